"""The service's environment file (`service.env_file`): KEY=VALUE lines that the restart command
reads, as systemd's `EnvironmentFile=`, `docker run --env-file` or a shell `export` script.

`kernels status` reads it to tell which backend the live wrapper picks; the import check after
a push imports the pushed modules with it, as the server would.
"""

from __future__ import annotations

import shlex

from kerneldev.config import HostConfig
from kerneldev.transport.base import Transport


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines; blank lines, `#` comments and a leading `export ` are skipped, one pair
    of matching quotes around a value is removed."""
    env = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def read_service_env(transport: Transport, host: HostConfig) -> dict[str, str] | None:
    """The variables of `service.env_file`, or None when none is configured. Raises
    `TransferError` when it is configured but cannot be read."""
    path = host.service.env_file if host.service is not None else None
    if not path:
        return None
    return parse_env_file(transport.read_bytes(path).decode("utf-8", "replace"))


def export_prefix(env: dict[str, str]) -> str:
    """Shell text that exports `env` for the command that follows it."""
    return "".join(
        f"export {key}={shlex.quote(value)}; " for key, value in env.items() if key.isidentifier()
    )
