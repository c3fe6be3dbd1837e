"""What every command shares: the --host, --json and --no-import-check options and loading the
chosen host."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

# kerneldev.config (and yaml) is imported when a config is loaded: `--help` needs neither.
if TYPE_CHECKING:
    from kerneldev.config import Config, HostConfig


def flag(*names: str, help: str):
    """An off-by-default switch named `names` (the long name first, then any short one)."""
    return typer.Option(False, *names, help=help)


HOST_OPTION = typer.Option(
    None,
    "--host",
    metavar="NAME",
    # $KERNELDEV_HOST is read by Config.host (not by typer), so a typo in it is reported as
    # coming from the environment.
    help="Host name from the config (default: $KERNELDEV_HOST, then the host of the workspace "
    "you are in, then the config's `default`, or its only host). May precede the subcommand. "
    "pull, diff, push, restart, rollback and bench also take a group name or a comma list.",
    show_default=False,
)
PARALLEL_OPTION = typer.Option(
    8,  # kerneldev.hosts.fleet.DEFAULT_PARALLEL (not imported here: --help stays light)
    "--parallel",
    min=1,
    metavar="N",
    help="With a group of hosts: work on at most N hosts at a time (one connection each).",
)
# What `bench --shapes` and `watch --bench` accept, as kernels/dsv4_bench.py parses it (its
# SHAPE_SETS and spec keys; tests/test_bench_harness.py keeps the two in step). Spelled out
# here so that --help imports no harness.
SHAPE_SET_NAMES = ("decode", "flashmla", "paths", "prefill", "v41", "smoke")
SHAPE_KEYS = (
    "B H topk page extra_topk extra_page sink lengths invalid pad layout share prefill own".split()
)
SHAPES_HELP = (
    f"a named set ({', '.join(SHAPE_SET_NAMES)}) or one shape such as B=1,H=64,topk=512 "
    f"(keys: {' '.join(SHAPE_KEYS)}; see docs/usage.md)"
)
JSON_OPTION = flag("--json", help="Print the result as JSON on stdout (also on failure).")
# Every command that pushes (push, rollback, watch) can skip the import checks.
NO_IMPORT_CHECK_OPTION = flag(
    "--no-import-check",
    help="Skip the import checks: the scan of the live tree's imports before the upload and "
    "the import of the pushed modules after it.",
)


def variants_option(help: str):
    """--variants LIST: the variants to compare, in order (default simt,mma, the two of the
    bundled kernel); `help` says where the names come from for that command."""
    return typer.Option("simt,mma", "--variants", metavar="LIST", help=help)


def config_path(ctx: typer.Context) -> str | None:
    """The --config value given to the top-level command (or $KERNELDEV_CONFIG), if any."""
    root = ctx.find_root()
    obj = root.obj if isinstance(root.obj, dict) else (ctx.obj or {})
    return obj.get("config_path") if isinstance(obj, dict) else None


def load(ctx: typer.Context, host_name: str | None) -> tuple[Config, HostConfig]:
    """The config (found as `load_config` says; ConfigError exits 2) and the chosen host."""
    from kerneldev.config import load_config

    config = load_config(config_path(ctx))
    return config, config.host(host_name)


def load_hosts(ctx: typer.Context, host_name: str | None) -> tuple[Config, list[HostConfig]]:
    """The config and the hosts `--host` names: one host exactly as `load` picks it (same
    errors), or, for a group name or a comma list (also from $KERNELDEV_HOST or `default`),
    every host of it (`Config.hosts_for`)."""
    from kerneldev.config import load_config

    config = load_config(config_path(ctx))
    return config, select_hosts(config, host_name)


def select_hosts(config: Config, host_name: str | None) -> list[HostConfig]:
    """See `load_hosts`."""
    chosen = config.choose(host_name).value
    if chosen is not None and ("," in chosen or chosen in config.groups):
        return config.hosts_for(host_name)
    return [config.host(host_name)]


def load_host(ctx: typer.Context, host_name: str | None) -> HostConfig:
    """Load the config (raises ConfigError, exit 2) and pick the host to work on."""
    return load(ctx, host_name)[1]
