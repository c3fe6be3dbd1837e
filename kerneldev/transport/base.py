"""The transport interface: everything kerneldev does on a host goes through these methods.

Two implementations exist: `SSHTransport` (paramiko, one connection per CLI invocation, reused
for exec, SFTP and port forwarding) and `LocalTransport` (subprocess + the local file system,
for a user working on the GPU box itself, and for tests). Every operation above this layer
(pull, diff, push, rollback, restart, bench) is written once against `Transport`.

All paths given to a transport are absolute POSIX paths on the host.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

# Receives a command's output as it arrives (decoded text chunks), for streaming progress.
OutputCallback = Callable[[str], None]


@dataclass(frozen=True)
class CommandResult:
    """What a command on the host did."""

    command: str
    exited: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exited == 0


@dataclass(frozen=True)
class RemoteFile:
    """A file on the host as seen by `Transport.hash_files`: path relative to the root."""

    path: str
    sha256: str
    size: int
    mode: int  # permission bits only (st_mode & 0o7777)


class Transport(abc.ABC):
    """A connection to one host. Use as a context manager; connects lazily on first use."""

    host_name: str  # the config's name for the host, for messages

    # --- commands -------------------------------------------------------------------------
    @abc.abstractmethod
    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        on_output: OutputCallback | None = None,
    ) -> CommandResult:
        """Run a shell command on the host (via `sh -c`), return its result; never raises for a
        non-zero exit. `on_output(text)` is called with stdout chunks as they arrive (streaming
        progress of long commands). A timeout raises `RemoteCommandError`."""

    # --- files ----------------------------------------------------------------------------
    @abc.abstractmethod
    def hash_files(self, root: str, patterns: list[str]) -> tuple[list[RemoteFile], list[str]]:
        """Expand `patterns` (paths relative to `root`, shell globs allowed) on the host and
        return (files found with sha256/size/mode, patterns that matched nothing). One round trip
        for all files. Matches are regular files only, sorted by path, never outside `root`."""

    @abc.abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """The file's bytes; `TransferError` when missing or unreadable."""

    @abc.abstractmethod
    def write_atomic(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Write to a temporary file in the same folder, then rename over `path`, so a reader
        never sees a half-written file. Keeps the existing file's mode unless `mode` is given;
        creates parent folders."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def mkdirs(self, path: str) -> None:
        """Create the folder and its parents (no error when it exists)."""

    @abc.abstractmethod
    def remove(self, path: str) -> None:
        """Delete a file or a whole folder tree; no error when absent."""

    # --- network --------------------------------------------------------------------------
    @abc.abstractmethod
    def http_get(self, url: str, timeout: float = 5.0) -> int:
        """GET `url` as seen from the host (for SSH: through a direct-tcpip channel, so the
        port need not be reachable from here). Returns the HTTP status; raises
        `HostConnectionError` when nothing answers."""

    # --- lifetime -------------------------------------------------------------------------
    def close(self) -> None:  # noqa: B027 - optional for implementations without resources
        pass

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
