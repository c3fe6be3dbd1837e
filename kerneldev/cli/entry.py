"""The `kerneldev` console script (and `python -m kerneldev`): imports nothing heavy itself.

Importing the CLI (typer, click, the command modules) takes a noticeable part of a second,
before `main()` turns Ctrl-C into a clean exit; a Ctrl-C in that window used to end in a
KeyboardInterrupt traceback. Here it ends as any other Ctrl-C does: one line, exit 130.
"""

from __future__ import annotations

import json
import os
import sys

# Not `from typing import TYPE_CHECKING`: `typing` is ~2-5 ms of every kept command's client,
# which imports nothing else of it (type checkers take this name as typing's).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from typing import NoReturn

INTERRUPTED = 130  # errors.ExitCode.INTERRUPTED, without importing anything


def quiet_background_errors(args: threading.ExceptHookArgs) -> None:
    """`threading.excepthook` of the CLI. paramiko reads ahead of an SFTP download in its own
    thread (`SFTPFile._prefetch_thread`); when the connection is cut or closed under it (a
    dropped link, Ctrl-C mid-pull) that thread dies with OSError / EOFError, which Python
    would print as a traceback after kerneldev's own one-line report of the same failure.
    Those are dropped (the SSH transport's `_prefetch` now ends that thread quietly itself;
    this stays as the net); any other background error is one line, never a traceback."""
    name = args.thread.name if args.thread is not None else ""
    if "_prefetch_thread" in name and issubclass(args.exc_type, (OSError, EOFError)):
        return
    if issubclass(args.exc_type, SystemExit):
        return
    sys.stderr.write(f"kerneldev: error in background thread {name}: {args.exc_value!r}\n")


def exit_without_teardown(status: int) -> NoReturn:
    """Exit with `status` as the interpreter would, without tearing it down.

    After a command, Python waits for non-daemon threads, runs the atexit functions, flushes
    stdout and stderr, and then frees every module and object one by one: with paramiko,
    cryptography, typer and rich loaded, that last part was ~0.1 s of every one-shot SSH
    command on the measured machine (strace: last packet to exit, docs/benchmarks.md, issue 23)
    and does nothing a user sees. The first three are done here, in CPython's order, as the
    warm process's children (cli/warm.py) have always ended; then `os._exit`. A stream that
    cannot be flushed (a closed pipe) goes the interpreter's usual way instead, so its
    message and exit status are unchanged."""
    import atexit
    import threading

    if not isinstance(status, int):
        sys.exit(status)
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize calls first
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - the interpreter's own exit reports it, as before
        sys.exit(status)
    os._exit(status)


def run() -> None:
    """Console-script entry."""
    from kerneldev.cli import warm_client

    argv = sys.argv[1:]
    try:
        if warm_client.wanted(argv):
            handed = warm_client.run(argv)  # None: not handed over, nothing ran
            if handed is not None:
                # This process only waited: no interpreter tear-down to wait for as well.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(handed)
        # A one-shot command's ssh logs in while the CLI below is imported.
        from kerneldev.cli import early_dial

        early_dial.start(argv)
        # Here, not at the top: a command handed to the warm process starts no thread, and
        # the hand-over's client skips threading's import.
        import threading

        threading.excepthook = quiet_background_errors
        from kerneldev.cli.main import main

        status = main()
        warm_client.start_after(argv)
        if not warm_client.IN_WARM:  # the warm process's child ends itself the same way
            exit_without_teardown(status)
    except KeyboardInterrupt:
        args = sys.argv[1:]
        if "--json" in (args[: args.index("--")] if "--" in args else args):
            error = {"code": INTERRUPTED, "type": "Interrupted", "message": "interrupted by Ctrl-C"}
            print(json.dumps({"error": {**error, "hint": None}}, indent=2), flush=True)
        sys.stderr.write("kerneldev: error: interrupted by Ctrl-C\n")
        sys.exit(INTERRUPTED)
    sys.exit(status)
