"""`kerneldev trust`: show the host's key and, once the user confirms, record it in known_hosts.
The workflow is `kerneldev.hosts.trust`; this module asks the question and renders the result."""

from __future__ import annotations

import typer

from kerneldev import interrupt
from kerneldev.cli import environment
from kerneldev.cli.common import HOST_OPTION, JSON_OPTION, flag, load_host
from kerneldev.cli.output import print_info, print_json
from kerneldev.errors import RefusedError
from kerneldev.hosts import trust as trust_core


def register(app: typer.Typer) -> None:
    app.command("trust", short_help="Show the host's SSH key and add it to known_hosts.")(trust)


def trust(
    ctx: typer.Context,
    host: str = HOST_OPTION,
    yes: bool = flag("--yes", "-y", help="Add the key without asking."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Show the host's SSH key (type and SHA256 fingerprint) and add it to known_hosts."""
    host_config = load_host(ctx, host)
    unanswered: str | None = None  # why no answer came, when none did

    def confirm(offer: trust_core.KeyOffer) -> bool:
        nonlocal unanswered
        who = (
            f"jump host {offer.known_hosts_name} (on the way to '{offer.host}')"
            if offer.jump_host
            else f"host '{offer.host}' ({offer.known_hosts_name})"
        )
        print_info(f"{who} offers this key:\n  {offer.key_type} {offer.fingerprint}")
        if yes:
            return True
        if not environment.current().stdin_isatty:
            # Nobody to answer (a script, CI): no prompt, and a piped "y" never adds a key.
            unanswered = "no terminal on stdin"
            return False
        answer = _ask(f"Add it to {offer.known_hosts}?")
        if answer is None:
            unanswered = "stdin ended"
        return bool(answer)

    result = trust_core.trust_host(host_config, confirm)
    if result.status == trust_core.DECLINED:
        # An error (exit 1), so --json's object carries `error` beside the offered key.
        if unanswered:
            raise RefusedError(
                f"not added: nobody answered ({unanswered}); the key of "
                f"{result.known_hosts_name} stays untrusted",
                "check the fingerprint above, then `kerneldev trust --yes` adds it",
                report=result,
            )
        raise RefusedError(
            f"not added: the key of {result.known_hosts_name} stays untrusted",
            "run `kerneldev trust` again and answer y, or `kerneldev trust --yes`",
            report=result,
        )
    _render(result, json_out)
    if result.jump_host and result.status == trust_core.ADDED:
        print_info("run `kerneldev trust` again to check the key of the host behind it")


def _ask(question: str) -> bool | None:
    """The user's answer; None when stdin ended without one (the terminal closed)."""
    try:
        # err=True: the question goes to stderr so stdout stays data (for --json).
        with interrupt.prompt():  # Ctrl-C ends the wait for an answer at once
            return typer.confirm(question, default=False, err=True)
    except typer.Abort:  # EOF on stdin (nobody said yes), or Ctrl-C at the prompt
        if interrupt.requested():  # Ctrl-C: stop as interrupted, not as "nobody answered"
            print_info("")  # end the prompt's line
            interrupt.check()
        return None


def _render(result: trust_core.TrustResult, json_out: bool) -> None:
    if json_out:
        print_json(result)
        return
    messages = {
        trust_core.LOCAL: f"host '{result.host}' is this machine (transport: local): "
        "no key to trust",
        trust_core.ALREADY_TRUSTED: f"host '{result.host}' ({result.known_hosts_name}) is already "
        f"trusted: {result.key_type} {result.fingerprint} (in {result.known_hosts})",
        trust_core.ADDED: f"added {result.key_type} {result.fingerprint} for "
        f"{result.known_hosts_name} to {result.known_hosts}",
    }
    print_info(messages[result.status])
