"""`kerneldev profile`: parse, call `kerneldev.bench.profile`, render the top kernels (or JSON)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from kerneldev.cli.commands.bench import allow_same_kernel_option
from kerneldev.cli.common import HOST_OPTION, JSON_OPTION, config_path, variants_option
from kerneldev.cli.output import NUMBER, Column, print_info, print_json, print_line
from kerneldev.errors import BenchError

# The core (kerneldev.bench.profile, the service bench, the config) is imported by the command,
# not here: `kerneldev --help` imports this module to list it.
if TYPE_CHECKING:
    from kerneldev.bench import profile as decode_profile


def profile_command(
    ctx: typer.Context,
    variants: str = variants_option(
        "Comma-separated names from service.variants; the service is restarted on each "
        "and put back on its original settings at the end."
    ),
    concurrency: int = typer.Option(
        8, "--concurrency", min=1, metavar="N", help="Requests in flight."
    ),
    steps: int = typer.Option(
        32, "--steps", min=1, metavar="N", help="Decode steps to profile (new tokens per request)."
    ),
    top: int = typer.Option(15, "--top", min=1, metavar="K", help="Kernels to show per variant."),
    allow_same_kernel: bool = allow_same_kernel_option("Profile"),
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Profile the service's decode per variant: top kernels by GPU time, by family."""
    from kerneldev.bench import profile as decode_profile
    from kerneldev.cli.commands.service_bench import progress_printer, service_session
    from kerneldev.config import load_config
    from kerneldev.service.variants import check_variants, parse_variants

    config = load_config(config_path(ctx))
    host = config.host(host_name)
    names = parse_variants(variants)
    check_variants(host, names)  # exit 2 before connecting
    with service_session(host, "profile") as transport:
        result = decode_profile.run_profile(
            transport,
            host,
            names,
            concurrency=concurrency,
            steps=steps,
            top=top,
            on_progress=progress_printer(),
            profiles_dir=config.path.parent / decode_profile.PROFILES_DIR,
            allow_same_kernel=allow_same_kernel,
        )
    if as_json and result.save_error is None:
        print_json(result)  # else the error's JSON below carries it: one document on stdout
    elif not as_json:
        render(result)
    for v in result.variants:
        print_info(f"trace ({v.variant}): {v.local_trace or v.trace_on_host}")
    if result.save_error is not None:
        # The profile is shown (or in --json's report) before the error: nothing is lost.
        raise BenchError(
            result.save_error,
            hint="the profile is printed but not saved; make the profiles folder one you can "
            "write (a file may be in the way), then run again",
            report=result if as_json else None,
        )
    print_info(f"saved: {result.saved_to}")


def render(result: decode_profile.ProfileResult) -> None:
    from kerneldev.cli.commands.service_bench import table

    kind = "GPU" if result.time_kind == "gpu" else "CPU"
    note = (
        ""
        if result.time_kind == "gpu"
        else " (no GPU kernels: the service's profiler ranges, CPU time)"
    )
    names = [v.variant for v in result.variants]
    # One row per kernel name seen in any variant's top list; A/B columns side by side.
    order: list[str] = []
    rows_by_variant = {}
    for v in result.variants:
        rows_by_variant[v.variant] = {r["name"]: r for r in v.summary["top"]}
        for r in v.summary["top"]:
            if r["name"] not in order:
                order.append(r["name"])
    columns = [Column("kernel"), Column("family", drop_order=5)]
    for n in names:
        columns += [
            Column(f"{n} calls", NUMBER, drop_order=3),
            Column(f"{n} ms", NUMBER, drop_order=4),
            Column(f"{n} %", NUMBER),
            Column(f"{n} µs", NUMBER, drop_order=1),
        ]
    rows = []
    for name in order:
        first = next(rows_by_variant[n][name] for n in names if name in rows_by_variant[n])
        row = [_short(name), first["family"]]
        for n in names:
            r = rows_by_variant[n].get(name)
            if r is None:
                row += ["-", "-", "-", "-"]
            else:
                share = "-" if r["share"] is None else f"{100 * r['share']:.1f}"
                row += [str(r["calls"]), f"{r['total_ms']:.2f}", share, f"{r['mean_us']:.1f}"]
        rows.append(row)
    title = (
        f"top kernels by {kind} time during decode: c={result.concurrency}, "
        f"{result.steps} steps{note}"
    )
    table(title, columns, rows)
    fam_line = []
    for v in result.variants:
        fams = ", ".join(
            f"{f['family']} {100 * (f['share'] or 0):.0f}%" for f in v.summary["families"]
        )
        fam_line.append(f"{v.variant}: {fams} (of {v.summary['total_ms']:.1f} ms {kind})")
    for line in fam_line:
        print_line(line)


def _short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def register(app: typer.Typer) -> None:
    app.command("profile", short_help="Top GPU kernels of the service's decode, per variant.")(
        profile_command
    )
