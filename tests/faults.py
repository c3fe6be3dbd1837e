"""Fault injection for the reliability tests: a TCP proxy that cuts the connection after a
given number of bytes, a transport under which someone else changes the host mid-push, and
checks of what a host looks like after a fault."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kerneldev.config import HostConfig
from kerneldev.hosts.transport import open_transport, over_agent
from kerneldev.hosts.transport.base import TEMP_MARK, Transport
from kerneldev.loop.state import load_state
from kerneldev.sandbox.proxy import LoopbackProxy


class CuttingProxy(LoopbackProxy):
    """Forwards 127.0.0.1:<port> to `target_port`; once `cut_after` bytes (both directions
    together) have passed, it closes both sides of every connection, as a dropped network
    link does. `cut_after=None` never cuts (used to measure a run's traffic in `total`)."""

    def __init__(self, target_port: int) -> None:
        self.cut_after: int | None = None
        self.total = 0
        self.cut = False
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        super().__init__(target_port)

    def reset(self, cut_after: int | None) -> None:
        with self._lock:
            self.cut_after, self.total, self.cut = cut_after, 0, False

    def _forward(self, client: socket.socket, server: socket.socket) -> None:
        with self._lock:
            self._socks += [client, server]
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(4096)
            except OSError:
                data = b""
            if not data:
                break
            with self._lock:
                if self.cut:
                    break
                if self.cut_after is not None and self.total + len(data) > self.cut_after:
                    data = data[: max(0, self.cut_after - self.total)]
                    self.cut = True
                self.total += len(data)
            try:
                if data:
                    dst.sendall(data)
            except OSError:
                break
            if self.cut:
                self._cut_all()
                return
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _cut_all(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        super().close()
        self._cut_all()


def meddled(host: HostConfig, after: str, meddle: Callable[[], None]) -> Transport:
    """The host's transport, under which `meddle()` (someone else at work on the host) runs
    once the file whose path ends in `after` has landed on the host, before the next file's
    bytes are sent: in the middle of the upload, on the one-request-per-step path and in the
    host agent's chain alike (there the upload may be queued behind the backups when the
    client sends, so the client's own progress says nothing of the host's)."""

    class Meddled(type(open_transport(host))):
        def put_files(self, items, *, on_start=None, **kw):
            start = _meddling(items, after, meddle, on_start)
            with _each_record_sent_at_once():
                return super().put_files(items, on_start=start, **kw)

        def chain(self):
            chain = super().chain()
            if chain is not None:
                put = chain.put_files

                def put_files(items, callbacks, size):
                    on_start = _meddling(items, after, meddle, callbacks.on_start)
                    with _each_record_sent_at_once():
                        return put(items, dataclasses.replace(callbacks, on_start=on_start), size)

                chain.put_files = put_files
            return chain

    return Meddled(host)


@contextlib.contextmanager
def _each_record_sent_at_once():
    """The agent transport gathers an upload's records into 256 KiB writes: a file's bytes
    would not leave before the next file's, and `_meddling` would wait for a file that cannot
    land yet. Here each record goes as it is written."""
    block = over_agent._Coalesced.BLOCK
    over_agent._Coalesced.BLOCK = 1
    try:
        yield
    finally:
        over_agent._Coalesced.BLOCK = block


def _meddling(items, after: str, meddle: Callable[[], None], on_start):
    def start(i):
        if i > 0 and items[i - 1].path.endswith(after):
            with items[i - 1].open() as f:
                sent = f.read()
            landed = Path(items[i - 1].path)
            deadline = time.monotonic() + 60  # a bound for a loaded machine, not a speed check
            while time.monotonic() < deadline and not _holds(landed, sent):
                time.sleep(0.01)
            meddle()
        if on_start is not None:
            on_start(i)

    return start


def _holds(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except OSError:
        return False


def process_gone(pid: int, within_s: float = 15.0) -> bool:
    """Whether process `pid` ends within `within_s` (a zombie nobody reaped yet counts as
    gone). The wait is a bound for a loaded machine, not a speed check: it returns as soon as
    the process is gone."""
    for _ in range(int(within_s * 10)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{pid}/stat")
        try:
            if stat.read_text().split(")")[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


class OnceTrue:
    """Runs `action` from a thread once `condition()` holds (asked every `poll_s`): the step
    under test is then known to be under way, where a fixed delay raced its start on a loaded
    CI machine. After `within_s` without it, `action` runs anyway, so the test fails instead of
    hanging. Leaving a `with` block first stops the watcher (no stray action, e.g. a Ctrl-C,
    reaches a later test); `join()` waits for the action instead."""

    def __init__(
        self,
        condition: Callable[[], bool],
        action: Callable[[], object],
        within_s: float = 60.0,
        poll_s: float = 0.02,
    ) -> None:
        self.condition, self.action = condition, action
        self.within_s, self.poll_s = within_s, poll_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        deadline = time.monotonic() + self.within_s
        while time.monotonic() < deadline and not self.done.is_set() and not self.condition():
            time.sleep(self.poll_s)
        if not self.done.is_set():
            self.action()

    def start(self) -> OnceTrue:
        self.thread.start()
        return self

    def join(self) -> None:
        self.thread.join()

    def __enter__(self) -> OnceTrue:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()


def _has_content(path: Path) -> bool:
    try:
        return bool(path.read_text().strip())
    except OSError:
        return False


def interrupt_once_written(path: Path) -> OnceTrue:
    """SIGINT to this process, as a terminal's Ctrl-C, once `path` has content (the command
    under test wrote its pid there), as a `with` block."""
    return OnceTrue(lambda: _has_content(path), lambda: os.kill(os.getpid(), signal.SIGINT))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def temp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(f"*{TEMP_MARK}*") if p.is_file())


def check_backups(root: Path, workspace: Path) -> list[str]:
    """Problems with the backups the workspace's deploy records point at (empty: all fine)."""
    problems = []
    for record in load_state(workspace).deploys:
        if not (root / ".kerneldev/backups" / record.id).is_dir():
            continue  # pruned as a whole (older than keep_backups): not a corruption
        for f in record.files:
            if f.old_sha256 is None:
                continue
            backup = root / f.backup if f.backup else None
            if backup is None or not backup.is_file():
                problems.append(f"{record.id}: no backup of {f.path}")
            elif sha(backup.read_bytes()) != f.old_sha256:
                problems.append(f"{record.id}: backup of {f.path} does not match")
    return problems
