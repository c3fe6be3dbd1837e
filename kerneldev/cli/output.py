"""Where output goes: data to stdout, messages and progress to stderr; colour and spinners only
on a terminal. `--json` prints the same result object a table is drawn from."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape

# stderr carries messages and progress; stdout carries data (tables, JSON, patches).
err_console = Console(stderr=True, highlight=False)
out_console = Console(highlight=False)


# Messages are plain text: escape() so a file name like `[x].py` or `[/tmp]` is printed as it
# is instead of being read as rich markup (which drops it or raises MarkupError).
def print_error(message: str, hint: str | None = None) -> None:
    err_console.print(
        f"[bold red]kerneldev: error:[/] {escape(message)}", markup=True, soft_wrap=True
    )
    if hint:
        err_console.print(f"[dim]hint:[/] {escape(hint)}", soft_wrap=True)


def print_warning(message: str) -> None:
    err_console.print(f"[yellow]kerneldev: warning:[/] {escape(message)}", soft_wrap=True)


def print_info(message: str) -> None:
    err_console.print(message, soft_wrap=True, markup=False)


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: to_jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "__fspath__"):
        return str(obj)
    return obj


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()
