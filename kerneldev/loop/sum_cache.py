"""The workspace's file sums, remembered between commands: `<workspace>/.kerneldev/sums.json`.

Every pull, push, diff and status hashes the workspace side of each file it looks at. A file
that has not changed since the last command is hashed again for nothing; for a 50 MB file that
is ~40 ms of every no-op. This cache keeps each file's sha256 next to the `stat` fields that
change whenever its bytes can have changed, as git's index does:

- size, mtime_ns, inode and device: a new file or a rewrite in place;
- ctime_ns: set by the kernel on every write, rename into place and `touch -d`; no user can set
  it back, so a file rewritten with its old size and mtime (`cp -p` onto it) is still caught.

"Racy git": a file system stamps times from a clock that ticks (every few ms; whole seconds on
some), so a write in the same tick as an earlier one leaves every field as it was. A sum is
therefore only remembered for a file whose ctime (which every write sets to "now"; mtime can be
set to anything) is strictly before the moment the command began, read on the same file
system's clock (the command stamps the `.kerneldev` folder's times first and reads them back):
any later write gets a later stamp. Its `stat` must also be the same after the read as before.
The rule is `hostside/hashfiles.py`'s `settled`, which the host's own cache of live files'
sums (`LiveSums`) follows too.

After a kept pull, the files it wrote are hashed and remembered by a detached process once the
clock has passed their writes (`loop/settle.py`), under this same rule.

The file is a cache: unreadable, malformed or from another format it is ignored and rewritten;
two commands writing it at once lose at most each other's new entries (a later command hashes
those files again). It is written without fsync, for the same reason.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kerneldev.hostside.hashfiles import settled, stat_key
from kerneldev.paths import KERNELDEV_DIR

SUMS_FILE = "sums.json"
FORMAT = 1


class SumCache:
    """Sums of one workspace's files, keyed by their path relative to the workspace."""

    def __init__(
        self, folder: Path, entries: dict[str, list], began: os.stat_result | None
    ) -> None:
        self._folder = folder
        self._entries = entries
        # The `.kerneldev` folder's stat just after its times were set to "now": the command's
        # start on the file system's own clock (None: nothing is remembered, e.g. read-only).
        self._began = began
        self._changed = False

    @classmethod
    def load(cls, workspace: Path, *, writable: bool = True) -> SumCache:
        """The cache as the last command left it; `writable` False: used, never written."""
        folder = Path(workspace) / KERNELDEV_DIR
        entries: dict[str, list] = {}
        try:
            raw = json.loads((folder / SUMS_FILE).read_bytes())
            if isinstance(raw, dict) and raw.get("format") == FORMAT:
                files = raw.get("files")
                if isinstance(files, dict):
                    entries = files
        except (OSError, ValueError):
            pass  # no cache yet, or a damaged one: every file is hashed and it is rewritten
        began = None
        if writable:
            try:
                # Only a workspace kerneldev already keeps state in gets the file (never a stray
                # folder); stamping the folder is what reads the file system's clock.
                os.utime(folder)
                began = os.stat(folder)
            except OSError:
                pass
        return cls(folder, entries, began)

    def lookup(self, path: str, st: os.stat_result) -> str | None:
        """The remembered sha256 of `path` if `st` says its bytes cannot have changed."""
        entry = self._entries.get(path)
        if (
            isinstance(entry, list)
            and len(entry) == 2
            and entry[0] == stat_key(st)
            and isinstance(entry[1], str)
        ):
            return entry[1]
        return None

    def remember(
        self, path: str, before: os.stat_result, after: os.stat_result, sha256: str
    ) -> None:
        """Keep `sha256` for `path`, whose bytes were read between the two `stat`s."""
        if not settled(before, after, self._began):
            return  # changed while read, no clock, or stamped in the command's own tick
        key = stat_key(before)
        if self._entries.get(path) != [key, sha256]:
            self._entries[path] = [key, sha256]
            self._changed = True

    def save(self) -> None:
        """Write the cache if anything new was learnt; a failure only costs hashing next time."""
        if not self._changed:
            return
        workspace = self._folder.parent
        self._entries = {p: e for p, e in self._entries.items() if (workspace / p).exists()}
        data = json.dumps({"format": FORMAT, "files": self._entries}, separators=(",", ":"))
        temp = self._folder / f".{SUMS_FILE}.{os.getpid()}.tmp"
        try:
            temp.write_text(data, encoding="utf-8")
            os.replace(temp, self._folder / SUMS_FILE)
        except OSError:
            try:
                temp.unlink()
            except OSError:
                pass
        self._changed = False
