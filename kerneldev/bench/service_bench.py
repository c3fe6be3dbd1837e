"""`kerneldev bench --service`: decode timings of the running service, A/B across restarts.

For each round, each variant in interleaved order (A B, then B A, ...): write the env file,
restart, wait for health, then per concurrency level warm up (at least c requests at
concurrency c, so the batch sizes it times have run once), `/flush_cache`, wait 1 s, and drive
streaming requests with the stdlib load generator (`service_load.py`) run on the host
against the service URL there. The
env file is restored and the service restarted on its original settings at the end, also
after a failure or Ctrl-C (`service_variants.VariantSwitcher`).

Metrics use the names and definitions of SGLang 0.5.23's client (`sglang.benchmark.serving`):
TTFT; ITL per token (a chunk of n new tokens counts its gap / n, n times); TPOT = (E2E -
TTFT) / (output tokens - 1) for requests with more than one output token; E2E;
`request_throughput` (completed requests / duration) and `output_throughput` (output tokens /
duration) per concurrency level. Per variant and concurrency the headline numbers pool the
requests of every round; the A/B verdict per metric compares the per-round values: "no
change" when the [min, max] ranges across rounds of the two variants overlap (the difference
lies within the spread across rounds), else "better" or "worse" (lower latency, higher
throughput is better). With one round there is no spread: the verdict is "one round".

Token counts are the server's (`meta_info`). A request fails when the HTTP status is not 200,
the stream breaks off or carries an error (SGLang's `data: {"error": ...}`, an aborted
`finish_reason`): `failed` counts it and `errors` lists the server's messages. Each run saves
the server's settings (`/server_info`: CUDA-graph sizes, speculative decoding, TP, attention
backend, ...); `server_differences` names those that differ between variants (beyond the
variant's own kernel), since an A/B across them times more than the kernel.

Result JSON: schema `kerneldev.service-bench/1` (docs/service-bench-json.md), saved as
`<results_dir>/<UTC time>-<host>-service.json`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kerneldev.bench import ab_kernels
from kerneldev.bench.kernel_bench import RESULTS_DIR, try_save_result
from kerneldev.config import HostConfig
from kerneldev.errors import BenchError, KerneldevError, UsageError
from kerneldev.hosts.transport.base import Transport
from kerneldev.service.variants import check_variants, service_url

SCHEMA = "kerneldev.service-bench/1"
BETTER, WORSE, NO_CHANGE, ONE_ROUND = "better", "worse", "no change", "one round"
LATENCIES = ("ttft", "tpot", "itl", "e2e_latency")  # bench_serving's metric stems, in ms
STATS = ("mean", "median", "p90", "p99")
# Metrics with an A/B verdict: every latency statistic (lower is better) and the throughputs.
THROUGHPUTS = ("output_throughput", "request_throughput")
VERDICT_METRICS = tuple(f"{s}_{m}_ms" for m in LATENCIES for s in STATS) + THROUGHPUTS

ProgressCallback = Callable[[str], None]


@dataclass(frozen=True)
class ServiceBenchRequest:
    variants: list[str]
    concurrency: list[int]
    requests: int = 16
    input_len: int = 128
    max_new_tokens: int = 64
    rounds: int = 2
    warmup: int = 2

    def check(self) -> None:
        if len(self.variants) < 1:
            raise UsageError("--variants names no variant")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise UsageError("--concurrency must list integers >= 1, e.g. 1,16,64")
        for name, value in (
            ("--requests", self.requests),
            ("--input-len", self.input_len),
            ("--max-new-tokens", self.max_new_tokens),
            ("--rounds", self.rounds),
        ):
            if value < 1:
                raise UsageError(f"{name} must be >= 1, got {value}")
        if self.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {self.warmup}")


def parse_concurrency(text: str) -> list[int]:
    try:
        levels = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise UsageError(f"--concurrency must be comma-separated integers, got {text!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise UsageError(f"--concurrency must list integers >= 1, got {text!r}")
    # A level given twice would run twice, its results doubled and the one-round verdict
    # turned into better/worse between two runs of the same variant.
    twice = sorted({c for c in levels if levels.count(c) > 1})
    if twice:
        raise UsageError(
            f"--concurrency names a level twice: {', '.join(map(str, twice))} (in {text!r})",
            hint="list each level once; --rounds N repeats every level",
        )
    return levels


def round_order(variants: list[str], rounds: int) -> list[tuple[int, str]]:
    """Interleaved: A B, B A, A B, ... (each variant first as often as the others)."""
    order = []
    for r in range(rounds):
        seq = variants if r % 2 == 0 else list(reversed(variants))
        order += [(r, v) for v in seq]
    return order


# --- metrics ------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default, as bench_serving uses)."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(prefix: str, values_s: list[float]) -> dict[str, float | None]:
    ms = [v * 1000.0 for v in values_s]
    return {
        f"mean_{prefix}_ms": sum(ms) / len(ms) if ms else None,
        f"median_{prefix}_ms": percentile(ms, 50),
        f"p90_{prefix}_ms": percentile(ms, 90),
        f"p99_{prefix}_ms": percentile(ms, 99),
    }


def level_metrics(requests: list[dict], duration: float) -> dict:
    """bench_serving's metrics for one batch of requests that took `duration` seconds."""
    ok = [r for r in requests if r and r.get("ok")]
    ttft = [r["ttft"] for r in ok]
    e2e = [r["e2e"] for r in ok]
    itl = [x for r in ok for x in r.get("itl", [])]
    tpot = [(r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1]
    out_tokens = sum(r["output_tokens"] for r in ok)
    metrics = {
        "completed": len(ok),
        "failed": len(requests) - len(ok),
        "errors": error_counts(requests),
        "total_input": sum(r.get("prompt_tokens", 0) for r in ok),
        "total_output": out_tokens,
        "duration": duration,
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_throughput": out_tokens / duration if duration > 0 else None,
    }
    for prefix, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e_latency", e2e)):
        metrics.update(_stats(prefix, values))
    return metrics


def error_counts(requests: list[dict]) -> list[dict]:
    """The failed requests' messages, each with how many requests it ended (first seen first)."""
    counts: dict[str, int] = {}
    for r in requests:
        if not r:
            counts["no result"] = counts.get("no result", 0) + 1
        elif not r.get("ok"):
            msg = str(r.get("error") or "failed")
            counts[msg] = counts.get(msg, 0) + 1
    return [{"message": m, "requests": n} for m, n in counts.items()]


def pooled_metrics(runs: list[dict]) -> dict:
    """Headline numbers for several rounds: every request pooled, durations summed."""
    reqs = [r for run in runs for r in run["requests"]]
    return level_metrics(reqs, sum(run["duration"] for run in runs))


def _lower_is_better(metric: str) -> bool:
    return metric not in THROUGHPUTS


def verdict(metric: str, a_values: list[float | None], b_values: list[float | None]) -> str:
    """B against A for one metric, from the per-round values of each."""
    a = [v for v in a_values if v is not None]
    b = [v for v in b_values if v is not None]
    if not a or not b:
        return "n/a"
    if len(a) < 2 or len(b) < 2:
        return ONE_ROUND
    if max(b) < min(a):
        return BETTER if _lower_is_better(metric) else WORSE
    if min(b) > max(a):
        return WORSE if _lower_is_better(metric) else BETTER
    return NO_CHANGE


# --- running ------------------------------------------------------------------------------


@dataclass
class ServiceBenchResult:
    data: dict  # schema kerneldev.service-bench/1
    saved_to: Path | None
    restart_skipped: str | None = None
    warnings: list[str] = field(default_factory=list)
    # Why it was not saved (`saved_to` None): the run is kept, the caller shows it, then this.
    save_error: BenchError | None = None

    @property
    def ok(self) -> bool:
        return bool(self.data.get("ok"))


def run_service_bench(
    transport: Transport,
    host: HostConfig,
    request: ServiceBenchRequest,
    on_progress: ProgressCallback | None = None,
    *,
    results_dir: Path | None = None,
    health_interval: float | None = None,
    allow_same_kernel: bool = False,
) -> ServiceBenchResult:
    """Run the interleaved rounds; the service is always put back (see the module doc). An A/B
    whose variants all run the same attention kernel is refused (`ab_kernels`) unless
    `allow_same_kernel`."""
    request.check()
    svc = check_variants(host, request.variants)
    url = service_url(svc, host.name)
    say = on_progress or (lambda _t: None)
    started = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    order = round_order(request.variants, request.rounds)
    runs: list[dict] = []
    servers: list[dict] = []
    try:
        ab = _run_rounds(transport, host, request, url, say, order, runs, servers,
                         health_interval, allow_same_kernel)  # fmt: skip
    except KerneldevError as err:
        if runs:
            data = _assembled(host, request, url, started, runs, servers)
            _keep_partial(err, data, runs, host, results_dir)
        raise
    data = _assembled(host, request, url, started, runs, servers)
    data["kerneldev"] = {
        "host": host.name,
        "env_file": svc.env_file,
        "env_file_warnings": ab.kernels.warnings,
        "restored": True,
    }
    _record_kernels(data, ab.kernels)
    saved, save_error = try_save_result(data, results_dir or RESULTS_DIR, f"{host.name}-service")
    return ServiceBenchResult(data, saved, ab.switcher.restart_skipped, save_error=save_error)


def _keep_partial(
    err: KerneldevError,
    data: dict,
    runs: list[dict],
    host: HostConfig,
    results_dir: Path | None,
) -> None:
    """An A/B stopped after some levels were measured (a later variant never got healthy, the
    connection dropped, Ctrl-C, or putting the service back failed after the last round):
    those (`data`, `_assembled` from `runs`) are saved as a failed result (`ok` false,
    `stopped_by` the error; `complete` false unless every round ran), and the error's hint
    says where, so a long A/B that fails at its last variant does not lose the others."""
    # (complete here: every round ran, and the error came after them: putting the service back)
    data.update(ok=False, stopped_by=err.message)
    svc = host.service
    data["kerneldev"] = {"host": host.name, "env_file": svc.env_file if svc else None}
    saved, save_error = try_save_result(data, results_dir or RESULTS_DIR, f"{host.name}-service")
    what = f"{len({(r['round'], r['variant']) for r in runs})} variant round(s) measured before it"
    kind = "a result (every round ran)" if data["complete"] else "an incomplete result"
    note = (
        f"the {what} are saved as {kind}: {saved}"
        if saved
        else f"the {what} could not be saved: {save_error.message if save_error else '?'}"
    )
    err.hint = f"{err.hint}\n{note}" if err.hint else note


def _assembled(
    host: HostConfig,
    request: ServiceBenchRequest,
    url: str,
    started: str,
    runs: list[dict],
    servers: list[dict],
) -> dict:
    """The result of the rounds in `runs` (all of them, or those before an error), with
    `complete` (every planned round ran) and the server's settings."""
    data = build_result(host, request, url, started, runs)
    ran = {(r["round"], r["variant"]) for r in runs}
    data["complete"] = ran == set(round_order(request.variants, request.rounds))
    add_server_settings(data, servers)
    return data


def _run_rounds(
    transport: Transport,
    host: HostConfig,
    request: ServiceBenchRequest,
    url: str,
    say: Callable[[str], None],
    order: list[tuple[int, str]],
    runs: list[dict],
    servers: list[dict],
    health_interval: float | None,
    allow_same_kernel: bool,
):
    """The A/B's rounds inside its session (the service put back after them); `runs` and
    `servers` filled as each level is measured. Returns the (closed) session."""
    with ab_kernels.ab_session(
        transport,
        host,
        request.variants,
        say,
        health_interval=health_interval,
        allow_same_kernel=allow_same_kernel,
    ) as ab:
        for i, (rnd, name) in enumerate(order, 1):
            say(f"[{i}/{len(order)}] round {rnd + 1}, variant {name}")
            switch = ab.switcher.switch(name)
            out = ab.scripts.path(f"load-{i}.json")
            args = [
                "bench",
                "--url",
                url,
                "--concurrency",
                ",".join(str(c) for c in request.concurrency),
                "--requests",
                str(request.requests),
                "--input-len",
                str(request.input_len),
                "--max-new-tokens",
                str(request.max_new_tokens),
                "--warmup",
                str(request.warmup),
                "--out",
                out,
            ]
            done = transport.run(
                ab.scripts.command("service_load.py", args) + " 2>&1", on_output=_lines_to(say)
            )
            if not done.ok:
                raise BenchError(
                    f"the load generator failed on {host.name} (exit {done.exited})",
                    hint=(done.stdout + done.stderr).strip()[-2000:] or None,
                )
            try:
                load = json.loads(transport.read_bytes(out))
            except (KerneldevError, ValueError) as err:
                raise BenchError(f"the load generator left no readable result: {err}") from None
            servers.append({"round": rnd, "variant": name, **(load.get("server") or {})})
            for level in load["levels"]:
                m = level_metrics(level["requests"], level["duration"])
                say(
                    f"  {name} c={level['concurrency']}: median TPOT "
                    f"{_fmt(m['median_tpot_ms'])} ms, TTFT {_fmt(m['median_ttft_ms'])} ms, "
                    f"{_fmt(m['output_throughput'])} tok/s"
                    + (f", {m['failed']} failed" if m["failed"] else "")
                )
                for e in m["errors"]:
                    say(f"    {e['requests']} failed: {e['message'][:200]}")
                runs.append(
                    {
                        "round": rnd,
                        "variant": name,
                        "concurrency": level["concurrency"],
                        "healthy_after_s": switch.healthy_after_s,
                        "warmup_requests": level.get("warmup"),
                        "flush_cache": level.get("flush_cache"),
                        "duration": level["duration"],
                        "requests": level["requests"],
                        "metrics": m,
                    }
                )
    return ab


# --- the server's settings ---------------------------------------------------------------

# Settings that are the variant itself (its kernel), not a difference to warn about.
VARIANT_OWN_SETTINGS = ("kernel_variant", "kernel_sha256", "env")


def variant_server_settings(servers: list[dict]) -> dict[str, dict]:
    """Per variant: the server's settings it ran under (the first round's; a change between
    rounds of one variant is listed under `changed_between_rounds`)."""
    out: dict[str, dict] = {}
    for s in servers:
        settings = dict(s.get("settings") or {})
        kd = s.get("kerneldev") or {}
        for key in ("kernel_variant", "kernel_sha256", "device_name", "cuda_graph"):
            if key in kd:
                settings[f"kerneldev.{key}"] = kd[key]
        entry = out.setdefault(
            s["variant"],
            {"source": s.get("source"), "settings": settings, "changed_between_rounds": []},
        )
        if s.get("error") and not entry["settings"]:
            entry["error"] = s["error"]
        for key in sorted(set(settings) | set(entry["settings"])):
            if settings.get(key) != entry["settings"].get(key):
                if key not in entry["changed_between_rounds"]:
                    entry["changed_between_rounds"].append(key)
    return out


def server_differences(per_variant: dict[str, dict]) -> list[dict]:
    """The settings whose values differ between variants (the variant's own kernel aside)."""
    names = list(per_variant)
    keys = sorted({k for v in per_variant.values() for k in v["settings"]})
    diffs = []
    for key in keys:
        if key.split(".")[-1] in VARIANT_OWN_SETTINGS:
            continue
        values = {n: per_variant[n]["settings"].get(key) for n in names}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            diffs.append({"setting": key, "values": values})
    return diffs


def add_server_settings(data: dict, servers: list[dict]) -> None:
    per_variant = variant_server_settings(servers)
    data["server"] = per_variant
    data["server_differences"] = server_differences(per_variant)


def _lines_to(say: ProgressCallback) -> Callable[[str], None]:
    def forward(text: str) -> None:
        for line in text.splitlines():
            if line.strip():
                say(line)

    return forward


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _record_kernels(data: dict, kernels: ab_kernels.KernelCheck) -> None:
    """Per variant, the attention kernel the live dispatch reached (A/B runs only)."""
    if kernels.kernels:
        data["kernels"] = {
            n: {"kernel": k, "how": kernels.reasons.get(n)} for n, k in kernels.kernels.items()
        }


def build_result(
    host: HostConfig, request: ServiceBenchRequest, url: str, started: str, runs: list[dict]
) -> dict:
    svc = host.service
    results = []
    for name in request.variants:
        for c in request.concurrency:
            mine = [r for r in runs if r["variant"] == name and r["concurrency"] == c]
            results.append(
                {
                    "variant": name,
                    "concurrency": c,
                    "rounds": len(mine),
                    "metrics": pooled_metrics(mine),
                    "per_round": [r["metrics"] for r in mine],
                }
            )
    ab = []
    if len(request.variants) >= 2:
        a_name = request.variants[0]
        for b_name in request.variants[1:]:
            for c in request.concurrency:
                a = next(r for r in results if r["variant"] == a_name and r["concurrency"] == c)
                b = next(r for r in results if r["variant"] == b_name and r["concurrency"] == c)
                metrics = {}
                for metric in VERDICT_METRICS:
                    av, bv = a["metrics"][metric], b["metrics"][metric]
                    metrics[metric] = {
                        "a": av,
                        "b": bv,
                        "ratio": (bv / av) if av and bv is not None else None,
                        "verdict": verdict(
                            metric,
                            [m[metric] for m in a["per_round"]],
                            [m[metric] for m in b["per_round"]],
                        ),
                    }
                ab.append({"a": a_name, "b": b_name, "concurrency": c, "metrics": metrics})
    ok = all(r["metrics"]["failed"] == 0 and r["metrics"]["completed"] > 0 for r in results)
    return {
        "schema": SCHEMA,
        "timestamp": started,
        "ok": ok,
        "url": url,
        "settings": {
            "variants": request.variants,
            "variant_env": {n: dict(svc.variants[n]) for n in request.variants} if svc else {},
            "concurrency": request.concurrency,
            "requests": request.requests,
            "input_len": request.input_len,
            "max_new_tokens": request.max_new_tokens,
            "rounds": request.rounds,
            "warmup": request.warmup,
            "order": [[r, v] for r, v in round_order(request.variants, request.rounds)],
        },
        "results": results,
        "ab": ab,
        "runs": [{k: v for k, v in r.items() if k != "requests"} for r in runs],
    }
