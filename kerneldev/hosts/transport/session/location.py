"""Where a kept session's socket and log live, and the checks that keep them private.

The socket goes in `$XDG_RUNTIME_DIR/kerneldev/` when that folder is usable (the user's own,
0700), else in the workspace's `.kerneldev/sessions/`; a path that would pass the unix socket
limit (about 104 bytes on macOS, 108 on Linux) moves to `/tmp/kerneldev-<uid>/`. Every folder a
socket is put in is made 0700 and checked: a real folder (no symlink), owned by this user,
nobody else may enter it. The log always goes in the workspace's `.kerneldev/sessions/`,
checked the same way.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from kerneldev.config import HostConfig
from kerneldev.paths import RUNTIME_SESSIONS, SESSIONS_DIR, SHORT_SESSIONS

MAX_SOCKET_PATH = 100  # bytes: under every system's sun_path, with a margin
RUNTIME_ENV = "XDG_RUNTIME_DIR"
NAME_CHARS = 24  # characters of the host's name kept in a socket's name


class PlaceError(OSError):
    """No private folder could be had for the socket (the session is then not kept)."""


@dataclass(frozen=True)
class SessionPlace:
    """The files of one kept session."""

    socket: Path
    log: Path

    @property
    def start_lock(self) -> Path:
        """Held while a holder is being started, so two commands start one holder."""
        return self.socket.with_suffix(".lock")


def place(host: HostConfig, key: str) -> SessionPlace:
    """The socket and log of the session `key` to `host` (folders made and checked)."""
    for folder in socket_folders(host):
        socket = folder / socket_name(host, key)
        if len(os.fsencode(socket)) > MAX_SOCKET_PATH:
            continue
        try:
            private_folder(folder)
        except PlaceError:
            continue
        return SessionPlace(socket, log_path(host, key))
    raise PlaceError(f"no private folder for the session socket of host '{host.name}'")


def candidates(host: HostConfig, key: str) -> list[Path]:
    """Where a socket of the session `key` may be, without making anything (for listing)."""
    paths = [folder / socket_name(host, key) for folder in socket_folders(host)]
    return [p for p in paths if len(os.fsencode(p)) <= MAX_SOCKET_PATH]


def socket_name(host: HostConfig, key: str) -> str:
    return f"{_safe(host.name)}-{key}.sock"


def log_path(host: HostConfig, key: str) -> Path:
    return host.workspace / SESSIONS_DIR / f"{_safe(host.name)}-{key}.log"


def socket_folders(host: HostConfig) -> list[Path]:
    """Every folder a socket of `host` may be in, most preferred first."""
    folders = []
    runtime = os.environ.get(RUNTIME_ENV)
    if runtime and os.path.isabs(runtime) and _own_folder(Path(runtime)):
        folders.append(Path(runtime) / RUNTIME_SESSIONS)
    folders.append(host.workspace / SESSIONS_DIR)
    folders.append(Path(SHORT_SESSIONS.format(uid=os.getuid())))
    return folders


def private_folder(folder: Path) -> Path:
    """`folder`, made 0700 (with its parents) if missing, checked to be private to this user;
    `PlaceError` when it is not and cannot be made so."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
        st = os.lstat(folder)
    except OSError as err:
        raise PlaceError(f"cannot make {folder}: {err.strerror or err}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise PlaceError(f"{folder} is not a folder (or is a symlink)")
    if st.st_uid != os.getuid():
        raise PlaceError(f"{folder} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o077:
        try:
            os.chmod(folder, 0o700)  # ours, but open to others: close it
        except OSError as err:
            raise PlaceError(f"cannot make {folder} private: {err.strerror}") from None
    return folder


def _own_folder(path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and os.access(path, os.W_OK)


def _safe(name: str) -> str:
    """A host's name as part of a file name."""
    kept = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return kept[:NAME_CHARS] or "host"
