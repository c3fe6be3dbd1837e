"""The workspace's remembered sums (`loop/sum_cache.py`): a hit only where the file's bytes
cannot have changed, and the commands' answers unchanged by it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

from kerneldev.hosts.transport.local import LocalTransport
from kerneldev.loop import drift, sync
from kerneldev.loop.sum_cache import SUMS_FILE, SumCache
from kerneldev.loop.workspace import local_file, sha256_bytes
from kerneldev.paths import KERNELDEV_DIR
from tests.localhost import local_host

TICK = 0.05  # s: longer than a file system's timestamp tick (a few ms), so a write is "before"


def _workspace(tmp_path: Path, text: str = "v1\n") -> Path:
    ws = tmp_path / "ws"
    (ws / KERNELDEV_DIR).mkdir(parents=True)
    (ws / "a.py").write_text(text)
    time.sleep(TICK)
    return ws


def _cached(ws: Path) -> dict:
    return json.loads((ws / KERNELDEV_DIR / SUMS_FILE).read_text())["files"]


def _hash_once(ws: Path, path: str = "a.py"):
    sums = SumCache.load(ws)
    found = local_file(ws, path, sums)
    sums.save()
    return found


def test_a_settled_file_is_remembered_and_its_sum_used(tmp_path):
    ws = _workspace(tmp_path)
    assert _hash_once(ws).sha256 == sha256_bytes(b"v1\n")
    assert list(_cached(ws)) == ["a.py"]
    # The cache is what answers now: a planted sum under the file's own stat key comes back.
    raw = json.loads((ws / KERNELDEV_DIR / SUMS_FILE).read_text())
    raw["files"]["a.py"][1] = "0" * 64
    (ws / KERNELDEV_DIR / SUMS_FILE).write_text(json.dumps(raw))
    assert _hash_once(ws).sha256 == "0" * 64


def test_a_rewrite_with_the_same_size_and_mtime_is_hashed_again(tmp_path):
    ws = _workspace(tmp_path)
    _hash_once(ws)
    st = (ws / "a.py").stat()
    (ws / "a.py").write_text("v2\n")  # same size, in place (same inode)
    os.utime(ws / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back, as cp -p does
    assert (ws / "a.py").stat().st_mtime_ns == st.st_mtime_ns
    assert _hash_once(ws).sha256 == sha256_bytes(b"v2\n")  # ctime moved: not the old sum


def test_a_file_stamped_in_the_commands_own_tick_is_not_remembered(tmp_path):
    ws = _workspace(tmp_path)
    sums = SumCache.load(ws)
    st = (ws / "a.py").stat()
    began = (ws / KERNELDEV_DIR).stat()
    # As if the file's last write had the same stamp as the command's start (one clock tick).
    fields = {k: getattr(st, k) for k in dir(st) if k.startswith("st_")}
    same_tick = SimpleNamespace(**{**fields, "st_ctime_ns": began.st_ctime_ns})
    sums.remember("a.py", same_tick, same_tick, sha256_bytes(b"v1\n"))
    sums.save()
    assert not (ws / KERNELDEV_DIR / SUMS_FILE).exists()
    sums.remember("a.py", st, st, sha256_bytes(b"v1\n"))  # written a tick before: kept
    sums.save()
    assert list(_cached(ws)) == ["a.py"]


def test_a_file_changed_while_it_was_read_is_not_remembered(tmp_path):
    ws = _workspace(tmp_path)
    sums = SumCache.load(ws)
    before = (ws / "a.py").stat()
    time.sleep(0.01)
    (ws / "a.py").write_text("v2, longer\n")
    sums.remember("a.py", before, (ws / "a.py").stat(), sha256_bytes(b"v1\n"))
    sums.save()
    assert not (ws / KERNELDEV_DIR / SUMS_FILE).exists()


def test_a_damaged_cache_is_ignored_and_rewritten(tmp_path):
    ws = _workspace(tmp_path)
    for damage in ('{"format": 1, "files": {"a.py": [1, 2, 3]}}', "not json", '{"format": 99}'):
        (ws / KERNELDEV_DIR / SUMS_FILE).write_text(damage)
        assert _hash_once(ws).sha256 == sha256_bytes(b"v1\n")
        assert _cached(ws)["a.py"][1] == sha256_bytes(b"v1\n")


def test_no_cache_file_outside_a_kerneldev_workspace(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "a.py").write_text("v1\n")
    assert _hash_once(folder).sha256 == sha256_bytes(b"v1\n")
    assert not (folder / KERNELDEV_DIR).exists()


def test_entries_of_deleted_files_are_dropped_on_the_next_write(tmp_path):
    ws = _workspace(tmp_path)
    (ws / "b.py").write_text("b\n")
    time.sleep(TICK)
    _hash_once(ws, "b.py")
    (ws / "b.py").unlink()
    _hash_once(ws, "a.py")
    assert list(_cached(ws)) == ["a.py"]


def _pulled(tmp_path: Path):
    """A live tree of one file pulled into a workspace over the local transport, a tick ago."""
    root = tmp_path / "live"
    (root / "k").mkdir(parents=True)
    (root / "k" / "a.py").write_text("a v1\n")
    host = local_host(root, tmp_path / "ws")
    transport = LocalTransport(host)
    sync.pull(transport, host)
    time.sleep(TICK)
    return root, host, transport


def test_diff_and_push_see_an_edit_that_keeps_size_and_mtime(tmp_path):
    """End to end over the local transport: the cache never hides an edit from drift or push."""
    root, host, transport = _pulled(tmp_path)
    edited = Path(host.workspace) / "k" / "a.py"
    assert {f.path: f.status for f in drift.compute_drift(transport, host).files} == {
        "k/a.py": drift.IN_SYNC
    }
    assert "k/a.py" in _cached(Path(host.workspace))
    st = edited.stat()
    edited.write_text("a v2\n")
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))
    statuses = {f.path: f.status for f in drift.compute_drift(transport, host).files}
    assert statuses == {"k/a.py": drift.EDITED}
    sync.push(transport, host)
    assert (root / "k" / "a.py").read_text() == "a v2\n"


def test_a_file_whose_mtime_was_set_ahead_is_remembered_by_its_ctime(tmp_path):
    ws = _workspace(tmp_path)
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(ws / "a.py", ns=(ahead, ahead))  # `touch -d` into the future: ctime is still now
    time.sleep(TICK)
    assert _hash_once(ws).sha256 == sha256_bytes(b"v1\n")
    assert list(_cached(ws)) == ["a.py"]


def test_a_dry_run_push_writes_no_cache(tmp_path):
    root, host, transport = _pulled(tmp_path)
    (Path(host.workspace) / "k" / "a.py").write_text("a v2\n")
    time.sleep(TICK)
    folder = Path(host.workspace) / KERNELDEV_DIR
    before = sorted(folder.iterdir()), folder.stat().st_mtime_ns
    plan = sync.push(transport, host, dry_run=True)
    assert [f.path for f in plan.uploads] == ["k/a.py"]
    assert (sorted(folder.iterdir()), folder.stat().st_mtime_ns) == before
    drift.compute_drift(transport, host)  # a read-only command does fill it
    assert "k/a.py" in _cached(Path(host.workspace))
