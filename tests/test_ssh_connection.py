"""Trust and connection failures against a real sshd: what a user sees when a host is new, when
its key changed, when the port is wrong, the key is wrong, or the host goes away mid-command."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
from paramiko.hostkeys import HostKeys

from kerneldev.errors import ConnectionLostError, HostConnectionError, HostKeyError
from kerneldev.hosts.transport.ssh import SSHTransport, parse_jump
from kerneldev.hosts.transport.ssh_connection import QuickAckSocket, SSHConnection
from kerneldev.sandbox.host import free_port, keygen
from tests.sshutil import (
    kill_sshd_and_sessions,
    kill_sshd_once_running,
    run_cli,
    ssh_host,
    start_on_terminal,
    write_hosts_yaml,
)


@pytest.fixture(autouse=True)
def _home(isolated_home):
    return isolated_home


def openssh_fingerprint(server) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-lf", f"{server.host_key}.pub"], capture_output=True, text=True, check=True
    ).stdout
    return out.split()[1]  # "256 SHA256:... comment (ED25519)"


def cli(*args: str, config: Path, input: str | None = None):
    return run_cli(*args, config=config, input=input)


# --- host keys --------------------------------------------------------------------------


def test_unknown_host_key_is_refused_with_fingerprint_and_hint(fresh_sshd, tmp_path):
    host = ssh_host(fresh_sshd, tmp_path, trusted=False)
    with pytest.raises(HostKeyError) as caught, SSHTransport(host) as t:
        t.run("true")
    err = caught.value
    assert "ssh-ed25519" in err.message and openssh_fingerprint(fresh_sshd) in err.message
    assert f"[127.0.0.1]:{fresh_sshd.port}" in err.message
    assert "kerneldev trust --host testhost" in err.hint
    assert not Path(host.known_hosts).exists()  # nothing was added behind the user's back


def test_trust_yes_then_connect_works(fresh_sshd, tmp_path):
    host = ssh_host(fresh_sshd, tmp_path, trusted=False)
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)

    proc = cli("trust", "--yes", config=config)
    assert proc.returncode == 0, proc.stderr
    assert openssh_fingerprint(fresh_sshd) in proc.stderr
    line = Path(host.known_hosts).read_text()
    kind, blob = fresh_sshd.host_key.with_suffix(".pub").read_text().split()[:2]
    assert line == f"[127.0.0.1]:{fresh_sshd.port} {kind} {blob}\n"
    assert Path(host.known_hosts).stat().st_mode & 0o777 == 0o600

    with SSHTransport(host) as t:
        assert t.run("echo in").stdout == "in\n"

    again = cli("trust", "--yes", "--json", config=config)
    assert again.returncode == 0
    assert '"status": "already-trusted"' in again.stdout
    assert Path(host.known_hosts).read_text() == line  # not added twice


def answer_on_terminal(config: Path, answer: str, *args: str) -> tuple[int, str, str]:
    proc, typing = start_on_terminal("trust", *args, config=config)
    try:
        os.write(typing, answer.encode())  # the terminal keeps the line until it is read
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(typing)
    return proc.returncode, out.decode(), err.decode()


def test_trust_asks_and_a_no_adds_nothing(fresh_sshd, tmp_path):
    host = ssh_host(fresh_sshd, tmp_path, trusted=False)
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    code, _, err = answer_on_terminal(config, "n\n")
    assert code == 1 and "[y/N]" in err
    assert openssh_fingerprint(fresh_sshd) in err
    assert "stays untrusted" in err and "hint: run `kerneldev trust` again" in err
    assert not Path(host.known_hosts).exists()
    code, out, err = answer_on_terminal(config, "n\n", "--json")
    data = json.loads(out)
    assert code == 1 and data["status"] == "declined" and data["error"]["code"] == 1
    code, _, err = answer_on_terminal(config, "y\n")
    assert code == 0 and Path(host.known_hosts).exists(), err


def test_trust_without_a_terminal_asks_nothing_and_adds_nothing(fresh_sshd, tmp_path):
    host = ssh_host(fresh_sshd, tmp_path, trusted=False)
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    # A script piping "y" is not someone who read the fingerprint.
    proc = cli("trust", config=config, input="y\n")
    assert proc.returncode == 1 and "[y/N]" not in proc.stderr
    assert openssh_fingerprint(fresh_sshd) in proc.stderr
    assert "nobody answered (no terminal on stdin)" in proc.stderr
    assert "hint: check the fingerprint above, then `kerneldev trust --yes`" in proc.stderr
    assert not Path(host.known_hosts).exists()

    proc = cli("trust", "--json", config=config)
    assert proc.returncode == 1 and "[y/N]" not in proc.stderr
    data = json.loads(proc.stdout)
    assert data["status"] == "declined" and data["fingerprint"] == openssh_fingerprint(fresh_sshd)
    assert data["error"]["code"] == 1 and "--yes" in data["error"]["hint"]
    assert not Path(host.known_hosts).exists()


def test_changed_host_key_is_refused_loudly(fresh_sshd, tmp_path):
    host = ssh_host(fresh_sshd, tmp_path)
    old_fp = openssh_fingerprint(fresh_sshd)
    with SSHTransport(host) as t:
        t.run("true")
    fresh_sshd.rotate_host_key()
    new_fp = openssh_fingerprint(fresh_sshd)

    with pytest.raises(HostKeyError) as caught, SSHTransport(host) as t:
        t.run("true")
    message = caught.value.message
    assert "CHANGED" in message and "man-in-the-middle" in message
    assert old_fp in message and new_fp in message
    assert f"{host.known_hosts}:1" in message
    assert "ssh-keygen -R" in caught.value.hint

    # `trust` does not paper over it either.
    before = Path(host.known_hosts).read_text()
    proc = cli("trust", "--yes", config=write_hosts_yaml(tmp_path / "hosts.yaml", host))
    assert proc.returncode == 3 and "CHANGED" in proc.stderr and "Traceback" not in proc.stderr
    assert Path(host.known_hosts).read_text() == before


def test_hashed_known_hosts_entry_is_honoured(sshd_server, tmp_path):
    host = ssh_host(sshd_server, tmp_path, trusted=False)
    name, kind, blob = sshd_server.host_key_line.split()
    hashed = HostKeys.hash_host(name)
    Path(host.known_hosts).write_text(f"# comment\n{hashed} {kind} {blob}\n")
    with SSHTransport(host) as t:
        assert t.run("true").ok


def test_the_dialled_socket_sends_small_packets_at_once(sshd_server, tmp_path):
    """TCP_NODELAY: a request written as two SSH packets is not held back by Nagle's algorithm
    until the host's delayed ACK of the first (40 ms per kept no-op, docs/benchmarks.md)."""
    connection = SSHConnection(ssh_host(sshd_server, tmp_path))
    try:
        sock = connection.transport().sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert SSHTransport(connection).run("true").ok
    finally:
        connection.close()


