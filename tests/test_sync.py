"""Core-level behaviour of pull/push/rollback/drift/service that the CLI tests do not reach:
failures midway, created files, a corrupt state file, the status table itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerneldev.config import HostConfig, ServiceConfig
from kerneldev.errors import (
    ConnectionLostError,
    NothingToRollBackError,
    RefusedError,
    ServiceError,
    TransferError,
    UsageError,
)
from kerneldev.hosts.transport.local import LocalTransport
from kerneldev.loop import drift, sync, workspace
from kerneldev.loop.state import StateError, load_state, state_path
from kerneldev.service import restart as service
from tests.localhost import local_host


@pytest.fixture
def host(tmp_path) -> HostConfig:
    root = tmp_path / "live"
    (root / "k").mkdir(parents=True)
    for name in ("a.py", "b.py", "c.py"):
        (root / "k" / name).write_text(f"{name} v1\n")
    return local_host(root, tmp_path / "ws", files=("k/*.py", "k/new.py"))


@pytest.fixture
def transport(host) -> LocalTransport:
    return LocalTransport(host)


class FailingTransport(LocalTransport):
    """Fails the n-th upload of a live file: what a dropped connection midway looks like."""

    def __init__(self, host, fail_on: str) -> None:
        super().__init__(host)
        self.fail_on = fail_on

    def put_file(self, path, source, **kwargs):
        if path.endswith(self.fail_on) and "/backups/" not in path:
            raise TransferError(f"cannot write {path}: connection lost")
        super().put_file(path, source, **kwargs)


@pytest.mark.parametrize(
    ("live", "workspace", "base", "status"),
    [
        ("x", "x", "x", drift.IN_SYNC),
        ("x", "x", None, drift.IN_SYNC),
        ("x", "y", "x", drift.EDITED),
        ("y", "x", "x", drift.DRIFTED),
        ("y", "z", "x", drift.CONFLICT),
        ("y", "z", None, drift.CONFLICT),
        ("x", None, "x", drift.NOT_PULLED),
        (None, "x", "x", drift.MISSING_LIVE),
    ],
)
def test_status_table(live, workspace, base, status):
    assert drift.classify(live, workspace, base)[0] == status


def test_partial_push_records_what_landed(host, transport):
    sync.pull(transport, host)
    ws = Path(host.workspace)
    for name in ("a.py", "b.py", "c.py"):
        (ws / "k" / name).write_text(f"{name} v2\n")
    with pytest.raises(sync.PartialDeployError) as caught:
        sync.push(FailingTransport(host, "k/b.py"), host)
    err = caught.value
    assert err.deployed == ["k/a.py"] and err.not_deployed == ["k/b.py", "k/c.py"]
    assert "Deployed: k/a.py" in err.message and "Not deployed: k/b.py, k/c.py" in err.message
    state = load_state(ws)
    record = state.deploys[-1]
    assert record.complete is False and [f.path for f in record.files] == ["k/a.py"]
    live = Path(host.root)
    assert (live / "k" / "a.py").read_text() == "a.py v2\n"
    assert (live / "k" / "b.py").read_text() == "b.py v1\n"

    # The diff tells the truth afterwards, and rollback undoes exactly what landed.
    report = drift.compute_drift(transport, host)
    assert {f.path: f.status for f in report.files}["k/b.py"] == drift.EDITED
    sync.rollback(transport, host)
    assert (live / "k" / "a.py").read_text() == "a.py v1\n"


class AnswerLostTransport(LocalTransport):
    """Lands `lost_on` on the host, then loses the connection before saying so: what a cut
    between the host's rename and its answer looks like."""

    def __init__(self, host, lost_on: str) -> None:
        super().__init__(host)
        self.lost_on = lost_on

    def put_file(self, path, source, **kwargs):
        super().put_file(path, source, **kwargs)
        if path.endswith(self.lost_on) and "/backups/" not in path:
            raise ConnectionLostError("the connection to host 'h' was lost while uploading")


