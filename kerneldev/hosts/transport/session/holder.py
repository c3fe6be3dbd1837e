"""The session holder: the background process that keeps one host's connection and agent.

Started by the first command to a host (`client.py`) as `python -m
kerneldev.hosts.transport.session.holder --ready-fd N HOST`, with its spec as JSON on stdin.
It detaches (a second fork: nobody waits for it), connects with `SSHConnection` (the host key
verified as for every connection), starts the host agent over one exec channel, listens on
its unix socket (0600, in a private folder: `location.py`) and says `{"ok": true}` (or the
error a one-shot command would have raised) on the ready pipe. Then it relays (`relay.py`):

- a connection from another uid is refused (SO_PEERCRED), whatever the file modes say;
- before a client begins, and before an OPEN when nothing runs, a connection older than
  `max_age` is replaced by a new one (the host key verified again); when that fails (a
  changed host key) the holder retires, and the command starts a new holder, whose fresh
  connection fails (or not) exactly as a one-shot command's would;
- it retires when idle for `idle` seconds (no request running, no client that ran one),
  when its socket file is removed or replaced (nobody can reach it: a deleted workspace),
  when its connection is lost, on `session stop` or SIGTERM, and when the config, ssh_config
  or known_hosts change what a new command would do (`freshness.py`). Retiring unlinks the
  socket at once (the next command starts a new holder), lets running requests end (unless
  cut), then exits.

Its log (stderr) is the workspace's `.kerneldev/sessions/<host>-<key>.log`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from kerneldev.config import HostConfig, SessionConfig
from kerneldev.errors import KerneldevError
from kerneldev.hosts.transport.agent_client import (
    CONTROL,
    HELLO,
    MAGIC,
    MAX_PREAMBLE,
)
from kerneldev.hosts.transport.session import wire
from kerneldev.hosts.transport.session.freshness import Freshness
from kerneldev.hosts.transport.session.liveness import Liveness
from kerneldev.hosts.transport.session.relay import AgentLink, Client, Relay
from kerneldev.hosts.transport.ssh import agent_channel, agent_failure
from kerneldev.hosts.transport.ssh_connection import SSHConnection, describe_error

log = logging.getLogger("kerneldev.session")

TICK = 0.5  # seconds between looks at idleness, the watched files and stop requests
FIRST_FRAME_TIMEOUT = 10.0  # seconds a new client has to say what it came for
LISTEN_BACKLOG = 64


class Taken(Exception):
    """Another holder already listens on the socket (started at the same moment)."""


class NoAgent(Exception):
    """The host agent cannot run there (no python3): commands go one-shot, which falls back
    to one remote command per step."""


def host_from_fields(fields: dict) -> HostConfig:
    """A host entry with just what connecting needs (`identity.connection_fields`)."""
    return HostConfig(
        name=fields["name"],
        root="/",
        files=(),
        workspace=Path("/"),
        hostname=fields["hostname"],
        user=fields["user"],
        port=fields["port"],
        identity_file=Path(fields["identity_file"]) if fields["identity_file"] else None,
        known_hosts=Path(fields["known_hosts"]) if fields["known_hosts"] else None,
        python=fields["python"],
    )


class Holder:
    def __init__(self, spec: dict) -> None:
        self.host = host_from_fields(spec["host"])
        self.key = spec["key"]
        self.code = spec["code"]
        self.socket_path = Path(spec["socket"])
        self.ssh_config = spec["ssh_config"]
        self.connect_timeout = spec.get("connect_timeout")
        self.config_path = Path(spec["config_path"]) if spec.get("config_path") else None
        self.session = SessionConfig(idle=float(spec["idle"]), max_age=float(spec["max_age"]))
        self.started = time.time()
        self.retiring: str | None = None
        self._retire_lock = threading.Lock()
        self._inode: int | None = None
        self.listener: socket.socket | None = None
        self.terminate = threading.Event()  # set by SIGTERM (a handler may not take locks)
        self.served = 0  # commands that have used the session
        self.stalled = False  # the host stopped answering keepalives: the connection was closed

    # --- connecting -----------------------------------------------------------------------
    def start(self) -> None:
        """Connect, start the agent, listen. `KerneldevError` as a one-shot command gives."""
        self.connection, link = self.connect()
        self.freshness = Freshness(self.host, self.connection, self.ssh_config, self.config_path)
        self.relay = Relay(link, self._refresh, self._refresh_failed)
        self.liveness = Liveness(lambda: self.connection.current_transport())
        self.listener = self._bind()

    def connect(self) -> tuple[SSHConnection, AgentLink]:
        connection = SSHConnection(
            self.host, ssh_config=self.ssh_config, connect_timeout=self.connect_timeout
        )
        try:
            return connection, self._start_agent(connection)
        except BaseException:
            connection.close()
            raise

    def _start_agent(self, connection: SSHConnection) -> AgentLink:
        chan = agent_channel(connection, ["python3", self.host.python])
        seen = b""
        # As long as a one-shot transport waits for the agent's HELLO. No channel timeout: the
        # thread that drains the agent's stderr reads with it too.
        deadline = time.monotonic() + 3 * connection.connect_timeout
        try:
            while MAGIC not in seen and len(seen) <= MAX_PREAMBLE:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([chan], [], [], left)[0]:
                    break
                block = chan.recv(4096)
                if not block:
                    break
                seen += block
        except (OSError, EOFError) as err:
            raise connection.dropped(err, "starting the host agent") from None
        if MAGIC not in seen:
            if not connection.is_active():
                raise connection.dropped(EOFError(), "starting the host agent")
            reason = agent_failure(chan)
            chan.close()
            raise NoAgent(reason)
        reader = wire.Prefixed(seen.split(MAGIC, 1)[1], chan.recv)
        link = AgentLink(reader.read, chan.sendall, chan.close, {})
        got = link.read_frame()
        if got is None or got[0] != HELLO or got[1] != CONTROL:
            chan.close()
            raise NoAgent("the host agent did not say HELLO")
        link.hello = json.loads(got[2].decode("utf-8"))
        log.info("connected to %s, agent pid %s", connection.target().address, link.hello["pid"])
        return link

    def _refresh(self) -> None:
        """Reconnect when the connection is past its maximum age (called while nothing runs)."""
        age = time.monotonic() - self.relay.agent.started
        if age <= self.session.max_age:
            return
        log.info("connection %.0fs old (max_age %.0fs): reconnecting", age, self.session.max_age)
        connection, link = self.connect()  # verifies the host key again
        old, self.connection = self.connection, connection
        self.relay.replace_agent(link)
        old.close()
        self.freshness.reconnected(connection)

    def _refresh_failed(self, err: BaseException) -> None:
        why = err.message if isinstance(err, KerneldevError) else describe_error(err)
        self.retire(f"reconnecting failed: {why}", cut=True)

    # --- the socket -----------------------------------------------------------------------
    def _bind(self) -> socket.socket:
        path = str(self.socket_path)
        if os.path.lexists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
                raise Taken(path)
            except (ConnectionRefusedError, FileNotFoundError):
                log.info("removing the stale socket %s", path)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is born 0600: nobody else may connect in between
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(LISTEN_BACKLOG)
        self._inode = os.stat(path).st_ino
        return sock

    def _socket_is_ours(self) -> bool:
        """Whether the socket's path still names the socket this holder listens on."""
        try:
            return os.stat(self.socket_path).st_ino == self._inode
        except FileNotFoundError:
            return False
        except OSError:
            return True  # cannot tell (a permission change): keep serving

    def _unlink_socket(self) -> None:
        """Remove the socket file if it is still ours (a new holder may have bound the name)."""
        try:
            if os.stat(self.socket_path).st_ino == self._inode:
                os.unlink(self.socket_path)
        except OSError:
            pass

    # --- serving --------------------------------------------------------------------------
    def run(self) -> int:
        assert self.listener is not None
        next_look = 0.0
        while True:
            if self.retiring and self.relay.running() == 0:
                break
            try:
                ready, _, _ = select.select([self.listener], [], [], TICK)
            except (OSError, ValueError):
                ready = []
            if ready and not self.retiring:
                try:
                    sock, _ = self.listener.accept()
                except OSError:
                    sock = None
                if sock is not None:
                    self._accept(sock)
            now = time.monotonic()
            if now >= next_look:
                next_look = now + 1.0
                self._look()
        self._wind_down()
        return 0

    def _look(self) -> None:
        if self.terminate.is_set():
            self.retire("SIGTERM", cut=True)
            return
        if self.relay.agent_lost.is_set():
            self.retire("the connection to the host was lost", cut=True)
            return
        silent = self.liveness.check()
        if silent is not None and not self.stalled:
            self.stalled = True
            self.retire(
                f"the host stopped answering (no keepalive reply in {silent:.0f}s)", cut=True
            )
            # Closing it ends the reads the requests wait on: each client sees a lost connection.
            self.connection.close()
            return
        verdict = self.freshness.check()
        if verdict.retire:
            self.retire(verdict.why, cut=verdict.cut)
            return
        if verdict.session is not None:
            self.session = replace(verdict.session, keep=True)
        unused = self.relay.running() == 0 and self.relay.attached() == 0
        if unused and not self._socket_is_ours():
            # Nobody can reach it any more (its workspace was deleted, or another holder took
            # the name): exit now rather than hold a connection until the idle limit.
            self.retire("its socket file was removed or replaced")
            return
        idle = time.monotonic() - self.relay.last_active
        if unused and idle > self.session.idle:
            self.retire(f"idle for {idle:.0f}s (idle limit {self.session.idle:g}s)")

    def _accept(self, sock: socket.socket) -> None:
        try:
            pid, uid = wire.peer_cred(sock)
        except OSError as err:
            log.warning("cannot tell who connected (%s): refused", err)
            sock.close()
            return
        if uid != os.getuid():
            log.warning(
                "refused a connection from uid %d, pid %d (this is uid %d's)", uid, pid, os.getuid()
            )
            sock.close()
            return
        threading.Thread(target=self._client, args=(sock, pid), daemon=True).start()

    def _client(self, sock: socket.socket, pid: int) -> None:
        try:
            sock.settimeout(FIRST_FRAME_TIMEOUT)
            got = wire.read_frame(sock.recv)
        except (OSError, ValueError):
            got = None
        if got is None or got[1] != CONTROL or got[0] not in (wire.USE, wire.STATUS, wire.STOP):
            sock.close()
            return
        kind, _, payload = got
        if kind == wire.STOP:
            self.retire(f"stopped by `kerneldev session stop` (pid {pid})", cut=True)
            sock.close()
            return
        if kind == wire.STATUS:
            self._send_hello(sock, self.info())
            sock.close()
            return
        try:
            asked = json.loads(payload.decode("utf-8"))
        except ValueError:
            asked = {}
        if self.relay.agent_lost.is_set():  # not seen by `_look` yet
            self.retire("the connection to the host was lost", cut=True)
        stale = asked.get("key") != self.key or asked.get("code") != self.code
        if stale:
            self.retire(f"pid {pid} runs other kerneldev code or another connection")
        if stale or self.retiring:
            self._send_hello(sock, dict(self.info(), stale=True))
            sock.close()
            return
        sock.settimeout(None)
        try:
            self.relay.refresh()
        except Exception as err:  # noqa: BLE001 - a KerneldevError, or paramiko's
            # The command starts a new holder, with its own environment (a fresh ssh-agent
            # socket, say): it fails, or not, exactly as a one-shot connection would now.
            self._refresh_failed(err)
            self._send_hello(sock, dict(self.info(), stale=True))
            sock.close()
            return
        client = Client(sock, pid)
        self.served += 1  # counted, not logged: a command leaves no trace in the workspace
        self.relay.greet(client, self.info())
        self.relay.serve(client, lambda: self.retire(f"stopped by pid {pid}", cut=True))

    def _send_hello(self, sock: socket.socket, session: dict) -> None:
        hello = dict(self.relay.agent.hello, session=session)
        try:
            sock.sendall(wire.MAGIC + wire.frame(HELLO, CONTROL, json.dumps(hello).encode()))
        except OSError:
            pass

    def info(self) -> dict:
        """What `session list` shows, as sent in every HELLO."""
        now = time.monotonic()
        running = self.relay.running()
        return {
            "pid": os.getpid(),
            "host": self.host.name,
            "address": self.freshness.target.address,
            "key": self.key,
            "code": self.code,
            "socket": str(self.socket_path),
            "started": self.started,
            "connection_age": round(now - self.relay.agent.started, 3),
            "idle": 0.0 if running else round(now - self.relay.last_active, 3),
            "idle_limit": self.session.idle,
            "max_age": self.session.max_age,
            "clients": self.relay.attached(),
            "served": self.served,
            "running": running,
            "retiring": self.retiring,
        }

    # --- ending ---------------------------------------------------------------------------
    def retire(self, why: str, cut: bool = False) -> None:
        """Take no new clients (the socket goes at once); with `cut`, drop the connected
        ones too. The holder exits once no request runs."""
        with self._retire_lock:
            first = self.retiring is None
            if first:
                self.retiring = why
                log.info("retiring: %s", why)
                self._unlink_socket()
        if cut:
            self.relay.drop_all()

    def _wind_down(self) -> None:
        self.relay.drop_all()
        self.relay.agent.close()
        self.connection.close()
        if self.listener is not None:
            self.listener.close()
        self._unlink_socket()
        try:
            # A command waiting on it then starts a holder that may race another one: the
            # loser finds the winner's socket (`Taken`) or is left without one and idles out.
            self.socket_path.with_suffix(".lock").unlink()
        except OSError:
            pass
        log.info("exited")


