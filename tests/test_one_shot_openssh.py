"""One-shot commands over the system's OpenSSH client (`one_shot.OneShotTransport`): the same
bytes as over paramiko, host keys exactly as strict, today's messages wherever OpenSSH cannot
start the agent (the command then goes over paramiko), a cut connection lost as over paramiko,
no ssh left running, and no paramiko loaded when OpenSSH did the work. A real sshd on
127.0.0.1 (tests/sshd.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kerneldev.errors import ConnectionLostError, HostConnectionError, UsageError
from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.one_shot import OneShotTransport
from kerneldev.hosts.transport.openssh import ssh_command
from kerneldev.hosts.transport.ssh import SSHTransport
from tests.clirun import REPO, run_kerneldev
from tests.sshutil import kill_sshd_once_running, ssh_host, write_hosts_yaml
from tests.test_transport import HOSTILE_NAMES

BINARY = bytes(range(256)) * 64


def _cli(config: Path, client: str, *args: str) -> subprocess.CompletedProcess:
    return run_kerneldev(
        "--config",
        str(config),
        *args,
        env={"KERNELDEV_SSH_CLIENT": client, "KERNELDEV_NO_KEEP": "1", "KERNELDEV_WARM": "0"},
        timeout=60,
        input="",
    )


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root` but kerneldev's own records: bytes and mode."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode)
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".kerneldev" not in p.parts
    }


def _fill(root: Path) -> None:
    for i, name in enumerate(HOSTILE_NAMES):
        (root / name).write_bytes(f"x = {i}\n".encode())
    (root / "binary.bin").write_bytes(BINARY)
    (root / "run.py").write_bytes(b"#!/bin/sh\n")
    (root / "run.py").chmod(0o755)


def test_pull_diff_push_move_the_same_bytes_over_openssh_and_paramiko(
    sshd_server, tmp_path, isolated_home
):
    """The same pull, diff and push, once per client: the workspaces, the diff's report and the
    live trees after the push are identical byte for byte."""
    seen = {}
    for client in ("openssh", "paramiko"):
        folder = tmp_path / client
        folder.mkdir()
        host = ssh_host(sshd_server, folder, files=("*.py", "*.bin"))
        live = Path(host.root)
        _fill(live)
        config = write_hosts_yaml(folder / "hosts.yaml", host)
        pulled = _cli(config, client, "pull")
        assert pulled.returncode == 0, pulled.stderr
        workspace = Path(host.workspace)
        pulled_tree = _tree(workspace)
        (workspace / "binary.bin").write_bytes(BINARY[::-1])
        (workspace / "with space.py").write_bytes(b"edited\n")
        diff = _cli(config, client, "diff", "--json")
        assert diff.returncode in (0, 1), diff.stderr
        pushed = _cli(config, client, "push")
        assert pushed.returncode == 0, pushed.stderr
        seen[client] = (
            pulled_tree,
            diff.stdout.replace(str(folder), "<folder>"),
            _tree(live),
        )
    assert seen["openssh"] == seen["paramiko"]
    pulled_tree, _, live_tree = seen["openssh"]
    assert pulled_tree["binary.bin"][0] == BINARY
    assert live_tree["binary.bin"][0] == BINARY[::-1]
    assert live_tree["with space.py"][0] == b"edited\n"


def test_a_one_shot_diff_over_openssh_never_loads_paramiko(sshd_server, tmp_path, isolated_home):
    host = ssh_host(sshd_server, tmp_path)
    (Path(host.root) / "a.py").write_text("a = 1\n")
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    code = (
        "import io, sys\n"
        "from kerneldev.cli.environment import Environment\n"
        "from kerneldev.cli.main import main\n"
        f"status = main(['--config', {str(config)!r}, 'diff'], env=Environment(\n"
        "    stdout=io.StringIO(), stderr=sys.stderr, stdin=io.StringIO()))\n"
        "print(status, 'paramiko' in sys.modules)\n"
    )
    for client, loaded in (("auto", "False"), ("paramiko", "True")):
        env = {**os.environ, "KERNELDEV_SSH_CLIENT": client, "KERNELDEV_NO_KEEP": "1"}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["1", loaded], (client, done.stdout, done.stderr)


def test_a_changed_host_key_is_refused_in_todays_words(
    fresh_sshd, tmp_path, isolated_home, monkeypatch
):
    host = ssh_host(fresh_sshd, tmp_path)
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    fresh_sshd.rotate_host_key()
    before = Path(host.known_hosts).read_text()
    over_auto, over_paramiko = _cli(config, "auto", "diff"), _cli(config, "paramiko", "diff")
    assert "HAS CHANGED" in over_paramiko.stderr
    assert (over_auto.returncode, over_auto.stderr) == (
        over_paramiko.returncode,
        over_paramiko.stderr,
    )
    assert Path(host.known_hosts).read_text() == before
    # Forced onto OpenSSH, the key is refused as strictly, in ssh's words.
    monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "openssh")
    with open_transport(host, keep=False) as t:
        assert isinstance(t, OneShotTransport)
        with pytest.raises(HostConnectionError, match="Host key verification failed"):
            t.run("true")
    assert Path(host.known_hosts).read_text() == before


def test_an_unknown_host_goes_to_paramiko_and_its_message(sshd_server, tmp_path, isolated_home):
    host = ssh_host(sshd_server, tmp_path, trusted=False)
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    over_auto, over_paramiko = _cli(config, "auto", "diff"), _cli(config, "paramiko", "diff")
    assert "is not known" in over_paramiko.stderr and "kerneldev trust" in over_paramiko.stderr
    assert (over_auto.returncode, over_auto.stderr) == (
        over_paramiko.returncode,
        over_paramiko.stderr,
    )
    assert not Path(host.known_hosts).exists() or Path(host.known_hosts).read_text() == ""


def test_hashed_known_hosts_and_a_port_are_read_as_kerneldev_reads_them(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    """A hashed `[127.0.0.1]:port` entry (ssh-keygen -H) is trusted by OpenSSH as by kerneldev."""
    host = ssh_host(sshd_server, tmp_path)
    subprocess.run(
        ["ssh-keygen", "-H", "-f", str(host.known_hosts)], check=True, capture_output=True
    )
    assert Path(host.known_hosts).read_text().startswith("|1|")
    monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "openssh")
    with open_transport(host, keep=False) as t:
        assert t.run("echo ok").stdout == "ok\n"
        assert t.client == "openssh"


def test_without_ssh_on_path_the_command_goes_over_paramiko(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    host = ssh_host(sshd_server, tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "auto")
    with open_transport(host, keep=False) as t:
        assert t.run("echo ok").stdout == "ok\n"
        assert (t.client, t.why_paramiko) == ("paramiko", "no `ssh` on PATH")
    monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "openssh")
    with open_transport(host, keep=False) as t, pytest.raises(HostConnectionError, match="PATH"):
        t.run("true")


def test_an_agent_that_cannot_start_goes_over_paramiko(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    """The agent does not start under ssh (its bootstrap finds no python3): the command is done
    over paramiko, nothing of it having run twice."""
    host = ssh_host(sshd_server, tmp_path)
    monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "auto")
    from kerneldev.hosts.transport import openssh

    real = openssh.ssh_command

    def without_python3(host, known_hosts, **kwargs):
        argv = list(real(host, known_hosts, **kwargs).argv)
        argv[-1] = "echo 'kerneldev: no python3 on the host' >&2; exit 127"
        return openssh.SSHCommand(argv)

    monkeypatch.setattr("kerneldev.hosts.transport.one_shot.ssh_command", without_python3)
    counter = Path(host.root) / "count"
    with open_transport(host, keep=False) as t:
        assert t.run(f"echo x >> {counter}; echo ok").stdout == "ok\n"
        assert (t.client, t.why_paramiko) == ("paramiko", "no python3 on the host")
    assert counter.read_text() == "x\n"


def test_what_openssh_cannot_express_goes_to_paramiko(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "auto")
    host = ssh_host(sshd_server, tmp_path)
    known = [Path(host.known_hosts)]
    assert ssh_command(host, known, ssh_config="none").argv is not None
    config = tmp_path / "ssh_config"
    config.write_text("Host jumped\n  ProxyJump somewhere\n")
    assert ssh_command(host, known, ssh_config=config).why_not == f"{config} uses ProxyJump"
    cert = tmp_path / "ca_known_hosts"
    cert.write_text("@cert-authority * ssh-ed25519 AAAA\n")
    assert "@cert-authority" in ssh_command(host, [cert], ssh_config="none").why_not
    assert ssh_command(replace(host, hostname="-oProxyCommand=x"), known).argv is None
    assert ssh_command(replace(host, hostname="me@127.0.0.1"), known).argv is None
    missing = replace(host, identity_file=tmp_path / "nope")
    assert "does not exist" in ssh_command(missing, known, ssh_config="none").why_not
    # ... and the command over paramiko says what it says today.
    with open_transport(missing, keep=False, ssh_config="none") as t:
        with pytest.raises(HostConnectionError, match="identity_file .* does not exist"):
            t.run("true")
        assert t.client == "paramiko"


def test_the_strict_options_are_on_the_command_line(sshd_server, tmp_path, isolated_home):
    host = ssh_host(sshd_server, tmp_path)
    files = [tmp_path / "a b" / "known_hosts", Path(host.known_hosts)]
    argv = ssh_command(host, files, ssh_config="none", connect_timeout=2.5).argv
    options = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    for wanted in (
        "BatchMode=yes",
        "StrictHostKeyChecking=yes",
        f'UserKnownHostsFile="{files[0]}" "{files[1]}"',
        "GlobalKnownHostsFile=/dev/null",
        "KnownHostsCommand=none",
        "UpdateHostKeys=no",
        "ControlMaster=no",
        "ControlPath=none",
        "ConnectTimeout=3",
        "KexAlgorithms=-sntrup761x25519-sha512,sntrup761x25519-sha512@openssh.com",
    ):
        assert wanted in options
    assert argv[argv.index("-F") + 1] == "none"
    assert argv[argv.index("--") + 1] == "127.0.0.1"


def test_a_cut_connection_is_lost_as_over_paramiko_and_ssh_is_gone(
    fresh_sshd, tmp_path, isolated_home, monkeypatch
):
    """sshd and its sessions killed while a command runs: `ConnectionLostError` (the same words
    as over paramiko), and no ssh process outlives the transport."""
    errors = {}
    for client in ("openssh", "paramiko"):
        if fresh_sshd.process is None:
            fresh_sshd.start()
        monkeypatch.setenv("KERNELDEV_SSH_CLIENT", client)
        host = ssh_host(fresh_sshd, tmp_path)
        with open_transport(host, keep=False) as t:
            t.run("true")
            killer = kill_sshd_once_running(fresh_sshd, ["sleep", "60"])
            with pytest.raises(ConnectionLostError) as caught:
                t.run("sleep 60", timeout=30)
            killer.join()
            if client == "openssh":
                ssh = t._ssh.process
        errors[client] = caught.value.message
        if client == "openssh":
            assert ssh.returncode is not None  # waited for
        else:
            assert isinstance(t, SSHTransport)
    for message in errors.values():
        assert message.startswith(
            "the connection to host 'testhost' was lost while running `sleep 60`"
        ), errors


def test_a_bad_ssh_client_or_transfer_in_the_environment_is_a_usage_error(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "libssh")
    with pytest.raises(UsageError, match="KERNELDEV_SSH_CLIENT is 'libssh'"):
        open_transport(ssh_host(sshd_server, tmp_path), keep=False)
    monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "auto")
    monkeypatch.setenv("KERNELDEV_TRANSFER", "rsync")
    with pytest.raises(UsageError, match="KERNELDEV_TRANSFER is 'rsync'"):
        open_transport(ssh_host(sshd_server, tmp_path), keep=False)


def test_a_one_shot_loop_command_starts_its_ssh_before_the_cli_is_imported(
    sshd_server, tmp_path, isolated_home, monkeypatch
):
    """`cli/early_dial.py`: the ssh of a one-shot `diff` starts from the console script's
    argv and config alone, and the command's transport takes it over (one ssh, not two);
    a kept command, help, paramiko or an unknown host start none."""
    from kerneldev.cli import early_dial
    from kerneldev.config import load_config
    from kerneldev.hosts.transport import openssh

    host = ssh_host(sshd_server, tmp_path)
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "auto")
    for argv in (
        ["--config", str(config), "diff", "--help"],
        ["--config", str(config), "status"],
        ["--config", str(config), "diff", "--host", "nobody"],
    ):
        early_dial.start(argv)
        assert not openssh._EARLY, argv
    monkeypatch.delenv("KERNELDEV_NO_KEEP")
    early_dial.start(["--config", str(config), "diff"])  # a kept session's command
    assert not openssh._EARLY
    monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "paramiko")
    early_dial.start(["--config", str(config), "diff", "--no-keep"])
    assert not openssh._EARLY
    monkeypatch.setenv("KERNELDEV_SSH_CLIENT", "auto")
    early_dial.start(["--config", str(config), "diff", "--no-keep"])
    assert len(openssh._EARLY) == 1
    (early,) = openssh._EARLY.values()
    with open_transport(load_config(config).host(), keep=False) as t:
        assert t.run("echo ok").stdout == "ok\n" and t.client == "openssh"
        assert t._ssh is early and not openssh._EARLY
    assert early.process.returncode is not None
    # One not taken over is ended when the process exits (atexit).
    early_dial.start(["--config", str(config), "pull", "--no-keep"])
    (untaken,) = openssh._EARLY.values()
    openssh._end_untaken()
    assert untaken.process.returncode is not None and not openssh._EARLY
