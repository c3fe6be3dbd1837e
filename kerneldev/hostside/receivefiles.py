"""Receive several files on the host from one stream, each landing atomically.

Self-contained like `_hashfiles.py`: `SSHTransport.put_files` runs this source on the host with
`python3 -c` and writes to its stdin an 8-byte big-endian length and a JSON request
(`{"mark": TEMP_MARK, "files": [{"path", "mode", "expect", "check"}...]}`), then per file the
records of `_sendfiles.py`'s framing: `D` chunks and one `E` (end of this file); an `A` record
or the end of the input mid-file aborts (the client was interrupted or went away).

Per file, the same rules as `SSHTransport.put_file`: a symlink is written through to its
target; parent folders are created; the bytes go to `.<name><mark><random>` next to the target
(exclusive create, mode set before any byte lands, the replaced file's owner kept where
allowed); then, when `check` is set, the live file is hashed again and must still be `expect`
(None: absent) - the compare-and-swap - and only then is the temporary file renamed over the
target. A temporary file never outlives a failure or an abort.

With `"lock": {"path", "token"}` in the request (a push's steps through the host agent), the
host lock file must still hold that token when the run begins and again right before each
rename: a chain the client left (a cut connection) must not act once its lock was taken over
by another command. Else the file is dropped and reported with `"reason": "lock"`.

With `"backups": {"items", "expect"}` (a push's backups, `AgentChain` folds its `copy_on_host`
into the upload that follows it), `copyfiles.py`'s work (`hostcommon.copy_all`) runs in a thread
while the files' bytes land in their temporary files, and no file is renamed before every
backup is made and its sum is the expected one: a file written meanwhile waits, and is renamed
(its compare-and-swap and lock check right before, as any) once they are. The backups' lines
(`<index> <sha256>`, as `copyfiles.py` prints them, then `backups ok`) come on stdout, their
failure on stderr as `copyfiles.py` says it; a failed backup drops every file written and
reports the first with `"reason": "backup"`. The backups' folders and the live tree are two
folders: their new files are created side by side (on a disk where each new inode is slow,
half the time of one after the other: docs/benchmarks.md, issue 23 round 7).

One JSON line per file on stdout: `{"i": n, "ok": true, "sha256", "size"}` once it is renamed,
or `{"i": n, "ok": false, "reason": "changed"|"aborted"|"lock"|"backup"|"error", "error": text}`;
after the first failure nothing more is written or read, and the exit status is 1 (0: every
file landed), so a request the host agent runs `after` this one starts only when all did.

SIGINT (the client's Ctrl-C, when every record is already on its way) stops it at the next
safe point - between two reads of a file's bytes, or right before a rename - as an `A` record
would: the file being written is dropped and reported aborted. So a file is renamed if and
only if its report line says so.
Standard library only, Python 3.6 compatible; imports nothing of kerneldev on the host, where
`hostscripts.script` sends `hostcommon.py`'s source ahead of this one.
"""

import hashlib
import json
import os
import signal
import stat
import struct
import sys

SHARED = ("hostcommon",)  # sent ahead of this source by `hostscripts.script`
if "copy_all" not in globals():  # imported or run here (on the host it is sent ahead)
    try:
        from kerneldev.hostside.hostcommon import CopyFailed, LockLost, check_lock, copy_all
    except ImportError:  # run alone, kerneldev not importable: hostcommon.py beside this file
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostcommon.py")) as f:
            exec(compile(f.read(), f.name, "exec"))  # noqa: S102

CHUNK = 1 << 20
HEADER = struct.Struct(">cQ")


class Aborted(Exception):
    pass


STOPPED = []  # the SIGINT that asked us to stop (acted on at the safe points: `check_stop`)


def _stop(signum, frame):
    STOPPED.append(signum)


def check_stop():
    if STOPPED:
        raise Aborted("interrupted by the client")


class Changed(Exception):
    pass


def discard(path):
    """Remove a temporary file that must not outlive a failure (already gone: fine). Also
    `atomic_file`'s, for this machine's files."""
    try:
        os.unlink(path)
    except OSError:
        pass


def read_exact(inp, n):
    parts = []
    while n:
        check_stop()
        block = inp.read(min(n, CHUNK))
        if not block:
            raise Aborted("the stream ended early")
        parts.append(block)
        n -= len(block)
    return b"".join(parts)


def sha256_of(path, keep=None):
    """The sha256 of the file at `path` (None: there is none). With `keep` (a list), the file
    read stays open and its descriptor is appended to it (see `Release`)."""
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        with open(fd, "rb", closefd=False) as f:
            for block in iter(lambda: f.read(CHUNK), b""):  # noqa: B023
                digest.update(block)
    except BaseException:
        os.close(fd)
        raise
    if keep is None:
        os.close(fd)
    else:
        keep.append(fd)
    return digest.hexdigest()


