"""Trusting a host's SSH key: scan the key the host offers, decide what it means against the
known_hosts files, record it once the user agreed, and say what happened.

The decision (the rules are in `kerneldev.hosts.hostkeys`):
- the key is on record: nothing to do ("already-trusted");
- it is unknown: `confirm(offer)` is asked; yes records it ("added"), no leaves it ("declined");
- it changed or is revoked: `HostKeyError`, never overridden here;
- a `transport: local` host has no key ("local").

With ProxyJump the first untrusted key on the way is offered (a jump host's before the target's),
since a hop has to be trusted before anything behind it can be reached; `TrustResult.jump_host`
then says so, and trusting again checks the next key.

The CLI only asks the question and renders the result; this module never imports typer or rich.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kerneldev.config import HostConfig

ALREADY_TRUSTED, ADDED, DECLINED, LOCAL = "already-trusted", "added", "declined", "local"


@dataclass(frozen=True)
class KeyOffer:
    """An unknown key, shown to the user before it is recorded."""

    host: str  # the config's name for the host
    known_hosts_name: str  # `host` or `[host]:port`, as it would be written in known_hosts
    key_type: str
    fingerprint: str  # SHA256:..., as `ssh-keygen -l` prints it
    known_hosts: str  # the file it would be added to
    jump_host: bool  # the key is a ProxyJump hop's, on the way to `host`


@dataclass(frozen=True)
class TrustResult:
    host: str
    known_hosts_name: str | None  # `host` or `[host]:port`, as written in known_hosts
    key_type: str | None
    fingerprint: str | None
    status: str  # "already-trusted", "added", "declined" or "local"
    known_hosts: str | None  # the file that was read/written
    jump_host: bool = False  # the key is a ProxyJump hop's: trust again for the next key


def trust_host(
    host: HostConfig,
    confirm: Callable[[KeyOffer], bool],
    *,
    ssh_config: str | Path | None = None,
) -> TrustResult:
    """Check the key `host` offers and record it if it is unknown and `confirm` says yes.
    Raises `HostKeyError` for a changed or revoked key and `HostConnectionError` when the host
    cannot be reached; `ssh_config` as for `open_transport`."""
    if host.transport == "local":
        return TrustResult(host.name, None, None, None, LOCAL, None)
    # Imported here: paramiko loads only when a key is really scanned.
    from kerneldev.hosts import hostkeys
    from kerneldev.hosts.transport.ssh_connection import SSHConnection

    with SSHConnection(host, ssh_config=ssh_config) as connection:
        check = connection.scan_host_key()
        if check.status not in ("trusted", "unknown"):
            # changed or revoked: the refusal says what happened and how to fix it
            raise hostkeys.refusal(check, host.name, connection.trust_path)
        target = connection.target()
        via_jump = check.name != hostkeys.known_hosts_name(target.hostname, target.port)
        known_hosts = str(connection.trust_path)
        if check.status == "trusted":
            status = ALREADY_TRUSTED
        else:
            offer = KeyOffer(
                host.name, check.name, check.key_type, check.fingerprint, known_hosts, via_jump
            )
            if confirm(offer):
                connection.trust(check)
                status = ADDED
            else:
                status = DECLINED
    return TrustResult(
        host=host.name,
        known_hosts_name=check.name,
        key_type=check.key_type,
        fingerprint=check.fingerprint,
        status=status,
        known_hosts=known_hosts,
        jump_host=via_jump,
    )
