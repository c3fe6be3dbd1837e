"""Work done once per test run and shared by every pytest-xdist worker of it.

A session fixture runs once per worker process: with N workers, an expensive build behind one
(an SGLang release laid out by importing its wrapper, a wheel built and installed) would run N
times. `shared_folder` builds such a folder once, under the run's common temporary folder
(the parent of each worker's own), behind a file lock: the first worker to ask builds it, the
others wait for it and reuse it. The folder is read-only by convention (tests copy what they
change). In a run without workers it is an ordinary folder of the session.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

DONE = ".built"  # written last: a folder without it was left half-built (a worker killed)


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder common to every worker of this run (the session's own folder
    when there are none)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_folder(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]
) -> Path:
    """The folder `name` of this run, built by `build(folder)` (an empty folder) the first time
    any worker asks for it."""
    root = run_folder(tmp_path_factory)
    folder = root / f"shared-{name}"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / DONE).exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / DONE).write_text("")
    return folder
