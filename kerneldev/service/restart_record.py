"""What the service's env file held at its last restart by kerneldev, so `kernels status` can say
when the file changed since: SGLang's sm_120 wrapper reads its switch once at import, so a
server keeps running the backend of the old values until it restarts.

The record is local to this machine: `$XDG_STATE_HOME/kerneldev/restarts.json` (default
`~/.local/state/kerneldev/`), one entry per (host name, env file): the file's sha256 as the
restart read it and the time. Restarts from another machine are not seen (then no note, rather
than a wrong one). Writes are atomic; two restarts recorded at the same instant keep one.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from pathlib import Path

from kerneldev.atomic_file import write_bytes_atomic


def record_file() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kerneldev" / "restarts.json"


def _load() -> dict:
    try:
        data = json.loads(record_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _key(host: str, env_file: str) -> str:
    return f"{host}\t{env_file}"


def record(host: str, env_file: str, env_bytes: bytes) -> None:
    """Remember `env_bytes` as what the restart of `host` just now read (best effort)."""
    data = _load()
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    data[_key(host, env_file)] = {"sha256": hashlib.sha256(env_bytes).hexdigest(), "time": now}
    try:
        write_bytes_atomic(record_file(), (json.dumps(data, indent=1) + "\n").encode(), 0o644)
    except OSError:
        pass  # a status note less, never a failed restart


def unchanged_since_restart(host: str, env_file: str, env_bytes: bytes) -> bool:
    """Whether `env_bytes` are what the last recorded restart read (False without a record)."""
    entry = _load().get(_key(host, env_file))
    return isinstance(entry, dict) and entry.get("sha256") == hashlib.sha256(env_bytes).hexdigest()


def changed_since_restart(host: str, env_file: str, env_bytes: bytes) -> str | None:
    """A note when `env_bytes` differ from what the last recorded restart read; else None."""
    entry = _load().get(_key(host, env_file))
    if not isinstance(entry, dict) or "sha256" not in entry:
        return None
    if entry["sha256"] == hashlib.sha256(env_bytes).hexdigest():
        return None
    return (
        f"{env_file} changed after the service's last restart by kerneldev ({entry.get('time')}):"
        " the wrapper reads its switch at import, so the running server still has the old "
        "values; the backends below are what the next restart runs"
    )
