"""`kerneldev bench`: parse, call `kerneldev.bench.kernel_bench`, render the table (or the JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kerneldev.cli import environment
from kerneldev.cli.common import (
    HOST_OPTION,
    JSON_OPTION,
    PARALLEL_OPTION,
    SHAPES_HELP,
    config_path,
    flag,
    select_hosts,
    variants_option,
)
from kerneldev.cli.output import (
    NUMBER,
    Cell,
    Column,
    print_info,
    print_json,
    print_line,
    print_table,
    print_warning,
)
from kerneldev.errors import BenchError, ExitCode, UsageError

if TYPE_CHECKING:
    from kerneldev.bench import kernel_bench as bench

# The core (kerneldev.bench.kernel_bench: the harness, the shapes, the workspace) and the
# config are imported by the command, not here: `kerneldev --help` and every other command
# import this module to register it.


def verdict_style(verdict: str) -> str | None:
    from kerneldev.bench import kernel_bench as bench

    return {
        bench.FASTER: "green",
        bench.SLOWER: "red",
        bench.NO_CHANGE: "dim",
        bench.FAILED: "bold red",
        bench.BASELINE_FAILED: "yellow",
        bench.NEW: "cyan",
    }.get(verdict)


# Module-level: typer options with list/Path defaults (ruff B008).
SHAPES_OPTION = typer.Option(
    None,
    "--shapes",
    metavar="SHAPES",
    help=SHAPES_HELP[0].upper() + SHAPES_HELP[1:] + "; "
    "repeatable, or ';'-separated. Default: decode (smoke with --cpu).",
    show_default=False,
)
COMPARE_OPTION = typer.Option(
    None,
    "--compare",
    metavar="FILE",
    help="An earlier result (saved JSON or --json output): mark each shape faster / slower / "
    "no change (no change = the p20-p80 intervals overlap).",
    show_default=False,
)


def allow_same_kernel_option(what: str):
    """--allow-same-kernel; `what` is done anyway (bench: measure, only with --service)."""
    return flag(
        "--allow-same-kernel",
        help=f"{what} even when every variant runs the same attention kernel "
        "(refused otherwise: a variable that did not take effect).",
    )


ALLOW_SAME_KERNEL_OPTION = allow_same_kernel_option("With --service: measure")


# The options of one of bench's two modes (parameter names): given in the other mode they are
# refused with exit 2 rather than ignored. --variants, --host, --parallel and --json serve both.
KERNEL_ONLY = ("shapes", "source", "compare_to", "gpu", "cpu", "rotate")
SERVICE_ONLY = (
    "concurrency",
    "requests",
    "input_len",
    "max_new_tokens",
    "rounds",
    "warmup",
    "allow_same_kernel",
)


def refuse_options_of_other_mode(ctx: typer.Context, on_service: bool) -> None:
    """Exit 2 naming each option given on the command line that the chosen mode does not use
    (`bench --service --shapes smoke`, `bench --rounds 3`), before anything is read or run."""
    names = KERNEL_ONLY if on_service else SERVICE_ONLY
    # By the enum's name: typer ships its own copy of click, whose ParameterSource is not
    # click's.
    sources = {name: ctx.get_parameter_source(name) for name in names}
    given = [
        param.opts[0]
        for param in ctx.command.params
        if param.name in names
        and sources[param.name] is not None
        and sources[param.name].name not in ("DEFAULT", "DEFAULT_MAP")
    ]
    if not given:
        return
    options = ", ".join(given)
    verb, it = ("applies", "it") if len(given) == 1 else ("apply", "them")
    if on_service:
        raise UsageError(
            f"{options} {verb} only without --service (to the kernel bench)",
            hint=f"drop {it} from `bench --service`, or run `kerneldev bench` without --service",
        )
    raise UsageError(
        f"{options} {verb} only with --service",
        hint=f"add --service to time the running service, or drop {it}",
    )


def bench_command(
    ctx: typer.Context,
    variants: str = variants_option(
        "Comma-separated variants of the kernel file: simt, mma, or dispatch (the "
        "file's own choice by environment), and flashinfer (FlashInfer's sm_120 DSv4 decode, "
        "where the host has it; else one line says why it was skipped). The first is the A "
        "of the A/B ratios."
    ),
    shapes: list[str] = SHAPES_OPTION,
    source: str = typer.Option(
        "bundled",
        "--source",
        metavar="SOURCE",
        help="Kernel file to run: bundled (this kerneldev's), workspace (your edited copy), "
        "or live (the file the server runs, benchmarked where it lies).",
    ),
    compare_to: Path = COMPARE_OPTION,
    gpu: str = typer.Option(
        None,
        "--gpu",
        metavar="IDS",
        help="CUDA_VISIBLE_DEVICES on the host (default: the host's `gpu`).",
    ),
    cpu: bool = flag(
        "--cpu",
        help="Run under the Triton interpreter on the host's CPU (tiny shapes; checks "
        "correctness, times are meaningless).",
    ),
    rotate: int = typer.Option(
        None,
        "--rotate",
        min=1,
        metavar="N",
        help="Input sets per shape (default 3).",
        show_default=False,
    ),
    parallel: int = PARALLEL_OPTION,
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
    # --- `bench --service`: decode timings of the running service ---
    on_service: bool = flag(
        "--service",
        help="Time the running service instead of the kernel: restart it on each of "
        "--variants (names from service.variants) in interleaved rounds and stream requests.",
    ),
    concurrency: str = typer.Option(
        "1,16,64",
        "--concurrency",
        metavar="LIST",
        help="With --service: requests in flight, comma-separated.",
    ),
    requests: int = typer.Option(
        None,
        "--requests",
        metavar="N",
        help="With --service: requests per concurrency level per round "
        "(default: 4 x the concurrency, at least 8).",
        show_default=False,
    ),
    input_len: int = typer.Option(
        128, "--input-len", metavar="N", help="With --service: prompt tokens (ids)."
    ),
    max_new_tokens: int = typer.Option(
        64, "--max-new-tokens", metavar="N", help="With --service: output tokens per request."
    ),
    rounds: int = typer.Option(
        2, "--rounds", metavar="N", help="With --service: rounds; variants alternate A B, B A, ..."
    ),
    warmup: int = typer.Option(
        2,
        "--warmup",
        metavar="N",
        help="With --service: warm-up requests before each level, at its concurrency "
        "(at least c of them; 0: none).",
    ),
    allow_same_kernel: bool = ALLOW_SAME_KERNEL_OPTION,
) -> None:
    """Check and time kernel variants on the host's GPU; A/B table, saved JSON.
    With --service: decode timings of the running service per variant (restarts it).
    An option of the other mode exits 2 naming it."""
    from kerneldev.config import load_config

    refuse_options_of_other_mode(ctx, on_service)
    config = load_config(config_path(ctx))
    hosts = select_hosts(config, host_name)
    if on_service:
        from kerneldev.cli.commands import service_bench as service_bench_cmd

        if requests is None:
            levels = [int(c) for c in concurrency.split(",") if c.strip().isdigit()] or [1]
            requests = max(8, 4 * max(levels))
        # One host: resolved before the request is checked (a group of one is refused first).
        host = config.host(host_name) if len(hosts) == 1 else None
        request = service_bench_cmd.make_request(
            variants, concurrency, requests, input_len, max_new_tokens, rounds, warmup
        )
        if host is None:
            from kerneldev.cli.commands import group as group_cmd

            return group_cmd.service_bench(
                config, hosts, request, parallel, as_json, allow_same_kernel=allow_same_kernel
            )
        code = service_bench_cmd.run(
            config, host, request, as_json, allow_same_kernel=allow_same_kernel
        )
        if code:
            raise typer.Exit(code)
        return
    from kerneldev.bench import kernel_bench as bench
    from kerneldev.hosts.transport import open_transport

    variant_list = [v.strip() for v in variants.split(",") if v.strip()]
    shape_list = list(shapes) if shapes else ["smoke" if cpu else "decode"]
    bench.check_request(variant_list, shape_list)  # exit 2 before connecting

    def run_harness(transport, host, on_output=None) -> bench.BenchResult:
        return bench.run_bench(
            transport,
            host,
            variant_list,
            shape_list,
            source=source,
            gpu=gpu,
            cpu_mode=cpu,
            on_output=on_output,
            results_dir=config.path.parent / bench.RESULTS_DIR,
            rotate=rotate,
        )

    if len(hosts) > 1:
        from kerneldev.cli.commands import group as group_cmd

        if compare_to is not None:
            raise UsageError(
                "--compare works on one host", hint="run it with --host NAME for that host"
            )
        return group_cmd.bench(
            hosts, run_harness, parallel=parallel, as_json=as_json, render=render
        )
    host = hosts[0]
    baseline = bench.load_result(compare_to) if compare_to else None

    with open_transport(host) as transport:
        result = run_harness(transport, host, on_output=_stream())
    comparison = (
        bench.compare(result.data, baseline, str(compare_to)) if baseline is not None else None
    )
    report = bench.bench_report(result, comparison)
    if not as_json:
        render(result, comparison)
    elif result.save_error is None:
        print_json(report)  # else the error's JSON below carries it: one document on stdout
    if comparison:
        for warning in comparison.warnings:
            print_warning(warning)
    service_env = result.data["kerneldev"].get("service_env") or {}
    if "dispatch" in variant_list:  # dispatch ran under the env file's switches
        for warning in service_env.get("warnings") or []:
            print_warning(f"{service_env['env_file']}: {warning}")
    if result.save_error is None:
        print_info(f"saved: {result.saved_to}")
    if not result.ok:
        bad = [f"{r['shape']} {r['label']}" for r in result.data["results"] if r["status"] != "ok"]
        print_warning("failed accuracy or did not run: " + "; ".join(bad))
    if result.save_error is not None:
        # The run is shown (or in --json's report) before the error: nothing measured is lost.
        err = result.save_error
        raise BenchError(err.message, err.hint, report=report if as_json else None)
    if not result.ok:
        raise typer.Exit(int(ExitCode.FAILURE))


def _stream():
    """The harness's progress lines on stderr, only on a terminal, each cut to the terminal's
    width (the harness fits its result lines to 80 columns, having no terminal on the host;
    a narrower terminal's own wrapping would bury the newest line)."""
    env = environment.current()
    if not env.stderr_isatty:
        return None
    width = max(env.err_console.width, 20)
    pending = ""

    def write(text: str) -> None:
        nonlocal pending
        *lines, pending = (pending + text).split("\n")
        for line in lines:
            env.stderr.write((line if len(line) < width else line[: width - 2] + "…") + "\n")
        env.stderr.flush()

    return write


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(result: bench.BenchResult, comparison: bench.Comparison | None) -> None:
    data = result.data
    ab = result.ab
    ratio_by_key = {(r.shape, r.label): r.speedup for r in ab.ratios}
    terminal = bool(environment.current().stdout_isatty)
    marks = (
        {"ok": Cell("✓", "green"), "failed": Cell("✗ failed", "bold red")}
        if terminal
        else {"ok": Cell("ok"), "failed": Cell("FAILED")}
    )
    marks["error"] = Cell("✗ error", "bold red") if terminal else Cell("ERROR")
    # On a narrow terminal the secondary numbers give way first (a pipe and --json keep them).
    columns = [
        Column("shape"),
        Column("variant"),
        Column("µs", NUMBER),
        Column("p20-p80", NUMBER, drop_order=1),
        Column("GB/s", NUMBER, drop_order=4),
        Column("% BW", NUMBER),
        Column("TFLOP/s", NUMBER, drop_order=3),
        Column("x floor", NUMBER, drop_order=2),
        Column("acc"),
    ]
    if ab.baseline_label and ab.ratios:
        columns.append(Column(f"vs {ab.baseline_label}", NUMBER))
    if comparison:
        columns.append(Column("vs baseline"))
    rows = []
    for r in data["results"]:
        timed = r["median_us"] is not None
        row = [
            r["shape"],
            r["label"],
            _fmt(r["median_us"], ".1f"),
            f"{r['p20_us']:.1f}-{r['p80_us']:.1f}" if timed else "-",
            _fmt(r["gbs"], ".0f"),
            _fmt(r["pct_copy_bw"], ".1f"),
            _fmt(r["tflops"], ".1f"),
            _fmt(r["x_floor"], ".1f"),
            marks.get(r["status"], Cell(str(r["status"]))),
        ]
        if ab.baseline_label and ab.ratios:
            speedup = ratio_by_key.get((r["shape"], r["label"]))
            row.append(f"{speedup:.2f}x" if speedup else "-")
        if comparison:
            row.append(_verdict_cell(comparison, r))
        rows.append(row)

    device = data.get("device") or {}
    title = f"{data.get('kerneldev', {}).get('source', '?')} kernel on {device.get('name')}"
    copy = data.get("copy_bandwidth")
    if copy:
        title += f" (copy {copy['gbs']:.0f} GB/s)"
    if data.get("timing") == "cpu-wallclock":
        title += " - CPU interpreter, times meaningless"
    print_table(title, columns, rows, title_in_pipe=True)

    for label, mean in ab.geomean.items():
        shapes = sum(1 for r in ab.ratios if r.label == label and r.speedup)
        text = f"{mean:.2f}x" if mean else "-"
        out_line(f"geomean {label} vs {ab.baseline_label}: {text} over {shapes} shape(s)")
    if comparison:
        for label, mean in comparison.geomean.items():
            text = f"{mean:.2f}x" if mean else "-"
            out_line(f"geomean {label} vs baseline {comparison.baseline}: {text}")
    for name, why in (data.get("skipped") or {}).items():
        out_line(f"skipped {name}: {why}")
    for note in data.get("notes") or []:  # the harness's (e.g. which MMA loops ran)
        out_line(note)


def _verdict_cell(comparison: bench.Comparison, r: dict) -> Cell | str:
    change = next(
        (c for c in comparison.changes if c.shape == r["shape"] and c.label == r["label"]), None
    )
    if change is None:
        return "-"
    text = change.verdict
    if change.speedup:
        text += f" {change.speedup:.2f}x"
    return Cell(text, verdict_style(change.verdict))


def out_line(text: str) -> None:
    print_line(text)


def register(app: typer.Typer) -> None:
    app.command("bench", short_help="Check and time kernel variants (or the service): A/B.")(
        bench_command
    )