def test_a_push_whose_answer_was_lost_says_not_confirmed_not_not_deployed(host, transport):
    sync.pull(transport, host)
    ws = Path(host.workspace)
    for name in ("a.py", "b.py", "c.py"):
        (ws / "k" / name).write_text(f"{name} v2\n")
    with pytest.raises(sync.PartialDeployError) as caught:
        sync.push(AnswerLostTransport(host, "k/b.py"), host)
    err = caught.value
    assert err.tally.unconfirmed and err.tally.not_deployed == ("k/b.py", "k/c.py")
    assert "Deployed: k/a.py" in err.message and "Not confirmed: k/b.py, k/c.py" in err.message
    assert "Not deployed" not in err.message
    assert err.report["unconfirmed"] is True
    # b.py did land; the diff the message points to tells the two apart.
    statuses = {f.path: f.status for f in drift.compute_drift(transport, host).files}
    assert statuses["k/b.py"] == drift.IN_SYNC and statuses["k/c.py"] == drift.EDITED


def test_a_workspace_whose_state_cannot_be_written_changes_nothing_on_the_host(host, transport):
    """The deploy's record goes into the workspace's state after the upload: a workspace that
    cannot take it (read-only, or here its state lock not a writable file) is refused before
    anything lands, rather than deploying bytes it then cannot record."""
    sync.pull(transport, host)
    ws, live = Path(host.workspace), Path(host.root)
    (ws / "k" / "a.py").write_text("a.py v2\n")
    sync.push(transport, host)  # a deploy to roll back below
    (ws / "k" / "a.py").write_text("a.py v3\n")
    lock = state_path(ws).parent / "state.lock"
    lock.unlink(missing_ok=True)
    lock.mkdir()
    before = sorted(p.relative_to(live) for p in live.rglob("*"))
    with pytest.raises(StateError, match="push refused, nothing changed on the host"):
        sync.push(transport, host)
    with pytest.raises(StateError, match="rollback refused, nothing changed on the host"):
        sync.rollback(transport, host)
    assert (live / "k" / "a.py").read_text() == "a.py v2\n"
    assert sorted(p.relative_to(live) for p in live.rglob("*")) == before
    lock.rmdir()
    sync.push(transport, host)
    assert (live / "k" / "a.py").read_text() == "a.py v3\n"


def test_created_file_is_removed_by_rollback_and_back_on_redo(host, transport):
    sync.pull(transport, host)
    new = Path(host.workspace) / "k" / "new.py"
    new.write_text("brand new\n")
    report = drift.compute_drift(transport, host)
    assert {f.path: f.status for f in report.files}["k/new.py"] == drift.MISSING_LIVE
    result = sync.push(transport, host)
    assert [(f.path, f.action) for f in result.uploads] == [("k/new.py", "create")]
    live = Path(host.root) / "k" / "new.py"
    assert live.read_text() == "brand new\n"

    undo = sync.rollback(transport, host)
    assert undo.files[0].new_sha256 is None and not live.exists()
    sync.rollback(transport, host)  # the rollback of the rollback
    assert live.read_text() == "brand new\n"


def test_file_deleted_on_host_is_refused(host, transport):
    sync.pull(transport, host)
    (Path(host.root) / "k" / "c.py").unlink()
    plan = sync.push(transport, host, dry_run=True)
    assert [f.path for f in plan.refused] == ["k/c.py"]
    with pytest.raises(RefusedError, match="k/c.py"):
        sync.push(transport, host)


def test_rollback_refuses_when_host_changed_since(host, transport):
    sync.pull(transport, host)
    (Path(host.workspace) / "k" / "a.py").write_text("mine\n")
    sync.push(transport, host)
    (Path(host.root) / "k" / "a.py").write_text("someone else\n")
    with pytest.raises(RefusedError, match="k/a.py"):
        sync.rollback(transport, host)
    sync.rollback(transport, host, force=True)
    assert (Path(host.root) / "k" / "a.py").read_text() == "a.py v1\n"


def test_nothing_to_roll_back(host, transport):
    sync.pull(transport, host)
    with pytest.raises(NothingToRollBackError, match="nothing to roll back"):
        sync.rollback(transport, host)


def test_corrupt_state_is_a_clear_error(host, transport):
    sync.pull(transport, host)
    path = state_path(Path(host.workspace))
    path.write_text("{ not json")
    with pytest.raises(StateError) as caught:
        drift.compute_drift(transport, host)
    assert str(path) in caught.value.message and caught.value.hint
    path.write_text(json.dumps({"version": 1, "files": {"k/a.py": {"nope": 1}}}))
    with pytest.raises(StateError, match="corrupt"):
        sync.pull(transport, host)


