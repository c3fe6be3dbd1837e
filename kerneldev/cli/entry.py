"""The `kerneldev` console script (and `python -m kerneldev`): imports nothing heavy itself.

Importing the CLI (typer, click, the command modules) takes a noticeable part of a second,
before `main()` turns Ctrl-C into a clean exit; a Ctrl-C in that window used to end in a
KeyboardInterrupt traceback. Here it ends as any other Ctrl-C does: one line, exit 130.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading

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
        # Here, not at the top: a command handed to the warm process starts no thread, and
        # the hand-over's client skips threading's import.
        import threading

        threading.excepthook = quiet_background_errors
        from kerneldev.cli.main import main

        status = main()
        warm_client.start_after(argv)
    except KeyboardInterrupt:
        args = sys.argv[1:]
        if "--json" in (args[: args.index("--")] if "--" in args else args):
            error = {"code": INTERRUPTED, "type": "Interrupted", "message": "interrupted by Ctrl-C"}
            print(json.dumps({"error": {**error, "hint": None}}, indent=2), flush=True)
        sys.stderr.write("kerneldev: error: interrupted by Ctrl-C\n")
        sys.exit(INTERRUPTED)
    sys.exit(status)
