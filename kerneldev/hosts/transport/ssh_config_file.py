"""Which ssh_config file applies: `ssh_config=`, else $KERNELDEV_SSH_CONFIG, else ~/.ssh/config;
and the connection defaults both SSH clients share (paramiko's `ssh_connection`, OpenSSH's
`openssh`).

Kept apart from `ssh_connection` (which reads the file with paramiko) so that a kept session's
client and the OpenSSH path, which must not load paramiko, name the same file and defaults."""

from __future__ import annotations

import os
from pathlib import Path

SSH_CONFIG_ENV = "KERNELDEV_SSH_CONFIG"
CONNECT_TIMEOUT = 10.0  # seconds for TCP connect, banner, key exchange and each auth step
DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")  # tried in ~/.ssh without an identity_file


def ssh_config_path(explicit: str | Path | None = None) -> Path | None:
    """The ssh_config file to honour: `explicit`, $KERNELDEV_SSH_CONFIG, then ~/.ssh/config."""
    raw = str(explicit) if explicit else os.environ.get(SSH_CONFIG_ENV)
    if raw:
        return None if raw.lower() == "none" else Path(os.path.expanduser(raw))
    default = Path(os.path.expanduser("~/.ssh/config"))
    return default if default.exists() else None
