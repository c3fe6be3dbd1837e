"""Starting the sandbox's decode service without paying for torch's import at every restart.

The sandbox's restart.sh runs `python -m kerneldev.sandbox.service.launcher --dir SERVICE_DIR
-- ARGS...` where it used to run `python -m kerneldev.sandbox.service ARGS...`. That process
(the *client*) is the service as restart.sh sees it: its pid goes in service.pid, SIGTERM stops
the service, and it exits when the service does. It asks a *launcher* to start the service:

    launcher   a resident process per distinct environment (the restart's environment after
               the env file, minus per-connection variables such as SSH_CLIENT), started by
               the first client that needs it, in that environment. It imports torch, triton
               (under the interpreter: TRITON_INTERPRET=1 before triton's import, as `app.main`
               sets it) and the service's HTTP stack once, then for each client forks a fresh
               worker; it exits after IDLE_S without a request or when its socket is removed
               (the sandbox folder is gone).
    worker     takes the client's stdin/stdout/stderr (the service log), its environment and
               folder, and runs `app.main(ARGS)`: the env file's switches are read, the kernel
               file is imported from the live tree and the engine is built there, after the
               fork, exactly as in a fresh `python -m kerneldev.sandbox.service`.

Why this is faithful: a restart still starts a new process (new pid, new port listener) that
reads what was pushed: the live kernel file is never imported by the launcher, only by each
worker, and `SGLANG_SM120_MMA_FLASHMLA` is read at that import. The launcher is chosen by the
whole environment, so a switch changes launcher, and a worker's /proc/<pid>/environ (what
`kernels status` reads of the running server) is its variant's environment. A switch that
torch or triton read at their import is covered by the same rule (another environment, another
launcher, a fresh import). Only the CPU case with the engine is served: on a CUDA machine, with
`--device cuda`, in scripted-stream mode (no torch to share) or with KERNELDEV_SANDBOX_LAUNCHER=0
the client execs `python -m kerneldev.sandbox.service` itself (same pid, as before), and so it
does when no launcher can be reached.

Protocol (a Unix socket `<SERVICE_DIR>/launch/<key>.sock`): the client sends one JSON line
{"argv", "env", "cwd"} with its fds 0, 1, 2 attached (SCM_RIGHTS); the answer is one JSON line
{"pid": worker} or {"error": why}. The connection stays open while both live: the worker
stops itself when the client goes away (even by SIGKILL), the client exits when the worker has.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from kerneldev.sandbox.service.scripted import SPEC_ENV

DISABLE_ENV = "KERNELDEV_SANDBOX_LAUNCHER"  # 0: every start is a fresh exec
IDLE_S = 900.0  # a launcher with no request for this long exits (an A/B waits minutes)
READY_WAIT_S = 600.0  # how long a client waits for a launcher it started to listen
ACCEPT_POLL_S = 2.0
STOP_GRACE_S = 3.0  # a worker whose client is gone: SIGTERM, then exit after this
KILL_AFTER_S = 4.0  # a client told to stop: SIGTERM to its worker, SIGKILL after this
# Set per SSH connection, by the shell per command or by pytest per test phase: not part of
# what the service runs on (the worker still gets their values in os.environ).
VOLATILE = frozenset(
    {"SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "_", "SHLVL", "OLDPWD", "PYTEST_CURRENT_TEST"}
)
NOT_SERVED = 3  # the launcher's exit status when it cannot serve this machine (CUDA)
OFF_NAME = "off"  # in the launch folder: this machine is not served (every start is a fresh exec)
SUN_PATH_MAX = 108  # bytes of a Unix socket's path on Linux, with its terminating NUL


def env_key(env: dict[str, str]) -> str:
    """The launcher for this environment, this Python and this version of the service's own
    code (an edited app.py gets a new launcher, as it would get a fresh import)."""
    items = sorted((k, v) for k, v in env.items() if k not in VOLATILE)
    blob = json.dumps([sys.executable, items, _code_stamp()]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _code_stamp() -> list:
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, n) for n in sorted(os.listdir(here)) if n.endswith(".py")]
    try:
        import importlib.util

        spec = importlib.util.find_spec("kerneldev.kernels.dsv4_reference")
        if spec is not None and spec.origin:
            paths.append(spec.origin)
    except ImportError:
        pass
    stamp = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        stamp.append([path, st.st_size, st.st_mtime_ns])
    return stamp


def _direct(argv: list[str]) -> None:
    """A fresh service in this process (no launcher)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "kerneldev.sandbox.service", *argv])


