"""Our side of the host agent's protocol (`kerneldev/hostside/agent.py`): many requests, one stream.

`AgentClient` works over two callables, `read(n) -> bytes` (b"" at EOF) and `write(bytes)`,
so the same code speaks to an agent over a paramiko channel and to the session holder over a
unix socket; it imports neither paramiko nor anything that does. One reader thread demuxes the
agent's frames by request id into `AgentProcess` objects; several requests may be open at
once from several threads. When the stream ends while a request is open, that request fails
with `ConnectionLostError` (and so does every later one).

The frame layout is the shared contract in /work/coord/agent-protocol.md: a 9-byte header
(`>IIB`: payload length, request id, frame type) and the payload; the agent writes `MAGIC`
before its first frame (HELLO) so that what a login shell printed first can be skipped.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import struct
import threading
import time
from collections.abc import Callable, Iterator

from kerneldev.errors import ConnectionLostError

MAGIC = b"\x00KDAGENT1\n"
HEADER = struct.Struct(">IIB")
MAX_PAYLOAD = 1 << 20
CONTROL = 0  # the request id of HELLO, PING and PONG
# frame types (the agent's numbering)
HELLO, OPEN, STDIN, SIGNAL, STDOUT, STDERR, EXIT, PING, PONG = range(9)
MAX_PREAMBLE = 1 << 16  # bytes a login shell may print before the agent's MAGIC
KILLED = 255  # the status of a process ended by a signal, as ssh reports it
END_GRACE = 2.0  # seconds between TERM and KILL when a request is ended

Reader = Callable[[int], bytes]
Writer = Callable[[bytes], None]


class AgentProcess:
    """One request: a process on the host. Output is buffered here by the reader thread."""

    def __init__(self, client: AgentClient, rid: int, command: str) -> None:
        self.client = client
        self.rid = rid
        self.command = command
        self._cond = threading.Condition()
        self._stdout = bytearray()
        self._stderr = bytearray()
        self._status: int | None = None
        self.start_error: str | None = None  # the agent could not start the process
        self.skip_reason: str | None = None  # not started: see `skipped`
        self._lost: str | None = None  # the stream ended before EXIT
        self._discard = False  # output no longer wanted (an early stop)

    # --- input --------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Send bytes to the process's stdin (split into frames of at most MAX_PAYLOAD)."""
        view = memoryview(data)
        while view:
            self.client._send(STDIN, self.rid, bytes(view[:MAX_PAYLOAD]))
            view = view[MAX_PAYLOAD:]

    def close_stdin(self) -> None:
        self.client._send(STDIN, self.rid, b"")

    def signal(self, name: str) -> None:
        """Send "TERM", "KILL" or "INT" to the process group (ignored once it has exited), or
        "CANCEL": a request opened `after` another that has not started yet never will."""
        if not self.exited:
            self.client._send(SIGNAL, self.rid, json.dumps({"signal": name}).encode())

    # --- output -------------------------------------------------------------------------
    @property
    def exited(self) -> bool:
        return self._status is not None

    @property
    def skipped(self) -> bool:
        """It never ran: the request it was opened `after` did not succeed, or it was
        cancelled, or the connection went first."""
        return self.skip_reason is not None

    @property
    def status(self) -> int | None:
        """The exit status (255 when ended by a signal), None while it runs."""
        return self._status

    def read_stdout(self, n: int, timeout: float | None = None) -> bytes:
        """Up to `n` bytes of stdout as soon as any are there; b"" once the process exited and
        all was read. `TimeoutError` after `timeout` seconds with nothing; `ConnectionLostError`
        when the stream ended."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._stdout or self._finished(), timeout):
                raise TimeoutError(f"no output within {timeout:g}s")
            if self._stdout:
                data = bytes(self._stdout[:n])
                del self._stdout[:n]
                return data
            self._raise_if_lost()
            return b""

    def take_stdout(self) -> bytes:
        """Whatever stdout has arrived (maybe b""), without waiting."""
        with self._cond:
            data = bytes(self._stdout)
            self._stdout.clear()
            return data

    def peek_stdout(self) -> bytes:
        """Whatever stdout has arrived, left for `take_stdout` (a request two steps read:
        `AgentChain`'s backups folded into the upload)."""
        with self._cond:
            return bytes(self._stdout)

    def iter_stdout(self, chunk: int = 1 << 20) -> Iterator[bytes]:
        """stdout in chunks until the process exits."""
        while True:
            data = self.read_stdout(chunk)
            if not data:
                return
            yield data

    def stderr_text(self) -> str:
        with self._cond:
            return bytes(self._stderr).decode("utf-8", "replace")

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; `TimeoutError` when still running after `timeout` seconds."""
        with self._cond:
            if not self._cond.wait_for(self._finished, timeout):
                raise TimeoutError(f"still running after {timeout:g}s")
            self._raise_if_lost()
            assert self._status is not None
            return self._status

    def wait_for_output(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for new stdout or the exit; True when either is there."""
        with self._cond:
            return self._cond.wait_for(lambda: self._stdout or self._finished(), timeout)

    def end(self) -> None:
        """Stop the process if it still runs: TERM to its group, KILL after 2 s. Output is
        discarded from now on. Best effort when the stream is gone."""
        with self._cond:
            self._discard = True
            self._stdout.clear()
        if self.exited or self._lost:
            return
        try:
            self.signal("TERM")
            try:
                self.wait(END_GRACE)
            except TimeoutError:
                self.signal("KILL")
                self.wait(END_GRACE)
        except (ConnectionLostError, TimeoutError):
            pass

    # --- fed by the reader thread -------------------------------------------------------
    def _finished(self) -> bool:
        return self._status is not None or self._lost is not None

    def _raise_if_lost(self) -> None:
        if self._lost is not None and self._status is None:
            raise ConnectionLostError(
                f"the connection to the host agent was lost while running `{_short(self.command)}`"
                f": {self._lost}",
                hint="check that the host is up and the network is stable, then run the command "
                "again (file writes are atomic: a target is either old or new)",
            )

    def _output(self, kind: int, data: bytes) -> None:
        with self._cond:
            if kind == STDOUT:
                if not self._discard:
                    self._stdout += data
            else:
                self._stderr += data
            self._cond.notify_all()

    def _exit(self, info: dict) -> None:
        with self._cond:
            if "error" in info:
                self.start_error = str(info["error"])
                if info.get("skipped"):
                    self.skip_reason = self.start_error
                self._stderr += self.start_error.encode("utf-8", "replace") + b"\n"
                self._status = 127
            else:
                status = int(info.get("status", KILLED))
                self._status = KILLED if status < 0 else status
            self._cond.notify_all()

    def _gone(self, why: str) -> None:
        with self._cond:
            self._lost = why
            self._cond.notify_all()


class AgentClient:
    """The agent at the other end of `read`/`write`. `shutdown()`, when given, closes our
    writing side (the agent sees EOF and ends); `close()` calls it."""

    def __init__(
        self, read: Reader, write: Writer, *, shutdown: Callable[[], None] | None = None
    ) -> None:
        self._read = read
        self._write = write
        self._shutdown = shutdown
        self._send_lock = threading.Lock()
        self._held = threading.local()  # `frames`: what this thread's `batch()` holds back
        self._lock = threading.Lock()
        self._requests: dict[int, AgentProcess] = {}
        self._next_id = 1
        self._hello: dict | None = None
        self._hello_event = threading.Event()
        self._pongs = threading.Condition()
        self._pong_count = 0
        self._lost: str | None = None
        self._preamble = b""  # what came before MAGIC (a login shell's output), for errors
        self._reader = threading.Thread(target=self._read_frames, daemon=True, name="agent-reader")
        self._reader.start()

    # --- the agent ----------------------------------------------------------------------
    def wait_hello(self, timeout: float | None = None) -> dict:
        """The agent's HELLO (waits for it); `ConnectionLostError` when the stream ended
        first (the agent could not start: its stderr is elsewhere), `TimeoutError` when it
        is not there within `timeout` seconds."""
        if not self._hello_event.wait(timeout):
            raise TimeoutError(f"no answer from the host agent within {timeout:g}s")
        if self._hello is None:
            raise self._lost_error("starting")
        return self._hello

    @property
    def hello(self) -> dict:
        return self.wait_hello()

    @property
    def started(self) -> bool:
        """The agent's HELLO came. The agent reads no request before it has sent it, so a
        stream that ended before that ran none of the requests sent into it."""
        return self._hello is not None

    def expect_hello_within(self, seconds: float) -> None:
        """End the stream (every request fails as lost) when no HELLO has come within
        `seconds`: requests may be sent before it, and must not wait on a host that never
        starts the agent for longer than `wait_hello(seconds)` would."""
        timer = threading.Timer(seconds, self._no_hello, args=(seconds,))
        timer.daemon = True
        timer.start()

    def _no_hello(self, seconds: float) -> None:
        if self._hello is None:
            self._stream_ended(f"no answer from the host agent within {seconds:g}s")

    @property
    def lost(self) -> str | None:
        """Why the stream ended (None while it is up)."""
        return self._lost

    def ping(self, timeout: float | None = 10.0) -> float:
        """A PING answered by a PONG: the round trip in seconds."""
        started = time.monotonic()
        with self._pongs:
            seen = self._pong_count
            self._send(PING, CONTROL, b"")
            if not self._pongs.wait_for(lambda: self._pong_count > seen or self._lost, timeout):
                raise TimeoutError(f"no PONG from the host agent within {timeout:g}s")
        if self._pong_count <= seen:
            raise self._lost_error("pinging")
        return time.monotonic() - started

    def close(self) -> None:
        """End our side: the agent sees EOF, ends what it still runs and exits."""
        if self._shutdown is not None:
            try:
                self._shutdown()
            except (OSError, EOFError):
                # EOFError: paramiko's `shutdown_write` on a connection already cut (its
                # socket refuses the write); the agent sees that end as EOF all the same.
                pass

    # --- requests -----------------------------------------------------------------------
    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The frames this thread sends inside the block are written together when it ends:
        a request's OPEN, its stdin and its end as one write, so one SSH packet (and one read
        of sshd, of the agent and of a session holder's relay) where three cost up to 16 ms
        more under load (docs/benchmarks.md, issue 23). Nothing is written when the block
        raises: the caller gives that request up."""
        if getattr(self._held, "frames", None) is not None:
            yield  # inside another batch: that one writes
            return
        self._held.frames = []
        try:
            yield
            frames = self._held.frames
        finally:
            self._held.frames = None
        if frames:
            self._write_frame(b"".join(frames))

    @property
    def pipelines(self) -> bool:
        """The agent runs a request `after` another (HELLO's "pipeline"; waits for HELLO)."""
        return bool(self.hello.get("pipeline"))

    def open(
        self,
        command: str,
        python: bool = False,
        fresh: bool = False,
        after: AgentProcess | None = None,
    ) -> AgentProcess:
        """Start `command` on the host (`/bin/sh -c`, or with `python` a hostside script's
        source run by the agent's interpreter: in a fork of the agent, or with `fresh` in a new
        `python -S -c`) and return it at once. `after` (where `pipelines`): the host starts it
        only once that request has exited with status 0, else it is `skipped`; its stdin may
        be sent meanwhile."""
        with self._lock:
            if self._lost is not None:
                raise self._lost_error(f"starting `{_short(command)}`")
            rid = self._next_id
            self._next_id = rid + 1 if rid < 0xFFFFFFFF else 1
            process = AgentProcess(self, rid, command)
            self._requests[rid] = process
        spec: dict = {"command": command}
        if python:
            spec["python"] = True
        if fresh:
            spec["fresh"] = True
        if after is not None:
            spec["after"] = after.rid
        self._send(OPEN, rid, json.dumps(spec).encode("utf-8"))
        return process

    def run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        on_output: Callable[[str], None] | None = None,
        timeout: float | None = None,
        python: bool = False,
    ) -> tuple[int, str, str]:
        """Run to its end: (status, stdout, stderr) as text. `on_output(text)` gets stdout as
        it arrives (in this thread). Past `timeout` the process group is ended (TERM, KILL)
        and `TimeoutError` raised."""
        process = self.open(command, python=python)
        if stdin:
            process.write(stdin)
        process.close_stdin()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        parts: list[str] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                process.end()
                raise TimeoutError(f"`{_short(command)}` timed out after {timeout:g}s")
            process.wait_for_output(0.5 if left is None else min(0.5, left))
            text = decoder.decode(process.take_stdout())
            if text:
                parts.append(text)
                if on_output:
                    on_output(text)
            if process.exited or self._lost:
                if process.wait_for_output(0) and process.take_stdout():
                    continue  # cannot happen: EXIT comes after all output; kept for safety
                break
        status = process.wait()
        tail = decoder.decode(b"", final=True)
        if tail:
            parts.append(tail)
            if on_output:
                on_output(tail)
        return status, "".join(parts), process.stderr_text()

    # --- the stream ---------------------------------------------------------------------
    def _send(self, kind: int, rid: int, payload: bytes) -> None:
        frame = HEADER.pack(len(payload), rid, kind) + payload
        held = getattr(self._held, "frames", None)
        if held is not None:
            if self._lost is not None:
                raise self._lost_error("sending")
            held.append(frame)
            return
        self._write_frame(frame)

    def _write_frame(self, frame: bytes) -> None:
        with self._send_lock:
            if self._lost is not None:
                raise self._lost_error("sending")
            try:
                self._write(frame)
            except (OSError, EOFError) as err:
                self._stream_ended(f"cannot send: {err or type(err).__name__}")
                raise self._lost_error("sending") from None

    def _read_exact(self, n: int) -> bytes | None:
        parts = []
        while n:
            block = self._read(n)
            if not block:
                return None
            parts.append(block)
            n -= len(block)
        return b"".join(parts)

    def _find_magic(self) -> bool:
        seen = b""
        while MAGIC not in seen:
            block = self._read(1)
            if not block:
                self._preamble = seen
                return False
            seen += block
            if len(seen) > MAX_PREAMBLE:
                self._preamble = seen[:200]
                return False
        self._preamble = seen[: -len(MAGIC)]
        return True

    def _read_frames(self) -> None:
        why = "the agent closed the stream"
        try:
            if not self._find_magic():
                why = "the host agent did not start" + (
                    f" (it printed {self._preamble[:200]!r})" if self._preamble else ""
                )
                return
            while True:
                head = self._read_exact(HEADER.size)
                if head is None:
                    return
                length, rid, kind = HEADER.unpack(head)
                if length > MAX_PAYLOAD:
                    why = f"garbled frame from the agent ({length} bytes)"
                    return
                payload = self._read_exact(length) if length else b""
                if payload is None:
                    return
                self._dispatch(kind, rid, payload)
        except (OSError, EOFError, ValueError) as err:
            why = str(err) or type(err).__name__
        finally:
            self._stream_ended(why)

    def _dispatch(self, kind: int, rid: int, payload: bytes) -> None:
        if kind == HELLO:
            self._hello = json.loads(payload.decode("utf-8"))
            self._hello_event.set()
        elif kind == PONG:
            with self._pongs:
                self._pong_count += 1
                self._pongs.notify_all()
        elif kind in (STDOUT, STDERR):
            process = self._requests.get(rid)
            if process is not None:
                process._output(kind, payload)
        elif kind == EXIT:
            with self._lock:
                process = self._requests.pop(rid, None)
            if process is not None:
                process._exit(json.loads(payload.decode("utf-8")))

    def _stream_ended(self, why: str) -> None:
        with self._lock:
            if self._lost is None:
                self._lost = why
            pending = list(self._requests.values())
            self._requests.clear()
        for process in pending:
            process._gone(self._lost)
        self._hello_event.set()
        with self._pongs:
            self._pongs.notify_all()

    def _lost_error(self, doing: str) -> ConnectionLostError:
        return ConnectionLostError(
            f"the connection to the host agent was lost while {doing}: {self._lost}",
            hint="check that the host is up and the network is stable, then run the command "
            "again (file writes are atomic: a target is either old or new)",
        )


def _short(command: str) -> str:
    first = command.split("\n", 1)[0]
    return first if len(first) <= 80 and first == command else first[:80] + " ..."
