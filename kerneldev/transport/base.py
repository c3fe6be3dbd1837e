"""The transport interface: everything kerneldev does on a host goes through these methods.

Two implementations exist: `SSHTransport` (paramiko, one connection per CLI invocation, reused
for exec, SFTP and port forwarding) and `LocalTransport` (subprocess + the local file system,
for a user working on the GPU box itself, and for tests). Every operation above this layer
(pull, diff, push, rollback, restart, bench) is written once against `Transport`.

All paths given to a transport are absolute POSIX paths on the host.
"""

from __future__ import annotations

import abc
import glob
import io
import posixpath
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from kerneldev.errors import TransferError

# Every temporary file kerneldev writes on a host is named `.<target>.kerneldev-tmp-<random>`
# next to its target, so leftovers of an interrupted run can be found and removed safely.
TEMP_MARK = ".kerneldev-tmp-"
CHUNK = 1 << 20  # bytes per read/write when streaming files

ByteCallback = Callable[[int], None]

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

    def write_atomic(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Write to a temporary file in the same folder, then rename over `path`, so a reader
        never sees a half-written file. Keeps the existing file's mode unless `mode` is given;
        creates parent folders."""
        self.put_file(path, io.BytesIO(data), mode=mode)

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def mkdirs(self, path: str) -> None:
        """Create the folder and its parents (no error when it exists)."""

    @abc.abstractmethod
    def remove(self, path: str) -> None:
        """Delete a file or a whole folder tree; no error when absent."""

    # --- streaming and host-side file work ----------------------------------------------
    # Defaults are built on run() (a POSIX shell on the host); transports override what they
    # can do better.
    @abc.abstractmethod
    def put_file(
        self,
        path: str,
        source: BinaryIO,
        *,
        mode: int | None = None,
        on_bytes: ByteCallback | None = None,
        before_rename: Callable[[], None] | None = None,
    ) -> None:
        """Stream `source` into a temporary file next to `path` in chunks, call
        `before_rename()` (a compare-and-swap check; raising there leaves `path` untouched),
        then rename over `path`. The temporary file never outlives a failure or an interrupt.
        Same mode/owner rules as `write_atomic`."""

    def copy_on_host(self, pairs: list[tuple[str, str]]) -> dict[str, str | None]:
        """Copy files on the host (no round trip through this machine), each atomically:
        `cp -p` to a temporary name next to the destination, then rename. One command.
        Returns {destination: sha256 of the copy}, hashed by the host's `sha256sum` in the
        same command (None where the host has no sha256sum)."""
        if not pairs:
            return {}
        lines = []
        for i, (src, dst) in enumerate(pairs):
            folder, name = posixpath.split(dst)
            tmp = shlex.quote(posixpath.join(folder, f".{name}{TEMP_MARK}{secrets.token_hex(6)}"))
            q = shlex.quote(dst)
            lines.append(
                f"mkdir -p -- {shlex.quote(folder)} && cp -p -- {shlex.quote(src)} {tmp} "
                f"&& mv -f -- {tmp} {q} || {{ rm -f -- {tmp}; exit 1; }}\n"
                f"h=$(sha256sum < {q} 2>/dev/null) && echo {i} $h"
            )
        # The script goes in on stdin: hundreds of files would pass sshd's command length.
        result = self.run("sh -s", stdin=("\n".join(lines) + "\n").encode("utf-8"))
        if not result.ok:
            raise TransferError(
                f"copying on {self.host_name} failed: "
                f"{result.stderr.strip() or f'exit {result.exited}'}"
            )
        sums: dict[str, str | None] = {dst: None for _, dst in pairs}
        for line in result.stdout.splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0].isdigit() and int(fields[0]) < len(pairs):
                sums[pairs[int(fields[0])][1]] = fields[1]
        return sums

    def rename(self, src: str, dst: str) -> None:
        """Rename `src` over `dst` in one step (both in the same folder)."""
        result = self.run(f"mv -f -- {shlex.quote(src)} {shlex.quote(dst)}")
        if not result.ok:
            raise TransferError(f"cannot rename {src} on {self.host_name}: {result.stderr.strip()}")

    def file_sha256(self, path: str) -> str | None:
        """sha256 of one file on the host, hashed there; None when it is not there."""
        folder, name = posixpath.split(path)
        files, _ = self.hash_files(folder, [glob.escape(name)])
        return files[0].sha256 if files else None

    def find_temp_files(self, root: str, markers: str | None = None) -> list[str]:
        """kerneldev's own temporary files anywhere under `root` (leftovers when no kerneldev
        command runs), plus files named `markers` when given; one command."""
        extra = f" -o -name {shlex.quote(markers)}" if markers else ""
        result = self.run(
            f"find {shlex.quote(root)} -type f \\( -name {shlex.quote('.*' + TEMP_MARK + '*')}"
            f"{extra} \\) -print0 2>/dev/null; exit 0"
        )
        return sorted(p for p in result.stdout.split("\0") if p)

    def append_text(self, path: str, text: str, then: str = "") -> None:
        """Append `text` to a file on the host (created with its folder when missing); one
        O_APPEND write, so concurrent appends do not interleave within a line. `then`: a
        shell command run after a successful append, in the same round trip."""
        folder = posixpath.dirname(path)
        result = self.run(
            f"mkdir -p -- {shlex.quote(folder)} && cat >> {shlex.quote(path)}"
            + (f" && {then}" if then else ""),
            stdin=text.encode("utf-8"),
        )
        if not result.ok:
            raise TransferError(
                f"cannot append to {path} on {self.host_name}: {result.stderr.strip()}"
            )

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
