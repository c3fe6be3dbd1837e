"""The transport interface: everything kerneldev does on a host goes through these methods.

Three implementations exist: `SSHTransport` (paramiko, one connection per CLI invocation;
every step after the login goes through the host agent it starts on one exec channel, or, on
a host without python3, exec, SFTP and port forwarding as before), `AgentTransport` (every
step as a request to a host agent, over any byte stream: the SSH channel, or a kept session's
unix socket) and `LocalTransport` (subprocess + the local file system, for a user working on
the GPU box itself, and for tests). Every operation above this layer
(pull, diff, push, rollback, restart, bench) is written once against `Transport`.

All paths given to a transport are absolute POSIX paths on the host.
"""

from __future__ import annotations

import abc
import glob
import hashlib
import io
import json
import posixpath
import secrets
import shlex
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from kerneldev import interrupt
from kerneldev.atomic_file import temp_stem
from kerneldev.errors import HostConnectionError, LockLostError, TransferError
from kerneldev.errors import (
    LiveChangedError as LiveChangedError,  # re-exported: it was defined here
)
from kerneldev.hostside import sendfiles as _sendfiles
from kerneldev.paths import TEMP_MARK

# Every temporary file kerneldev writes on a host is named `.<target>.kerneldev-tmp-<random>`
# next to its target, so leftovers of an interrupted run can be found and removed safely.
CHUNK = 1 << 20  # bytes per read/write when streaming files


def temp_path(folder: str, name: str) -> str:
    """A fresh temporary name next to `folder/name` on the host (a long name is cut for it)."""
    return posixpath.join(folder, f".{temp_stem(name)}{TEMP_MARK}{secrets.token_hex(6)}")


def copy_sums(
    host_name: str, pairs: list[tuple[str, str]], result: CommandResult
) -> dict[str, str | None]:
    """{destination: sha256} from a copy's `<index> <sha256>` lines (None where none came);
    a failed copy raises `TransferError` with the host's words, except a copy that stopped
    on a sum other than the one expected (`copyfiles.py`'s `expect`): its sums are returned
    for the caller's own check, which refuses the deploy."""
    if not result.ok and "copyfiles: mismatch" not in result.stderr:
        raise TransferError(
            f"copying on {host_name} failed: {result.stderr.strip() or f'exit {result.exited}'}"
        )
    sums: dict[str, str | None] = {dst: None for _, dst in pairs}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].isdigit() and int(fields[0]) < len(pairs):
            sums[pairs[int(fields[0])][1]] = fields[1]
    return sums


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


@dataclass(frozen=True)
class HostScan:
    """What `Transport.scan` saw on the host in one look."""

    files: list[RemoteFile]  # as hash_files
    unmatched: list[str]  # as hash_files
    root_exists: bool
    found: list[str]  # as find_temp_files: kerneldev's temporary files and the named markers
    # The host lock's outcome when the scan was asked to take it (`_hashfiles.answer`); None
    # when not asked or the transport cannot (the caller then takes the lock on its own).
    lock: dict | None = None


@dataclass(frozen=True)
class PutItem:
    """One file for `Transport.put_files`."""

    path: str  # absolute on the host
    open: Callable[[], BinaryIO]  # opens the source (called once, when its turn comes)
    mode: int | None = None  # None: keep the replaced file's mode (0o644 for a new file)
    expect_sha256: str | None = None  # live as planned (None: absent), for the check
    check: bool = True  # compare-and-swap: refuse when live is no longer `expect_sha256`


@dataclass(frozen=True)
class RunOptions:
    """`run`'s keyword options as one value, as each transport's `_run` gets them."""

    timeout: float | None = None
    stdin: bytes | None = None
    on_output: OutputCallback | None = None


@dataclass(frozen=True)
class PutOptions:
    """`put_file`'s keyword options as one value, as each transport's `_put_file` gets them."""

    mode: int | None = None
    on_bytes: ByteCallback | None = None
    before_rename: Callable[[], None] | None = None


# put_files' callbacks: on_start(index) before an item's bytes go; on_landed(index, sha256,
# size) once it is renamed over its target (sha256 and size of the bytes sent).
IndexCallback = Callable[[int], None]
LandedCallback = Callable[[int, str, int], None]


