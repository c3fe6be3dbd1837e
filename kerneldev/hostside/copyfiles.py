"""Copy files on the host, each atomically, and hash each copy: a push's backups in one process.

Request on stdin: `{"items": [[src, tmp, dst], ...]}`. For each item, in order, what the shell
script of `Transport.copy_on_host` does with `mkdir -p`, `cp -p`, `mv -f` and `sha256sum`,
without starting four programs per file (~9 ms a file on the measured host, 0.2 s of a
20-file push: docs/benchmarks.md, issue 23):
  - create `dst`'s folder and its parents (mode 0777 less the umask, as `mkdir -p`);
  - copy `src` (through a symlink, as `cp` does for a named file) to `tmp`, keeping its
    owner where this user may set it (`cp -p`: EPERM and EINVAL are ignored unless root),
    then its mode and its access and modification times;
  - rename `tmp` over `dst` (rename(2), one step);
  - print `<index> <sha256 of dst>`: of the bytes written to it, hashed as they were copied
    (reading them back, as `sha256sum < dst` did, would read the same bytes from the page
    cache a second time: ~20% of a 100-file backup, docs/benchmarks.md, issue 23 round 3).
The first failure removes that item's `tmp`, prints `copyfiles: <what>: <why>` on stderr and
exits 1; the items before it stay copied, as with the shell script. With `"expect"` in the
request (one sha256 per item), a copy whose sum is not the expected one is printed and then
ends the run the same way (exit 1, `copyfiles: mismatch <index>`): a push's backups are
checked on the host, so that an upload sent `after` them never starts on a bad backup.
With `"lock": {"path", "token"}`, the host lock file must still hold that token before each
item is begun and again right before its rename; else that item's `tmp` is removed and the run
ends (exit 1, `copyfiles: lock taken over: <why>`): a push's chain left by its client (a cut
connection) creates no backup once its lock was taken over.

Standard library only, Python 3.6 compatible; imports nothing of kerneldev.
"""

import errno
import hashlib
import json
import os
import stat
import sys

CHUNK = 1 << 20


class LockLost(Exception):
    pass


def check_lock(lock):
    """As `receivefiles.check_lock` (a copy: each script is sent alone)."""
    if lock is None:
        return
    try:
        with open(lock["path"], "rb") as f:
            held = lock["token"].encode("ascii") in f.read(1 << 16)
    except OSError:
        held = False
    if not held:
        raise LockLost("the lock %s no longer holds this command's token" % lock["path"])


def copy_item(src, tmp):
    """Copy `src` to `tmp` as `cp -p` does; returns the sha256 of the bytes written."""
    st = os.stat(src)
    digest = hashlib.sha256()
    with open(src, "rb") as source, open(tmp, "xb") as target:
        for block in iter(lambda: source.read(CHUNK), b""):  # noqa: B023
            target.write(block)
            digest.update(block)
    try:
        os.chown(tmp, st.st_uid, st.st_gid)
    except OSError as err:
        if os.geteuid() == 0 or err.errno not in (errno.EPERM, errno.EINVAL):
            raise
    os.chmod(tmp, stat.S_IMODE(st.st_mode))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    return digest.hexdigest()


def main():
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    expect = request.get("expect")
    lock = request.get("lock")
    out = sys.stdout
    made = set()  # folders already created (one makedirs per folder, not per file)
    for i, (src, tmp, dst) in enumerate(request["items"]):
        folder = os.path.dirname(dst)
        step = "create folder " + folder
        try:
            check_lock(lock)
            if folder not in made:
                os.makedirs(folder, exist_ok=True)
                made.add(folder)
            step = "copy " + src
            sha = copy_item(src, tmp)
            step = "rename to " + dst
            check_lock(lock)
            os.rename(tmp, dst)
        except LockLost as err:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            out.flush()
            sys.stderr.write("copyfiles: lock taken over: %s\n" % err)
            sys.exit(1)
        except OSError as err:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            out.flush()
            sys.stderr.write("copyfiles: %s: %s\n" % (step, err.strerror or err))
            sys.exit(1)
        out.write("%d %s\n" % (i, sha))
        if expect is not None and sha != expect[i]:
            out.flush()
            sys.stderr.write("copyfiles: mismatch %d\n" % i)
            sys.exit(1)
    out.flush()


if __name__ == "__main__":
    main()
