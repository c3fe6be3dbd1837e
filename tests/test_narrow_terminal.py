"""A new user's 80-column terminal: every line kerneldev prints fits it.

The commands a user meets first run on a forced 80-column terminal (stdout and stderr), over
the real sshd with kept sessions on, two hosts in a group, a refused push, a refused pull and
error messages; then `--help` of every command. Tables fold their paths and words, messages
and hints wrap at spaces. (A single word longer than the line, a path the user chose, is left
whole: no such word occurs here.)"""

from __future__ import annotations

import io
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import typer
import yaml

from kerneldev.cli.environment import Environment
from kerneldev.cli.main import _register_commands, app, main
from tests.test_session import A, B, kept, make_env  # noqa: F401 - kept: a fixture

WIDTH = 80
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def terminal_run(config, *args: str) -> tuple[int, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    env = Environment(
        stdout=out,
        stderr=err,
        stdin=io.StringIO(),
        stdout_isatty=True,
        stderr_isatty=True,
        width=WIDTH,
    )
    argv = ["--config", str(config), *args] if config is not None else list(args)
    code = main(argv, env=env)
    text = ANSI.sub("", out.getvalue() + err.getvalue()).replace("\r", "\n")
    return int(code), text.splitlines()


def too_long(lines: list[str]) -> list[str]:
    return [line for line in lines if len(line) > WIDTH]


@pytest.fixture
def short_tmp():
    """A short folder for the test's files: pytest's own (under a worker's `popen-gwN/`) made the
    config's path, which an error names on a line of its own, 83 characters long."""
    folder = Path(tempfile.mkdtemp(prefix="kd80-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_first_commands_fit_80_columns(kept, short_tmp, sshd_server, monkeypatch):  # noqa: F811
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    env = make_env(short_tmp, sshd_server)
    data = yaml.safe_load(env.config.read_text())
    second = dict(data["hosts"]["h"], workspace="ws2")
    data["hosts"]["h-second-with-a-longer-name"] = second
    data["groups"] = {"pair": ["h", "h-second-with-a-longer-name"]}
    data["default"] = "h"
    env.config.write_text(yaml.safe_dump(data))
    kept.append(env)

    steps: list[tuple[tuple[str, ...], int | None]] = []

    def run(*args: str, code: int | None = 0) -> None:
        got, lines = terminal_run(env.config, *args)
        if code is not None:
            assert got == code, (args, lines)
        steps.append((args, got))
        long = too_long(lines)
        assert not long, f"kerneldev {' '.join(args)}: lines over {WIDTH} columns: {long}"

    run("status")
    run("doctor", code=None)  # no GPU, no service here: some checks fail, the lines must fit
    run("pull")
    run("diff")
    (env.workspace / A).write_bytes(b"BLOCK = 128\n")
    run("diff", code=1)
    run("push", "--dry-run")
    run("push", "--no-import-check")
    run("log")
    (env.root / B).write_bytes(b"SPLITS = 16\n")  # someone edits the host
    (env.workspace / B).write_bytes(b"SPLITS = 4\n")
    run("push", "--no-import-check", code=1)  # refused: the error and its hint wrap
    run("pull", code=1)  # refused: unpushed edits
    run("rollback", "--dry-run")
    run("rollback")
    run("diff", "--host", "nosuch", code=2)
    run("session", "list")
    run("session", "status")
    run("status", "--host", "pair")
    run("diff", "--host", "pair", code=None)
    run("push", "--host", "pair", "--dry-run", code=None)
    run("session", "list", "--host", "pair")
    run("session", "status", "--host", "pair")
    run("session", "stop", "--all")


def _command_paths(command, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for name, sub in getattr(command, "commands", {}).items():  # a group's commands
        if not getattr(sub, "hidden", False):
            paths += _command_paths(sub, (*prefix, name))
    return paths


def test_every_help_fits_80_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    _register_commands()  # as `kerneldev --help` does: every command, not only the loop's
    paths = _command_paths(typer.main.get_command(app))
    assert ("session", "status") in paths and ("sandbox", "up") in paths
    long = {}
    for path in paths:
        code, lines = terminal_run(None, *path, "--help")
        assert code == 0 and lines, (path, lines)
        if too_long(lines):
            long[" ".join(path)] = too_long(lines)
        # A group's list of commands: each summary whole (the parser cuts a long one at the
        # width and ends it with "...", mid-clause).
        listing = lines[lines.index("Commands:") + 1 :] if "Commands:" in lines else []
        cut = [line for line in listing if line.rstrip().endswith("...")]
        if cut:
            long[" ".join(path) + " (cut summaries)"] = cut
    assert not long, long


def test_profile_at_80_columns_hides_an_ab_pair_together():
    """`profile`'s A/B columns come in pairs (`simt ms`, `mma ms`): at 80 columns it hid
    `simt ms` and kept `mma ms`, so the columns no longer paired. Columns of one drop order go
    together."""
    from kerneldev.bench.profile import ProfileResult, VariantProfile
    from kerneldev.cli import environment
    from kerneldev.cli.commands import profile as profile_cmd

    def summary(scale: float) -> dict:
        top = [
            {"name": name, "family": family, "calls": 128, "total_ms": 1234.56 * scale * k,
             "share": 0.4 / k, "mean_us": 9645.0 * scale * k}
            for k, (name, family) in enumerate(
                [("flash_mla_sparse_decode_mma_kernel", "attention"), ("nvjet_tst_gemm", "gemm")], 1
            )
        ]  # fmt: skip
        families = [{"family": "attention", "share": 0.4, "total_ms": 1234.56 * scale}]
        return {"top": top, "families": families, "total_ms": 3086.4 * scale}

    result = ProfileResult(
        "kerneldev.service-profile/1", "2026-12-01T00:00:00Z", "h", "http://x", 8, 32, 15, "gpu"
    )
    for name, scale in (("simt", 1.0), ("mma", 0.5)):
        result.variants.append(VariantProfile(name, summary(scale), "/t", 1, None, 0.4))
    out = io.StringIO()
    env = Environment(stdout=out, stdout_isatty=True, width=WIDTH)
    with environment.use(env):
        profile_cmd.render(result)
    text = ANSI.sub("", out.getvalue())
    assert not too_long(text.splitlines()), text
    header = next(line for line in text.splitlines() if line.lstrip().startswith("kernel"))
    hidden = re.search(r"hidden at 80 columns: (.*);", text)
    assert hidden, text  # the table is too wide for 80 columns: some pair goes
    for column in ("calls", "ms", "%", "µs"):
        shown = [f"{v} {column}" in header for v in ("simt", "mma")]
        assert shown[0] == shown[1], (column, header, hidden.group(1))
        gone = [f"{v} {column}" in hidden.group(1).split(", ") for v in ("simt", "mma")]
        assert gone[0] == gone[1] == (not shown[0]), (column, header, hidden.group(1))


def test_the_group_progress_view_keeps_host_state_and_time_whole_at_80_columns():
    """A group command's live view on a terminal: a long last message is cut, never the host's
    name, its state or its time (rich squeezed them to nothing at 80 columns)."""
    import io
    import time

    from rich.console import Console

    from kerneldev.cli.commands.group import HostsView
    from kerneldev.hosts.fleet import OutcomeStatus

    view = HostsView.__new__(HostsView)
    view.names = ["unreachable-node", "node1"]
    view.state = {"unreachable-node": OutcomeStatus.UNREACHABLE, "node1": "running"}
    long = "connection refused by 127.0.0.1:35591 (host 'unreachable-node'): no SSH server there"
    view.text = {"unreachable-node": long, "node1": "hashing files"}
    view.started = {name: time.monotonic() - 12 for name in view.names}
    view.ended = {}
    console = Console(width=WIDTH, file=io.StringIO(), force_terminal=False)
    console.print(view)
    lines = console.file.getvalue().splitlines()
    assert all(len(line) <= WIDTH for line in lines), lines
    assert lines[0].split() == ["host", "state", "time", "last"]
    assert lines[2].split()[:3] == ["unreachable-node", "unreachable", "12s"], lines
    assert lines[2].rstrip().endswith("…") and lines[3].split()[:3] == ["node1", "running", "12s"]
