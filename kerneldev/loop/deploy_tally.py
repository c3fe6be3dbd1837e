"""The `Deployed: ... / Not deployed: ...` summary of a deploy that did not run to its end.

An interrupted or partial deploy (and a push stopped before its uploads or after them, in the
restart) ends with an error whose message closes with these two lines. What they say is data
first: `errors.DeployTally` on the error's `tally`; the lines are built from it here, in one
place, and code decides on `tally`, never on the message's text.
"""

from __future__ import annotations

from collections.abc import Sequence

from kerneldev.errors import DeployTally, KerneldevError
from kerneldev.printable import printable_list

SHOWN = 20  # paths listed before the rest is counted
BEFORE_UPLOAD = "everything (stopped before the upload)"


def names(paths: Sequence[str], limit: int = SHOWN) -> str:
    """A list of paths for a message: all of them up to `limit`, then a count."""
    if not paths:
        return "(none)"
    shown = printable_list(paths[:limit])
    return shown if len(paths) <= limit else f"{shown} and {len(paths) - limit} more"


def summary(tally: DeployTally) -> str:
    """The two lines, built from the data."""
    deployed = names(tally.deployed)
    if tally.deploy_id and tally.deployed:
        deployed += f" as {tally.deploy_id}"
    if tally.not_deployed is None:
        return f"Deployed: {deployed}\nNot deployed: {BEFORE_UPLOAD}"
    if tally.unconfirmed and tally.not_deployed:
        return f"Deployed: {deployed}\nNot confirmed: {names(tally.not_deployed)} {UNCONFIRMED}"
    return f"Deployed: {deployed}\nNot deployed: {names(tally.not_deployed)}"


UNCONFIRMED = (
    "(the connection was lost before the host said whether they landed: each holds its old or "
    "its new bytes; `kerneldev diff` shows which, the next push records them)"
)


def report(tally: DeployTally) -> dict:
    """The tally as `--json` gives it on failure (`not_deployed` null: stopped before the
    upload, nothing was deployed; `unconfirmed` true: see `DeployTally`)."""
    left = None if tally.not_deployed is None else list(tally.not_deployed)
    return {
        "deployed": list(tally.deployed),
        "not_deployed": left,
        "deploy_id": tally.deploy_id,
        "unconfirmed": tally.unconfirmed,
    }


def attach(err: KerneldevError, tally: DeployTally) -> KerneldevError:
    """Give `err` its tally, end its message with the summary and add the tally to its
    `--json` report (once: an error that has a tally keeps the one it has; a report's own keys
    stay). Returns `err`."""
    if err.tally is None:
        err.tally = tally
        err.message += "\n" + summary(tally)
        if err.report is None:
            err.report = report(tally)
        elif isinstance(err.report, dict):
            err.report = {**report(tally), **err.report}
    return err


def stopped_at(landed: Sequence[str] | None, deploy_id: str | None = None) -> DeployTally:
    """The tally of a push stopped outside its uploads: before them (`landed` None: nothing
    ran) or after them (every planned file landed)."""
    if landed is None:
        return DeployTally((), None)
    return DeployTally(tuple(landed), (), deploy_id)
