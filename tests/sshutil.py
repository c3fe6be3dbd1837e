"""Helpers for the transport and host-key tests: a hosts.yaml-equivalent `HostConfig` pointing at
the test sshd and ways to cut a live connection (at once, or once a command runs). (The
isolated home folder is the `isolated_home` fixture in conftest.py.)"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from kerneldev.config import HostConfig
from tests.clirun import REPO, run_kerneldev
from tests.faults import OnceTrue
from tests.sshd import SSHServer


def ssh_host(server: SSHServer, tmp_path: Path, *, trusted: bool = True, **overrides) -> HostConfig:
    """A host entry for the test sshd; `trusted` pre-records its key in a private known_hosts."""
    known_hosts = tmp_path / "known_hosts"
    if trusted:
        known_hosts.write_text(server.host_key_line)
    live = tmp_path / "live"
    live.mkdir(exist_ok=True)
    host = HostConfig(
        name="testhost",
        root=str(live),
        files=("*.py",),
        workspace=tmp_path / "ws",
        transport="ssh",
        hostname="127.0.0.1",
        port=server.port,
        user=server.user,
        identity_file=server.client_key,
        known_hosts=known_hosts,
    )
    return replace(host, **overrides)


def ssh_entry(server: SSHServer, tmp_path: Path) -> dict:
    """The hosts.yaml keys that reach `server` with its host key already trusted."""
    known = tmp_path / "known_hosts"
    known.write_text(server.host_key_line)
    return {
        "hostname": "127.0.0.1",
        "port": server.port,
        "user": server.user,
        "identity_file": str(server.client_key),
        "known_hosts": str(known),
    }


def write_hosts_yaml(path: Path, host: HostConfig) -> Path:
    """The hosts.yaml a user would write for `host` (for tests that go through the CLI)."""
    lines = ["hosts:", f"  {host.name}:", f"    transport: {host.transport}"]
    for key in ("hostname", "user", "port", "identity_file", "known_hosts"):
        value = getattr(host, key)
        if value is not None:
            lines.append(f"    {key}: '{value}'" if key != "port" else f"    port: {value}")
    lines += [f"    root: '{host.root}'", "    files:"]
    lines += [f"      - '{f}'" for f in host.files]
    lines.append(f"    workspace: '{host.workspace}'")
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(*args: str, config: Path | None = None, input: str | None = None):
    """Run `python -m kerneldev ARGS` as a user would; returns the CompletedProcess."""
    env = {"KERNELDEV_CONFIG": str(config)} if config is not None else None
    return run_kerneldev(*args, env=env, timeout=60, input=input if input is not None else "")


def start_on_terminal(*args: str, config: Path) -> tuple[subprocess.Popen, int]:
    """`python -m kerneldev ARGS` with a terminal (a pty) on stdin, as someone typing at a
    prompt; stdout and stderr piped as bytes. Returns the process and the pty's side to type on
    (the caller closes it)."""
    typing, stdin = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kerneldev", "--config", str(config), *args],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            cwd=REPO,
        )
    finally:
        os.close(stdin)
    return proc, typing


def _process_tree(root: int) -> list[int]:
    """`root` and every process below it, from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Field 4 (after the parenthesised command name) is the parent pid.
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending += children.get(pid, [])
    return tree


def kill_sshd_and_sessions(server: SSHServer) -> None:
    """Stop the sshd *and* its per-connection processes: a host going away mid-session.
    (Stopping only the listener leaves established sessions alive, as on a real host.)"""
    assert server.process is not None
    victims = _process_tree(server.process.pid)
    # Freeze them all first: otherwise sshd may see its command die and report an exit status
    # before it is killed itself, and the test would see a clean exit instead of a drop.
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in victims:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    server.process.wait()
    server.process = None


def stall_sessions(server: SSHServer, sig: int = signal.SIGSTOP) -> list[int]:
    """SIGSTOP (or, to end it, SIGCONT) every per-connection process of the sshd, the listener
    left running: the established connections stop answering while their TCP stays up, as on
    a stalled link. Returns the pids signalled."""
    assert server.process is not None
    victims = [pid for pid in _process_tree(server.process.pid) if pid != server.process.pid]
    for pid in victims:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return victims


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return []


def kill_sshd_once_running(server: SSHServer, argv: list[str], within_s: float = 60.0) -> OnceTrue:
    """`kill_sshd_and_sessions(server)` from a thread, once a process of one of its sessions
    runs `argv` (e.g. ["sleep", "60"]): the command under test is then known to run (a fixed
    delay let the connection go before the command had started). `join()` the result."""
    assert server.process is not None
    want = [a.encode() for a in argv]
    sshd = server.process.pid

    def running() -> bool:
        return any(_cmdline(pid) == want for pid in _process_tree(sshd))

    return OnceTrue(running, lambda: kill_sshd_and_sessions(server), within_s, 0.05).start()
