"""What names a kept session: the connection it holds, as one short key.

Two commands share a holder exactly when they would make the same connection from the same
config file: the same local user and home folder, host entry (name, address, user, port, key,
known_hosts, interpreter), ssh_config file and hosts.yaml. The key is part of the socket's
name, so a changed entry reaches another holder (the old one sees the change itself and
retires: `freshness.py`). The config file takes part because a holder belongs to one: it
watches that file, takes its `session` settings and logs in its workspace; two workspaces
(two hosts.yaml) that name a host alike, even with the same entry, each get their own holder,
and `session stop` in one never ends the other's (with $XDG_RUNTIME_DIR their sockets share
one folder)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from kerneldev import __version__
from kerneldev.config import HostConfig
from kerneldev.hosts.transport.ssh_config_file import ssh_config_path

KEY_CHARS = 16  # hex characters of the key in a socket's name
AGENT = "agent.py"  # the host agent's source, in kerneldev/hostside/


def connection_fields(host: HostConfig) -> dict:
    """The parts of a host entry that decide the connection (and the agent's interpreter)."""
    return {
        "name": host.name,
        "hostname": host.hostname,
        "user": host.user,
        "port": host.port,
        "identity_file": _text(host.identity_file),
        "known_hosts": _text(host.known_hosts),
        "python": host.python,
    }


def session_key(host: HostConfig, ssh_config: str | Path | None = None) -> str:
    """The key of the session to `host` for this user (`ssh_config` as for `open_transport`)."""
    config = str(host.config_path) if host.config_path is not None else None
    return key_of(connection_fields(host), resolved_ssh_config(ssh_config), config)


def key_of(fields: dict, ssh_config: str | None, config: str | None = None) -> str:
    # HOME: ~/.ssh's keys and known_hosts take part in the connection too.
    home = os.path.expanduser("~")
    ident = {
        "uid": os.getuid(),
        "home": home,
        "host": fields,
        "ssh_config": ssh_config,
        "config": config,
    }
    blob = json.dumps(ident, sort_keys=True).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:KEY_CHARS]


def resolved_ssh_config(ssh_config: str | Path | None = None) -> str | None:
    """The ssh_config file the connection honours, as text ("none" when none)."""
    path = ssh_config_path(ssh_config)
    return str(path) if path is not None else "none"


_REMEMBERED: str | None = None  # the warm process's code stamp, read once (remember_code_stamp)


def code_stamp() -> str:
    """kerneldev's version and the holder's and agent's sources: a holder started by other
    code is replaced, not spoken to."""
    if _REMEMBERED is not None:
        return _REMEMBERED
    import kerneldev.hostside

    digest = hashlib.sha256(__version__.encode())
    here = Path(__file__).parent
    for path in (*sorted(here.glob("*.py")), Path(kerneldev.hostside.__file__).parent / AGENT):
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(str(path).encode())
    return digest.hexdigest()[:KEY_CHARS]


def remember_code_stamp() -> str:
    """Read the sources once, for the warm process (cli/warm.py) and the commands it forks:
    ~5 ms less per kept command. Safe because its clients' stamp covers the size and mtime of
    every kerneldev file: with a source changed since, no command reaches its children."""
    global _REMEMBERED
    _REMEMBERED = None
    _REMEMBERED = code_stamp()
    return _REMEMBERED


def _text(path: Path | None) -> str | None:
    return str(path) if path is not None else None
