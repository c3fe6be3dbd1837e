"""The warm process (cli/warm.py) over the real sshd: a loop command handed to it behaves as one
run in its own process, byte for byte; Ctrl-C ends it as before; changed code or another user
is never served.

Commands run as `python -m kerneldev` processes (the fast path is the console script's); kept
sessions are on (the suite runs with KERNELDEV_NO_KEEP=1) and each test has its own
$XDG_RUNTIME_DIR, so its warm process is its own and stopped at its end."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import pytest

from kerneldev.cli import warm_client
from kerneldev.sandbox.host import find_sshd
from tests.clirun import REPO, run_kerneldev, start_kerneldev
from tests.test_session import (
    _AS_OTHER,
    A,
    B,
    _normal,
    _other_user,
    _state,
    alive,
    kept,  # noqa: F401 - a fixture
    make_env,
    run_as,
    slow_restart_env,
    stop_sessions,
    stop_warm,
    wait_for,
)

pytestmark = [
    pytest.mark.skipif(find_sshd() is None, reason="sshd is not installed"),
    pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the warm process needs Linux"),
]


# test_changed_code_is_not_served edits the mtime of a file of this checkout's kerneldev, which
# changes the code stamp of every warm process of the checkout: a warm test on another parallel
# worker would then see its commands refused. That test holds this lock exclusively, the others
# shared (one lock per checkout, across the workers' processes).
_CODE_LOCK = Path(tempfile.gettempdir()) / (
    f"kerneldev-warm-tests-{os.getuid()}-{zlib.crc32(str(REPO).encode()):08x}.lock"
)


def _runtime(kept, monkeypatch, exclusive: bool):  # noqa: F811
    with open(_CODE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        folder = Path(tempfile.mkdtemp(prefix="kd-warm-", dir="/tmp"))
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
        yield folder
        stop_warm()
        stop_sessions(kept)  # while their sockets are still there to be asked on
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def runtime(kept, monkeypatch):  # noqa: F811
    yield from _runtime(kept, monkeypatch, exclusive=False)


@pytest.fixture
def runtime_alone(kept, monkeypatch):  # noqa: F811
    """`runtime`, with no other warm test of this checkout running meanwhile."""
    yield from _runtime(kept, monkeypatch, exclusive=True)


def warm_socket() -> str:
    return warm_client.socket_path()


def served() -> int | None:
    info = warm_client.look(warm_socket())
    return info["served"] if info else None


def kd(env, *args: str, extra: dict | None = None) -> tuple:
    result = run_kerneldev(*args, "--config", str(env.config), env=extra)
    return (args, result.returncode, _normal(result.stdout), _normal(result.stderr))


def story(env, warm: bool) -> list:
    """pull, diff, edit, diff --patch, push --json, log, a drift, a refused push, pull --force."""
    extra = None if warm else {"KERNELDEV_WARM": "0"}
    seen = [kd(env, "pull", extra=extra)]
    if warm:
        wait_for(lambda: served() is not None, what="the warm process to listen")
    seen.append(kd(env, "diff", extra=extra))
    (env.workspace / A).write_bytes(b"BLOCK = 128\n")
    seen.append(kd(env, "diff", "--patch", extra=extra))
    seen.append(kd(env, "push", "--no-import-check", "--json", extra=extra))
    seen.append(kd(env, "diff", "--json", extra=extra))
    seen.append(kd(env, "log", extra=extra))
    (env.root / B).write_bytes(b"SPLITS = 16\n")  # someone edits the host
    (env.workspace / B).write_bytes(b"SPLITS = 4\n")
    seen.append(kd(env, "push", "--no-import-check", extra=extra))
    seen.append(kd(env, "push", "--no-import-check", "--json", extra=extra))
    seen.append(kd(env, "pull", "--force", "--json", extra=extra))
    seen.append(kd(env, "diff", "--no-such-option", extra=extra))
    return seen


def test_the_warm_path_gives_the_same_results(kept, runtime, tmp_path, sshd_server, monkeypatch):  # noqa: F811
    folder = tmp_path / "story"
    cold_env = make_env(folder, sshd_server)
    kept.append(cold_env)
    cold = story(cold_env, warm=False)
    assert served() is None  # KERNELDEV_WARM=0: never started
    shutil.rmtree(folder)

    warm_env = make_env(folder, sshd_server)
    kept.append(warm_env)
    warm = story(warm_env, warm=True)
    assert served() == len(warm) - 1  # every command after the first went through it
    assert any(code != 0 for _, code, _, _ in warm)  # failures too
    assert warm == cold


def test_one_shot_commands_go_through_it_too(kept, runtime, tmp_path, sshd_server):  # noqa: F811
    """`--no-keep`: no session, the command's own SSH connection, but the warm interpreter."""
    env = make_env(tmp_path, sshd_server)
    kept.append(env)
    assert kd(env, "pull", "--no-keep")[1] == 0  # one-shot: it starts the warm process
    wait_for(lambda: served() is not None, what="the warm process to listen")
    (env.workspace / A).write_bytes(b"BLOCK = 512\n")
    cold = kd(env, "diff", "--no-keep", "--json", extra={"KERNELDEV_WARM": "0"})
    assert served() == 0
    warm = kd(env, "diff", "--no-keep", "--json")
    assert served() == 1 and warm == cold and cold[1] != 0  # a drift: exit 1, same bytes
    assert kd(env, "push", "--no-keep", "--no-import-check")[1] == 0
    assert served() == 2 and (env.root / A).read_bytes() == b"BLOCK = 512\n"
    # $KERNELDEV_NO_KEEP: nothing is handed to it (and nothing would start it).
    assert kd(env, "diff", extra={"KERNELDEV_NO_KEEP": "1"})[1] == 0
    assert served() == 2


