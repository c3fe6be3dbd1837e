"""The holder's relay: frames between many local clients and the one host agent.

Each client numbers its requests as it likes; the relay gives every OPEN a fresh id of its own
towards the agent and keeps the route back, so a client only ever sees, feeds and signals its
own requests (a STDIN or SIGNAL for an id the client did not open goes nowhere). When a client
goes away (its command ended, or it was killed or interrupted), its requests still running
are ended on the host (stdin closed, TERM, KILL after 2 s), nobody else's.

An OPEN that names an earlier request of its client (`"after"`, the agent's pipelines) is
passed on with that request's id towards the agent; one the client never opened becomes 0,
which the agent refuses, so a client can never chain onto another client's request.

Output to a client goes through a queue drained by that client's own writer thread, so a slow
or stopped client (Ctrl-Z) never holds up the agent's other requests; a client that leaves more
than `MAX_BACKLOG` bytes unread is dropped. What goes to the agent is written whole frame by
frame, one writer at a time.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable

from kerneldev.hosts.transport.agent_client import (
    CONTROL,
    END_GRACE,
    EXIT,
    HELLO,
    OPEN,
    PING,
    PONG,
    SIGNAL,
    STDERR,
    STDIN,
    STDOUT,
)
from kerneldev.hosts.transport.session import wire

log = logging.getLogger("kerneldev.session")

MAX_BACKLOG = 64 << 20  # bytes queued for one client before it counts as gone
MAX_ID = 0xFFFFFFFF
MAX_OPENED = 4096  # a client's past request ids remembered for "after" (oldest dropped)


class AgentLink:
    """The agent's end: `read(n)` (b"" at EOF) and `write(bytes)` over its channel, its HELLO,
    and `close()` that ends the channel (the agent then ends what it runs and exits)."""

    def __init__(
        self,
        read: Callable[[int], bytes],
        write: Callable[[bytes], None],
        close: Callable[[], None],
        hello: dict,
    ) -> None:
        self.read = read
        self._write = write
        self._close = close
        self.hello = hello
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def send(self, data: bytes) -> None:
        with self._lock:
            self._write(data)

    def read_frame(self) -> tuple[int, int, bytes] | None:
        return wire.read_frame(self.read)

    def close(self) -> None:
        try:
            self._close()
        except Exception:  # noqa: BLE001, S110 - closing a dead channel may fail
            pass


class Client:
    """One local connection: its socket, its outgoing queue, its requests (its id -> ours)."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        self.owned: dict[int, int] = {}
        self.opened: dict[int, int] = {}  # every request it opened, ended ones too (for "after")
        self.attached = False  # has opened a request (a status probe never does)
        self.alive = True
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self._backlog = 0
        self._backlog_lock = threading.Lock()
        threading.Thread(target=self._drain, daemon=True, name=f"client-{pid}-out").start()

    def send(self, data: bytes) -> None:
        if not self.alive:
            return
        with self._backlog_lock:
            self._backlog += len(data)
            full = self._backlog > MAX_BACKLOG
        if full:
            log.warning("client pid %s left %d bytes unread: dropped", self.pid, self._backlog)
            self.drop()
            return
        self._queue.put(data)

    def _drain(self) -> None:
        while True:
            data = self._queue.get()
            if data is None:
                break
            try:
                self.sock.sendall(data)
            except OSError:
                break
            with self._backlog_lock:
                self._backlog -= len(data)
        self.drop()

    def drop(self) -> None:
        """Cut the connection now: the client's reader sees EOF and the relay ends its
        requests."""
        self.alive = False
        self._queue.put(None)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Relay:
    """Routes between clients and the agent. `refresh()` is called (under the routing lock,
    while no request runs) before a client begins and before an OPEN is passed on: the holder
    reconnects there when its connection is too old; when that raises, `on_failed(err)` is
    told and the client dropped."""

    def __init__(
        self,
        agent: AgentLink,
        refresh: Callable[[], None],
        on_failed: Callable[[BaseException], None],
    ) -> None:
        self.agent = agent
        self._refresh = refresh
        self._on_failed = on_failed
        self._lock = threading.Lock()
        self._routes: dict[int, tuple[Client, int]] = {}
        self._next_id = 1
        self.clients: set[Client] = set()
        self.last_active = time.monotonic()
        self.agent_lost = threading.Event()
        self._held = threading.local()  # `frames`: a client's frames for the agent, held back
        self._start_reader(agent)

    # --- the agent ------------------------------------------------------------------------
    def replace_agent(self, agent: AgentLink) -> None:
        """A new connection's agent in place of the old one (only while nothing runs)."""
        old, self.agent = self.agent, agent
        self._start_reader(agent)
        old.close()

    def _start_reader(self, agent: AgentLink) -> None:
        threading.Thread(target=self._read_agent, args=(agent,), daemon=True).start()

    def _read_agent(self, agent: AgentLink) -> None:
        why = "the agent closed its output"
        try:
            while True:
                got = agent.read_frame()
                if got is None:
                    break
                self._from_agent(*got)
        except (OSError, EOFError, ValueError) as err:
            why = str(err) or type(err).__name__
        if agent is self.agent:  # not an old agent closed on purpose
            log.warning("lost the agent: %s", why)
            self.agent_lost.set()
            with self._lock:
                self._routes.clear()  # no EXIT will come for them
            for client in list(self.clients):
                client.drop()

    def _from_agent(self, kind: int, rid: int, payload: bytes) -> None:
        if rid == CONTROL:
            return  # HELLO was read before the relay began; PONGs answer nobody here
        with self._lock:
            route = self._routes.get(rid)
            if route is None:
                return
            client, cid = route
            if kind == EXIT:
                del self._routes[rid]
                client.owned.pop(cid, None)
                self.last_active = time.monotonic()
        if kind in (STDOUT, STDERR, EXIT):
            client.send(wire.frame(kind, cid, payload))

    # --- clients --------------------------------------------------------------------------
    def greet(self, client: Client, session: dict) -> None:
        """The client's first bytes: MAGIC and the agent's HELLO with `session` added."""
        hello = dict(self.agent.hello, session=session)
        client.send(wire.MAGIC + wire.frame(HELLO, CONTROL, json.dumps(hello).encode("utf-8")))

    def serve(self, client: Client, on_stop: Callable[[], None]) -> None:
        """Read the client's frames until it goes; then end what it left running."""
        with self._lock:
            self.clients.add(client)
        # The frames a client wrote together (a request's OPEN, stdin and end) go to the agent
        # in one write: one SSH packet, where one each cost up to 16 ms more under load.
        reader = wire.Buffered(client.sock.recv)
        self._held.frames = []
        try:
            while True:  # until EOF
                try:
                    got = wire.read_frame(reader.read)
                except (OSError, ValueError):
                    break
                if got is None:
                    break
                kind, cid, payload = got
                going_on = self._from_client(client, kind, cid, payload, on_stop)
                if not going_on or not reader.frame_ready():
                    self._send_held()
                if not going_on:
                    break
        finally:
            self._send_held()
            self._held.frames = None
            self._client_gone(client)

    def _from_client(self, client: Client, kind: int, cid: int, payload: bytes, on_stop) -> bool:
        """Handle one frame; False to drop the client (it broke the protocol)."""
        if cid == CONTROL:
            if kind == PING:
                client.send(wire.frame(PONG, CONTROL))
                return True
            if kind == wire.STOP:
                on_stop()
                return True
            return False
        if kind == OPEN:
            return self._open(client, cid, payload)
        if kind not in (STDIN, SIGNAL):
            return False
        with self._lock:
            rid = client.owned.get(cid)
        if rid is not None:  # else the request ended (late input) or was never this client's
            self._to_agent(kind, rid, payload)
        return True

    def refresh(self) -> None:
        """Run the holder's `refresh` now if no request runs (errors are the caller's)."""
        with self._lock:
            if not self._routes:
                self._refresh()

    def _open(self, client: Client, cid: int, payload: bytes) -> bool:
        with self._lock:
            if cid in client.owned:
                return False
            if self.agent_lost.is_set():
                # Nothing can run: the client is cut, as those connected at the loss were, so
                # it sees a lost connection (an EXIT with an error read as the command's own
                # failure, exit 127: `kerneldev diff` then exited 1, not 3).
                return False
            if not self._routes:
                try:
                    self._refresh()
                except Exception as err:  # noqa: BLE001 - the holder retires, cutting us all
                    # The client sees its connection lost, as over a dropped SSH connection,
                    # and its next connection starts a new holder.
                    self._on_failed(err)
                    return False
            rid = self._new_id()
            self._routes[rid] = (client, cid)
            client.owned[cid] = rid
            client.opened[cid] = rid
            while len(client.opened) > MAX_OPENED:
                del client.opened[next(iter(client.opened))]
            if b'"after"' in payload:
                payload = _chained(payload, client.opened)
            client.attached = True
            self.last_active = time.monotonic()
        self._to_agent(OPEN, rid, payload)
        return True

    def _new_id(self) -> int:
        while True:
            rid = self._next_id
            self._next_id = rid + 1 if rid < MAX_ID else 1
            if rid not in self._routes:
                return rid

    def _to_agent(self, kind: int, rid: int, payload: bytes) -> None:
        held = getattr(self._held, "frames", None)
        if held is not None:
            held.append(wire.frame(kind, rid, payload))
        else:
            self._send_to_agent(wire.frame(kind, rid, payload))

    def _send_held(self) -> None:
        held = getattr(self._held, "frames", None)
        if held:
            self._held.frames = []
            self._send_to_agent(b"".join(held))

    def _send_to_agent(self, data: bytes) -> None:
        try:
            self.agent.send(data)
        except (OSError, EOFError) as err:
            log.warning("cannot write to the agent: %s", err)
            self.agent.close()  # its reader then sees EOF: the agent counts as lost

    def _client_gone(self, client: Client) -> None:
        client.drop()
        with self._lock:
            self.clients.discard(client)
            left = list(client.owned.values())
            client.owned.clear()
            self.last_active = time.monotonic()
        if not left:
            return
        log.info("client pid %s left %d request(s) running: ending them", client.pid, len(left))
        for rid in left:
            self._to_agent(SIGNAL, rid, b'{"signal": "CANCEL"}')  # one waiting never starts
            self._to_agent(STDIN, rid, b"")
            self._to_agent(SIGNAL, rid, b'{"signal": "TERM"}')
        timer = threading.Timer(END_GRACE, self._kill_leftovers, args=(left,))
        timer.daemon = True
        timer.start()

    def _kill_leftovers(self, rids: list[int]) -> None:
        with self._lock:
            running = [rid for rid in rids if rid in self._routes]
        for rid in running:
            self._to_agent(SIGNAL, rid, b'{"signal": "KILL"}')

    # --- for the holder ---------------------------------------------------------------------
    def running(self) -> int:
        """Requests open on the agent (including those of clients that went away)."""
        with self._lock:
            return len(self._routes)

    def attached(self) -> int:
        """Connected clients that have opened a request (they count as using the session)."""
        with self._lock:
            return sum(1 for c in self.clients if c.attached)

    def drop_all(self) -> None:
        for client in list(self.clients):
            client.drop()


def _chained(payload: bytes, opened: dict[int, int]) -> bytes:
    """The OPEN with its "after" (the client's id) turned into the agent's id of that request;
    0 (refused by the agent) when the client did not open it."""
    try:
        spec = json.loads(payload.decode("utf-8"))
        after = spec.get("after")
    except (ValueError, AttributeError):
        return payload  # the agent answers a garbled OPEN itself
    if after is None:
        return payload
    spec["after"] = opened.get(after, 0) if isinstance(after, int) else 0
    return json.dumps(spec).encode("utf-8")
