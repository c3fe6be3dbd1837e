"""`kerneldev watch` as a user runs it: a child process watching a workspace, pushing to a real
sshd on 127.0.0.1; the test edits files the way editors save them and reads the watch's lines.

Every wait below has a generous bound only so that a broken watch fails the test instead of
hanging it; nothing asserts how fast anything happens."""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from kerneldev.cli.environment import Environment
from kerneldev.cli.main import main
from kerneldev.config import load_config
from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.session import control
from kerneldev.loop import lock as host_lock
from kerneldev.watch import is_editor_temp
from tests.clirun import start_kerneldev
from tests.sshd import free_port
from tests.sshutil import kill_sshd_and_sessions, ssh_entry

A = "python/sglang/srt/layers/attention/flash_mla_sm120_triton.py"
B = "python/sglang/srt/layers/attention/flash_mla_sm120.py"
ORIGINAL_A = b'"""triton kernel"""\nBLOCK_N = 64\n'
ORIGINAL_B = b'"""wrapper"""\nNUM_SPLITS = 8\n'
WAIT = 60.0  # seconds: the bound of every wait (a hang fails instead of blocking the suite)


class Setup:
    """A live root on the test sshd, its hosts.yaml and a pulled workspace."""

    def __init__(self, tmp_path: Path, server, **host) -> None:
        self.root = tmp_path / "live"
        for path, data in ((A, ORIGINAL_A), (B, ORIGINAL_B)):
            (self.root / path).parent.mkdir(parents=True, exist_ok=True)
            (self.root / path).write_bytes(data)
        self.workspace = tmp_path / "ws"
        entry = ssh_entry(server, tmp_path)
        entry.update(root=str(self.root), files=[A, B], workspace=str(self.workspace))
        entry.update(host)
        self.config = tmp_path / "hosts.yaml"
        self.config.write_text(yaml.safe_dump({"default": "h", "hosts": {"h": entry}}))
        code, _, err = self.kd("pull")
        assert code == 0, err

    def kd(self, *args: str) -> tuple[int, str, str]:
        """`kerneldev --config <this> ARGS` in this process: (exit code, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        env = Environment(stdout=out, stderr=err, stdin=io.StringIO())
        code = main(["--config", str(self.config), *args], env=env)
        return int(code), out.getvalue(), err.getvalue()

    def history(self) -> list[dict]:
        path = self.root / ".kerneldev" / "history.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def deploys(self) -> list[dict]:
        state = json.loads((self.workspace / ".kerneldev" / "state.json").read_text())
        return state["deploys"]


class Watch:
    """`kerneldev watch ARGS` in the background; its stdout lines arrive on a queue."""

    def __init__(self, setup: Setup, *args: str) -> None:
        self.proc = start_kerneldev("--config", str(setup.config), "watch", *args)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, match) -> str:
        """The next stdout line for which `match(line)` is true."""
        while True:
            try:
                line = self.lines.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(f"no matching line; saw: {self.seen}") from None
            if line is None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"watch ended early ({self.proc.poll()}): {self.seen}\n{err}")
            self.seen.append(line)
            if match(line):
                return line

    def event(self, kind: str) -> dict:
        """The next JSON event of this kind (with --json)."""
        return json.loads(self.line(lambda s: json.loads(s)["kind"] in (kind, "error")))

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, list[str], str]:
        """Send `sig` as a terminal would; (exit code, the remaining stdout lines, stderr)."""
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=WAIT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        rest = []
        while True:
            line = self.lines.get(timeout=WAIT)
            if line is None:
                break
            rest.append(line)
        self.seen += rest
        err = self.proc.stderr.read() if self.proc.stderr else ""
        return self.proc.returncode, rest, err


@pytest.fixture
def setup(sshd_server, tmp_path, isolated_home) -> Setup:
    return Setup(tmp_path, sshd_server)


def restarting_watch(tmp_path, sshd_server, service: dict) -> tuple[Setup, Watch]:
    """A host with `service`, watched with --restart (JSON events, no import checks), ready."""
    setup = Setup(tmp_path, sshd_server, service=service)
    watch = Watch(setup, "--json", "--restart", "--no-import-check")
    watch.event("ready")
    return setup, watch


def wait_until(condition) -> bool:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def pushes(lines: list[str]) -> list[dict]:
    return [e for e in map(json.loads, lines) if e["kind"] == "push"]


def test_a_plain_save_is_live_once(setup: Setup):
    """The human output: a ready line, one line for the save, a line when Ctrl-C stops it."""
    watch = Watch(setup)
    ready = watch.line(lambda s: "watching" in s)
    assert "2 file(s) of h" in ready
    new = ORIGINAL_A + b"# tuned\n"
    (setup.workspace / A).write_bytes(new)
    line = watch.line(lambda s: "#1" in s)
    assert f"pushed {A} as " in line
    assert (setup.root / A).read_bytes() == new
    assert (setup.root / B).read_bytes() == ORIGINAL_B
    code, rest, err = watch.stop()
    assert code == 0, err
    assert "Traceback" not in err
    assert [s for s in watch.seen if " pushed " in s] == [line]  # one push, no second one
    assert rest and "stopped watching h (SIGINT) after 1 push(es)" in rest[-1]
    history, deploys = setup.history(), setup.deploys()
    assert len(history) == 1 and len(deploys) == 1
    assert history[0]["id"] == deploys[0]["id"] and history[0]["kind"] == "push"
    assert [f["path"] for f in history[0]["files"]] == [A]
    backup = setup.root / ".kerneldev" / "backups" / history[0]["id"] / A
    assert backup.read_bytes() == ORIGINAL_A
    assert not (setup.root / ".kerneldev" / "lock").exists()  # released after the push


def test_a_save_that_meets_a_held_lock_stays_pending_and_goes_once_it_is_free(setup: Setup):
    """Another deploy holds the host lock past --lock-wait: the push fails with who holds it,
    but the save is not dropped: the next round pushes it once the lock is free."""
    host = load_config(setup.config).hosts["h"]
    watch = Watch(setup, "--json", "--no-import-check", "--lock-wait", "1")
    try:
        watch.event("ready")
        with open_transport(host) as t, host_lock.HostLock(t, host.root, "push", wait=5):
            new = ORIGINAL_A + b"# saved while someone deploys\n"
            (setup.workspace / A).write_bytes(new)
            busy = watch.event("push")
            assert busy["outcome"] == "failed" and "locked" in busy["message"], busy
            assert "stays pending" in busy["hint"]
            assert (setup.root / A).read_bytes() == ORIGINAL_A
        done = watch.event("push")  # the next round, after the lock went
        assert (done["outcome"], done["deployed"]) == ("pushed", [A]), done
        assert (setup.root / A).read_bytes() == new
    finally:
        code, _, err = watch.stop()
    assert code == 0, err


def test_a_save_that_does_not_import_names_its_deploy_and_rollback(setup: Setup):
    """The import check after the upload fails: the files landed and were rolled back, and the
    --json event carries both deploy ids (they were only in the message)."""
    watch = Watch(setup, "--json")
    try:
        watch.event("ready")
        broken = ORIGINAL_A + b"import a_module_kerneldev_never_installs  # noqa: F401\n"
        (setup.workspace / A).write_bytes(broken)
        event = watch.event("push")
    finally:
        code, _, err = watch.stop()
    assert code == 0, err
    assert event["outcome"] == "failed" and "do not import" in event["message"], event
    assert event["deploy_id"] and event["rollback_id"], event
    assert event["deploy_id"] in event["message"] and event["rollback_id"] in event["message"]
    assert (setup.root / A).read_bytes() == ORIGINAL_A
    assert [d["kind"] for d in setup.history()] == ["push", "rollback"]


def test_editor_saves_give_one_push_each(setup: Setup):
    """Save by temp file + rename (most editors), then as vim does by default (4913 probe,
    backup~ made by renaming the file, new file written in several writes, backup removed).
    Only the PATHS named are watched: a save of another configured file is not pushed."""
    # A long debounce: on a loaded machine the watcher's thread may hand over a save's
    # changes in two parts; this test counts events, so it leaves room for that.
    watch = Watch(setup, "--json", "--no-import-check", "--debounce", "1000", A)
    watch.event("ready")
    folder = (setup.workspace / A).parent
    first = ORIGINAL_A + b"# saved via rename\n"
    tmp = folder / ".flash_mla_sm120_triton.py.tmp"
    with open(tmp, "wb") as f:
        f.write(first[:10])
        f.flush()
        f.write(first[10:])
    os.replace(tmp, setup.workspace / A)
    event = watch.event("push")
    assert (event["outcome"], event["deployed"]) == ("pushed", [A]), event
    assert (setup.root / A).read_bytes() == first

    (setup.workspace / B).write_bytes(ORIGINAL_B + b"# not watched\n")
    second = first + b"# saved by vim\n"
    probe = folder / "4913"
    probe.write_bytes(b"")
    probe.unlink()
    os.rename(setup.workspace / A, folder / "flash_mla_sm120_triton.py~")
    with open(setup.workspace / A, "wb") as f:
        for i in range(0, len(second), 8):
            f.write(second[i : i + 8])
            f.flush()
    (folder / "flash_mla_sm120_triton.py~").unlink()
    event = watch.event("push")
    assert (event["outcome"], event["changed"], event["deployed"]) == ("pushed", [A], [A])
    assert (setup.root / A).read_bytes() == second
    assert (setup.root / B).read_bytes() == ORIGINAL_B

    code, rest, err = watch.stop()
    assert code == 0, err
    assert len(pushes(watch.seen)) == 2  # one push per save, nothing for the temp files
    stopped = json.loads(rest[-1])
    assert stopped["kind"] == "stopped" and stopped["waiting"] == []
    assert len(setup.history()) == 2
    assert not (setup.root / A).with_name("flash_mla_sm120_triton.py~").exists()
    assert not (setup.root / A).with_name("4913").exists()


def test_a_folder_swapped_in_pushes_the_tracked_files_it_brings(setup: Setup, tmp_path):
    """`mv` of a folder into the workspace (a tree prepared elsewhere and swapped in): inotify
    names only the folder; its tracked files that changed are still pushed."""
    watch = Watch(setup, "--json", "--no-import-check")
    watch.event("ready")
    folder = (setup.workspace / A).parent
    staged = tmp_path / "staged"
    staged.mkdir()
    new = ORIGINAL_A + b"# prepared elsewhere\n"
    (staged / Path(A).name).write_bytes(new)
    (staged / Path(B).name).write_bytes(ORIGINAL_B)
    os.rename(folder, tmp_path / "old")
    os.rename(staged, folder)
    event = watch.line(lambda s: json.loads(s)["kind"] == "push" and json.loads(s)["deployed"])
    assert json.loads(event)["deployed"] == [A], event
    assert (setup.root / A).read_bytes() == new
    assert (setup.root / B).read_bytes() == ORIGINAL_B
    code, _, err = watch.stop()
    assert code == 0, err


def test_a_path_that_names_no_workspace_file_is_noted(sshd_server, tmp_path, isolated_home):
    """`kerneldev watch 'attention/*.py'` with that glob configured: PATHS are literal names,
    so it names one file that does not exist; the ready line says so instead of watching in
    silence."""
    glob_path = str(Path(A).parent / "*.py")
    setup = Setup(tmp_path, sshd_server, files=[glob_path])
    watch = Watch(setup, "--json", A, glob_path)
    ready = watch.event("ready")
    assert any("not in the workspace (yet): " + glob_path in n for n in ready["notes"]), ready
    assert not any(A + "," in n or n.endswith(A) for n in ready["notes"]), ready
    code, _, err = watch.stop()
    assert code == 0, err


def test_a_drifted_file_is_refused_and_watch_goes_on(sshd_server, tmp_path, isolated_home):
    """A conflict is refused and left alone; the watch goes on: with --restart, a save whose
    service never gets healthy is rolled back, and the next save is live."""
    sick = tmp_path / "service-is-sick"
    # 5 s (waited out twice while sick): the healthy check over SSH must fit in it even on a
    # loaded 2-core machine (with 1 s, a check slower than that would fail the last push).
    service = {"restart": "true", "health": f"test ! -e '{sick}'", "timeout": 5}
    setup, watch = restarting_watch(tmp_path, sshd_server, service)
    hotfix = ORIGINAL_B + b"# hotfix made on the host\n"
    (setup.root / B).write_bytes(hotfix)
    (setup.workspace / B).write_bytes(ORIGINAL_B + b"# my edit\n")
    event = watch.event("push")
    assert event["outcome"] == "refused", event
    assert [(f["path"], f["status"]) for f in event["refused"]] == [(B, "conflict")]
    assert event["deployed"] == [] and event["deploy_id"] is None
    assert (setup.root / B).read_bytes() == hotfix  # not overwritten

    sick.touch()
    (setup.workspace / A).write_bytes(ORIGINAL_A + b"# breaks the service\n")
    event = watch.event("push")
    assert (event["outcome"], event["deployed"]) == ("rolled-back", [A]), event
    assert event["health"]["healthy"] is False and event["rollback_id"]
    assert (setup.root / A).read_bytes() == ORIGINAL_A

    sick.unlink()
    fixed = ORIGINAL_A + b"# fixed\n"
    (setup.workspace / A).write_bytes(fixed)
    event = watch.event("push")
    assert (event["outcome"], event["deployed"]) == ("pushed", [A]), event
    assert event["health"]["healthy"] is True
    assert (setup.root / A).read_bytes() == fixed
    assert (setup.root / B).read_bytes() == hotfix

    code, rest, err = watch.stop(signal.SIGTERM)
    assert code == 0, err
    assert json.loads(rest[-1])["signal"] == "SIGTERM"
    kinds = [(r["kind"], r["outcome"]) for r in setup.history()]
    assert kinds == [("push", "deployed"), ("rollback", "auto-rollback"), ("push", "deployed")]


def test_a_save_whose_restart_command_fails_is_rolled_back(sshd_server, tmp_path, isolated_home):
    """A restart command that exits 3 counts as an unhealthy service: watch rolls back."""
    sick = tmp_path / "service-is-sick"
    service = {"restart": f"test ! -e '{sick}' || exit 3"}
    setup, watch = restarting_watch(tmp_path, sshd_server, service)
    sick.touch()
    (setup.workspace / A).write_bytes(ORIGINAL_A + b"# breaks the service\n")
    event = watch.event("push")
    assert (event["outcome"], event["deployed"]) == ("rolled-back", [A]), event
    assert event["health"]["last_check"] == "restart exited 3" and event["rollback_id"], event
    assert "exited 3" in event["message"], event
    assert (setup.root / A).read_bytes() == ORIGINAL_A
    code, _, err = watch.stop()
    assert code == 0, err


@pytest.mark.parametrize("kept", [False, True], ids=["one-shot", "kept-session"])
def test_reconnects_after_a_drop_and_pushes_what_was_saved_meanwhile(
    fresh_sshd, tmp_path, isolated_home, monkeypatch, kept
):
    """The host stays away through a failed reconnect attempt (a kept session's opener then
    connects at once and failed outside the retry: the watch ended with exit 3)."""
    if kept:
        monkeypatch.delenv("KERNELDEV_NO_KEEP", raising=False)
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    setup = Setup(tmp_path, fresh_sshd)
    watch = Watch(setup, "--json", "--no-import-check")
    try:
        watch.event("ready")
        kill_sshd_and_sessions(fresh_sshd)  # the host goes away with the watch's connection
        new = ORIGINAL_A + b"# saved while the host was away\n"
        (setup.workspace / A).write_bytes(new)
        lost = watch.event("disconnected")
        assert lost["waiting"] == [A] and lost["attempt"] == 1
        again = watch.event("disconnected")  # a reconnect attempt while it is still away
        assert again["attempt"] == 2 and again["waiting"] == [A]
        fresh_sshd.start()
        back = watch.event("reconnected")
        assert back["waiting"] == [A]
        event = watch.event("push")
        assert (event["outcome"], event["deployed"]) == ("pushed", [A]), event
        assert (setup.root / A).read_bytes() == new
        code, _, err = watch.stop()
        assert code == 0, err
        assert len(setup.history()) == 1
    finally:
        if kept:
            control.stop(load_config(setup.config).hosts["h"])


# --- usage, without a watch running --------------------------------------------------------


def test_bad_usage_exits_2_and_an_unreachable_host_3_before_watching(setup: Setup):
    code, _, err = setup.kd("watch", "--bench", "B=1,H=oops")
    assert code == 2 and "bad shape spec" in err, err
    code, out, err = setup.kd("watch", "no/such/file.py", "--json")
    assert code == 2 and "is not one of the files configured" in err, err
    assert json.loads(out.splitlines()[-1])["error"]["code"] == 2
    data = yaml.safe_load(setup.config.read_text())
    data["groups"] = {"fleet": ["h"]}
    setup.config.write_text(yaml.safe_dump(data))
    code, _, err = setup.kd("watch", "--host", "fleet")
    assert code == 2 and "works on one host" in err, err
    code, _, err = setup.kd("watch", "--host", "h,h")  # a list: the same answer, not "no host"
    assert code == 2 and "'h,h' is a list of hosts and this command works on one host" in err
    data["hosts"]["h"]["port"] = free_port()  # nothing listens there
    setup.config.write_text(yaml.safe_dump(data))
    code, out, err = setup.kd("watch", "--json")
    assert code == 3 and "Traceback" not in err, err
    assert [json.loads(line)["kind"] for line in out.splitlines()] == ["error"]


@pytest.mark.parametrize(
    ("name", "temp"),
    [
        ("flash_mla.py~", True),
        ("4913", True),
        (".flash_mla.py.swp", True),
        (".#flash_mla.py", True),
        ("#flash_mla.py#", True),
        ("flash_mla.py.tmp", True),
        ("flash_mla.py", False),
        ("flash_mla_sm120_triton.py", False),
    ],
)
def test_editor_temporaries_are_recognised(name: str, temp: bool):
    assert is_editor_temp(name) is temp


def test_ctrl_c_while_a_push_waits_for_health_ends_it_as_push_does(
    sshd_server, tmp_path, isolated_home
):
    """Ctrl-C in flight (the service never gets healthy): exit 130 with push's `Deployed:`
    summary, the deploy complete and recorded, the host's lock released."""
    waiting = tmp_path / "health-checked"
    service = {"restart": "true", "health": f"touch '{waiting}'; false", "timeout": 300}
    setup, watch = restarting_watch(tmp_path, sshd_server, service)
    new = ORIGINAL_A + b"# tuned\n"
    (setup.workspace / A).write_bytes(new)
    assert wait_until(waiting.exists)  # pushed, restarted, now waiting for health
    code, rest, err = watch.stop()
    assert code == 130, err
    assert "interrupted" in err and "Traceback" not in err
    error = json.loads(rest[-1])  # JSON lines to the end
    assert error["kind"] == "error" and error["error"]["code"] == 130
    assert f"Deployed: {A} as " in error["error"]["message"]
    assert (setup.root / A).read_bytes() == new
    assert len(setup.history()) == 1 and setup.history()[0]["complete"] is True
    assert not (setup.root / ".kerneldev" / "lock").exists()


