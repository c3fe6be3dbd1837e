"""`kerneldev bench --service`: parse, call `kerneldev.bench.service_bench`, render (or JSON).

Reached through `kerneldev bench --service` (bench_cmd.py hands over here), so the options
live on the bench command; this module does the work and the rendering.
"""

from __future__ import annotations

import contextlib

from kerneldev.bench import service_bench
from kerneldev.cli.output import (
    NUMBER,
    Column,
    err_console,
    fit_lines,
    print_info,
    print_json,
    print_line,
    print_table,
    print_warning,
)
from kerneldev.config import Config, HostConfig
from kerneldev.errors import BenchError, ExitCode
from kerneldev.hosts.transport import open_transport
from kerneldev.service.variants import check_variants, parse_variants

# The A/B lines a person reads; the JSON has a verdict for every statistic.
HEADLINE_METRICS = (
    ("median_ttft_ms", "TTFT median"),
    ("median_tpot_ms", "TPOT median"),
    ("p99_tpot_ms", "TPOT p99"),
    ("median_itl_ms", "ITL median"),
    ("median_e2e_latency_ms", "E2E median"),
    ("output_throughput", "output tok/s"),
)


def progress_printer():
    """Progress lines on stderr, only on a terminal."""
    if not err_console.is_terminal:
        return None
    return lambda text: err_console.print(
        fit_lines(text, err_console.width), style="dim", markup=False, soft_wrap=True
    )


@contextlib.contextmanager
def service_logs_shown(host):
    """An unhealthy restart's logs go to stderr, as `kerneldev restart` shows them."""
    from kerneldev.cli.host_steps import print_service_logs
    from kerneldev.service.restart import UnhealthyError

    try:
        yield
    except UnhealthyError as err:
        print_service_logs(err, host.service.logs if host.service else None)
        raise


def make_request(
    variants: str,
    concurrency: str,
    requests: int,
    input_len: int,
    max_new_tokens: int,
    rounds: int,
    warmup: int = 2,
) -> service_bench.ServiceBenchRequest:
    """The checked request (exit 2 on bad values, before connecting)."""
    request = service_bench.ServiceBenchRequest(
        variants=parse_variants(variants),
        concurrency=service_bench.parse_concurrency(concurrency),
        requests=requests,
        input_len=input_len,
        max_new_tokens=max_new_tokens,
        rounds=rounds,
        warmup=warmup,
    )
    request.check()
    return request


LOCK_WAIT = 60.0  # seconds, as `restart`'s default --lock-wait


@contextlib.contextmanager
def host_locked(transport, host, command: str):
    """The host's lock for a whole A/B: it rewrites service.env_file and restarts the service,
    so a second A/B (or a push, a restart) at the same time would restart the service under
    the first one's requests and leave the env file on a variant's settings."""
    from kerneldev.cli.host_steps import locked

    lock = locked(transport, host, command, False, LOCK_WAIT)
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def service_session(host, command: str):
    """What an A/B of the service (`bench --service`, `profile`) runs in: a connection, the
    host's lock for the whole A/B (`host_locked`), an unhealthy restart's logs shown."""
    with (
        open_transport(host) as transport,
        host_locked(transport, host, command),
        service_logs_shown(host),
    ):
        yield transport


def run(
    config: Config,
    host: HostConfig,
    request: service_bench.ServiceBenchRequest,
    as_json: bool,
    allow_same_kernel: bool = False,
) -> int:
    """One host's A/B for the checked `request` (`make_request`); the exit code."""
    check_variants(host, request.variants)  # exit 2 before connecting
    with service_session(host, "bench --service") as transport:
        result = service_bench.run_service_bench(
            transport,
            host,
            request,
            on_progress=progress_printer(),
            results_dir=config.path.parent / service_bench.RESULTS_DIR,
            allow_same_kernel=allow_same_kernel,
        )
    report = service_report(result)
    if not as_json:
        render(result.data)
    elif result.save_error is None:
        print_json(report)  # else the error's JSON below carries it: one document on stdout
    if result.save_error is None:
        print_info(f"saved: {result.saved_to}")
    if not result.ok:
        print_warning("some requests failed (see `failed` in the result)")
    if result.save_error is not None:
        # The run is shown (or in --json's report) before the error: nothing measured is lost.
        err = result.save_error
        raise BenchError(err.message, err.hint, report=report if as_json else None)
    return int(ExitCode.FAILURE if not result.ok else ExitCode.OK)


