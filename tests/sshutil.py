"""Helpers for the transport and host-key tests: a hosts.yaml-equivalent `HostConfig` pointing at
the test sshd and ways to cut a live connection (at once, or once a command runs). (The
isolated home folder is the `isolated_home` fixture in conftest.py.)"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

from kerneldev.config import HostConfig
from tests.clirun import run_kerneldev
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


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Field 4 (after the parenthesised command name) is the parent pid.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found.append(int(entry))
    return found


def kill_sshd_and_sessions(server: SSHServer) -> None:
    """Stop the sshd *and* its per-connection processes: a host going away mid-session.
    (Stopping only the listener leaves established sessions alive, as on a real host.)"""
    assert server.process is not None
    pending = [server.process.pid]
    victims = []
    while pending:
        pid = pending.pop()
        victims.append(pid)
        pending += _children(pid)
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


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return []


def kill_sshd_once_running(server: SSHServer, argv: list[str], within_s: float = 60.0):
    """`kill_sshd_and_sessions(server)` from a thread, once a process of one of its sessions
    runs `argv` (e.g. ["sleep", "60"]): the command under test is then known to run. A fixed
    delay raced the command's start on a loaded machine (the connection went before the
    command had started). After `within_s` without it, it kills anyway: the test fails
    instead of hanging. Returns the thread."""
    assert server.process is not None
    want = [a.encode() for a in argv]
    sshd = server.process.pid

    def running() -> bool:
        children: dict[int, list[int]] = {}  # one pass over /proc per look, not one per process
        for entry in os.listdir("/proc"):
            try:
                stat = Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
            except OSError:
                continue
            if stat:
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        pending = [sshd]
        while pending:
            pid = pending.pop()
            if _cmdline(pid) == want:
                return True
            pending += children.get(pid, [])
        return False

    def watch() -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline and not running():
            time.sleep(0.05)
        kill_sshd_and_sessions(server)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread
