"""Ctrl-C and SIGTERM as an outcome, not a crash.

While `deferred_signals()` is active (the CLI wraps every command in it), SIGINT and SIGTERM
only set a flag. Long operations call `check()` at safe points (between upload chunks, between
files, in the loops that wait for remote commands), which raises `Interrupted` there: the SFTP
session is between requests, so temporary files can still be removed and the deploy record
saved. A second signal while the first is being handled raises at once (the user insists).

Without `deferred_signals()` (library use), `check()` never raises and signals keep Python's
default behaviour.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from kerneldev.errors import Interrupted as Interrupted  # re-exported: it was defined here

_pending: int | None = None
_active = False
_at_prompt = False


class _Shields(threading.local):
    """Per thread: a clean-up shielded in one host's worker thread (kerneldev/hosts/fleet.py) must
    not keep Ctrl-C from the others, and the count is never updated by two threads at once."""

    count = 0


_shields = _Shields()


def pending() -> int | None:
    """The signal received and not yet acted on, if any."""
    return _pending


def requested() -> bool:
    """True when `check()` would raise: a signal is pending and no clean-up is shielded."""
    return _pending is not None and not _shields.count


def check() -> None:
    """Raise `Interrupted` if a signal arrived since `deferred_signals()` began (not inside
    `shield()`)."""
    if _pending is not None and not _shields.count:
        raise Interrupted(_pending)


def consume() -> int | None:
    """Take the pending signal as handled and return it (None: there was none). For a command
    whose normal end is a signal between operations (`kerneldev watch`): it then ends as a
    success instead of as interrupted."""
    global _pending
    taken, _pending = _pending, None
    return taken


@contextmanager
def shield() -> Iterator[None]:
    """Clean-up that must finish (remove temporary files, release the lock, save the record):
    `check()` does not raise inside it."""
    _shields.count += 1
    try:
        yield
    finally:
        _shields.count -= 1


@contextmanager
def set_aside() -> Iterator[None]:
    """Clean-up that only a *new* signal may cut short (the restart on the original settings
    after Ctrl-C): the pending signal is set aside meanwhile, so the next one is acted on at
    the next `check()`; afterwards the set-aside signal is pending again."""
    global _pending
    saved, _pending = _pending, None
    try:
        yield
    finally:
        if _pending is None:
            _pending = saved


@contextmanager
def prompt() -> Iterator[None]:
    """A question waiting for the user's answer: a signal ends the wait at once, as a
    `KeyboardInterrupt` (pending too, so `requested()` says so); a flag alone would leave the
    read of the answer waiting, since Python resumes a read after the handler returns."""
    global _at_prompt
    _at_prompt = True
    try:
        yield
    finally:
        _at_prompt = False


def _handler(signum: int, _frame) -> None:
    global _pending
    if _pending is not None and not _shields.count:
        raise Interrupted(signum)  # second signal: stop now, wherever we are
    _pending = signum
    if _at_prompt:
        raise KeyboardInterrupt


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Turn SIGINT/SIGTERM into a flag for the duration (main thread only; else a no-op)."""
    global _pending, _active
    if threading.current_thread() is not threading.main_thread() or _active:
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    _pending, _active = None, True
    for s in previous:
        signal.signal(s, _handler)
    try:
        yield
        check()  # a signal that came after the last safe point still ends the command as such
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _active = False
        _pending = None  # acted on (or the caller caught it): the next command starts clean
