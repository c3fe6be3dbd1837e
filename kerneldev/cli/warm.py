"""The warm process: the CLI imported once, a fork of it per loop command (`warm_client.py`).

One per user, started detached by the first command that used a kept session, on a 0600 unix
socket in the holders' private 0700 folder; a client of another uid is refused (SO_PEERCRED).
It is single-threaded and only forks: each command runs in a child that takes the client's
cwd, umask, environment and file descriptors, rebuilds sys.stdin/stdout/stderr as a fresh
interpreter would, restores default signal handling and runs the console script's `run()`;
its exit status goes back to the client. A client with another code stamp (kerneldev's files
changed, another interpreter or start environment) is refused and the warm process exits, so
old code never runs. It exits when idle for `IDLE` seconds (a kept session's default idle).
Its stderr is its log (`warm-<id>.log` next to its socket, opened by the starter): start,
refusals, its own failures and why it exited; nothing per command.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import importlib
import io
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

from kerneldev.cli import warm_client
from kerneldev.config import SessionConfig
from kerneldev.hosts.transport.session import identity, location, wire

IDLE = SessionConfig().idle
TICK = 1.0  # seconds between looks at idleness
REQUEST_TIMEOUT = 5.0  # seconds for a client's request once it connected
MAX_REQUEST = 4 << 20  # bytes
# What a loop command imports on its way: imported here once, so no child imports it again.
WARM_MODULES = (
    "kerneldev.cli.entry",  # the child runs the command through it
    "kerneldev.cli.main",
    "kerneldev.cli.commands.loop",
    "typer._click.decorators",  # imported by the first command typer builds
    "kerneldev.hosts.transport.session.client",
    "kerneldev.hosts.transport.over_agent",
    "rich.console",
    "rich.table",
    # A one-shot command (`--no-keep`) connects itself: over the system's ssh where it can
    # (one_shot), else paramiko and its cryptography, ~0.5 s of imports, done here once
    # (importing starts no thread, so forking stays safe).
    "kerneldev.hosts.transport.one_shot",
    "kerneldev.hosts.transport.ssh",
)


class Refused(Exception):
    """A request this warm process does not serve."""


class Job:
    def __init__(self, pid: int, conn: socket.socket, go: int) -> None:
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self.conn: socket.socket | None = conn  # None once the client went away
        self.go = go  # write end of the pipe the child waits on; -1 once it may run


class Warm:
    def __init__(self, path: str, stamp: str) -> None:
        self.path = path
        self.stamp = stamp
        self.jobs: list[Job] = []
        self.served = 0  # commands run
        self.last_active = time.monotonic()
        self.stop = False
        # A fresh interpreter's choice of stdio encodings, from the start environment the
        # stamp pins (this process's own streams are /dev/null and its log).
        self.stdio = {
            name: (getattr(sys, f"__{name}__").encoding, getattr(sys, f"__{name}__").errors)
            for name in ("stdin", "stdout", "stderr")
        }

    def bind(self) -> socket.socket:
        location.private_folder(Path(os.path.dirname(self.path)))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            probe = warm_client.private(os.path.dirname(self.path))
            if not probe:
                raise OSError("the warm process's folder is not private")
            with contextlib.suppress(FileNotFoundError):
                if warm_client.listening(self.path):
                    raise FileExistsError(self.path)
                os.unlink(self.path)  # a stale socket
            sock.bind(self.path)
        finally:
            os.umask(old)
        sock.listen(16)
        self.inode = os.stat(self.path).st_ino
        return sock

    def serve(self, listener: socket.socket) -> None:
        """Serve until told to stop, idle or replaced; then take no new command but see the
        running ones to their end (their exit status comes from here)."""
        open_for_more = True
        while open_for_more or self.jobs:
            conns = [j.conn for j in self.jobs if j.conn is not None]
            watched = [*conns, *(j.pidfd for j in self.jobs)]
            if open_for_more:
                watched.append(listener)
            ready, _, _ = select.select(watched, [], [], TICK)
            for item in ready:
                if item is listener:
                    self.accept(listener)
                else:
                    self.event(item)
            idle = not self.jobs and time.monotonic() - self.last_active > IDLE
            if open_for_more and (self.stop or idle or not self._still_ours()):
                why = "stopped" if self.stop else "idle" if idle else "its socket was replaced"
                log(f"taking no more commands: {why}")
                open_for_more = False
                self.unlink()
                listener.close()

    def accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        self.last_active = time.monotonic()
        fds: list[int] = []
        try:
            _pid, uid = wire.peer_cred(conn)
            if uid != os.getuid():
                conn.close()  # another user: not a word (the holders do the same)
                log(f"refused a connection of uid {uid}")
                return
            conn.settimeout(REQUEST_TIMEOUT)
            request, fds = _read_request(conn)
            if request.get("status"):  # a look (tests, benchmarks): nothing is run
                answer = {"pid": os.getpid(), "served": self.served, "running": len(self.jobs)}
                conn.sendall(json.dumps(answer).encode() + b"\n")
                conn.close()
                return
            if request.get("stamp") != self.stamp:
                self.stop = True  # other code or another interpreter: a fresh one is started
                raise Refused("another code stamp (kerneldev's files or the interpreter changed)")
            if len(fds) != 3:
                raise Refused("no standard streams")
            if not _well_formed(request):
                raise Refused("a malformed request")
            self.start(conn, request, fds)
        except (Refused, OSError, ValueError) as err:
            log(f"refused a command: {type(err).__name__}: {err}")
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"refused": str(err)}).encode() + b"\n")
            conn.close()
        finally:
            for fd in fds:
                os.close(fd)

    def start(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        go_read, go_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.close(go_write)
                for job in self.jobs:  # the other commands' ends are not this one's
                    if job.conn is not None:
                        job.conn.close()
                    os.close(job.pidfd)
                    if job.go >= 0:
                        os.close(job.go)
                conn.close()
                self.listener_close()
                if os.read(go_read, 1) != b"g":
                    os._exit(0)  # the client gave up before the command started
                os.close(go_read)
                code = self.child(request, fds)
            except BaseException:  # noqa: BLE001 - a bug of the fast path: say so, exit 1
                import traceback

                with contextlib.suppress(Exception):
                    traceback.print_exc()
                    sys.stderr.flush()
            finally:
                os._exit(code)
        os.close(go_read)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # as the child does: a Ctrl-C forwarded at once finds the group
        conn.settimeout(None)
        self.jobs.append(Job(pid, conn, go_write))
        self.served += 1
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def listener_close(self) -> None:
        if self._listener is not None:
            self._listener.close()

    def event(self, item) -> None:
        for job in list(self.jobs):
            if job.conn is not None and item is job.conn:
                data = b""
                with contextlib.suppress(OSError):
                    data = job.conn.recv(16)
                if data.startswith(b"g") and job.go >= 0:
                    os.write(job.go, b"g")
                    os.close(job.go)
                    job.go = -1
                elif not data:  # the client went away (killed): end the command as a TERM would
                    started = job.go < 0
                    if not started:
                        os.close(job.go)  # the child sees EOF and exits without running
                        job.go = -1
                    else:
                        with contextlib.suppress(OSError):
                            os.killpg(job.pid, signal.SIGTERM)
                    job.conn.close()
                    job.conn = None  # reaped when its pidfd says it ended
            elif item == job.pidfd:
                _, status = os.waitpid(job.pid, 0)
                code = os.waitstatus_to_exitcode(status)
                self._finish(job, 128 - code if code < 0 else code)

    def _finish(self, job: Job, code: int) -> None:
        if job.conn is not None:
            with contextlib.suppress(OSError):
                job.conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
            job.conn.close()
        os.close(job.pidfd)
        if job.go >= 0:
            os.close(job.go)
        self.jobs.remove(job)
        self.last_active = time.monotonic()

    def child(self, request: dict, fds: list[int]) -> int:
        """Become the client's command: its streams, cwd, environment, argv; run it."""
        os.setpgid(0, 0)  # its own group, which the client's Ctrl-C is forwarded to
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        for name in ("SIGTERM", "SIGHUP", "SIGCHLD"):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it up
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()  # the client's TZ for local times, as its own interpreter would have
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        sys.argv = list(request["argv"])
        self._streams()
        from kerneldev.cli import entry

        warm_client.IN_WARM = True  # the command itself, not another hand-over
        try:
            entry.run()
            code = 0
        except SystemExit as done:
            code = _exit_code(done.code)
        with contextlib.suppress(Exception):
            import threading

            threading._shutdown()  # as at interpreter exit: non-daemon threads are waited for
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        return code

    def _streams(self) -> None:
        """sys.stdin/stdout/stderr for fds 0/1/2 as CPython's create_stdio makes them."""
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))  # -u is not in sys.flags
        for fd, name in enumerate(("stdin", "stdout", "stderr")):
            encoding, errors = self.stdio[name]
            tty = os.isatty(fd)
            raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
            if unbuffered and fd:
                buffer = raw
            else:
                buffer = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
            line = not unbuffered and (tty or fd == 2)
            stream = io.TextIOWrapper(
                buffer,
                encoding=encoding,
                errors=errors,
                newline="\n",
                line_buffering=line and fd != 0,
                write_through=unbuffered and fd != 0,
            )
            stream.mode = "r" if fd == 0 else "w"
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)

    def _still_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def unlink(self) -> None:
        if self._still_ours():
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    _listener: socket.socket | None = None


