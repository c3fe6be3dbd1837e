"""Settling what a kept command wrote (`loop/settle.py`, `hashfiles.settle_live`): the sums of
the files a pull or push has just written are remembered after it, in the background, so the
next no-op does not read them again; a file changed meanwhile is never answered from them."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.over_agent import AgentTransport
from kerneldev.hostside import hashfiles
from kerneldev.hostside.hashfiles import clock_past, hash_tree, settle_live
from kerneldev.loop import settle, workspace
from kerneldev.loop.settle import settle_workspace
from kerneldev.loop.sum_cache import SUMS_FILE, SumCache
from kerneldev.loop.workspace import local_file
from kerneldev.paths import KERNELDEV_DIR
from tests.test_session import A, B, Env, kept, make_env, wait_for  # noqa: F401 - kept: a fixture


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rewrite_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    """As `cp -p` onto it would: new bytes, the old size and mtime (only ctime tells)."""
    st = path.stat()
    assert len(data) == st.st_size
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


# --- the clock ------------------------------------------------------------------------


def test_the_clock_is_past_a_write_once_a_stamp_is_later_than_its_ctime(tmp_path):
    (tmp_path / "a.py").write_bytes(b"v1\n")
    ctime = (tmp_path / "a.py").stat().st_ctime_ns
    stamp = clock_past(tmp_path, ctime)
    assert stamp is not None and stamp.st_ctime_ns > ctime
    assert clock_past(tmp_path, time.time_ns() + 10**12, limit=0.01) is None  # never: gives up


# --- the workspace --------------------------------------------------------------------


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / KERNELDEV_DIR).mkdir(parents=True)
    return ws


def _cached(ws: Path) -> dict:
    path = ws / KERNELDEV_DIR / SUMS_FILE
    return json.loads(path.read_text())["files"] if path.exists() else {}


def test_a_just_written_workspace_file_is_settled_and_its_sum_used(tmp_path):
    ws = _workspace(tmp_path)
    (ws / "a.py").write_bytes(b"v1\n")  # as a pull writes it: ctime is "now"
    settle_workspace(ws, ["a.py"])
    st = (ws / "a.py").stat()
    assert _cached(ws)["a.py"] == [hashfiles.stat_key(st), sha(b"v1\n")]
    rewrite_keeping_size_and_mtime(ws / "a.py", b"v2\n")  # after the settle: still seen
    sums = SumCache.load(ws)
    assert local_file(ws, "a.py", sums).sha256 == sha(b"v2\n")


def test_a_workspace_file_rewritten_before_the_settle_is_read_from_its_bytes(tmp_path):
    ws = _workspace(tmp_path)
    (ws / "a.py").write_bytes(b"v1\n")
    rewrite_keeping_size_and_mtime(ws / "a.py", b"v2\n")  # right after the command
    settle_workspace(ws, ["a.py"])
    assert _cached(ws)["a.py"][1] == sha(b"v2\n")
    assert local_file(ws, "a.py", SumCache.load(ws)).sha256 == sha(b"v2\n")


def test_a_workspace_file_rewritten_during_the_settle_is_not_remembered(tmp_path, monkeypatch):
    ws = _workspace(tmp_path)
    (ws / "a.py").write_bytes(b"v1\n")
    real_open = builtins.open

    def open_then_rewrite(path, *args, **kwargs):
        handle = real_open(path, *args, **kwargs)
        if Path(path).name == "a.py":
            time.sleep(0.01)  # a clock tick, so the rewrite's ctime is a new one
            rewrite_keeping_size_and_mtime(Path(path), b"v2\n")
        return handle

    monkeypatch.setattr(workspace, "open", open_then_rewrite, raising=False)
    settle_workspace(ws, ["a.py"])
    monkeypatch.undo()
    assert "a.py" not in _cached(ws)  # its stat moved while it was read
    assert local_file(ws, "a.py", SumCache.load(ws)).sha256 == sha(b"v2\n")


def test_settling_in_the_background_returns_at_once_and_records_later(tmp_path):
    ws = _workspace(tmp_path)
    (ws / "a.py").write_bytes(b"v1\n")
    assert settle.settle_workspace_later(ws, ["a.py"])
    entry = wait_for(lambda: _cached(ws).get("a.py"), what="the settle to record a.py")
    assert entry == [hashfiles.stat_key((ws / "a.py").stat()), sha(b"v1\n")]
    assert not settle.settle_workspace_later(ws, [])  # nothing written: no process


# --- the host's live files ------------------------------------------------------------


@pytest.fixture
def live_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kerneldev" / "live-sums"


def _live_entries(cache: Path) -> dict:
    # Not a settle's temporary file (renamed over the cache file once complete).
    found = list(cache.glob("*.json")) if cache.exists() else []
    return json.loads(found[0].read_text())["files"] if found else {}


def test_a_just_pushed_live_file_is_settled(tmp_path, live_cache):
    root = tmp_path / "live"
    root.mkdir()
    (root / "a.py").write_bytes(b"v1\n")  # as a push lands it
    rewrite_keeping_size_and_mtime(root / "a.py", b"v2\n")  # and someone right after it
    settle_live(str(root), ["a.py"])
    real = os.path.realpath(root / "a.py")
    assert _live_entries(live_cache)[real] == [hashfiles.stat_key(os.stat(real)), sha(b"v2\n")]
    rewrite_keeping_size_and_mtime(root / "a.py", b"v3\n")  # after it: still seen
    assert hash_tree(str(root), ["a.py"], sums=True)["files"][0]["sha256"] == sha(b"v3\n")


def test_a_settle_request_answers_at_once_and_the_sums_come_later(tmp_path, live_cache):
    root = tmp_path / "live"
    root.mkdir()
    (root / "a b[1].py").write_bytes(b"v1\n")  # a glob character: taken as a name
    assert hashfiles.answer({"root": str(root), "settle": ["a b[1].py"]}) == {"settling": True}
    real = os.path.realpath(root / "a b[1].py")
    entry = wait_for(lambda: _live_entries(live_cache).get(real), what="the host's settle")
    assert entry[1] == sha(b"v1\n")


# --- over the real sshd, through a kept session ---------------------------------------


@pytest.fixture
def env(kept, tmp_path, sshd_server, monkeypatch) -> Env:  # noqa: F811
    # These files are a few bytes: settled here whatever their size (see the size rule below).
    monkeypatch.setattr(settle, "SETTLE_MIN_BYTES", 0)
    made = make_env(tmp_path, sshd_server)
    kept.append(made)
    return made


def _diff(env: Env) -> dict:
    run = env.kd("diff", "--json")
    return {"exit": run.exit_code, "out": json.loads(run.stdout)}


def _settled_or_a_while(predicate) -> None:
    """Until `predicate()` (the settle recorded what it should), or a few seconds (it may
    rightly record nothing): the answers below must be right either way."""
    try:
        wait_for(predicate, timeout=5.0, what="the settle")
    except AssertionError:
        pass


def test_only_a_kept_sessions_transport_settles(env: Env):
    with open_transport(env.host, keep=False) as one_shot:
        assert not one_shot.settles_writes
    with open_transport(env.host) as through_session:
        assert through_session.settles_writes


def test_after_a_kept_pull_the_no_ops_answer_as_before_and_a_quick_rewrite_is_seen(env: Env):
    assert env.kd("pull").exit_code == 0  # cold: the workspace files are new
    ws_file = env.workspace / A
    # No command reads them after the pull: what the cache holds is the settle's.
    entry = wait_for(lambda: _cached(env.workspace).get(A), what="the pulled file's settle")
    assert entry == [hashfiles.stat_key(ws_file.stat()), sha(b"BLOCK = 64\n")]
    first = _diff(env)
    assert env.kd("pull").exit_code == 0
    assert _diff(env) == first
    (env.workspace / A).unlink()
    assert env.kd("pull").exit_code == 0
    assert _diff(env) == first  # at once after a pull: the settle may run beside it

    # A pull writes the file again, and the user rewrites it right after (same size, mtime).
    (env.root / A).write_bytes(b"BLOCK = 32\n")
    assert env.kd("pull").exit_code == 0
    rewrite_keeping_size_and_mtime(ws_file, b"BLOCK = 16\n")
    _settled_or_a_while(
        lambda: _cached(env.workspace).get(A, [None])[0] == hashfiles.stat_key(ws_file.stat())
    )
    entry = _cached(env.workspace).get(A)
    if entry is not None and entry[0] == hashfiles.stat_key(ws_file.stat()):
        assert entry[1] == sha(b"BLOCK = 16\n")
    seen = _diff(env)
    (kernel,) = [f for f in seen["out"]["files"] if f["path"] == A]
    assert (kernel["status"], kernel["workspace_sha256"]) == ("edited", sha(b"BLOCK = 16\n"))


def test_after_a_kept_push_a_live_rewrite_right_after_is_seen(env: Env):
    assert env.kd("pull").exit_code == 0
    (env.workspace / A).write_bytes(b"BLOCK = 128\n")
    assert env.kd("push", "--no-import-check").exit_code == 0
    live = env.root / A
    with open_transport(env.host, keep=False) as t:
        # No command reads the live file after the push: what the host records is the settle's.
        name = hashlib.sha256(os.path.realpath(env.root).encode()).hexdigest()[:32]
        folder = t.run('printf %s "${XDG_CACHE_HOME:-$HOME/.cache}"').stdout
        cache = Path(folder) / "kerneldev" / "live-sums" / f"{name}.json"

        def settled_entry():
            files = json.loads(cache.read_text())["files"] if cache.exists() else {}
            return files.get(os.path.realpath(live))

        entry = wait_for(settled_entry, what="the host to settle the pushed file")
        assert entry == [hashfiles.stat_key(live.stat()), sha(b"BLOCK = 128\n")]
    rewrite_keeping_size_and_mtime(live, b"BLOCK = 256\n")  # on the host, right after the push
    with open_transport(env.host, keep=False) as t:
        files, _ = t.hash_files(str(env.root), [A])
        assert files[0].sha256 == sha(b"BLOCK = 256\n")  # the live bytes, whatever was settled
    run = env.kd("push", "--no-import-check")
    assert run.exit_code != 0  # live changed since the push: refused, as without a session
    assert "changed" in run.stderr or "drift" in run.stderr


def test_what_a_command_wrote_is_settled_only_when_worth_a_round_trip(env: Env, monkeypatch):
    asked, settled = [], []
    monkeypatch.setattr(settle, "settle_workspace_later", lambda ws, paths: asked.append(paths))
    monkeypatch.setattr(
        AgentTransport, "settle_live", lambda self, root, paths: settled.append(paths)
    )
    monkeypatch.setattr(settle, "SETTLE_MIN_BYTES", 23)  # the two files are 11 + 11 bytes
    assert env.kd("pull").exit_code == 0
    assert asked == []
    for path in (A, B):
        (env.workspace / path).unlink()
    monkeypatch.setattr(settle, "SETTLE_MIN_BYTES", 22)
    assert env.kd("pull").exit_code == 0
    assert [sorted(paths) for paths in asked] == [sorted([A, B])]

    monkeypatch.setattr(settle, "SETTLE_MIN_BYTES", 13)
    (env.workspace / A).write_bytes(b"BLOCK = 128\n")  # 12 bytes land
    assert env.kd("push", "--no-import-check").exit_code == 0
    assert settled == []
    (env.workspace / A).write_bytes(b"BLOCK = 1024\n")  # 13 bytes land
    assert env.kd("push", "--no-import-check").exit_code == 0
    assert settled == [[A]]
