"""Status words as enums whose members are their words: `FileStatus.EDITED == "edited"`.

A `StatusWord` is a `str`, so JSON output (`json.dumps`), tables, f-strings, comparisons with
plain strings and dictionary keys all see the word itself, exactly as when these were bare
strings; each set of words is its own type, so drift's "same" (mirror and live agree) and a
group comparison's "same" (a host's live file is the reference host's) no longer pass for one
another in the code.
"""

from __future__ import annotations

from enum import Enum


class StatusWord(str, Enum):
    """Base of kerneldev's status words: prints, formats and hashes as its value."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return format(str.__str__(self), spec)

    __hash__ = str.__hash__
