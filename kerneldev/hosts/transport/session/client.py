"""A command's side of a kept session: find the host's holder, or start one, and talk to it.

`open_kept(host)` gives an `AgentTransport` over the holder's unix socket: the same agent
protocol as over SSH, so every operation behaves as a one-shot command's (it reads the host's
live files; nothing is cached in the holder). It checks that the socket's owner is this user
(SO_PEERCRED) and that the holder serves the same connection with the same code; a stale
socket (nobody listening), a dead holder or one for another config is replaced without a word.
Starting one is serialized by a lock file, so two first commands start one holder. A holder
that cannot connect says why, and the command fails with that same error (a changed host key,
a refused connection); a holder that cannot start at all (no private folder for the socket,
a crash) leaves the command to connect one-shot, and so does a holder whose process is stopped
(SIGSTOP, a debugger: it answers nothing until continued; its socket stays its own). This
module never imports paramiko.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import kerneldev
from kerneldev import interrupt, process_state
from kerneldev.config import HostConfig
from kerneldev.hosts.transport.agent_client import (
    CONTROL,
    HEADER,
    HELLO,
    MAGIC,
    MAX_PAYLOAD,
    AgentClient,
)
from kerneldev.hosts.transport.base import Transport
from kerneldev.hosts.transport.over_agent import AgentTransport
from kerneldev.hosts.transport.session import location, wire
from kerneldev.hosts.transport.session.identity import (
    code_stamp,
    connection_fields,
    resolved_ssh_config,
    session_key,
)
from kerneldev.hosts.transport.session.keep import NO_KEEP_ENV as NO_KEEP_ENV  # re-exported
from kerneldev.hosts.transport.session.keep import keep_wanted as keep_wanted
from kerneldev.hosts.transport.session.keep import keeping as keeping

HOLDER_MODULE = "kerneldev.hosts.transport.session.holder"
HELLO_TIMEOUT = 60.0  # seconds for a holder's HELLO (it may be reconnecting first)
POLL = 0.2  # seconds between looks at Ctrl-C while waiting
MAX_LOG = 1 << 20  # bytes of a holder's log before the next holder starts it afresh
attached = False  # True once this process went through a kept session (cli/warm_client.py)


def open_kept(
    host: HostConfig,
    *,
    ssh_config: str | Path | None = None,
    connect_timeout: float | None = None,
) -> Transport | None:
    """A transport through `host`'s kept session, starting its holder if needed; None when no
    session can be kept here (the caller then connects one-shot). Raises the connection's own
    `KerneldevError` when the holder could not connect."""
    key = session_key(host, ssh_config)
    try:
        where = location.place(host, key)
    except location.PlaceError:
        return None
    code = code_stamp()
    try:
        sock = _attach(where.socket, key, code)
        if sock is None:
            with _start_lock(where.start_lock):
                sock = _attach(where.socket, key, code)  # another command may have started it
                if sock is None and _start_holder(
                    host, where, key, code, ssh_config, connect_timeout
                ):
                    sock = _attach(where.socket, key, code)
    except HolderStopped:
        return None  # not waited for: the command connects one-shot (`session list` says so)
    if sock is None:
        return None
    global attached
    attached = True
    return _transport(host, sock)


def _transport(host: HostConfig, attached: tuple[socket.socket, bytes]) -> Transport:
    sock, head = attached
    reader = wire.Prefixed(head, sock.recv)
    client = AgentClient(reader.read, sock.sendall, shutdown=lambda: _shutdown(sock))
    return AgentTransport(client, host, host.name, settles_writes=True)


# --- reaching a holder ------------------------------------------------------------------


def connect(path: Path) -> socket.socket | None:
    """A connection to the holder at `path` if one listens there and is this user's."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        if wire.peer_cred(sock)[1] != os.getuid():
            raise OSError(errno.EPERM, "the socket belongs to another user")
    except OSError:
        sock.close()
        return None
    return sock


class HolderStopped(OSError):
    """The holder's process is stopped (SIGSTOP, a debugger): it answers nothing until it is
    continued, so nobody waits for it."""

    def __init__(self, pid: int) -> None:
        super().__init__(errno.EAGAIN, f"the session holder (pid {pid}) is stopped")
        self.pid = pid


def read_hello(sock: socket.socket, timeout: float = HELLO_TIMEOUT) -> tuple[dict, bytes]:
    """The holder's HELLO and the bytes it came in (MAGIC and the frame); `OSError` when the
    holder closed, said nothing or something else, `HolderStopped` as soon as its process is
    seen stopped."""
    pid = wire.peer_cred(sock)[0]
    magic = _recv(sock, len(MAGIC), timeout, pid)
    head = _recv(sock, HEADER.size, timeout, pid)
    length, rid, kind = HEADER.unpack(head)
    if magic != MAGIC or length > MAX_PAYLOAD or rid != CONTROL or kind != HELLO:
        raise OSError(errno.EPROTO, "not a session holder")
    payload = _recv(sock, length, timeout, pid)
    return json.loads(payload.decode("utf-8")), magic + head + payload