def test_the_dialled_socket_acknowledges_what_it_reads_at_once(sshd_server, tmp_path):
    """TCP_QUICKACK re-armed after every read: sshd's channel-open confirmation is not held
    back by Nagle's algorithm until our delayed ACK (~40 ms per one-shot command)."""
    connection = SSHConnection(ssh_host(sshd_server, tmp_path))
    try:
        sock = connection.transport().sock
        assert isinstance(sock, QuickAckSocket)
        assert SSHTransport(connection).run("true").ok
    finally:
        connection.close()
    # What `recv` does, on a plain TCP pair: quick-ACK mode is on after each read (Linux
    # reports it through getsockopt), whatever the kernel's own choice was before it.
    with socket.create_server(("127.0.0.1", 0)) as server:
        plain = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with peer, QuickAckSocket.wrap(plain) as quick:
            for _ in range(3):
                quick.sendall(b"request")
                assert peer.recv(16) == b"request"
                peer.sendall(b"answer")
                assert quick.recv(16) == b"answer"
                assert quick.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1


def test_users_own_known_hosts_is_read(sshd_server, tmp_path, _home):
    host = ssh_host(sshd_server, tmp_path, trusted=False, known_hosts=None)
    (_home / ".ssh").mkdir()
    (_home / ".ssh" / "known_hosts").write_text(sshd_server.host_key_line)
    with SSHTransport(host) as t:
        assert t.run("true").ok


