"""The loop as a user meets it: pull, diff, push, restart, rollback through the CLI, against a
real sshd on 127.0.0.1 and against the local transport (every scenario runs on both)."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kerneldev.cli.environment import Environment
from kerneldev.cli.main import main
from kerneldev.sandbox.host import find_sshd
from tests.sshutil import ssh_entry

A = "python/sglang/srt/layers/attention/flash_mla_sm120_triton.py"
B = "python/sglang/srt/layers/attention/flash_mla_sm120.py"
ORIGINAL_A = b'"""triton kernel"""\nBLOCK_N = 64\n'
ORIGINAL_B = b'"""wrapper"""\nNUM_SPLITS = 8\n'


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


@dataclass
class Env:
    """One host in a per-test hosts.yaml: a live tree, a workspace and a git mirror."""

    config: Path
    root: Path
    workspace: Path
    mirror: Path
    transport: str

    def kd(self, *args: str) -> Run:
        """Run `kerneldev --config <this> ARGS` through the real entry, in a pipe."""
        return kd("--config", str(self.config), *args)

    def statuses(self, *paths: str) -> dict[str, tuple[str, str | None]]:
        run = self.kd("diff", "--json", *paths)
        assert run.exit_code in (0, 1), run.stderr
        return {f["path"]: (f["status"], f["mirror"]) for f in run.json()["files"]}

    def state(self) -> dict:
        return json.loads((self.workspace / ".kerneldev" / "state.json").read_text())

    def set_host(self, **changes) -> None:
        data = yaml.safe_load(self.config.read_text())
        data["hosts"]["h"].update(changes)
        self.config.write_text(yaml.safe_dump(data))


def kd(*args: str, **terminal) -> Run:
    """`kerneldev ARGS` through `main`, with captured streams (a pipe unless `terminal` says
    otherwise, e.g. stdout_isatty=True, width=80)."""
    out, err = io.StringIO(), io.StringIO()
    env = Environment(stdout=out, stderr=err, stdin=io.StringIO(), **terminal)
    code = main(list(args), env=env)
    return Run(int(code), out.getvalue(), err.getvalue())


def make_env(tmp_path: Path, transport: str, server=None, files=(A, B), **host) -> Env:
    root = tmp_path / "live root"
    mirror = tmp_path / "mirror"
    for tree in (root, mirror):
        for path, data in ((A, ORIGINAL_A), (B, ORIGINAL_B)):
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_bytes(data)
    (root / A).chmod(0o640)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=mirror, check=True)
    subprocess.run([*git, "add", "-A"], cwd=mirror, check=True)
    subprocess.run([*git, "commit", "-qm", "m"], cwd=mirror, check=True)
    entry: dict = {"transport": transport}
    if transport == "ssh":
        entry.update(ssh_entry(server, tmp_path))
    entry.update(root=str(root), files=list(files), workspace="ws", mirror="mirror")
    entry.update(host)
    config = tmp_path / "hosts.yaml"
    config.write_text(yaml.safe_dump({"default": "h", "hosts": {"h": entry}}))
    return Env(config, root, tmp_path / "ws", mirror, transport)


@pytest.fixture(params=["local", "ssh"])
def transport_kind(request) -> str:
    if request.param == "ssh" and find_sshd() is None:
        pytest.skip("sshd is not installed (.ci/run installs openssh-server)")
    return request.param


@pytest.fixture
def env_factory(request, tmp_path, isolated_home, transport_kind):
    server = request.getfixturevalue("sshd_server") if transport_kind == "ssh" else None

    def make(**host) -> Env:
        return make_env(tmp_path, transport_kind, server, **host)

    return make


@pytest.fixture
def env(env_factory) -> Env:
    return env_factory()


def tree_bytes(*folders: Path) -> dict[str, bytes]:
    out = {}
    for folder in folders:
        for dirpath, _, names in os.walk(folder):
            for n in names:
                p = Path(dirpath) / n
                out[str(p)] = p.read_bytes() + oct(p.stat().st_mode).encode()
    return out


# --- the story ----------------------------------------------------------------------------


def test_pull_edit_push_with_backup(env: Env):
    run = env.kd("pull")
    assert run.exit_code == 0, run.stderr
    assert (env.workspace / A).read_bytes() == ORIGINAL_A
    assert (env.workspace / A).stat().st_mode & 0o777 == 0o640  # the live mode came along
    assert env.statuses() == {A: ("in-sync", "same"), B: ("in-sync", "same")}
    assert env.kd("diff").exit_code == 0

    # A second pull transfers nothing.
    again = env.kd("pull", "--json").json()
    assert {f["action"] for f in again["files"]} == {"unchanged"}

    (env.workspace / A).write_bytes(ORIGINAL_A + b"# tuned\n")
    assert env.statuses() == {A: ("edited", "same"), B: ("in-sync", "same")}
    edited = env.kd("diff", "--patch")
    assert edited.exit_code == 1
    assert "+# tuned" in edited.stdout
    patches = {
        f["path"]: f.get("patch") for f in env.kd("diff", "--patch", "--json").json()["files"]
    }
    assert "+# tuned" in patches[A] and patches[B] is None

    push = env.kd("push", "--json")
    assert push.exit_code == 0, push.stderr
    result = push.json()
    assert result["deployed"] == [A]
    assert (env.root / A).read_bytes() == ORIGINAL_A + b"# tuned\n"
    assert (env.root / A).stat().st_mode & 0o777 == 0o640  # the target's mode is kept
    backup = env.root / ".kerneldev" / "backups" / result["deploy_id"] / A
    assert backup.read_bytes() == ORIGINAL_A

    # In sync now, but the mirror still has the old bytes: exit 1 gates scripts.
    assert env.statuses() == {A: ("in-sync", "differs"), B: ("in-sync", "same")}
    assert env.kd("diff").exit_code == 1
    deploy = env.state()["deploys"][-1]
    assert deploy["kind"] == "push" and deploy["id"] == result["deploy_id"]
    assert deploy["files"][0]["old_sha256"] != deploy["files"][0]["new_sha256"]


def test_ctrl_c_before_any_upload_still_prints_the_summary(env: Env):
    """Ctrl-C while the push waits for another engineer's lock: exit 130 with the documented
    `Deployed: (none)` summary, nothing changed, and --json still valid."""
    import signal

    assert env.kd("pull").exit_code == 0
    (env.workspace / A).write_bytes(ORIGINAL_A + b"# tuned\n")
    lock = env.root / ".kerneldev" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = {"user": "bob", "machine": "another-box", "pid": 1, "command": "push"}
    lock.write_text(json.dumps({**holder, "since": "2026-11-30T04:00:00Z", "token": "t"}))

    class CtrlCOnceWaiting(io.StringIO):
        """stderr that presses Ctrl-C once the push says it waits for the lock: a fixed delay
        raced the push's start on a loaded machine."""

        def write(self, text: str) -> int:
            written = super().write(text)
            if "for the lock" in self.getvalue() and not getattr(self, "pressed", False):
                self.pressed = True
                os.kill(os.getpid(), signal.SIGINT)
            return written

    err = CtrlCOnceWaiting()
    out = io.StringIO()
    code = main(
        ["--config", str(env.config), "push", "--lock-wait", "60", "--json"],
        env=Environment(stdout=out, stderr=err, stdin=io.StringIO()),
    )
    assert err.pressed, err.getvalue()
    run = Run(int(code), out.getvalue(), err.getvalue())
    assert run.exit_code == 130
    assert "Deployed: (none)" in run.stderr and "Traceback" not in run.stderr
    assert run.json()["error"]["code"] == 130
    assert (env.root / A).read_bytes() == ORIGINAL_A and lock.exists()