def log(message: str) -> None:
    """A line of the warm process's log (its stderr); never in a command's child."""
    if warm_client.IN_WARM:
        return
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} warm {os.getpid()}: {message}\n"
    with contextlib.suppress(OSError):
        os.write(2, line.encode("utf-8", "backslashreplace"))


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data, ancillary, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    received = list(fds)
    try:
        while len(data) < warm_client.LENGTH.size:
            chunk = conn.recv(65536)
            if not chunk:
                raise ValueError("short request")
            data += chunk
        (size,) = warm_client.LENGTH.unpack_from(data)
        if size > MAX_REQUEST:
            raise ValueError("request too big")
        data = data[warm_client.LENGTH.size :]
        while len(data) < size:
            chunk = conn.recv(65536)
            if not chunk:
                raise ValueError("short request")
            data += chunk
        return json.loads(data[:size]), received
    except BaseException:
        for fd in received:
            os.close(fd)
        raise


def _well_formed(request: dict) -> bool:
    argv, env = request.get("argv"), request.get("env")
    return (
        isinstance(argv, list)
        and all(isinstance(a, str) for a in argv)
        and isinstance(request.get("cwd"), str)
        and isinstance(request.get("umask"), int)
        and isinstance(env, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    )


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)
    sys.stderr.write(f"{code}\n")
    return 1