def test_a_key_for_another_port_is_not_trusted(sshd_server, tmp_path):
    host = ssh_host(sshd_server, tmp_path, trusted=False)
    # The same key recorded without a port means port 22, a different server.
    kind, blob = sshd_server.host_key_line.split()[1:]
    Path(host.known_hosts).write_text(f"127.0.0.1 {kind} {blob}\n")
    with pytest.raises(HostKeyError, match="not known"), SSHTransport(host) as t:
        t.run("true")


# --- connection failures ----------------------------------------------------------------


def test_connection_refused(tmp_path, sshd_server):
    host = ssh_host(sshd_server, tmp_path, port=free_port())
    with pytest.raises(HostConnectionError, match="connection refused"), SSHTransport(host) as t:
        t.run("true")


def test_dns_failure(tmp_path, sshd_server):
    host = ssh_host(sshd_server, tmp_path, hostname="no-such-host.invalid")
    with pytest.raises(HostConnectionError, match="cannot resolve host name"):
        SSHTransport(host).run("true")


def test_server_that_never_speaks_ssh_times_out(tmp_path, sshd_server):
    # Accepts TCP (the kernel's backlog) but never sends a banner: a hung or wrong service.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        host = ssh_host(sshd_server, tmp_path, port=silent.getsockname()[1])
        start = time.monotonic()
        with pytest.raises(HostConnectionError, match="handshake"):
            SSHTransport(SSHConnection(host, connect_timeout=1)).run("true")
        assert time.monotonic() - start < 8


def test_wrong_user_key_is_an_auth_failure(tmp_path, sshd_server):
    other_key = tmp_path / "other_key"
    keygen(other_key)
    host = ssh_host(sshd_server, tmp_path, identity_file=other_key)
    with pytest.raises(HostConnectionError) as caught, SSHTransport(host) as t:
        t.run("true")
    assert "authentication failed" in caught.value.message
    assert str(other_key) in caught.value.message
    assert "identity_file" in caught.value.hint


def test_missing_identity_file(tmp_path, sshd_server):
    host = ssh_host(sshd_server, tmp_path, identity_file=tmp_path / "nope")
    with pytest.raises(HostConnectionError, match="does not exist"), SSHTransport(host) as t:
        t.run("true")


def test_cli_reports_connection_errors_without_traceback(tmp_path, sshd_server):
    host = ssh_host(sshd_server, tmp_path, port=free_port())
    proc = cli("trust", "--yes", config=write_hosts_yaml(tmp_path / "hosts.yaml", host))
    assert proc.returncode == 3  # ExitCode.UNREACHABLE, apart from "found a problem"
    assert "connection refused" in proc.stderr and "Traceback" not in proc.stderr


def test_host_going_away_mid_session(fresh_sshd, tmp_path):
    host = ssh_host(fresh_sshd, tmp_path)
    (Path(host.root) / "a.py").write_text("a")
    t = SSHTransport(host)
    assert t.run("echo up").ok
    t.read_bytes(str(Path(host.root) / "a.py"))
    kill_sshd_and_sessions(fresh_sshd)
    time.sleep(0.3)
    with pytest.raises(ConnectionLostError) as caught:
        t.run("echo up")
    assert "connection to host 'testhost' was lost" in caught.value.message
    with pytest.raises(HostConnectionError) as caught:
        t.read_bytes(str(Path(host.root) / "a.py"))
    # "lost while reading <path>: <reason>", not "while read ...:" with an empty reason
    assert "while read " not in caught.value.message
    assert not caught.value.message.rstrip().endswith(":"), caught.value.message
    t.close()


def _lost_while_running(fresh_sshd, tmp_path, script: str) -> tuple[str, float]:
    """Runs `script` (it starts with `sleep 60`) and cuts the connection once the sleep runs:
    the ConnectionLostError's message and how long the run took."""
    host = ssh_host(fresh_sshd, tmp_path)
    with SSHTransport(host) as t:
        t.run("true")
        killer = kill_sshd_once_running(fresh_sshd, ["sleep", "60"])
        start = time.monotonic()
        with pytest.raises(ConnectionLostError) as caught:
            t.run(script)
        seconds = time.monotonic() - start
        killer.join()
    return caught.value.message, seconds


