"""Single file operations on the host, one JSON request on stdin, one JSON answer on stdout.

The agent transport runs this where the SSH transport uses SFTP requests, with the same
semantics: `exists` (lstat: a dangling symlink exists), `mkdirs` (the folder and its parents;
an existing non-folder is refused), `sha256` (of a regular file, through a symlink; null when
missing or not a regular file), `rename` (rename(2): replaces the target in one step).

Answer: `{"ok": true, ...}` or `{"ok": false, "error": text, "missing": bool, "notdir": bool}`.
Standard library only, Python 3.6 compatible; imports nothing of kerneldev.
"""

import errno
import hashlib
import json
import os
import stat
import sys

CHUNK = 1 << 20


def exists(request):
    try:
        os.lstat(request["path"])
    except FileNotFoundError:
        return {"ok": True, "exists": False}
    return {"ok": True, "exists": True}


def mkdirs(request):
    path = request["path"]
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            return {"ok": True}
        return {"ok": False, "notdir": True, "error": "exists and is not a folder"}
    except FileNotFoundError:
        pass
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        return {"ok": False, "notdir": True, "error": "exists and is not a folder"}
    return {"ok": True}


def sha256(request):
    try:
        f = open(request["path"], "rb")
    except FileNotFoundError:
        return {"ok": True, "sha256": None}
    except IsADirectoryError:
        return {"ok": True, "sha256": None}
    with f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return {"ok": True, "sha256": None}
        digest = hashlib.sha256()
        for block in iter(lambda: f.read(CHUNK), b""):  # noqa: B023
            digest.update(block)
    return {"ok": True, "sha256": digest.hexdigest()}


def rename(request):
    os.rename(request["src"], request["dst"])
    return {"ok": True}


OPS = {"exists": exists, "mkdirs": mkdirs, "sha256": sha256, "rename": rename}


def main():
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    try:
        answer = OPS[request["op"]](request)
    except OSError as err:
        answer = {
            "ok": False,
            "error": err.strerror or str(err),
            "missing": err.errno == errno.ENOENT,
        }
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
