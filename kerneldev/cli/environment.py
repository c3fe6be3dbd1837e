"""The environment a command runs in: its streams, whether they are terminals, and the width.

`main(argv, env)` runs every command inside one `Environment`; output code asks `current()`
for it instead of holding module-global consoles, so a test passes its own (StringIO streams,
a forced terminal of 80 columns) and reads what a user would see.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False


@dataclass
class Environment:
    """stdout carries data (tables, JSON, patches); stderr messages and progress.

    `stdout_isatty` / `stderr_isatty` (default: ask the stream) switch colour, tables and
    spinners on; `width` fixes the terminal width (default: the terminal's own)."""

    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    stdin: TextIO = field(default_factory=lambda: sys.stdin)
    stdout_isatty: bool | None = None
    stderr_isatty: bool | None = None
    stdin_isatty: bool | None = None
    width: int | None = None
    _out: Console | None = field(default=None, init=False, repr=False)
    _err: Console | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.stdout_isatty is None:
            self.stdout_isatty = _isatty(self.stdout)
        if self.stderr_isatty is None:
            self.stderr_isatty = _isatty(self.stderr)
        if self.stdin_isatty is None:
            self.stdin_isatty = _isatty(self.stdin)

    def _console(self, stream: TextIO, terminal: bool) -> Console:
        from rich.console import Console  # rich loads only when something is printed

        # force_terminal=False (not None): a pipe is never treated as a terminal, whatever
        # FORCE_COLOR says, so `grep` sees plain columns.
        return Console(
            file=stream, force_terminal=terminal, width=self.width, highlight=False, soft_wrap=False
        )

    @property
    def out_console(self) -> Console:
        if self._out is None:
            self._out = self._console(self.stdout, bool(self.stdout_isatty))
        return self._out

    @property
    def err_console(self) -> Console:
        if self._err is None:
            self._err = self._console(self.stderr, bool(self.stderr_isatty))
        return self._err


_current: ContextVar[Environment | None] = ContextVar("kerneldev_environment", default=None)


def current() -> Environment:
    """The environment of the running command (outside `main`: the process's streams as they
    are now, so pytest's capture still sees the output)."""
    env = _current.get()
    return env if env is not None else Environment()


@contextmanager
def use(env: Environment) -> Iterator[Environment]:
    token = _current.set(env)
    try:
        yield env
    finally:
        _current.reset(token)
