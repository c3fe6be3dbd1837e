"""The console script's fast path: hand a loop command to the warm process, standard library only.

Starting Python and importing the CLI (typer, pydantic, the command modules) costs most of a
kept no-op `pull`/`diff`/`push`. The warm process (`warm.py`, one per user) has all that
imported already; this side sends it the command's argv, cwd, umask, environment and its
stdin/stdout/stderr file descriptors (SCM_RIGHTS), forwards Ctrl-C / SIGTERM / SIGHUP to the
command's process group and exits with its exit status. Anything that goes wrong before the
command started (no warm process, another code stamp, a protocol error) returns None: the
caller then runs the command in this process, as without the fast path. Kept or one-shot
(`--no-keep`: the warm process has paramiko imported too); never with $KERNELDEV_NO_KEEP or
$KERNELDEV_WARM=0 set; Linux only (pidfd, SO_PEERCRED).
"""

from __future__ import annotations

import _socket as socket  # the C module: `socket`'s enum wrappers cost ~10 ms to import
import json
import os
import signal
import stat
import struct
import sys

from kerneldev import process_state

WARM_ENV = "KERNELDEV_WARM"  # "0": never the fast path
NO_KEEP_ENV = "KERNELDEV_NO_KEEP"  # session.client.NO_KEEP_ENV, without importing it
RUNTIME_ENV = "XDG_RUNTIME_DIR"
COMMANDS = ("pull", "diff", "push", "rollback", "log")  # cli.main._LOOP_COMMANDS
WARM_MODULE = "kerneldev.cli.warm"  # the warm process, started as its own interpreter
LENGTH = struct.Struct(">I")
ANSWER_TIMEOUT = 10.0  # seconds for the warm process's first answer (it only forks)
# The environment a Python process decides its start with (paths, flags, stdio encodings):
# the warm process serves only commands whose values equal those it was started with.
START_ENV_PREFIXES = ("PYTHON", "LC_", "LANG")
IN_WARM = False  # True in the warm process's children: they run the command themselves


def wanted(argv: list[str]) -> bool:
    """Whether this command may take the fast path (a loop command, no help, no completion)."""
    if IN_WARM or os.environ.get(WARM_ENV, "").strip() == "0":
        return False
    if os.environ.get(NO_KEEP_ENV, "").strip() not in ("", "0"):
        return False
    if not hasattr(os, "pidfd_open") or not hasattr(socket, "SO_PEERCRED"):
        return False
    if any(k.startswith("_KERNELDEV_COMPLETE") for k in os.environ):
        return False
    before = argv[: argv.index("--")] if "--" in argv else argv
    if "--help" in before or "-h" in before:
        return False
    return command_of(before) in COMMANDS


def command_of(argv: list[str]) -> str | None:
    """The subcommand after leading `--config PATH` / `--host NAME` (cli.main hoists them)."""
    i = 0
    while i < len(argv):
        if argv[i] in ("--config", "--host"):
            i += 2
        elif argv[i].startswith(("--config=", "--host=")):
            i += 1
        else:
            return None if argv[i].startswith("-") else argv[i]
    return None


def socket_folder() -> str | None:
    """The warm process's folder: $XDG_RUNTIME_DIR/kerneldev when that is ours, else
    /tmp/kerneldev-<uid> (the holders' folders, location.py)."""
    runtime = os.environ.get(RUNTIME_ENV)
    if runtime and os.path.isabs(runtime):
        try:
            st = os.stat(runtime)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                return os.path.join(runtime, "kerneldev")
        except OSError:
            pass
    return f"/tmp/kerneldev-{os.getuid()}"


def socket_path() -> str | None:
    """One warm process per kerneldev package and interpreter (several checkouts, one user)."""
    import zlib

    import kerneldev

    folder = socket_folder()
    if not folder:
        return None
    which = f"{sys.executable}\0{os.path.abspath(kerneldev.__file__)}".encode("utf-8", "replace")
    return os.path.join(folder, f"warm-{zlib.crc32(which):08x}.sock")


def log_path(sock_path: str) -> str:
    """The warm process's log, next to its socket: `warm-<id>.log`."""
    return (
        sock_path[: -len(".sock")] + ".log" if sock_path.endswith(".sock") else sock_path + ".log"
    )


def private(folder: str) -> bool:
    """A real folder of this user that nobody else may enter."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def package_stamp() -> list:
    """Where kerneldev is, how many .py files it has and a checksum of their names, sizes
    and mtimes: any edited, added or removed file (an editable install) gives another stamp."""
    import zlib

    import kerneldev

    root = os.path.dirname(os.path.abspath(kerneldev.__file__))
    count, digest = 0, 0
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(entry.path)
                elif entry.name.endswith(".py"):
                    st = entry.stat()
                    count += 1
                    line = f"{entry.path}\0{st.st_size}\0{st.st_mtime_ns}\n"
                    digest = zlib.crc32(line.encode("utf-8", "surrogateescape"), digest)
    return [root, count, digest]


def stamp() -> str:
    """This interpreter, its start environment and kerneldev's files, as text."""
    start_env = sorted((k, v) for k, v in os.environ.items() if k.startswith(START_ENV_PREFIXES))
    ident = [sys.executable, sys.version, repr(sys.flags), package_stamp(), start_env]
    return json.dumps(ident, ensure_ascii=True)


