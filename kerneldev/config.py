"""hosts.yaml: where the hosts are, which files to track, how to restart the service.

Lookup order for the file: `--config PATH`, then `$KERNELDEV_CONFIG`, then `./hosts.yaml`.
Relative local paths in the file (workspace, mirror, identity_file, known_hosts) are resolved
against the file's folder. See hosts.example.yaml for every key.

TODO(core-transport helper): implement `load_config` with full validation (see issue 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ServiceConfig:
    restart: str | None = None  # shell command run on the host
    health: str | None = None  # http(s):// URL as seen from the host, or a shell command
    timeout: float = 900.0  # seconds to wait for health after a restart
    logs: str | None = None  # shell command whose output is shown when health never comes


@dataclass(frozen=True)
class HostConfig:
    name: str
    root: str  # absolute POSIX path of the live repo root on the host
    files: tuple[str, ...]  # relative to root; shell globs allowed
    workspace: Path  # absolute local folder
    transport: str = "ssh"  # "ssh" or "local"
    hostname: str | None = None
    user: str | None = None
    port: int | None = None
    identity_file: Path | None = None
    known_hosts: Path | None = None
    mirror: Path | None = None
    service: ServiceConfig | None = None
    python: str = "python3"  # interpreter on the host for the bench harness
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES for bench on the host


@dataclass(frozen=True)
class Config:
    path: Path
    default: str | None
    hosts: dict[str, HostConfig] = field(default_factory=dict)

    def host(self, name: str | None) -> HostConfig:
        """The named host, else $KERNELDEV_HOST, else `default`, else the only host."""
        raise NotImplementedError


def load_config(path: Path | str | None = None) -> Config:
    raise NotImplementedError
