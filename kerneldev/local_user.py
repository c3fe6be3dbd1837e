"""The local user's name, for deploy records, the sandbox's sshd and an SSH login default."""

from __future__ import annotations

import getpass
import os


def local_user() -> str:
    """The login name; "unknown" when there is no passwd entry and no $USER (some containers)."""
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - getpass raises KeyError or OSError without a passwd entry
        return os.environ.get("USER") or "unknown"
