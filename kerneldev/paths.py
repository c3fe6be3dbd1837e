"""Where kerneldev keeps its own files: every `.kerneldev` path is spelled here and only here.

On a host, under its SGLang root:

    .kerneldev/lock             one writer at a time (loop/lock.py)
    .kerneldev/history.jsonl    every deploy, one JSON line each (loop/history.py)
    .kerneldev/backups/<id>/    the bytes each deploy replaced (loop/history.py)

In a workspace:

    .kerneldev/config.json      which config and host the workspace belongs to (config.py)
    .kerneldev/state.json       bases and deploy records per host (loop/state.py)
    .kerneldev/discarded/       edits `pull --force` set aside (loop/sync.py)
    .kerneldev/sessions/        kept sessions' holder logs, and their sockets when
                                $XDG_RUNTIME_DIR is not usable (hosts/transport/session/)

A kept session's socket is `$XDG_RUNTIME_DIR/kerneldev/<host>-<key>.sock` when that folder is
usable, else in the workspace's `.kerneldev/sessions/`, else (a path too long for a unix
socket) in `/tmp/kerneldev-<uid>/`; each folder 0700 and the user's own.

Next to the config file (hosts.yaml): `.kerneldev/results/` (bench results) and
`.kerneldev/profiles/` (profiles). Temporary files, locally and on hosts, are named
`.<target>.kerneldev-tmp-<random>` beside their target.
"""

from __future__ import annotations

from pathlib import Path

KERNELDEV_DIR = ".kerneldev"

# On a host, relative to its root.
HOST_LOCK = f"{KERNELDEV_DIR}/lock"
HOST_HISTORY = f"{KERNELDEV_DIR}/history.jsonl"
HOST_BACKUPS = f"{KERNELDEV_DIR}/backups"

# In a workspace, relative to it.
WORKSPACE_POINTER = f"{KERNELDEV_DIR}/config.json"  # {"config": path, "host": name}
DISCARDED_DIR = f"{KERNELDEV_DIR}/discarded"
SESSIONS_DIR = f"{KERNELDEV_DIR}/sessions"

# Kept sessions' sockets: under $XDG_RUNTIME_DIR, else the workspace's SESSIONS_DIR, else this
# folder for paths that would pass the unix socket limit ({uid}: the local user's).
RUNTIME_SESSIONS = "kerneldev"
SHORT_SESSIONS = "/tmp/kerneldev-{uid}"

# Next to the config file.
RESULTS_DIR = Path(KERNELDEV_DIR) / "results"
PROFILES_DIR = Path(KERNELDEV_DIR) / "profiles"

# The mark in every temporary file's name: `.<target>.kerneldev-tmp-<random>`.
TEMP_MARK = f"{KERNELDEV_DIR}-tmp-"
