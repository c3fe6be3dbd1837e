"""How a file name appears in human output (tables, status lines, messages).

A name is bytes the user chose: it may hold a newline, a tab or a terminal escape sequence,
which would split a table row or a grep-able line in two, or drive the terminal. Such a name is
shown quoted with those characters escaped, as Python writes a string (`'new\\nline.py'`);
every other name is shown as it is. `--json` always carries the exact name.
"""

from __future__ import annotations

from collections.abc import Iterable


def printable(name: str) -> str:
    """`name` unchanged when every character of it prints; else its escaped, quoted form."""
    return name if name.isprintable() else repr(name)


def printable_list(names: Iterable[str], sep: str = ", ") -> str:
    """Names joined for one line of output, each shown by `printable`."""
    return sep.join(printable(n) for n in names)


def printable_text(text: str) -> str:
    """A message for the terminal: line breaks kept, every other character that does not print
    (an escape sequence from a typed argument, a tab, a carriage return) written as Python
    escapes it (`\\x1b`, `\\t`), so user input shown in an error cannot drive the terminal."""
    if all(c == "\n" or c.isprintable() for c in text):
        return text
    return "".join(c if c == "\n" or c.isprintable() else repr(c)[1:-1] for c in text)
