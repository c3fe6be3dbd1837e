"""The one place kerneldev asks git something about a local checkout (the mirror, the kernel
file a bench ran). The bench harness runs on the host with the standard library only and keeps
its own small copy."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


class GitUnavailable(Exception):
    """git is not installed or could not be run; the message says which."""


def head_commit(folder: Path | str) -> str | None:
    """The HEAD commit of the checkout holding `folder`; None when it is not a git checkout
    with a commit. Raises `GitUnavailable` when git itself cannot run."""
    git = shutil.which("git")
    if git is None:
        raise GitUnavailable("git is not installed")
    try:
        proc = subprocess.run(
            [git, "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise GitUnavailable(f"cannot run git in {folder}: {err}") from None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None
