"""Transports: how kerneldev reaches a host (SSH or this machine)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kerneldev.hosts.transport.base import CommandResult, OutputCallback, RemoteFile, Transport

if TYPE_CHECKING:
    from kerneldev.config import HostConfig

__all__ = ["CommandResult", "OutputCallback", "RemoteFile", "Transport", "open_transport"]


def open_transport(
    host: HostConfig,
    *,
    ssh_config: str | Path | None = None,
    connect_timeout: float | None = None,
    keep: bool | None = None,
) -> Transport:
    """The transport for a configured host, not yet connected (it connects on first use).

    `ssh_config` and `connect_timeout` apply to SSH hosts only (a `transport: local` host has
    nothing to dial): `ssh_config` is the ssh_config file to honour instead of
    $KERNELDEV_SSH_CONFIG / ~/.ssh/config (`"none"` reads none); `connect_timeout` is in
    seconds, None for the default. An SSH host goes through its kept session (started now if
    none runs: `session/`) unless `keep` is False, $KERNELDEV_NO_KEEP is set or the config's
    `session.keep` is false; then, or where no session can be kept, it connects one-shot: over
    the system's OpenSSH client where it can, else paramiko (`one_shot`, the host's
    `ssh_client`)."""
    if host.transport == "local":
        from kerneldev.hosts.transport.local import LocalTransport

        return LocalTransport(host)
    from kerneldev.hosts.transport.session.client import keep_wanted, open_kept

    if keep_wanted(host, keep):
        kept = open_kept(host, ssh_config=ssh_config, connect_timeout=connect_timeout)
        if kept is not None:
            return kept
    from kerneldev.hosts.transport.one_shot import OneShotTransport, paramiko_transport
    from kerneldev.hosts.transport.openssh import ssh_client

    # paramiko is imported only where it is used: not by commands that never connect, nor by
    # one-shot commands that go through the system's ssh.
    if ssh_client(host) == "paramiko":
        return paramiko_transport(host, ssh_config=ssh_config, connect_timeout=connect_timeout)
    return OneShotTransport(host, ssh_config=ssh_config, connect_timeout=connect_timeout)
