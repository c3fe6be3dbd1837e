"""The command line itself, through `main(argv, env)`: exit codes, what a terminal of 80
columns shows, JSON on failure, where the config is found, help and honest messages. The loop's
behaviour is in test_loop_cmd.py; these run on the local transport (plus an SSH port nobody
listens on for "unreachable")."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kerneldev.bench import kernel_bench as bench
from kerneldev.cli import environment
from kerneldev.cli.main import hoist_global_options
from kerneldev.cli.output import NUMBER, Column, print_table, wrap_path
from kerneldev.config import load_config
from kerneldev.errors import ExitCode
from kerneldev.printable import printable
from kerneldev.sandbox.host import free_port
from tests.clirun import run_kerneldev
from tests.sshutil import run_cli, ssh_host, start_on_terminal, write_hosts_yaml
from tests.test_loop_cmd import A, B, Env, kd, make_env


@pytest.fixture(autouse=True)
def _home(isolated_home):
    return isolated_home


@pytest.fixture
def env(tmp_path) -> Env:
    return make_env(tmp_path, "local")


def unreachable(env: Env, **extra) -> None:
    """Point the host at an SSH port on 127.0.0.1 where nothing listens."""
    data = yaml.safe_load(env.config.read_text())
    entry = data["hosts"]["h"]
    entry.update(transport="ssh", hostname="127.0.0.1", port=free_port(), user="nobody")
    entry.update(extra)
    env.config.write_text(yaml.safe_dump(data))


# --- exit codes -------------------------------------------------------------------------


def test_main_returns_named_exit_codes(env: Env):
    assert env.kd("pull").exit_code == ExitCode.OK
    (env.workspace / A).write_bytes(b"edited\n")
    assert env.kd("diff").exit_code == ExitCode.FAILURE  # a difference, not an error
    assert env.kd("diff", "nope.py").exit_code == ExitCode.USAGE
    assert env.kd("diff", "--no-such-option").exit_code == ExitCode.USAGE


def test_unreachable_host_is_3_not_drift(env: Env):
    unreachable(env)
    run = env.kd("diff")
    assert run.exit_code == ExitCode.UNREACHABLE == 3
    assert "kerneldev: error:" in run.stderr and "Traceback" not in run.stderr


# --- tables -------------------------------------------------------------------------------


def test_table_cells_are_not_markup_on_a_terminal(tmp_path):
    env = make_env(tmp_path, "local", files=["odd/*.py"])
    name = "odd/[x].py"
    (env.root / name).parent.mkdir(parents=True)
    (env.root / name).write_text("v1\n")
    assert env.kd("pull").exit_code == 0
    run = kd("--config", str(env.config), "diff", stdout_isatty=True, width=120)
    assert run.exit_code == 0, run.stderr
    assert name in run.stdout  # rich markup would have shown `odd/.py`
    assert "in-sync" in run.stdout


def test_tables_fit_80_columns_on_a_terminal(tmp_path):
    deep = "python/sglang/srt/layers/attention/very_long_kernel_directory_name/"
    files = [deep + "flash_mla_sm120_triton_extra.py", A]
    env = make_env(tmp_path, "local", files=files)
    (env.root / files[0]).parent.mkdir(parents=True, exist_ok=True)
    (env.root / files[0]).write_bytes(b"k\n")
    env.kd("pull")
    (env.workspace / files[0]).write_bytes(b"edited\n")
    (env.workspace / A).write_bytes(b"edited too\n")

    for args in (("push", "--dry-run"), ("diff",)):
        run = kd("--config", str(env.config), *args, stdout_isatty=True, width=80)
        shown = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout)  # what the eye sees
        lines = shown.splitlines()
        assert lines and all(len(line) <= 80 for line in lines), shown
        words = shown.split()
        # Status words whole, not `upl`/`oad`; every path segment readable.
        assert ("upload" in words) if args[0] == "push" else ("edited" in words)
        for segment in files[0].split("/"):
            assert segment in shown
    # Hashes are shortened on a narrow terminal; a pipe keeps 12 characters, one row a line.
    plan = kd("--config", str(env.config), "push", "--dry-run", stdout_isatty=True, width=80)
    piped = env.kd("push", "--dry-run")
    live_sha = env.kd("push", "--dry-run", "--json").json()["files"][0]["old_sha256"]
    assert live_sha[:8] in plan.stdout and live_sha[:12] not in plan.stdout
    assert live_sha[:12] in piped.stdout
    assert any(line.endswith(files[0]) for line in piped.stdout.splitlines())


def test_log_fits_80_columns_and_keeps_the_path(tmp_path):
    """`kerneldev log` at 80 columns: every line fits, and the columns that matter (id, what
    happened, whether it is live, which file) stay; the others are named as hidden."""
    env = make_env(tmp_path, "local")
    env.kd("pull")
    (env.workspace / A).write_bytes(b"EDITED = True\n")  # valid Python: pushes import-check
    assert env.kd("push").exit_code == 0
    run = kd("--config", str(env.config), "log", stdout_isatty=True, width=80)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout)
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    deploy_id = env.kd("log", "--json").json()[0]["id"]
    for word in (deploy_id, "push/deployed", "yes", "flash_mla_sm120", "triton.py", "hidden"):
        assert word in shown, shown


def test_a_table_too_wide_even_without_its_secondary_columns_keeps_every_column():
    # bench at 80 columns: a long shape name must not push the accuracy verdict off the table.
    columns = [Column("shape"), Column("µs", NUMBER), Column("x", NUMBER, drop_order=1)]
    columns += [Column("acc"), Column("vs simt", NUMBER)]
    shape = "B2 H16 main8/p16+extra16/p16 sink len-partial invalid0.25 and a longer tail"
    out = io.StringIO()
    with environment.use(environment.Environment(stdout=out, stdout_isatty=True, width=80)):
        print_table("t", columns, [[shape, "1193095.0", "1" * 20, "FAILED", "1.00x"]])
    shown = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    assert "FAILED" in shown and "1.00x" in shown and "1193095.0" in shown, shown
    assert "invalid0.25" in shown, shown  # the shape wraps instead
    assert "hidden at 80 columns: x" in shown


def test_wrap_path_breaks_after_slashes():
    assert wrap_path("abc/def/ghi.py", 8) == "abc/def/\nghi.py"
    assert wrap_path("short.py", 20) == "short.py"
    assert all(len(line) <= 4 for line in wrap_path("abcdefghij/k", 4).splitlines())
    # A part longer than the line: broken before an escape or after `_` `.` `-`, not cut.
    quoted = printable("odd/esc\x1b[31mred.py")  # 'odd/esc\x1b[31mred.py'
    assert wrap_path(quoted, 17) == "'odd/\nesc\\x1b[31mred.\npy'"
    assert wrap_path("a/flash_mla_sm120_triton.py", 16) == "a/\nflash_mla_sm120_\ntriton.py"


def test_log_at_80_columns_never_cuts_an_escaped_name_inside(tmp_path, isolated_home):
    name = "odd/esc\x1b[31mred.py"
    env = make_env(tmp_path, "local", files=(A, B, "odd/*"))
    (env.root / "odd").mkdir()
    (env.root / name).write_bytes(b"x = 1\n")
    assert env.kd("pull").exit_code == 0
    (env.workspace / name).write_bytes(b"x = 2\n")
    (env.workspace / A).write_bytes(b"y = 2\n")
    assert env.kd("push", "--no-import-check").exit_code == 0
    run = kd("--config", str(env.config), "log", stdout_isatty=True, width=80)
    text = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout)
    rows = [row for row in text.splitlines() if row.strip()]
    assert all(len(row) <= 80 for row in rows), rows
    cells = [row[row.index("'odd/") :].strip() for row in rows if "'odd/" in row]
    assert cells == ["'odd/"], rows
    after = rows[[i for i, row in enumerate(rows) if "'odd/" in row][0] + 1 :]
    # Too long for the path column: broken after the `.`, never inside `red.py` or `\x1b`.
    assert [row.split()[-1] for row in after[:2]] == ["esc\\x1b[31mred.", "py'"], rows


# --- JSON on failure ------------------------------------------------------------------------


def test_json_on_a_refused_push_is_the_plan_with_the_error(env: Env):
    env.kd("pull")
    (env.root / B).write_bytes(b"hotfix on the host\n")
    run = env.kd("push", "--json")
    assert run.exit_code == 1
    data = run.json()
    assert data["error"]["code"] == 1 and "refused" in data["error"]["message"]
    actions = {f["path"]: f["action"] for f in data["files"]}
    assert actions[B] == "refused"


def test_json_on_a_refused_pull(env: Env):
    env.kd("pull")
    (env.workspace / A).write_bytes(b"mine\n")
    (env.root / A).write_bytes(b"theirs\n")
    data = env.kd("pull", "--json").json()
    assert data["refused"] == [A] and data["error"]["code"] == 1


def test_json_on_an_unhealthy_restart(tmp_path):
    # 3 s: the restart command runs under service.timeout too, and must not time out on a
    # loaded machine (a restart that timed out is a failed restart with no health check).
    service = {"restart": "true", "health": "false", "timeout": 3}
    env = make_env(tmp_path, "local", service=service)
    run = env.kd("restart", "--json")
    assert run.exit_code == 1
    data = run.json()
    assert data["healthy"] is False and data["checks"] >= 1 and data["error"]["code"] == 1
    # After a push that landed, the push is reported with the failed health in it.
    env.kd("pull")
    (env.workspace / A).write_bytes(b"edited = True\n")  # pushes are import-checked
    pushed = env.kd("push", "--restart", "--json").json()
    assert pushed["deployed"] == [A] and pushed["health"]["healthy"] is False
    assert pushed["error"]["type"] == "UnhealthyError"


def test_json_on_errors_carries_the_code(env: Env):
    usage = env.kd("diff", "nope.py", "--json")
    assert usage.exit_code == 2 and usage.json()["error"]["code"] == 2
    bad_option = env.kd("diff", "--json", "--bogus")
    assert bad_option.exit_code == 2 and bad_option.json()["error"]["code"] == 2
    unreachable(env)
    down = env.kd("pull", "--json")
    assert down.exit_code == 3 and down.json()["error"]["code"] == 3
    assert down.json()["error"]["hint"]


def test_control_characters_typed_by_the_user_are_escaped_in_errors(env: Env):
    """`kerneldev diff $'\\x1b[31mred'` used to send the escape sequence to the terminal in
    its error; every error line (ours and click's usage errors) shows it escaped, on a
    terminal and in a pipe; --json keeps the exact text."""
    red = "\x1b[31mred"
    runs = [
        env.kd("diff", red),
        kd("--config", str(env.config), "diff", red, stderr_isatty=True),
        env.kd("diff", "--host", red + "\r"),
        env.kd("diff", "--bogus" + red),
        kd("--config", str(env.config) + red, "diff"),
    ]
    for run in runs:
        assert run.exit_code == 2, run.stderr
        assert red not in run.stderr and "\r" not in run.stderr, repr(run.stderr)
        assert "\\x1b[31mred" in run.stderr, run.stderr
    assert "\x1b" not in runs[0].stderr  # in a pipe, no escape sequence at all
    assert "no host named '\\x1b[31mred\\r'" in runs[2].stderr, runs[2].stderr
    assert env.kd("diff", red, "--json").json()["error"]["message"].startswith(f"'{red}'")


# --- finding the config -----------------------------------------------------------------------


def test_config_and_host_on_either_side_of_the_subcommand(env: Env):
    assert env.kd("pull").exit_code == 0
    after = kd("diff", "--config", str(env.config), "--json")
    assert after.exit_code == 0, after.stderr and after.json()["host"] == "h"
    equals = kd("diff", f"--config={env.config}", "--host", "h")
    assert equals.exit_code == 0, equals.stderr
    before = kd("--config", str(env.config), "--host", "h", "diff")
    assert before.exit_code == 0, before.stderr
    typo = kd("--host", "nope", "diff", "--config", str(env.config))
    assert typo.exit_code == 2 and "no host named 'nope'" in typo.stderr


def test_hoisting_stops_at_double_dash():
    assert hoist_global_options(["push", "--", "--config", "x"]) == ["push", "--", "--config", "x"]


def test_config_found_upward_and_from_the_workspace(tmp_path, monkeypatch):
    env = make_env(tmp_path, "local")
    sub = tmp_path / "deep" / "er"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    assert kd("pull").exit_code == 0  # hosts.yaml two folders up

    # A config kept elsewhere: the pulled workspace remembers it.
    elsewhere = tmp_path / "configs"
    elsewhere.mkdir()
    moved = elsewhere / "hosts.yaml"
    data = yaml.safe_load(env.config.read_text())
    data["hosts"]["h"]["workspace"] = str(env.workspace)
    data["hosts"]["h"]["mirror"] = str(env.mirror)
    moved.write_text(yaml.safe_dump(data))
    env.config.unlink()
    assert kd("--config", str(moved), "pull").exit_code == 0
    pointer = json.loads((env.workspace / ".kerneldev" / "config.json").read_text())
    assert pointer == {"config": str(moved), "host": "h"}
    monkeypatch.chdir(env.workspace / Path(A).parent)
    run = kd("diff", "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["host"] == "h"

    monkeypatch.chdir(tmp_path / "deep")
    lost = kd("diff")
    assert lost.exit_code == 2 and "not found" in lost.stderr and "--config" in lost.stderr


def test_host_typo_from_the_environment_says_so(env: Env, monkeypatch):
    monkeypatch.setenv("KERNELDEV_HOST", "hh")
    run = env.kd("diff")
    assert run.exit_code == 2
    assert "no host named 'hh' (from $KERNELDEV_HOST)" in run.stderr


# --- help, version, messages ----------------------------------------------------------------


def test_config_without_a_value_after_the_subcommand_says_so():
    run = kd("diff", "--json", "--config")
    assert run.exit_code == 2
    assert "'--config' requires an argument" in run.stderr, run.stderr
    assert "No such option: --json" not in run.stderr + run.stdout
    assert run.json()["error"]["code"] == 2  # --json still gets its JSON


def test_help_has_no_type_tags_and_version():
    commands = ("pull", "push", "bench", "log", "demo", "profile", "sandbox up")
    for args in (["--help"], *([*c.split(), "--help"] for c in commands)):
        run = kd(*args)
        assert run.exit_code == 0 and "Usage: kerneldev" in run.stdout
        assert "<bool>" not in run.stdout and "<str>" not in run.stdout
        assert "<int>" not in run.stdout and "<path>" not in run.stdout, run.stdout
        assert "list[str]" not in run.stdout
    version = kd("--version")
    assert version.exit_code == 0 and version.stdout.startswith("kerneldev 0.")


def test_help_imports_no_paramiko_rich_tables_or_torch():
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "kerneldev", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    modules = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()}
    for heavy in ("paramiko", "rich.table", "rich.syntax", "torch", "triton"):
        assert heavy not in modules, heavy


# A real SIGINT, delivered while kerneldev is still importing typer (before main() runs).
# The child first puts SIGINT as a terminal's foreground job has it: Python's handler, not
# blocked. A parent that ignores SIGINT (a background job of a non-interactive shell, as CI
# scripts and `nohup` start pytest) passes SIG_IGN on through exec, and one that blocks it
# passes the mask on: either way the signal would never be acted on, the child would go on to
# its config check, and the test would fail for a reason that is not kerneldev's.
CTRL_C_ON_IMPORT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
class CtrlCOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == "typer":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, CtrlCOnImport())
"""


@pytest.mark.parametrize("json_flag", [False, True])
def test_ctrl_c_while_the_cli_starts_is_exit_130_without_a_traceback(tmp_path, json_flag):
    (tmp_path / "sitecustomize.py").write_text(CTRL_C_ON_IMPORT)
    args = ["diff", "--json"] if json_flag else ["diff"]
    env = {"PYTHONPATH": str(tmp_path), "KERNELDEV_CONFIG": str(tmp_path / "none.yaml")}
    proc = run_kerneldev(*args, env=env, timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, proc.stderr
    assert "Traceback" not in proc.stderr and "interrupted" in proc.stderr
    if json_flag:
        assert json.loads(proc.stdout)["error"]["code"] == ExitCode.INTERRUPTED
    else:
        assert proc.stdout == ""


def test_bench_bad_variants_and_shapes_exit_2_before_connecting(env: Env):
    unreachable(env)  # connecting would exit 3
    run = env.kd("bench", "--variants", "simt,foo")
    assert run.exit_code == 2 and "'foo'" in run.stderr
    shapes = env.kd("bench", "--shapes", "B=0,H=x")
    assert shapes.exit_code == 2, shapes.stderr


def test_push_from_an_empty_workspace_does_not_claim_it_matches(env: Env):
    run = env.kd("push")
    assert run.exit_code == 0, run.stderr
    assert "live already has" not in run.stderr and "kerneldev pull" in run.stderr


def test_restart_says_nothing_before_the_host_answers(env: Env):
    unreachable(env, service={"restart": "true", "health": "true"})
    run = env.kd("restart")
    assert run.exit_code == 3 and "restarting" not in run.stderr


def test_unhealthy_hint_when_logs_print_nothing(tmp_path):
    service = {"restart": "true", "health": "false", "timeout": 3, "logs": "true"}  # 3 s: see above
    env = make_env(tmp_path, "local", service=service)
    run = env.kd("restart")
    assert run.exit_code == 1
    assert "printed nothing" in run.stderr and "configure `service.logs`" not in run.stderr


def test_trust_without_an_answer_suggests_yes(sshd_server, tmp_path):
    host = ssh_host(sshd_server, tmp_path, trusted=False)
    proc = run_cli("trust", config=write_hosts_yaml(tmp_path / "hosts.yaml", host), input="")
    assert proc.returncode == 1 and "kerneldev trust --yes" in proc.stderr
    assert not Path(host.known_hosts).exists()


def test_bench_without_a_gpu_names_kerneldevs_flag(tmp_path):
    config = load_config(make_env(tmp_path, "local").config).host(None)
    output = (
        "dsv4_bench.py: error: no CUDA device visible to torch 2.13.0+cpu "
        "(CUDA_VISIBLE_DEVICES=None); use --cpu-mode for the interpreter\n"
    )
    err = bench._harness_failure(config, bench.harness.EXIT_ENV, output)
    text = f"{err.message}\n{err.hint}"
    assert "--cpu-mode" not in text and "kerneldev bench --cpu" in text
    assert "needs torch and triton" not in text


def test_wide_tables_give_up_their_secondary_columns_at_80():
    columns = [Column("shape"), Column("µs", NUMBER)] + [
        Column(f"extra{i}", NUMBER, drop_order=i) for i in (1, 2, 3)
    ]
    rows = [["decode_b64_h128_topk2048", "20.7", "1" * 20, "2" * 20, "3" * 20]]

    def render(**terminal) -> str:
        out = io.StringIO()
        with environment.use(environment.Environment(stdout=out, **terminal)):
            print_table("t", columns, rows)
        return re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())

    narrow = render(stdout_isatty=True, width=80)
    assert all(len(line) <= 80 for line in narrow.splitlines()), narrow
    assert "20.7" in narrow and "3" * 20 in narrow and "1" * 20 not in narrow
    assert "hidden at 80 columns: extra1" in narrow
    assert "1" * 20 in render(stdout_isatty=True, width=200)
    assert "1" * 20 in render(stdout_isatty=False)  # a pipe keeps every column


def test_a_mirror_that_is_a_file_is_named_so(env: Env):
    a_file = env.root.parent / "notes.txt"
    a_file.write_text("not a clone\n")
    env.set_host(mirror=str(a_file))
    run = env.kd("diff")
    assert run.exit_code == 1, run.stderr  # nothing pulled yet
    assert f"the mirror folder {a_file} is not a folder" in run.stderr


@pytest.mark.parametrize("under", [False, True])
def test_a_workspace_that_is_a_file_is_a_config_error(env: Env, under):
    a_file = env.root.parent / "wsfile"
    a_file.write_text("not a folder\n")
    env.set_host(workspace=str(a_file / "sub" if under else a_file))
    for command in ("pull", "diff", "push", "log"):
        run = env.kd(command)
        assert run.exit_code == 2, (command, run.stderr)
        assert "`workspace:` in hosts.yaml" in run.stderr, run.stderr
        assert (f"lies under a file, {a_file}" if under else "is a file") in run.stderr
        assert "hint: point `workspace:` at a folder" in run.stderr
        assert "state file" not in run.stderr
    error = env.kd("diff", "--json").json()["error"]
    assert error["code"] == 2 and error["type"] == "ConfigError"
    assert a_file.read_text() == "not a folder\n"


def test_ctrl_c_at_the_trust_prompt_is_interrupted_not_unanswered(sshd_server, tmp_path):
    host = ssh_host(sshd_server, tmp_path, trusted=False)
    config = write_hosts_yaml(tmp_path / "hosts.yaml", host)
    proc, typing = start_on_terminal("trust", config=config)  # the prompt waits on it
    try:
        asked = b""
        while b"[y/N]" not in asked:
            byte = proc.stderr.read(1)
            assert byte, asked
            asked += byte
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it to its job
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(typing)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert b"interrupted by Ctrl-C" in err and b"nobody answered" not in err
    assert b"Traceback" not in err and not Path(host.known_hosts).exists()


@pytest.mark.parametrize("name", ["gpu..box", "a" * 64 + ".example"])
def test_a_host_name_dns_cannot_encode_is_unreachable_not_a_traceback(env: Env, name):
    # Not a config error: it might be a Host alias of ~/.ssh/config. getaddrinfo raises
    # UnicodeError (not gaierror) for an empty label or one over 63 characters.
    unreachable(env, hostname=name)
    run = env.kd("diff")
    assert run.exit_code == ExitCode.UNREACHABLE, run.stderr
    assert f"cannot resolve host name '{name}'" in run.stderr
    assert "not a valid DNS name" in run.stderr
    doctor = env.kd("doctor", "--json")
    assert doctor.exit_code == ExitCode.FAILURE, doctor.stderr
    (dns,) = [c for c in doctor.json()["hosts"][0]["checks"] if c["name"] == "dns"]
    assert dns["verdict"] == "FAIL" and "not a valid DNS name" in dns["detail"]


def test_a_background_thread_dying_on_a_cut_connection_prints_no_traceback():
    """paramiko's SFTP read-ahead thread dies with OSError when the connection is cut or
    closed under it (seen in the cut-connection test): the CLI's thread hook drops that, and
    any other background error is one line, not a traceback."""
    code = (
        "import threading\n"
        "from kerneldev.cli.entry import quiet_background_errors\n"
        "threading.excepthook = quiet_background_errors\n"
        "def cut(): raise OSError('Socket is closed')\n"
        "def bug(): raise ValueError('boom')\n"
        "for target, name in ((cut, 'Thread-7 (_prefetch_thread)'), (bug, 'Thread-8 (x)')):\n"
        "    t = threading.Thread(target=target, name=name); t.start(); t.join()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    assert "Traceback" not in res.stderr
    assert "Socket is closed" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        "kerneldev: error in background thread Thread-8 (x): ValueError('boom')"
    ]


def test_a_command_ends_as_the_interpreter_would_without_its_teardown():
    """The console script ends a command with `exit_without_teardown`: non-daemon threads
    are waited for, atexit functions run, buffered output is written, in CPython's order, and
    the exit status is the command's."""
    code = (
        "import atexit, sys, threading, time\n"
        "from kerneldev.cli.entry import exit_without_teardown\n"
        "atexit.register(lambda: print('atexit', flush=True))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread'))).start()\n"
        "sys.stdout.write('buffered ')\n"
        "sys.stderr.write('err')\n"
        "exit_without_teardown(3)\n"
    )
    assert _python(code) == (3, "buffered thread\natexit\n", "err")


def test_output_that_cannot_be_written_at_the_end_fails_as_before():
    """A reader gone before the last output was flushed (`| head`): the same report and exit
    status (120) as the interpreter's own exit gives."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered
    ends = (
        "sys.exit(0)",
        "from kerneldev.cli.entry import exit_without_teardown\nexit_without_teardown(0)",
    )
    results = []
    for end in ends:
        read, write = os.pipe()
        os.close(read)
        code = f"import sys\nsys.stdout.write('x' * 100)\n{end}\n"
        try:
            res = subprocess.run(
                [sys.executable, "-c", code],
                stdout=write,
                stderr=subprocess.PIPE,
                env=env,
                timeout=60,
            )
        finally:
            os.close(write)
        results.append((res.returncode, res.stderr))
    assert results[0] == results[1]
    assert results[0][0] == 120 and b"BrokenPipeError" in results[0][1]


def test_prefetch_rich_imports_it_in_the_background_and_prints_nothing():
    code = (
        "import sys, threading\n"
        "from kerneldev.cli.output import prefetch_rich\n"
        "assert 'rich.text' not in sys.modules\n"
        "prefetch_rich()\n"
        "for t in threading.enumerate():\n"
        "    if t.name == 'prefetch-rich':\n"
        "        t.join(60)\n"
        "print('rich.console' in sys.modules and 'rich.text' in sys.modules)\n"
        "prefetch_rich()\n"
        "print([t.name for t in threading.enumerate() if t.name == 'prefetch-rich'])\n"
    )
    assert _python(code) == (0, "True\n[]\n", "")


def _python(code: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `code` in a fresh interpreter."""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return res.returncode, res.stdout, res.stderr
