"""The host agent: one long-lived helper that runs every later remote step of a connection.

Started once per connection over one SSH exec channel (the only login shell paid), it speaks
the framed protocol of /work/coord/agent-protocol.md on its stdin/stdout: each OPEN request
runs `/bin/sh -c command` (or, with `"python": true`, this interpreter with `-S -c source`: no
PATH lookup, no pyenv shim) in its own process group, with its stdin, stdout and stderr
pumped by threads as frames of that request's id; EXIT carries the status. When its stdin
reaches EOF (the connection is gone) it ends every process it still runs (TERM, then KILL
after 2 s) and exits, so a dropped connection leaves nothing behind.

An OPEN may name an earlier request of the same stream (`"after": id`): it then starts only
when that one has exited with status 0 (its stdin frames wait here meanwhile), and is not
started at all (EXIT `{"error": ..., "skipped": true}`) when that one failed, could not start,
was skipped, is unknown, or when a SIGNAL "CANCEL" came for it first. So a client can send
the steps of a pipeline without waiting for each answer, and a failure stops the rest on the
host, in order. CANCEL never touches a request that runs; the connection's end starts
nothing more: its stdin's EOF, or already a write to the client that failed (the client is
gone; the EOF may come later). The chain's steps also check the host lock themselves before
they act (`receivefiles.py`, `copyfiles.py`), since a step may be running when the client
goes.

Frame: a 9-byte header (struct ">IIB": payload length, request id, type) and the payload.
Before the first frame the agent writes MAGIC, so a client can skip whatever a login shell's
rc files printed. Standard library only, Python 3.6 compatible; imports nothing of kerneldev.
"""

import json
import os
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
import warnings

VERSION = "1.1.0"
MAGIC = b"\x00KDAGENT1\n"
HEADER = struct.Struct(">IIB")
MAX_PAYLOAD = 1 << 20
CONTROL = 0

# frame types
HELLO, OPEN, STDIN, SIGNAL, STDOUT, STDERR, EXIT, PING, PONG = range(9)

SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "INT": signal.SIGINT}
CANCEL = "CANCEL"  # a SIGNAL for a request that waits for another: never start it
MAX_STATUSES = 4096  # exit statuses kept for later OPENs' "after" (oldest forgotten first)
END_GRACE = 2.0  # seconds between TERM and KILL when the connection is gone
# Seconds to keep reading a command's output after it exited: a daemon it started may hold
# the pipes open (a restart command), and must not keep the request open (as over ssh).
EXIT_GRACE = 2.0
READ_SIZE = 1 << 16
# Bytes a pipe of the agent may hold (Linux; 64 KiB by default): its stdin and stdout, and a
# request's stdin or stdout once a large transfer goes through it, so that its 1 MiB frames
# pass a pipe in one wake-up of the reader instead of 16 (docs/benchmarks.md, issue 23 round 6).
PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, named there only from Python 3.10
# Python requests run in a fork of the agent (no interpreter start), where that gives what
# `python -S -c` with PYTHONUTF8=1 would: UTF-8 file names. OPEN {"fresh": true} asks for a
# new interpreter anyway.
FORK = hasattr(os, "fork") and sys.getfilesystemencoding().lower().replace("-", "") == "utf8"
MAX_FD = 1 << 16
# The standard modules the hostside scripts import (hashfiles, sendfiles, receivefiles,
# fileops, versions): imported once here, after HELLO, so no forked helper imports them again
# (~15 ms of every hash request measured).
HELPER_MODULES = ("errno", "fnmatch", "glob", "hashlib", "io", "stat", "traceback")


class Output:
    """Frames to the client, one writer at a time (several threads send)."""

    def __init__(self, fd):
        self.fd = fd
        self.lock = threading.Lock()
        self.broken = False

    def send(self, kind, rid, payload=b""):
        frame = HEADER.pack(len(payload), rid, kind) + payload
        with self.lock:
            if self.broken:
                return False
            try:
                view = memoryview(frame)
                while view:
                    view = view[os.write(self.fd, view) :]
            except OSError:
                self.broken = True  # the client is gone; stdin's EOF ends us
                return False
        return True

    def send_json(self, kind, rid, value):
        return self.send(kind, rid, json.dumps(value).encode("utf-8"))