@dataclass(frozen=True)
class PutFilesCallbacks:
    """`put_files`' callbacks as one value, as each transport's `_put_files` gets them."""

    on_landed: LandedCallback
    on_start: IndexCallback | None = None
    on_bytes: ByteCallback | None = None


class Transport(abc.ABC):
    """A connection to one host. Use as a context manager; connects lazily on first use."""

    host_name: str  # the config's name for the host, for messages
    # Called once by a transport that starts a host agent, right after asking the host to
    # start it and before waiting for it: the host's login shell and Python take most of a
    # one-shot command's wait (0.3-0.6 s measured), time this process would otherwise idle.
    while_agent_starts: Callable[[], None] | None = None

    # --- commands -------------------------------------------------------------------------
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
        return self._run(command, RunOptions(timeout, stdin, on_output))

    @abc.abstractmethod
    def _run(self, command: str, options: RunOptions) -> CommandResult:
        """`run` as this transport does it (the signature and its defaults live once, in
        `run`)."""

    # --- files ----------------------------------------------------------------------------
    @abc.abstractmethod
    def hash_files(self, root: str, patterns: list[str]) -> tuple[list[RemoteFile], list[str]]:
        """Expand `patterns` (paths relative to `root`, shell globs allowed) on the host and
        return (files found with sha256/size/mode, patterns that matched nothing). One round trip
        for all files. Matches are regular files only, sorted by path, never outside `root`."""

    def scan(
        self, root: str, patterns: list[str], markers: str | None = None, lock: dict | None = None
    ) -> HostScan:
        """`hash_files`, whether `root` exists, and `find_temp_files(root, markers)` together:
        one round trip where the transport can (this default makes three). `lock`: take the
        host lock in the same command first (`HostLock.scan_request`); this default cannot,
        and says so with `HostScan.lock` None."""
        files, unmatched = self.hash_files(root, patterns)
        return HostScan(files, unmatched, self.exists(root), self.find_temp_files(root, markers))

    @abc.abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """The file's bytes; `TransferError` when missing or unreadable."""

    def stream_files(self, paths: list[str]) -> Iterator[tuple[str, Iterator[bytes]]]:
        """Read several files in one go: yields `(path, chunks)` in the order given, where
        `chunks` yields the file's bytes in bounded pieces; consume it before asking for the
        next file. A file that is missing or unreadable raises `TransferError` from its
        `chunks` (possibly after some bytes: discard them). Closing the generator early (an
        interrupt) stops the transfer. The default reads file by file; transports override
        it with one stream for all files."""
        for path in paths:
            yield path, iter([self.read_bytes(path)])

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

    def remove(self, path: str) -> None:
        """Delete a file or a whole folder tree; no error when absent. This default is one
        `rm -rf` on the host (absolute paths only, never `/`)."""
        if not path.startswith("/") or posixpath.normpath(path) == "/":
            raise TransferError(f"refusing to remove {path!r} on {self.host_name}")
        result = self.run(f"rm -rf -- {shlex.quote(path)}")
        if not result.ok:
            raise TransferError(
                f"cannot remove {path} on {self.host_name}: {result.stderr.strip()}"
            )

    # --- streaming and host-side file work ----------------------------------------------
    # Defaults are built on run() (a POSIX shell on the host); transports override what they
    # can do better.
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
        self._put_file(path, source, PutOptions(mode, on_bytes, before_rename))

    @abc.abstractmethod
    def _put_file(self, path: str, source: BinaryIO, options: PutOptions) -> None:
        """`put_file` as this transport does it (the signature and its defaults live once,
        in `put_file`)."""

    def put_files(
        self,
        items: list[PutItem],
        *,
        on_landed: LandedCallback,
        on_start: IndexCallback | None = None,
        on_bytes: ByteCallback | None = None,
    ) -> None:
        """Land several files, in order, each as `put_file` does (temporary file, the
        compare-and-swap check when `check`, rename), stopping at the first failure:
        `LiveChangedError` for a failed check, `TransferError` for the rest; Ctrl-C is
        honoured between chunks. `on_landed` is called for exactly the files renamed over
        their targets, even when a later one fails or the command is interrupted. This default
        puts file by file; transports override it with one stream for all files."""
        self._put_files(items, PutFilesCallbacks(on_landed, on_start, on_bytes))

    def _put_files(self, items: list[PutItem], callbacks: PutFilesCallbacks) -> None:
        """`put_files` as this transport does it; this default puts file by file."""
        on_landed, on_start, on_bytes = callbacks.on_landed, callbacks.on_start, callbacks.on_bytes
        for i, item in enumerate(items):
            if on_start is not None:
                on_start(i)
            with item.open() as handle:
                reader = _HashingReader(handle)
                self.put_file(
                    item.path,
                    reader,
                    mode=item.mode,
                    on_bytes=on_bytes,
                    before_rename=self._compare_and_swap(i, item),
                )
            on_landed(i, reader.digest.hexdigest(), reader.size)

    def _compare_and_swap(self, index: int, item: PutItem) -> Callable[[], None]:
        def check() -> None:
            if item.check and self.file_sha256(item.path) != item.expect_sha256:
                raise LiveChangedError(index, item.path)

        return check

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
            tmp = shlex.quote(temp_path(folder, name))
            q = shlex.quote(dst)
            lines.append(
                f"mkdir -p -- {shlex.quote(folder)} && cp -p -- {shlex.quote(src)} {tmp} "
                f"&& mv -f -- {tmp} {q} || {{ rm -f -- {tmp}; exit 1; }}\n"
                f"h=$(sha256sum < {q} 2>/dev/null) && echo {i} $h"
            )
        # The script goes in on stdin: hundreds of files would pass sshd's command length.
        result = self.run("sh -s", stdin=("\n".join(lines) + "\n").encode("utf-8"))
        return copy_sums(self.host_name, pairs, result)

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
        result = self.run(append_command(path, then), stdin=text.encode("utf-8"))
        if not result.ok:
            raise TransferError(
                f"cannot append to {path} on {self.host_name}: {result.stderr.strip()}"
            )

    def begin(self) -> None:  # noqa: B027 - optional: only what starts a host has work here
        """Start reaching the host (connection, login, agent) without waiting for it, so that
        local work overlaps the host's start; a no-op where nothing needs starting."""

    def chain(self):  # -> agent_chain.AgentChain | None (not imported here: it imports this)
        """Where the host runs a pipeline of requests (the host agent): an `AgentChain` that
        sends a deploy's steps at once, each run only after the one before succeeded; None
        where each step must wait for the answer of the one before."""
        return None

    # A kept session's transport: its host agent outlives the command, so what the command
    # wrote there is hashed after it, in the background (`settle_live`; docs/sessions.md),
    # and the workspace files it wrote likewise (`loop/settle.py`).
    settles_writes = False

    def settle_live(self, root: str, paths: list[str]) -> None:  # noqa: B027 - optional
        """Have the host remember the sums of `paths` (relative to `root`), just written by
        this command, once its clock has moved past their writes, in a process of its own
        (`hashfiles.py`'s `settle`): the next command finds them unchanged instead of reading
        them again. Nothing waits for it; only where `settles_writes`."""

    # --- network --------------------------------------------------------------------------
    @abc.abstractmethod
    def http_get(self, url: str, timeout: float = 5.0) -> int:
        """GET `url` as seen from the host (for SSH: through a direct-tcpip channel, so the
        port need not be reachable from here). Returns the HTTP status; raises
        `HostConnectionError` when nothing answers."""

    def _https_get_with_curl(self, url: str, timeout: float) -> int:
        # TLS is not spoken by the channel or the probe; the host's own curl does it.
        result = self.run(
            f"curl -s -o /dev/null -w '%{{http_code}}' --max-time {timeout:g} "
            f"-- {shlex.quote(url)}",
            timeout=timeout + 10,
        )
        if result.exited == 127:
            raise HostConnectionError(
                f"GET {url}: https health checks need curl on host '{self.host_name}'",
                hint="install curl on the host, or use an http:// URL or a shell command",
            )
        code = result.stdout.strip()
        if not code.isdigit() or code == "000":
            raise HostConnectionError(f"GET {url}: no answer (curl exit {result.exited})")
        return int(code)

    # --- lifetime -------------------------------------------------------------------------
    def close(self) -> None:  # noqa: B027 - optional for implementations without resources
        pass

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _HashingReader:
    """Hashes and counts what is read from a binary file (the bytes actually sent)."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self.handle.read(n)
        self.digest.update(data)
        self.size += len(data)
        return data


# --- shared by the transports that stream files through a host-side helper ------------------


def append_command(path: str, then: str = "") -> str:
    """`append_text`'s shell command: stdin appended to `path` (its folder made first), then
    `then` when that worked."""
    folder = posixpath.dirname(path)
    return f"mkdir -p -- {shlex.quote(folder)} && cat >> {shlex.quote(path)}" + (
        f" && {then}" if then else ""
    )


def receive_items(items: list[PutItem]) -> list[dict]:
    """`receivefiles.py`'s description of each file to land."""
    return [
        {"path": f.path, "mode": f.mode, "expect": f.expect_sha256, "check": f.check} for f in items
    ]


