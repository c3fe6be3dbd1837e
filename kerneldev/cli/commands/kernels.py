"""`kerneldev kernels install` and `kerneldev kernels status`: deploy the bundled kernels as an
edit that `push` checks and uploads, and tell what the live server runs."""

from __future__ import annotations

import typer

# kerneldev.bundled.install (the probe, the releases, the sync core) is imported by each
# command, not here: `kerneldev --help` and every other command import this module.
from kerneldev.bundled import DEFAULT_HEADS, MAX_HEADS
from kerneldev.cli.common import HOST_OPTION, JSON_OPTION, flag, load_host
from kerneldev.cli.output import HASH, PATH, STATUS, Column, print_info, print_json, print_warning

kernels_app = typer.Typer(
    name="kernels",
    help="Install the bundled DSv4 decode kernels into the workspace; show what runs live.",
    no_args_is_help=True,
)


@kernels_app.command("install", short_help="Put the bundled kernel file over the workspace copy.")
def install_command(
    ctx: typer.Context,
    with_wrapper: bool = flag(
        "--with-wrapper",
        help="Also replace the live wrapper flash_mla_sm120.py (only when the bundled one "
        "keeps its public names).",
    ),
    force: bool = flag("--force", help="Overwrite unpushed workspace edits of those files."),
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Put the bundled kernel file over the workspace copy of the live one (push deploys it)."""
    from kerneldev.bundled import install as kernel_deploy
    from kerneldev.cli.host_steps import print_patch, print_table
    from kerneldev.hosts.transport import open_transport

    host = load_host(ctx, host_name)
    with open_transport(host) as transport:
        result = kernel_deploy.install(transport, host, with_wrapper=with_wrapper, force=force)
    if as_json:
        print_json(result)
        return
    for f in result.files:
        if f.patch:
            print_patch(f.patch)
    print_table(
        f"kernels install into {result.workspace}",
        [
            Column("action", STATUS),
            Column("role"),
            Column("live", HASH),
            Column("bundled", HASH),
            Column("path", PATH),
        ],
        [(f.action, f.role, f.live_sha256, f.new_sha256, f.path) for f in result.files],
    )
    for note in result.notes:
        print_info(note)
    if any(f.action == "installed" for f in result.files):
        print_info("next: `kerneldev diff` and `kerneldev push --restart` (import-checked)")


@kernels_app.command("status", short_help="Is the live kernel the bundled one; which backend runs.")
def status_command(
    ctx: typer.Context,
    heads: int = typer.Option(
        DEFAULT_HEADS,
        "--heads",
        min=1,
        max=MAX_HEADS,
        metavar="N",
        help="Query heads per GPU of the server's attention layers (tp_q_head_num): the "
        "probe's decode and prefill calls use them.",
    ),
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Is the live kernel file the bundled one (which release), and which backend runs for
    decode and for prefill (probed from the live wrapper in the service's environment)?"""
    from kerneldev.bundled import install as kernel_deploy
    from kerneldev.cli.host_steps import print_table
    from kerneldev.hosts.transport import open_transport

    host = load_host(ctx, host_name)
    with open_transport(host) as transport:
        result = kernel_deploy.status(transport, host, heads=heads)
    for note in result.notes:
        print_warning(note)
    if as_json:
        print_json(result)
        return
    rows = []
    for s in result.sites:
        # what runs now: the running server's own values where they differ from the env file's
        backend = _runs(s.running or s.backend)
        if s.imported is False:
            backend = "not imported"
        rows.append((s.kernel.kind, s.kernel.release or "-", backend, s.kernel.path))
        if s.wrapper is not None:
            rows.append((s.wrapper.kind, s.wrapper.release or "-", "-", s.wrapper.path))
    columns = [
        Column("live file", STATUS),
        Column("release"),
        Column("decode/prefill"),
        Column("path", PATH),
    ]
    print_table(f"kernels on {result.host}", columns, rows)
    for s in result.sites:
        env = s.backend.environment or "unknown"
        if s.imported is False:
            print_info(f"{s.layout}: {s.backend.reason}")
        elif s.running is not None:
            now = s.running
            print_info(f"{s.layout} runs now (environment: {now.environment}): {now.reason}")
            alone = f"{s.layout} with {env} alone: {_runs(s.backend)}"
            print_info(alone + (f" ({s.backend.reason})" if s.backend.backend is None else ""))
        else:
            print_info(f"{s.layout} (environment: {env}): {s.backend.reason}")


def _runs(choice) -> str:
    """decode/prefill of a `BackendChoice`: one name when both calls reach the same backend."""
    runs = []
    for call in choice.calls or [None]:
        name = (call.backend if call else None) or "unknown"
        if call and call.kernel_variant:
            name += f" ({call.kernel_variant})"
        runs.append(name)
    return "/".join(runs) if len(set(runs)) > 1 else runs[0]


def register(app: typer.Typer) -> None:
    app.add_typer(
        kernels_app,
        name="kernels",
        short_help="Install the bundled DSv4 kernels; show what runs live.",
    )
