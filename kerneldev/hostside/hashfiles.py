"""Expand file patterns under a root and hash what they match.

This module is self-contained on purpose: `LocalTransport` imports it, and `SSHTransport` sends
its source to the host and runs it with `python3 -c`, patterns as JSON on stdin, so one remote
command hashes every file and names with spaces, quotes, newlines or any unicode survive. Keep
it standard-library only and compatible with Python 3.6 (old server images).

Semantics (the same on both transports):
- a pattern is a path relative to root; shell globs (`*`, `?`, `[...]`) match like the shell
  (`glob.glob`, not recursive, `*` skips dotfiles);
- matches are regular files only (a symlink is followed, but its target must stay inside root);
- a pattern that is absolute, contains `..` leading out of root, or reaches outside root
  through a symlink matches nothing (it is reported as unmatched, never read);
- results are de-duplicated and sorted by path.

A request may also ask (`find`: file-name globs) for every regular file under root whose name
matches one of them (kerneldev's temporary files and markers: symlinks are not followed),
returned as absolute paths in `found`, and always says whether root exists: the snapshot of a
read-only command needs no second round trip for those.

A push's request may also carry `lock` (see `host_lock.HostLock.scan_request`): the host lock
is taken first, in the same command (an exclusive create, as the shell's `set -C` does), and
the files are hashed only when it was taken; when the caller's workspace files
(`release_if_same`: path -> sha256) are all live already and nothing was left over, nothing can
change, so the lock is released again before answering. A push with nothing to do is then one
remote command. When the lock is kept (the push has work), the request's `lock["history"]`
file (the host's deploy history) is read under it and returned as `lock["history"]` (its text;
None when there is none; left out when it cannot be read): the deploy's pruning needs no
request of its own to read it.

A request with `"sums": true` reuses the live files' sums of earlier requests (`LiveSums`: a
file's sha256 is kept in the host user's cache folder, outside root, next to the `stat` fields
that change whenever its bytes can have changed, and reused only while they match), so a file
that did not change since the last command is not read again. Every file's `stat` is still
taken live on every request.

A request `{"root", "settle": [path...]}` (a kept session's push, after its files landed)
answers at once and leaves a detached process (`detach`) that waits until the file system's
clock has moved past those files' last change, then hashes them as a `"sums"` request would:
the next command finds their sums remembered instead of reading them again. Nothing is
answered from it; a file changed meanwhile is either read afresh or not remembered, by the
same rule (`settled`).
"""

import fnmatch
import glob
import hashlib
import json
import os
import signal
import stat
import sys
import time

CHUNK = 1 << 20
SUMS_FORMAT = 1
SUMS_LIMIT = 4096  # entries kept per root: the files of a few deploys' worth of patterns
# Seconds a settle waits at most for the file system's clock to pass the files' ctime (a tick
# is a few ms on Linux; whole seconds on some file systems), and between two looks.
SETTLE_WAIT = 2.5
SETTLE_POLL = 0.002
MAX_FD = 1 << 16
# Seconds a detached settle may live at most: it is only a cache's work, and a fork beside a
# caller's threads could, however unlikely, inherit a lock that one of them held.
SETTLE_LIFE = 120


def stat_key(st):
    """The `stat` fields that move whenever a file's bytes can have changed."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def settled(before, after, began):
    """Whether a sum read between the `stat`s `before` and `after` may be remembered, given
    `began`, the stat of a folder stamped "now" when the reading command began (falsy: no
    clock): the file did not change while read, is on that folder's device, and its last change
    (ctime: every write sets it, no user can set it back) is stamped in an earlier clock tick,
    so any later write gets a later stamp. The one rule of `LiveSums` and the workspace's
    `SumCache` (loop/sum_cache.py)."""
    return (
        bool(began)
        and stat_key(before) == stat_key(after)
        and before.st_dev == began.st_dev
        and before.st_ctime_ns < began.st_ctime_ns
    )


def sums_folder():
    """Where the host user's `LiveSums` live: `$XDG_CACHE_HOME/kerneldev/live-sums`, else
    `~/.cache/kerneldev/live-sums` (never under a live root: only pushed bytes change there)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kerneldev", "live-sums")


def clock_past(folder, ctime_ns, limit=SETTLE_WAIT):
    """Stamp `folder` "now" until its ctime is after `ctime_ns` on the file system's own clock;
    its stat then (what `settled` takes as `began`), or None after `limit` seconds."""
    deadline = time.monotonic() + limit
    while True:
        os.utime(folder)
        st = os.stat(folder)
        if st.st_ctime_ns > ctime_ns:
            return st
        if time.monotonic() > deadline:
            return None
        time.sleep(SETTLE_POLL)


def newest_change(root, paths):
    """The latest ctime (ns) among the files `paths` under `root` (missing ones skipped)."""
    newest = 0
    for path in paths:
        try:
            newest = max(newest, os.stat(os.path.join(root, path)).st_ctime_ns)
        except OSError:
            continue
    return newest


