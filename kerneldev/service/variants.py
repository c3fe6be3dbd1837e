"""Switch the running service between configured variants, and always switch it back.

A variant is a name in `service.variants` mapping environment variables to values. Switching
writes them into `service.env_file` on the host (only the managed keys' lines, atomically),
runs `service.restart` and waits for health. `VariantSwitcher` is a context manager: on the way
out (normal end, error, or Ctrl-C) it restores the env file at once and restarts the service
once more on the original settings. A second Ctrl-C during that restart skips it; the
switcher then reports the command to run (`restart_skipped`).

Also here: the service's base URL (`service.url`, else scheme://host:port of `service.health`)
and the uploads both `bench --service` and `profile` run on the host.
"""

from __future__ import annotations

import posixpath
import shlex
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from kerneldev import interrupt
from kerneldev.config import HostConfig, ServiceConfig
from kerneldev.errors import KerneldevError, ServiceError, UsageError
from kerneldev.errors import (
    RestartSkippedError as RestartSkippedError,  # re-exported: it was defined here
)
from kerneldev.hosts.transport.base import Transport
from kerneldev.service import restart as service_mod
from kerneldev.service.envfile import EnvFileEdit

ProgressCallback = Callable[[str], None]
HOST_SCRIPTS = ("service_load.py", "trace_summary.py")  # stdlib-only, run on the host


