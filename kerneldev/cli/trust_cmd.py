"""`kerneldev trust`: show the host's key and, once the user confirms, record it in known_hosts."""

from __future__ import annotations

from dataclasses import dataclass

import typer

from kerneldev.cli.common import HOST_OPTION, JSON_OPTION, load_host
from kerneldev.cli.output import print_info, print_json
from kerneldev.errors import ExitCode


@dataclass(frozen=True)
class TrustResult:
    host: str
    known_hosts_name: str | None  # `host` or `[host]:port`, as written in known_hosts
    key_type: str | None
    fingerprint: str | None
    status: str  # "already-trusted", "added", "declined" or "local"
    known_hosts: str | None  # the file that was read/written


def register(app: typer.Typer) -> None:
    app.command("trust")(trust)


def trust(
    ctx: typer.Context,
    host: str = HOST_OPTION,
    yes: bool = typer.Option(False, "--yes", "-y", help="Add the key without asking."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Show the host's SSH key (type and SHA256 fingerprint) and add it to known_hosts."""
    from kerneldev import hostkeys
    from kerneldev.transport.ssh import SSHTransport  # paramiko: only when trust runs

    host_config = load_host(ctx, host)
    if host_config.transport == "local":
        result = TrustResult(host_config.name, None, None, None, "local", None)
        _render(result, json_out)
        return
    unanswered = False
    with SSHTransport(host_config) as transport:
        # An unknown key comes back for confirmation; a changed or revoked one raises.
        check = transport.scan_host_key()
        if check.status in ("changed", "revoked"):
            raise hostkeys.refusal(check, host_config.name, transport.trust_path)
        target = transport.target()
        via_jump = check.name != hostkeys.known_hosts_name(target.hostname, target.port)
        status = "already-trusted" if check.status == "trusted" else None
        if status is None:
            who = (
                f"jump host {check.name} (on the way to '{host_config.name}')"
                if via_jump
                else (f"host '{host_config.name}' ({check.name})")
            )
            print_info(f"{who} offers this key:\n  {check.key_type} {check.fingerprint}")
            answer = True if yes else _confirm(f"Add it to {transport.trust_path}?")
            if answer:
                transport.trust(check)
                status = "added"
            else:
                status = "declined"
                unanswered = answer is None
        result = TrustResult(
            host=host_config.name,
            known_hosts_name=check.name,
            key_type=check.key_type,
            fingerprint=check.fingerprint,
            status=status,
            known_hosts=str(transport.trust_path),
        )
    _render(result, json_out)
    if via_jump and status == "added":
        print_info("run `kerneldev trust` again to check the key of the host behind it")
    if status == "declined":
        if unanswered:
            print_info("nobody answered (no terminal on stdin): `kerneldev trust --yes` adds it")
        raise typer.Exit(int(ExitCode.FAILURE))


def _confirm(question: str) -> bool | None:
    """The user's answer; None when stdin ended without one (a script, no terminal)."""
    try:
        # err=True: the question goes to stderr so stdout stays data (for --json).
        return typer.confirm(question, default=False, err=True)
    except typer.Abort:  # EOF on stdin: nobody said yes
        return None


def _render(result: TrustResult, json_out: bool) -> None:
    if json_out:
        print_json(result)
        return
    messages = {
        "local": f"host '{result.host}' is this machine (transport: local): no key to trust",
        "already-trusted": f"host '{result.host}' ({result.known_hosts_name}) is already "
        f"trusted: {result.key_type} {result.fingerprint} (in {result.known_hosts})",
        "added": f"added {result.key_type} {result.fingerprint} for {result.known_hosts_name} "
        f"to {result.known_hosts}",
        "declined": "not added: the key stays untrusted",
    }
    print_info(messages[result.status])