def test_bench_checks_the_pushed_kernel(sshd_server, tmp_path, isolated_home):
    """--bench: the bundled kernel saved over the workspace copy is pushed, then checked on the
    host (Triton interpreter, one tiny shape) and its verdict is in the push's event."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kerneldev.bench.harness import bundled_file

    setup = Setup(tmp_path, sshd_server, python=sys.executable)
    shape = "B=1,H=16,topk=16,page=16"
    watch = Watch(
        setup, "--json", "--no-import-check", "--bench", shape, "--cpu", "--variants", "simt"
    )
    watch.event("ready")
    kernel = bundled_file("flash_mla_sm120_triton.py").read_bytes()
    (setup.workspace / A).write_bytes(kernel)
    event = watch.event("push")
    assert (event["outcome"], event["deployed"]) == ("pushed", [A]), event
    check = event["check"]
    assert (check["verdict"], check["ok"], check["failed"]) == ("ok", True, []), check
    assert check["median_us"]["simt"] > 0 and check["cpu"] is True
    assert Path(check["saved_to"]).is_file()
    assert (setup.root / A).read_bytes() == kernel
    code, _, err = watch.stop()
    assert code == 0, err


def test_the_line_of_a_save_that_deleted_the_files_says_so():
    from kerneldev.cli.commands.watch import describe
    from kerneldev.watch import UNCHANGED, WatchEvent

    event = WatchEvent(kind="push", host="h", time="2026-11-30T07:00:00Z", seq=3)
    event.outcome, event.changed, event.ignored = UNCHANGED, [A], [A]
    event.message = "the saved files were deleted from the workspace; watch never deletes"
    line = describe(event)
    assert "deleted from the workspace" in line, line
    assert "live already has these bytes" not in line, line