def test_ctrl_c_after_the_pull_completed_is_a_success(env: Env, monkeypatch):
    """Ctrl-C arriving while the pull records its bases (its last, shielded step): every file
    has landed, so the pull exits 0 and says it had completed, as push does."""
    import signal

    from kerneldev import interrupt
    from kerneldev.loop import sync

    record = sync.update_state

    def ctrl_c_then_record(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # as the terminal sends it
        while interrupt.pending() is None:  # the handler runs in the main thread
            pass
        return record(*args, **kwargs)

    monkeypatch.setattr(sync, "update_state", ctrl_c_then_record)
    run = env.kd("pull")
    assert run.exit_code == 0, run.stderr
    assert "2 transferred" in run.stderr
    assert "Ctrl-C came after the pull had completed; nothing was interrupted" in run.stderr
    assert (env.workspace / A).read_bytes() == ORIGINAL_A
    assert set(env.state()["files"]) == {A, B}
    run = env.kd("pull", "--json")  # one JSON document: the result, no error object
    assert run.exit_code == 0 and "error" not in run.json(), run.stderr
    assert "Ctrl-C came after the pull" in run.stderr


def test_ctrl_c_after_the_push_completed_is_a_success(env: Env, monkeypatch):
    """Ctrl-C arriving while the push writes its record (its last, shielded step): the files
    are live and recorded, so the push exits 0 and says it had completed; --json is the
    result alone."""
    import signal

    from kerneldev import interrupt
    from kerneldev.hosts.transport import agent_chain
    from kerneldev.loop import history

    assert env.kd("pull").exit_code == 0
    (env.workspace / A).write_bytes(ORIGINAL_A + b"# tuned\n")
    append, record_step = history.append_record, agent_chain.RunStep.result

    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)  # as the terminal sends it
        while interrupt.pending() is None:  # the handler runs in the main thread
            pass

    def ctrl_c_then_append(*args, **kwargs):
        ctrl_c()
        return append(*args, **kwargs)

    def ctrl_c_then_record(step):  # through the host agent: the chain's last request
        ctrl_c()
        return record_step(step)

    monkeypatch.setattr(history, "append_record", ctrl_c_then_append)
    monkeypatch.setattr(agent_chain.RunStep, "result", ctrl_c_then_record)
    run = env.kd("push", "--no-import-check", "--json")  # the record is the last step
    assert run.exit_code == 0, run.stderr
    result = run.json()  # one JSON document: the push's result, no error object
    assert result["deployed"] == [A] and "error" not in result
    assert f"Ctrl-C came after deploy {result['deploy_id']} had completed" in run.stderr
    assert (env.root / A).read_bytes() == ORIGINAL_A + b"# tuned\n"
    assert env.state()["deploys"][-1]["id"] == result["deploy_id"]
    assert not (env.root / ".kerneldev" / "lock").exists()


