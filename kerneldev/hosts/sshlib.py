"""paramiko, imported without the `invoke` package: the one place kerneldev imports it from.

paramiko.config imports `invoke` (when installed) only to run ssh_config's `Match exec`
lines, and invoke brings unittest.mock and asyncio with it: about half of `import paramiko`'s
time, paid by every SSH command (measured in docs/benchmarks.md, issue 23). Here paramiko is
imported with `invoke` blocked; `allow_match_exec()` hands paramiko the real invoke for a
ssh_config that has a `Match exec` line, so that such a config works exactly as before.
"""

from __future__ import annotations

import sys

if "paramiko" not in sys.modules and "invoke" not in sys.modules:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` fails at once
    try:
        import paramiko
        import paramiko.config
    finally:
        del sys.modules["invoke"]  # a later `import invoke` (Match exec) finds the real one
else:
    import paramiko
    import paramiko.config

__all__ = ["allow_match_exec", "paramiko"]


def allow_match_exec() -> None:
    """Give paramiko the `invoke` package it needs to evaluate `Match exec` (when installed;
    without it paramiko reports the missing package as before)."""
    if getattr(paramiko.config, "invoke", None) is not None:
        return
    try:
        import invoke
    except ImportError:
        return
    paramiko.config.invoke = invoke
