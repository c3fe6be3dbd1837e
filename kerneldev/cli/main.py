"""Entry point: `main(argv, env) -> ExitCode` builds the typer app from one module per command
group, runs it inside an `Environment` and turns every expected error into a one-line message
(and, with `--json`, a JSON error object on stdout) and a named exit code, in one place."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer
import typer.core as _typer_core

from kerneldev import __version__
from kerneldev.cli import coercion
from kerneldev.errors import ExitCode, KerneldevError

if TYPE_CHECKING:
    from kerneldev.cli.environment import Environment

app = typer.Typer(
    name="kerneldev",
    help="Pull, diff, push, restart and benchmark the live kernels of a remote inference server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click help: no `<bool>` type tags, and `--help` loads no rich tables.
    rich_markup_mode=None,
)

# typer 0.29 appends a Python type tag to every argument's help line (`PATHS <list[str]>`);
# the metavar and the help text already say what to pass (options get their metavar instead).
_typer_core.TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]

# typer coerces every value through a pydantic adapter it builds at parse time (~0.2-0.3 CPU-s
# of each command); the plain values skip it, with typer's own results (cli/coercion.py).
coercion.install()

# Options of the whole program that may also follow the subcommand (`kerneldev diff --config
# x.yaml`): main() moves them in front of it before typer parses.
GLOBAL_VALUE_OPTIONS = ("--config",)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kerneldev {__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    ctx: typer.Context,
    config: str = typer.Option(
        None,
        "--config",
        envvar="KERNELDEV_CONFIG",
        metavar="PATH",
        help="Path of hosts.yaml (default: hosts.yaml in this folder or the nearest one above "
        "it, or the config of the workspace you are in). May follow the subcommand.",
        show_envvar=True,
    ),
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print kerneldev's version and exit.",
    ),
) -> None:
    # A path from $KERNELDEV_CONFIG is left to load_config, so messages name the variable.
    source = ctx.get_parameter_source("config")
    if source is not None and source.name == "ENVIRONMENT":
        config = None
    ctx.obj = {"config_path": config}


_registered: set[str] = set()

# The click command typer builds from the signatures on every call of `app`: the warm process
# (cli/warm.py) builds it once, with its options' coercion, and each forked command reuses it.
prepared_command = None

# The sync loop's commands are timed against rsync: they import only their own module (about
# 0.1 s less start-up than importing every command's).
_LOOP_COMMANDS = ("pull", "diff", "push", "rollback", "log")

# Which module of kerneldev/cli/commands registers each top-level command: a command run (or
# its --help) imports only its own module. `--help`, no command and a mistyped name register
# them all, in the order `kerneldev --help` lists them (tests/test_cli_start.py checks this
# table against what the modules register).
COMMAND_MODULES = {
    **dict.fromkeys(_LOOP_COMMANDS, "loop"),
    "restart": "service",
    "trust": "trust",
    "bench": "bench",
    "demo": "demo",
    "profile": "profile",
    "watch": "watch",
    "status": "status",
    "doctor": "status",
    "kernels": "kernels",
    "sandbox": "sandbox",
    "session": "session",
}


def _register_commands(args: Sequence[str] | None = None) -> None:
    # Each module adds its own commands; importing them all keeps `kerneldev --help` complete.
    # The modules import their heavy dependencies (paramiko, rich tables) inside the commands.
    own = COMMAND_MODULES.get(_command_name(args or ()) or "")
    for name in (own,) if own is not None else MODULE_ORDER:
        module = f"kerneldev.cli.commands.{name}"
        # The import statement's path (not importlib.import_module): `-X importtime` lists it.
        __import__(module)
        _register_module(sys.modules[module])


# The modules in the order `kerneldev --help` lists their commands.
MODULE_ORDER = (
    "loop",
    "service",
    "trust",
    "bench",
    "demo",
    "kernels",
    "sandbox",
    "profile",
    "watch",
    "status",
    "session",
)
_rank: dict[int, int] = {}  # id of a registered command or group -> its module's place


def _register_module(module) -> None:
    if module.__name__ in _registered:
        return
    before = {id(item) for item in (*app.registered_commands, *app.registered_groups)}
    module.register(app)
    _registered.add(module.__name__)
    place = MODULE_ORDER.index(module.__name__.rsplit(".", 1)[1])
    for item in (*app.registered_commands, *app.registered_groups):
        _rank.setdefault(id(item), place if id(item) not in before else -1)
    # A process that ran one command and then lists them all (in-process callers) lists them
    # in the same order as a fresh `kerneldev --help`.
    app.registered_commands.sort(key=lambda item: _rank[id(item)])
    app.registered_groups.sort(key=lambda item: _rank[id(item)])


def _command_name(args: Sequence[str]) -> str | None:
    """The subcommand of hoisted `args` (global options first), None when there is none."""
    i = 0
    while i < len(args):
        if args[i] in GLOBAL_VALUE_OPTIONS:
            i += 2
        elif args[i].split("=", 1)[0] in GLOBAL_VALUE_OPTIONS:
            i += 1
        else:
            return None if args[i].startswith("-") else args[i]
    return None


def hoist_global_options(argv: Sequence[str]) -> list[str]:
    """Let the program-wide options stand anywhere: `--config PATH` given after the subcommand
    moves in front of it, and `--host NAME` given before the subcommand moves after it (every
    command that talks to a host takes --host). Nothing moves past a `--`."""
    args = list(argv)
    end = args.index("--") if "--" in args else len(args)
    args, tail = args[:end], args[end:]
    config: list[str] = []
    host: list[str] = []
    rest: list[str] = []
    seen_command = False
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        takes_value = "=" not in arg and i + 1 < len(args)
        if name in GLOBAL_VALUE_OPTIONS:
            if not takes_value and "=" not in arg:
                return [arg]  # its value is missing: say so, instead of eating the command
            config += args[i : i + 2] if takes_value else [arg]
            i += 2 if takes_value else 1
            continue
        if name == "--host" and not seen_command:
            host += args[i : i + 2] if takes_value else [arg]
            i += 2 if takes_value else 1
            continue
        if not arg.startswith("-"):
            seen_command = True
        rest.append(arg)
        i += 1
    return config + rest + host + tail


def _wants_json(argv: Sequence[str]) -> bool:
    args = list(argv)
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def main(argv: Sequence[str] | None = None, env: Environment | None = None) -> ExitCode | int:
    """Run kerneldev with `argv` (default: sys.argv[1:]) in `env` (default: this process's
    streams) and return the exit status; never calls sys.exit."""
    from kerneldev import interrupt
    from kerneldev.cli import environment
    from kerneldev.cli.output import error_json, print_error, print_json

    env = env if env is not None else environment.Environment()
    raw = sys.argv[1:] if argv is None else argv
    args = hoist_global_options(raw)
    wants_json = _wants_json(raw)
    _register_commands(args)

    def fail(code: ExitCode, kind: str, message: str, hint=None, report=None) -> ExitCode:
        if wants_json:
            print_json(error_json(code, kind, message, hint, report))
        print_error(message, hint)
        return code

    with environment.use(env), _redirect(env):
        try:
            # Ctrl-C and SIGTERM become `Interrupted` (exit 130/143) at a safe point of the
            # command, which then saves its records and prints its summary (interrupt.py).
            with interrupt.deferred_signals():
                run_app = app if prepared_command is None else prepared_command
                status = run_app(args=args, prog_name="kerneldev", standalone_mode=False)
        except KerneldevError as err:
            return fail(err.exit_code, type(err).__name__, err.message, err.hint, err.report)
        except typer.TyperException as err:  # usage errors, as typer reports them
            code = getattr(err, "exit_code", ExitCode.USAGE)
            if wants_json:
                print_json(error_json(code, "UsageError", err.format_message()))
            show = getattr(err, "show", None)
            if show is not None:
                from kerneldev.cli.output import PrintableWriter

                show(file=PrintableWriter(env.stderr))
            else:
                print_error(err.format_message())
            return _status(code)
        except typer.Abort:  # a prompt got Ctrl-C
            return fail(ExitCode.INTERRUPTED, "Interrupted", "aborted")
        except KeyboardInterrupt:
            return fail(ExitCode.INTERRUPTED, "Interrupted", "interrupted")
    if status in (None, 0):
        return ExitCode.OK
    if status == ExitCode.INTERRUPTED:  # typer turns Ctrl-C into a plain exit 130
        with environment.use(env):
            print_error("interrupted")
    return _status(status)


def _status(code: int) -> ExitCode | int:
    try:
        return ExitCode(code)
    except ValueError:
        return code  # a code a command chose itself


@contextlib.contextmanager
def _redirect(env: Environment):
    """click and typer write help and prompts to sys.stdout/sys.stderr and read answers from
    sys.stdin: point those at the environment's streams while a command runs."""
    stdin = sys.stdin
    sys.stdin = env.stdin
    try:
        with contextlib.redirect_stdout(env.stdout), contextlib.redirect_stderr(env.stderr):
            yield
    finally:
        sys.stdin = stdin


def run() -> None:
    """The console script's entry before it moved to kerneldev/cli/entry.py (kept for
    installs whose generated `kerneldev` script still imports it)."""
    from kerneldev.cli.entry import run as entry_run

    entry_run()