class Request:
    """One OPEN: the process, its stdin feeder and output pumps, and the EXIT when done."""

    def __init__(self, rid, out, on_settled):
        self.rid = rid
        self.out = out
        self.on_settled = on_settled  # called with the status (None: did not run) at the end
        self.followers = []  # requests opened "after" this one, waiting for its status
        self.pid = None  # the process, leader of its own process group
        self.wait = None  # callable: reaps the process, returns its status (negative: signal)
        self.stdin = queue.Queue()  # bytes; None = close stdin
        self.exited = threading.Event()  # the process was reaped (by `finish` alone)
        self.done = threading.Event()  # EXIT sent: output after it is dropped
        self.spec = None  # the OPEN of a request that waits for another ("after")
        self.before = None  # the request it waits for (None once started or refused)

    def start(self, spec):
        command = spec["command"]
        if spec.get("python") and FORK and not spec.get("fresh"):
            streams = self.fork_python(command)
        else:
            streams = self.spawn(command, bool(spec.get("python")))
        stdin, stdout, stderr = streams
        pumps = [_thread(self.pump, stdout, STDOUT), _thread(self.pump, stderr, STDERR)]
        _thread(self.feed, stdin)
        _thread(self.finish, pumps)

    def spawn(self, command, python):
        if python:
            argv = [sys.executable, "-S", "-c", command]
            env = dict(os.environ, PYTHONUTF8="1")
        else:
            argv = ["/bin/sh", "-c", command]
            env = None
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group, for SIGNAL and the clean-up
        )
        self.pid, self.wait = proc.pid, proc.wait
        return proc.stdin, proc.stdout, proc.stderr

    def fork_python(self, source):
        """A hostside script in a fork of this interpreter: no new Python to start (what
        `python -S -c` would cost per request), the same modules, pipes and process group."""
        code = _compiled(source)  # here, once per script: a SyntaxError is the OPEN's error
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                os.setsid()
                for fd, target in ((r_in, 0), (w_out, 1), (w_err, 2)):
                    os.dup2(fd, target)
                # fork copied every descriptor, other requests' pipe ends too: an open write
                # end here would keep their EOF from ever coming.
                os.closerange(3, MAX_FD)
                _run_script(code)
            finally:
                os._exit(70)
        for fd in (r_in, w_out, w_err):
            os.close(fd)
        self.pid = pid
        self.wait = lambda: _status(os.waitpid(pid, 0)[1])
        return os.fdopen(w_in, "wb"), os.fdopen(r_out, "rb"), os.fdopen(r_err, "rb")

    def pump(self, stream, kind):
        fd = stream.fileno()
        big = False
        try:
            while True:
                try:
                    block = os.read(fd, READ_SIZE)
                except OSError:
                    break
                if not block or self.done.is_set():
                    break
                if not big and len(block) == READ_SIZE:  # a bulk output: a larger pipe
                    big = _big_pipe(fd)
                self.out.send(kind, self.rid, block)
        finally:
            stream.close()

    def feed(self, stream):
        big = False
        while True:
            block = self.stdin.get()
            if block is None:
                break
            if not big and len(block) > READ_SIZE:  # a bulk input: a larger pipe
                big = _big_pipe(stream.fileno())
            try:
                stream.write(block)
                stream.flush()
            except OSError:
                # The process closed its input: drop the rest, as a pipe would refuse it.
                while self.stdin.get() is not None:
                    pass
                break
        try:
            stream.close()
        except OSError:
            pass

    def finish(self, pumps):
        status = self.wait()
        self.exited.set()
        until = time.monotonic() + EXIT_GRACE
        for pump in pumps:
            pump.join(max(0.0, until - time.monotonic()))
        self.done.set()
        self.out.send_json(EXIT, self.rid, {"status": status})
        self.on_settled(self, status)

    def signal(self, name):
        if self.pid is None or self.exited.is_set():
            return
        try:
            os.killpg(self.pid, SIGNALS[name])
        except (ProcessLookupError, PermissionError):
            pass