def _report(fd: int, data: dict) -> None:
    try:
        os.write(fd, (json.dumps(data) + "\n").encode("utf-8"))
        os.close(fd)
    except OSError:
        pass  # the starter gave up waiting (Ctrl-C): the holder serves the next command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kerneldev-session-holder")
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("host", help="the host's name (for ps; the spec comes on stdin)")
    args = parser.parse_args(argv)
    spec = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    # Detach: the starter waits only for this first process; the holder is its child.
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for name in ("SIGINT", "SIGHUP", "SIGPIPE"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s holder {os.getpid()} {args.host}: %(message)s",
    )
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    holder = Holder(spec)
    try:
        holder.start()
    except Taken:
        log.info("another holder listens on %s already", holder.socket_path)
        _report(args.ready_fd, {"ok": True, "other": True})
        return 0
    except NoAgent as err:
        log.info("no host agent (%s): commands connect one-shot", err)
        _report(args.ready_fd, {"failed": f"no host agent: {err}"})
        return 1
    except KerneldevError as err:
        log.info("cannot connect: %s", err.message)
        _report(args.ready_fd, {"error": wire.error_json(err)})
        return int(err.exit_code)
    except Exception as err:  # noqa: BLE001 - the starter then connects one-shot
        log.exception("the holder failed to start")
        _report(args.ready_fd, {"failed": f"{type(err).__name__}: {err}"})
        return 1
    signal.signal(signal.SIGTERM, lambda *_: holder.terminate.set())
    _report(args.ready_fd, {"ok": True, "pid": os.getpid()})
    return holder.run()


if __name__ == "__main__":
    sys.exit(main())