def detach(work):
    """Run `work()` in a process nobody waits for (its own session, the lowest CPU priority, no
    inherited descriptor but /dev/null as stdin, stdout and stderr, so no pipe or socket of the
    caller's stays open through it), and return at once: True when it was started. A
    grandchild, so the caller reaps the one child at once and no zombie is left behind."""
    try:
        pid = os.fork()
    except OSError:
        return False
    if pid:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
        return True
    try:
        os.setsid()
        if os.fork() == 0:
            import gc

            gc.disable()  # no finalizer of the caller's objects closes a descriptor reused here
            signal.alarm(SETTLE_LIFE)  # its default action ends the process
            try:  # work nobody waits for: never take a CPU from a command (or the host's server)
                os.nice(19)
            except OSError:
                pass
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, MAX_FD)
            work()
    finally:
        os._exit(0)


def settle_live(root, paths):
    """Remember the sums of `paths` under `root` once the clock moved past their last change
    (see the module's docstring); in a detached process."""
    if not clock_past_sums(newest_change(root, paths)):
        return
    hash_tree(root, [glob.escape(p) for p in paths], sums=True)


def clock_past_sums(ctime_ns):
    try:
        os.makedirs(sums_folder(), mode=0o700, exist_ok=True)
        return clock_past(sums_folder(), ctime_ns) is not None
    except OSError:
        return False


