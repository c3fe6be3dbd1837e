"""Local files written whole or not at all: a temporary file in the same folder, then a rename.

The one implementation for this machine's files (the workspace, the state file, and the
"host" of `LocalTransport`). The bench harness (`kernels/dsv4_bench.py`) keeps its own few
lines: it runs on the host with the standard library only.
"""

from __future__ import annotations

import io
import os
import queue
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from kerneldev.hostside.receivefiles import discard
from kerneldev.paths import TEMP_MARK

CHUNK = 1 << 20  # bytes per read/write when streaming
# A file name is at most 255 bytes (NAME_MAX) and a temporary name adds about 30 to its
# target's, so the target's part is cut to this many bytes (leftovers are found by the mark).
TEMP_STEM_BYTES = 200


def temp_stem(target_name: str) -> str:
    """`target_name` as it goes into its temporary file's name: cut to `TEMP_STEM_BYTES`
    UTF-8 bytes on a character boundary, so that a long (legal) name still gets one."""
    raw = target_name.encode("utf-8", "surrogateescape")
    if len(raw) <= TEMP_STEM_BYTES:
        return target_name
    return raw[:TEMP_STEM_BYTES].decode("utf-8", "ignore")


def temp_name_prefix(target_name: str) -> str:
    """Prefix of the temporary file written next to `target_name` before the rename."""
    return f".{temp_stem(target_name)}{TEMP_MARK}"


def write_bytes_atomic(
    path: Path | str,
    data: bytes,
    mode: int | None = None,
    *,
    owner: tuple[int, int] | None = None,
) -> None:
    """Write `data` to `path` so that a reader sees the old or the new file, never half of one.

    Creates the parent folders; `mode` sets the permission bits (else mkstemp's 0600); `owner`
    (uid, gid) is given to the new file where the user may (a file replaced as root keeps its
    owner). The bytes are on disk before the name points at them, and the rename itself is
    made durable where the file system allows. Raises OSError; the temporary file never
    outlives a failure.
    """
    write_stream_atomic(path, io.BytesIO(data), mode, owner=owner)


def write_stream_atomic(
    path: Path | str,
    source: BinaryIO,
    mode: int | None = None,
    *,
    owner: tuple[int, int] | None = None,
    on_chunk: Callable[[int], None] | None = None,
    before_rename: Callable[[], None] | None = None,
    sync_folder: bool = True,
) -> None:
    """`write_bytes_atomic` from a binary stream, copied in 1 MiB chunks (memory stays flat
    for any size). `on_chunk(n)` runs after each chunk (progress; it may raise to stop, e.g.
    on Ctrl-C); `before_rename()` runs last (a compare-and-swap check; raising leaves `path`
    untouched). The temporary file never outlives a failure. `sync_folder=False`: the caller
    makes the rename durable itself (`sync_folders`, once per folder for many files)."""
    path = Path(path)
    fd, tmp = write_temp(path, source, mode, owner=owner, on_chunk=on_chunk)
    try:
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise
    if sync_folder:
        _fsync_dir(path.parent)


def write_temp(
    path: Path,
    source: BinaryIO,
    mode: int | None = None,
    *,
    owner: tuple[int, int] | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> tuple[int, str]:
    """`write_stream_atomic`'s first half: `source` written to a new temporary file next to
    `path` (its folders created), its bytes handed to the kernel but not yet synced. Returns
    the file's open descriptor and its name, for the caller to sync, close and rename (or
    `discard`); the temporary file never outlives a failure here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_name_prefix(path.name), dir=path.parent)
    try:
        _give_owner(fd, owner)
        if mode is not None:
            os.fchmod(fd, mode)
        for chunk in iter(lambda: source.read(CHUNK), b""):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            if on_chunk is not None:
                on_chunk(len(chunk))
    except BaseException:
        os.close(fd)
        discard(tmp)
        raise
    return fd, tmp


class SyncedRenames:
    """Temporary files (`write_temp`) made durable and renamed over their targets by a few
    threads: each file's bytes are still on disk (fsync) before its name points at them, as
    `write_stream_atomic` makes them, but the fsyncs of many small files overlap instead of
    waiting one after another for the file system's journal (ext4 commits concurrent fsyncs
    together: 100 files of 13 KB 0.3-0.7 s one by one, 0.05-0.07 s with 8 threads, measured
    in docs/benchmarks.md, issue 23 round 6).

    `add(fd, tmp, path, key)` hands one over (the descriptor is closed here); `wait()` returns
    once every file handed over is renamed or dropped: the keys of those renamed, and the first
    error as (target, OSError) of a sync or a rename (that file's temporary file is removed).
    A file handed over is always finished, also when the caller stops early (`wait` in its
    `finally`)."""

    def __init__(self, workers: int = 8) -> None:
        self.workers = max(1, workers)
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.landed: list = []
        self.errors: list[tuple[Path, OSError]] = []

    def add(self, fd: int, tmp: str, path: Path, key) -> None:
        if len(self.threads) < self.workers:
            thread = threading.Thread(target=self._work, name="synced-renames", daemon=True)
            thread.start()
            self.threads.append(thread)
        self.jobs.put((fd, tmp, path, key))

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fd, tmp, path, key = job
            try:
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            except OSError as err:
                discard(tmp)
                with self.lock:
                    self.errors.append((path, err))
                continue
            with self.lock:
                self.landed.append(key)

    def wait(self) -> tuple[list, tuple[Path, OSError] | None]:
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            thread.join()
        self.threads = []
        return list(self.landed), (self.errors[0] if self.errors else None)


def sync_folders(folders: set[Path]) -> None:
    """Make the renames made in these folders durable (`write_stream_atomic`'s last step, for
    a batch of files: one fsync per folder instead of one per file)."""
    for folder in sorted(folders):
        _fsync_dir(folder)


def _give_owner(fd: int, owner: tuple[int, int] | None) -> None:
    # Others than root cannot chown; then the new file simply belongs to them.
    if owner is None:
        return
    current = os.fstat(fd)
    if (current.st_uid, current.st_gid) == owner:
        return
    try:
        os.fchown(fd, *owner)
    except PermissionError:
        pass


def _fsync_dir(folder: Path) -> None:
    # Not every file system allows fsync on a folder, so failures are ignored.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
