"""Looking at and stopping kept sessions (`kerneldev session list|stop`, `kerneldev status`).

A look asks the holder itself (a STATUS frame: it answers its HELLO and closes), so what is
shown is what runs: nothing is read from files a dead holder may have left behind. A look
starts nothing and leaves the session's idle time alone. A holder whose process is stopped
(SIGSTOP, a debugger) cannot answer: it is shown as `stopped` with its pid (commands pass it by
and connect one-shot), and `stop` continues it (SIGCONT) so that it reads the STOP and ends."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from kerneldev.config import HostConfig
from kerneldev.hosts.transport.agent_client import CONTROL
from kerneldev.hosts.transport.session import client, location, wire
from kerneldev.hosts.transport.session.identity import session_key

LOOK_TIMEOUT = 5.0  # seconds for a holder to answer a look
STOP_WAIT = 5.0  # seconds for a stopped holder to take its socket away


@dataclass(frozen=True)
class SessionStatus:
    """One host's kept session as its holder describes it (`alive` False: none runs)."""

    host: str
    alive: bool
    keep: bool  # the config (and $KERNELDEV_NO_KEEP) let commands keep one
    socket: str | None = None
    log: str | None = None
    pid: int | None = None
    address: str | None = None
    connection_age: float | None = None  # seconds since it (re)connected
    idle: float | None = None  # seconds since the last request ended (0 while one runs)
    idle_limit: float | None = None
    max_age: float | None = None
    clients: int = 0  # connected commands that have run a request
    served: int = 0  # commands that have used it since it started
    running: int = 0  # requests running on the host
    retiring: str | None = None  # why it is ending, once it is
    stopped: bool = False  # its process is stopped: it answers nothing until continued


def status(host: HostConfig, ssh_config: str | Path | None = None) -> SessionStatus:
    """The session of `host` for this user (`alive` False when there is none)."""
    keep = client.keep_wanted(host)
    if host.transport != "ssh":
        return SessionStatus(host.name, False, keep)
    key = session_key(host, ssh_config)
    log = location.log_path(host, key)
    for path in location.candidates(host, key):
        info = _look(path)
        if info is not None and info.get("stopped"):
            return SessionStatus(
                host.name, True, keep, socket=str(path), log=str(log), pid=info["pid"],
                stopped=True,
            )  # fmt: skip
        if info is not None:
            return SessionStatus(
                host=host.name,
                alive=True,
                keep=keep,
                socket=str(path),
                log=str(log),
                pid=info.get("pid"),
                address=info.get("address"),
                connection_age=info.get("connection_age"),
                idle=info.get("idle"),
                idle_limit=info.get("idle_limit"),
                max_age=info.get("max_age"),
                clients=int(info.get("clients") or 0),
                served=int(info.get("served") or 0),
                running=int(info.get("running") or 0),
                retiring=info.get("retiring"),
            )
    return SessionStatus(host.name, False, keep, log=str(log) if log.exists() else None)


def stop(host: HostConfig, ssh_config: str | Path | None = None) -> SessionStatus:
    """End `host`'s session now (its running requests are ended on the host too). Returns
    what it was before (`alive` False: there was none)."""
    before = status(host, ssh_config)
    if not before.alive or before.socket is None:
        return before
    sock = client.connect(Path(before.socket))
    if sock is not None:
        try:
            sock.sendall(wire.frame(wire.STOP, CONTROL))
        except OSError:
            pass
        sock.close()
    if before.stopped and before.pid is not None:
        try:
            os.kill(before.pid, signal.SIGCONT)  # to read the STOP it was sent
        except OSError:
            pass
    deadline = time.monotonic() + STOP_WAIT
    while time.monotonic() < deadline and _look(Path(before.socket)) is not None:
        time.sleep(0.05)
    return before


def _look(path: Path) -> dict | None:
    sock = client.connect(path)
    if sock is None:
        return None
    try:
        sock.sendall(wire.frame(wire.STATUS, CONTROL, json.dumps({}).encode()))
        hello, _ = client.read_hello(sock, LOOK_TIMEOUT)
    except client.HolderStopped as err:
        return {"pid": err.pid, "stopped": True}
    except (OSError, ValueError):
        return None
    finally:
        sock.close()
    session = hello.get("session")
    if not isinstance(session, dict) or session.get("retiring"):
        return None  # on its way out: the next command starts another
    return session