def test_the_progress_bar_counts_the_plan_made_under_the_lock(env: Env, monkeypatch):
    """On a terminal: the push waits for another engineer's lock; meanwhile they push one of
    the two files we edited, with our bytes. The bar must count what this push uploads once it
    holds the lock (one file), not what it would have uploaded before the wait (two)."""
    import time

    from rich.progress import Progress

    assert env.kd("pull").exit_code == 0
    new_a, new_b = b"#" + b"a" * 4999, b"#" + b"b" * 6999  # valid Python: the import check
    (env.workspace / A).write_bytes(new_a)
    (env.workspace / B).write_bytes(new_b)
    lock = env.root / ".kerneldev" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = {"user": "bob", "machine": "another-box", "pid": 1, "command": "push"}
    lock.write_text(json.dumps({**holder, "since": "2026-11-30T04:00:00Z", "token": "t"}))
    totals: list[float | None] = []
    sent: list[float] = []
    add_task, update, advance = Progress.add_task, Progress.update, Progress.advance

    def spy_add_task(self, description, *args, total=100.0, **fields):
        totals.append(total)
        return add_task(self, description, *args, total=total, **fields)

    def spy_update(self, task, **fields):
        if "total" in fields:
            totals.append(fields["total"])
        return update(self, task, **fields)

    def spy_advance(self, task, n):
        sent.append(n)
        return advance(self, task, n)

    monkeypatch.setattr(Progress, "add_task", spy_add_task)
    monkeypatch.setattr(Progress, "update", spy_update)
    monkeypatch.setattr(Progress, "advance", spy_advance)
    out, err = io.StringIO(), io.StringIO()

    def bob_pushes_a_then_unlocks() -> None:
        deadline = time.monotonic() + 60
        while "waiting up to" not in err.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        (env.root / A).write_bytes(new_a)
        lock.unlink()

    bob = threading.Thread(target=bob_pushes_a_then_unlocks)
    bob.start()
    terminal = Environment(stdout=out, stderr=err, stdin=io.StringIO(), stderr_isatty=True)
    code = main(["--config", str(env.config), "push", "--lock-wait", "60"], env=terminal)
    bob.join()
    assert code == 0, err.getvalue()
    assert "waiting up to" in err.getvalue()
    assert (env.root / B).read_bytes() == new_b
    assert totals and totals[-1] == len(new_b), totals
    assert sum(sent) == len(new_b)


