"""What a CLI process imports to start: each command only its own module, no pydantic for the
plain option values (cli/coercion.py gives typer's own answers), no other command's core."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import typer
import typer.main
from typer._click import Context

from kerneldev.cli import coercion
from kerneldev.cli import main as cli_main
from tests.clirun import REPO

# Cores that a command of the sync loop, `status` or `--help` must not import (each is
# another command's, or typer's pydantic coercion of values it can give without pydantic).
HEAVY = (
    "pydantic",
    "paramiko",
    "torch",
    "asyncio",
    "kerneldev.bench.kernel_bench",
    "kerneldev.bundled.install",
    "kerneldev.sandbox.host",
    "kerneldev.hostside.kernelprobe",
)


def imported(*args: str, cwd=REPO) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "kerneldev", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "KERNELDEV_NO_KEEP": "1"},
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert lines, proc.stderr
    return {line.rsplit("|", 1)[-1].strip() for line in lines}


@pytest.fixture
def local_config(tmp_path):
    live = tmp_path / "live" / "python"
    live.mkdir(parents=True)
    (live / "a.py").write_text("x = 1\n")
    config = tmp_path / "hosts.yaml"
    config.write_text(
        f"hosts:\n  h:\n    transport: local\n    root: '{tmp_path / 'live'}'\n"
        f"    files: [python/a.py]\n    workspace: '{tmp_path / 'ws'}'\n"
    )
    return config


@pytest.mark.parametrize(
    "args",
    [
        ("pull",),
        ("diff", "--json"),
        ("push", "--parallel", "3", "--lock-wait", "2.5"),
        ("status", "--timeout", "5"),
        ("restart",),
    ],
)
def test_a_hot_command_imports_no_other_commands_core_and_no_pydantic(local_config, args):
    modules = imported("--config", str(local_config), *args)
    assert "kerneldev.config" in modules  # it did run
    assert not [m for m in HEAVY if m in modules]
    ours = {m.rsplit(".", 1)[-1] for m in modules if m.startswith("kerneldev.cli.commands.")}
    assert ours == {cli_main.COMMAND_MODULES[args[0]]}


def test_help_imports_no_command_core():
    # (The config and yaml it does import: the sync loop's module, which it lists, uses them.)
    modules = imported("--help")
    assert not [
        m
        for m in (*HEAVY, "kerneldev.bench.profile", "kerneldev.bench.service_bench")
        if m in modules
    ]
    assert all(f"kerneldev.cli.commands.{name}" in modules for name in cli_main.MODULE_ORDER)


def test_the_command_table_names_each_commands_own_module():
    import importlib

    for name in cli_main.MODULE_ORDER:
        app = typer.Typer()
        importlib.import_module(f"kerneldev.cli.commands.{name}").register(app)
        command = typer.main.get_command(app)
        names = set(getattr(command, "commands", {}) or {command.name})
        assert names == {c for c, m in cli_main.COMMAND_MODULES.items() if m == name}, name


def test_one_command_then_all_lists_them_in_the_fresh_order():
    before = [c.name for c in cli_main.app.registered_commands]
    cli_main._register_commands(["status"])
    cli_main._register_commands([])
    order = [c.name or c.callback.__name__ for c in cli_main.app.registered_commands]
    groups = [g.name or g.typer_instance.info.name for g in cli_main.app.registered_groups]
    assert order[:5] == ["pull", "diff", "push", "rollback", "log"], (before, order)
    assert order.index("restart") < order.index("bench") < order.index("status")
    assert groups == ["kernels", "sandbox", "session"]


def test_the_heads_limits_have_one_home():
    from kerneldev import bundled
    from kerneldev.bundled import install
    from kerneldev.cli.commands import kernels

    limits = (bundled.DEFAULT_HEADS, bundled.MAX_HEADS)
    assert (kernels.DEFAULT_HEADS, kernels.MAX_HEADS) == limits
    assert (install.DEFAULT_HEADS, install.MAX_HEADS) == limits


# Values a command line, an environment variable or a default gives typer, for each kind of
# plain parameter; the coercion must answer exactly as typer's own adapter, or leave it to it.
VALUES = [
    None,
    "",
    "abc",
    "0",
    "3",
    "007",
    "-1",
    " 3",
    "3 ",
    "+2",
    "3_0",
    "1e3",
    "2.5",
    "2.",
    ".5",
    "5000",
    "nan",
    "inf",
    0,
    3,
    5000,
    -1,
    2.5,
    0.0,
    float("nan"),
    True,
    (),
    ("a", "b"),
    ["a"],
    ("a", 1),
]


PATHS = typer.Argument(None)
TEXT = typer.Option(None, "--text")
COUNT = typer.Option(8, "--count", min=1)
HEADS = typer.Option(64, "--heads", min=1, max=1024)
WAIT = typer.Option(0.0, "--wait", min=0)
TIMEOUT = typer.Option(10.0, "--timeout", min=0.1, max=3600.0)
PLAIN = typer.Option(2, "--plain")
FLAG = typer.Option(False, "--flag")
WHERE = typer.Option(None, "--where")  # a Path: only None is answered without typer's adapter


def _params():
    """A command with a parameter of each plain kind the CLI's commands use."""
    app = typer.Typer()

    @app.command()
    def command(
        paths: list[str] = PATHS,
        text: str = TEXT,
        count: int = COUNT,
        heads: int = HEADS,
        wait: float = WAIT,
        timeout: float = TIMEOUT,
        plain: int = PLAIN,
        flag: bool = FLAG,
        where: Path = WHERE,
    ) -> None:
        pass

    command_ = typer.main.get_command(app)
    return command_, command_.params


def _typers_own(param, value, ctx):
    build = type(param).get_runtime_param.typer_build  # typer's, building the pydantic adapter
    return build(param).coerce(value, param=param, ctx=ctx)


def _outcome(fn):
    try:
        value = fn()
    except Exception as err:  # typer's BadParameter (pydantic's message inside)
        return ("error", type(err).__name__, str(err))
    return ("value", type(value), repr(value))


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_plain_coercion_answers_as_typers_adapter(value):
    assert coercion.install()
    command, params = _params()
    ctx = Context(command)
    for param in params:
        multi = bool(param.multiple or param.nargs == -1)
        known, result = coercion._plain_value(param.type_descriptor, multi, value)
        if not known:
            continue
        real = _outcome(partial(_typers_own, param, value, ctx))
        assert real == ("value", type(result), repr(result)), (param.name, value)