class LiveSums:
    """The sha256 of live files under one root, remembered between requests (as git's index
    and the workspace's `sum_cache` do): an entry counts only while the file's size, mtime,
    ctime, inode and device are what they were when it was read. ctime moves on every write
    and rename and no user can set it back, so a rewrite with the old size and mtime is seen.

    A write in the same clock tick as the one before leaves every field as it was ("racy
    git"), so a sum is only kept for a file whose ctime is strictly before the moment this
    request began reading, on the file system's own clock: the cache folder's times are set to
    "now" and read back, and a file on another device than that folder is never kept. Its
    `stat` must also be the same after the read as before. The cache file is only a cache:
    unreadable, damaged or of another format it is ignored and rewritten (two requests at once
    lose at most each other's new entries)."""

    def __init__(self, real_root):
        self.folder = sums_folder()
        name = hashlib.sha256(real_root.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        self.path = os.path.join(self.folder, name + ".json")
        self.entries = {}
        self.began = None  # the folder's stat once stamped; False: no clock, keep nothing
        self.changed = False
        try:
            with open(self.path, "rb") as f:
                raw = json.loads(f.read().decode("utf-8"))
            if isinstance(raw, dict) and raw.get("format") == SUMS_FORMAT:
                if isinstance(raw.get("files"), dict):
                    self.entries = raw["files"]
        except (OSError, ValueError):
            pass

    def lookup(self, real, st):
        entry = self.entries.get(real)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == stat_key(st):
            return entry[1]
        return None

    def begin(self):
        """Before the first file is read: the file system's "now" (the stamp)."""
        if self.began is not None:
            return
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            os.utime(self.folder)
            self.began = os.stat(self.folder)
        except OSError:
            self.began = False

    def remember(self, real, before, after, sha256):
        if not settled(before, after, self.began):
            return
        key = stat_key(before)
        if self.entries.get(real) != [key, sha256]:
            self.entries[real] = [key, sha256]
            self.changed = True

    def save(self):
        if not self.changed:
            return
        entries = self.entries
        if len(entries) > SUMS_LIMIT:
            entries = dict(e for e in entries.items() if os.path.exists(e[0]))
            entries = dict(list(entries.items())[-SUMS_LIMIT:])
        temp = "%s.%d.tmp" % (self.path, os.getpid())
        try:
            with open(temp, "w") as f:
                f.write(json.dumps({"format": SUMS_FORMAT, "files": entries}))
            os.rename(temp, self.path)
        except OSError:
            try:
                os.remove(temp)
            except OSError:
                pass


def file_sha256(path):
    """The sha256 of `path`'s bytes, read in CHUNK blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):  # noqa: B023
            digest.update(block)
    return digest.hexdigest()


def _inside(path, root):
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def real_path(path, real_parents, lst=None):
    """(`os.path.realpath(path)`, whether `path` itself is no symlink), with one `realpath` per
    folder (`real_parents` caches them): a name that is not a symlink adds nothing to its
    folder's real path. `lst`: `path`'s `lstat`, when the caller has it (None: taken here; a
    missing file is no symlink, as for `realpath`)."""
    parent, name = os.path.split(path)
    if name in ("", os.curdir, os.pardir):
        return os.path.realpath(path), False
    if lst is None:
        try:
            lst = os.lstat(path)
        except OSError:
            lst = False
    if lst and stat.S_ISLNK(lst.st_mode):
        return os.path.realpath(path), False
    real_parent = real_parents.get(parent)
    if real_parent is None:
        real_parent = real_parents[parent] = os.path.realpath(parent)
    return os.path.join(real_parent, name), True


def hash_tree(root, patterns, sums=False):
    """Return {"files": [{"path", "sha256", "size", "mode"}...], "unmatched": [pattern...]}.
    `sums`: reuse (and keep) the sums of files unchanged since an earlier request."""
    root = os.path.normpath(root)
    real_root = os.path.realpath(root)
    live_sums = LiveSums(real_root) if sums else None
    found = {}
    unmatched = []
    real_parents = {}
    for pattern in patterns:
        hits = 0
        if not pattern or os.path.isabs(pattern):
            unmatched.append(pattern)
            continue
        # Escape root so a `[` in the root folder's name is not read as a glob.
        for match in glob.glob(os.path.join(glob.escape(root), pattern)):
            rel = os.path.relpath(match, root)
            if rel == os.curdir or rel == os.pardir or rel.startswith(os.pardir + os.sep):
                continue
            try:
                st = os.lstat(match)
            except OSError:
                continue
            real, direct = real_path(match, real_parents, st)
            if not _inside(real, real_root):
                # a symlink (or `..`) that leads out of root: no match, never read (a literal
                # entry naming it is still in the file set, as `missing-live`)
                continue
            if not direct:  # `st` is the link's (or `..`'s): the target's is wanted
                try:
                    st = os.stat(real)
                except OSError:
                    continue
            if not stat.S_ISREG(st.st_mode):
                continue
            hits += 1
            rel = rel.replace(os.sep, "/")
            if rel in found:
                continue
            sha256 = live_sums.lookup(real, st) if live_sums else None
            if sha256 is None:
                if live_sums:
                    live_sums.begin()
                sha256 = file_sha256(real)
                if live_sums:
                    try:
                        live_sums.remember(real, st, os.stat(real), sha256)
                    except OSError:
                        pass
            found[rel] = {
                "path": rel,
                "sha256": sha256,
                "size": st.st_size,
                "mode": stat.S_IMODE(st.st_mode),
            }
        if not hits:
            unmatched.append(pattern)
    if live_sums:
        live_sums.save()
    return {"files": [found[k] for k in sorted(found)], "unmatched": unmatched}


def find_named(root, names):
    """Regular files under root (not following symlinks) whose name matches a glob of `names`,
    as sorted absolute paths; nothing when root is missing."""
    found = []

    def ignore(_err):
        return None  # an unreadable folder is skipped, as `find ... 2>/dev/null` would

    for folder, _dirs, files in os.walk(root, onerror=ignore):
        for name in files:
            if any(fnmatch.fnmatchcase(name, n) for n in names):
                path = os.path.join(folder, name)
                try:
                    if stat.S_ISREG(os.lstat(path).st_mode):
                        found.append(path)
                except OSError:
                    continue
    return sorted(found)


def take_lock(root, lock):
    """Create the lock file exclusively, holding `lock["line"]`. Returns {"state": "taken"},
    {"state": "busy", "holder": its content}, {"state": "no_root"} or {"state": "error"}."""
    if lock.get("root_must_exist") and not os.path.isdir(root):
        return {"state": "no_root"}
    path = lock["path"]
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        try:
            with open(path, "rb") as f:
                holder = f.read(65536).decode("utf-8", "replace")
        except OSError:
            holder = ""
        return {"state": "busy", "holder": holder}
    except OSError as err:
        return {"state": "error", "error": str(err)}
    with os.fdopen(fd, "w") as f:
        f.write(lock["line"] + "\n")
    return {"state": "taken"}


def release_lock(lock):
    """Remove the lock file if it still holds our token."""
    try:
        with open(lock["path"], "rb") as f:
            mine = lock["token"].encode("ascii") in f.read(65536)
        if mine:
            os.remove(lock["path"])
    except OSError:
        return False
    return mine


def read_text(path):
    """A text file's content (undecodable bytes replaced), None when it is not there."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None


def answer(request):
    """The reply to one request (a dict), as `main` prints it."""
    if request.get("settle") is not None:
        root, paths = request["root"], list(request["settle"])
        return {"settling": detach(lambda: settle_live(root, paths))}
    lock = request.get("lock")
    if lock is not None:
        outcome = take_lock(request["root"], lock)
        if outcome["state"] != "taken":  # hashing without the lock would be wasted
            result = {"files": [], "unmatched": list(request["patterns"]), "lock": outcome}
            if request.get("find") is not None:
                result["found"], result["root_exists"] = [], os.path.lexists(request["root"])
            return result
    result = hash_tree(request["root"], request["patterns"], bool(request.get("sums")))
    if request.get("find") is not None:
        result["found"] = find_named(request["root"], request["find"])
        result["root_exists"] = os.path.lexists(request["root"])
    if lock is not None:
        same = lock.get("release_if_same")
        live = dict((f["path"], f["sha256"]) for f in result["files"])
        idle = (
            same is not None
            and not result.get("found")
            and all(live.get(p) == sha for p, sha in same.items())
        )
        outcome["released"] = bool(idle and release_lock(lock))
        if lock.get("history") and not outcome["released"]:
            try:
                outcome["history"] = read_text(lock["history"])
            except OSError:
                pass  # unreadable: the client reads it itself, and says why
        result["lock"] = outcome
    return result


def main():
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    result = answer(request)
    # ensure_ascii: names that are not valid UTF-8 travel as escapes, never as broken bytes.
    sys.stdout.write(json.dumps(result, ensure_ascii=True))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