def run(argv: list[str]) -> int | None:
    """Run `kerneldev argv` in the warm process: its exit status, or None when it could not
    be handed over (nothing was run)."""
    path = socket_path()
    if path is None or not private(os.path.dirname(path)):
        return None
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            return None  # a closed standard stream: the normal path decides what that means
    mask = os.umask(0)
    os.umask(mask)
    try:
        cwd = os.getcwd()
    except OSError:
        return None  # a removed folder: the normal path says what that means
    request = {
        "stamp": stamp(),
        "argv": [sys.argv[0], *argv],
        "cwd": cwd,
        "umask": mask,
        "env": dict(os.environ),
    }
    body = json.dumps(request, ensure_ascii=True).encode("ascii")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(ANSWER_TIMEOUT)
        sock.connect(path)
        warm_pid, uid, _gid = struct.unpack(
            "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        )
        if uid != os.getuid() or process_state.stopped(warm_pid):
            return None  # not ours, or stopped: it would not answer (the command runs here)
        data = LENGTH.pack(len(body)) + body
        fds = struct.pack("3i", 0, 1, 2)
        sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        sock.sendall(data[sent:])
        answers = _Lines(sock)
        first = answers.next()
        if first is None or "pid" not in first:
            return None  # refused (another stamp, sessions off) or gone: nothing ran
        pid = int(first["pid"])
        _forward_signals(pid)
        sock.sendall(b"g")  # go: from here the command runs, and its result is ours
    except (OSError, ValueError):
        sock.close()
        return None
    return _wait(sock, answers)


def _forward_signals(pid: int) -> None:
    """Ctrl-C, SIGTERM and SIGHUP of this process go to the command's process group."""

    def forward(signum, _frame):
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), forward)


def _wait(sock: socket.socket, answers: _Lines) -> int:
    sock.settimeout(None)
    while True:
        try:
            answer = answers.next()
        except InterruptedError:
            continue
        except (OSError, ValueError):
            answer = None
        if answer is None:
            sys.stderr.write("kerneldev: error: the warm process went away during the command\n")
            return 1
        if "exit" in answer:
            return int(answer["exit"])


class _Lines:
    """JSON answers, one a line."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def next(self) -> dict | None:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


def look(path: str, timeout: float = 5.0) -> dict | None:
    """The warm process at `path`: its pid, commands served and running; None when none."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        body = json.dumps({"status": True}).encode()
        sock.sendall(LENGTH.pack(len(body)) + body)
        return _Lines(sock).next()
    except (OSError, ValueError):
        return None
    finally:
        sock.close()


def listening(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def start_after(argv: list[str]) -> None:
    """After a command ran in its own process: when it used a kept session, or reached an SSH
    host one-shot (`--no-keep`, `session: {keep: false}`), start the warm process for the next
    one (if none listens). Never with $KERNELDEV_NO_KEEP set (`wanted`): no background process
    at all then."""
    if not wanted(argv):
        return
    session = sys.modules.get("kerneldev.hosts.transport.session.client")
    kept = session is not None and getattr(session, "attached", False)
    # The SSH transport is imported only to connect to a host without a session.
    if not kept and "kerneldev.hosts.transport.ssh" not in sys.modules:
        return
    try:
        start(stamp())
    except Exception:  # noqa: BLE001, S110 - only a later command's speed depends on it
        pass


def start(code: str) -> None:
    """Start a warm process for the stamp `code` in the background, when none listens."""
    import subprocess

    import kerneldev

    path = socket_path()
    if path is None or listening(path):
        return
    log = _open_log(path)
    if log is None:
        return  # no private folder: nowhere to put its socket either
    env = dict(os.environ)
    # The warm process imports this very kerneldev, wherever it was imported from.
    package_root = os.path.dirname(os.path.dirname(os.path.realpath(kerneldev.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", WARM_MODULE],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=log,
            start_new_session=True,
            cwd="/",
            env=env,
        )
        assert process.stdin is not None
        process.stdin.write(json.dumps({"stamp": code, "path": path}).encode())
        process.stdin.close()  # not waited for: its imports take a while, the command is done
    except OSError:
        pass
    finally:
        os.close(log)


LOG_LIMIT = 1 << 20  # bytes: a warm process started on a longer log starts it afresh


def _open_log(sock_path: str) -> int | None:
    """The log's descriptor, appending (0600, in the socket's private folder, never through a
    symlink); None when that folder cannot be made private."""
    from pathlib import Path

    from kerneldev.hosts.transport.session import location

    try:
        location.private_folder(Path(os.path.dirname(sock_path)))
    except location.PlaceError:
        return None
    path = log_path(sock_path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        if os.lstat(path).st_size > LOG_LIMIT:
            flags |= os.O_TRUNC
    except OSError:
        pass
    try:
        return os.open(path, flags, 0o600)
    except OSError:
        return None