def test_ctrl_c_is_forwarded(kept, runtime, tmp_path, sshd_server):  # noqa: F811
    pidfile = tmp_path / "restart.pid"
    env = slow_restart_env(tmp_path, sshd_server, pidfile)
    kept.append(env)
    assert kd(env, "pull")[1] == 0
    wait_for(lambda: served() is not None, what="the warm process to listen")
    (env.workspace / A).write_bytes(b"BLOCK = 256\n")

    push = start_kerneldev("push", "--no-import-check", "--restart", "--config", str(env.config))
    remote = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip()))
    assert served() == 1  # it went through the warm process
    os.killpg(push.pid, signal.SIGINT)  # Ctrl-C in its terminal
    _, err = push.communicate(timeout=60)
    assert push.returncode == 130, err
    assert "Traceback" not in err
    # 30 s, well under the command's own 60 s: ended by the Ctrl-C, not by itself.
    wait_for(lambda: not alive(remote), 30, "the interrupted restart's command to end")
    assert warm_client.look(warm_socket())["running"] == 0


def test_changed_code_is_not_served(kept, runtime_alone, tmp_path, sshd_server):  # noqa: F811
    env = make_env(tmp_path, sshd_server)
    kept.append(env)
    assert kd(env, "pull")[1] == 0
    wait_for(lambda: served() is not None, what="the warm process to listen")
    old = warm_client.look(warm_socket())["pid"]

    # An edited kerneldev file (an editable install): the stamp differs.
    touched = REPO / "kerneldev" / "cli" / "warm_client.py"
    stat = touched.stat()
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    try:
        assert kd(env, "diff")[1] == 0  # refused, so run the normal way
        wait_for(lambda: not alive(old), 30, "the stale warm process to exit")
        info = wait_for(lambda: warm_client.look(warm_socket()), what="a fresh warm process")
        assert info["pid"] != old and info["served"] == 0
        assert kd(env, "diff")[1] == 0
        assert served() == 1
    finally:
        os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    # Both warm processes wrote to one log next to the socket, closed to others.
    log = Path(warm_client.log_path(warm_socket()))
    assert log.stat().st_mode & 0o777 == 0o600
    text = log.read_text()
    assert f"warm {old}: listening on {warm_socket()}" in text
    assert f"warm {old}: refused a command: Refused: another code stamp" in text
    assert f"warm {info['pid']}: listening on" in text


def test_a_stopped_warm_process_is_passed_by(kept, runtime, tmp_path, sshd_server):  # noqa: F811
    """A warm process stopped by SIGSTOP answers nothing: a loop command runs in its own
    process at once (not after the 10 s answer timeout), with the same result, and leaves
    it as it was."""
    env = make_env(tmp_path, sshd_server)
    kept.append(env)
    assert kd(env, "pull")[1] == 0
    wait_for(lambda: served() is not None, what="the warm process to listen")
    pid = warm_client.look(warm_socket())["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _state(pid) in ("T", "t"), what="the warm process to stop")
        (env.workspace / A).write_bytes(b"BLOCK = 32\n")
        began = time.monotonic()
        _, code, out, _err = kd(env, "diff")
        assert code == 1 and A in out  # the difference, found in the command's own process
        assert time.monotonic() - began < warm_client.ANSWER_TIMEOUT  # not waited for
        assert alive(pid) and _state(pid) in ("T", "t")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert served() == 0  # continued: it never ran the command


def test_another_user_is_refused(kept, runtime, tmp_path, sshd_server):  # noqa: F811
    uid, gid = _other_user()
    env = make_env(tmp_path, sshd_server)
    kept.append(env)
    assert kd(env, "pull")[1] == 0
    wait_for(lambda: served() is not None, what="the warm process to listen")
    path = warm_socket()

    def as_other() -> str:
        body = b'{"status": true}'
        return run_as(uid, gid, _AS_OTHER, path, (struct.pack(">I", len(body)) + body).hex())

    assert as_other() == "refused: permission"
    runtime.chmod(0o755)  # opened up by mistake: the uid check still refuses
    Path(path).parent.chmod(0o755)
    Path(path).chmod(0o666)
    assert as_other() == "answer: nothing"
    # And a client does not use a folder others may enter.
    assert not warm_client.private(str(Path(path).parent))
    assert kd(env, "diff")[1] == 0
    assert served() == 0


def test_the_client_side_imports_nothing_heavy():
    script = (
        "import sys\n"
        "from kerneldev.cli import warm_client\n"
        "warm_client.wanted(['diff']); warm_client.stamp(); warm_client.socket_path()\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('typer', 'click', 'pydantic', 'rich', 'yaml', 'paramiko', 'hashlib')]\n"
        "ours = [m for m in sys.modules if m.startswith('kerneldev')]\n"
        "print(heavy, sorted(ours))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "[] ['kerneldev', 'kerneldev.cli', 'kerneldev.cli.warm_client', 'kerneldev.process_state']"
    )


def test_the_fast_path_is_only_for_loop_commands(monkeypatch):
    monkeypatch.delenv("KERNELDEV_NO_KEEP", raising=False)
    monkeypatch.delenv("KERNELDEV_WARM", raising=False)
    assert warm_client.wanted(["pull"])
    assert warm_client.wanted(["--config", "x.yaml", "diff", "--json"])
    assert not warm_client.wanted(["diff", "--help"])
    assert not warm_client.wanted(["restart"])
    assert not warm_client.wanted([])
    monkeypatch.setenv("KERNELDEV_WARM", "0")
    assert not warm_client.wanted(["pull"])
    monkeypatch.setenv("KERNELDEV_WARM", "1")
    monkeypatch.setenv("KERNELDEV_NO_KEEP", "1")
    assert not warm_client.wanted(["pull"])
