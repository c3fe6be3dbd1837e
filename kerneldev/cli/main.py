"""Entry point: builds the typer app from one module per command group and maps errors to exit
codes in one place."""

from __future__ import annotations

import sys

import typer

from kerneldev.errors import KerneldevError

app = typer.Typer(
    name="kerneldev",
    help="Pull, diff, push, restart and benchmark the live kernels of a remote inference server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _global_options(
    ctx: typer.Context,
    config: str = typer.Option(
        None,
        "--config",
        envvar="KERNELDEV_CONFIG",
        help="Path of hosts.yaml (default: ./hosts.yaml).",
        show_envvar=True,
    ),
) -> None:
    ctx.obj = {"config_path": config}


def _register_commands() -> None:
    # Each module adds its own commands; importing them here keeps `kerneldev --help` complete.
    from kerneldev.cli import (  # noqa: F401
        bench_cmd,
        demo_cmd,
        loop_cmd,
        service_cmd,
        trust_cmd,
    )

    for module in (loop_cmd, service_cmd, trust_cmd, bench_cmd, demo_cmd):
        module.register(app)


def run() -> None:
    """Console-script entry: run the app, turning expected errors into one-line messages."""
    from kerneldev.cli.output import print_error

    _register_commands()
    try:
        # Standalone mode: typer itself reports usage errors (exit 2), --help and typer.Exit
        # codes; only our own errors (and bugs, which keep their traceback) come out here.
        app()
    except KerneldevError as err:
        print_error(err.message, err.hint)
        sys.exit(int(err.exit_code))
    except KeyboardInterrupt:
        print_error("interrupted")
        sys.exit(130)
