"""Run the CLI as a user does: `python -m kerneldev ARGS` in a child process. The one place the
tests spell out that command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_kerneldev(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """`python -m kerneldev ARGS` from the repository root, output captured as text; `env` adds
    to (or overrides) this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "kerneldev", *args],
        capture_output=True,
        text=True,
        input=input,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        cwd=REPO,
    )


def start_kerneldev(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m kerneldev ARGS` started in the background in its own process group, as a
    terminal's foreground job (so a test can send it Ctrl-C); output piped as text."""
    return subprocess.Popen(
        [sys.executable, "-m", "kerneldev", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        cwd=REPO,
    )