class Release:
    """Closes, in a few threads, the descriptors of the files a rename replaced: the last
    close frees the replaced file's blocks, and that (not the rename) is what costs - one to
    several ms a file on ext4 while other programs keep its journal busy, 0.2-0.35 s for 100
    files measured (docs/benchmarks.md, issue 23 round 6). Held open by the compare-and-swap
    check across its rename, each replaced file is freed here while the next file lands,
    several at a time. Only when the old file is freed changes; nothing can reach it through
    its name once it is replaced. `finish()` waits for every close."""

    WORKERS = 4
    LIMIT = 256  # descriptors waiting at most; beyond that a close is made right away

    def __init__(self):
        self.jobs = None
        self.threads = []

    def close(self, fd):
        if self.jobs is None:
            try:
                import queue
                import threading

                self.jobs = queue.Queue()
                for _ in range(self.WORKERS):
                    thread = threading.Thread(target=self._work)
                    thread.daemon = True
                    thread.start()
                    self.threads.append(thread)
            except Exception:  # no threads here: close at once, as before
                self.jobs = False
        if not self.jobs or self.jobs.qsize() >= self.LIMIT:
            os.close(fd)
        else:
            self.jobs.put(fd)

    def _work(self):
        while True:
            fd = self.jobs.get()
            if fd is None:
                return
            try:
                os.close(fd)
            except OSError:
                pass

    def finish(self):
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            thread.join()
        self.threads = []


def replaced(stat_of, path, mode):
    """(owner, mode) for a file written over `path`: the old file's (uid, gid), None when there
    is none, and `mode`, or when None the old file's permission bits (0o644 for a new file).
    `stat_of` is `os.stat` here, an SFTP client's `stat` for the SSH transport; its errors
    other than FileNotFoundError pass through."""
    try:
        st = stat_of(path)
    except FileNotFoundError:
        return None, 0o644 if mode is None else mode
    return (st.st_uid, st.st_gid), stat.S_IMODE(st.st_mode) if mode is None else mode


def write_temp(inp, item, mark, out=None, made=None):
    """A file's bytes, from its records, into a new temporary file next to its target; returns
    (target, temporary file, sha256, size). With `confirm` set, once the bytes are written a
    `{"i": n, "written": true}` line goes to `out` and one `R` record (rename) must follow, else
    the file is dropped: the client's own compare-and-swap check runs in between
    (`Transport.put_file`'s `before_rename`). `made`: the folders this run created (or found)
    already, one makedirs each. The temporary file never outlives a failure here."""
    path = item["path"]
    if os.path.islink(path):
        path = os.path.realpath(path)
    folder, name = os.path.split(path)
    if made is None or folder not in made:
        os.makedirs(folder, exist_ok=True)
        if made is not None:
            made.add(folder)
    owner, mode = replaced(os.stat, path, item["mode"])
    # At most 200 bytes of the name: the temporary one must stay within 255 (NAME_MAX).
    stem = name.encode("utf-8", "surrogateescape")[:200].decode("utf-8", "ignore")
    tmp = os.path.join(folder, "." + stem + mark + os.urandom(6).hex())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            now = os.fstat(f.fileno())
            if owner is not None and (now.st_uid, now.st_gid) != owner:
                try:
                    os.fchown(f.fileno(), *owner)
                except PermissionError:
                    pass  # only root may give a file away
            digest = hashlib.sha256()
            size = 0
            while True:
                kind, length = HEADER.unpack(read_exact(inp, HEADER.size))
                if kind == b"E":
                    break
                if kind != b"D":
                    raise Aborted("aborted by the client")
                block = read_exact(inp, length)
                f.write(block)
                digest.update(block)
                size += len(block)
        if item.get("confirm"):
            out.write(json.dumps({"i": item["i"], "written": True}) + "\n")
            out.flush()
            kind, _ = HEADER.unpack(read_exact(inp, HEADER.size))
            if kind != b"R":
                raise Aborted("aborted by the client")
    except BaseException:
        discard(tmp)
        raise
    return path, tmp, digest.hexdigest(), size


def swap(item, path, tmp, lock=None, release=None):
    """Rename `tmp` over `path`: when `check` is set, the live file must still be `expect` (the
    compare-and-swap, read right before), the client must not have asked to stop, and `lock`
    must still hold our token (`check_lock`), all right before the rename. `release`: a
    `Release` that closes the replaced file, read by the compare-and-swap, after the rename.
    On any failure `tmp` is removed."""
    try:
        held = [] if release is not None else None
        try:
            if item["check"] and sha256_of(path, held) != item["expect"]:
                raise Changed()
            check_stop()
            check_lock(lock)
            os.rename(tmp, path)
        finally:
            for fd in held or ():
                release.close(fd)
    except BaseException:
        discard(tmp)
        raise


