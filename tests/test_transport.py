"""The transport contract, run identically over `LocalTransport`, `SSHTransport` (a real sshd
on 127.0.0.1; by default every step through its host agent, and with the agent pinned off as on
a host without python3), a bare `AgentTransport` (as a kept session's client uses it) and a
one-shot command's agent under the system's `ssh` (`OneShotTransport`, no fallback):
whatever pull/diff/push build on it behaves the same on all."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from kerneldev import interrupt
from kerneldev.errors import HostConnectionError, RemoteCommandError, TransferError
from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.local import LocalTransport
from kerneldev.hosts.transport.one_shot import OneShotTransport
from kerneldev.hosts.transport.over_agent import AgentTransport
from kerneldev.hosts.transport.ssh import SSHTransport, hash_command, start_agent
from kerneldev.hosts.transport.ssh_connection import SSHConnection
from tests.faults import CuttingProxy, process_gone
from tests.sshutil import ssh_host

HOSTILE_NAMES = [
    "plain.py",
    "with space.py",
    "single'quote.py",
    'double"quote.py',
    "new\nline.py",
    "ünïcødé_注意.py",
    "$(touch pwned).py",
    "-dash.py",
]


@pytest.fixture(params=["local", "ssh", "ssh-no-agent", "agent", "openssh"])
def host(request, tmp_path, isolated_home, monkeypatch):
    """(transport, live root) for each kind of host; the root is a fresh folder."""
    root = tmp_path / "live"
    root.mkdir()
    if request.param == "local":
        transport = LocalTransport()
    elif request.param == "agent":
        server = request.getfixturevalue("sshd_server")
        config = ssh_host(server, tmp_path)
        connection = SSHConnection(config)
        request.addfinalizer(connection.close)
        client, _ = start_agent(connection, ["python3"])
        transport = AgentTransport(client, config, config.name)
    elif request.param == "openssh":
        monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "openssh")  # no fallback to paramiko
        server = request.getfixturevalue("sshd_server")
        transport = open_transport(ssh_host(server, tmp_path), keep=False)
        assert isinstance(transport, OneShotTransport)
    else:
        if request.param == "ssh-no-agent":
            monkeypatch.setenv("KERNELDEV_TRANSFER", "stream")  # today's paths, no agent
        monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "paramiko")
        server = request.getfixturevalue("sshd_server")
        transport = open_transport(ssh_host(server, tmp_path))
        assert isinstance(transport, SSHTransport)
    with transport:
        yield transport, root


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- run --------------------------------------------------------------------------------


def test_run_reports_exit_code_stdout_and_stderr(host):
    t, _ = host
    result = t.run("echo out; echo err >&2; exit 3")
    assert (result.exited, result.stdout, result.stderr, result.ok) == (3, "out\n", "err\n", False)
    assert t.run("true").ok


def test_run_is_sh_c_with_quotes_pipes_and_variables(host):
    t, _ = host
    result = t.run("""x='a "b" c'; printf '%s\\n' "$x" | tr a A""")
    assert result.stdout == 'A "b" c\n'


def test_run_passes_stdin_bytes_unchanged(host):
    t, _ = host
    data = "päth\n\x00 bytes ✓\n".encode() * 1000
    result = t.run("sha256sum", stdin=data)
    assert result.stdout.split()[0] == sha(data)


def test_run_streams_output_as_it_arrives(host, tmp_path):
    t, _ = host
    seen: list[str] = []
    heard = tmp_path / "heard-one"

    def on_output(text: str) -> None:
        seen.append(text)
        heard.touch()  # the command writes "two" only once "one" has reached us

    # No delay to race: "two" waits for the callback to have had "one", so the run can only
    # end if output is handed on while the command still runs (not all at the end: then the
    # command would wait until the timeout).
    result = t.run(
        f"echo one; while [ ! -e '{heard}' ]; do sleep 0.05; done; echo two",
        on_output=on_output,
        timeout=60,
    )
    assert result.stdout == "one\ntwo\n"
    assert "".join(seen) == "one\ntwo\n"
    assert seen[0] == "one\n"  # delivered alone, before "two" was written


def test_run_timeout_ends_the_command_on_the_host(host, tmp_path):
    # A health command that hangs was left running on the host after each timed-out check.
    t, _ = host
    pidfile = tmp_path / "pid"
    start = time.monotonic()
    # 5 s, not less: on a loaded machine (parallel test workers on 2 cores) the session and the
    # shell can take over a second to start, and the command must have started to be ended.
    with pytest.raises(RemoteCommandError, match="timed out"):
        t.run(f"echo $$ > {pidfile}; exec sleep 60", timeout=5)
    assert time.monotonic() - start < 40  # not the command's 60 s (margin for a loaded machine)
    assert process_gone(int(pidfile.read_text()))
    assert t.run("echo still usable").stdout == "still usable\n"


def test_ctrl_c_during_run_ends_the_command_on_the_host(host, tmp_path):
    t, _ = host
    pidfile = tmp_path / "pid"

    def ctrl_c_once_started() -> None:
        while not pidfile.exists() or not pidfile.read_text().strip():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # as the terminal sends it

    threading.Thread(target=ctrl_c_once_started, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(interrupt.Interrupted), interrupt.deferred_signals():
        t.run(f"echo $$ > {pidfile}; exec sleep 60")
    assert time.monotonic() - start < 40  # not the command's 60 s
    assert process_gone(int(pidfile.read_text()))
    assert t.run("echo still usable").stdout == "still usable\n"


def test_run_does_not_wait_for_a_background_daemon(host, tmp_path):
    t, _ = host
    release = tmp_path / "release"
    # The daemon runs until the test lets it go, after run() returned: a run that waited for
    # it would end only at the timeout (an error). No wall-clock bound to race.
    daemon = f"while [ ! -e '{release}' ]; do sleep 0.1; done"
    try:
        result = t.run(f"({daemon} >/dev/null 2>&1 &) ; echo started", timeout=60)
    finally:
        release.touch()
    assert result.stdout == "started\n" and result.ok


# --- hash_files -------------------------------------------------------------------------


def test_hash_files_hostile_names_in_one_call(host):
    t, root = host
    folder = root / "python" / "attn"
    folder.mkdir(parents=True)
    for name in HOSTILE_NAMES:
        (folder / name).write_bytes(name.encode())
    files, unmatched = t.hash_files(str(root), [f"python/attn/{n}" for n in HOSTILE_NAMES])
    assert unmatched == []
    assert [f.path for f in files] == sorted(f"python/attn/{n}" for n in HOSTILE_NAMES)
    for f in files:
        data = f.path.rsplit("/", 1)[1].encode()
        assert (f.sha256, f.size, f.mode) == (sha(data), len(data), 0o644)
    assert not (root / "pwned").exists() and not Path("pwned").exists()


def test_hash_files_globs_like_the_shell(host):
    t, root = host
    (root / "a" / "sub").mkdir(parents=True)
    for name in ("k1.py", "k2.py", ".hidden.py", "notes.txt", "sub/deep.py"):
        (root / "a" / name).write_text(name)
    (root / "a" / "dir.py").mkdir()  # a folder matching the glob is not a file
    os.chmod(root / "a" / "k2.py", 0o755)
    files, unmatched = t.hash_files(str(root), ["a/*.py", "a/k1.py", "nothing/*.py", "gone.py"])
    assert [f.path for f in files] == ["a/k1.py", "a/k2.py"]  # de-duplicated, sorted
    assert files[1].mode == 0o755
    assert unmatched == ["nothing/*.py", "gone.py"]


def test_hash_files_never_leaves_root(host, tmp_path):
    t, root = host
    secret = tmp_path / "secret.py"
    secret.write_text("outside")
    (tmp_path / "outside_dir").mkdir()
    (tmp_path / "outside_dir" / "x.py").write_text("outside")
    (root / "ok.py").write_text("inside")
    (root / "link_out.py").symlink_to(secret)  # a symlink escaping root
    (root / "dir_out").symlink_to(tmp_path / "outside_dir")  # a folder symlink escaping root
    (root / "link_in.py").symlink_to(root / "ok.py")  # a symlink that stays inside is fine
    patterns = ["../secret.py", "*.py", "dir_out/x.py", str(secret), "sub/../../secret.py"]
    files, unmatched = t.hash_files(str(root), patterns)
    assert [f.path for f in files] == ["link_in.py", "ok.py"]
    assert all(f.sha256 == sha(b"inside") for f in files)
    assert unmatched == ["../secret.py", "dir_out/x.py", str(secret), "sub/../../secret.py"]


def test_hash_files_of_a_missing_root_matches_nothing(host, tmp_path):
    t, _ = host
    assert t.hash_files(str(tmp_path / "nope"), ["a.py"]) == ([], ["a.py"])


# --- files ------------------------------------------------------------------------------


def test_read_bytes_round_trip_and_missing_file(host):
    t, root = host
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    (root / "big.bin").write_bytes(data)
    assert t.read_bytes(str(root / "big.bin")) == data
    with pytest.raises(TransferError, match="no such file"):
        t.read_bytes(str(root / "missing.py"))
    with pytest.raises(TransferError):
        t.read_bytes(str(root))  # a folder


def test_write_atomic_replaces_by_rename_and_keeps_mode(host):
    t, root = host
    target = root / "kernel.py"
    target.write_text("old")
    os.chmod(target, 0o750)
    inode = target.stat().st_ino
    t.write_atomic(str(target), b"new contents")
    assert target.read_bytes() == b"new contents"
    assert target.stat().st_mode & 0o7777 == 0o750
    # A new inode: the name was switched to a complete file, never written in place.
    assert target.stat().st_ino != inode
    assert sorted(os.listdir(root)) == ["kernel.py"]  # no temporary file left behind


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_write_atomic_as_root_keeps_the_owner(host):
    t, root = host
    target = root / "owned.py"
    target.write_text("old")
    os.chown(target, 65534, 65534)  # e.g. the service user owns the live repo
    t.write_atomic(str(target), b"new")
    assert (target.stat().st_uid, target.stat().st_gid) == (65534, 65534)


def test_write_atomic_creates_parents_and_honours_mode(host):
    t, root = host
    target = root / "new" / "deep" / "file name.py"
    t.write_atomic(str(target), b"x", mode=0o600)
    assert target.read_bytes() == b"x"
    assert target.stat().st_mode & 0o7777 == 0o600


def test_write_atomic_through_a_symlink_keeps_the_link(host):
    t, root = host
    (root / "real.py").write_text("old")
    (root / "alias.py").symlink_to(root / "real.py")
    t.write_atomic(str(root / "alias.py"), b"new")
    assert (root / "alias.py").is_symlink()
    assert (root / "real.py").read_bytes() == b"new"


def test_write_atomic_failure_leaves_no_temp_file(host):
    t, root = host
    target = root / "occupied"
    target.mkdir()
    (target / "keep").write_text("x")  # renaming a file over a non-empty folder must fail
    with pytest.raises(TransferError):
        t.write_atomic(str(target), b"data")
    assert sorted(os.listdir(root)) == ["occupied"]
    assert (target / "keep").read_text() == "x"


def test_copy_on_host_keeps_bytes_mode_times_and_owner_and_hashes_each_copy(host):
    """`copy_on_host` (a push's backups, a rollback's restore): the shell script's
    `mkdir -p`, `cp -p`, `mv -f` and `sha256sum` on a host without the agent, one forked
    helper through it: the same copies, sums and temporary-file hygiene either way."""
    t, root = host
    (root / "src").mkdir()
    data = {name: (name * 50).encode("utf-8") for name in HOSTILE_NAMES}
    for i, (name, body) in enumerate(data.items()):
        (root / "src" / name).write_bytes(body)
        os.chmod(root / "src" / name, 0o640 + i % 2)
        os.utime(root / "src" / name, ns=(1_600_000_000_123_456_789, 1_500_000_000_987_654_321))
    pairs = [(str(root / "src" / n), str(root / "backup" / "deep" / n)) for n in data]
    sums = t.copy_on_host(pairs)
    assert sums == {dst: sha(data[os.path.basename(dst)]) for _, dst in pairs}
    for src, dst in pairs:
        a, b = os.stat(src), os.stat(dst)
        assert Path(dst).read_bytes() == Path(src).read_bytes()
        assert (b.st_mode, b.st_uid, b.st_gid) == (a.st_mode, a.st_uid, a.st_gid)
        assert b.st_mtime_ns == a.st_mtime_ns
    assert sorted(os.listdir(root / "backup" / "deep")) == sorted(data)  # no temporary files
    # A missing source fails the call; what came before it is copied, nothing is left half.
    missing = [
        (pairs[0][0], str(root / "again" / "a")),
        (str(root / "nope"), str(root / "again" / "b")),
    ]
    with pytest.raises(TransferError, match="copying on"):
        t.copy_on_host(missing)
    assert os.listdir(root / "again") == ["a"]
    assert t.copy_on_host([]) == {}


def test_exists_mkdirs_remove(host):
    t, root = host
    tree = root / "backups" / "d1" / "python"
    t.mkdirs(str(tree))
    t.mkdirs(str(tree))  # twice is fine
    (tree / "f.py").write_text("x")
    assert t.exists(str(tree / "f.py")) and not t.exists(str(root / "nope"))
    t.remove(str(root / "backups"))
    assert not t.exists(str(root / "backups"))
    t.remove(str(root / "backups"))  # absent is fine


# --- network ----------------------------------------------------------------------------


@pytest.fixture
def http_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_get_as_seen_from_the_host(host, http_server):
    t, _ = host
    assert t.http_get(f"{http_server}/health") == 200
    assert t.http_get(f"{http_server}/other?x=1") == 404


def test_http_get_with_nothing_listening(host):
    from tests.sshd import free_port

    t, _ = host
    with pytest.raises(HostConnectionError):
        t.http_get(f"http://127.0.0.1:{free_port()}/health", timeout=2)


# --- SSH only ---------------------------------------------------------------------------


def test_ssh_calls_while_agent_starts_once_while_the_host_starts_it(
    sshd_server, tmp_path, isolated_home
):
    """`while_agent_starts` runs once, after the agent was asked for and before its HELLO is
    awaited (the CLI imports rich there, while the host starts its shell and Python)."""
    transport = open_transport(ssh_host(sshd_server, tmp_path), keep=False)
    assert isinstance(transport, SSHTransport)
    calls = []
    transport.while_agent_starts = lambda: calls.append(transport._agent)
    with transport:
        assert transport.run("echo one").stdout == "one\n"
        assert transport.run("echo two").stdout == "two\n"
    assert calls == [None]  # once, before the agent's transport existed


def test_the_first_request_goes_out_before_the_agents_hello(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    """A command's first request follows the agent's source at once (no round trip for the
    HELLO); the host agent answers it after its HELLO. The login is slowed (`sleep`) only so
    that the order is certain."""
    from kerneldev.hosts.transport import agent_client, ssh

    real = ssh.agent_command
    monkeypatch.setattr(ssh, "agent_command", lambda pythons: "sleep 1; " + real(pythons))
    events = []
    dispatch = agent_client.AgentClient._dispatch

    def seen(self, kind, rid, payload):
        if kind == agent_client.HELLO:
            events.append("hello")
        return dispatch(self, kind, rid, payload)

    monkeypatch.setattr(agent_client.AgentClient, "_dispatch", seen)
    write = agent_client.AgentClient._write_frame
    monkeypatch.setattr(
        agent_client.AgentClient,
        "_write_frame",
        lambda self, frame: (events.append(frame[8]), write(self, frame))[1],
    )
    host = ssh_host(sshd_server, tmp_path)
    (Path(host.root) / "a.py").write_text("a")
    with SSHTransport(host) as t:
        files, _ = t.hash_files(host.root, ["*.py"])
        assert [f.path for f in files] == ["a.py"] and t.agent_unavailable is None
    assert events[:2] == [agent_client.OPEN, "hello"], events


def test_a_first_request_sent_into_a_shell_without_python3_runs_once_without_the_agent(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    """The first request goes out before the agent's HELLO. On a host where the agent cannot
    start (no python3 for it), that request was never run by anyone: the step is done the way
    without the agent, exactly once - a command with a side effect, and a push whose first
    request takes the host lock (were it run twice, the second would find the lock busy)."""
    from kerneldev.hosts.transport import ssh
    from kerneldev.loop import lock as host_lock
    from kerneldev.loop import sync

    monkeypatch.setattr(
        ssh, "agent_command", lambda _: "echo 'kerneldev: no python3 on the host' >&2; exit 127"
    )
    host = ssh_host(sshd_server, tmp_path)
    root = Path(host.root)
    with SSHTransport(host) as t:
        assert t.run(f"echo once >> {root}/ran").ok
        assert t.agent_unavailable == "no python3 on the host"
    assert (root / "ran").read_text() == "once\n"

    (root / "a.py").write_text("v1\n")
    with SSHTransport(host) as t:
        sync.pull(t, host)
    (Path(host.workspace) / "a.py").write_text("v2\n")
    with SSHTransport(host) as t:
        lock = host_lock.HostLock(t, host.root, "push", wait=0)
        try:
            result = sync.push(t, host, lock=lock, release_lock=True)
        finally:
            lock.release()
        assert t.agent_unavailable == "no python3 on the host"
    assert result.deployed == ["a.py"] and (root / "a.py").read_text() == "v2\n"
    assert not (root / ".kerneldev" / "lock").exists()
    assert '"a.py"' in (root / ".kerneldev" / "history.jsonl").read_text()


def test_ssh_uses_one_connection_for_everything(sshd_server, tmp_path, isolated_home, http_server):
    host = ssh_host(sshd_server, tmp_path)
    root = Path(host.root)
    (root / "a.py").write_text("a")
    with SSHTransport(host) as t:
        assert t.connection._transport is None  # lazy: nothing happens until first use
        t.run("true")
        connection = t.connection._transport
        t.hash_files(str(root), ["*.py"])
        t.read_bytes(str(root / "a.py"))
        t.write_atomic(str(root / "a.py"), b"b")
        t.http_get(f"{http_server}/health")
        assert t.connection._transport is connection and connection.is_active()
    assert t.connection._transport is None


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_cut_during_an_sftp_read_leaves_no_dying_thread(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    """The SFTP read-ahead thread (paramiko's, started by our prefetch) sends its requests as
    the connection goes: it used to die with `OSError: Socket is closed` (a traceback; an
    error under -W error) while the reader reported the loss. The cut comes after 64 KB, before
    the ~150 KB of requests for this file are all sent, so it always falls in that window."""
    monkeypatch.setenv("KERNELDEV_TRANSFER", "sftp")
    proxy = CuttingProxy(sshd_server.port)
    host = ssh_host(sshd_server, tmp_path, port=proxy.port)
    (tmp_path / "known_hosts").write_text(
        sshd_server.host_key_line.replace(f":{sshd_server.port} ", f":{proxy.port} ")
    )
    big = Path(host.root) / "big.bin"
    with open(big, "wb") as f:
        f.truncate(64 << 20)  # sparse: 2048 read requests of 32 KB
    try:
        with SSHTransport(host) as t:
            t.run("true")  # connected: the cut counts from the read on
            proxy.reset(64 * 1024)
            with pytest.raises(HostConnectionError, match="lost"):
                t.read_bytes(str(big))
        for thread in threading.enumerate():
            if thread.name.endswith("(read_ahead)") or thread.name.endswith("(_prefetch_thread)"):
                thread.join(30)  # its end (and any exception) falls in this test
    finally:
        proxy.close()
    assert proxy.cut


def test_ssh_hashing_falls_back_to_the_configured_python(sshd_server, tmp_path, isolated_home):
    host = ssh_host(sshd_server, tmp_path)
    (Path(host.root) / "a.py").write_text("a")
    request = json.dumps({"root": host.root, "patterns": ["*.py"]}).encode()
    no_path = "PATH=/nonexistent; export PATH; "
    with SSHTransport(host) as t:
        # No python3 on PATH: the configured interpreter (an absolute path) is used instead.
        found = t.run(no_path + hash_command(["python3", sys.executable]), stdin=request)
        assert found.ok and json.loads(found.stdout)["files"][0]["path"] == "a.py"
        # Neither: a clear message and exit 127, which hash_files turns into TransferError.
        missing = t.run(no_path + hash_command(["python3"]), stdin=request)
        assert missing.exited == 127 and "no python3 on the host" in missing.stderr


# --- stream_files -----------------------------------------------------------------------


def test_stream_files_byte_for_byte_hostile_names_and_empty(host):
    t, root = host
    contents = {name: (name.encode() * 7) for name in HOSTILE_NAMES}
    contents["empty.py"] = b""
    contents["big.bin"] = os.urandom(3 << 20)  # several stream records
    for name, data in contents.items():
        (root / name).write_bytes(data)
    names = sorted(contents)
    got = {}
    for path, chunks in t.stream_files([str(root / n) for n in names]):
        got[path] = b"".join(chunks)
    assert got == {str(root / n): contents[n] for n in names}


def test_stream_files_missing_file_raises_and_stops_early(host):
    t, root = host
    (root / "a.py").write_bytes(b"a")
    (root / "b.py").write_bytes(b"b" * 100)
    stream = t.stream_files([str(root / "a.py"), str(root / "gone.py"), str(root / "b.py")])
    _, chunks = next(stream)
    assert b"".join(chunks) == b"a"
    _, chunks = next(stream)
    with pytest.raises(TransferError, match="no such file"):
        b"".join(chunks)
    stream.close()  # an early stop: the transfer ends, the connection stays usable
    assert t.run("echo still here").stdout == "still here\n"


def test_ssh_without_python3_for_the_agent_falls_back_with_the_reason(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    from kerneldev.hosts.transport import ssh

    host = ssh_host(sshd_server, tmp_path)
    (Path(host.root) / "a.py").write_text("a")
    # What the agent's start prints and exits with on a host that has no python3 at all.
    monkeypatch.setattr(
        ssh, "agent_command", lambda _: "echo 'kerneldev: no python3 on the host' >&2; exit 127"
    )
    with SSHTransport(host) as t:
        assert t.run("echo old path").stdout == "old path\n"
        assert t.agent_unavailable == "no python3 on the host"
        assert t.read_bytes(str(Path(host.root) / "a.py")) == b"a"
    monkeypatch.setenv("KERNELDEV_TRANSFER", "agent")  # required: a clear error instead
    with SSHTransport(host) as t:
        with pytest.raises(TransferError, match="cannot start the host agent.*no python3"):
            t.run("true")


def test_each_chained_step_acts_only_while_the_lock_holds_its_token(
    sshd_server, tmp_path, isolated_home
):
    """A push's chain holds its lock (`AgentChain.hold`): each step - the marker's write, the
    backups, the upload, the record's append - checks on the host that the lock file still
    holds the push's token before it acts. With another command's token there (the lock taken
    over, as after a cut connection), none of them touches anything and each says why; with
    its own token, each acts."""
    from kerneldev.errors import LockLostError
    from kerneldev.hosts.transport.base import PutFilesCallbacks, PutItem

    host = ssh_host(sshd_server, tmp_path)
    root = Path(host.root)
    lock_file, live = root / "lock", root / "live.py"
    live.write_bytes(b"old\n")
    old_sha = hashlib.sha256(b"old\n").hexdigest()
    mine = {"path": str(lock_file), "token": "0123456789abcdef"}
    marker, backup, history_file = root / "b" / "marker", root / "b" / "live.py", root / "history"

    def steps(chain):
        yield lambda: chain.write_atomic(str(marker), b"planned\n").result()
        yield lambda: chain.copy_on_host([(str(live), str(backup))], [old_sha]).result()
        item = PutItem(str(live), lambda: io.BytesIO(b"new\n"), None, old_sha)
        callbacks = PutFilesCallbacks(lambda i, sha, size: None)
        yield lambda: chain.put_files([item], callbacks, 4).result()
        yield lambda: chain.append_text(str(history_file), "record\n").result()

    lock_file.write_text('{"token": "fedcba9876543210", "user": "someone else"}\n')
    with open_transport(host) as t:
        for i in range(4):
            chain = t.chain()
            assert chain is not None
            chain.hold(mine)
            with pytest.raises(LockLostError, match="taken over") as caught, chain:
                list(steps(chain))[i]()
            assert "no longer holds this command's token" in caught.value.message
        assert live.read_bytes() == b"old\n"
        assert not (root / "b").exists() and not history_file.exists()
        assert sorted(p.name for p in root.iterdir()) == ["live.py", "lock"]  # no temp file

        lock_file.write_text(json.dumps({"token": mine["token"]}) + "\n")
        chain = t.chain()
        chain.hold(mine)
        with chain:
            for step in steps(chain):
                step()
    assert marker.read_bytes() == b"planned\n" and backup.read_bytes() == b"old\n"
    assert live.read_bytes() == b"new\n" and history_file.read_text() == "record\n"


def test_chained_record_append_removes_the_marker_and_releases_only_its_own_lock(
    sshd_server, tmp_path, isolated_home
):
    """The chain's last step (`appendrecord.py`, one helper process where the shell took seven
    programs): the record appended (its folder made), the marker removed, the lock released
    only while it holds the push's token; a failed append stops it before the rest."""
    host = ssh_host(sshd_server, tmp_path)
    root = Path(host.root)
    lock_file, marker = root / "lock", root / "b" / ".incomplete"
    history_file = root / "h" / "history.jsonl"
    mine = {"path": str(lock_file), "token": "0123456789abcdef"}
    marker.parent.mkdir()
    with open_transport(host) as t:
        for token, released in (("fedcba9876543210", False), (mine["token"], True)):
            lock_file.write_text(json.dumps({"token": token}) + "\n")
            marker.write_text("planned\n")
            chain = t.chain()
            with chain:
                step = chain.append_text(
                    str(history_file), "record\n", remove=[str(marker)], release=mine
                )
                assert step.result().ok
            assert not marker.exists() and lock_file.exists() != released
        assert history_file.read_text() == "record\n" * 2
        # A folder where the record goes: the append fails, the marker stays.
        marker.write_text("planned\n")
        lock_file.write_text(json.dumps({"token": mine["token"]}) + "\n")
        chain = t.chain()
        with chain:
            result = chain.append_text(
                str(root / "b"), "record\n", remove=[str(marker)], release=mine
            ).result()
        assert not result.ok and "appendrecord: append to" in result.stderr
        assert marker.exists() and lock_file.exists()