def test_connection_drops_while_a_command_runs(fresh_sshd, tmp_path):
    message, seconds = _lost_while_running(fresh_sshd, tmp_path, "sleep 60")
    assert "running `sleep 60`" in message, message
    assert seconds < 30  # not the command's 60 s


def test_connection_lost_error_quotes_only_the_start_of_a_long_remote_script(fresh_sshd, tmp_path):
    script = "sleep 60; " + "true; " * 100 + "\necho second-line"
    message, _ = _lost_while_running(fresh_sshd, tmp_path, script)
    assert "running `sleep 60; true;" in message and " ...`" in message
    assert "second-line" not in message and len(message) < 250


# --- ssh_config -------------------------------------------------------------------------


def test_ssh_config_alias_and_proxyjump_through_the_sshd_to_itself(
    sshd_server, tmp_path, monkeypatch
):
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        "Host target\n"
        "  HostName 127.0.0.1\n"
        f"  Port {sshd_server.port}\n"
        f"  User {sshd_server.user}\n"
        f"  ProxyJump {sshd_server.user}@127.0.0.1:{sshd_server.port}\n"
    )
    monkeypatch.setenv("KERNELDEV_SSH_CONFIG", str(ssh_config))
    host = ssh_host(sshd_server, tmp_path, hostname="target", port=None, user=None)
    with SSHTransport(host) as t:
        assert t.run("echo through").stdout == "through\n"
        assert len(t.connection.hops) == 1  # really went through the jump host's channel
        (Path(host.root) / "k.py").write_text("k")
        assert t.read_bytes(str(Path(host.root) / "k.py")) == b"k"


def test_proxyjump_host_key_is_checked_too(fresh_sshd, tmp_path, monkeypatch):
    ssh_config = tmp_path / "ssh_config"
    # The target's key is trusted as [127.0.0.1]:port; the jump host, named localhost, is not.
    ssh_config.write_text(
        f"Host target\n  HostName 127.0.0.1\n  ProxyJump localhost:{fresh_sshd.port}\n"
    )
    monkeypatch.setenv("KERNELDEV_SSH_CONFIG", str(ssh_config))
    host = ssh_host(fresh_sshd, tmp_path, hostname="target")
    with pytest.raises(HostKeyError) as caught, SSHTransport(host) as t:
        t.run("true")
    assert "jump host localhost" in caught.value.message
    assert f"[localhost]:{fresh_sshd.port}" in caught.value.message
    assert caught.value.message.startswith("jump host localhost: ")  # said once, up front
    assert caught.value.check.name == f"[localhost]:{fresh_sshd.port}"  # the key to trust
    # `trust` offers the jump host's key first.
    check = SSHConnection(host).scan_host_key()
    assert check.status == "unknown" and check.name == f"[localhost]:{fresh_sshd.port}"


def test_proxycommand(sshd_server, tmp_path, monkeypatch):
    known = tmp_path / "known_hosts"
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        "Host viaproxy\n"
        "  HostName 127.0.0.1\n"
        f"  Port {sshd_server.port}\n"
        f"  ProxyCommand ssh -F /dev/null -o BatchMode=yes -o UserKnownHostsFile={known} "
        f"-o StrictHostKeyChecking=yes -i {sshd_server.client_key} -p %p "
        f"-W %h:%p {sshd_server.user}@127.0.0.1\n"
    )
    monkeypatch.setenv("KERNELDEV_SSH_CONFIG", str(ssh_config))
    host = ssh_host(sshd_server, tmp_path, hostname="viaproxy", port=None)
    with SSHTransport(host) as t:
        assert t.run("echo proxied").stdout == "proxied\n"
        assert t.connection.proxy_commands  # the ProxyCommand process carried the connection


