"""Safe under real use (issue 9), against the real sshd: the host lock, compare-and-swap,
cut connections at many points, Ctrl-C delivered to the process group, concurrent pushes from
two workspaces, automatic rollback, the shared history and backup pruning."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kerneldev.config import HostConfig
from kerneldev.errors import KerneldevError, RefusedError
from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.local import LocalTransport
from kerneldev.loop import history, sync
from kerneldev.loop import lock as host_lock
from kerneldev.loop.state import DeployedFile, DeployRecord, load_state
from tests.clirun import run_kerneldev, start_kerneldev
from tests.faults import CuttingProxy, check_backups, meddled, sha, temp_files
from tests.localhost import local_host
from tests.sshutil import ssh_host, write_hosts_yaml

FILES = ("k/a.py", "k/b.py", "k/c.py")


def _seed(root: Path, version: str, size: int = 2000) -> dict[str, bytes]:
    """Write FILES under root with content tagged by `version`; returns {path: bytes}."""
    out = {}
    for i, path in enumerate(FILES):
        data = (f"# {path} {version}\n" + f"x{i} = 0\n" * (size // 8)).encode()
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
        out[path] = data
    return out


def locked_push(host, **kwargs):
    with open_transport(host) as t, host_lock.HostLock(t, host.root, "push", wait=10):
        return sync.push(t, host, **kwargs)


def locked_rollback(host, **kwargs):
    with open_transport(host) as t, host_lock.HostLock(t, host.root, "rollback", wait=10):
        return sync.rollback(t, host, **kwargs)


@pytest.fixture
def ssh_env(sshd_server, tmp_path, isolated_home):
    host = ssh_host(sshd_server, tmp_path, files=("k/*.py",))
    (Path(host.root) / "k").mkdir(parents=True, exist_ok=True)
    return host


def _seed_and_pull(host: HostConfig) -> tuple[Path, Path]:
    """The live files at v1, pulled into the workspace; returns (live root, workspace)."""
    root, ws = Path(host.root), Path(host.workspace)
    _seed(root, "v1")
    with open_transport(host) as t:
        sync.pull(t, host)
    return root, ws


# --- the lock -----------------------------------------------------------------------------


def test_lock_waits_names_holder_detects_stale_and_breaks(tmp_path):
    root = tmp_path / "live"
    root.mkdir()
    t = LocalTransport()
    first = host_lock.HostLock(t, str(root), "push")
    first.acquire()
    holder = json.loads((root / host_lock.LOCK_FILE).read_text())
    assert {"user", "machine", "pid", "since", "command", "token"} <= set(holder)

    waited = []
    second = host_lock.HostLock(t, str(root), "rollback", wait=0.6, on_wait=waited.append)
    with pytest.raises(host_lock.LockBusyError) as caught:
        second.acquire()
    assert waited and waited[0].token == first.me.token
    assert f"pid {os.getpid()}" in caught.value.message and "push" in caught.value.message
    assert "--break-lock" in caught.value.hint
    first.release()
    assert not (root / host_lock.LOCK_FILE).exists()

    # A holder on this machine whose process is gone: stale, taken over with a note.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = replace(first.me, pid=dead.pid, token="deadbeef")
    (root / host_lock.LOCK_FILE).write_text(json.dumps(stale.__dict__))
    with host_lock.HostLock(t, str(root), "push", wait=0) as lock:
        assert "stale" in lock.notes[0]

    # A holder on another machine cannot be checked: only --break-lock takes it over.
    other = replace(first.me, machine="elsewhere", user="alice", token="cafe")
    (root / host_lock.LOCK_FILE).write_text(json.dumps(other.__dict__))
    with pytest.raises(host_lock.LockBusyError, match="alice@elsewhere"):
        host_lock.HostLock(t, str(root), "push", wait=0).acquire()
    with host_lock.HostLock(t, str(root), "push", wait=0, break_lock=True) as lock:
        assert "alice@elsewhere" in lock.notes[0]
    assert not (root / host_lock.LOCK_FILE).exists()


def test_push_takes_the_lock_in_its_scan_and_keeps_every_lock_rule(ssh_env, monkeypatch):
    """`sync.push(lock=...)` takes the lock in its first remote command (a no-op drops it in
    the same command, a deploy in its record's append) and keeps every rule of `acquire`:
    waits for and names a live holder, takes over a stale one, breaks with --break-lock, holds
    on while there are leftovers to clean or the caller still needs it (a restart), and never
    changes anything unlocked when the host released it on a wrong premise."""
    host = ssh_env
    root, ws = _seed_and_pull(host)
    lock_file = root / host_lock.LOCK_FILE
    with open_transport(host) as t:

        def push(lock_kwargs=None, **kwargs):
            lock = host_lock.HostLock(t, host.root, "push", **(lock_kwargs or {"wait": 0}))
            try:
                return sync.push(t, host, lock=lock, **kwargs), lock
            finally:
                held, lock_there = lock.held, lock_file.exists()
                lock.release()
                push.held, push.lock_there = held, lock_there

        # No-op, release allowed: the scan took and dropped the lock.
        result, _ = push(release_lock=True)
        assert not result.uploads and not push.held and not push.lock_there
        # No-op, the caller still needs it (--restart): held after the push.
        push(release_lock=False)
        assert push.held and push.lock_there
        # Leftovers: held on (cleaned under the lock), then released by the caller.
        (root / "k/.a.py.kerneldev-tmp-0123abcd").write_bytes(b"half")
        result, _ = push(release_lock=True)
        assert push.held and not temp_files(root)
        assert any("removed leftovers" in n for n in result.notes)
        # A deploy: the lock goes with the record's append.
        (ws / "k/a.py").write_bytes(b"a = 2\n")
        result, _ = push(release_lock=True)
        assert result.deployed == ["k/a.py"] and not push.held and not push.lock_there
        assert result.deploy_id in _history_text(root)
        # A live holder: waited for, named, refused; nothing changed.
        (ws / "k/b.py").write_bytes(b"b = 2\n")
        other = host_lock.HostLock(t, host.root, "rollback")
        other.acquire()
        with pytest.raises(host_lock.LockBusyError, match="rollback"):
            push({"wait": 0.3}, release_lock=True)
        assert lock_file.exists() and (root / "k/b.py").read_bytes() != b"b = 2\n"
        other.release()
        # A stale holder (this machine, process gone): taken over with a note.
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        lock_file.write_text(json.dumps(replace(other.me, pid=dead.pid, token="dead").__dict__))
        result, _ = push(release_lock=True)
        assert any("stale" in n for n in result.notes) and result.deployed == ["k/b.py"]
        # Another machine's holder: only --break-lock takes it over.
        (ws / "k/c.py").write_bytes(b"c = 2\n")
        elsewhere = replace(other.me, machine="elsewhere", user="alice", token="cafe")
        lock_file.write_text(json.dumps(elsewhere.__dict__))
        with pytest.raises(host_lock.LockBusyError, match="alice@elsewhere"):
            push(release_lock=True)
        result, _ = push({"wait": 0, "break_lock": True}, release_lock=True)
        assert any("alice@elsewhere" in n for n in result.notes)
        assert result.deployed == ["k/c.py"] and not lock_file.exists()
        # The host dropped the lock believing nothing would change: the push takes it again
        # (the usual way) before it changes anything.
        (ws / "k/a.py").write_bytes(b"a = 3\n")
        taken = []
        real_acquire = host_lock.HostLock.acquire
        real_request = host_lock.HostLock.scan_request

        def acquire(self):
            real_acquire(self)
            taken.append(lock_file.exists())

        monkeypatch.setattr(host_lock.HostLock, "acquire", acquire)
        monkeypatch.setattr(
            host_lock.HostLock, "scan_request", lambda self, same=None: real_request(self, {})
        )
        result, _ = push(release_lock=True)
        assert taken == [True] and result.deployed == ["k/a.py"] and not lock_file.exists()
        assert (root / "k/a.py").read_bytes() == b"a = 3\n"


def _history_text(root: Path) -> str:
    return (root / history.HISTORY_FILE).read_text()


def test_compare_and_swap_refuses_a_change_made_during_the_push(ssh_env):
    host = ssh_env
    root, ws = _seed_and_pull(host)
    for path in FILES:
        (ws / path).write_bytes(b"mine " + path.encode() + b"\n")

    # Someone edits k/b.py on the host (without the lock) once a.py has landed.
    meddler = meddled(host, "k/a.py", lambda: (root / "k/b.py").write_bytes(b"hotfix by hand\n"))
    with meddler as t, pytest.raises(sync.PartialDeployError) as caught:
        sync.push(t, host)
    assert "k/b.py changed on the host while deploying" in caught.value.message
    assert caught.value.deployed == ["k/a.py"]
    assert (root / "k/b.py").read_bytes() == b"hotfix by hand\n"  # never overwritten
    assert (root / "k/c.py").read_bytes().startswith(b"# k/c.py v1")
    assert not temp_files(root)
    record = load_state(ws).deploys[-1]
    assert [f.path for f in record.files] == ["k/a.py"] and record.outcome == "partial"


# --- a push through the host agent: one chain of requests ---------------------------------------


def _pushed_with_the_lock(host, **kwargs):
    """A push as the CLI makes it: the lock taken by its scan, released by its last request."""
    with open_transport(host) as t:
        lock = host_lock.HostLock(t, host.root, "push", wait=10)
        try:
            return sync.push(t, host, lock=lock, release_lock=True, **kwargs)
        finally:
            lock.release()


def _host_as_before(root: Path, live: dict[str, bytes], history_before: str | None) -> None:
    """Nothing of a stopped push is left on the host: live as given, the history as it was,
    no marker, backup or temporary file, the lock released."""
    assert {p: (root / p).read_bytes() for p in live} == live
    history_file = root / history.HISTORY_FILE
    assert (history_file.read_text() if history_file.exists() else None) == history_before
    assert not list(root.glob(f"{history.BACKUP_DIR}/*"))
    assert not temp_files(root)
    assert not (root / ".kerneldev" / "lock").exists()


def test_a_push_through_the_agent_is_one_round_trip_after_its_scan(ssh_env, monkeypatch):
    """After the scan (which takes the lock and reads the history), every later step - the
    marker, the backups with the upload (one host process: `receivefiles.py`'s `backups`), the
    record with the marker's removal and the lock's release - is sent before any answer is
    awaited, each opened `after` the one before; no other request (no history read, no
    separate unlock)."""
    from kerneldev.hosts.transport import agent_client

    host = ssh_env
    root, ws = _seed_and_pull(host)
    for path in FILES:
        (ws / path).write_bytes(b"mine " + path.encode() + b"\n")
    events = []
    open_ = agent_client.AgentClient.open

    def opened(self, command, python=False, fresh=False, after=None):
        process = open_(self, command, python=python, fresh=fresh, after=after)
        events.append(("open", process.rid, after.rid if after else None))
        return process

    def waiting(method):
        def wait(self, *args, **kwargs):
            events.append(("wait", self.rid))
            return method(self, *args, **kwargs)

        return wait

    monkeypatch.setattr(agent_client.AgentClient, "open", opened)
    for name in ("wait", "wait_for_output", "read_stdout"):
        method = getattr(agent_client.AgentProcess, name)
        monkeypatch.setattr(agent_client.AgentProcess, name, waiting(method))
    result = _pushed_with_the_lock(host)
    assert result.deployed == list(FILES)
    opens = [e for e in events if e[0] == "open"]
    assert len(opens) == 4, opens  # the scan, then the chain of three
    scan, marker, upload, record = (e[1] for e in opens)
    assert [e[2] for e in opens] == [None, None, marker, upload]
    chain_sent = events.index(opens[-1])
    assert not [e for e in events[:chain_sent] if e[0] == "wait" and e[1] != scan], events
    history_lines = (root / history.HISTORY_FILE).read_text().splitlines()
    assert [f["path"] for f in json.loads(history_lines[-1])["files"]] == list(FILES)
    assert not (root / ".kerneldev" / "lock").exists()
    assert not list(root.glob(f"{history.BACKUP_DIR}/*/{history.INCOMPLETE}"))
    assert check_backups(root, ws) == []


def _opened_requests(monkeypatch) -> list:
    """Every request the agent client opens from now on (its `AgentProcess`), in order."""
    from kerneldev.hosts.transport import agent_client

    opened, open_ = [], agent_client.AgentClient.open

    def recording(self, *args, **kwargs):
        opened.append(open_(self, *args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(agent_client.AgentClient, "open", recording)
    return opened


def test_backups_failing_on_the_host_stop_the_chain_before_any_rename(ssh_env, monkeypatch):
    """The upload's bytes are already on their way, and land in temporary files, while the
    backups are made in the same host process: when a backup fails, no file is renamed (the
    temporary files are removed), no record is appended; the host is as before, the lock
    released, and the error is the copy's."""
    from kerneldev.hosts.transport import hostscripts
    from kerneldev.hostside import receivefiles

    host = ssh_env
    root, ws = _seed_and_pull(host)
    live = {p: (root / p).read_bytes() for p in FILES}
    for path in FILES:
        (ws / path).write_bytes(b"mine " + path.encode() + b"\n")
    # The second backup fails (a disk full, say), after the first one was made.
    source = hostscripts.script(receivefiles)
    failing = source.replace(
        '            step = "rename to " + dst\n',
        "            if i == 1:\n"
        "                raise OSError(28, 'No space left on device')\n"
        '            step = "rename to " + dst\n',
        1,
    )
    assert failing != source
    monkeypatch.setitem(hostscripts._SOURCES, "kerneldev.hostside.receivefiles", failing)
    opened = _opened_requests(monkeypatch)
    with pytest.raises(KerneldevError, match="No space left") as caught:
        _pushed_with_the_lock(host)
    assert "Deployed: (none)" in caught.value.message
    scan, marker, upload, record = opened[:4]
    assert [p.skipped for p in (marker, upload, record)] == [False, False, True]
    assert upload.status == 1
    _host_as_before(root, live, None)
    assert not load_state(ws).deploys


def test_a_backup_that_is_not_the_planned_bytes_stops_the_chain(ssh_env, monkeypatch):
    """Live changes between the plan and its backup (someone at work on the host, without the
    lock): the copy's sum is checked on the host, so no file of the upload, already sent, is
    renamed and nothing is replaced; no record is appended."""
    host = ssh_env
    root, ws = _seed_and_pull(host)
    for path in FILES:
        (ws / path).write_bytes(b"mine " + path.encode() + b"\n")
    hotfix = b"# k/b.py hotfix by hand\n"

    def meddle(plan):
        (root / "k/b.py").write_bytes(hotfix)

    live = {p: (root / p).read_bytes() for p in FILES} | {"k/b.py": hotfix}
    opened = _opened_requests(monkeypatch)
    with pytest.raises(RefusedError, match="k/b.py changed on the host while deploying"):
        _pushed_with_the_lock(host, on_plan=meddle)
    upload, record = opened[2:4]
    assert upload.status == 1 and record.skipped, "a file renamed after a wrong backup"
    _host_as_before(root, live, None)
    assert not load_state(ws).deploys


@pytest.mark.parametrize("handed", [True, False], ids=["lock-in-the-scan", "lock-held-before"])
def test_a_lock_taken_over_mid_push_stops_the_chain_on_the_host(ssh_env, handed):
    """Another command takes the lock over while the host still runs a push's chain (as when
    a connection was cut: the re-run finds the lock stale and takes it while the host has not
    seen the cut yet). From then on no step of the chain acts - the next file is not written,
    no record is appended, the new holder's lock stays - and the push says the lock was taken
    over. The new holder's own push then settles what was left."""
    host = ssh_env
    root, ws = _seed_and_pull(host)
    for path in FILES:
        (ws / path).write_bytes(b"mine " + path.encode() + b"\n")
    lock_file = root / ".kerneldev" / "lock"
    history_file = root / history.HISTORY_FILE
    history_before = history_file.read_text() if history_file.exists() else None
    other = json.dumps({"user": "someone", "machine": "elsewhere", "token": "fedcba9876543210"})

    def take_over():  # once k/a.py has landed, before k/b.py's bytes go
        lock_file.write_text(other + "\n")

    with meddled(host, "k/a.py", take_over) as t, pytest.raises(sync.PartialDeployError) as caught:
        lock = host_lock.HostLock(t, host.root, "push", wait=10)
        try:
            if handed:
                sync.push(t, host, lock=lock, release_lock=True)
            else:
                with lock:
                    sync.push(t, host)
        finally:
            lock.release()
    assert "was taken over by another command" in caught.value.message
    assert caught.value.deployed == ["k/a.py"]
    assert (root / "k/a.py").read_bytes() == b"mine k/a.py\n"
    for path in ("k/b.py", "k/c.py"):
        assert (root / path).read_bytes().startswith(f"# {path} v1".encode()), path
    assert lock_file.read_text() == other + "\n"  # the new holder's, untouched
    assert (history_file.read_text() if history_file.exists() else None) == history_before
    assert len(list(root.glob(f"{history.BACKUP_DIR}/*/{history.INCOMPLETE}"))) == 1
    assert not temp_files(root)
    record = load_state(ws).deploys[-1]
    assert [f.path for f in record.files] == ["k/a.py"] and record.outcome == "partial"

    lock_file.unlink()  # the new holder is done; its next push settles the marker
    result = _pushed_with_the_lock(host)
    assert result.deployed == ["k/b.py", "k/c.py"]
    assert not list(root.glob(f"{history.BACKUP_DIR}/*/{history.INCOMPLETE}"))
    assert check_backups(root, ws) == []


# --- concurrent pushes ----------------------------------------------------------------------


@pytest.mark.slow
def test_two_workspaces_push_at_once_20_times(sshd_server, tmp_path, isolated_home):
    """Two engineers push different edits of the same files at the same moment: exactly one
    deploys, the other is refused naming the changed file, no edit is lost (half the runs with
    the lock taken before the push, half with it taken in the push's own scan)."""
    alice = ssh_host(sshd_server, tmp_path, files=("k/*.py",), workspace=tmp_path / "alice")
    bob = replace(alice, workspace=tmp_path / "bob")
    root = Path(alice.root)
    _seed(root, "base")
    # Each engineer keeps one connection, as one kerneldev command would hold one.
    conn = {w.workspace.name: open_transport(w) for w in (alice, bob)}
    outcomes = []
    for rep in range(20):
        # Both start from what is live: the last winner is in sync, the loser pulls.
        for who in (alice, bob):
            if rep == 0 or who.workspace.name != outcomes[-1]:
                sync.pull(conn[who.workspace.name], who, force=True)
            for path in FILES:
                (who.workspace / path).write_bytes(f"{who.workspace.name} {rep} {path}\n".encode())
        results: dict[str, object] = {}
        start = threading.Barrier(2)

        def go(who, results=results, start=start, rep=rep):
            t = conn[who.workspace.name]
            start.wait()
            try:
                if rep % 2:  # as `kerneldev push` does: the lock taken in the push's scan
                    lock = host_lock.HostLock(t, who.root, "push", wait=30)
                    try:
                        results[who.workspace.name] = sync.push(
                            t, who, lock=lock, release_lock=True
                        )
                    finally:
                        lock.release()
                else:
                    with host_lock.HostLock(t, who.root, "push", wait=30):
                        results[who.workspace.name] = sync.push(t, who)
            except KerneldevError as err:
                results[who.workspace.name] = err

        threads = [threading.Thread(target=go, args=(w,)) for w in (alice, bob)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        won = [n for n, r in results.items() if isinstance(r, sync.PushResult)]
        lost = [r for r in results.values() if isinstance(r, KerneldevError)]
        assert len(won) == 1 and len(lost) == 1, results
        assert isinstance(lost[0], RefusedError)
        assert "k/a.py" in lost[0].message or "locked by" in lost[0].message
        for path in FILES:  # the winner's edit is live, whole
            assert (root / path).read_bytes() == f"{won[0]} {rep} {path}\n".encode()
        outcomes.append(won[0])
    print(
        f"20 concurrent pushes: winners {outcomes.count('alice')} alice, "
        f"{outcomes.count('bob')} bob"
    )
    for t in conn.values():
        t.close()
    assert not temp_files(root)


def test_two_terminals_on_one_workspace_keep_every_record(ssh_env):
    """The loser of a race in one workspace must not save a stale state over the winner's."""
    host = ssh_env
    root, ws = _seed_and_pull(host)
    (ws / "k/a.py").write_bytes(b"one\n")
    first = locked_push(host, paths=["k/a.py"])
    (ws / "k/b.py").write_bytes(b"two\n")
    second = locked_push(host, paths=["k/b.py"])
    ids = [d.id for d in load_state(ws).deploys]
    assert ids == [first.deploy_id, second.deploy_id]
    # The host's shared history has both too; rollback undoes the newest.
    with open_transport(host) as t:
        assert [r.id for r in history.load_history(t, host.root).records] == ids
    undo = locked_rollback(host)
    assert undo.rolls_back == second.deploy_id and (root / "k/b.py").read_bytes() != b"two\n"


# --- cut connections --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("transfer", ["sftp", "agent"])
def test_cut_connection_at_50_points_push_and_rollback(
    sshd_server, tmp_path, isolated_home, monkeypatch, transfer
):
    """A TCP proxy between kerneldev and sshd cuts the connection at points spread over a
    push of three files and over a rollback. After every cut: each live file is its old or its
    new version; after the next command: no temporary file, backups intact, state valid, and
    the re-run completes. (The workspace alternates between the two versions, so every push
    and every rollback has all three files to change.) Over SFTP (one request per step) and
    through the host agent (a push's steps in one chain of requests)."""
    # The cut points come from one measured run: every run must move files the same way (the
    # stream-or-SFTP choice is timed, and load could flip it between runs), so it is pinned.
    monkeypatch.setenv("KERNELDEV_TRANSFER", transfer)
    proxy = CuttingProxy(sshd_server.port)
    # Every backup is kept, so `rollback --to` can go back and forth between two deploys.
    direct = ssh_host(sshd_server, tmp_path, files=("k/*.py",), keep_backups=1000)
    (tmp_path / "known_hosts").write_text(
        sshd_server.host_key_line
        + sshd_server.host_key_line.replace(f":{sshd_server.port} ", f":{proxy.port} ")
    )
    cut = replace(direct, port=proxy.port)
    root, ws = Path(direct.root), Path(direct.workspace)
    old = _seed(root, "old")
    new = {p: d.replace(b" old\n", b" new\n") for p, d in old.items()}
    versions = (old, new)
    with open_transport(direct) as t:
        sync.pull(t, direct)

    def edit(version):
        for p, d in version.items():
            (ws / p).write_bytes(d)

    # Measure each operation's traffic once, uncut.
    edit(new)
    proxy.reset(None)
    to_new = locked_push(cut).deploy_id
    push_bytes = proxy.total
    proxy.reset(None)
    to_old = locked_rollback(cut).deploy_id
    rollback_bytes = proxy.total

    # The uncut re-runs share one connection (the cut runs each open their own), and go
    # through the host agent, as an unpinned command does: one host process for all 54, where
    # SFTP mode runs a remote command per step (a shell, a Python per hash: ~11 per re-run,
    # 3/4 of this test's time).
    monkeypatch.setenv("KERNELDEV_TRANSFER", "agent")
    steady = open_transport(direct)
    monkeypatch.setenv("KERNELDEV_TRANSFER", transfer)  # the cut runs stay pinned

    def rerun(op, **kw):
        with host_lock.HostLock(steady, direct.root, op, wait=10):
            return (sync.push if op == "push" else sync.rollback)(steady, direct, **kw)

    cuts = corrupted = 0
    plan = [("push", push_bytes, i, 36) for i in range(36)]
    plan += [("rollback", rollback_bytes, i, 18) for i in range(18)]
    for n, (op, total, i, points) in enumerate(plan):
        at = int(total * (i + 0.5) / points)
        if op == "push":
            target = versions[n % 2]  # live holds the other one
            edit(target)
        else:  # back to the files as right after `to_old`'s or `to_new`'s deploy
            is_new = (root / FILES[0]).read_bytes() == new[FILES[0]]
            to, target = (to_old, old) if is_new else (to_new, new)
        proxy.reset(at)
        try:
            if op == "push":
                locked_push(cut)
            else:
                locked_rollback(cut, to=to)
        except KerneldevError:
            pass
        cuts += proxy.cut
        corrupted += sum((root / p).read_bytes() not in (old[p], new[p]) for p in FILES)
        # The next command (not cut) completes and leaves nothing behind.
        if op == "push":
            rerun("push")
        else:
            rerun("rollback", to=to)
        for p in FILES:
            assert (root / p).read_bytes() == target[p], (op, at, p)
        assert not temp_files(root), (op, at)
        assert not list(root.glob(f"{history.BACKUP_DIR}/*/{history.INCOMPLETE}")), (op, at)
        assert check_backups(root, ws) == [], (op, at)
        load_state(ws)  # parses
    steady.close()
    proxy.close()
    print(f"cut points: {cuts}, corrupted files: {corrupted}")
    assert cuts >= 50 and corrupted == 0


# --- Ctrl-C -------------------------------------------------------------------------------------


def _start_push(config: Path, *extra: str) -> subprocess.Popen:
    return start_kerneldev("push", *extra, env={"KERNELDEV_CONFIG": str(config)})


def _wait_for(condition, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize(
    ("when", "sig"),
    [
        ("uploading the first file", signal.SIGINT),
        ("uploading the second file", signal.SIGINT),
        ("after the first file landed", signal.SIGINT),
        ("uploading the first file", signal.SIGTERM),
    ],
)
def test_ctrl_c_during_a_large_push(ssh_env, tmp_path, when, sig):
    host = replace(ssh_env, files=("k/big*.bin",))
    root, ws = Path(host.root), Path(host.workspace)
    names = ("k/big1.bin", "k/big2.bin")
    for name in names:
        (root / name).write_bytes(b"old" * 1000)
    with open_transport(host) as t:
        sync.pull(t, host)
    chunk = os.urandom(1 << 20)
    # Where the signal must come while the second file uploads, a larger second file keeps
    # that window open on a loaded machine (16 MB over loopback closed before the signal came,
    # and the push completed: once after the first file landed, once with the second's
    # temporary file seen, on a fresh-clone CI run sharing its 2 cores with a compile).
    second = when in ("after the first file landed", "uploading the second file")
    megabytes = {names[0]: 16, names[1]: 64 if second else 16}
    for name in names:
        with open(ws / name, "wb") as f:
            for _ in range(megabytes[name]):
                f.write(chunk)
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    proc = _start_push(config)

    def temp_of(name):
        return any(
            p.name.startswith(f".{Path(name).name}.kerneldev-tmp-") for p in temp_files(root)
        )

    if when == "uploading the first file":
        ok = _wait_for(lambda: temp_of(names[0]))
    elif when == "uploading the second file":
        ok = _wait_for(lambda: temp_of(names[1]))
    else:
        ok = _wait_for(lambda: (root / names[0]).stat().st_size > 3000)
    assert ok, proc.communicate()
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    expected = 130 if sig == signal.SIGINT else 143
    assert proc.returncode == expected, err
    assert "Traceback" not in err and "Deployed:" in err and "Not deployed:" in err, err
    assert not temp_files(root)
    landed = [n for n in names if (root / n).stat().st_size > 3000]
    for n in names:  # each file old or new, whole
        assert (root / n).read_bytes() in ((ws / n).read_bytes(), b"old" * 1000)
    records = load_state(ws).deploys
    recorded = [f.path for f in records[-1].files] if records else []
    assert recorded == landed and f"Deployed: {', '.join(landed) or '(none)'}" in err
    if landed:
        assert records[-1].outcome == "interrupted"
    # The host lock was released: the next push runs at once and completes.
    again = run_kerneldev(
        "push", "--lock-wait", "0", env={"KERNELDEV_CONFIG": str(config)}, timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert all((root / n).read_bytes() == (ws / n).read_bytes() for n in names)


# --- automatic rollback ---------------------------------------------------------------------------


def test_push_restart_rolls_back_when_never_healthy(tmp_path):
    root = tmp_path / "live"
    old = _seed(root, "v1")
    marker = tmp_path / "restarts"
    host_yaml = tmp_path / "hosts.yaml"
    host_yaml.write_text(
        "hosts:\n  h:\n    transport: local\n"
        f"    root: '{root}'\n    files: ['k/*.py']\n    workspace: '{tmp_path / 'ws'}'\n"
        f"    service:\n      restart: 'echo restart >> {marker}'\n"
        # healthy only when a.py holds its old bytes: the new kernel "crashes the server"
        f"      health: 'grep -q v1 {root / 'k/a.py'}'\n"
        # 3 s, not 1: the restart command runs under this timeout too, and after the rollback
        # it and one health check must fit in it on a loaded 2-core machine.
        "      timeout: 3\n      logs: 'echo server log: kernel crashed'\n"
    )

    def kd(*args):
        return run_kerneldev(*args, env={"KERNELDEV_CONFIG": str(host_yaml)}, timeout=120)

    assert kd("pull").returncode == 0
    (tmp_path / "ws/k/a.py").write_bytes(b"# broken v2\n")
    run = kd("push", "--restart")
    assert run.returncode == 1, run.stderr
    assert "rolled back" in run.stderr and "healthy again" in run.stderr
    assert "kernel crashed" in run.stderr  # the logs of the failed restart
    assert (root / "k/a.py").read_bytes() == old["k/a.py"]
    assert marker.read_text().count("restart") == 2
    log = json.loads(kd("log", "--json").stdout)
    assert [(e["kind"], e["outcome"]) for e in log] == [
        ("push", "deployed"),
        ("rollback", "auto-rollback"),
    ]
    # --no-rollback leaves the failing deploy in place.
    run = kd("push", "--restart", "--no-rollback")
    assert run.returncode == 1 and (root / "k/a.py").read_bytes() == b"# broken v2\n"


def test_push_restart_rolls_back_when_the_restart_command_fails(ssh_env, tmp_path):
    """A restart command that exits non-zero (3 here, while the new kernel is live) is treated
    as an unhealthy service: the deploy is rolled back and the service restarted again."""
    import io

    from kerneldev.cli.environment import Environment
    from kerneldev.cli.main import main

    host = ssh_env
    root, ws = _seed_and_pull(host)
    marker = tmp_path / "restarts"
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    restart = f"echo restart >> {marker}; grep -q v1 {root / 'k/a.py'} || exit 3"
    with config.open("a") as f:
        f.write(
            f'    service:\n      restart: "{restart}"\n'
            "      logs: 'echo server log: kernel crashed'\n"
        )

    def kd(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["--config", str(config), *args], env=Environment(stdout=out, stderr=err))
        return code, out.getvalue(), err.getvalue()

    (ws / "k/a.py").write_bytes(b"# broken v2\n")
    code, _, err = kd("push", "--restart", "--no-import-check")
    assert code == 1, err
    assert "restart command on testhost exited 3" in err and "rolled back" in err, err
    assert "healthy again" in err and "kernel crashed" in err and "Traceback" not in err, err
    assert (root / "k/a.py").read_bytes() == _seed(tmp_path / "v1", "v1")["k/a.py"]
    assert marker.read_text().count("restart") == 2
    code, out, _ = kd("log", "--json")
    assert [(e["kind"], e["outcome"]) for e in json.loads(out)] == [
        ("push", "deployed"),
        ("rollback", "auto-rollback"),
    ]
    # --json carries the failed restart as the deploy's health.
    code, out, _ = kd("push", "--restart", "--no-import-check", "--json")
    report = json.loads(out)
    assert code == 1 and report["error"]["type"] == "UnhealthyError", out
    assert report["health"]["healthy"] is False, out
    assert report["health"]["last_check"] == "restart exited 3", out
    assert report["auto_rollback"]["rolls_back"] == report["deploy_id"], out
    # --no-rollback leaves the deploy in place, as for an unhealthy service.
    code, _, err = kd("push", "--restart", "--no-import-check", "--no-rollback")
    assert code == 1 and "exited 3" in err and "rolled back" not in err, err
    assert (root / "k/a.py").read_bytes() == b"# broken v2\n"


# --- history, log, rollback --to, pruning, leftovers --------------------------------------------


def test_history_log_rollback_to_and_pruning(tmp_path):
    root = tmp_path / "live"
    v0 = _seed(root, "v0")
    host = sync_host = _local_host(tmp_path, root, keep_backups=2)
    t = LocalTransport(host)
    sync.pull(t, sync_host)
    ws = Path(host.workspace)
    ids = []
    for n in range(1, 5):
        (ws / "k/a.py").write_bytes(f"a v{n}\n".encode())
        ids.append(locked_push(host).deploy_id)
    entries = sync.deploy_log(t, host)
    assert [e.id for e in entries] == ids
    assert [f.live for e in entries for f in e.files] == [False, False, False, True]
    # Backups pruned to the last 2 deploys, except the one whose bytes are still live.
    kept = sorted(p.name for p in (root / history.BACKUP_DIR).iterdir())
    assert kept == ids[-2:]

    plan = sync.rollback(t, host, to=ids[2], dry_run=True)
    assert [(r.path, r.restore_sha256) for r in plan.plan] == [("k/a.py", sha(b"a v3\n"))]
    assert (root / "k/a.py").read_bytes() == b"a v4\n"  # dry run changed nothing
    locked_rollback(host, to=ids[2])
    assert (root / "k/a.py").read_bytes() == b"a v3\n"
    # Too far back: that backup was pruned; a clear error, nothing touched.
    with pytest.raises(KerneldevError, match="missing"):
        locked_rollback(host, to=ids[0])
    assert (root / "k/a.py").read_bytes() == b"a v3\n"
    assert v0


def _local_host(tmp_path, root, **kw):
    return local_host(root, tmp_path / "ws", **kw)


def test_leftovers_reported_by_diff_and_removed_by_push(tmp_path):
    root = tmp_path / "live"
    _seed(root, "v1")
    config = tmp_path / "hosts.yaml"
    write_hosts_yaml(config, _local_host(tmp_path, root))

    def kd(*args):
        return run_kerneldev(*args, env={"KERNELDEV_CONFIG": str(config)}, timeout=120)

    assert kd("pull").returncode == 0
    # What an interrupted run leaves: a partial upload, an incomplete backup folder.
    (root / "k/.a.py.kerneldev-tmp-0123abcd").write_bytes(b"half")
    stale = root / history.BACKUP_DIR / "20260101T000000.000Z-abcdef"
    (stale / "k").mkdir(parents=True)
    live_a = (root / "k/a.py").read_bytes()
    (stale / "k/a.py").write_bytes(live_a)
    planned = DeployRecord("20260101T000000.000Z-abcdef", "t", "h", "bob", "push")
    backup = f"{history.BACKUP_DIR}/{planned.id}/k/a.py"  # where push puts it
    planned.files = [
        DeployedFile("k/a.py", sha(live_a), sha(b"never landed"), 0o644, 0o644, backup)
    ]
    (stale / history.INCOMPLETE).write_text(history.record_line(planned))
    diff = kd("diff")
    assert "leftovers of interrupted" in diff.stderr and "1 temporary file" in diff.stderr
    assert (root / "k/.a.py.kerneldev-tmp-0123abcd").exists()  # read-only: reported only
    (tmp_path / "ws/k/a.py").write_bytes(b"new = 1\n")
    push = kd("push")
    assert push.returncode == 0, push.stderr
    assert "removed leftovers of interrupted runs" in push.stderr
    assert not temp_files(root) and not stale.exists()


def _processes_with(text: str) -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found[int(entry.name)] = cmd
    return found


def test_ctrl_c_during_bench_ends_the_harness_on_the_host(sshd_server, tmp_path, isolated_home):
    """The harness runs through a wrapper named only by this test, so its processes on the
    (loopback) host can be found; Ctrl-C must end them and remove the harness's folder."""
    from tests.test_bench import SMOKE_ON_CPU, write_config

    wrapper = tmp_path / "python-for-this-test"
    wrapper.write_text(f'#!/bin/sh\n"{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    config = write_config(tmp_path, "ssh", sshd_server, python=str(wrapper))
    proc = start_kerneldev("--config", str(config), *SMOKE_ON_CPU)
    harness = {}

    def bench_processes() -> dict:
        # The host agent's start names the wrapper too (as a candidate python), for a moment.
        found = _processes_with(str(wrapper))
        return {pid: cmd for pid, cmd in found.items() if "kerneldev-bench." in cmd}

    assert _wait_for(lambda: harness.update(bench_processes()) or harness, 120)
    folder = next(w for cmd in harness.values() for w in cmd.split() if "kerneldev-bench." in w)
    folder = (
        Path(folder[: folder.index("kerneldev-bench.")])
        / folder[folder.index("kerneldev-bench.") :].split("/")[0]
    )
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert _wait_for(lambda: not _processes_with(str(wrapper)), 10), "the harness still runs"
    assert not folder.exists()


def test_the_lock_wait_message_reads_well_for_an_infinite_wait():
    assert host_lock.wait_text(60.0) == "up to 60s"
    assert host_lock.wait_text(0.5) == "up to 0.5s"
    assert host_lock.wait_text(float("inf")) == "as long as it takes"  # was "up to infs"


def test_a_lock_being_created_is_not_stale_to_another_lock_of_the_same_process(tmp_path):
    """Two locks of one process (one pid): while the first one's create is on its way back from
    the host, the file already holds its token; the second must wait for it, not take it over
    as stale (both would then write at once: seen as a deleted backup folder under load)."""
    root = tmp_path / "live"
    root.mkdir()
    t = LocalTransport()
    first = host_lock.HostLock(t, str(root), "push")
    second = host_lock.HostLock(t, str(root), "push", wait=0)
    create = first._try_create
    seen = []

    def create_then_race():
        created = create()  # the file is on the host; the answer has not reached `first` yet
        with pytest.raises(host_lock.LockBusyError):
            second.acquire()
        seen.append(json.loads((root / host_lock.LOCK_FILE).read_text())["token"])
        return created

    first._try_create = create_then_race
    first.acquire()
    assert seen == [first.me.token] and second.notes == []
    first.release()
    assert not (root / host_lock.LOCK_FILE).exists()
