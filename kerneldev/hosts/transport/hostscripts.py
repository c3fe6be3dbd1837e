"""The host-side scripts as the transports run them: their source, and the shell command that
starts one with the host's first Python 3 found (no paramiko here: the agent transport, which a
kept session's client uses, must not load it)."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import ModuleType

from kerneldev.hostside import agent as _agent
from kerneldev.hostside import agent_bootstrap as _agent_bootstrap
from kerneldev.hostside import hashfiles as _hashfiles

_SOURCES: dict[str, str] = {}


def script(module: ModuleType) -> str:
    """The source of a self-contained hostside module, to run on the host with `python3 -c`:
    the sources of the hostside modules it names in `SHARED` (`hostcommon`), then its own
    (which imports their names only where they are not defined yet)."""
    if module.__name__ not in _SOURCES:
        parts = [
            Path(module.__file__).with_name(f"{name}.py").read_text(encoding="utf-8")
            for name in getattr(module, "SHARED", ())
        ]
        parts.append(Path(module.__file__).read_text(encoding="utf-8"))
        _SOURCES[module.__name__] = "\n\n".join(parts)
    return _SOURCES[module.__name__]


def python_command(
    pythons: list[str], source: str, *, utf8: bool = True, args: tuple[str, ...] = ()
) -> str:
    """A shell command that runs `source` with the first interpreter of `pythons` found on the
    host; none found -> exit 127 with 'no python3' on stderr. `utf8`: PYTHONUTF8=1 for it (the
    agent goes without, so that the commands it runs get the login shell's environment as is)."""
    candidates = " ".join(shlex.quote(p) for p in dict.fromkeys(pythons))
    env = "PYTHONUTF8=1 " if utf8 else ""
    run = " ".join([f'{env}exec "$p" -S -c', shlex.quote(source), *map(shlex.quote, args)])
    return (
        f"for p in {candidates}; do "
        f'if command -v "$p" >/dev/null 2>&1; then {run}; fi; '
        f"done; echo 'kerneldev: no python3 on the host' >&2; exit 127"
    )


def hash_command(pythons: list[str]) -> str:
    """The one shell command that hashes files on the host: the first interpreter of `pythons`
    found runs `hashfiles.py` (request as JSON on stdin); none found -> exit 127."""
    return python_command(pythons, script(_hashfiles))


def agent_source() -> bytes:
    """What the agent's bootstrap reads from stdin first: `hostside/agent.py`."""
    return script(_agent).encode("utf-8")


def agent_command(pythons: list[str]) -> str:
    """The shell command that starts the host agent (`hostside/agent.py`) on an exec channel:
    only `hostside/agent_bootstrap.py` is on its command line (`ps` on the host shows no 15 KB
    of source); its stdin must start with `agent_source()`."""
    size = str(len(agent_source()))
    return python_command(pythons, script(_agent_bootstrap), utf8=False, args=(size,))
