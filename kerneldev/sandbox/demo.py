"""The main job: the whole loop end to end against a sandbox host on this machine.

Each step does what a user would do (through the same core functions the commands call) and
checks that kerneldev behaved as promised; the demo passes when every step did.

A step is a function of the `DemoContext` that returns a `DemoStep`; `LOOP_STEPS` lists them
in order. They run while the sandbox host, its transport and its fake service are up.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kerneldev.bench import kernel_bench as bench
from kerneldev.config import HostConfig, load_config
from kerneldev.errors import KerneldevError, RefusedError, UsageError
from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.base import Transport
from kerneldev.loop import drift, sync
from kerneldev.loop.state import state_path
from kerneldev.loop.sum_cache import SUMS_FILE
from kerneldev.paths import PROFILES_DIR, RESULTS_DIR
from kerneldev.sandbox.host import Sandbox, create_sandbox
from kerneldev.service import restart as service


@dataclass
class DemoStep:
    name: str  # the command a user would type
    expected: str
    observed: str
    ok: bool
    seconds: float = 0.0
    details: list[str] = field(default_factory=list)
    skipped: bool = False  # could not run here (ok is False): never reported as passed


@dataclass
class DemoResult:
    dir: str
    transport: str
    kept: bool
    ok: bool
    seconds: float
    notes: list[str] = field(default_factory=list)
    steps: list[DemoStep] = field(default_factory=list)


@dataclass
class DemoContext:
    sandbox: Sandbox
    host: HostConfig
    transport: Transport
    # Filled as the demo goes: the original and the edited bytes of the edited kernel file.
    data: dict = field(default_factory=dict)


StepFn = Callable[[DemoContext], DemoStep]

HEALTH_INTERVAL = 0.2  # the fake service warms up in ~1 s; poll faster than the default


def run_demo(
    folder: Path | None = None,
    *,
    keep: bool = False,
    use_ssh: bool | None = None,
    on_step: Callable[[DemoStep], None] | None = None,
    on_start: Callable[[Sandbox], None] | None = None,
) -> DemoResult:
    """Create the sandbox, run every step, clean up (processes always; files unless `keep`)."""
    started = time.monotonic()
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="kerneldev-demo-"))
    else:
        folder = Path(os.path.abspath(folder))
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise UsageError(
                f"--dir {folder} exists and is not an empty folder",
                hint="name a new or empty folder; the demo builds its sandbox there",
            )
    sandbox = None
    host = None
    result = DemoResult(dir=str(folder), transport="?", kept=keep, ok=False, seconds=0.0)
    try:
        sandbox = create_sandbox(folder, use_ssh=use_ssh)
        result.transport = sandbox.transport
        result.notes = list(sandbox.notes)
        if on_start:
            on_start(sandbox)
        host = load_config(sandbox.config_path).host(sandbox.host_name)
        # The sandbox host is fully described by its hosts.yaml: the user's ~/.ssh/config
        # (a `Host *` ProxyJump, say) must not change where the demo connects.
        with open_transport(host, ssh_config="none") as transport:
            ctx = DemoContext(sandbox, host, transport)
            for fn in LOOP_STEPS:
                t0 = time.monotonic()
                try:
                    step = fn(ctx)
                except KerneldevError as err:
                    step = DemoStep(fn.__name__, "no error", f"error: {err.message}", False)
                except Exception as err:  # a broken step fails the demo, it does not crash it
                    step = DemoStep(fn.__name__, "no error", f"{type(err).__name__}: {err}", False)
                step.seconds = round(time.monotonic() - t0, 2)
                result.steps.append(step)
                if on_step:
                    on_step(step)
    finally:
        if sandbox is not None:
            if host is not None:
                _stop_session(host)
            sandbox.close()
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    result.ok = passed(result.steps)
    result.seconds = round(time.monotonic() - started, 2)
    return result


def _stop_session(host: HostConfig) -> None:
    """The demo's host goes away with the sandbox: end its kept session with it, so no
    holder is left waiting out its idle time for a host that is gone. Best effort."""
    from kerneldev.hosts.transport.session import control

    try:
        control.stop(host, ssh_config="none")
    except Exception:  # noqa: BLE001, S110 - cleaning up; the sandbox is closed either way
        pass


def passed(steps: Sequence[DemoStep]) -> bool:
    """Every step that ran behaved, and at least one ran; skipped steps are reported as
    SKIPPED, never counted as passed."""
    return any(s.ok for s in steps) and all(s.ok or s.skipped for s in steps)


# --- the steps ----------------------------------------------------------------------------


def _statuses(report: drift.DriftReport) -> dict[str, tuple[str, str | None]]:
    return {f.path: (f.status, f.mirror) for f in report.files}


def _describe(report: drift.DriftReport) -> list[str]:
    return [f"{f.status:<12} mirror {f.mirror or '-':<8} {f.path}" for f in report.files]


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _edited_file(ctx: DemoContext) -> str:
    return ctx.host.files[0]


def _other_file(ctx: DemoContext) -> str:
    return ctx.host.files[1]


def _expect_diff(
    ctx: DemoContext, name: str, expected: dict[str, tuple[str, str | None]]
) -> DemoStep:
    report = drift.compute_drift(ctx.transport, ctx.host)
    seen = _statuses(report)
    ok = seen == expected
    want = ", ".join(f"{_short(p)} {s}/{m}" for p, (s, m) in sorted(expected.items()))
    got = ", ".join(f"{_short(p)} {s}/{m}" for p, (s, m) in seen.items())
    exit_code = 0 if report.ok else 1
    return DemoStep(
        name, want, f"{got} (exit {exit_code})", ok, details=_describe(report) + report.warnings
    )


def step_pull(ctx: DemoContext) -> DemoStep:
    result = sync.pull(ctx.transport, ctx.host)
    ctx.data["original"] = (ctx.host.workspace / _edited_file(ctx)).read_bytes()
    ok = result.transferred == len(ctx.host.files) and not result.missing
    return DemoStep(
        "kerneldev pull",
        f"{len(ctx.host.files)} files copied from the host into the workspace",
        f"{result.transferred} transferred, {len(result.files) - result.transferred} identical",
        ok,
        details=[f"{f.action:<9} {f.path}" for f in result.files],
    )


def _diff_step(edited: tuple[str, str | None], other: tuple[str, str | None]) -> StepFn:
    """A `kerneldev diff` step expecting these (workspace, mirror) statuses of the edited file
    and of the other one."""

    def step(ctx: DemoContext) -> DemoStep:
        return _expect_diff(
            ctx, "kerneldev diff", {_edited_file(ctx): edited, _other_file(ctx): other}
        )

    step.__name__ = step.__qualname__ = "kerneldev diff"  # the failure row's name, as its step's
    return step


def step_diff_clean(ctx: DemoContext) -> DemoStep:
    return _expect_diff(
        ctx, "kerneldev diff", {p: (drift.IN_SYNC, drift.MIRROR_SAME) for p in ctx.host.files}
    )


def step_edit(ctx: DemoContext) -> DemoStep:
    path = ctx.host.workspace / _edited_file(ctx)
    edit = b"\n# kerneldev demo: tuned here (BLOCK_N 64 -> 128 would go here)\n"
    path.write_bytes(ctx.data["original"] + edit)
    ctx.data["edited"] = path.read_bytes()
    return DemoStep(
        f"edit workspace/{_edited_file(ctx)}",
        "a local edit",
        f"appended {len(edit)} bytes",
        True,
    )


step_diff_edited = _diff_step(
    edited=(drift.EDITED, drift.MIRROR_SAME), other=(drift.IN_SYNC, drift.MIRROR_SAME)
)


def _fingerprint(ctx: DemoContext) -> dict[str, str]:
    """Every byte that a dry run must not change: live tree, workspace and state."""
    out = {}
    for base in (ctx.sandbox.root, ctx.host.workspace):
        for dirpath, _, names in os.walk(base):
            for n in names:
                p = Path(dirpath) / n
                # Regular files only: a kept session's socket under the workspace's
                # .kerneldev/ has no bytes to read (opening it fails with ENXIO). The sums
                # cache is not the workspace's content: a refused push may refresh it.
                if p.is_file() and p.name != SUMS_FILE:
                    out[str(p)] = _sha(p.read_bytes())
    sp = state_path(ctx.host.workspace)
    out["state"] = _sha(sp.read_bytes()) if sp.exists() else ""
    return out


def step_dry_run(ctx: DemoContext) -> DemoStep:
    before = _fingerprint(ctx)
    plan = sync.push(ctx.transport, ctx.host, dry_run=True)
    after = _fingerprint(ctx)
    uploads = [f.path for f in plan.uploads]
    ok = uploads == [_edited_file(ctx)] and before == after
    return DemoStep(
        "kerneldev push --dry-run",
        f"plan: upload {_short(_edited_file(ctx))}; live, workspace and state unchanged",
        f"plan: upload {', '.join(map(_short, uploads)) or 'nothing'}; "
        + ("nothing changed" if before == after else "SOMETHING CHANGED"),
        ok,
        details=[f"{f.action:<8} {f.status:<10} {f.path}" for f in plan.files],
    )


def step_push_restart(ctx: DemoContext) -> DemoStep:
    result = sync.push(ctx.transport, ctx.host)
    path = _edited_file(ctx)
    live = ctx.transport.read_bytes(posixpath.join(ctx.host.root, path))
    backup = posixpath.join(ctx.host.root, sync.BACKUP_DIR, result.deploy_id or "-", path)
    backup_ok = (
        ctx.transport.exists(backup) and ctx.transport.read_bytes(backup) == ctx.data["original"]
    )
    health = service.restart(ctx.transport, ctx.host.service, interval=HEALTH_INTERVAL)
    ok = result.deployed == [path] and live == ctx.data["edited"] and backup_ok and health.healthy
    return DemoStep(
        "kerneldev push --restart",
        "1 file deployed atomically, old bytes backed up on the host, service healthy",
        f"deployed {len(result.deployed)} as {result.deploy_id}; backup "
        f"{'matches' if backup_ok else 'MISSING/WRONG'}; healthy after {health.elapsed:.1f}s "
        f"({health.checks} checks, {health.last_check})",
        ok,
        details=[f"backup: {backup}"],
    )


step_diff_after_push = _diff_step(
    edited=(drift.IN_SYNC, drift.MIRROR_DIFFERS), other=(drift.IN_SYNC, drift.MIRROR_SAME)
)


def step_drift_on_host(ctx: DemoContext) -> DemoStep:
    live = posixpath.join(ctx.host.root, _other_file(ctx))
    cmd = f"printf '%s\\n' '# hotfix made directly on the host' >> {shlex.quote(live)}"
    result = ctx.transport.run(cmd)
    return DemoStep(
        f"someone edits {_short(live)} on the host",
        "the live file changes behind kerneldev's back",
        "appended a line on the host" if result.ok else f"failed: {result.stderr.strip()}",
        result.ok,
    )


step_diff_drifted = _diff_step(
    edited=(drift.IN_SYNC, drift.MIRROR_DIFFERS),
    other=(drift.DRIFTED, drift.MIRROR_DIFFERS),
)


def step_push_refused(ctx: DemoContext) -> DemoStep:
    before = _fingerprint(ctx)
    try:
        sync.push(ctx.transport, ctx.host)
    except RefusedError as err:
        unchanged = before == _fingerprint(ctx)
        named = _other_file(ctx) in err.message
        return DemoStep(
            "kerneldev push",
            f"refused (exit 1), names {_short(_other_file(ctx))}, changes nothing",
            f"refused: {err.message}" + ("" if unchanged else " BUT SOMETHING CHANGED"),
            named and unchanged,
        )
    return DemoStep("kerneldev push", "refused", "the push went through", False)


def step_rollback(ctx: DemoContext) -> DemoStep:
    result = sync.rollback(ctx.transport, ctx.host)
    live = ctx.transport.read_bytes(posixpath.join(ctx.host.root, _edited_file(ctx)))
    ok = live == ctx.data["original"] and [f.path for f in result.files] == [_edited_file(ctx)]
    return DemoStep(
        "kerneldev rollback",
        f"{_short(_edited_file(ctx))} back to the exact bytes from before the push",
        f"restored {len(result.files)} file(s) from {result.rolls_back}; live bytes "
        + ("match the original" if live == ctx.data["original"] else "DO NOT MATCH"),
        ok,
        details=[f"recorded as deploy {result.deploy_id}"],
    )


step_diff_after_rollback = _diff_step(
    edited=(drift.EDITED, drift.MIRROR_SAME), other=(drift.DRIFTED, drift.MIRROR_DIFFERS)
)


def step_pull_drifted(ctx: DemoContext) -> DemoStep:
    b = _other_file(ctx)
    result = sync.pull(ctx.transport, ctx.host, [b])
    live = ctx.transport.read_bytes(posixpath.join(ctx.host.root, b))
    ok = [f.path for f in result.files] == [b] and (ctx.host.workspace / b).read_bytes() == live
    return DemoStep(
        f"kerneldev pull {b}",
        "takes the host's hotfix into the workspace (only that file)",
        f"{result.transferred} transferred",
        ok,
    )


def step_redo(ctx: DemoContext) -> DemoStep:
    result = sync.rollback(ctx.transport, ctx.host)
    live = ctx.transport.read_bytes(posixpath.join(ctx.host.root, _edited_file(ctx)))
    health = service.restart(ctx.transport, ctx.host.service, interval=HEALTH_INTERVAL)
    ok = live == ctx.data["edited"] and health.healthy
    return DemoStep(
        "kerneldev rollback --restart",
        "a second rollback re-applies the push; service healthy",
        f"undid {result.rolls_back}; live "
        + ("has the edit again" if live == ctx.data["edited"] else "DOES NOT have the edit")
        + f"; healthy after {health.elapsed:.1f}s",
        ok,
    )


step_diff_final = _diff_step(
    edited=(drift.IN_SYNC, drift.MIRROR_DIFFERS),
    other=(drift.IN_SYNC, drift.MIRROR_DIFFERS),
)


def step_import_check_refuses(ctx: DemoContext) -> DemoStep:
    """A wrapper that only re-exports the kernel entry (what kerneldev once bundled): SGLang's
    DSv4 backend imports `flash_mla_with_kvcache_sm120` from it, so the push is refused before
    anything is uploaded."""
    from kerneldev.loop.import_check import ImportRefusedError
    from kerneldev.sandbox import fake_sglang

    wrapper = _other_file(ctx)
    local = ctx.host.workspace / wrapper
    kept = local.read_bytes()
    local.write_text("from .flash_mla_sm120_triton import flash_mla_sparse_decode_triton\n")
    before = _fingerprint(ctx)
    name = "kerneldev push (a wrapper without flash_mla_with_kvcache_sm120)"
    expected = f"refused before upload (exit 1), naming {_short(fake_sglang.BACKEND_PATH)}"
    try:
        sync.push(ctx.transport, ctx.host, [wrapper], import_check=True)
    except ImportRefusedError as err:
        unchanged = before == _fingerprint(ctx)
        named = fake_sglang.BACKEND_PATH in err.message
        return DemoStep(name, expected, err.message, named and unchanged)
    finally:
        local.write_bytes(kept)
    return DemoStep(name, expected, "the push went through", False)


def _kernel_stack_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("torch", "triton"))


def step_bench(ctx: DemoContext) -> DemoStep:
    """The last question of every round: is the deployed kernel still correct? On the sandbox
    (no GPU) the harness runs both variants under the Triton interpreter on tiny shapes, so
    the accuracy check is real and the times are not."""
    name = "kerneldev bench --source live --cpu --variants simt,mma --shapes smoke"
    expected = "both variants of the deployed kernel match the float64 reference"
    if not _kernel_stack_available():
        return DemoStep(
            name, expected, "SKIPPED: torch/triton not installed here", False, skipped=True
        )
    result = bench.run_bench(
        ctx.transport,
        ctx.host,
        ["simt", "mma"],
        ["smoke"],
        source="live",
        cpu_mode=True,
        rotate=1,
        results_dir=ctx.sandbox.dir / RESULTS_DIR,
    )
    entries = [(r["shape"], r["label"], r["status"]) for r in result.data["results"]]
    passed = sum(status == "ok" for _, _, status in entries)
    return DemoStep(
        name,
        expected,
        f"{passed}/{len(entries)} shape x variant checks passed (CPU interpreter; times not "
        "meaningful)",
        result.ok and passed == len(entries) > 0,
        details=[f"{status:6} {label:12} {shape}" for shape, label, status in entries],
    )


# --- decode timings from the running service -----------------------------------------------

DEMO_CONCURRENCY = [1, 4]


def _service_skip(ctx: DemoContext, name: str, expected: str) -> DemoStep | None:
    if ctx.sandbox.decode_service:
        return None
    return DemoStep(
        name,
        expected,
        "skipped: the sandbox's decode service needs fastapi, uvicorn, torch and triton "
        "(pip install -e '.[kernels,service]')",
        False,
        skipped=True,
    )


def step_bench_service(ctx: DemoContext) -> DemoStep:
    """The end-to-end question: does the server decode faster with the MMA kernel? The service
    is restarted on each variant (env file + restart) and put back afterwards."""
    from kerneldev.bench import service_bench

    c = ",".join(map(str, DEMO_CONCURRENCY))
    name = (
        f"kerneldev bench --service --variants simt,mma --concurrency {c} --requests 4 "
        "--max-new-tokens 4 --rounds 1"
    )
    expected = "streamed requests on both variants, TTFT/TPOT/ITL per concurrency, env restored"
    if (skip := _service_skip(ctx, name, expected)) is not None:
        return skip
    env_file = ctx.host.service.env_file
    before = ctx.transport.read_bytes(env_file)
    result = service_bench.run_service_bench(
        ctx.transport,
        ctx.host,
        service_bench.ServiceBenchRequest(
            ["simt", "mma"], DEMO_CONCURRENCY, requests=4, input_len=8, max_new_tokens=4, rounds=1
        ),
        results_dir=ctx.sandbox.dir / RESULTS_DIR,
        health_interval=HEALTH_INTERVAL,
    )
    restored = ctx.transport.read_bytes(env_file) == before
    ctx.data["service_bench"] = result.data
    details = []
    for r in result.data["results"]:
        m = r["metrics"]
        done = f"{m['completed']}/{m['completed'] + m['failed']}"
        details.append(
            f"{r['variant']:5} c={r['concurrency']}: TTFT {_ms(m['median_ttft_ms'])}, "
            f"TPOT {_ms(m['median_tpot_ms'])}, ITL {_ms(m['median_itl_ms'])}, "
            f"{m['output_throughput'] or 0:.1f} tok/s, {done} ok"
        )
    details.append(f"saved: {result.saved_to}")
    return DemoStep(
        name,
        expected,
        f"{len(result.data['results'])} variant x concurrency runs, all requests "
        + ("completed" if result.ok else "NOT completed")
        + f"; env file {'restored' if restored else 'NOT RESTORED'} (CPU interpreter: slow)",
        result.ok and restored,
        details=details,
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def step_profile(ctx: DemoContext) -> DemoStep:
    """Which kernels take the decode time, per variant (CPU time of the service's profiler
    ranges here: no GPU)."""
    from kerneldev.bench import profile as decode_profile
    from kerneldev.hostside import trace_summary

    name = "kerneldev profile --variants simt,mma --concurrency 4 --steps 3"
    expected = "a trace per variant whose summary names the sparse-decode attention kernel"
    if (skip := _service_skip(ctx, name, expected)) is not None:
        return skip
    result = decode_profile.run_profile(
        ctx.transport,
        ctx.host,
        ["simt", "mma"],
        concurrency=4,
        steps=3,
        top=5,
        profiles_dir=ctx.sandbox.dir / PROFILES_DIR,
        health_interval=HEALTH_INTERVAL,
    )
    ctx.data["profile"] = result
    named = all(
        any(r["family"] == trace_summary.ATTENTION for r in v.summary["top"])
        and v.local_trace is not None
        for v in result.variants
    )
    details = [
        f"{v.variant:5} {r['name']:28} {r['family']:24} {r['calls']:3} calls "
        f"{r['total_ms']:8.1f} ms {100 * (r['share'] or 0):5.1f}%"
        for v in result.variants
        for r in v.summary["top"]
    ]
    return DemoStep(
        name,
        expected,
        f"{len(result.variants)} traces copied locally; attention ranges "
        + ("named" if named else "MISSING")
        + f" ({result.time_kind.upper()} time: no GPU kernels here)",
        named and len(result.variants) == 2,
        details=details,
    )


def step_ab_summary(ctx: DemoContext) -> DemoStep:
    name = "A/B summary: simt -> mma"
    expected = "TPOT and the attention share of decode time, before and after"
    bench_data, prof = ctx.data.get("service_bench"), ctx.data.get("profile")
    if bench_data is None or prof is None:
        return DemoStep(
            name, expected, "SKIPPED: no service timings in this run", False, skipped=True
        )
    lines = []
    for ab in bench_data["ab"]:
        m = ab["metrics"]["median_tpot_ms"]
        ratio = f"{m['ratio']:.2f}x, " if m["ratio"] else ""
        lines.append(
            f"c={ab['concurrency']}: TPOT {_ms(m['a'])} -> {_ms(m['b'])} ({ratio}{m['verdict']})"
        )
    shares = {v.variant: v.attention_share for v in prof.variants}
    kind = prof.time_kind.upper()
    lines.append(
        f"attention share of decode {kind} time: "
        f"{100 * (shares.get('simt') or 0):.0f}% -> {100 * (shares.get('mma') or 0):.0f}%"
    )
    return DemoStep(name, expected, "; ".join(lines), True)


SERVICE_STEPS: tuple[StepFn, ...] = (step_bench_service, step_profile, step_ab_summary)


LOOP_STEPS: tuple[StepFn, ...] = (
    step_pull,
    step_diff_clean,
    step_edit,
    step_diff_edited,
    step_dry_run,
    step_push_restart,
    step_diff_after_push,
    step_drift_on_host,
    step_diff_drifted,
    step_push_refused,
    step_rollback,
    step_diff_after_rollback,
    step_pull_drifted,
    step_redo,
    step_diff_final,
    step_import_check_refuses,
    step_bench,
    *SERVICE_STEPS,
)
