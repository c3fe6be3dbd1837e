"""Restart the inference service on the host and wait until it is healthy.

`service.health` is either an http(s) URL as seen from the host (polled with
`Transport.http_get`, which goes through the SSH connection, so the port need not be reachable
from the laptop; any 2xx/3xx answer is healthy) or a shell command run on the host (exit 0 is
healthy). When health does not come within `service.timeout` seconds, the output of
`service.logs` is fetched and carried by the `UnhealthyError` raised. A restart command that
fails (non-zero exit, timeout) raises `RestartFailedError`, a kind of `UnhealthyError` (with the
logs too): callers that roll an unhealthy deploy back roll this one back as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kerneldev import interrupt
from kerneldev.config import ServiceConfig
from kerneldev.errors import (
    ConnectionLostError,
    HostConnectionError,
    RemoteCommandError,
    RestartFailedError,
    TransferError,
    UnhealthyError,
    UsageError,
)
from kerneldev.hosts.transport.base import Transport
from kerneldev.service import restart_record

DEFAULT_INTERVAL = 1.0  # seconds between health checks

TickCallback = Callable[[float, str | None], None]  # (elapsed seconds, last check's outcome)


@dataclass
class ServiceHealth:
    host: str
    healthy: bool
    elapsed: float  # seconds from the start of the restart until healthy
    checks: int  # health checks made
    health: str | None  # the URL or command that was polled
    last_check: str | None  # e.g. "HTTP 200", "exit 0", "no answer"


def is_url(health: str) -> bool:
    return health.startswith(("http://", "https://"))


def require_service(service: ServiceConfig | None, host_name: str) -> ServiceConfig:
    if service is None or not service.restart:
        raise UsageError(
            f"no service restart command is configured for host '{host_name}'",
            hint=f"add `service: {{restart: ..., health: ...}}` under hosts.{host_name} "
            "in hosts.yaml",
        )
    return service


def _env_file_bytes(transport: Transport, service: ServiceConfig) -> bytes | None:
    if not service.env_file:
        return None
    try:
        return transport.read_bytes(service.env_file)
    except (TransferError, RemoteCommandError):  # unreadable: no record, the restart goes on
        return None


def check_health(transport: Transport, health: str, timeout: float) -> tuple[bool, str]:
    """One health check: (healthy, what it saw)."""
    if is_url(health):
        try:
            status = transport.http_get(health, timeout=max(0.5, min(5.0, timeout)))
        except ConnectionLostError:
            raise  # the SSH connection itself is gone: polling on would only wait out the timeout
        except HostConnectionError:
            return False, "no answer"
        return 200 <= status < 400, f"HTTP {status}"
    try:
        result = transport.run(health, timeout=max(1.0, min(30.0, timeout)))
    except RemoteCommandError:
        return False, "timed out"
    return result.ok, f"exit {result.exited}"


def restart(
    transport: Transport,
    service: ServiceConfig | None,
    on_tick: TickCallback | None = None,
    *,
    interval: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ServiceHealth:
    """Run `service.restart`, then poll `service.health` until healthy or `service.timeout`."""
    host = transport.host_name
    service = require_service(service, host)
    if interval is None:
        interval = DEFAULT_INTERVAL  # read at call time, so tests can shorten it
    start = time.monotonic()
    env_bytes = _env_file_bytes(transport, service)  # what this restart reads (kernels status)
    try:
        result = transport.run(service.restart, timeout=service.timeout)
    except RemoteCommandError as err:
        failed = f"restart command on {host} failed: {err.message}"
        raise _restart_failed(transport, service, failed, "restart timed out", start) from None
    if not result.ok:
        detail = (result.stderr.strip() or result.stdout.strip())[-2000:]
        failed = f"restart command on {host} exited {result.exited}: {service.restart}" + (
            f"\n{detail}" if detail else ""
        )
        last = f"restart exited {result.exited}"
        raise _restart_failed(transport, service, failed, last, start)
    if env_bytes is not None:
        restart_record.record(host, service.env_file, env_bytes)
    if not service.health:
        return ServiceHealth(host, True, time.monotonic() - start, 0, None, "no health check")

    checks = 0
    last = None
    deadline = start + service.timeout
    while True:
        checks += 1
        healthy, last = check_health(transport, service.health, deadline - time.monotonic())
        elapsed = time.monotonic() - start
        if healthy:
            return ServiceHealth(host, True, elapsed, checks, service.health, last)
        if on_tick:
            on_tick(elapsed, last)
        if time.monotonic() + interval > deadline:
            break
        interrupt.check()  # Ctrl-C ends the wait now, not after service.timeout
        sleep(interval)

    logs, hint = _fetch_logs(transport, service)
    raise UnhealthyError(
        f"service on {host} not healthy after {service.timeout:g}s "
        f"({checks} checks of {service.health}, last: {last})",
        logs,
        hint=hint,
        health=ServiceHealth(host, False, time.monotonic() - start, checks, service.health, last),
    )


def _fetch_logs(transport: Transport, service: ServiceConfig) -> tuple[str | None, str]:
    """The output of `service.logs` (None when not configured), and a hint that says where
    it is shown or why it is missing."""
    logs = None
    if service.logs:
        try:
            out = transport.run(service.logs, timeout=30)
            logs = out.stdout + (out.stderr if out.stderr else "")
        except RemoteCommandError as err:
            logs = f"(could not fetch logs: {err.message})"
    if logs and logs.strip():
        hint = "the service logs are shown above"
    elif service.logs:
        hint = f"`service.logs` ({service.logs}) printed nothing; check it on the host"
    else:
        hint = "configure `service.logs` to see the service's output here"
    return logs, hint


def _restart_failed(
    transport: Transport, service: ServiceConfig, message: str, last: str, start: float
) -> RestartFailedError:
    """A restart command that failed: the service is as good as unhealthy (callers roll the
    deploy back), so the error carries the service logs and a failed health result."""
    logs, hint = _fetch_logs(transport, service)
    health = ServiceHealth(
        transport.host_name, False, time.monotonic() - start, 0, service.health, last
    )
    hint = f"fix `service.restart` in hosts.yaml or the service on the host; {hint}"
    return RestartFailedError(message, logs, hint=hint, health=health)
