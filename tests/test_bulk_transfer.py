"""The bulk transfer paths over the real sshd: pull's files down and push's files up, in one
exec stream or one by one over SFTP (byte for byte, any name, empty files, modes, the
compare-and-swap, Ctrl-C mid-file), and the number of remote commands a no-op `diff`, `pull`
and `push` make after authentication (counted on the SSH channels opened)."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import stat
from dataclasses import replace
from pathlib import Path

import paramiko
import pytest

from kerneldev import interrupt
from kerneldev.cli.environment import Environment
from kerneldev.cli.main import main
from kerneldev.hosts.transport.base import LiveChangedError, PutItem
from kerneldev.hosts.transport.ssh import SSHTransport
from kerneldev.loop import lock as host_lock
from kerneldev.loop import sync
from kerneldev.loop.state import load_state
from tests.sshutil import ssh_host, write_hosts_yaml
from tests.test_transport import HOSTILE_NAMES

# How the host agent is started (the first characters, as ChannelCounter records a command).
AGENT_START = 'exec sh -c \'for p in python3; do if command -v "$p" >/dev/null 2>&1; then'


@pytest.fixture(params=["agent", "stream", "sftp"])
def host(request, sshd_server, tmp_path, isolated_home, monkeypatch):
    """The test sshd, with files moving through the host agent, or (a host without python3's
    agent) in one exec stream or one by one over SFTP; every path must keep every guarantee."""
    monkeypatch.setenv("KERNELDEV_TRANSFER", request.param)
    return ssh_host(sshd_server, tmp_path, files=("*.py", "*.bin"))


def _temp_files(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*") if ".kerneldev-tmp-" in p.name]


def test_pull_streams_every_name_empty_files_and_modes_byte_for_byte(host):
    root, ws = Path(host.root), Path(host.workspace)
    contents = {name: name.encode() * 50 for name in HOSTILE_NAMES}
    contents["empty.py"] = b""
    contents["big.bin"] = os.urandom(3 << 20) + bytes(range(256))
    modes = {"plain.py": 0o755, "empty.py": 0o600, "-dash.py": 0o640}
    for name, data in contents.items():
        (root / name).write_bytes(data)
        (root / name).chmod(modes.get(name, 0o644))
    with SSHTransport(host) as t:
        result = sync.pull(t, host)
        assert {f.path for f in result.files if f.action == "pulled"} == set(contents)
        for name, data in contents.items():
            assert (ws / name).read_bytes() == data, name
            assert stat.S_IMODE((ws / name).stat().st_mode) == modes.get(name, 0o644), name
        # Changed on the host: the workspace copies are replaced, again byte for byte.
        for name in ("with space.py", "-dash.py", "big.bin"):
            contents[name] = b"v2 " + contents[name][::-1]
            (root / name).write_bytes(contents[name])
        again = sync.pull(t, host)
    assert sorted(f.path for f in again.files if f.action == "pulled") == sorted(
        ["with space.py", "-dash.py", "big.bin"]
    )
    for name, data in contents.items():
        assert (ws / name).read_bytes() == data, name
    assert _temp_files(ws) == []


@pytest.mark.parametrize("existing", [False, True])
def test_ctrl_c_mid_file_leaves_no_partial_workspace_file(host, existing):
    root, ws = Path(host.root), Path(host.workspace)
    (root / "a.py").write_bytes(b"a v1\n")
    big = os.urandom(4 << 20)
    (root / "big.bin").write_bytes(big)
    with SSHTransport(host) as t:
        if existing:
            sync.pull(t, host)
            (root / "a.py").write_bytes(b"a v2\n")
            (root / "big.bin").write_bytes(big[::-1])
        real = t.stream_files

        def first_chunk_then_ctrl_c(chunks):
            yield next(chunks)
            os.kill(os.getpid(), signal.SIGINT)  # as the terminal sends it, mid-file
            yield from chunks

        def spy(paths):
            for path, chunks in real(paths):
                yield path, first_chunk_then_ctrl_c(chunks) if path.endswith("big.bin") else chunks

        t.stream_files = spy
        with pytest.raises(interrupt.Interrupted), interrupt.deferred_signals():
            sync.pull(t, host)
        assert _temp_files(ws) == []
        # a.py (before big.bin) landed and is recorded; big.bin is its old self or absent.
        assert (ws / "a.py").read_bytes() == (root / "a.py").read_bytes()
        assert load_state(ws).files["a.py"].sha256 is not None
        if existing:
            assert (ws / "big.bin").read_bytes() == big
        else:
            assert not (ws / "big.bin").exists()
        # The connection is still usable, and the next pull finishes the job.
        t.stream_files = real
        sync.pull(t, host)
    assert (ws / "big.bin").read_bytes() == (root / "big.bin").read_bytes()


def test_stream_or_sftp_is_chosen_by_what_this_host_costs(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    host = ssh_host(sshd_server, tmp_path)
    with SSHTransport(host) as t:
        assert not t._stream_pays(1, 4, host.root)  # one file never needs a stream
        assert t._stream_pays(16, 4, host.root)  # nothing measured yet: by the file count
        t.hash_files(host.root, ["*.py"])  # timed: the cost of a helper command here
        t._exec_seconds, t._sftp_seconds = 0.5, 0.001  # a slow login shell, fast SFTP
        assert not t._stream_pays(100, 4, host.root)
        assert t._stream_pays(200, 4, host.root)
        t._exec_seconds, t._sftp_seconds = 0.03, 0.02  # a plain shell, a WAN round trip
        assert t._stream_pays(2, 4, host.root)
    # $KERNELDEV_TRANSFER pins the choice whatever the timings (tests that count commands).
    monkeypatch.setenv("KERNELDEV_TRANSFER", "sftp")
    with SSHTransport(host) as t:
        t._exec_seconds, t._sftp_seconds = 0.03, 0.02
        assert not t._stream_pays(200, 4, host.root)
    monkeypatch.setenv("KERNELDEV_TRANSFER", "Stream")
    with SSHTransport(host) as t:
        t._exec_seconds, t._sftp_seconds = 0.5, 0.001
        assert t._stream_pays(2, 4, host.root)
    monkeypatch.setenv("KERNELDEV_TRANSFER", "rsync")
    out, err = io.StringIO(), io.StringIO()
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    code = main(["--config", str(config), "diff"], env=Environment(stdout=out, stderr=err))
    assert code == 2 and "$KERNELDEV_TRANSFER is 'rsync', not one of auto, agent, stream, sftp" in (
        err.getvalue()
    ), err.getvalue()
    assert "Traceback" not in err.getvalue()


class ChannelCounter:
    """Every exec command and subsystem (sftp) started on any SSH connection of this process."""

    def __init__(self, monkeypatch) -> None:
        self.opened: list[str] = []
        exec_command, invoke_subsystem = (
            paramiko.Channel.exec_command,
            paramiko.Channel.invoke_subsystem,
        )

        def counted_exec(chan, command):
            self.opened.append(f"exec {command[:60]}")
            return exec_command(chan, command)

        def counted_subsystem(chan, name):
            self.opened.append(f"subsystem {name}")
            return invoke_subsystem(chan, name)

        monkeypatch.setattr(paramiko.Channel, "exec_command", counted_exec)
        monkeypatch.setattr(paramiko.Channel, "invoke_subsystem", counted_subsystem)

    def during(self, *args: str) -> list[str]:
        self.opened.clear()
        out, err = io.StringIO(), io.StringIO()
        code = main(list(args), env=Environment(stdout=out, stderr=err, stdin=io.StringIO()))
        assert code in (0, 1), err.getvalue()
        return list(self.opened)


def test_with_the_agent_every_command_is_one_remote_command(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    """By default every step after the login goes through the host agent: each command opens
    one exec channel (the agent, the connection's only login shell) and nothing else, no SFTP;
    a cold push with its import check included."""
    host = ssh_host(sshd_server, tmp_path)
    root = Path(host.root)
    for i in range(20):
        (root / f"k{i}.py").write_bytes(b"x = 1  # " + b"x" * 13000 + bytes([65 + i]) + b"\n")
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    counter = ChannelCounter(monkeypatch)
    agent_only = [f"exec {AGENT_START[:60]}"]
    assert counter.during("--config", str(config), "pull") == agent_only  # cold: hashes + files
    assert counter.during("--config", str(config), "pull") == agent_only
    assert counter.during("--config", str(config), "diff") == agent_only
    assert counter.during("--config", str(config), "push") == agent_only  # no-op
    workspace = Path(host.workspace)
    for i in range(3):
        (workspace / f"k{i}.py").write_bytes(b"y = 2  # " + b"y" * 13000 + bytes([65 + i]) + b"\n")
    # A cold push: lock + plan, backups, the files, the record + the unlock, the import check.
    push = counter.during("--config", str(config), "push")
    assert push == agent_only, push
    assert (root / "k2.py").read_bytes().startswith(b"y = 2")
    assert not (root / ".kerneldev" / "lock").exists()
    assert '"files": [{' in (root / ".kerneldev" / "history.jsonl").read_text()


def test_no_op_diff_and_pull_make_one_remote_command(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    """Without the agent (a host without python3's path, pinned here): one remote command per
    step, as few steps as the commands need."""
    host = ssh_host(sshd_server, tmp_path)
    root = Path(host.root)
    for i in range(20):
        (root / f"k{i}.py").write_bytes(b"x" * 13000 + bytes([i]))
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    counter = ChannelCounter(monkeypatch)
    # Stream or SFTP is chosen from timings, which vary with the machine's load: pinned (which
    # also leaves the agent out), so the counts below are the same on every run (stream: no
    # SFTP probe, no SFTP channel).
    monkeypatch.setenv("KERNELDEV_TRANSFER", "stream")
    cold = counter.during("--config", str(config), "pull")
    assert len(cold) == 2, cold  # the hashes, then every file in one stream
    assert len(counter.during("--config", str(config), "pull")) == 1
    assert len(counter.during("--config", str(config), "diff")) == 1
    # A no-op push: one command takes the lock, plans (hashes, root, leftovers) and, as
    # nothing can change, releases the lock.
    push = counter.during("--config", str(config), "push", "--no-import-check")
    assert len(push) == 1, push
    assert not (root / ".kerneldev" / "lock").exists()
    # A cold push: lock + plan, backups, the files (SFTP here), the record + the unlock.
    monkeypatch.setenv("KERNELDEV_TRANSFER", "sftp")
    workspace = Path(host.workspace)
    for i in range(3):
        (workspace / f"k{i}.py").write_bytes(b"y" * 13000 + bytes([i]))
    push = counter.during("--config", str(config), "push", "--no-import-check")
    assert len([c for c in push if c.startswith("exec")]) == 3, push
    assert len(push) == 4, push
    assert (root / "k2.py").read_bytes() == b"y" * 13000 + bytes([2])
    assert not (root / ".kerneldev" / "lock").exists()
    assert '"files": [{' in (root / ".kerneldev" / "history.jsonl").read_text()
    # Leftovers of an interrupted run are still reported by the one-command diff.
    (root / f".k1.py.kerneldev-tmp-{'0' * 12}").write_bytes(b"half")
    out, err = io.StringIO(), io.StringIO()
    main(["--config", str(config), "diff"], env=Environment(stdout=out, stderr=err))
    assert "leftovers of interrupted kerneldev runs: 1 temporary file" in err.getvalue()


def test_watch_and_group_pushes_take_the_lock_in_the_plan_like_push(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    """A save pushed by `watch` and a push to a group make the single-host push's commands:
    through the host agent, one exec channel per host and command (a no-op or a cold push),
    and none at all for a save in `watch`, whose connection and agent live as long as it."""
    import json
    import queue
    import socket
    import subprocess
    import threading

    from kerneldev import watch
    from kerneldev.config import load_config

    hosts = {}
    for name in ("n0", "n1"):
        (tmp_path / name).mkdir()
        h = ssh_host(sshd_server, tmp_path / name, name=name)
        (Path(h.root) / "k.py").write_bytes(b"k v1\n" * 3000)
        hosts[name] = {
            "hostname": "127.0.0.1",
            "port": h.port,
            "user": h.user,
            "identity_file": str(h.identity_file),
            "known_hosts": str(h.known_hosts),
            "root": h.root,
            "files": ["*.py"],
            "workspace": str(h.workspace),
        }
    config = tmp_path / "hosts.yaml"
    config.write_text(json.dumps({"default": "n0", "groups": {"g": ["n0", "n1"]}, "hosts": hosts}))
    counter = ChannelCounter(monkeypatch)
    counter.during("--config", str(config), "pull", "--host", "g")
    execs = lambda opened: [c for c in opened if c.startswith("exec")]  # noqa: E731

    push = counter.during("--config", str(config), "push", "--host", "g", "--no-import-check")
    assert len(push) == 2, push  # one per host
    for name in hosts:
        (Path(hosts[name]["workspace"]) / "k.py").write_bytes(b"k v2\n" * 3000)
    push = counter.during("--config", str(config), "push", "--host", "g", "--no-import-check")
    assert len(execs(push)) == 2, push  # the agent, one per host
    for name in hosts:
        assert (Path(hosts[name]["root"]) / "k.py").read_bytes() == b"k v2\n" * 3000
        assert not (Path(hosts[name]["root"]) / ".kerneldev" / "lock").exists()

    # watch: the same counts for one save that changes nothing and one that is pushed.
    host = load_config(str(config)).host("n0")
    events: queue.Queue = queue.Queue()
    options = watch.WatchOptions(import_check=False, debounce=0.05, keepalive=3600)
    watcher = watch.Watcher(host, options, events.put)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()

    def next_push() -> watch.WatchEvent:
        while True:
            event = events.get(timeout=60)
            assert event.kind in (watch.READY, watch.PUSH), event
            if event.kind == watch.PUSH:
                return event

    try:
        assert events.get(timeout=60).kind == watch.READY
        counter.opened.clear()
        (Path(host.workspace) / "k.py").write_bytes(b"k v2\n" * 3000)  # saved, unchanged
        assert next_push().outcome == watch.UNCHANGED
        assert len(counter.opened) == 0, counter.opened
        counter.opened.clear()
        (Path(host.workspace) / "k.py").write_bytes(b"k v3\n" * 3000)
        assert next_push().outcome == watch.PUSHED
        assert len(counter.opened) == 0, counter.opened
        assert (Path(host.root) / "k.py").read_bytes() == b"k v3\n" * 3000
        assert not (Path(host.root) / ".kerneldev" / "lock").exists()
        # The lock rules stay: a stale lock (its process is gone) is taken over, with a note.
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = {"user": "bob", "machine": socket.gethostname(), "pid": dead.pid}
        stale.update(command="push", since="2026-11-30T06:00:00Z", token="deadbeef")
        (Path(host.root) / ".kerneldev" / "lock").write_text(json.dumps(stale))
        (Path(host.workspace) / "k.py").write_bytes(b"k v4\n" * 3000)
        event = next_push()
        assert event.outcome == watch.PUSHED, event
        assert any(n.startswith("took over a stale lock: bob@") for n in event.notes), event
        assert (Path(host.root) / "k.py").read_bytes() == b"k v4\n" * 3000
        assert not (Path(host.root) / ".kerneldev" / "lock").exists()
    finally:
        monkeypatch.setattr(interrupt, "_pending", signal.SIGINT)  # ends the watch
        thread.join(timeout=60)
    assert events.get(timeout=5).kind == watch.STOPPED


# --- put_files: push's one stream up ---------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _item(root: Path, name: str, data: bytes, **fields) -> PutItem:
    return PutItem(str(root / name), lambda: io.BytesIO(data), **fields)


def test_put_files_every_name_empty_files_and_modes_byte_for_byte(host):
    root = Path(host.root)
    contents = {name: b"new " + name.encode() * 30 for name in HOSTILE_NAMES}
    contents["empty.py"] = b""
    contents["sub dir/big.bin"] = os.urandom(3 << 20)
    (root / "plain.py").write_bytes(b"old")
    (root / "plain.py").chmod(0o750)  # an existing file keeps its mode
    (root / "-dash.py").write_bytes(b"old")
    names = sorted(contents)
    items = [
        _item(
            root,
            n,
            contents[n],
            mode=None if n in ("plain.py", "-dash.py") else 0o600 if n == "empty.py" else 0o644,
            expect_sha256=_sha(b"old") if n in ("plain.py", "-dash.py") else None,
        )
        for n in names
    ]
    landed = []
    with SSHTransport(host) as t:
        t.put_files(items, on_landed=lambda i, sha, size: landed.append((names[i], sha, size)))
    assert landed == [(n, _sha(contents[n]), len(contents[n])) for n in names]
    for name, data in contents.items():
        assert (root / name).read_bytes() == data, name
    assert stat.S_IMODE((root / "plain.py").stat().st_mode) == 0o750
    assert stat.S_IMODE((root / "empty.py").stat().st_mode) == 0o600
    assert _temp_files(root) == []


def test_put_files_compare_and_swap_stops_at_the_changed_file(host):
    root = Path(host.root)
    for name in ("a.py", "b.py", "c.py"):
        (root / name).write_bytes(b"v1 " + name.encode())
    (root / "b.py").write_bytes(b"changed by hand")  # since the plan saw v1
    items = [
        _item(root, n, b"v2", expect_sha256=_sha(b"v1 " + n.encode()))
        for n in ("a.py", "b.py", "c.py")
    ]
    landed = []
    with SSHTransport(host) as t:
        with pytest.raises(LiveChangedError) as caught:
            t.put_files(items, on_landed=lambda i, sha, size: landed.append(i))
        assert t.run("true").ok  # the connection is still usable
    assert caught.value.index == 1 and landed == [0]
    assert (root / "a.py").read_bytes() == b"v2"
    assert (root / "b.py").read_bytes() == b"changed by hand"
    assert (root / "c.py").read_bytes() == b"v1 c.py"
    assert _temp_files(root) == []


def test_put_files_ctrl_c_mid_file_lands_nothing_half_written(host):
    root = Path(host.root)
    (root / "a.py").write_bytes(b"a v1")
    (root / "big.bin").write_bytes(b"big v1")
    big = os.urandom(4 << 20)
    items = [_item(root, "a.py", b"a v2"), _item(root, "big.bin", big)]
    items = [PutItem(i.path, i.open, check=False) for i in items]
    sent = []

    def on_bytes(n: int) -> None:
        sent.append(n)
        if len(sent) == 2:  # the first chunk of big.bin is out
            os.kill(os.getpid(), signal.SIGINT)

    landed = []
    with SSHTransport(host) as t:
        with pytest.raises(interrupt.Interrupted), interrupt.deferred_signals():
            t.put_files(items, on_landed=lambda i, sha, size: landed.append(i), on_bytes=on_bytes)
        assert t.run("true").ok
    assert landed == [0]  # exactly what the host renamed is reported as landed
    assert (root / "a.py").read_bytes() == b"a v2"
    assert (root / "big.bin").read_bytes() == b"big v1"
    assert _temp_files(root) == []


def test_a_name_of_255_bytes_is_pulled_pushed_and_rolled_back(host):
    # The longest legal name: its temporary file's name must still fit in 255 bytes.
    host = replace(host, files=("*.py",))
    name = "é" * 120 + "x" * 12 + ".py"
    assert len(name.encode()) == 255
    root, ws = Path(host.root), Path(host.workspace)
    (root / name).write_bytes(b"v1\n")
    (root / "short.py").write_bytes(b"s1\n")
    with SSHTransport(host) as t:
        sync.pull(t, host)
        assert (ws / name).read_bytes() == b"v1\n"
        (ws / name).write_bytes(b"v2\n")
        (ws / "short.py").write_bytes(b"s2\n")
        with host_lock.HostLock(t, host.root, "push", wait=5):
            pushed = sync.push(t, host)
        assert sorted(pushed.deployed) == sorted([name, "short.py"])
        assert (root / name).read_bytes() == b"v2\n"
        with host_lock.HostLock(t, host.root, "rollback", wait=5):
            sync.rollback(t, host)
    assert (root / name).read_bytes() == b"v1\n"
    assert _temp_files(root) == [] and _temp_files(ws) == []
