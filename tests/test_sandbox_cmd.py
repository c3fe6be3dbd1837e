"""`kerneldev sandbox up|down|status --dir D` (kerneldev/cli/commands/sandbox.py over sandbox.py):
the sandbox's hosts.yaml works after `up`, `down` stops exactly its processes; and the demo
reports a step it could not run as SKIPPED."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from kerneldev.errors import ExitCode
from kerneldev.sandbox import demo
from kerneldev.sandbox.host import find_sshd, start_sshd
from tests.clirun import run_kerneldev


def kerneldev(*args: str) -> subprocess.CompletedProcess:
    return run_kerneldev(*args, timeout=120)


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


def test_sandbox_up_down_status(tmp_path, isolated_home):
    folder = tmp_path / "sb"
    try:
        up = kerneldev("sandbox", "up", "--dir", str(folder), "--json")
        assert up.returncode == 0, up.stderr
        status = json.loads(up.stdout)
        assert status["created"] and status["service_running"]
        assert status["sshd_running"] is (True if status["transport"] == "ssh" else None)
        config = folder / "hosts.yaml"
        assert status["config"] == str(config)

        # The kept config now reaches its host (over its sshd when sshd is installed).
        pull = kerneldev("--config", str(config), "pull")
        assert pull.returncode == 0, pull.stderr

        service_pid = _pid(folder / "service" / "service.pid")
        sshd_pid = _pid(folder / "ssh" / "sshd.pid")
        assert _alive(service_pid)
        # The decode service's launchers (service/launcher.py) go down with it.
        launchers = [_pid(p) for p in (folder / "service").glob("launch/*.pid")]
        down = kerneldev("sandbox", "down", "--dir", str(folder), "--json")
        assert down.returncode == 0, down.stderr
        stopped = json.loads(down.stdout)
        assert not stopped["service_running"] and stopped["sshd_running"] in (False, None)
        assert not _alive(service_pid) and not _alive(sshd_pid)
        assert not [pid for pid in launchers if _alive(pid)]

        text = kerneldev("sandbox", "status", "--dir", str(folder))
        assert text.returncode == 0 and "service: stopped" in text.stdout

        again = kerneldev("sandbox", "up", "--dir", str(folder))
        assert again.returncode == 0, again.stderr
        assert "service: running" in again.stdout and "sandbox down --dir" in again.stderr
        assert kerneldev("--config", str(config), "diff").returncode == 0
    finally:
        kerneldev("sandbox", "down", "--dir", str(folder))


@pytest.mark.skipif(find_sshd() is None, reason="needs OpenSSH's sshd")
def test_sandbox_up_on_a_taken_port_changes_only_the_port_in_hosts_yaml(tmp_path, isolated_home):
    """The sandbox's sshd port was taken meanwhile: `up` moves it to a free port by editing
    that one value; the user's comments and hosts added by hand stay byte for byte."""
    folder = tmp_path / "sb"
    try:
        assert kerneldev("sandbox", "up", "--dir", str(folder)).returncode == 0
        assert kerneldev("sandbox", "down", "--dir", str(folder)).returncode == 0
        config = folder / "hosts.yaml"
        old_port = json.loads(kerneldev("sandbox", "status", "--dir", str(folder), "--json").stdout)
        old_port = old_port["sshd_port"]
        text = config.read_text().replace(
            f"    port: {old_port}\n", f"    port: {old_port}  # the sandbox's sshd\n"
        )
        mine = "# my notes: node7 is the spare box\n"
        other = "  node7:  # added by hand\n    hostname: 10.0.0.7\n    root: /srv/sglang\n"
        other += "    files: [k/*.py]\n    workspace: ws7\n"
        config.write_text(mine + text + other)
        before = config.read_text()
        with socket.socket() as holder:  # someone else listens on the old port now
            holder.bind(("127.0.0.1", old_port))
            holder.listen()
            up = kerneldev("sandbox", "up", "--dir", str(folder), "--json")
        assert up.returncode == 0, up.stderr
        new_port = json.loads(up.stdout)["sshd_port"]
        assert new_port != old_port and json.loads(up.stdout)["sshd_running"]
        assert config.read_text() == before.replace(
            f"port: {old_port}  # the sandbox's sshd", f"port: {new_port}  # the sandbox's sshd"
        )
        pull = kerneldev("--config", str(config), "pull")  # it reaches the host
        assert pull.returncode == 0, pull.stderr
    finally:
        kerneldev("sandbox", "down", "--dir", str(folder))


def test_a_port_that_cannot_be_changed_alone_is_refused_and_the_file_kept(tmp_path):
    from kerneldev.errors import SandboxError
    from kerneldev.sandbox.host import _set_port_in_place

    config = tmp_path / "hosts.yaml"
    text = "ports: &p 2222  # shared\nhosts:\n  sandbox:\n    port: *p\n  b:\n    port: *p\n"
    config.write_text(text)
    with pytest.raises(SandboxError) as caught:
        _set_port_in_place(config, 2222, 40000)
    assert "set `port: 40000`" in (caught.value.hint or "")
    assert config.read_text() == text


def test_sandbox_up_says_what_a_new_sandbox_settled_for(tmp_path, isolated_home):
    # Without ssh-keygen on PATH the new sandbox falls back to the local transport; `up` must
    # say so (it printed nothing, and the user saw "sshd: none" without a reason).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            link = bin_dir / name
            if name not in ("ssh-keygen", "sshd") and not link.exists():
                link.symlink_to(os.path.join(folder, name))
    folder = tmp_path / "sb"
    try:
        up = run_kerneldev("sandbox", "up", "--dir", str(folder), env={"PATH": str(bin_dir)})
        assert up.returncode == 0, up.stderr
        assert "sshd:    none (local transport)" in up.stdout
        assert "note: sshd is not installed: the sandbox uses the local transport" in up.stderr
    finally:
        kerneldev("sandbox", "down", "--dir", str(folder))


