"""The host through its agent: every operation is a request to `hostside/agent.py`, no SFTP.

`AgentTransport(client, host_config, host_name)` works over any `AgentClient`: the agent that
`SSHTransport` starts on its one exec channel (then no later step pays a login shell or a new
channel), or a kept session holder's unix socket. It never loads paramiko.

Each operation is one agent request: commands run as `/bin/sh -c` (as over SSH); hashing and
scans run `hashfiles.py`, pulls `sendfiles.py`, pushes `receivefiles.py` and the SFTP-like
single steps `fileops.py`, all with the agent's own interpreter (no PATH lookup); HTTP health
checks run `httpprobe.py` on the host. The bytes, names, modes, owners and errors are those of
`SSHTransport` with `KERNELDEV_TRANSFER=stream`. Ctrl-C (kerneldev.interrupt) and timeouts end
the request's process group on the host with SIGNAL frames (TERM, then KILL after 2 s).
"""

from __future__ import annotations

import codecs
import json
import posixpath
import time
import urllib.parse
from collections.abc import Iterator
from typing import BinaryIO

from kerneldev import interrupt
from kerneldev.config import HostConfig
from kerneldev.errors import (
    ConnectionLostError,
    HostConnectionError,
    KerneldevError,
    RemoteCommandError,
    TransferError,
)
from kerneldev.hosts.transport.agent_chain import AgentChain
from kerneldev.hosts.transport.agent_client import AgentClient, AgentProcess
from kerneldev.hosts.transport.base import (
    TEMP_MARK,
    CommandResult,
    ExactReader,
    HostScan,
    PutFilesCallbacks,
    PutItem,
    PutOptions,
    RemoteFile,
    RunOptions,
    Transport,
    copy_sums,
    hash_answer,
    host_scan,
    http_request_text,
    http_status,
    parse_reports,
    raise_put_failure,
    receive_items,
    scan_request,
    send_file_records,
    sendfiles_chunks,
    settle_put_reports,
    temp_path,
)
from kerneldev.hosts.transport.hostscripts import script
from kerneldev.hostside import copyfiles as _copyfiles
from kerneldev.hostside import fileops as _fileops
from kerneldev.hostside import hashfiles as _hashfiles
from kerneldev.hostside import httpprobe as _httpprobe
from kerneldev.hostside import receivefiles as _receivefiles
from kerneldev.hostside import sendfiles as _sendfiles

IO_TIMEOUT = 120.0  # seconds of silence in a file stream before the host counts as gone
POLL = 0.5  # seconds between looks at Ctrl-C and deadlines while waiting on the host
LOST_HINT = (
    "check that the host is up and the network is stable, then run the command again "
    "(file writes are atomic: a target is either old or new)"
)


