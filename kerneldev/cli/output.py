"""Where output goes: data to stdout, messages and progress to stderr; colour, tables and
spinners only on a terminal. `--json` prints the same result object a table is drawn from.

Everything prints through the running command's `Environment` (`environment.current()`), so
tests can pass their own streams and a forced terminal. `out_console` / `err_console` are thin
proxies to that environment's consoles, kept for the modules that print directly.

The one table renderer is `print_table`: every cell is data (escaped, never rich markup); on a
terminal it fits the width (status words whole, hashes shortened, paths wrapped at `/`), in a
pipe it prints plain aligned columns, one row per line, for `grep` and `awk`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kerneldev.cli import environment
from kerneldev.printable import printable, printable_text

if TYPE_CHECKING:
    from rich.console import Console


class _ConsoleProxy:
    """Looks like a rich Console; forwards to the current environment's stdout or stderr one."""

    def __init__(self, which: str) -> None:
        self._which = which

    def _target(self) -> Console:
        env = environment.current()
        return env.err_console if self._which == "err" else env.out_console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)


out_console: Any = _ConsoleProxy("out")
err_console: Any = _ConsoleProxy("err")


# Messages are plain text: never read as rich markup (a file name like `[x].py` or `[/tmp]` is
# printed as it is instead of being dropped or raising MarkupError), and with control
# characters (a typed `$'\x1b[31m'`) written as escapes instead of reaching the terminal.
# On a terminal they are wrapped at spaces to its width (the continuation indented, a path or
# word longer than a line left whole); in a pipe each stays one line, for grep.
def _say(lead: str, style: str | None, message: str) -> None:
    from rich.text import Text

    env = environment.current()
    console = env.err_console
    text = lead + printable_text(message)
    if env.stderr_isatty:
        text = fit_lines(text, console.width)
    rendered = Text(text)
    if style and lead:
        rendered.stylize(style, 0, len(lead))
    console.print(rendered, soft_wrap=True, highlight=False)


def prefetch_rich() -> None:
    """Import what the messages and consoles print with (rich's console and text, ~50 ms) in a
    background thread, for a command that will print while the host is still starting its
    agent: imported then, it is not paid after the host's answer. Nothing is printed."""
    if "rich.text" in sys.modules:
        return

    def load() -> None:
        with contextlib.suppress(Exception):  # the printing path imports it again, and says why
            import rich.console
            import rich.text  # noqa: F401

    threading.Thread(target=load, name="prefetch-rich", daemon=True).start()


def fit_lines(text: str, width: int) -> str:
    """`text` with each line longer than `width` broken at spaces, the continuation lines
    indented two more than the line's own indent; a longer word is never cut."""
    import textwrap

    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip(" "))]
        out.extend(
            textwrap.wrap(
                line,
                width,
                initial_indent="",
                subsequent_indent=indent + "  ",
                break_long_words=False,
                break_on_hyphens=False,
                replace_whitespace=False,
                drop_whitespace=True,
            )
            or [line]
        )
    return "\n".join(out)


def wrap_block(text: str, width: int) -> str:
    """`text` (a service's log) for a terminal `width` wide: each longer line broken at spaces
    as `fit_lines` does, and a word still longer than the line (a path) as `wrap_path` breaks
    it, after a `/`; lines that fit are left as they are."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        for piece in fit_lines(line, width).split("\n"):
            out.append(piece if len(piece) <= width else wrap_path(piece, width))
    return "\n".join(out)


def print_error(message: str, hint: str | None = None) -> None:
    _say("kerneldev: error: ", "bold red", message)
    if hint:
        _say("hint: ", "dim", hint)


def print_warning(message: str) -> None:
    _say("kerneldev: warning: ", "yellow", message)


class PrintableWriter:
    """A text stream that writes through `printable_text`: for the usage errors click prints
    itself (they quote the typed option or value)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(printable_text(text))

    def flush(self) -> None:
        self._stream.flush()


def print_info(message: str) -> None:
    """A message for the reader on stderr (wrapped on a terminal, one line in a pipe)."""
    _say("", None, message)


