"""Which known_hosts files kerneldev reads and writes (no paramiko: the one-shot OpenSSH path
and `hostkeys` both name them from here)."""

from __future__ import annotations

import os
from pathlib import Path

USER_KNOWN_HOSTS = "~/.ssh/known_hosts"


def user_known_hosts() -> Path:
    return Path(os.path.expanduser(USER_KNOWN_HOSTS))


def known_hosts_files(configured: Path | None) -> list[Path]:
    """Where keys are read from: the configured file first, then the user's own."""
    files = [Path(os.path.expanduser(str(configured)))] if configured else []
    user = user_known_hosts()
    if user not in files:
        files.append(user)
    return files


def trust_file(configured: Path | None) -> Path:
    """Where `kerneldev trust` writes: the configured file, else the user's known_hosts."""
    return Path(os.path.expanduser(str(configured))) if configured else user_known_hosts()