def settle_put_reports(
    items: list[PutItem],
    sent: dict[int, tuple[str, int]],
    reports: list[dict],
    host_name: str,
    on_landed: LandedCallback,
) -> None:
    """Act on `receivefiles.py`'s reports: `on_landed` for each file the host renamed (its
    sha256 must be what was sent), then the first failure as `LiveChangedError` (a failed
    compare-and-swap) or `TransferError`."""
    for report in reports:
        i = report.get("i")
        if not isinstance(i, int) or not 0 <= i < len(items) or not report.get("ok"):
            continue
        if i not in sent or report.get("sha256") != sent[i][0]:
            raise TransferError(
                f"{items[i].path} on {host_name}: the host wrote other bytes than "
                "were sent (sha256 differs)"
            )
        on_landed(i, sent[i][0], sent[i][1])


def raise_put_failure(items: list[PutItem], reports: list[dict], host_name: str) -> None:
    """The first failure among `receivefiles.py`'s reports, raised (none: nothing happens)."""
    for report in reports:
        if report.get("ok") is False:
            i = report.get("i", 0)
            if report.get("reason") == "changed":
                raise LiveChangedError(i, items[i].path)
            if report.get("reason") == "lock":
                raise lock_lost(host_name, f"before writing {items[i].path}", report.get("error"))
            raise TransferError(
                f"cannot write {items[i].path} on {host_name}: {report.get('error')}"
            )


