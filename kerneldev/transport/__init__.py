"""Transports: how kerneldev reaches a host (SSH or this machine)."""

from kerneldev.transport.base import CommandResult, RemoteFile, Transport

__all__ = ["CommandResult", "RemoteFile", "Transport", "open_transport"]


def open_transport(host_config, **kwargs) -> Transport:
    """The transport for a configured host (`config.HostConfig`)."""
    if host_config.transport == "local":
        from kerneldev.transport.local import LocalTransport

        return LocalTransport(host_config, **kwargs)
    from kerneldev.transport.ssh import SSHTransport

    return SSHTransport(host_config, **kwargs)
