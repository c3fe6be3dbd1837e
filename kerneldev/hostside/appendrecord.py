"""Append a record to a file on the host, then remove files and release a lock: the last step
of a push's chain (`AgentChain.append_text`) in one process.

Request on stdin: an 8-byte big-endian length and a JSON object `{"path", "lock", "remove",
"release"}`, then the bytes to append. In order, what the shell command
`grep -qF TOKEN LOCK || exit 75; mkdir -p -- FOLDER && cat >> PATH && rm -f -- REMOVE... &&
{ grep -qF TOKEN2 RELEASE && rm -f -- RELEASE; true; }` did, without its seven programs (~9 ms
of CPU and 30-45 ms on the measured host: docs/benchmarks.md, issue 23 round 6):
  - with `lock` (`{"path", "token"}`): the lock file must still hold that token, else nothing
    is done: `kerneldev: lock taken over: ...` on stderr, exit 75 (`agent_chain.LOCK_LOST_EXIT`);
  - `path`'s folder and its parents are created, and the bytes appended to `path` (created
    with mode 0666 less the umask, as the shell's `>>`);
  - each path of `remove` is removed (one already gone: fine);
  - with `release` (`{"path", "token"}`): that lock file is removed when it holds the token
    (never another command's lock; a failure here is ignored, as the shell's `; true`).
A failed append or removal: its error on stderr, exit 1, nothing after it done.
Standard library only, Python 3.6 compatible; imports nothing of kerneldev on the host, where
`hostscripts.script` sends `hostcommon.py`'s source (the lock checks) ahead of this one.
"""

import json
import os
import struct
import sys

SHARED = ("hostcommon",)  # sent ahead of this source by `hostscripts.script`
if "holds" not in globals():  # imported or run here (on the host it is sent ahead)
    try:
        from kerneldev.hostside.hostcommon import LockLost, check_lock, holds
    except ImportError:  # run alone, kerneldev not importable: hostcommon.py beside this file
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostcommon.py")) as f:
            exec(compile(f.read(), f.name, "exec"))  # noqa: S102

LOCK_LOST = "kerneldev: lock taken over:"
LOCK_LOST_EXIT = 75


def read_all(inp, n):
    parts = []
    while n:
        block = inp.read(n)
        if not block:
            raise EOFError("the request ended early")
        parts.append(block)
        n -= len(block)
    return b"".join(parts)


def append(path, data):
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def main():
    inp = sys.stdin.buffer
    (length,) = struct.unpack(">Q", read_all(inp, 8))
    request = json.loads(read_all(inp, length).decode("utf-8"))
    data = inp.read()
    try:
        check_lock(request.get("lock"))
    except LockLost as err:
        sys.stderr.write("%s %s\n" % (LOCK_LOST, err))
        return LOCK_LOST_EXIT
    step = "append to " + request["path"]
    try:
        append(request["path"], data)
        for path in request.get("remove") or ():
            step = "remove " + path
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    except OSError as err:
        sys.stderr.write("appendrecord: %s: %s\n" % (step, err.strerror or err))
        return 1
    release = request.get("release")
    if release is not None and holds(release):
        try:
            os.unlink(release["path"])
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
