"""The "host" is this machine: subprocess for commands, the local file system for files.

Used by a user who develops on the GPU box itself and by the tests, so everything above the
transport runs the identical code path as over SSH.
"""

from __future__ import annotations

import codecs
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import BinaryIO

from kerneldev import interrupt
from kerneldev.atomic_file import write_stream_atomic
from kerneldev.config import HostConfig
from kerneldev.errors import HostConnectionError, RemoteCommandError, TransferError
from kerneldev.hosts.transport.base import (
    CHUNK,
    TEMP_MARK,
    CommandResult,
    HostScan,
    OutputCallback,
    PutOptions,
    RemoteFile,
    RunOptions,
    Transport,
)
from kerneldev.hostside.hashfiles import answer, find_named, hash_tree


class LocalTransport(Transport):
    def __init__(self, host_config: HostConfig | None = None) -> None:
        self.host_config = host_config
        self.host_name = getattr(host_config, "name", None) or "local"

    # --- commands -------------------------------------------------------------------------
    def _run(self, command: str, options: RunOptions) -> CommandResult:
        timeout, stdin, on_output = options.timeout, options.stdin, options.on_output
        try:
            proc = subprocess.Popen(
                ["sh", "-c", command],
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                # Own process group, so a timeout kills the whole pipeline, not just `sh`.
                start_new_session=True,
            )
        except OSError as err:
            raise HostConnectionError(f"cannot start a shell on this machine: {err}") from None

        out: list[str] = []
        errs: list[str] = []
        readers = [
            threading.Thread(target=_pump, args=(proc.stdout, out, on_output), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, errs, None), daemon=True),
        ]
        if stdin is not None:
            # A thread, so a command that never reads its input cannot block the timeout.
            readers.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
        for t in readers:
            t.start()
        deadline = time.monotonic() + timeout if timeout is not None else None
        try:
            exited = _wait_interruptible(proc, deadline)
        except interrupt.Interrupted:
            _end_group(proc)  # the command's whole process group ends with us
            for t in readers:
                t.join(2)
            raise
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            for t in readers:
                t.join(2)
            raise RemoteCommandError(
                f"command timed out after {timeout:g}s on {self.host_name}: {command}",
                result=CommandResult(command, -1, "".join(out), "".join(errs)),
            ) from None
        # Output left in the pipes is read at once; a background process that inherited them
        # (a restart command starting a daemon) must not keep us waiting for its EOF.
        deadline = time.monotonic() + 2
        for t in readers:
            t.join(max(0.0, deadline - time.monotonic()))
        # A negative return code means a signal; report it the way a shell would (128 + n).
        if exited < 0:
            exited = 128 - exited
        return CommandResult(command, exited, "".join(out), "".join(errs))

    # --- files ----------------------------------------------------------------------------
    def hash_files(self, root: str, patterns: list[str]) -> tuple[list[RemoteFile], list[str]]:
        try:
            result = hash_tree(root, list(patterns))
        except OSError as err:
            raise TransferError(f"cannot hash files under {root}: {err}") from None
        return [RemoteFile(**f) for f in result["files"]], result["unmatched"]

    def scan(
        self, root: str, patterns: list[str], markers: str | None = None, lock: dict | None = None
    ) -> HostScan:
        names = [".*" + TEMP_MARK + "*"] + ([markers] if markers else [])
        if lock is not None:  # the same code as on an SSH host: lock, scan, maybe release
            request = {"root": root, "patterns": list(patterns), "find": names, "lock": lock}
            try:
                data = answer(request)
            except OSError as err:
                raise TransferError(f"cannot hash files under {root}: {err}") from None
            files = [RemoteFile(**f) for f in data["files"]]
            found, exists = data["found"], data["root_exists"]
            return HostScan(files, data["unmatched"], exists, found, data["lock"])
        files, unmatched = self.hash_files(root, patterns)
        return HostScan(files, unmatched, os.path.lexists(root), find_named(root, names))

    def read_bytes(self, path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise TransferError(f"{path}: no such file on {self.host_name}") from None
        except OSError as err:
            raise TransferError(f"cannot read {path} on {self.host_name}: {err}") from None

    def stream_files(self, paths: list[str]) -> Iterator[tuple[str, Iterator[bytes]]]:
        for path in paths:
            yield path, self._chunks(path)

    def _chunks(self, path: str) -> Iterator[bytes]:
        try:
            with open(path, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise TransferError(f"{path} on {self.host_name} is not a regular file")
                yield from iter(lambda: f.read(CHUNK), b"")
        except FileNotFoundError:
            raise TransferError(f"{path}: no such file on {self.host_name}") from None
        except OSError as err:
            raise TransferError(f"cannot read {path} on {self.host_name}: {err}") from None

    def _put_file(self, path: str, source: BinaryIO, options: PutOptions) -> None:
        mode, on_bytes, before_rename = options.mode, options.on_bytes, options.before_rename
        if os.path.islink(path):
            # Write through a symlink to its target (as hash_files reads through it), rather
            # than replacing the link with a plain file.
            path = os.path.realpath(path)
        owner: tuple[int, int] | None = None
        try:
            old = os.stat(path)
            owner = (old.st_uid, old.st_gid)  # a service user's repo stays theirs
            if mode is None:
                mode = old.st_mode & 0o7777
        except FileNotFoundError:
            if mode is None:
                mode = 0o666 & ~_umask()  # what a plain `open(path, "w")` would give
        except OSError as err:
            raise TransferError(f"cannot write {path} on {self.host_name}: {err}") from None

        def chunk_written(n: int) -> None:
            interrupt.check()  # Ctrl-C stops between chunks; the temporary file is removed
            if on_bytes:
                on_bytes(n)

        def last_check() -> None:
            interrupt.check()
            if before_rename is not None:
                before_rename()

        try:
            write_stream_atomic(
                os.path.abspath(path),
                source,
                mode,
                owner=owner,
                on_chunk=chunk_written,
                before_rename=last_check,
            )
        except OSError as err:
            raise TransferError(f"cannot write {path} on {self.host_name}: {err}") from None

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def mkdirs(self, path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as err:
            raise TransferError(f"cannot create {path} on {self.host_name}: {err}") from None

    def remove(self, path: str) -> None:
        if not os.path.isabs(path) or os.path.normpath(path) == "/":
            raise TransferError(f"refusing to remove {path!r} on {self.host_name}")
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise TransferError(f"cannot remove {path} on {self.host_name}: {err}") from None

    # --- network --------------------------------------------------------------------------
    def http_get(self, url: str, timeout: float = 5.0) -> int:
        # Here, not at the top: urllib.request (http.client, email, ssl) is most of this
        # module's import, and only a health check needs it.
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise HostConnectionError(f"GET {url}: no answer ({reason})") from None


def _pump(stream, sink: list[str], on_output: OutputCallback | None) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in iter(lambda: stream.read1(65536), b""):
        text = decoder.decode(chunk)
        if text:
            sink.append(text)
            if on_output:
                on_output(text)
    tail = decoder.decode(b"", final=True)
    if tail:
        sink.append(tail)
        if on_output:
            on_output(tail)
    stream.close()


def _feed(stream, data: bytes) -> None:
    try:
        stream.write(data)
    except (BrokenPipeError, OSError):
        pass  # the command stopped reading its input; that is not our failure
    finally:
        try:
            stream.close()
        except OSError:
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _wait_interruptible(proc: subprocess.Popen, deadline: float | None) -> int:
    """proc.wait(), waking up to act on Ctrl-C/SIGTERM; TimeoutExpired past `deadline`."""
    while True:
        interrupt.check()
        step = 0.2
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            step = min(step, left)
        try:
            return proc.wait(timeout=step)
        except subprocess.TimeoutExpired:
            continue


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's process group, SIGKILL if it is still there after 2 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
    except (ProcessLookupError, PermissionError):
        proc.kill()
        proc.wait()


def _umask() -> int:
    # os.umask can only be read by setting it; set it back at once.
    current = os.umask(0o022)
    os.umask(current)
    return current
