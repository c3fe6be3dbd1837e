"""The release step after a deploy: restart, and roll back when the service never gets healthy.

The last stages of a push (`push_pipeline.py` has the ones before): restart the service and
wait for health; when health never comes, undo the deploy (a rollback recorded as
`auto-rollback`) and restart again. `push --restart` (kerneldev/cli/commands/loop.py), group pushes
(kerneldev/loop/fleet_ops.py) and watch (kerneldev/watch.py) all run `restart_or_roll_back`; each
says what happens in its own words through `ReleaseHooks` and reads the `ReleaseOutcome`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kerneldev.config import HostConfig
from kerneldev.errors import ServiceError, UnhealthyError
from kerneldev.hosts.transport.base import Transport
from kerneldev.loop import sync
from kerneldev.service.restart import ServiceHealth


def _nothing(_: object) -> None:
    return None


@dataclass
class ReleaseHooks:
    """`restart()`: restart and wait for health (raises `UnhealthyError` when it never comes),
    with whatever progress the caller shows. `on_rolling_back(unhealthy)`: the rollback is about
    to start; `on_rolled_back(undo)`: it is done, the second restart comes next."""

    restart: Callable[[], ServiceHealth]
    on_rolling_back: Callable[[UnhealthyError], None] = _nothing
    on_rolled_back: Callable[[sync.RollbackResult], None] = _nothing


@dataclass
class ReleaseOutcome:
    """How the release ended. `unhealthy` None: healthy. Else `rollback` None: kept in place
    (not asked to roll back, or nothing was deployed); else rolled back, `after` saying how
    the service came back."""

    health: ServiceHealth  # the first restart's health (failed when `unhealthy`)
    unhealthy: UnhealthyError | None = None
    rollback: sync.RollbackResult | None = None
    after: str | None = None


def restart_or_roll_back(
    transport: Transport,
    host: HostConfig,
    deploy_id: str | None,
    hooks: ReleaseHooks,
    *,
    roll_back: bool = True,
) -> ReleaseOutcome:
    """Restart after deploy `deploy_id`; when health never comes and `roll_back`, undo the
    last deploy and restart again. Call it holding the host lock. Errors other than an
    unhealthy first restart (a restart command that fails, a rollback refused) propagate."""
    try:
        return ReleaseOutcome(hooks.restart())
    except UnhealthyError as err:
        if not roll_back or not deploy_id:
            return ReleaseOutcome(err.health, err)
        unhealthy = err
    hooks.on_rolling_back(unhealthy)
    undo = sync.rollback(transport, host, outcome="auto-rollback")
    hooks.on_rolled_back(undo)
    try:
        undo.health = hooks.restart()
        after = "healthy again with the previous files"
    except ServiceError as err:
        after = f"still not healthy after the rollback: {err.message}"
    return ReleaseOutcome(unhealthy.health, unhealthy, undo, after)


def with_result(unhealthy: UnhealthyError, result) -> UnhealthyError:
    """The unhealthy error again, the deploy's result (its health filled) as the --json report:
    the deploy did happen."""
    err = unhealthy
    again = UnhealthyError(err.message, err.logs, err.hint, health=err.health)
    again.report = result
    return again


def raise_unless_healthy(
    result: sync.PushResult, outcome: ReleaseOutcome, logs_shown: bool = False
) -> None:
    """Fill the push's health; fail as a push whose restart did not end healthy: kept in place,
    or rolled back (both outcomes in one message, the push result with its automatic rollback
    as the --json report). `logs_shown`: the logs were already printed above."""
    result.health = outcome.health
    if outcome.unhealthy is None:
        return
    if outcome.rollback is None:
        raise with_result(outcome.unhealthy, result)
    raise rolled_back_error(
        result, outcome.unhealthy, outcome.rollback, outcome.after or "", logs_shown
    )


def rolled_back_error(
    result: sync.PushResult,
    unhealthy: UnhealthyError,
    undo: sync.RollbackResult,
    after: str,
    logs_shown: bool = False,
) -> UnhealthyError:
    """What a push whose restart never became healthy fails with once it was rolled back: both
    outcomes in one message, the first restart's logs and health, and the push result, its
    automatic rollback recorded, as the --json report."""
    result.auto_rollback = undo
    failed = UnhealthyError(
        f"deploy {result.deploy_id} did not come up healthy ({unhealthy.message}); it was "
        f"rolled back as {undo.deploy_id} and the service restarted: {after}",
        unhealthy.logs,
        hint=f"see the service logs{' above' if logs_shown else ''}; fix the kernel and push "
        "again (`--no-rollback` keeps a failing deploy in place for debugging)",
        health=unhealthy.health,
    )
    failed.report = result
    return failed
