"""The host's remembered sums of live files (`hostside/hashfiles.py`, `LiveSums`): a sum is
reused only while the file's `stat` shows its bytes unchanged, the cache lives in the host
user's cache folder (never under a live root), and over a real sshd the answers are what a
read of every byte would give."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.over_agent import AgentTransport
from kerneldev.hosts.transport.ssh import start_agent
from kerneldev.hosts.transport.ssh_connection import SSHConnection
from kerneldev.hostside.hashfiles import LiveSums, hash_tree
from tests.sshutil import ssh_host

TICK = 0.05  # s: longer than a file system's timestamp tick (a few ms), so a write is "before"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """The folder `LiveSums` keeps its files in, for hashing in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kerneldev" / "live-sums"


def _live(tmp_path: Path, text: str = "v1\n") -> Path:
    root = tmp_path / "live"
    root.mkdir()
    (root / "a.py").write_text(text)
    time.sleep(TICK)
    return root


def _hash(root: Path, pattern: str = "a.py") -> str:
    return hash_tree(str(root), [pattern], sums=True)["files"][0]["sha256"]


def _cache_file(cache: Path) -> Path:
    (found,) = cache.iterdir()
    return found


def _entries(cache: Path) -> dict:
    return json.loads(_cache_file(cache).read_text())["files"]


def test_a_settled_live_file_is_remembered_and_its_sum_used(tmp_path, cache):
    root = _live(tmp_path)
    assert _hash(root) == sha(b"v1\n")
    assert list(_entries(cache)) == [os.path.realpath(root / "a.py")]
    # The cache answers now: a sum planted under the file's own stat key comes back.
    raw = json.loads(_cache_file(cache).read_text())
    raw["files"][os.path.realpath(root / "a.py")][1] = "0" * 64
    _cache_file(cache).write_text(json.dumps(raw))
    assert _hash(root) == "0" * 64


def test_a_live_rewrite_with_the_same_size_and_mtime_is_hashed_again(tmp_path, cache):
    root = _live(tmp_path)
    _hash(root)
    st = (root / "a.py").stat()
    (root / "a.py").write_text("v2\n")  # same size, in place (same inode)
    os.utime(root / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p does
    assert _hash(root) == sha(b"v2\n")  # ctime moved: not the old sum


def test_a_live_file_stamped_in_the_requests_own_tick_is_not_remembered(tmp_path, cache):
    root = _live(tmp_path)
    sums = LiveSums(os.path.realpath(root))
    sums.begin()
    st = (root / "a.py").stat()
    fields = {k: getattr(st, k) for k in dir(st) if k.startswith("st_")}
    same_tick = SimpleNamespace(**{**fields, "st_ctime_ns": sums.began.st_ctime_ns})
    real = os.path.realpath(root / "a.py")
    sums.remember(real, same_tick, same_tick, sha(b"v1\n"))
    sums.save()
    assert not cache.exists() or not list(cache.iterdir())
    sums.remember(real, st, st, sha(b"v1\n"))  # written a tick before the stamp: kept
    sums.save()
    assert list(_entries(cache)) == [real]


def test_a_live_file_changed_while_it_was_read_is_not_remembered(tmp_path, cache):
    root = _live(tmp_path)
    sums = LiveSums(os.path.realpath(root))
    sums.begin()
    before = (root / "a.py").stat()
    time.sleep(0.01)
    (root / "a.py").write_text("v2, longer\n")
    sums.remember(os.path.realpath(root / "a.py"), before, (root / "a.py").stat(), sha(b"v1\n"))
    sums.save()
    assert not list(cache.iterdir())


def test_a_damaged_cache_is_ignored_and_rewritten(tmp_path, cache):
    root = _live(tmp_path)
    _hash(root)
    real = os.path.realpath(root / "a.py")
    for damage in (f'{{"format": 1, "files": {{"{real}": [1, 2]}}}}', "not json", '{"format": 9}'):
        _cache_file(cache).write_text(damage)
        assert _hash(root) == sha(b"v1\n")
        assert _entries(cache)[real][1] == sha(b"v1\n")


def test_the_cache_is_private_and_nothing_is_written_under_the_live_root(tmp_path, cache):
    root = _live(tmp_path)
    assert _hash(root) == sha(b"v1\n")
    assert sorted(p.name for p in root.iterdir()) == ["a.py"]
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


def test_without_sums_every_byte_is_read_and_nothing_kept(tmp_path, cache):
    root = _live(tmp_path)
    assert hash_tree(str(root), ["a.py"])["files"][0]["sha256"] == sha(b"v1\n")
    assert not cache.exists()


@pytest.fixture(params=["ssh", "agent"])
def ssh_live(request, sshd_server, tmp_path, isolated_home):
    """(transport factory, live root, the host's LiveSums folder) over the real sshd; the
    factory takes `live_sums`."""
    root = tmp_path / "live"
    root.mkdir()
    config = ssh_host(sshd_server, tmp_path)
    opened = []

    def transport(live_sums: bool = True):
        host = dataclasses.replace(config, live_sums=live_sums)
        if request.param == "agent":
            connection = SSHConnection(host)
            request.addfinalizer(connection.close)
            client, _ = start_agent(connection, ["python3"])
            t = AgentTransport(client, host, host.name)
        else:
            t = open_transport(host, keep=False)
        opened.append(t)
        return t

    yield transport, root
    for t in opened:
        t.close()


def _host_cache_file(t, root: Path) -> str:
    """The path of `root`'s cache file on the host, asked of the host's own environment."""
    name = hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:32]
    folder = t.run('printf %s "${XDG_CACHE_HOME:-$HOME/.cache}"').stdout
    return f"{folder}/kerneldev/live-sums/{name}.json"


def test_over_ssh_a_live_edit_that_keeps_size_and_mtime_is_seen(ssh_live):
    transport, root = ssh_live
    (root / "a.py").write_bytes(b"v1\n")
    (root / "b.py").write_bytes(b"b" * 300_000)
    time.sleep(TICK)
    t = transport()
    first, _ = t.hash_files(str(root), ["*.py"])
    assert [(f.path, f.sha256) for f in first] == [
        ("a.py", sha(b"v1\n")),
        ("b.py", sha(b"b" * 300_000)),
    ]
    kept = json.loads(t.read_bytes(_host_cache_file(t, root)))["files"]
    assert sorted(kept) == [os.path.realpath(root / n) for n in ("a.py", "b.py")]
    st = (root / "a.py").stat()
    (root / "a.py").write_bytes(b"v2\n")
    os.utime(root / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    again, _ = t.hash_files(str(root), ["*.py"])
    assert [f.sha256 for f in again] == [sha(b"v2\n"), sha(b"b" * 300_000)]


def test_live_sums_false_reads_every_byte_and_keeps_nothing(ssh_live):
    transport, root = ssh_live
    (root / "a.py").write_bytes(b"v1\n")
    time.sleep(TICK)
    t = transport(live_sums=False)
    files, _ = t.hash_files(str(root), ["a.py"])
    assert files[0].sha256 == sha(b"v1\n")
    assert t.run(f"test -e '{_host_cache_file(t, root)}'").exited == 1