class Agent:
    def __init__(self, inp, out):
        self.inp = inp
        self.out = out
        self.requests = {}
        # requests, statuses, followers, closing; reentrant: a refused request settles its
        # followers under it
        self.lock = threading.RLock()
        self.statuses = {}  # rid -> exit status of a finished request (None: did not run)
        self.closing = False  # the connection is gone: nothing more starts

    def serve(self):
        self.out.send_json(
            HELLO,
            CONTROL,
            {
                "agent": 1,
                "pid": os.getpid(),
                "python": sys.executable,
                "version": VERSION,
                "pipeline": 1,  # OPEN's "after" and SIGNAL "CANCEL" are understood
            },
        )
        # Before the first request is read (it waits in the pipe), never while one runs: a
        # fork taken during an import could leave the child an import lock it cannot take.
        _preload()
        while True:
            head = read_exact(self.inp, HEADER.size)
            if head is None:
                break
            length, rid, kind = HEADER.unpack(head)
            if length > MAX_PAYLOAD:
                break  # not a client of this protocol
            payload = read_exact(self.inp, length) if length else b""
            if payload is None:
                break
            self.handle(kind, rid, payload)

    def handle(self, kind, rid, payload):
        if kind == PING:
            self.out.send(PONG, CONTROL)
            return
        if kind == OPEN:
            self.open(rid, payload)
            return
        with self.lock:
            request = self.requests.get(rid)
        if request is None:
            return  # a request that ended: late input or signals are moot
        if kind == STDIN:
            request.stdin.put(payload if payload else None)
        elif kind == SIGNAL:
            try:
                name = json.loads(payload.decode("utf-8"))["signal"]
            except (ValueError, KeyError, TypeError):
                return
            if name == CANCEL:
                self.cancel(request)
            elif name in SIGNALS:
                request.signal(name)

    def open(self, rid, payload):
        request = Request(rid, self.out, self.settled)
        try:
            spec = json.loads(payload.decode("utf-8"))
            after = spec.get("after")
        except (ValueError, AttributeError) as err:
            self.refuse(request, "cannot start: %s: %s" % (type(err).__name__, err))
            return
        with self.lock:
            self.forget_finished()
            self.requests[rid] = request
            self.statuses.pop(rid, None)  # an id used again: its old status is not this one's
            if after is None:
                self.start(request, spec)
                return
            before = self.requests.get(after)
            if before is not None and before is not request and after not in self.statuses:
                request.spec, request.before = spec, before  # started by `settled`
                before.followers.append(request)
            elif self.statuses.get(after, "unknown") == 0:
                self.start(request, spec)
            else:
                self.refuse(request, "not started: request %s did not succeed" % after, True)

    def start(self, request, spec):
        """Under the lock (so that `end_all` sees every process started)."""
        if self.closing or self.out.broken:
            self.refuse(request, "not started: the connection is gone", True)
            return
        try:
            request.start(spec)
        except (OSError, ValueError, KeyError, TypeError, SyntaxError) as err:
            self.refuse(request, "cannot start: %s: %s" % (type(err).__name__, err))

    def refuse(self, request, why, skipped=False):
        """EXIT with an error for a request that never ran, and settle it (its followers)."""
        request.done.set()
        answer = {"error": why}
        if skipped:
            answer["skipped"] = True
        self.out.send_json(EXIT, request.rid, answer)
        self.settled(request, None)

    def settled(self, request, status):
        """A request ended (status None: it never ran): its followers start when it exited 0,
        else they are skipped, in the order they were opened."""
        with self.lock:
            self.statuses[request.rid] = status
            while len(self.statuses) > MAX_STATUSES:
                del self.statuses[next(iter(self.statuses))]
            followers, request.followers = request.followers, []
            for follower in followers:
                follower.before = None
                if status == 0:
                    self.start(follower, follower.spec)
                else:
                    why = "not started: request %s did not succeed" % request.rid
                    self.refuse(follower, why, True)

    def cancel(self, request):
        """SIGNAL CANCEL: a request still waiting for another is never started; one that runs
        (or ended) is left alone."""
        with self.lock:
            before = request.before
            if before is None or request not in before.followers:
                return
            before.followers.remove(request)
            request.before = None
            self.refuse(request, "not started: cancelled", True)

    def forget_finished(self):
        """Under the lock: drop the requests that ended and were settled (their status is
        kept for a later "after"; one not settled yet is still what a follower waits on)."""
        for rid in [
            r for r, req in self.requests.items() if req.done.is_set() and r in self.statuses
        ]:
            del self.requests[rid]

    def end_all(self):
        """The connection is gone: nothing more starts; every process still running ends
        (TERM, KILL after 2 s)."""
        with self.lock:
            self.closing = True
            requests = list(self.requests.values())
        running = [r for r in requests if r.pid and not r.exited.is_set()]
        for request in running:
            request.stdin.put(None)
            request.signal("TERM")
        until = time.monotonic() + END_GRACE
        for request in running:
            request.exited.wait(max(0.0, until - time.monotonic()))
        for request in running:
            # The group, even when its leader is gone: a child it started may still run.
            try:
                os.killpg(request.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


_CODE = {}


def _preload():
    for name in HELPER_MODULES:
        try:
            __import__(name)
        except ImportError:
            pass  # the script that needs it says so itself


def _compiled(source):
    if source not in _CODE:
        _CODE[source] = compile(source, "<string>", "exec")
    return _CODE[source]


def _run_script(code_object):
    """In a forked child: run a hostside script's code as `python -S -c` would, then exit."""
    import io
    import traceback

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ["PYTHONUTF8"] = "1"  # for whatever it starts, as the fresh interpreter had
    sys.argv = ["-c"]
    sys.stdin = io.TextIOWrapper(open(0, "rb", closefd=False), "utf-8", "surrogateescape")
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), "utf-8", "surrogateescape")
    sys.stderr = io.TextIOWrapper(
        open(2, "wb", closefd=False), "utf-8", "backslashreplace", line_buffering=True
    )
    code = 0
    try:
        exec(code_object, {"__name__": "__main__"})  # noqa: S102
    except SystemExit as exit_:
        if exit_.code is None:
            code = 0
        elif isinstance(exit_.code, int):
            code = exit_.code
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - reported as python -c would, with the traceback
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _status(wait_status):
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def read_exact(inp, n):
    """n bytes from the raw stream, or None at EOF."""
    parts = []
    while n:
        try:
            block = os.read(inp, min(n, MAX_PAYLOAD))
        except OSError:
            return None
        if not block:
            return None
        parts.append(block)
        n -= len(block)
    return b"".join(parts)


