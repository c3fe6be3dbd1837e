"""`kerneldev profile`: which kernels take the service's decode time, per variant.

For each variant (switched and restarted as `bench --service` does, the service put back at
the end): `service_load.py profile` on the host warms up, calls `POST /start_profile` with an
`output_dir` in a fresh temporary folder, drives `concurrency` streaming requests of `steps`
new tokens each (so about `steps` decode steps at that batch size), calls `POST
/stop_profile`, waits for the newest trace there and summarises it on the host with
`trace_summary.py` (traces can be hundreds of MB; only the summary comes back over SSH before
the copy). The trace itself is then copied to `<profiles_dir>/<UTC time>-<host>/<variant>/`
for Perfetto, the result beside as `profile.json` (`profiles_dir` is `.kerneldev/profiles/`
beside the config file).

Works against a real SGLang server (the same endpoints, `output_dir` honoured) and the sandbox
service. On a CPU-only service the trace has no GPU kernels: the summary then sums the
service's `record_function` ranges and its `time_kind` is "cpu".
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import posixpath
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kerneldev import interrupt
from kerneldev.atomic_file import write_bytes_atomic
from kerneldev.bench import ab_kernels
from kerneldev.config import HostConfig
from kerneldev.errors import BenchError, KerneldevError, UsageError
from kerneldev.hosts.transport.base import Transport
from kerneldev.hostside.trace_summary import ATTENTION_FAMILIES
from kerneldev.paths import PROFILES_DIR
from kerneldev.service import server_process
from kerneldev.service.envfile import read_service_env
from kerneldev.service.variants import (
    check_variants,
    make_host_folder,
    service_url,
)

SCHEMA = "kerneldev.service-profile/1"

ProgressCallback = Callable[[str], None]


@dataclass
class VariantProfile:
    variant: str
    summary: dict  # trace_summary's object (schema kerneldev.trace-summary/1)
    trace_on_host: str
    trace_bytes: int
    local_trace: str | None
    attention_share: float | None  # the share of all attention families together
    # the attention family that took the most time: which attention kernel ran (FlashInfer's,
    # FlashMLA's, SGLang's Triton, kerneldev's); None when the trace has none
    attention_kernel: str | None = None
    # what the live dispatch reaches for decode in this variant's environment (ab_kernels;
    # A/B runs only)
    dispatch_kernel: str | None = None
    # True: the server traced decode steps only (SGLang's profile_by_stage + num_steps); False:
    # it took only the plain /start_profile, so the window holds the prefill too
    decode_only: bool | None = None


class TraceFolders:
    """Where the server writes each variant's trace: `SGLANG_TORCH_PROFILER_DIR` of
    `service.env_file` when set (the folder the server is set up to write), else a fresh folder
    under the host's /tmp that any user can write (mode 1777, like /tmp itself: a server running
    as another user than the SSH one, or in a container sharing /tmp, can write it), one
    subfolder per variant, removed at the end (the traces are copied first)."""

    def __init__(self, transport: Transport, host: HostConfig) -> None:
        self.transport = transport
        self.host = host
        self.configured: str | None = None
        self.made: str | None = None

    def __enter__(self) -> TraceFolders:
        try:
            env = read_service_env(self.transport, self.host) or {}
        except KerneldevError:
            env = {}
        self.configured = env.get("SGLANG_TORCH_PROFILER_DIR") or None
        if self.configured is None:
            self.made = make_host_folder(
                self.transport, self.host, "kerneldev-traces", shared=True, error=BenchError
            )
        return self

    def folder(self, variant: str) -> str:
        if self.configured is not None:
            return self.configured
        assert self.made is not None
        path = posixpath.join(self.made, re.sub(r"[^A-Za-z0-9_.-]", "_", variant))
        self.transport.run(f"mkdir -m 1777 -p {shlex.quote(path)}", timeout=60)
        return path

    def no_trace_error(self, variant: str, folder: str) -> BenchError:
        me = self.transport.run("id -un", timeout=60).stdout.strip() or "?"
        found = server_process.find(self.transport, self.host)
        user = found.user if found else None
        who = f"its user {user}" if user else "its user (not found: `ss -ltnp` did not tell)"
        how = (
            "SGLANG_TORCH_PROFILER_DIR of service.env_file"
            if self.configured
            else f"made by kerneldev as {me}, mode 1777"
        )
        return BenchError(
            f"profiling {variant}: no trace appeared in {folder} ({how}) after /stop_profile; "
            f"the server writes its traces as {who}, who must be able to write {folder}",
            hint="set SGLANG_TORCH_PROFILER_DIR in service.env_file to a folder the server's "
            "user can write (in a container: one it shares with the host), then profile again",
        )

    def __exit__(self, *exc) -> None:
        if self.made:
            # Shielded: after Ctrl-C the folder still goes (a pending one would stop the rm).
            with interrupt.shield():
                try:
                    self.transport.run(f"rm -rf {shlex.quote(self.made)}", timeout=120)
                except KerneldevError:
                    pass  # a leftover trace folder must not hide the real outcome


def attention_of(summary: dict) -> tuple[float | None, str | None]:
    """(share of all attention families, the attention family with the most time) of a trace
    summary."""
    attention = [f for f in summary["families"] if f["family"] in ATTENTION_FAMILIES]
    if not attention:
        return None, None
    shares = [f["share"] for f in attention if f["share"] is not None]
    top = max(attention, key=lambda f: f["total_ms"])
    return (sum(shares) if shares else None), top["family"]


@dataclass
class ProfileResult:
    schema: str
    timestamp: str
    host: str
    url: str
    concurrency: int
    steps: int
    top: int
    time_kind: str  # "gpu" or "cpu" (CPU-only service: record_function ranges)
    variants: list[VariantProfile] = field(default_factory=list)
    saved_to: str | None = None  # None: not saved (`save_error` says why)
    save_error: str | None = None


def run_profile(
    transport: Transport,
    host: HostConfig,
    variants: list[str],
    *,
    concurrency: int = 8,
    steps: int = 32,
    top: int = 15,
    input_len: int = 32,
    on_progress: ProgressCallback | None = None,
    profiles_dir: Path | None = None,
    health_interval: float | None = None,
    allow_same_kernel: bool = False,
) -> ProfileResult:
    for name, value in (("--concurrency", concurrency), ("--steps", steps), ("--top", top)):
        if value < 1:
            raise UsageError(f"{name} must be >= 1, got {value}")
    svc = check_variants(host, variants)
    url = service_url(svc, host.name)
    say = on_progress or (lambda _t: None)
    stamp = _dt.datetime.now(_dt.timezone.utc)
    result = ProfileResult(
        schema=SCHEMA,
        timestamp=stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        host=host.name,
        url=url,
        concurrency=concurrency,
        steps=steps,
        top=top,
        time_kind="gpu",
    )
    base = (profiles_dir or PROFILES_DIR) / (
        f"{stamp.strftime('%Y%m%dT%H%M%SZ')}-{re.sub(r'[^A-Za-z0-9_.-]', '_', host.name)}"
    )
    with (
        ab_kernels.ab_session(
            transport,
            host,
            variants,
            say,
            health_interval=health_interval,
            allow_same_kernel=allow_same_kernel,
        ) as ab,
        TraceFolders(transport, host) as traces,
    ):
        for name in variants:
            ab.switcher.switch(name)
            trace_dir = traces.folder(name)
            out = ab.scripts.path(f"profile-{name}.json")
            args = [
                "profile",
                "--url",
                url,
                "--concurrency",
                str(concurrency),
                "--max-new-tokens",
                str(steps),
                "--input-len",
                str(input_len),
                "--output-dir",
                trace_dir,
                "--top",
                str(top),
                "--out",
                out,
            ]
            say(f"{name}: profiling {concurrency} request(s) x {steps} decode steps")
            done = transport.run(ab.scripts.command("service_load.py", args) + " 2>&1")
            said = done.stdout + done.stderr
            if not done.ok and "every profiled request failed" in said:
                line = next(x for x in said.splitlines() if "every profiled request failed" in x)
                raise BenchError(
                    f"profiling {name} on {host.name}: {line.split('error: ', 1)[-1]}",
                    hint="the service did not decode under the profiler: see its logs, and "
                    "`kerneldev bench --service` for the same requests without it",
                )
            if not done.ok and "no trace appeared" in said:
                raise traces.no_trace_error(name, trace_dir)
            if not done.ok:
                raise BenchError(
                    f"profiling {name} failed on {host.name}: "
                    + ((done.stdout + done.stderr).strip().splitlines() or ["no output"])[-1],
                    hint="the server must answer POST /start_profile and /stop_profile "
                    "(SGLang does; set SGLANG_TORCH_PROFILER_DIR if it ignores output_dir)",
                )
            try:
                data = json.loads(transport.read_bytes(out))
            except (KerneldevError, ValueError) as err:
                raise BenchError(f"the profiler run left no readable result: {err}") from None
            summary = data["summary"]
            local = None
            try:
                dest = base / name
                dest.mkdir(parents=True, exist_ok=True)
                local_path = dest / posixpath.basename(data["trace"])
                # whole or not at all: a cut connection or Ctrl-C leaves no half trace
                write_bytes_atomic(local_path, transport.read_bytes(data["trace"]), 0o644)
                local = str(local_path)
            except (KerneldevError, OSError) as err:
                say(f"warning: could not copy the trace: {err}")
            share, ran = attention_of(summary)
            result.variants.append(
                VariantProfile(
                    name,
                    summary,
                    data["trace"],
                    data["trace_bytes"],
                    local,
                    share,
                    ran,
                    ab.kernels.kernels.get(name),
                    data.get("decode_only"),
                )  # fmt: skip
            )
            if summary["time_kind"] == "cpu":
                result.time_kind = "cpu"
            say(
                f"{name}: {summary['kernels_seen']} kernels/ranges, "
                f"{summary['total_ms']:.1f} ms {summary['time_kind'].upper()} time"
            )
    saved = base / "profile.json"
    result.saved_to = str(saved)
    text = json.dumps(dataclasses.asdict(result), indent=2) + "\n"
    try:
        write_bytes_atomic(saved, text.encode("utf-8"), 0o644)  # creates the folders
    except OSError as err:
        # kept, not raised: the caller shows the finished profile, then this error
        result.saved_to = None
        result.save_error = f"cannot write {saved}: {err.strerror or err}"
    return result