def service_report(result: service_bench.ServiceBenchResult) -> dict:
    """The object `bench --service --json` prints."""
    return {"result": result.data, "saved_to": str(result.saved_to) if result.saved_to else None}


def _f(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def table(title: str, columns: list[Column], rows: list[list[str]]) -> None:
    """The one table renderer (fits the terminal, plain columns in a pipe)."""
    print_table(title, columns, rows, title_in_pipe=True)


def render(data: dict) -> None:
    s = data["settings"]
    title = (
        f"service decode timings, {s['requests']} requests x {s['max_new_tokens']} tokens "
        f"(input {s['input_len']}), {s['rounds']} round(s), ms"
    )
    columns = [
        Column("c", NUMBER),
        Column("variant"),
        Column("TTFT med/p90/p99", NUMBER, drop_order=3),
        Column("TPOT med/p90/p99", NUMBER),
        Column("ITL med/p99", NUMBER, drop_order=2),
        Column("E2E med", NUMBER, drop_order=4),
        Column("tok/s", NUMBER),
        Column("req/s", NUMBER, drop_order=1),
    ]
    rows = []
    for r in sorted(
        data["results"], key=lambda r: (r["concurrency"], s["variants"].index(r["variant"]))
    ):
        m = r["metrics"]
        rows.append(
            [
                str(r["concurrency"]),
                r["variant"],
                f"{_f(m['median_ttft_ms'])}/{_f(m['p90_ttft_ms'])}/{_f(m['p99_ttft_ms'])}",
                f"{_f(m['median_tpot_ms'])}/{_f(m['p90_tpot_ms'])}/{_f(m['p99_tpot_ms'])}",
                f"{_f(m['median_itl_ms'])}/{_f(m['p99_itl_ms'])}",
                _f(m["median_e2e_latency_ms"]),
                _f(m["output_throughput"]),
                _f(m["request_throughput"], ".2f"),
            ]
        )
    table(title, columns, rows)
    for line in ab_lines(data):
        print_line(line)
    for line in failure_lines(data):
        print_warning(line)
    for line in server_difference_lines(data):
        print_warning(line)


def failure_lines(data: dict) -> list[str]:
    """One line per failure message and variant/concurrency, with the server's words."""
    lines = []
    for r in data["results"]:
        for e in r["metrics"].get("errors") or []:
            lines.append(
                f"{r['variant']} c={r['concurrency']}: {e['requests']} failed: {e['message'][:300]}"
            )
    return lines


def server_difference_lines(data: dict) -> list[str]:
    """The server settings that differ between variants: the A/B timed more than a kernel."""
    lines = []
    for d in data.get("server_differences") or []:
        values = ", ".join(f"{n}={v!r}" for n, v in d["values"].items())
        lines.append(f"server setting differs between variants: {d['setting']}: {values}")
    for name, v in (data.get("server") or {}).items():
        if v.get("changed_between_rounds"):
            keys = ", ".join(v["changed_between_rounds"])
            lines.append(f"server settings changed between rounds of {name}: {keys}")
    return lines


def ab_lines(data: dict) -> list[str]:
    lines = []
    for ab in data["ab"]:
        parts = []
        for key, label in HEADLINE_METRICS:
            m = ab["metrics"][key]
            ratio = f" {m['ratio']:.2f}x" if m["ratio"] else ""
            parts.append(f"{label}{ratio} {m['verdict']}")
        lines.append(f"c={ab['concurrency']} {ab['b']} vs {ab['a']}: " + "; ".join(parts))
    return lines
