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
"""

import fnmatch
import glob
import hashlib
import json
import os
import stat
import sys

CHUNK = 1 << 20


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


def hash_tree(root, patterns):
    """Return {"files": [{"path", "sha256", "size", "mode"}...], "unmatched": [pattern...]}."""
    root = os.path.normpath(root)
    real_root = os.path.realpath(root)
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
                continue  # a symlink (or `..`) that leads out of root
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
            digest = hashlib.sha256()
            with open(real, "rb") as f:
                for block in iter(lambda: f.read(CHUNK), b""):  # noqa: B023
                    digest.update(block)
            found[rel] = {
                "path": rel,
                "sha256": digest.hexdigest(),
                "size": st.st_size,
                "mode": stat.S_IMODE(st.st_mode),
            }
        if not hits:
            unmatched.append(pattern)
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
    lock = request.get("lock")
    if lock is not None:
        outcome = take_lock(request["root"], lock)
        if outcome["state"] != "taken":  # hashing without the lock would be wasted
            result = {"files": [], "unmatched": list(request["patterns"]), "lock": outcome}
            if request.get("find") is not None:
                result["found"], result["root_exists"] = [], os.path.lexists(request["root"])
            return result
    result = hash_tree(request["root"], request["patterns"])
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
