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
With `"lock": {"path", "token"}`, the host lock file must still hold that token when the run
begins and again right before each rename; else that item's `tmp` is removed and the run ends
(exit 1, `copyfiles: lock taken over: <why>`): a push's chain left by its client (a cut
connection) creates no backup once its lock was taken over. (Each item's check as it began came
right after the previous item's check before its rename: one read of the lock file a file.)
The work is `hostcommon.copy_all`, shared with `receivefiles.py`'s backups.

Standard library only, Python 3.6 compatible; imports nothing of kerneldev on the host, where
`hostscripts.script` sends `hostcommon.py`'s source ahead of this one.
"""

import json
import os
import sys

SHARED = ("hostcommon",)  # sent ahead of this source by `hostscripts.script`
if "copy_all" not in globals():  # imported or run here (on the host it is sent ahead)
    try:
        from kerneldev.hostside.hostcommon import CopyFailed, copy_all
    except ImportError:  # run alone, kerneldev not importable: hostcommon.py beside this file
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostcommon.py")) as f:
            exec(compile(f.read(), f.name, "exec"))  # noqa: S102


def main():
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    out = sys.stdout

    def done(i, sha):
        out.write("%d %s\n" % (i, sha))

    try:
        copy_all(request["items"], request.get("expect"), request.get("lock"), done)
    except CopyFailed as err:
        out.flush()
        sys.stderr.write(err.message + "\n")
        sys.exit(1)
    out.flush()


if __name__ == "__main__":
    main()