@pytest.mark.skipif(find_sshd() is None, reason="needs OpenSSH's sshd")
def test_the_sandbox_sshd_starts_in_a_folder_with_a_space(tmp_path):
    # `sandbox up --dir "my sandbox"` fell back to the local transport without saying why.
    server = start_sshd(tmp_path / "my sandbox [1]" / "ssh")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass
    finally:
        server.stop()


def test_sandbox_status_of_a_folder_that_is_no_sandbox(tmp_path):
    proc = kerneldev("sandbox", "status", "--dir", str(tmp_path))
    assert proc.returncode == ExitCode.USAGE
    assert "holds no sandbox" in proc.stderr and "Traceback" not in proc.stderr


def _sshds_of(folder: Path) -> list[int]:
    """The sshd servers whose title names `folder`, raw or as sshd escapes it (\\ooo)."""
    raw = str(folder).encode()
    octal = b"".join(b"\\%03o" % c if c > 0x7E else bytes([c]) for c in raw)
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if b"sshd" in cmd.split(b"\0")[0] and (raw in cmd or octal in cmd):
            found.append(int(entry.name))
    # A connection's own sshd (forked, then re-executed with -R) carries the server's command
    # line until it renames itself: count the servers, not their children.
    return [pid for pid in found if _parent(pid) not in found]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.mark.skipif(find_sshd() is None, reason="needs OpenSSH's sshd")
def test_sandbox_in_a_non_ascii_folder_is_seen_running_and_stopped(tmp_path, isolated_home):
    # sshd writes the folder into its process title as \\303\\274...: it used to look
    # stopped, so `up` started a second sshd and `down` left both running.
    folder = tmp_path / "ünï sandbox"
    try:
        up = kerneldev("sandbox", "up", "--dir", str(folder), "--json")
        assert up.returncode == 0, up.stderr
        assert json.loads(up.stdout)["sshd_running"] is True
        assert len(_sshds_of(folder)) == 1
        down = kerneldev("sandbox", "down", "--dir", str(folder), "--json")
        assert down.returncode == 0 and json.loads(down.stdout)["sshd_running"] is False
        assert _sshds_of(folder) == []
    finally:
        kerneldev("sandbox", "down", "--dir", str(folder))
        for pid in _sshds_of(folder):  # what a failing run would leave
            os.kill(pid, 9)


def test_sandbox_dir_that_is_a_file_is_a_usage_error(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    for command in ("up", "status", "down"):
        proc = kerneldev("sandbox", command, "--dir", str(a_file), "--json")
        assert proc.returncode == ExitCode.USAGE, (command, proc.stderr)
        assert "is a file, not a folder" in proc.stderr and "Traceback" not in proc.stderr
        assert json.loads(proc.stdout)["error"]["code"] == ExitCode.USAGE
    assert a_file.read_text() == "mine\n"


def test_demo_reports_a_step_it_could_not_run_as_skipped(monkeypatch):
    monkeypatch.setattr(demo, "_kernel_stack_available", lambda: False)
    step = demo.step_bench(None)  # returns before touching the context
    assert step.skipped and not step.ok and "SKIPPED" in step.observed
    ran = demo.DemoStep("pull", "", "", True)
    assert demo.passed([ran, step])  # a skip is not a failure of the demo ...
    assert not demo.passed([step])  # ... and a demo that ran nothing did not pass
    assert not demo.passed([ran, step, demo.DemoStep("push", "", "", False)])


def test_a_port_left_in_time_wait_by_a_killed_sshd_counts_as_free():
    """`sandbox up` after its sshd was killed with clients connected: the old port only has
    connections in TIME_WAIT, which sshd's own bind ignores; keeping the port keeps
    hosts.yaml (and a running `watch`, which reconnects to it) valid."""
    from kerneldev.sandbox.host import _port_free

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    server, _ = listener.accept()
    server.close()  # the server closes first: its side of the connection enters TIME_WAIT
    client.recv(1)
    client.close()
    assert not _port_free(port)  # still listening
    listener.close()
    assert _port_free(port)


def test_a_service_between_two_programs_counts_as_running(tmp_path, monkeypatch):
    """`sandbox up` reads the service's command line right after restart.sh started it: during
    the execve of `nohup python ...` /proc/<pid>/cmdline is empty for a moment, and `up` once
    reported a just-started service as stopped (a CI run). An empty read is read again."""
    from kerneldev.sandbox import host

    folder = tmp_path / "sb"
    pidfile = folder / "service" / "service.pid"
    pidfile.parent.mkdir(parents=True)
    pidfile.write_text(f"{os.getpid()}\n")
    marker = str(folder) + os.sep
    real = Path.read_bytes
    reads = []

    def read_bytes(path):
        if str(path) == f"/proc/{os.getpid()}/cmdline":
            reads.append(path)
            # empty twice (mid-exec), then a command line naming the sandbox folder
            return b"" if len(reads) <= 2 else b"python\x00" + marker.encode() + b"x\x00"
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    assert host._pid_if_running(pidfile, marker) == os.getpid()
    assert len(reads) == 3
    reads.clear()
    monkeypatch.setattr(host, "CMDLINE_RETRIES", 2)  # empty every time: not ours
    monkeypatch.setattr(
        Path, "read_bytes", lambda path: b"" if "cmdline" in str(path) else real(path)
    )
    assert host._pid_if_running(pidfile, marker) is None