def lock_lost(host_name: str, when: str, why: object) -> LockLostError:
    """A host step refused because this command's host lock was taken over (`receivefiles.py`'s
    and `copyfiles.py`'s `check_lock`, the chain's record guard)."""
    return LockLostError(
        f"the lock on host '{host_name}' was taken over by another command {when} ({why}); "
        "nothing more of this command changed the host",
        hint="another command took the lock (a stale lock after a cut connection, or "
        "`--break-lock`); run `kerneldev status` and push again: the next push settles what "
        "this one left",
    )


def scan_request(root: str, patterns: list[str], markers: str | None, lock: dict | None) -> dict:
    """`hashfiles.py`'s request for `Transport.scan`: hash as hash_files, and walk `root` for
    kerneldev's temporary files and `markers` (taking the host lock first when `lock`)."""
    names = [".*" + TEMP_MARK + "*"] + ([markers] if markers else [])
    request = {"root": root, "patterns": list(patterns), "find": names}
    if lock is not None:
        request["lock"] = lock
    return request


def host_scan(data: dict) -> HostScan:
    """The `HostScan` of `hash_answer`'s data for a `scan_request`."""
    return HostScan(
        data["files"], data["unmatched"], data["root_exists"], data["found"], data.get("lock")
    )


def sendfiles_chunks(reader: ExactReader, path: str, host_name: str) -> Iterator[bytes]:
    """One file's bytes from a `sendfiles.py` stream (its records, up to the file's end);
    `TransferError` when the host could not read it."""
    while True:
        kind, length = _sendfiles.HEADER.unpack(reader.read_exact(_sendfiles.HEADER.size))
        payload = reader.read_exact(length) if length else b""
        if kind == b"D":
            yield payload
        elif kind == b"E":
            return
        elif kind == b"X":
            reason = payload.decode("utf-8", "replace")
            if "No such file" in reason:
                raise TransferError(f"{path}: no such file on {host_name}")
            raise TransferError(f"cannot read {path} on {host_name}: {reason}")
        else:
            raise TransferError(f"reading {path} from {host_name}: garbled stream")