def parse_variants(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise UsageError("--variants names no variant")
    if len(set(names)) != len(names):
        raise UsageError(f"--variants names a variant twice: {text}")
    return names


def check_variants(host: HostConfig, names: list[str]) -> ServiceConfig:
    """The host's service config, checked to switch between `names`; UsageError (exit 2)."""
    svc = service_mod.require_service(host.service, host.name)
    kp = f"hosts.{host.name}.service"
    if not svc.variants:
        raise UsageError(
            f"no `variants` under {kp} in the config",
            hint="add e.g. `variants: {simt: {SGLANG_SM120_MMA_FLASHMLA: '0'}, "
            "mma: {SGLANG_SM120_MMA_FLASHMLA: '1'}}` (see hosts.example.yaml)",
        )
    unknown = [n for n in names if n not in svc.variants]
    if unknown:
        raise UsageError(
            f"unknown variant(s) {', '.join(unknown)} for host '{host.name}' "
            f"(configured: {', '.join(svc.variants)})",
            hint=f"use names from {kp}.variants",
        )
    if not svc.env_file:
        raise UsageError(
            f"no `env_file` under {kp}: kerneldev switches variants by rewriting it",
            hint="name the KEY=VALUE file your restart command reads (systemd EnvironmentFile=)",
        )
    service_url(svc, host.name)  # fail early when no URL can be derived
    return svc


def service_url(svc: ServiceConfig, host_name: str) -> str:
    if svc.url:
        return svc.url.rstrip("/")
    if svc.health and svc.health.startswith(("http://", "https://")):
        parts = urllib.parse.urlsplit(svc.health)
        return f"{parts.scheme}://{parts.netloc}"
    raise UsageError(
        f"no service URL for host '{host_name}': `health` is not a URL",
        hint=f"set hosts.{host_name}.service.url (e.g. http://127.0.0.1:30000)",
    )


@dataclass
class Switch:
    variant: str | None  # None: the original settings
    healthy_after_s: float
    env: dict[str, str]


class VariantSwitcher:
    def __init__(
        self,
        transport: Transport,
        host: HostConfig,
        on_progress: ProgressCallback | None = None,
        *,
        health_interval: float | None = None,
    ) -> None:
        self.transport = transport
        self.host = host
        self.svc = service_mod.require_service(host.service, host.name)
        if not self.svc.env_file:
            raise UsageError(f"no `env_file` under hosts.{host.name}.service")
        managed = {k for env in self.svc.variants.values() for k in env}
        self.edit = EnvFileEdit(transport, self.svc.env_file, managed)
        self.say = on_progress or (lambda _text: None)
        self.interval = health_interval
        self.current: str | None = None
        self.restart_skipped: str | None = None  # the command to run, after a second Ctrl-C
        self.restored = False

    def switch(self, name: str) -> Switch:
        env = self.svc.variants[name]
        self.edit.apply(env)
        self.current = name
        shown = " ".join(f"{k}={v}" for k, v in env.items()) or "(no variables)"
        self.say(f"{name}: {shown} -> restart")
        # service.restart checks for Ctrl-C before each pause of its health wait.
        health = service_mod.restart(self.transport, self.svc, interval=self.interval)
        self.say(f"{name}: healthy after {health.elapsed:.1f}s")
        return Switch(name, health.elapsed, dict(env))

    def restore(self) -> None:
        """Env file back at once; then one restart on the original settings."""
        if self.restored:
            return
        self.restored = True
        if not self.edit.touched:
            return
        with interrupt.shield():  # a pending Ctrl-C must not stop the restore itself
            self.edit.restore()
        self.say(f"restored {self.svc.env_file}; restarting on the original settings")
        try:
            # Only a second Ctrl-C skips this restart (the first may still be pending).
            with interrupt.set_aside():
                service_mod.restart(self.transport, self.svc, interval=self.interval)
        except (KeyboardInterrupt, interrupt.Interrupted):
            self.restart_skipped = f"kerneldev restart --host {shlex.quote(self.host.name)}"
            raise RestartSkippedError(
                f"interrupted again: {self.svc.env_file} is restored, but the service was not "
                "restarted on the original settings",
                hint=f"run `{self.restart_skipped}`",
            ) from None

    def __enter__(self) -> VariantSwitcher:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.restore()
        except RestartSkippedError:
            raise  # replaces the KeyboardInterrupt: its hint says what to run
        except KerneldevError as err:
            if exc is None:
                raise
            # The original failure matters more; the restore problem goes to the progress log.
            self.say(f"warning: restoring the service failed too: {err.message}")


def make_host_folder(
    transport: Transport,
    host: HostConfig,
    prefix: str,
    *,
    shared: bool = False,
    error: type[KerneldevError] = ServiceError,
) -> str:
    """A fresh folder under the host's $TMPDIR (else /tmp), by mktemp; `shared`: mode 1777,
    so that a server running as another user can write into it. Its absolute path; `error`
    with the host's answer when it cannot be made."""
    chmod = ' && chmod 1777 "$d"' if shared else ""
    made = transport.run(
        f'd=$(mktemp -d "${{TMPDIR:-/tmp}}/{prefix}.XXXXXX"){chmod} && echo "$d"', timeout=60
    )
    folder = made.stdout.strip()
    if not made.ok or not folder.startswith("/"):
        what = "a trace folder" if shared else "a temporary folder"
        raise error(
            f"cannot create {what} on {host.name}: "
            f"{(made.stderr or made.stdout).strip() or f'exit {made.exited}'}"
        )
    return folder


class HostScripts:
    """A temporary folder on the host holding the stdlib-only scripts; removed on exit."""

    def __init__(self, transport: Transport, host: HostConfig) -> None:
        self.transport = transport
        self.host = host
        self.dir: str | None = None

    def __enter__(self) -> HostScripts:
        tmp = make_host_folder(self.transport, self.host, "kerneldev-service")
        self.dir = tmp
        scripts = resources.files("kerneldev.hostside")
        for name in HOST_SCRIPTS:
            self.transport.write_atomic(posixpath.join(tmp, name), (scripts / name).read_bytes())
        return self

    def path(self, name: str) -> str:
        assert self.dir is not None
        return posixpath.join(self.dir, name)

    def command(self, script: str, args: list[str]) -> str:
        q = shlex.quote
        return (
            f"cd {q(self.dir or '/')} && PYTHONUNBUFFERED=1 {self.host.python} "
            f"{q(self.path(script))} {' '.join(q(a) for a in args)}"
        )

    def __exit__(self, *exc) -> None:
        if self.dir:
            # Shielded: after Ctrl-C the folder still goes (a pending one would stop the rm).
            with interrupt.shield():
                try:
                    self.transport.remove(self.dir)
                except KerneldevError:
                    pass  # a leftover temp folder must not hide the real outcome