class AgentTransport(Transport):
    def __init__(
        self,
        client: AgentClient,
        host_config: HostConfig | None,
        host_name: str,
        settles_writes: bool = False,
    ) -> None:
        self.client = client
        self.host_config = host_config
        self.host_name = host_name
        self.settles_writes = settles_writes

    def close(self) -> None:
        self.client.close()

    def chain(self) -> AgentChain | None:
        try:
            pipelines = self.client.pipelines
        except ConnectionLostError:
            return None  # the next request says so in its own words
        return AgentChain(self) if pipelines else None

    def _lost(self, doing: str) -> ConnectionLostError:
        why = self.client.lost or "the stream ended"
        return ConnectionLostError(
            f"the connection to host '{self.host_name}' was lost while {doing}: {why}",
            hint=LOST_HINT,
        )

    def _open(
        self,
        command: str,
        doing: str,
        python: bool = False,
        stdin: bytes | None = None,
        after: AgentProcess | None = None,
    ) -> AgentProcess:
        """Start `command` (`after`: once that request succeeded, see `AgentClient.open`);
        with `stdin` (b"" for none) also send that and its end, in the same write as the
        request (`AgentClient.batch`)."""
        try:
            with self.client.batch():
                process = self.client.open(command, python=python, after=after)
                if stdin is not None:
                    if stdin:
                        process.write(stdin)
                    process.close_stdin()
            return process
        except ConnectionLostError:
            raise self._lost(doing) from None

    def _end(self, process: AgentProcess) -> None:
        """End a request that is no longer wanted (Ctrl-C, a timeout, an early stop)."""
        with interrupt.shield():
            process.end()

    # --- commands -----------------------------------------------------------------------
    def _run(self, command: str, options: RunOptions) -> CommandResult:
        doing = f"running `{_first_line(command)}`"
        process = self._open(command, doing, stdin=options.stdin or b"")
        return self._finish(process, command, options, doing)

    def _finish(
        self, process: AgentProcess, command: str, options: RunOptions, doing: str
    ) -> CommandResult:
        timeout, on_output = options.timeout, options.on_output
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        parts: list[str] = []

        def take() -> None:
            text = decoder.decode(process.take_stdout())
            if text:
                parts.append(text)
                if on_output:
                    on_output(text)

        deadline = time.monotonic() + timeout if timeout is not None else None
        try:
            while not process.exited:
                if interrupt.requested():
                    self._end(process)
                    interrupt.check()
                wait = POLL
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._end(process)
                        take()
                        raise RemoteCommandError(
                            f"command timed out after {timeout:g}s on {self.host_name}: {command}",
                            result=CommandResult(
                                command, -1, "".join(parts), process.stderr_text()
                            ),
                        )
                    wait = min(wait, left)
                if process.wait_for_output(wait):
                    take()
                if self.client.lost and not process.exited:
                    raise self._lost(doing)
            take()
            status = process.wait()
        except ConnectionLostError:
            raise self._lost(doing) from None
        tail = decoder.decode(b"", final=True)
        if tail:
            parts.append(tail)
            if on_output:
                on_output(tail)
        return CommandResult(command, status, "".join(parts), process.stderr_text())

    def _python(self, module, request: dict | bytes, doing: str) -> CommandResult:
        """Run a hostside script with the agent's interpreter, `request` as its stdin."""
        stdin = request if isinstance(request, bytes) else json.dumps(request).encode("utf-8")
        process = self._open(script(module), doing, python=True, stdin=stdin)
        return self._finish(process, f"python3 {module.__name__}", RunOptions(), doing)

    def _answer(self, module, request: dict, doing: str) -> dict:
        """A hostside script's one JSON answer; `TransferError` when it failed."""
        result = self._python(module, request, doing)
        try:
            answer = json.loads(result.stdout)
            if not isinstance(answer, dict):
                raise ValueError("not an object")
        except ValueError:
            tail = result.stderr.strip().splitlines()[-1:] or [f"exit {result.exited}"]
            raise TransferError(f"{doing} on {self.host_name} failed: {tail[0]}") from None
        return answer

    # --- hashing ------------------------------------------------------------------------
    def hash_files(self, root: str, patterns: list[str]) -> tuple[list[RemoteFile], list[str]]:
        data = self._hash_request({"root": root, "patterns": list(patterns)})
        return data["files"], data["unmatched"]

    def scan(
        self, root: str, patterns: list[str], markers: str | None = None, lock: dict | None = None
    ) -> HostScan:
        return host_scan(self._hash_request(scan_request(root, patterns, markers, lock)))

    def _hash_request(self, request: dict) -> dict:
        request = {**request, "sums": self.host_config is None or self.host_config.live_sums}
        root = request["root"]
        result = self._python(_hashfiles, request, f"hashing files under {root}")
        return hash_answer(result, request, self.host_name)

    def settle_live(self, root: str, paths: list[str]) -> None:
        if not (self.settles_writes and paths):
            return
        if self.host_config is not None and not self.host_config.live_sums:
            return
        try:  # the answer comes once the settling process is forked: no wait for its work
            self._answer(_hashfiles, {"root": root, "settle": list(paths)}, "settling sums")
        except KerneldevError:
            pass  # only a cache: the next command hashes those files itself

    # --- files down -----------------------------------------------------------------------
    def stream_files(self, paths: list[str]) -> Iterator[tuple[str, Iterator[bytes]]]:
        request = json.dumps({"paths": list(paths)}).encode("utf-8")
        process = self._open(
            script(_sendfiles), "starting a file transfer", python=True, stdin=request
        )
        try:
            reader = _StreamReader(process, self)
            for path in paths:
                yield path, sendfiles_chunks(reader, path, self.host_name)
        finally:
            if not process.exited:
                self._end(process)  # an early stop (an error, Ctrl-C): the host stops too

    def read_bytes(self, path: str) -> bytes:
        for _, chunks in self.stream_files([path]):
            return b"".join(chunks)
        raise TransferError(f"{path}: no such file on {self.host_name}")  # not reached

    # --- files up -------------------------------------------------------------------------
    def _put_file(self, path: str, source: BinaryIO, options: PutOptions) -> None:
        # One file through the push stream; `before_rename` (the caller's own check) runs
        # while the host holds the written temporary file (`confirm`).
        item = {"path": path, "mode": options.mode, "expect": None, "check": False}
        if options.before_rename is not None:
            item["confirm"] = True
        process = self._start_receiving([item])
        stopped: BaseException | None = None
        try:
            send_file_records(process.write, lambda: source, path, options.on_bytes)
            if options.before_rename is not None:
                self._wait_written(process)
                options.before_rename()
                process.write(_sendfiles.HEADER.pack(b"R", 0))
        except ConnectionLostError:
            raise self._lost(f"writing {path}") from None
        except BaseException as err:  # Ctrl-C, the check refused, the source failed
            stopped = err
            self._abort(process)
        reports = self._reports(process, f"writing {path}")
        if stopped is not None:
            raise stopped
        done = [r for r in reports if "ok" in r]
        if done and not done[0]["ok"]:
            raise TransferError(f"cannot write {path} on {self.host_name}: {done[0].get('error')}")
        if not done:
            raise TransferError(f"writing {path} on {self.host_name} ended without a report")

    def _put_files(self, items: list[PutItem], callbacks: PutFilesCallbacks) -> None:
        # One stream for all: `receivefiles.py` lands each file as put_file does (temporary
        # file, compare-and-swap, rename) and reports it by one line.
        process = self._start_receiving(receive_items(items))
        sent, stopped = self._send_files(process, items, callbacks)
        self._settle_files(process, items, sent, stopped, callbacks)

    def _send_files(
        self, process: AgentProcess, items: list[PutItem], callbacks: PutFilesCallbacks
    ) -> tuple[dict[int, tuple[str, int]], BaseException | None]:
        """Every file's records to the receiving request: (sha256 and size of each file sent,
        the interrupt or read error that stopped the sending, after which the host was told
        to abort)."""
        on_start, on_bytes = callbacks.on_start, callbacks.on_bytes
        sent: dict[int, tuple[str, int]] = {}
        out = _Coalesced(process.write)
        try:
            try:
                for i, item in enumerate(items):
                    if on_start is not None:
                        on_start(i)
                    interrupt.check()
                    if process.exited:
                        break  # the host stopped reading (a failed check or write): it says why
                    sent[i] = send_file_records(out.write, item.open, item.path, on_bytes)
            finally:
                with interrupt.shield():
                    out.flush()  # whole records only: an abort after them is read as one
        except ConnectionLostError:
            raise self._lost("uploading files") from None
        except BaseException as err:  # Ctrl-C, or the workspace file could not be read
            self._abort(process)
            return sent, err
        return sent, None

    def _settle_files(
        self,
        process: AgentProcess,
        items: list[PutItem],
        sent: dict[int, tuple[str, int]],
        stopped: BaseException | None,
        callbacks: PutFilesCallbacks,
    ) -> None:
        # What landed is known only from the host's report: read it to the end even after
        # Ctrl-C (shielded; bounded by IO_TIMEOUT).
        reports = self._reports(process, "uploading files")
        settle_put_reports(items, sent, reports, self.host_name, callbacks.on_landed)
        if stopped is not None:
            raise stopped
        raise_put_failure(items, reports, self.host_name)
        if len(reports) < len(items):
            why = process.skip_reason or process.stderr_text().strip()[-200:]
            raise TransferError(
                f"uploading to {self.host_name} ended after {len(reports)} of {len(items)} "
                f"files without a reason: {why}"
            )

    def _start_receiving(
        self,
        files: list[dict],
        after: AgentProcess | None = None,
        lock: dict | None = None,
        backups: dict | None = None,
    ) -> AgentProcess:
        """`receivefiles.py` started (`after`: see `_open`); `lock`: the host lock that must
        still be ours when it begins and before each rename (`AgentChain.hold`); `backups`:
        `copyfiles.py`'s request, made by the same process before any file is renamed
        (`AgentChain.put_files`)."""
        fields: dict = {"mark": TEMP_MARK, "files": files}
        if lock is not None:
            fields["lock"] = lock
        if backups is not None:
            fields["backups"] = backups
        request = json.dumps(fields).encode("utf-8")
        process = self._open(
            script(_receivefiles), "starting a file transfer", python=True, after=after
        )
        try:
            process.write(len(request).to_bytes(8, "big") + request)
        except ConnectionLostError:
            raise self._lost("starting a file transfer") from None
        return process

    def _wait_written(self, process: AgentProcess) -> None:
        """Wait for the host's `written` line (confirm mode): the file is ready to rename."""
        buf = b""
        reader = _StreamReader(process, self)
        while b"\n" not in buf:
            buf += reader.read_exact(1)
        line = json.loads(buf.decode("utf-8", "replace"))
        if not line.get("written"):
            raise TransferError(f"writing on {self.host_name} failed: {line.get('error')}")

    def _abort(self, process: AgentProcess) -> None:
        with interrupt.shield():
            try:
                process.write(_sendfiles.HEADER.pack(b"A", 0))
            except ConnectionLostError:
                pass

    def _reports(self, process: AgentProcess, doing: str) -> list[dict]:
        with interrupt.shield():
            try:
                process.close_stdin()
                process.wait(IO_TIMEOUT)
            except ConnectionLostError:
                raise self._lost(doing) from None
            except TimeoutError:
                process.end()
            return parse_reports(process.take_stdout())

    # --- single steps -------------------------------------------------------------------
    def _fileop(self, request: dict, path: str, doing: str) -> dict:
        answer = self._answer(_fileops, request, f"{doing} {path}")
        if answer.get("ok"):
            return answer
        if answer.get("missing"):
            raise TransferError(f"{path}: no such file on {self.host_name}")
        raise TransferError(f"cannot {doing} {path} on {self.host_name}: {answer.get('error')}")

    def exists(self, path: str) -> bool:
        return bool(self._fileop({"op": "exists", "path": path}, path, "stat")["exists"])

    def mkdirs(self, path: str) -> None:
        answer = self._answer(_fileops, {"op": "mkdirs", "path": path}, f"create folder {path}")
        if answer.get("notdir"):
            raise TransferError(f"{path} on {self.host_name} exists and is not a folder")
        if not answer.get("ok"):
            raise TransferError(
                f"cannot create folder {path} on {self.host_name}: {answer.get('error')}"
            )

    def copy_on_host(self, pairs: list[tuple[str, str]]) -> dict[str, str | None]:
        # The shell script's steps in one forked helper (`hostside/copyfiles.py`), not four
        # programs started per file; the same temporary names, order, renames and sums.
        if not pairs:
            return {}
        items = [[src, temp_path(*posixpath.split(dst)), dst] for src, dst in pairs]
        result = self._python(_copyfiles, {"items": items}, "copying files on the host")
        return copy_sums(self.host_name, pairs, result)

    def rename(self, src: str, dst: str) -> None:
        self._fileop({"op": "rename", "src": src, "dst": dst}, dst, "rename onto")

    def file_sha256(self, path: str) -> str | None:
        return self._fileop({"op": "sha256", "path": path}, path, "read")["sha256"]

    # --- network ------------------------------------------------------------------------
    def http_get(self, url: str, timeout: float = 5.0) -> int:
        if urllib.parse.urlsplit(url).scheme == "https":
            return self._https_get_with_curl(url, timeout)
        hostname, port, request = http_request_text(url)
        answer = self._answer(
            _httpprobe,
            {"host": hostname, "port": port, "request": request, "timeout": timeout},
            f"GET {url}",
        )
        if not answer.get("ok"):
            target = f"{hostname}:{port}"
            if answer.get("refused"):
                raise HostConnectionError(
                    f"GET {url}: nothing answers at {target} on host '{self.host_name}' "
                    f"({answer.get('error')})"
                )
            if answer.get("timeout"):
                raise HostConnectionError(f"GET {url}: no answer within {timeout:g}s")
            raise HostConnectionError(f"GET {url}: {answer.get('error')}")
        return http_status(url, answer.get("head", ""))