def _not_for_a_launcher(argv: list[str]) -> bool:
    """CUDA (no fork after it), or scripted streams (no torch: a fresh start costs less than
    a launcher's imports)."""
    cuda = any(a == "--device=cuda" for a in argv) or any(
        a == "--device" and b == "cuda" for a, b in zip(argv, argv[1:], strict=False)
    )
    scripted = SPEC_ENV in os.environ or any(a.startswith("--scripted-stream") for a in argv)
    return cuda or scripted


# --- the client ---------------------------------------------------------------------------


def _connect(path: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None
    return conn


def _launcher_conn(folder: str, key: str) -> socket.socket | None:
    """A connection to this environment's launcher, started here when none listens; None when
    it cannot serve (CUDA) or does not come up."""
    os.makedirs(folder, exist_ok=True)
    sock_path = os.path.join(folder, f"{key}.sock")
    if len(os.fsencode(sock_path)) >= SUN_PATH_MAX:
        return None  # too long for a Unix socket's address (a deep sandbox folder)
    with open(os.path.join(folder, f"{key}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per key; the others wait, then connect
        conn = _connect(sock_path)
        if conn is not None:
            return conn
        if os.path.exists(os.path.join(folder, OFF_NAME)):
            return None  # a launcher found this machine unfit before (CUDA)
        try:
            os.unlink(sock_path)  # a dead launcher's
        except FileNotFoundError:
            pass
        with open(os.path.join(folder, f"{key}.log"), "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kerneldev.sandbox.service.launcher", "--serve", sock_path],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # it outlives this client and this restart
            )
        deadline = time.monotonic() + READY_WAIT_S
        while time.monotonic() < deadline:
            conn = _connect(sock_path)
            if conn is not None:
                return conn
            if proc.poll() is not None:
                return None
            time.sleep(0.05)
        return None


def client(folder: str, argv: list[str]) -> int:
    if os.environ.get(DISABLE_ENV, "1") == "0" or _not_for_a_launcher(argv):
        _direct(argv)
    conn = _launcher_conn(os.path.join(folder, "launch"), env_key(dict(os.environ)))
    if conn is None:
        _direct(argv)
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    reply = conn.makefile("rb").readline()
    try:
        pid = int(json.loads(reply)["pid"])
    except (ValueError, KeyError, TypeError):
        conn.close()
        _direct(argv)  # the launcher could not start it: a fresh exec says why, in the log

    def stop(signum, _frame):
        _signal(pid, signal.SIGTERM)
        # Hard, before restart.sh's own SIGKILL of this process at 5 s, so that the port is
        # free when it starts the next service (as its SIGKILL freed it before the launcher).
        hard = threading.Timer(KILL_AFTER_S, _signal, (pid, signal.SIGKILL))
        hard.daemon = True  # this process exits as soon as the worker has
        hard.start()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    while True:  # EOF: the worker is gone
        try:
            if not conn.recv(64):
                return 0
        except InterruptedError:
            continue


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# --- the launcher -------------------------------------------------------------------------


def _preload() -> None:
    import torch

    if torch.cuda.is_available():
        raise SystemExit(NOT_SERVED)  # a CUDA context must not cross a fork: fresh execs there
    os.environ["TRITON_INTERPRET"] = "1"  # before triton's import, as app.main does on CPU
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.")
    import triton  # noqa: F401
    import uvicorn  # noqa: F401

    import kerneldev.kernels.dsv4_reference  # noqa: F401
    import kerneldev.sandbox.service.app  # noqa: F401  (fastapi)


def serve(sock_path: str) -> int:
    folder = os.path.dirname(sock_path)
    stem = sock_path[: -len(".sock")]
    with open(stem + ".pid", "w") as f:  # first: `stop_launchers` may come during the imports
        f.write(f"{os.getpid()}\n")
    try:
        _preload()
    except SystemExit as exit_:
        if exit_.code == NOT_SERVED:
            with open(os.path.join(folder, OFF_NAME), "w") as f:
                f.write("CUDA is available: every start is a fresh exec\n")
        raise
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(8)
    listener.settimeout(ACCEPT_POLL_S)
    ino = os.stat(sock_path).st_ino
    last = time.monotonic()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            try:
                gone = os.stat(sock_path).st_ino != ino
            except FileNotFoundError:
                gone = True
            if gone or time.monotonic() - last > IDLE_S or not os.path.isdir(folder):
                return 0
            continue
        last = time.monotonic()
        conn.settimeout(30)
        try:
            _spawn(listener, conn)
        except Exception as err:  # noqa: BLE001 - answer the client; keep serving others
            try:
                conn.sendall(json.dumps({"error": f"{type(err).__name__}: {err}"}).encode() + b"\n")
            except OSError:
                pass
        finally:
            conn.close()


def _spawn(listener: socket.socket, conn: socket.socket) -> None:
    msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
    try:
        while not msg.endswith(b"\n"):
            more = conn.recv(1 << 20)
            if not more:
                raise ValueError("the request broke off")
            msg += more
        request = json.loads(msg)
        if len(fds) != 3:
            raise ValueError("the request came without stdin, stdout and stderr")
        sys.stdout.flush()
        sys.stderr.flush()
        middle = os.fork()
        if middle == 0:  # detach, then fork the worker and say its pid
            try:
                os.setsid()
                worker = os.fork()
                if worker == 0:
                    _worker(listener, conn, fds, request)  # never returns
                conn.settimeout(None)
                conn.sendall(json.dumps({"pid": worker}).encode() + b"\n")
            finally:
                os._exit(0)
    finally:
        for fd in fds:  # the worker has its copies
            os.close(fd)
    os.waitpid(middle, 0)


def _worker(listener: socket.socket, conn: socket.socket, fds: list[int], request: dict) -> None:
    code = 1
    try:
        listener.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        # A fresh Python's handlers and random state (the launcher's were set before the fork).
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import random

        random.seed()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        conn.settimeout(None)
        threading.Thread(target=_stop_when_client_goes, args=(conn,), daemon=True).start()
        argv = list(request["argv"])
        sys.argv = ["-m kerneldev.sandbox.service", *argv]
        from kerneldev.sandbox.service.app import main

        main(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
        if not isinstance(exit_.code, int | None):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as an uncaught exception would end the process
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code or 0)


def _stop_when_client_goes(conn: socket.socket) -> None:
    """The client is the service for restart.sh: without it, this worker stops."""
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(STOP_GRACE_S)
    os._exit(1)


def stop_launchers(service_dir) -> None:
    """End the launchers of a sandbox's service folder (theirs only: a pid file's process must
    name its socket); the services they started are not touched."""
    folder = os.path.join(str(service_dir), "launch")
    try:
        names = os.listdir(folder)
    except OSError:
        return
    stopped = []
    for name in names:
        if not name.endswith(".pid"):
            continue
        pidfile = os.path.join(folder, name)
        sock = pidfile[: -len(".pid")] + ".sock"
        try:
            with open(pidfile) as f:
                pid = int(f.read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                ours = sock.encode() in f.read()
            if ours:
                os.kill(pid, signal.SIGTERM)
                stopped.append(pid)
        except (OSError, ValueError):
            pass
        for path in (pidfile, sock):
            try:
                os.unlink(path)
            except OSError:
                pass
    deadline = time.monotonic() + 5.0
    while stopped and time.monotonic() < deadline:  # gone, or a zombie (its parent reaps it)
        stopped = [pid for pid in stopped if _alive(pid)]
        if stopped:
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kerneldev.sandbox.service.launcher",
        description="start the sandbox decode service through a resident launcher",
    )
    p.add_argument("--dir", help="the sandbox's service folder (client)")
    p.add_argument("--serve", metavar="SOCKET", help="run the launcher on this socket")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then the service's arguments")
    ns = p.parse_args(argv)
    if ns.serve:
        return serve(ns.serve)
    if not ns.dir:
        p.error("--dir or --serve is required")
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    return client(ns.dir, args)


if __name__ == "__main__":
    sys.exit(main())