def test_state_written_atomically_and_readable(host, transport):
    sync.pull(transport, host)
    folder = state_path(Path(host.workspace)).parent
    # No temporary files left behind (state.lock is the lock for read-modify-write).
    assert sorted(p.name for p in folder.iterdir()) == ["state.json", "state.lock"]
    state = load_state(Path(host.workspace))
    assert set(state.files) == {"k/a.py", "k/b.py", "k/c.py"}
    assert state.files["k/a.py"].synced_by == "pull"


def test_resolve_paths(host, tmp_path, monkeypatch):
    ws = Path(host.workspace)
    monkeypatch.chdir(tmp_path)
    assert workspace.resolve_paths(host, None) is None
    assert workspace.resolve_paths(host, ["k/a.py", "./k/a.py", str(ws / "k/b.py")]) == [
        "k/a.py",
        "k/b.py",
    ]
    assert workspace.resolve_paths(host, [f"{host.root}/k/c.py"]) == ["k/c.py"]
    assert workspace.resolve_paths(host, ["ws/k/a.py"]) == ["k/a.py"]  # relative to cwd, in ws
    for bad in ("k/sub/a.py", "../x.py", "/etc/passwd", "k/.hidden.py", "k/a.txt"):
        with pytest.raises(UsageError):
            workspace.resolve_paths(host, [bad])


def test_rollback_to_an_ambiguous_or_empty_prefix_is_refused(host, transport):
    """`--to` takes a unique prefix: one that matches several deploys (or an empty one) must
    not quietly pick the oldest and undo everything after it."""
    sync.pull(transport, host)
    ws = Path(host.workspace)
    ids = []
    for version in ("v2", "v3"):
        (ws / "k" / "a.py").write_text(f"a.py {version}\n")
        ids.append(sync.push(transport, host).deploy_id)
    shared = ids[0][:4]
    assert ids[1].startswith(shared)
    for prefix in (shared, ""):
        with pytest.raises(UsageError, match="deploy"):
            sync.rollback(transport, host, to=prefix, dry_run=True)
    assert (Path(host.root) / "k" / "a.py").read_text() == "a.py v3\n"
    assert sync.rollback(transport, host, to=ids[0], dry_run=True).rolls_back == ids[0]


def test_restart_timeout_carries_logs(transport):
    svc = ServiceConfig(restart="true", health="exit 1", timeout=0.3, logs="echo last words")
    ticks = []
    with pytest.raises(service.UnhealthyError) as caught:
        service.restart(transport, svc, on_tick=lambda e, last: ticks.append(last), interval=0.05)
    assert "last words" in caught.value.logs and ticks and ticks[-1] == "exit 1"


def test_ctrl_c_stops_the_wait_for_health(transport):
    """Ctrl-C while the service is not healthy yet ends the wait at once (exit 130), not
    after `service.timeout`."""
    import os
    import signal

    from kerneldev import interrupt

    # a URL nobody answers on: the poll itself never looks at the signal
    svc = ServiceConfig(restart="true", health="http://127.0.0.1:9/health", timeout=600)
    naps = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # as the terminal sends it
        assert len(naps) < 5, "the wait for health went on after Ctrl-C"

    with pytest.raises(interrupt.Interrupted) as caught, interrupt.deferred_signals():
        service.restart(transport, svc, interval=0.01, sleep=sleep)
    assert caught.value.exit_code == 130 and len(naps) == 1


def test_restart_requires_config(transport):
    with pytest.raises(UsageError):
        service.restart(transport, None)
    with pytest.raises(ServiceError, match="exited 2"):
        service.restart(transport, ServiceConfig(restart="exit 2"))


def test_demo_refuses_a_folder_with_files(tmp_path):
    from kerneldev.sandbox.demo import run_demo

    (tmp_path / "something").write_text("mine")
    with pytest.raises(UsageError, match="not an empty folder"):
        run_demo(tmp_path)
    assert (tmp_path / "something").read_text() == "mine"