def _big_pipe(fd):
    """Let the pipe `fd` hold PIPE_SIZE bytes where the system and this user's pipe quota
    allow; anything else (not a pipe, not Linux) leaves it as it is. Only the agent's own two
    pipes and those of a request that moves more than READ_SIZE at once get it (the user's
    quota of pipe memory is shared with every other program of theirs). Returns True (tried)."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        import fcntl

        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
    except (ImportError, OSError, ValueError):
        pass
    return True


def _thread(target, *args):
    thread = threading.Thread(target=target, args=args)
    thread.daemon = True
    thread.start()
    return thread


def main():
    inp, out = 0, Output(1)
    # Nothing else may write to fd 1 (the frames): Python's own stdout goes to stderr.
    sys.stdout = sys.stderr
    # Python 3.12+ warns at each fork of a process with threads; the forked helpers touch no
    # lock of the agent's threads (see fork_python), and the warnings would pile up unread.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    # SIGTERM (someone ends the agent) ends its processes too, as EOF does.
    signal.signal(signal.SIGTERM, _exit_on_term)
    os.write(1, MAGIC)
    _big_pipe(0)
    _big_pipe(1)
    agent = Agent(inp, out)
    try:
        agent.serve()
    finally:
        agent.end_all()


def _exit_on_term(signum, frame):
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    main()
