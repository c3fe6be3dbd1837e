"""The server's own process on the host, found from the port its URL names: its user (whom a
trace folder must let write) and its environment (what its wrapper read at import).

`ss -ltnpH` names the process listening on the port (it shows the pid only for processes the
SSH user may inspect: its own, or all of them as root); `/proc/<pid>/environ` holds the
environment the process started with. Either may be out of reach (another user, a container,
no `ss`): then the answer is None and callers say what they could not tell.

`times` tells when the process started and when files last changed, on the host's clock (the
start from `/proc/<pid>/stat`'s start tick, `/proc/uptime` and `date`: to 1/100 s; a file's
change from its ctime, whole seconds, which every write, rename over it or `touch` moves and
no user can set back), so a caller can tell that the server imported a file before it changed.
"""

from __future__ import annotations

import shlex
import urllib.parse
from dataclasses import dataclass, field

from kerneldev.config import HostConfig
from kerneldev.errors import KerneldevError, UsageError
from kerneldev.hosts.transport.base import Transport
from kerneldev.service.variants import service_url


@dataclass
class ServerProcess:
    pid: int
    user: str | None


def _port(host: HostConfig) -> int | None:
    if host.service is None:
        return None
    try:
        url = service_url(host.service, host.name)
    except UsageError:
        return None
    parts = urllib.parse.urlsplit(url)
    return parts.port or {"http": 80, "https": 443}.get(parts.scheme)


def find(transport: Transport, host: HostConfig) -> ServerProcess | None:
    """The process listening on the service's port, where `ss` tells it."""
    port = _port(host)
    if not port:
        return None
    command = (
        f"pid=$(ss -ltnpH 'sport = :{port}' 2>/dev/null "
        "| sed -n 's/.*pid=\\([0-9]*\\).*/\\1/p' | head -n 1); "
        '[ -n "$pid" ] && echo "$pid $(ps -o user= -p "$pid")"'
    )
    try:
        found = transport.run(command, timeout=60)
    except KerneldevError:
        return None
    fields = found.stdout.split()
    if not found.ok or not fields or not fields[0].isdigit():
        return None
    return ServerProcess(int(fields[0]), fields[1] if len(fields) > 1 else None)


@dataclass
class Times:
    """Seconds since the epoch, on the host's clock."""

    started: float | None  # when the process started; None when /proc does not tell
    changed: dict[str, int] = field(default_factory=dict)  # path -> ctime (missing: absent)


def times(transport: Transport, pid: int, paths: list[str]) -> Times:
    """When process `pid` started and when each of `paths` (absolute) last changed."""
    stat = shlex.quote(f"/proc/{pid}/stat")
    command = (
        "read up _ < /proc/uptime && "
        f'echo "start $up $(date +%s.%N) $(getconf CLK_TCK) '
        f"$(sed 's/.*) //' {stat} | cut -d' ' -f20)\"; "
        + "".join(
            f'echo "changed $(stat -c %Z -- {shlex.quote(p)} 2>/dev/null || echo -)"; '
            for p in paths
        )
    )
    try:
        got = transport.run(command, timeout=60)
    except KerneldevError:
        return Times(None)
    lines = got.stdout.splitlines()
    started = None
    start = [line.split()[1:] for line in lines if line.startswith("start ")]
    if start and len(start[0]) == 4:
        up, now, tick, ticks = start[0]
        try:
            now_s = float(now) if now.replace(".", "", 1).isdigit() else float(now.split(".")[0])
            started = now_s - float(up) + int(ticks) / int(tick)
        except ValueError:
            started = None
    changed = {}
    values = [line.split()[1:] for line in lines if line.startswith("changed")]
    for path, value in zip(paths, values, strict=False):
        if value and value[0].isdigit():
            changed[path] = int(value[0])
    return Times(started, changed)


def environment(transport: Transport, pid: int) -> dict[str, str] | None:
    """The environment process `pid` started with, or None when it cannot be read."""
    try:
        got = transport.run(f"cat {shlex.quote(f'/proc/{pid}/environ')}", timeout=60)
    except KerneldevError:
        return None
    if not got.ok:
        return None
    env = {}
    for item in got.stdout.split("\0"):
        if "=" in item:
            key, value = item.split("=", 1)
            env[key] = value
    return env
