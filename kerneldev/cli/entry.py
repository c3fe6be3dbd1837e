"""The `kerneldev` console script (and `python -m kerneldev`): imports nothing heavy itself.

Importing the CLI (typer, click, the command modules) takes a noticeable part of a second,
before `main()` turns Ctrl-C into a clean exit; a Ctrl-C in that window used to end in a
KeyboardInterrupt traceback. Here it ends as any other Ctrl-C does: one line, exit 130.
"""

from __future__ import annotations

import json
import sys

INTERRUPTED = 130  # errors.ExitCode.INTERRUPTED, without importing anything


def run() -> None:
    """Console-script entry."""
    try:
        from kerneldev.cli.main import main

        status = main()
    except KeyboardInterrupt:
        args = sys.argv[1:]
        if "--json" in (args[: args.index("--")] if "--" in args else args):
            error = {"code": INTERRUPTED, "type": "Interrupted", "message": "interrupted by Ctrl-C"}
            print(json.dumps({"error": {**error, "hint": None}}, indent=2), flush=True)
        sys.stderr.write("kerneldev: error: interrupted by Ctrl-C\n")
        sys.exit(INTERRUPTED)
    sys.exit(status)