def _attach(path: Path, key: str, code: str) -> tuple[socket.socket, bytes] | None:
    """Connected to a holder for `key` running `code`, past its HELLO (kept for the agent
    client); None when there is none (a stale one is told it is, and goes)."""
    sock = connect(path)
    if sock is None:
        return None
    try:
        sock.sendall(_control(wire.USE, {"key": key, "code": code}))
        hello, head = read_hello(sock)
    except HolderStopped:
        sock.close()
        raise
    except (OSError, ValueError):
        sock.close()
        return None
    session = hello.get("session") or {}
    if session.get("stale") or session.get("key") != key or session.get("code") != code:
        sock.close()
        _wait_gone(path, session.get("pid"))
        return None
    sock.settimeout(None)
    return sock, head


def _control(kind: int, data: dict | None = None) -> bytes:
    return wire.frame(kind, CONTROL, json.dumps(data or {}).encode("utf-8"))


def _recv(sock: socket.socket, n: int, timeout: float, pid: int) -> bytes:
    """Exactly `n` bytes within `timeout` seconds from the holder `pid`, Ctrl-C honoured while
    waiting; `HolderStopped` once its process is seen stopped."""
    deadline = time.monotonic() + timeout
    parts = []
    while n:
        interrupt.check()
        left = deadline - time.monotonic()
        if left <= 0:
            raise OSError(errno.ETIMEDOUT, "the session holder did not answer")
        sock.settimeout(min(POLL, left))
        try:
            block = sock.recv(n)
        except TimeoutError:
            if process_state.stopped(pid):
                raise HolderStopped(pid) from None
            continue
        if not block:
            raise OSError(errno.ECONNRESET, "the session holder closed the connection")
        parts.append(block)
        n -= len(block)
    return b"".join(parts)


def _wait_gone(path: Path, pid: object, timeout: float = 2.0) -> None:
    """Give a retiring holder a moment to take its socket away."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and os.path.lexists(path):
        probe = connect(path)
        if probe is None:
            return
        probe.close()
        time.sleep(0.05)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


# --- starting a holder ------------------------------------------------------------------


@contextlib.contextmanager
def _start_lock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                interrupt.check()
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def _start_holder(
    host: HostConfig,
    where: location.SessionPlace,
    key: str,
    code: str,
    ssh_config: str | Path | None,
    connect_timeout: float | None,
) -> bool:
    """Start a holder and wait until it listens: True; False when it failed for a reason of
    its own (see its log); its connection's error raised as a one-shot command's."""
    spec = {
        "host": connection_fields(host),
        "key": key,
        "code": code,
        "socket": str(where.socket),
        "ssh_config": resolved_ssh_config(ssh_config),
        "connect_timeout": connect_timeout,
        "config_path": str(host.config_path) if host.config_path else None,
        "idle": host.session.idle,
        "max_age": host.session.max_age,
    }
    try:
        location.private_folder(where.log.parent)
        log_path = where.log
    except location.PlaceError:
        log_path = Path(os.devnull)  # no private place for it: the holder runs without a log
    env = dict(os.environ)
    # The holder runs this very kerneldev, wherever it was imported from.
    package_root = str(Path(kerneldev.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    read_end, write_end = os.pipe()
    try:
        big = log_path.is_file() and log_path.stat().st_size > MAX_LOG
        with open(log_path, "wb" if big else "ab") as log:  # a new holder, a fresh log
            if log_path != Path(os.devnull):
                os.chmod(log_path, 0o600)
            process = subprocess.Popen(
                [sys.executable, "-m", HOLDER_MODULE, "--ready-fd", str(write_end), host.name],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=log,
                pass_fds=(write_end,),
                start_new_session=True,  # no terminal: Ctrl-C in it never reaches the holder
                cwd="/",
                env=env,
            )
        os.close(write_end)
        write_end = -1
        assert process.stdin is not None
        process.stdin.write(json.dumps(spec).encode("utf-8"))
        process.stdin.close()
        process.wait()  # the first process only: the holder itself is its child
        answer = _read_ready(read_end, _ready_timeout(connect_timeout))
    except OSError:
        return False
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    if "error" in answer:
        raise wire.error_from_json(answer["error"])
    return bool(answer.get("ok"))


def _ready_timeout(connect_timeout: float | None) -> float:
    # Each connection step has its own timeout; this only bounds a holder that hangs.
    return 6 * (connect_timeout or 10.0) + 30.0


def _read_ready(fd: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        interrupt.check()
        left = deadline - time.monotonic()
        if left <= 0:
            return {}
        ready, _, _ = select.select([fd], [], [], min(POLL, left))
        if not ready:
            continue
        block = os.read(fd, 65536)
        if not block:
            break
        data += block
    try:
        answer = json.loads(data.decode("utf-8"))
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}