def print_line(message: str) -> None:
    """One line of data on stdout (plain in a pipe, never read as markup; on a terminal wrapped
    at spaces to its width, as messages are)."""
    env = environment.current()
    if env.stdout_isatty:
        text = fit_lines(message, env.out_console.width)
        env.out_console.print(text, soft_wrap=True, markup=False)
    else:
        env.stdout.write(message + "\n")
        env.stdout.flush()


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
    out = environment.current().stdout
    out.write(json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")
    out.flush()


def error_json(
    code: int, kind: str, message: str, hint: str | None = None, report: Any = None
) -> dict:
    """What `--json` prints on failure: the partial result when there is one (a refused plan,
    an unhealthy health result) with an `error` key added, else just `{"error": {...}}`."""
    data = to_jsonable(report) if report is not None else {}
    if not isinstance(data, dict):
        data = {"result": data}
    data["error"] = {"code": int(code), "type": kind, "message": message, "hint": hint}
    return data


# --- tables ---------------------------------------------------------------------------------

TEXT, PATH, HASH, STATUS, NUMBER = "text", "path", "hash", "status", "number"
WORDS = "words"  # prose (a failure's detail): wrapped at spaces like a path is at `/`
HASH_CHARS = 12  # in a pipe and on wide terminals
HASH_CHARS_NARROW = 8  # on terminals narrower than WIDE
WIDE = 100
MIN_PATH_WIDTH = 16
GAP = 3  # characters between two columns of a box.SIMPLE_HEAD table


@dataclasses.dataclass(frozen=True)
class Column:
    """`kind`: text, status and number cells are never wrapped; a path may be wrapped at `/`
    to fit the terminal, words at spaces (a word too long for the line then at `/`); a hash
    is shortened (12 characters, 8 on a narrow terminal). Columns with a `drop_order` are
    left out, 1 first, where the terminal is too narrow for the table (a note under it names
    them), all columns of one drop order together (an A/B's pair); pipes and --json always
    have them."""

    name: str
    kind: str = TEXT
    drop_order: int | None = None


@dataclasses.dataclass(frozen=True)
class Cell:
    """A cell with a style for the terminal (`"bold red"`); the text is never markup."""

    text: str
    style: str | None = None


def _column(spec: str | Column) -> Column:
    if isinstance(spec, Column):
        return spec
    return Column(spec, PATH if spec == "path" else TEXT)  # old callers passed bare names


def _text(value: Any) -> str:
    if isinstance(value, Cell):
        return value.text
    return "-" if value is None else str(value)


def wrap_path(path: str, width: int) -> str:
    """`path` in lines of at most `width` characters, broken after a `/` where possible; a part
    longer than the width is broken before an escape (`\\x1b` of a quoted name) or after `_`,
    `.` or `-`, and cut inside only where it has none of those."""
    width = max(width, 1)
    lines: list[str] = []
    line = ""
    parts = path.split("/")
    for i, part in enumerate(parts):
        piece = part if i == len(parts) - 1 else part + "/"
        if line and len(line) + len(piece) > width:
            lines.append(line)
            line = ""
        for chunk in _breakable(piece) if len(piece) > width else [piece]:
            if line and len(line) + len(chunk) > width:
                lines.append(line)
                line = ""
            while len(chunk) > width:
                room = width - len(line)
                lines.append(line + chunk[:room])
                line, chunk = "", chunk[room:]
            line += chunk
    if line or not lines:
        lines.append(line)
    return "\n".join(lines)


# One character, or an escape as `printable` writes it (never split by a line break).
_UNIT = re.compile(r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)|.", re.S)


def _breakable(text: str) -> list[str]:
    """`text` in the chunks a line may end between: each escape starts one, and `_`, `.`, `-`
    end one."""
    chunks, chunk = [], ""
    for unit in _UNIT.findall(text):
        if unit.startswith("\\") and len(unit) > 1 and chunk:
            chunks.append(chunk)
            chunk = ""
        chunk += unit
        if unit in ("_", ".", "-"):
            chunks.append(chunk)
            chunk = ""
    if chunk:
        chunks.append(chunk)
    return chunks


def wrap_words(text: str, width: int) -> str:
    """`text` in lines of at most `width` characters, broken at spaces; a word longer than
    the width (a path) is broken as `wrap_path` breaks it."""
    import textwrap

    width = max(width, 1)
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
    return "\n".join(wrap_path(line, width) if len(line) > width else line for line in lines)


def print_table(
    title: str | None,
    columns: Sequence[str | Column],
    rows: Sequence[Sequence[Any]],
    *,
    styles: Mapping[str, str] | None = None,
    title_in_pipe: bool = False,
) -> None:
    """Render `rows` under `columns` on stdout. A cell is a value (None prints `-`) or a `Cell`;
    `styles` colours cells whose whole text is a key (status words) on a terminal."""
    env = environment.current()
    cols = [_column(c) for c in columns]
    styles = styles or {}
    terminal = bool(env.stdout_isatty)
    console = env.out_console if terminal else None
    width = console.width if console is not None else 0
    hash_chars = HASH_CHARS if not terminal or width >= WIDE else HASH_CHARS_NARROW
    cells: list[list[str]] = []
    for row in rows:
        line = []
        for col, value in zip(cols, row, strict=True):
            text = _text(value)
            if col.kind == HASH and all(c in "0123456789abcdef" for c in text):
                text = text[:hash_chars]
            elif col.kind in (PATH, WORDS):
                text = printable(text)  # a newline in a file name must not split its row
            line.append(text)
        cells.append(line)

    if not terminal:
        widths = [max([len(c.name)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
        lines = [title] if (title and title_in_pipe) else []
        for row in [[c.name for c in cols], *cells]:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        env.stdout.write("\n".join(lines) + "\n")
        env.stdout.flush()
        return

    from rich import box
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    natural = [
        max([cell_len(c.name)] + [cell_len(r[i]) for r in cells]) for i, c in enumerate(cols)
    ]

    # Too wide for the terminal: leave out the columns that may go, in their drop order.
    def needed(keep: list[int]) -> int:
        least = [
            min(natural[i], MIN_PATH_WIDTH) if cols[i].kind in (PATH, WORDS) else natural[i]
            for i in keep
        ]
        return sum(least) + GAP * (len(keep) - 1)

    # Columns of one drop order go together: an A/B's `simt ms` never leaves without `mma ms`.
    keep = list(range(len(cols)))
    hidden: list[str] = []
    orders = sorted({c.drop_order for c in cols if c.drop_order is not None})
    for order in orders:
        if needed(keep) <= width:
            break
        for i, c in enumerate(cols):
            if c.drop_order == order:
                keep.remove(i)
                hidden.append(c.name)
    cols = [cols[i] for i in keep]
    natural = [natural[i] for i in keep]
    cells = [[row[i] for i in keep] for row in cells]
    rows = [[row[i] for i in keep] for row in rows]

    # Still too wide: free-text columns (shape names, ids, times) wrap too, so that rich does
    # not leave whole columns out (the accuracy verdict, the path) without a word.
    squeeze = needed(list(range(len(cols)))) > width
    wraps = (PATH, WORDS, TEXT) if squeeze else (PATH, WORDS)
    # Columns other than paths keep their natural width; paths get what is left and are
    # wrapped at `/` (GAP: padding, divider, padding between two columns).
    fixed = sum(w for w, c in zip(natural, cols, strict=True) if c.kind not in wraps)
    paths = sum(1 for c in cols if c.kind in wraps)
    path_width = max(MIN_PATH_WIDTH, (width - fixed - GAP * (len(cols) - 1)) // max(paths, 1))
    table = Table(
        title=Text(title) if title else None,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    for col, natural_width in zip(cols, natural, strict=True):
        if col.kind in (PATH, WORDS):
            table.add_column(Text(col.name), overflow="fold", min_width=MIN_PATH_WIDTH)
        elif col.kind == TEXT and squeeze:
            table.add_column(Text(col.name), overflow="fold")
        else:
            justify = "right" if col.kind == NUMBER else "left"
            table.add_column(Text(col.name), no_wrap=True, min_width=natural_width, justify=justify)
    for raw, row in zip(rows, cells, strict=True):
        rendered = []
        for col, value, text in zip(cols, raw, row, strict=True):
            style = value.style if isinstance(value, Cell) else styles.get(text)
            if col.kind == PATH and len(text) > path_width:
                text = wrap_path(text, path_width)
            elif col.kind == WORDS and len(text) > path_width:
                text = wrap_words(text, path_width)
            rendered.append(Text(text, style=style or ""))
        table.add_row(*rendered)
    console.print(table)
    if hidden:
        console.print(
            f"(hidden at {width} columns: {', '.join(hidden)}; --json or a pipe has them)",
            style="dim",
            markup=False,
            highlight=False,
        )
