"""Local files written whole or not at all: a temporary file in the same folder, then a rename.

The one implementation for this machine's files (the workspace, the state file, and the
"host" of `LocalTransport`). The bench harness (`kernels/dsv4_bench.py`) keeps its own few
lines: it runs on the host with the standard library only.
"""

from __future__ import annotations

import io
import os
import tempfile
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_name_prefix(path.name), dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            _give_owner(f.fileno(), owner)
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            for chunk in iter(lambda: source.read(CHUNK), b""):
                f.write(chunk)
                if on_chunk is not None:
                    on_chunk(len(chunk))
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise
    if sync_folder:
        _fsync_dir(path.parent)


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