def test_a_proxycommand_that_never_answers_ends_with_the_command(tmp_path, monkeypatch):
    pidfile = tmp_path / "proxy.pid"
    proxy = tmp_path / "proxy.sh"
    proxy.write_text(f"#!/bin/sh\necho $$ > '{pidfile}'\nexec sleep 60\n")
    proxy.chmod(0o755)
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(f"Host hanging\n  HostName 127.0.0.1\n  ProxyCommand {proxy}\n")
    monkeypatch.setenv("KERNELDEV_SSH_CONFIG", str(ssh_config))
    config = tmp_path / "hosts.yaml"
    config.write_text("hosts:\n  h:\n    hostname: hanging\n    root: /srv\n    files: [a.py]\n")
    config.write_text(config.read_text() + "    workspace: ws\n")
    proc = cli("doctor", "--timeout", "1", config=config)
    assert proc.returncode == 1 and "SSH handshake with" in proc.stdout, proc.stdout + proc.stderr
    pid = int(pidfile.read_text())
    for _ in range(100):  # SIGTERM'd when the connection closed; give it a moment to go
        try:
            if " Z " in Path(f"/proc/{pid}/stat").read_text():
                break  # a zombie nobody reaped yet: ended
        except OSError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the ProxyCommand outlived kerneldev")


def test_explicit_config_wins_over_ssh_config(sshd_server, tmp_path, monkeypatch):
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host *\n  Port 1\n  User nobody-here\n")
    monkeypatch.setenv("KERNELDEV_SSH_CONFIG", str(ssh_config))
    host = ssh_host(sshd_server, tmp_path)
    target = SSHConnection(host).target()
    assert (target.port, target.user) == (sshd_server.port, sshd_server.user)
    bare = SSHConnection(replace(host, port=None, user=None)).target()
    assert (bare.port, bare.user) == (1, "nobody-here")


def test_parse_jump():
    assert parse_jump("bob@jump:2222") == ("jump", "bob", 2222)
    assert parse_jump("ssh://jump") == ("jump", None, None)
    assert parse_jump("[::1]:22") == ("::1", None, 22)
    assert parse_jump("jump") == ("jump", None, None)


def test_trust_walks_a_proxyjump_chain_one_key_at_a_time(fresh_sshd, tmp_path, monkeypatch):
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        f"Host target\n  HostName 127.0.0.1\n  ProxyJump localhost:{fresh_sshd.port}\n"
    )
    monkeypatch.setenv("KERNELDEV_SSH_CONFIG", str(ssh_config))
    host = ssh_host(fresh_sshd, tmp_path, hostname="target", trusted=False)
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)

    first = cli("trust", "--yes", config=config)
    assert first.returncode == 0, first.stderr
    assert "jump host [localhost]" in first.stderr and "run `kerneldev trust` again" in first.stderr
    second = cli("trust", "--yes", config=config)
    assert second.returncode == 0 and f"[127.0.0.1]:{fresh_sshd.port}" in second.stderr
    names = [line.split()[0] for line in Path(host.known_hosts).read_text().splitlines()]
    assert names == [f"[localhost]:{fresh_sshd.port}", f"[127.0.0.1]:{fresh_sshd.port}"]
    with SSHTransport(host) as t:
        assert t.run("echo ok").stdout == "ok\n"


def test_trust_on_a_local_host_has_nothing_to_do(tmp_path):
    config = tmp_path / "hosts.yaml"
    config.write_text(
        "hosts:\n  me:\n    transport: local\n    root: /x\n    files: [a]\n    workspace: w\n"
    )
    proc = cli("trust", "--json", config=config)
    assert proc.returncode == 0 and '"status": "local"' in proc.stdout


def test_import_paramiko_without_invoke_yet_match_exec_still_works(tmp_path):
    """kerneldev imports paramiko with `invoke` blocked (half of its import time); a
    ssh_config with `Match exec` gets the real invoke, so it is evaluated as before. In a
    child process: invoke reads stdin, which pytest's capture refuses."""
    import json
    import sys

    config = tmp_path / "ssh_config"
    config.write_text("Match exec true\n  User from-match-exec\nHost *\n  Port 2222\n")
    probe = (
        "import json, pathlib, sys; import kerneldev.hosts.transport.ssh as ssh; "
        "before = [m for m in ('invoke', 'unittest.mock') if m in sys.modules]; "
        "t = ssh.resolve_target('somehost', ssh.load_ssh_config(pathlib.Path(sys.argv[1]))); "
        "print(json.dumps([before, t.user, t.port]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[], "from-match-exec", 2222]