def send_file_records(
    write: Callable[[bytes], None],
    open_source: Callable[[], BinaryIO],
    path: str,
    on_bytes: ByteCallback | None,
) -> tuple[str, int]:
    """Send one file to `receivefiles.py` as its records (`write` sends bytes to the host);
    returns the sha256 and size of what was sent."""
    digest, size = hashlib.sha256(), 0
    try:
        handle = open_source()
    except OSError as err:
        raise TransferError(f"cannot read the file for {path}: {err}") from None
    with handle:
        # Chunks, checking for Ctrl-C between them: memory stays bounded.
        for chunk in iter(lambda: handle.read(CHUNK), b""):  # noqa: B023
            interrupt.check()
            write(_sendfiles.HEADER.pack(b"D", len(chunk)) + chunk)
            digest.update(chunk)
            size += len(chunk)
            if on_bytes:
                on_bytes(len(chunk))
    write(_sendfiles.HEADER.pack(b"E", 0))
    return digest.hexdigest(), size


class ExactReader(abc.ABC):
    """Exact reads from a host process's stdout, waking up to act on Ctrl-C and giving up
    after `io_timeout` seconds of silence; each transport says how it receives (`_recv`) and
    what a stream that ends early means (`_ended_early`)."""

    def __init__(self, host_name: str, io_timeout: float) -> None:
        self.host_name = host_name
        self.io_timeout = io_timeout
        self.buf = bytearray()

    @abc.abstractmethod
    def _recv(self, n: int) -> bytes:
        """Up to about `n` bytes (b"" at the end); `TimeoutError` after a short quiet spell."""

    @abc.abstractmethod
    def _ended_early(self) -> None:
        """Raise the error for a stream that ended before the bytes asked for."""

    def read_exact(self, n: int) -> bytes:
        quiet_since = time.monotonic()
        while len(self.buf) < n:
            interrupt.check()
            try:
                data = self._recv(n - len(self.buf))
            except TimeoutError:
                if time.monotonic() - quiet_since > self.io_timeout:
                    raise TransferError(
                        f"no data from {self.host_name} for {self.io_timeout:g}s"
                    ) from None
                continue
            if not data:
                self._ended_early()
            self.buf += data
            quiet_since = time.monotonic()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


def parse_reports(data: bytes) -> list[dict]:
    """`receivefiles.py`'s one-line JSON reports (lines that are not one are skipped)."""
    reports = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict):
            reports.append(report)
    return reports


def http_request_text(url: str) -> tuple[str, int, str]:
    """(host, port, the HTTP/1.0 GET request) for an http:// URL, as both SSH paths send it;
    `HostConnectionError` for another scheme."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise HostConnectionError(f"cannot GET {url}: only http:// and https:// URLs work")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    request = (
        f"GET {path} HTTP/1.0\r\nHost: {parts.netloc}\r\n"
        f"User-Agent: kerneldev\r\nConnection: close\r\n\r\n"
    )
    return parts.hostname, parts.port or 80, request


def http_status(url: str, status_line: str) -> int:
    """The status of an HTTP answer's first line; `HostConnectionError` when it is none."""
    fields = status_line.split()
    if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
        raise HostConnectionError(
            f"GET {url}: not an HTTP answer ({status_line[:60]!r})"
            if status_line
            else f"GET {url}: the connection closed without an answer"
        )
    return int(fields[1])


def hash_answer(result: CommandResult, request: dict, host_name: str) -> dict:
    """`hashfiles.py`'s answer to `request` (files as `RemoteFile`s); `TransferError` when the
    command failed or its output is unreadable."""
    if not result.ok:
        tail = result.stderr.strip().splitlines()[-1:] or ["no error output"]
        raise TransferError(
            f"hashing files under {request['root']} on {host_name} failed "
            f"(exit {result.exited}): {tail[0]}"
        )
    try:
        data = json.loads(result.stdout)
        data["files"] = [RemoteFile(**f) for f in data["files"]]
        data["unmatched"] = list(data["unmatched"])
        if "find" in request:
            data["found"] = [str(p) for p in data["found"]]
            data["root_exists"] = bool(data["root_exists"])
    except (ValueError, KeyError, TypeError) as err:
        raise TransferError(f"hashing files on {host_name} gave unreadable output: {err}") from None
    return data