def test_drift_refused_then_force(env: Env):
    env.kd("pull")
    (env.root / B).write_bytes(ORIGINAL_B + b"# hotfix on the host\n")
    assert env.statuses()[B] == ("drifted", "differs")

    refused = env.kd("push")
    assert refused.exit_code == 1
    assert B in refused.stderr
    assert (env.root / B).read_bytes() == ORIGINAL_B + b"# hotfix on the host\n"

    forced = env.kd("push", "--force")
    assert forced.exit_code == 0, forced.stderr
    assert (env.root / B).read_bytes() == ORIGINAL_B
    assert env.statuses()[B] == ("in-sync", "same")


def test_conflict(env: Env):
    env.kd("pull")
    (env.workspace / A).write_bytes(b"mine\n")
    (env.root / A).write_bytes(b"theirs\n")
    assert env.statuses()[A][0] == "conflict"
    refused = env.kd("push")
    assert refused.exit_code == 1 and A in refused.stderr and "conflict" in refused.stderr
    assert (env.root / A).read_bytes() == b"theirs\n"


def test_mirror_differs_and_commit(env: Env):
    env.kd("pull")
    (env.mirror / B).write_bytes(b"upstream moved on\n")
    run = env.kd("diff", "--json")
    assert run.exit_code == 1
    report = run.json()
    assert set(report) == {"host", "mirror_commit", "files"}
    head = subprocess.run(
        ["git", "-C", str(env.mirror), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert report["host"] == "h" and report["mirror_commit"] == head
    files = {f["path"]: f for f in report["files"]}
    assert files[B]["status"] == "in-sync" and files[B]["mirror"] == "differs"
    assert files[A]["mirror"] == "same"

    # A mirror that is not a git repository still compares, with a null commit and a warning.
    shutil.rmtree(env.mirror / ".git")
    run = env.kd("diff", "--json")
    assert run.json()["mirror_commit"] is None
    assert "not a git repository" in run.stderr


def test_dry_run_changes_nothing(env: Env):
    env.kd("pull")
    (env.workspace / A).write_bytes(b"edited\n")
    before = tree_bytes(env.root, env.workspace)
    run = env.kd("push", "--dry-run", "--json")
    assert run.exit_code == 0, run.stderr
    plan = run.json()
    assert plan["dry_run"] is True and plan["deploy_id"] is None
    assert [f["path"] for f in plan["files"] if f["action"] == "upload"] == [A]
    assert tree_bytes(env.root, env.workspace) == before  # live, workspace and state.json


def test_rollback_restores_exact_bytes(env: Env):
    env.kd("pull")
    (env.workspace / A).write_bytes(b"kernel = 'new'\n")  # pushes are import-checked
    (env.workspace / B).write_bytes(b"wrapper = 'new'\n")
    assert env.kd("push").exit_code == 0
    run = env.kd("rollback", "--json")
    assert run.exit_code == 0, run.stderr
    assert (env.root / A).read_bytes() == ORIGINAL_A
    assert (env.root / B).read_bytes() == ORIGINAL_B
    assert (env.root / A).stat().st_mode & 0o777 == 0o640
    assert env.state()["deploys"][-1]["kind"] == "rollback"
    # The workspace keeps the edits: they show as not pushed.
    assert env.statuses() == {A: ("edited", "same"), B: ("edited", "same")}

    # Rolling back the rollback re-applies the push.
    assert env.kd("rollback").exit_code == 0
    assert (env.root / A).read_bytes() == b"kernel = 'new'\n"
    assert env.statuses()[A] == ("in-sync", "differs")


def test_a_pushed_file_that_does_not_parse_is_refused_with_a_fix_hint(env: Env):
    env.kd("pull")
    (env.workspace / A).write_bytes(b"BLOCK_N = 64\ndef kernel(:\n    pass\n")
    run = env.kd("push")
    assert run.exit_code == 1, run.stderr
    assert f"{A} does not parse: line 2:" in run.stderr
    hint = run.stderr.split("hint: ", 1)[1]
    assert hint.startswith(f"fix the syntax error in {A} at the line named above")
    assert f"python -m py_compile {A}" in hint and "then push again" in hint
    assert "keep" not in hint and "--no-import-check" not in hint  # skipping deploys it broken
    assert (env.root / A).read_bytes() == ORIGINAL_A


def test_the_import_refusal_hints_fit_what_was_found():
    from kerneldev.errors import ImportRefusedError
    from kerneldev.loop import import_check

    gap = import_check.MissingImport("k/user.py", "k.a", "BLOCK_N", 3)
    names = import_check.ImportScan(modules={"k/a.py": "k.a"}, missing=[gap])
    broken = import_check.ImportScan(
        modules={"k/a.py": "k.a", "k/b.py": "k.b"},
        unparsable=["k/b.py does not parse: line 2: invalid syntax"],
        missing=[gap],
    )
    hints = []
    for scan in (names, broken):
        with pytest.raises(ImportRefusedError) as caught:
            import_check.refuse_gaps(scan)
        hints.append(caught.value.hint)
    assert hints[0].startswith("keep the missing names in the new file")
    assert hints[0].endswith("or skip this check with --no-import-check")
    assert hints[1].startswith("fix the syntax error in k/b.py at the line named above")
    assert "; keep the missing names" in hints[1] and "--no-import-check" not in hints[1]


def test_pull_refuses_unpushed_edits(env: Env):
    env.kd("pull")
    (env.workspace / A).write_bytes(b"my unpushed work\n")
    (env.root / A).write_bytes(b"changed on host\n")
    run = env.kd("pull")
    assert run.exit_code == 1 and A in run.stderr
    assert (env.workspace / A).read_bytes() == b"my unpushed work\n"

    # A subset that avoids the edited file works.
    (env.root / B).write_bytes(b"b changed on host\n")
    assert env.kd("pull", B).exit_code == 0
    assert (env.workspace / B).read_bytes() == b"b changed on host\n"

    forced = env.kd("pull", "--force", "--json")
    assert forced.exit_code == 0
    assert (env.workspace / A).read_bytes() == b"changed on host\n"
    kept = [f["discarded"] for f in forced.json()["files"] if f["discarded"]]
    assert len(kept) == 1 and Path(kept[0]).read_bytes() == b"my unpushed work\n"


def test_paths_workspace_or_root_relative_and_unknown(env: Env):
    env.kd("pull")
    (env.workspace / A).write_bytes(b"x = 1\n")  # pushes are import-checked
    (env.workspace / B).write_bytes(b"y = 2\n")
    # A workspace path selects just that file.
    run = env.kd("push", str(env.workspace / B), "--json")
    assert run.exit_code == 0 and run.json()["deployed"] == [B]
    assert (env.root / A).read_bytes() == ORIGINAL_A
    unknown = env.kd("push", "python/other.py")
    assert unknown.exit_code == 2 and "python/other.py" in unknown.stderr


def test_hostile_names_via_glob(env_factory):
    env = env_factory(files=["weird dir/*.py"])
    names = ["weird dir/ä ö [x].py", 'weird dir/it\'s "quoted" $HOME.py']
    for n in names:
        (env.root / n).parent.mkdir(parents=True, exist_ok=True)
        (env.root / n).write_bytes(n.encode() + b"\n")
    assert env.kd("pull").exit_code == 0
    assert {p for p in env.statuses()} == set(names)
    for n in names:
        (env.workspace / n).write_bytes(b"edited " + n.encode() + b"\n")
    assert set(env.statuses().values()) == {("edited", "absent")}
    # Naming one file with glob characters in it selects exactly that file.
    run = env.kd("push", names[0], "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["deployed"] == [names[0]]
    assert env.kd("push").exit_code == 0
    for n in names:
        assert (env.root / n).read_bytes() == b"edited " + n.encode() + b"\n"
    assert env.kd("rollback").exit_code == 0
    assert (env.root / names[1]).read_bytes() == names[1].encode() + b"\n"


def test_control_characters_in_names_are_escaped_in_human_output(env_factory):
    """A file name with a newline, a tab or a terminal escape in it is one escaped, quoted
    cell or item (`'k/new\\nline.py'`) in the tables and lines of diff, push and status, on a
    terminal and in a pipe; --json keeps the exact names."""
    env = env_factory(files=["k/*.py"])
    names = ["k/new\nline.py", "k/tab\there.py", "k/esc\x1b[31mred.py"]
    shown = [repr(n) for n in names]
    (env.root / "k").mkdir()
    for n in names:
        (env.root / n).write_bytes(b"v1\n")
    assert env.kd("pull").exit_code == 0
    for n in names:
        (env.workspace / n).write_bytes(b"v2\n")

    def assert_escaped(text: str) -> None:
        assert "\x1b" not in text and "\t" not in text and "new\nline" not in text, text

    diff = env.kd("diff")
    assert diff.exit_code == 1
    rows = diff.stdout.splitlines()[1:]  # under the header: one line per file
    assert len(rows) == len(names), diff.stdout
    assert all(r.startswith("edited") for r in rows), diff.stdout
    assert {r.split()[-1] for r in rows} >= {shown[0], shown[2]}
    assert_escaped(diff.stdout)
    terminal = kd("--config", str(env.config), "diff", stdout_isatty=True, width=100)
    assert "new\nline" not in terminal.stdout and "esc\x1b" not in terminal.stdout  # rich's own
    assert all(s in terminal.stdout for s in shown)  # colours aside, the names are escaped
    assert {f["path"] for f in env.kd("diff", "--json").json()["files"]} == set(names)
    patch = env.kd("diff", "--patch")  # the headers name the files escaped too
    assert_escaped(patch.stdout)
    assert all(f"--- {repr('live/' + n)}" in patch.stdout for n in names), patch.stdout

    push = env.kd("push", "--no-import-check")
    assert push.exit_code == 0, push.stderr
    assert_escaped(push.stdout + push.stderr)
    deployed = next(ln for ln in push.stderr.splitlines() if ln.startswith("Deployed: "))
    assert all(s in deployed for s in shown), deployed
    assert len([ln for ln in push.stdout.splitlines() if ln.startswith("upload")]) == 3
    for n in names:
        assert (env.root / n).read_bytes() == b"v2\n"

    (env.root / names[0]).write_bytes(b"hot fix\n")  # status flags it by name
    status = env.kd("status")
    assert status.exit_code == 1
    assert_escaped(status.stdout)
    lines = status.stdout.splitlines()
    assert any(ln.startswith("h: changed since deploy") and shown[0] in ln for ln in lines)
    assert all(ln.startswith("h: ") for ln in lines[2:]), status.stdout
    refused = env.kd("push", "--force", "--dry-run")
    assert_escaped(refused.stdout + refused.stderr)


def test_patch_on_an_80_column_terminal_is_wrapped_not_cut(tmp_path, isolated_home):
    env = make_env(tmp_path, "local", files=[A, B, "python/sglang/srt/layers/attention/blob.bin"])
    blob = env.root / "python/sglang/srt/layers/attention/blob.bin"
    blob.write_bytes(b"\x00\x1b[2J" * 50)
    assert env.kd("pull").exit_code == 0
    (env.workspace / "python/sglang/srt/layers/attention/blob.bin").write_bytes(b"\x00" * 9)
    (env.workspace / A).write_bytes(ORIGINAL_A + b"X = '" + b"long line " * 12 + b"end'\n")
    run = kd("--config", str(env.config), "diff", "--patch", stdout_isatty=True, width=80)
    assert run.exit_code == 1, run.stderr
    shown = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout)
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    joined = "".join(shown.split())  # what the eye reads across wrapped lines
    assert "blob.bindiffer" in joined, shown  # "Binary files ... differ", not cut at 80
    assert hashlib.sha256(b"\x00" * 9).hexdigest() in joined, shown
    assert "longline" * 12 + "end'" in joined, shown


# --- restart ------------------------------------------------------------------------------


def test_restart_health_command_after_delay(env_factory, tmp_path):
    flag = tmp_path / "healthy-flag"
    env = env_factory(
        service={
            "restart": f"rm -f '{flag}'; (sleep 1; touch '{flag}') >/dev/null 2>&1 </dev/null &",
            "health": f"test -f '{flag}'",
            "timeout": 10,
        }
    )
    run = env.kd("restart", "--json")
    assert run.exit_code == 0, run.stderr
    health = run.json()
    assert health["healthy"] is True and health["checks"] >= 2 and health["elapsed"] >= 0.9


def test_restart_never_healthy_shows_logs(env_factory):
    env = env_factory(
        service={
            "restart": "true",
            "health": "false",
            "timeout": 1.5,
            "logs": "echo 'CUDA error: LOG-MARKER'",
        }
    )
    run = env.kd("restart")
    assert run.exit_code == 1
    assert "LOG-MARKER" in run.stderr and "not healthy" in run.stderr


def test_unhealthy_logs_are_whole_lines_in_a_pipe_and_wrapped_at_a_slash_on_a_terminal(
    tmp_path, isolated_home
):
    line = f'  File "/srv/checkouts/sglang-dsv4/{A}", line 42, in flash_mla_sm120_entry_point'
    logs = tmp_path / "service.log"
    logs.write_text(f"CUDA error: LOG-MARKER\n{line}\n")
    service = {"restart": "true", "health": "false", "timeout": 0.5, "logs": f"cat '{logs}'"}
    env = make_env(tmp_path, "local", service=service)
    run = env.kd("restart")
    assert run.exit_code == 1
    assert f"\n{line}\n" in run.stderr  # one line, whole, for grep
    assert "--- service logs (cat " in run.stderr and "--- end of service logs" in run.stderr

    run = kd("--config", str(env.config), "restart", stderr_isatty=True, width=80)
    assert run.exit_code == 1
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", run.stderr)  # colour and cursor codes
    shown = text[text.index("LOG-MARKER") :].splitlines()[1:]
    rows = shown[: next(i for i, row in enumerate(shown) if row.startswith("─"))]
    assert len(rows) > 1 and all(len(row) <= 80 for row in rows), rows
    # Broken at spaces and after a `/`, nothing lost: no name is cut inside.
    assert "".join(row.strip().replace(" ", "") for row in rows) == line.replace(" ", "")
    assert any(row.endswith("/") for row in rows), rows
    assert any(row.strip().startswith("flash_mla_sm120_triton.py") for row in rows), rows


def test_restart_failing_command(env_factory):
    env = env_factory(service={"restart": "echo boom >&2; exit 3", "health": "true"})
    run = env.kd("restart")
    assert run.exit_code == 1 and "boom" in run.stderr


def test_restart_without_service_is_usage_error(env: Env):
    run = env.kd("restart")
    assert run.exit_code == 2 and "no service" in run.stderr


class _WarmingUp(http.server.BaseHTTPRequestHandler):
    """503 for the first two requests, then 200: a server that is still loading."""

    count = 0

    def do_GET(self):
        type(self).count += 1
        code = 200 if type(self).count > 2 else 503
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_restart_http_health(env_factory, monkeypatch):
    _WarmingUp.count = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WarmingUp)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # Poll fast: this test is about the HTTP path, not the interval.
    monkeypatch.setattr("kerneldev.service.restart.DEFAULT_INTERVAL", 0.1)
    try:
        port = server.server_address[1]
        env = env_factory(
            service={
                "restart": "true",
                "health": f"http://127.0.0.1:{port}/health",
                "timeout": 10,
            }
        )
        run = env.kd("push", "--restart", "--json")
        assert run.exit_code == 0, run.stderr
        health = run.json()["health"]
        assert health["healthy"] and health["last_check"] == "HTTP 200" and health["checks"] == 3
    finally:
        server.shutdown()
        server.server_close()


# --- the demo -----------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_exits_0(tmp_path):
    """The README's main job as a new user runs it: kept sessions on (the suite turns them
    off elsewhere) and no $XDG_RUNTIME_DIR, so the session's socket sits in the demo's
    workspace; the demo ends that session with its sandbox."""
    env = {k: v for k, v in os.environ.items() if k not in ("KERNELDEV_NO_KEEP", "XDG_RUNTIME_DIR")}
    proc = subprocess.run(
        [sys.executable, "-m", "kerneldev", "demo", "--dir", str(tmp_path / "sb")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,  # the decode service's bench --service and profile steps restart it 6 times
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASSED" in proc.stdout
    assert not (tmp_path / "sb").exists()  # cleaned up without --keep
    # A stopped holder takes its socket away first, then closes its connection and exits.
    deadline = time.monotonic() + 20
    while (left := _holders_with_files_under(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"session holders outlived the demo: {left}"


def _holders_with_files_under(folder: Path) -> list[tuple[int, list[str]]]:
    """Session holder processes with a file open under `folder` (their log sits in the
    workspace they were started for)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if b"session.holder" not in (proc / "cmdline").read_bytes():
                continue
            links = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue  # gone, or not ours to read
        hits = [link for link in links if link.startswith(str(folder))]
        if hits:
            found.append((int(proc.name), hits))
    return found


def test_console_script_names_hostile_file_in_refusal(tmp_path, isolated_home):
    """Through the real entry point: a refusal is one readable line naming the file (rich
    markup in a name like `[x]` is printed as it is), exit 1, no traceback."""
    env = make_env(tmp_path, "local", files=["odd/*.py"])
    name = "odd/ä ö [x].py"
    (env.root / name).parent.mkdir(parents=True)
    (env.root / name).write_text("v1\n")

    def kerneldev(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "kerneldev", "--config", str(env.config), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert kerneldev("pull").returncode == 0
    (env.root / name).write_text("hotfix\n")
    (env.workspace / name).write_text("mine\n")
    proc = kerneldev("push")
    assert proc.returncode == 1
    assert "ä ö [x].py (conflict)" in proc.stderr and "Traceback" not in proc.stderr
    diff = kerneldev("diff")
    assert diff.returncode == 1 and f"conflict  absent  {name}" in diff.stdout


def test_push_restart_without_service_deploys_nothing(env: Env):
    env.kd("pull")
    (env.workspace / A).write_bytes(b"edited\n")
    run = env.kd("push", "--restart")
    assert run.exit_code == 2 and "no service" in run.stderr
    assert (env.root / A).read_bytes() == ORIGINAL_A


def test_a_file_deleted_on_the_host_and_in_the_workspace_is_forgotten_by_pull(env_factory):
    # A glob-matched file that a colleague deleted on the host: once the workspace copy is
    # deleted too, one pull settles it; diff used to exit 1 (`missing-live`) for ever after.
    env = env_factory(files=["python/sglang/srt/layers/attention/*.py"])
    assert env.kd("pull").exit_code == 0
    (env.root / B).unlink()
    pulled = env.kd("pull")
    assert pulled.exit_code == 1 and B in pulled.stderr  # reported: the workspace still has it
    assert env.statuses()[B][0] == "missing-live"
    (env.workspace / B).unlink()
    pulled = env.kd("pull")
    assert pulled.exit_code == 1 and B in pulled.stderr  # reported once more, then forgotten
    assert B not in env.state()["files"]
    assert env.statuses() == {A: ("in-sync", "same")}
    assert env.kd("diff").exit_code == 0 and env.kd("pull").exit_code == 0