class _Coalesced:
    """Writes gathered into blocks of `BLOCK` bytes: an upload of many small files is a few
    frames and SSH packets, not two per file. Callers write whole records, so a block always
    ends on a record's end."""

    BLOCK = 256 << 10

    def __init__(self, write) -> None:
        self._write = write
        self._parts: list[bytes] = []
        self._size = 0

    def write(self, data: bytes) -> None:
        self._parts.append(data)
        self._size += len(data)
        if self._size >= self.BLOCK:
            self.flush()

    def flush(self) -> None:
        if self._parts:
            data, self._parts, self._size = b"".join(self._parts), [], 0
            self._write(data)


class _StreamReader(ExactReader):
    """`ExactReader` over a request's stdout; a process that ends early is reported with its
    stderr."""

    def __init__(self, process: AgentProcess, transport: AgentTransport) -> None:
        super().__init__(transport.host_name, IO_TIMEOUT)
        self.process = process
        self.transport = transport

    def _recv(self, n: int) -> bytes:
        try:
            return self.process.read_stdout(max(n, 1 << 20), timeout=POLL)
        except ConnectionLostError:
            raise self.transport._lost("transferring files") from None

    def _ended_early(self) -> None:
        text = self.process.stderr_text().strip()
        tail = text.splitlines()[-1:] or [f"exit {self.process.status}"]
        raise TransferError(f"file transfer from {self.host_name} ended early: {tail[0]}")


def _first_line(command: str) -> str:
    first = command.split("\n", 1)[0]
    return first if len(first) <= 100 else first[:100] + " ..."
