"""What several hostside scripts share: the host lock's token check and a push's backup copies.

Each hostside script runs on the host alone (`python3 -c SOURCE`, or in a fork of the agent), so
it cannot import this module there: `hostscripts.script` sends this source ahead of each script
that names it in `SHARED` (`copyfiles.py`, `receivefiles.py`, `appendrecord.py`), and each of
them imports these names only where they are not defined already (run or imported on this
machine, as the tests and `local.py` do).

Standard library only, Python 3.6 compatible; imports nothing of kerneldev.
"""

import errno
import hashlib
import os
import stat

COPY_CHUNK = 1 << 20


class LockLost(Exception):
    pass


def holds(lock):
    """The lock file `lock["path"]` holds `lock["token"]`: no other command took the host lock
    over (unreadable or gone: it does not)."""
    try:
        with open(lock["path"], "rb") as f:
            return lock["token"].encode("ascii") in f.read(1 << 16)
    except OSError:
        return False


def check_lock(lock):
    """The host lock (`{"path", "token"}`, None: none to check) still holds our token, else
    `LockLost`."""
    if lock is not None and not holds(lock):
        raise LockLost("the lock %s no longer holds this command's token" % lock["path"])


def copy_item(src, tmp):
    """Copy `src` to the new file `tmp` as `cp -p` does: its owner where this user may set it
    (EPERM and EINVAL ignored unless root), then its permission bits and its access and
    modification times, all set on the open descriptor (no path looked up again); returns the
    sha256 of the bytes written."""
    st = os.stat(src)
    digest = hashlib.sha256()
    with open(src, "rb") as source, open(tmp, "xb") as target:
        fd = target.fileno()
        try:
            os.fchown(fd, st.st_uid, st.st_gid)
        except OSError as err:
            if os.geteuid() == 0 or err.errno not in (errno.EPERM, errno.EINVAL):
                raise
        for block in iter(lambda: source.read(COPY_CHUNK), b""):  # noqa: B023
            target.write(block)
            digest.update(block)
        target.flush()
        # After the bytes: a write by a non-root user clears set-user-ID and set-group-ID bits,
        # and sets the modification time.
        os.fchmod(fd, stat.S_IMODE(st.st_mode))
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
    return digest.hexdigest()


class CopyFailed(Exception):
    """A copy of `copy_all` failed: `message` is what `copyfiles.py` prints on stderr for it."""

    def __init__(self, message):
        Exception.__init__(self, message)
        self.message = message


def copy_all(items, expect=None, lock=None, done=None, stopped=None):
    """`copyfiles.py`'s work: for each `[src, tmp, dst]` in order, `dst`'s folder created, `src`
    copied to `tmp` (`copy_item`), `tmp` renamed over `dst`, and `done(index, sha256)` called.
    `lock`: checked before the first item and right before each rename. `expect`: one sha256
    per item; a copy with another sum is reported to `done` and then stops the run.
    `stopped()`: true when the run must stop before its next item (the copies made stay).
    The first failure removes that item's `tmp` and raises `CopyFailed` with the message
    `copyfiles:` prints; the items before it stay copied."""
    made = set()  # folders already created (one makedirs per folder, not per file)
    try:
        check_lock(lock)
    except LockLost as err:
        raise CopyFailed("copyfiles: lock taken over: %s" % err) from None
    for i, (src, tmp, dst) in enumerate(items):
        if stopped is not None and stopped():
            raise CopyFailed("copyfiles: stopped before %s" % src)
        folder = os.path.dirname(dst)
        step = "create folder " + folder
        try:
            if folder not in made:
                os.makedirs(folder, exist_ok=True)
                made.add(folder)
            step = "copy " + src
            sha = copy_item(src, tmp)
            step = "rename to " + dst
            check_lock(lock)
            os.rename(tmp, dst)
        except (LockLost, OSError) as err:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(err, LockLost):
                raise CopyFailed("copyfiles: lock taken over: %s" % err) from None
            raise CopyFailed("copyfiles: %s: %s" % (step, err.strerror or err)) from None
        if done is not None:
            done(i, sha)
        if expect is not None and sha != expect[i]:
            raise CopyFailed("copyfiles: mismatch %d" % i)