def test_workspace_of_another_host_is_refused(host, transport):
    from dataclasses import replace

    sync.pull(transport, host)
    other = replace(host, name="other")
    with pytest.raises(StateError, match="belongs to host 'h'"):
        drift.compute_drift(LocalTransport(other), other)


@pytest.mark.slow
def test_demo_on_the_local_transport(tmp_path):
    """The fallback when sshd is not installed: the same steps, all passing."""
    from kerneldev.sandbox.demo import run_demo

    result = run_demo(tmp_path / "sb", use_ssh=False)
    assert result.transport == "local"
    assert result.ok, [s for s in result.steps if not s.ok]
    assert not (tmp_path / "sb").exists()


def test_the_state_file_is_written_as_dataclasses_asdict_would_give_it(tmp_path):
    import dataclasses

    from kerneldev.loop import state as st

    record = st.State(host="h", root="/r")
    record.set_base("a/é.py", "0" * 64, 3, 0o644, "pull", when="2026-12-02T00:00:00Z")
    deployed = [st.DeployedFile("a/é.py", None, "1" * 64, None, 0o644, None)]
    record.deploys.append(st.DeployRecord("d1", "t", "h", "u", "push", deployed))
    record.deploys.append(st.DeployRecord("d2", "t", "h", "u", "rollback", [], False, "d1"))
    st.save_state(tmp_path, record)
    expected = {
        "version": st.STATE_VERSION,
        "host": "h",
        "root": "/r",
        "files": {k: dataclasses.asdict(v) for k, v in record.files.items()},
        "deploys": [dataclasses.asdict(d) for d in record.deploys],
        "hosts": {},
    }
    text = json.dumps(expected, indent=2, ensure_ascii=False) + "\n"
    assert state_path(tmp_path).read_text(encoding="utf-8") == text


def test_a_no_op_pull_or_push_leaves_the_state_file_as_it_was(host, transport):
    sync.pull(transport, host)
    ws = Path(host.workspace)
    (ws / "k" / "a.py").write_text("a.py v2\n")
    sync.push(transport, host)
    before = state_path(ws).stat()
    content = state_path(ws).read_bytes()
    sync.pull(transport, host)
    sync.push(transport, host)
    after = state_path(ws).stat()
    assert state_path(ws).read_bytes() == content
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not rewritten
    # The base the push set is still the push's: a pull that finds it unchanged keeps it.
    assert load_state(ws).files["k/a.py"].synced_by == "push"
    # A real change is still written.
    (Path(host.root) / "k" / "b.py").write_text("b.py v3\n")
    sync.pull(transport, host)
    state = load_state(ws)
    assert state.files["k/b.py"].synced_by == "pull"
    assert state.files["k/b.py"].sha256 == workspace.sha256_bytes(b"b.py v3\n")


def test_pull_syncs_each_file_before_its_rename(host, transport, monkeypatch):
    # Several files land through `SyncedRenames` (their fsyncs overlap in threads): each one's
    # bytes must still be on disk before its name points at them.
    import os
    import threading

    synced: set[str] = set()
    renamed: list[str] = []
    guard = threading.Lock()
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        real_fsync(fd)
        with guard:
            synced.add(os.readlink(f"/proc/self/fd/{fd}"))

    def replace(src, dst):
        with guard:
            assert str(src) in synced, f"{src} renamed before its fsync"
            renamed.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    sync.pull(transport, host)
    assert {"a.py", "b.py", "c.py"} <= set(renamed)
    ws = Path(host.workspace)
    assert (ws / "k" / "b.py").read_text() == "b.py v1\n"


def test_pull_a_failed_rename_records_only_the_files_that_landed(host, transport, monkeypatch):
    import os

    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == "b.py":
            raise OSError(28, "No space left on device", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(TransferError, match="b.py"):
        sync.pull(transport, host)
    ws = Path(host.workspace)
    assert sorted(p.name for p in (ws / "k").iterdir()) == ["a.py", "c.py"]  # no temp file
    state = load_state(ws)
    assert set(state.files) == {"k/a.py", "k/c.py"}
    monkeypatch.setattr(os, "replace", real_replace)
    sync.pull(transport, host)  # the rest comes next time
    assert set(load_state(ws).files) == {"k/a.py", "k/b.py", "k/c.py"}