def prepare_command() -> None:
    """Build the loop commands' click command once, as `main` would for each (typer rebuilds
    it from the signatures on every call), and each option's coercion with it: typer imports
    pydantic and builds a TypeAdapter per option lazily, at parse time, ~0.3 s of every
    forked command here otherwise. The children inherit both; nothing of a command runs."""
    import typer.main

    from kerneldev.cli import coercion
    from kerneldev.cli import main as cli_main

    cli_main._register_commands([warm_client.COMMANDS[0]])
    command = typer.main.get_command(cli_main.app)
    groups = [command]
    while groups:
        group = groups.pop()
        for param in group.params:
            coercion.build_all(param)
        groups.extend(getattr(group, "commands", {}).values())
    cli_main.prepared_command = command


def main() -> int:
    spec = json.loads(sys.stdin.buffer.read())
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    started = time.monotonic()
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - the command imports it itself, and says why
            log(f"cannot import {name} ahead: {type(err).__name__}: {err}")
    try:
        prepare_command()
    except Exception as err:  # noqa: BLE001 - each command then builds its own, as without us
        log(f"cannot prepare the click command: {type(err).__name__}: {err}")
    warm = Warm(spec["path"], spec["stamp"])
    try:
        identity.remember_code_stamp()  # before the check below: what it read is checked too
    except Exception as err:  # noqa: BLE001 - each command then reads the sources itself
        log(f"cannot read the session code stamp: {type(err).__name__}: {err}")
    # kerneldev's files as they are now: changed since the starter looked, it serves nobody.
    if json.loads(spec["stamp"])[3] != warm_client.package_stamp():
        log("kerneldev's files changed while it started: exiting")
        return 0
    try:
        listener = warm.bind()
    except OSError as err:
        log(f"not listening: {type(err).__name__}: {err}")  # another one listens, or no folder
        return 0
    warm._listener = listener
    took = time.monotonic() - started
    log(f"listening on {spec['path']} ({sys.executable}, ready in {took:.2f}s)")
    signal.signal(signal.SIGTERM, lambda *_: setattr(warm, "stop", True))
    try:
        warm.serve(listener)
    except Exception:
        import traceback

        log("failed:\n" + traceback.format_exc().rstrip())
        raise
    finally:
        listener.close()
    log(f"exited after {warm.served} commands")
    return 0


if __name__ == "__main__":
    sys.exit(main())
