"""Settling what a kept command wrote: its sums remembered after it, in the background.

A file that a command has just written has a ctime of "now", so neither the workspace's sums
cache (`sum_cache.py`) nor the host's (`hashfiles.LiveSums`) may remember its sum yet (the
racy-clean rule, `hashfiles.settled`): the next command would read it once more (a 50 MB
file: 40-90 ms of a no-op). With a kept session (`Transport.settles_writes`), a command that
wrote files leaves a detached process behind (a fork: no interpreter start) that waits until
the file system's clock has moved past their last change, hashes them again from their bytes
and records them under the same rule, as the next command's own read would have. A file changed
meanwhile is either read afresh or, changed during the read or in the stamp's tick, not
remembered; nothing is answered from the cache that its `stat` does not vouch for. The cache is
written as always (a temporary file, then a rename), so a command running beside it loses at
most the other's new entries. One-shot commands do not settle, nor does a command that wrote
less than `SETTLE_MIN_BYTES` in all (see there).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path

from kerneldev.hostside.hashfiles import clock_past, detach, newest_change
from kerneldev.loop.sum_cache import SumCache
from kerneldev.loop.workspace import local_file
from kerneldev.paths import KERNELDEV_DIR

# Below this many bytes in all, the next command reads back what a command wrote in a few
# milliseconds (sha256 here: ~1-2 ms per MB), less than settling it costs: a kept push's settle
# is one more round trip to the host (50 ms and more on a real GPU box), a pull's a fork.
# Kernel sources are far below it; a 50 MB file (40-90 ms to read back) is above.
SETTLE_MIN_BYTES = 8 << 20


def worth_settling(paths: Iterable[str], sizes: dict[str, int]) -> bool:
    """Whether the files `paths` (their sizes in `sizes`) are worth settling."""
    return sum(sizes.get(path, 0) for path in paths) >= SETTLE_MIN_BYTES


def settle_workspace(workspace: Path, paths: list[str]) -> None:
    """Remember the sums of the workspace files `paths` once the clock passed their writes."""
    try:
        newest = newest_change(str(workspace), paths)
        if clock_past(Path(workspace) / KERNELDEV_DIR, newest) is None:
            return
    except OSError:
        return
    sums = SumCache.load(workspace)  # stamps "now" again: after every write above
    for path in paths:
        try:
            local_file(workspace, path, sums)
        except OSError:
            continue
    sums.save()


def settle_workspace_later(workspace: Path, paths: list[str]) -> bool:
    """`settle_workspace` in a detached process; True when one was started."""
    if not paths:
        return False
    with warnings.catch_warnings():  # Python 3.12+ warns at a fork beside threads: nothing
        warnings.simplefilter("ignore", DeprecationWarning)  # of theirs runs in the fork
        return detach(lambda: settle_workspace(workspace, list(paths)))
