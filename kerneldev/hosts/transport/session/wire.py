"""What a holder and its clients say beyond the agent's own frames (agent-protocol.md).

On a client's socket the holder speaks the agent protocol as the agent does (MAGIC, HELLO,
then the frames of the client's own requests, with the client's own ids), after one frame of
the client's that says what it came for, on the control id 0; these are numbered far from
the agent's frame types:

  USE    (client -> holder)  JSON {"key": ..., "code": ...}: run requests through the session.
                             The holder answers MAGIC and HELLO (reconnecting first when its
                             connection is past its maximum age).
  STATUS (client -> holder)  only the HELLO, then the holder closes (`session list`).
  STOP   (client -> holder)  end the session now (`kerneldev session stop`).

The holder's HELLO is the agent's with a `session` object added (pid, key, code stamp, ages,
counts), and `stale: true` when the client should start a new holder instead: the USE named
another key or code, or the holder is retiring (its connection lost, reconnecting failed). A
holder being started reports `{"ok": true}` on the pipe its starter gave it, or the error a
one-shot command would have raised, as JSON (`error_json`), which the starter raises.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

from kerneldev import errors
from kerneldev.errors import HostConnectionError, KerneldevError
from kerneldev.hosts.transport.agent_client import HEADER, MAGIC, MAX_PAYLOAD

USE, STATUS, STOP = 64, 65, 66
PEER_CRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


@dataclass(frozen=True)
class KeyCheck:
    """A refused host key as a client sees it (`HostKeyError.check` across the socket)."""

    name: str
    key_type: str
    fingerprint: str
    status: str


def frame(kind: int, rid: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), rid, kind) + payload


def error_json(err: KerneldevError) -> dict:
    """`err` as JSON: its class (one of kerneldev.errors), message, hint and what it carries."""
    data: dict = {"class": type(err).__name__, "message": err.message, "hint": err.hint}
    jump_host = getattr(err, "jump_host", None)
    if jump_host:
        data["jump_host"] = jump_host
    check = getattr(err, "check", None)
    if check is not None:
        data["check"] = {
            "name": check.name,
            "key_type": check.key_type,
            "fingerprint": check.fingerprint,
            "status": check.status,
        }
    return data


def error_from_json(data: dict) -> KerneldevError:
    """The error `error_json` wrote, as the same class with the same message and hint."""
    cls = getattr(errors, str(data.get("class")), None)
    if not (isinstance(cls, type) and issubclass(cls, KerneldevError)):
        cls = HostConnectionError
    err = cls.__new__(cls)
    # The message is taken as written (a jump host's prefix is already in it), so the class's
    # own __init__, which would build it again, is bypassed.
    KerneldevError.__init__(err, str(data.get("message", "")), data.get("hint"))
    if isinstance(err, HostConnectionError):
        err.jump_host = data.get("jump_host")
    if isinstance(err, errors.HostKeyError):
        check = data.get("check")
        err.check = KeyCheck(**check) if isinstance(check, dict) else None
    return err


def peer_cred(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a unix socket (the kernel's word)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER_CRED.size)
    pid, uid, _gid = PEER_CRED.unpack(raw)
    return pid, uid


class Prefixed:
    """A stream as `read(n)` (b"" at EOF or on an error), starting with bytes already read
    from it (a HELLO the reader looked at, what followed the agent's MAGIC)."""

    def __init__(self, head: bytes, read: Callable[[int], bytes]) -> None:
        self.head = head
        self._read = read

    def read(self, n: int) -> bytes:
        if self.head:
            out, self.head = self.head[:n], self.head[n:]
            return out
        try:
            return self._read(n)
        except OSError:
            return b""


class Buffered:
    """`read(n)` over a socket's `recv`, taking whatever has arrived (up to 64 KiB) at once,
    so that `frame_ready()` can tell whether a whole frame is already here."""

    def __init__(self, recv: Callable[[int], bytes]) -> None:
        self._recv = recv
        self._buffer = bytearray()

    def read(self, n: int) -> bytes:
        if not self._buffer:
            data = self._recv(max(n, 1 << 16))
            if not data:
                return b""
            self._buffer += data
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def frame_ready(self) -> bool:
        if len(self._buffer) < HEADER.size:
            return False
        length = HEADER.unpack_from(self._buffer)[0]
        return len(self._buffer) >= HEADER.size + length


def read_exact(read: Callable[[int], bytes], n: int) -> bytes | None:
    """Exactly `n` bytes from `read`, or None at EOF before them."""
    parts = []
    while n:
        block = read(min(n, 1 << 20))
        if not block:
            return None
        parts.append(block)
        n -= len(block)
    return b"".join(parts)


def read_frame(read: Callable[[int], bytes]) -> tuple[int, int, bytes] | None:
    """(kind, request id, payload), or None at EOF; `ValueError` for an oversized frame."""
    head = read_exact(read, HEADER.size)
    if head is None:
        return None
    length, rid, kind = HEADER.unpack(head)
    if length > MAX_PAYLOAD:
        raise ValueError(f"frame of {length} bytes")
    payload = read_exact(read, length) if length else b""
    if payload is None:
        return None
    return kind, rid, payload


__all__ = ["MAGIC", "STATUS", "STOP", "USE", "KeyCheck", "error_from_json", "error_json"]
