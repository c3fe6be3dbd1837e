"""What every command shares: the --host and --json options and loading the chosen host."""

from __future__ import annotations

import typer

from kerneldev.config import HostConfig, load_config

HOST_OPTION = typer.Option(
    None,
    "--host",
    envvar="KERNELDEV_HOST",
    help="Host name from the config (default: the config's `default`, or its only host).",
    show_envvar=True,
)
JSON_OPTION = typer.Option(False, "--json", help="Print the result as JSON on stdout.")


def config_path(ctx: typer.Context) -> str | None:
    """The --config value given to the top-level command (or $KERNELDEV_CONFIG), if any."""
    root = ctx.find_root()
    obj = root.obj if isinstance(root.obj, dict) else (ctx.obj or {})
    return obj.get("config_path") if isinstance(obj, dict) else None


def load_host(ctx: typer.Context, host_name: str | None) -> HostConfig:
    """Load the config (raises ConfigError, exit 2) and pick the host to work on."""
    return load_config(config_path(ctx)).host(host_name)