class Backups:
    """A push's backups (`hostcommon.copy_all` of the request's `backups`) made in a thread
    while the files land; `finish` waits for them and reports them, once. SIGINT (`STOPPED`)
    stops them before their next item, as it stops the landing."""

    def __init__(self, request, lock):
        import threading

        self.lines = []
        self.error = None
        self.reported = False
        self.thread = threading.Thread(
            target=self._run, args=(request["items"], request.get("expect"), lock)
        )
        self.thread.daemon = True
        self.thread.start()

    def _run(self, items, expect, lock):
        try:
            copy_all(items, expect, lock, self._done, lambda: bool(STOPPED))
        except CopyFailed as err:
            self.error = err.message
        except BaseException as err:  # noqa: BLE001 - said as copyfiles.py would, on stderr
            self.error = "copyfiles: %s" % (err,)

    def _done(self, i, sha):
        self.lines.append("%d %s\n" % (i, sha))

    def finish(self, out):
        """Wait for the backups; the first time, their lines to `out` (`backups ok` when all
        were made as expected) or their error to stderr. True when all were."""
        self.thread.join()
        if not self.reported:
            self.reported = True
            out.write("".join(self.lines) + ("backups ok\n" if self.error is None else ""))
            out.flush()
            if self.error is not None:
                sys.stderr.write(self.error + "\n")
                sys.stderr.flush()
        return self.error is None


def main():
    signal.signal(signal.SIGINT, _stop)
    # Unbuffered: whether more bytes wait is then what select() says (`wait_for_bytes`).
    inp, out = getattr(sys.stdin.buffer, "raw", sys.stdin.buffer), sys.stdout
    (length,) = struct.unpack(">Q", read_exact(inp, 8))
    request = json.loads(read_exact(inp, length).decode("utf-8"))
    made = set()
    release = Release()
    backups = None
    if request.get("backups") is not None:
        backups = Backups(request["backups"], request.get("lock"))
    try:
        return land_all(inp, out, request, made, release, backups)
    finally:
        try:
            if backups is not None:
                backups.finish(out)  # made, or stopped (SIGINT), before the process ends
        finally:
            release.finish()


def wait_for_bytes(inp, backups):
    """Until the next bytes of the stream are there or the backups are made (or SIGINT): files
    written meanwhile are renamed as soon as the backups allow, also when the client sends
    the next file only once it saw this one land."""
    try:
        fd = inp.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a pipe (run in-process): read on
    import select

    while backups.thread.is_alive() and not STOPPED:
        if select.select([fd], [], [], 0.005)[0]:
            return


def failure(i, err):
    """The report line of a file that did not land, for the exception that stopped it."""
    if isinstance(err, Changed):
        return {"i": i, "ok": False, "reason": "changed", "error": "changed on the host"}
    if isinstance(err, Aborted):
        return {"i": i, "ok": False, "reason": "aborted", "error": str(err)}
    if isinstance(err, LockLost):
        return {"i": i, "ok": False, "reason": "lock", "error": str(err)}
    return {"i": i, "ok": False, "reason": "error", "error": err.strerror or str(err)}


def land_all(inp, out, request, made, release, backups=None):
    """Land each file of the request in order, one report line each; False after the first
    failure (nothing more is read or written). With `backups`, the files written while they are
    being made wait for them (`pending`), then are renamed in order."""
    lock = request.get("lock")
    mark = request["mark"]
    pending = []  # (item, target, temporary file, sha256, size), in order

    def report(line):
        out.write(json.dumps(line) + "\n")
        out.flush()

    def drop_pending():
        for entry in pending:
            discard(entry[2])
        del pending[:]

    def rename_pending():
        """Once the backups are made (checked), each file written so far renamed in order."""
        if pending and backups is not None and not backups.finish(out):
            first = pending[0][0]["i"]
            drop_pending()
            report({"i": first, "ok": False, "reason": "backup", "error": backups.error})
            return False
        while pending:
            item, path, tmp, sha, size = pending.pop(0)
            try:
                swap(item, path, tmp, lock, release)
            except (Changed, Aborted, LockLost, OSError) as err:
                drop_pending()
                report(failure(item["i"], err))
                return False
            report({"i": item["i"], "ok": True, "sha256": sha, "size": size})
        return True

    try:
        check_lock(lock)  # then right before each rename (`swap`)
    except LockLost as err:
        report(failure(0, err))
        return False
    try:
        for i, item in enumerate(request["files"]):
            item = dict(item, i=i)
            if pending:
                wait_for_bytes(inp, backups)
                if not backups.thread.is_alive() and not rename_pending():
                    return False
            try:
                pending.append((item,) + write_temp(inp, item, mark, out, made))
            except Aborted as err:
                # Stop at once: what waits for the backups is not renamed any more.
                first = pending[0][0]["i"] if pending else i
                drop_pending()
                report(failure(first, err))
                return False
            except OSError as err:
                # As one by one: the files before it land first (their checks as always).
                if not rename_pending():
                    return False
                report(failure(i, err))
                return False
            if backups is None or not backups.thread.is_alive():
                if not rename_pending():
                    return False
        return rename_pending()
    finally:
        drop_pending()  # whatever ended it (a broken pipe too): no temporary file outlives it


if __name__ == "__main__":
    try:
        landed = main()
    except (BrokenPipeError, Aborted):
        landed = False  # the client went away: every temporary file is already removed
    sys.exit(0 if landed else 1)
