"""`kerneldev doctor`: check, step by step, everything kerneldev needs from the config and a
host, and say for each step what is wrong and how to fix it.

The checks, in order (each one verdict: ok, warn, FAIL, or skip):

    config    the config file: where it was found, and that it is valid
    dns       the host name (after ~/.ssh/config's HostName) resolves here
    tcp       its SSH port answers within the timeout, with an SSH banner
    host-key  the key it offers is in known_hosts (unknown, changed or revoked: FAIL)
    auth      a key logs in (which one: identity_file, agent, ~/.ssh default)
    root      `root` is a folder on the host
    files     the `files` entries match files under root
    write     a file can be created and removed under root/.kerneldev
    gpu       nvidia-smi's GPUs and compute capability ("no nvidia-smi": warn)
    python    the configured `python`'s version and its torch and triton versions; on a GPU
              host also that torch is a CUDA build that sees the GPUs (compute capability)
    service   `service.health` answers healthy (when configured)
    env-file  `service.env_file` is a readable file on the host (when configured), whose
              lines a shell, systemd and docker read alike (else: warn, naming them)

A check whose prerequisite failed is shown as skipped, naming it (no auth: nothing on the host
is looked at). Missing torch or triton is a FAIL on a GPU host (one with GPUs or `gpu:` set:
bench and the post-push import check need them there) and a warn elsewhere. With a ProxyJump,
dns and tcp look at the first jump host (the one dialled from here); with a ProxyCommand they
are skipped (the command does the dialling).

The doctor reads and connects; the only thing it writes is its test file under
`<root>/.kerneldev` (a folder it creates for the test is removed again).
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import posixpath
import secrets
import shlex
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kerneldev import interrupt
from kerneldev.config import Config, HostConfig, load_config, locate_config
from kerneldev.errors import (
    ConfigError,
    ExitCode,
    HostConnectionError,
    HostKeyError,
    KerneldevError,
)
from kerneldev.hosts import fleet
from kerneldev.hosts.gpus import GpuReport, query_gpus
from kerneldev.hosts.transport.base import TEMP_MARK, Transport
from kerneldev.loop.sync import OUT_OF_ROOT, out_of_root
from kerneldev.loop.workspace import display_pattern, is_glob
from kerneldev.paths import KERNELDEV_DIR
from kerneldev.service import envfile
from kerneldev.service.restart import check_health

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
CONFIG, DNS, TCP, HOST_KEY, AUTH = "config", "dns", "tcp", "host-key", "auth"
ROOT, FILES, WRITE, GPU, PYTHON, SERVICE = "root", "files", "write", "gpu", "python", "service"
ENV_FILE = "env-file"
DEFAULT_TIMEOUT = 5.0  # seconds for the TCP connect and each SSH step
HEALTH_TIMEOUT = 10.0

_FOUND_BY = {
    "option": "given with --config",
    "environment": "from $KERNELDEV_CONFIG",
    "search": "found in this folder or above it",
    "workspace": "named by the workspace you are in",
}

# Run under the host's `python` (fed on stdin); read when first needed.
_SCRIPTS = importlib.resources.files("kerneldev.hostside")


def _host_script(name: str) -> bytes:
    return (_SCRIPTS / name).read_bytes()


@dataclass
class Check:
    name: str
    verdict: str  # ok, warn, FAIL, skip
    detail: str
    hint: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class HostReport:
    host: str
    transport: str
    address: str | None = None  # user@hostname:port once known (ssh)
    checks: list[Check] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C / SIGTERM: the checks after the last one did not run

    @property
    def failed(self) -> bool:
        return any(c.verdict == FAIL for c in self.checks)


@dataclass
class DoctorReport:
    config: Check
    hosts: list[HostReport] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C / SIGTERM came before every check had run

    @property
    def exit_code(self) -> ExitCode:
        failed = self.config.verdict == FAIL or any(h.failed for h in self.hosts)
        return ExitCode.FAILURE if failed else ExitCode.OK

    def as_json(self) -> dict[str, Any]:
        """What `doctor --json` prints: each host's checks in the order they ran."""
        # `ok`: every check ran and none failed (a host cut short by Ctrl-C is not known ok).
        hosts = [{**asdict(h), "ok": not h.failed and not h.interrupted} for h in self.hosts]
        return {
            "config": asdict(self.config),
            "hosts": hosts,
            "exit_code": int(self.exit_code),
            "interrupted": self.interrupted,
        }


def diagnose(
    config_path: str | None,
    host_spec: str | None,
    *,
    connect_timeout: float = DEFAULT_TIMEOUT,
    parallel: int = fleet.DEFAULT_PARALLEL,
) -> DoctorReport:
    """Check the config, then every host `host_spec` names (a host, group or comma list, as
    `--host` takes it; None: the default host), at most `parallel` at a time. A missing or
    invalid config is a FAIL of the config check; a `host_spec` naming nothing raises
    `ConfigError`. Ctrl-C / SIGTERM raises `Interrupted` whose `report` is the
    `DoctorReport` as far as it got (`interrupted` set on it and on the hosts cut short)."""
    config_check, config = check_config(config_path)
    if config is None:
        return DoctorReport(config_check)
    hosts = config.hosts_for(host_spec)
    outcomes = fleet.run_on_hosts(
        hosts,
        lambda host, _transport, _progress: diagnose_host(host, connect_timeout=connect_timeout),
        parallel=parallel,
        # The doctor opens its own connections, step by step: no transport from the runner.
        connect=lambda host: contextlib.nullcontext(),
    )
    report = DoctorReport(config_check)
    stopped: interrupt.Interrupted | None = None
    for host, outcome in zip(hosts, outcomes, strict=True):
        if isinstance(outcome.error, interrupt.Interrupted):
            stopped = stopped or outcome.error
            partial = outcome.error.report
            if not isinstance(partial, HostReport):  # not started: nothing was checked
                partial = HostReport(host.name, host.transport, interrupted=True)
            report.hosts.append(partial)
            continue
        if outcome.error is not None:
            raise outcome.error  # `diagnose_host` lets nothing else out
        report.hosts.append(outcome.result)
    if stopped is not None:
        report.interrupted = True
        err = interrupt.Interrupted(stopped.signum)  # the run's, not "not started"
        err.report = report
        raise err
    return report


def check_config(config_path: str | None) -> tuple[Check, Config | None]:
    location = locate_config(config_path)
    try:
        config = load_config(config_path)
    except ConfigError as err:
        return Check(CONFIG, FAIL, err.message, err.hint, {"path": str(location.path)}), None
    groups = f", {len(config.groups)} group(s)" if config.groups else ""
    detail = (
        f"{config.path} ({_FOUND_BY.get(location.found_by, location.found_by)}): "
        f"{len(config.hosts)} host(s){groups}"
    )
    data = {"path": str(config.path), "found_by": location.found_by}
    return Check(CONFIG, OK, detail, data=data), config


def diagnose_host(host: HostConfig, *, connect_timeout: float = DEFAULT_TIMEOUT) -> HostReport:
    """Every check of one host, in order; never raises for the host's own problems."""
    return _HostDoctor(host, connect_timeout).run()


class _HostDoctor:
    def __init__(self, host: HostConfig, timeout: float) -> None:
        self.host = host
        self.timeout = timeout
        self.report = HostReport(host.name, host.transport)
        self.blocked: dict[str, str] = {}  # check -> the failed check it could not do without
        self.connection = None  # SSHConnection, once the target is known
        self.target = None  # SSHTarget
        self.dial: tuple[str, int, str | None] | None = None  # host, port, jump host
        self.transport: Transport | None = None
        self.gpus: GpuReport | None = None

    def run(self) -> HostReport:
        steps: list[tuple[str, tuple[str, ...], Callable[[], Check]]] = [
            (DNS, (), self.dns),
            (TCP, (DNS,), self.tcp),
            (HOST_KEY, (TCP,), self.host_key),
            (AUTH, (HOST_KEY,), self.auth),
            (ROOT, (AUTH,), self.root),
            (FILES, (ROOT,), self.files),
            (WRITE, (ROOT,), self.write),
            (GPU, (AUTH,), self.gpu),
            (PYTHON, (AUTH,), self.python),
            (SERVICE, (AUTH,), self.service),
            (ENV_FILE, (AUTH,), self.env_file),
        ]
        try:
            for name, needs, step in steps:
                interrupt.check()  # Ctrl-C between checks: the next one is not started
                self.step(name, needs, step)
        except interrupt.Interrupted as err:
            self.report.interrupted = True
            err.report = self.report  # the checks that ran before the signal
            raise
        finally:
            if self.transport is not None:
                self.transport.close()
            elif self.connection is not None:
                self.connection.close()
        return self.report

    def step(self, name: str, needs: tuple[str, ...], check: Callable[[], Check]) -> None:
        cause = next((self.blocked[n] for n in needs if n in self.blocked), None)
        if cause is not None:
            self.blocked[name] = cause
            self.report.checks.append(Check(name, SKIP, f"skipped: needs {cause}"))
            return
        try:
            result = check()
        except interrupt.Interrupted:
            raise
        except (HostConnectionError, HostKeyError) as err:
            result = Check(name, FAIL, err.message, err.hint)
            if name not in (DNS, TCP, HOST_KEY, AUTH):
                self.blocked[AUTH] = f"{AUTH} (the connection was lost during {name})"
        except KerneldevError as err:
            result = Check(name, FAIL, err.message, err.hint)
        if result.verdict == FAIL:
            self.blocked[name] = name
        self.report.checks.append(result)

    # --- reaching the host ------------------------------------------------------------
    def _local(self, name: str) -> Check | None:
        if self.host.transport == "local":
            self.transport = self.transport or _local_transport(self.host)
            return Check(name, SKIP, "transport: local (this machine)")
        return None

    def dns(self) -> Check:
        if (local := self._local(DNS)) is not None:
            return local
        from kerneldev.hosts.transport.ssh_connection import (
            SSHConnection,
            load_ssh_config,
            parse_jump,
            resolve_target,
            ssh_config_path,
        )

        self.connection = SSHConnection(self.host, connect_timeout=self.timeout)
        target = self.target = self.connection.target()
        self.report.address = target.address
        if target.proxy_command:
            return Check(DNS, SKIP, f"reached through ProxyCommand `{target.proxy_command}`")
        name, port, via = target.hostname, target.port, None
        if target.proxy_jump:
            first = target.proxy_jump.split(",")[0]
            try:
                jump_host, user, jump_port = parse_jump(first)
            except ValueError:
                return Check(DNS, FAIL, f"bad ProxyJump entry {first!r}", "use [user@]host[:port]")
            hop = resolve_target(
                jump_host, load_ssh_config(ssh_config_path()), user=user, port=jump_port
            )
            name, port, via = hop.hostname, hop.port, jump_host
        self.dial = (name, port, via)
        try:
            infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as err:  # UnicodeError: `a..b`, a 64+ label
            why = err.strerror if isinstance(err, socket.gaierror) else "not a valid DNS name"
            return Check(
                DNS,
                FAIL,
                f"cannot resolve '{name}'{_via(via)}: {why}",
                "check `hostname` in hosts.yaml (or HostName in ~/.ssh/config) and DNS",
            )
        addresses = sorted({info[4][0] for info in infos})
        alias = target.alias if target.alias != target.hostname and via is None else None
        shown = f"{alias} -> {name}" if alias else name
        return Check(
            DNS,
            OK,
            f"{shown} -> {', '.join(addresses)}{_via(via)}",
            data={"name": name, "alias": alias, "addresses": addresses, "jump_host": via},
        )

    def tcp(self) -> Check:
        if (local := self._local(TCP)) is not None:
            return local
        if self.dial is None:
            return Check(TCP, SKIP, "reached through ProxyCommand")
        name, port, via = self.dial
        where = f"{name}:{port}"
        try:
            sock = socket.create_connection((name, port), timeout=self.timeout)
        except ConnectionRefusedError:
            return Check(
                TCP,
                FAIL,
                f"connection refused by {where}{_via(via)}: nothing listens on that port",
                "check `port` in hosts.yaml (or Port in ~/.ssh/config) and that sshd runs there",
            )
        except TimeoutError:
            return Check(
                TCP,
                FAIL,
                f"no answer from {where}{_via(via)} within {self.timeout:g}s",
                "check the address, the VPN and firewalls on the way",
            )
        except OSError as err:
            return Check(
                TCP,
                FAIL,
                f"cannot connect to {where}{_via(via)}: {err.strerror or err}",
                "check the address and the network",
            )
        with sock:
            try:
                banner = sock.recv(256).split(b"\n", 1)[0].decode("ascii", "replace").strip()
            except TimeoutError:
                banner = ""
            except OSError as err:
                banner = f"(read failed: {err.strerror or err})"
        if not banner.startswith("SSH-"):
            return Check(
                TCP,
                WARN,
                f"{where}{_via(via)} accepts connections but sent no SSH banner"
                + (f" ({banner!r})" if banner else f" within {self.timeout:g}s"),
                "check that this port is the SSH server's",
            )
        return Check(TCP, OK, f"{where}{_via(via)} answers: {banner}", data={"banner": banner})

    def host_key(self) -> Check:
        if (local := self._local(HOST_KEY)) is not None:
            return local
        from kerneldev.hosts import hostkeys

        assert self.connection is not None and self.target is not None
        check = self.connection.scan_host_key()
        target = self.target
        whose = (
            f"jump host {check.name}"
            if check.name != hostkeys.known_hosts_name(target.hostname, target.port)
            else check.name
        )
        data = {"name": check.name, "key_type": check.key_type, "fingerprint": check.fingerprint}
        data["status"] = check.status
        if check.status == "trusted":
            where = ", ".join(f"{r.file}:{r.line}" for r in check.recorded[:1])
            return Check(
                HOST_KEY, OK, f"{whose}: {check.key_type} {check.fingerprint} ({where})", data=data
            )
        refusal = hostkeys.refusal(check, self.host.name, self.connection.trust_path)
        if check.status == "unknown":
            detail = f"{whose} offers {check.key_type} {check.fingerprint}: not in known_hosts"
        elif check.status == "changed":
            old = "; ".join(f"{r.fingerprint} at {r.file}:{r.line}" for r in check.recorded)
            detail = f"{whose} CHANGED its key: now {check.fingerprint}, recorded {old}"
        else:
            detail = f"{whose} offers a key marked @revoked: {check.key_type} {check.fingerprint}"
        return Check(HOST_KEY, FAIL, detail, refusal.hint, data=data)

    def auth(self) -> Check:
        if (local := self._local(AUTH)) is not None:
            return local
        from kerneldev.hosts.transport.ssh import SSHTransport

        assert self.connection is not None and self.target is not None
        self.connection.transport()  # logs in, or raises with what was tried
        self.transport = SSHTransport(self.connection)
        used = self.connection.authenticated_with
        return Check(
            AUTH,
            OK,
            f"logged in as {self.target.user} with {used}",
            data={"user": self.target.user, "key": used},
        )

    # --- on the host ------------------------------------------------------------------
    def root(self) -> Check:
        t = self._transport()
        root = self.host.root
        q = shlex.quote(root)
        result = t.run(
            f"if [ -d {q} ]; then echo folder; elif [ -e {q} ]; then echo other; "
            "else echo missing; fi",
            timeout=30,
        )
        kind = result.stdout.strip()
        if kind == "folder":
            return Check(ROOT, OK, f"{root} is a folder")
        if kind == "other":
            return Check(ROOT, FAIL, f"{root} is not a folder", "fix `root` in hosts.yaml")
        return Check(
            ROOT,
            FAIL,
            f"{root} does not exist on the host",
            "fix `root` in hosts.yaml (the live repo root on the host); for a new checkout you "
            "mean to fill, `kerneldev push --create-root` creates it",
        )

    def files(self) -> Check:
        t = self._transport()
        found, unmatched = t.hash_files(self.host.root, list(self.host.files))
        entries = len(self.host.files)
        data = {"matched": len(found), "unmatched": [display_pattern(p) for p in unmatched]}
        globs = [display_pattern(p) for p in unmatched if is_glob(p)]
        literals = [display_pattern(p) for p in unmatched if not is_glob(p)]
        # The scan sees only regular files inside root: a literal entry it did not find may be
        # a symlink out of root (or a folder), which push refuses rather than creates.
        blocked: list[str] = []
        if literals and not globs:
            blocked = [literals[i] for i in out_of_root(t, self.host, literals)]
        if blocked:
            return Check(
                FILES,
                FAIL,
                f"{', '.join(blocked)}: {OUT_OF_ROOT}; push refuses to write there (kerneldev "
                "never writes outside root)",
                "on the host, make it a regular file inside root (or remove the link), or drop "
                "it from `files:`",
                {**data, "outside_root": blocked},
            )
        if globs or not found:
            return Check(
                FILES,
                FAIL,
                f"nothing on the host matches: {', '.join(globs or literals)}",
                "fix `files` in hosts.yaml (paths and globs relative to root)",
                data,
            )
        if literals:
            return Check(
                FILES,
                WARN,
                f"{len(found)} file(s) match; not on the host: {', '.join(literals)}",
                "`kerneldev push` creates them; fix `files` if they should already be there",
                data,
            )
        return Check(FILES, OK, f"{len(found)} file(s) match the {entries} entries", data=data)

    def write(self) -> Check:
        t = self._transport()
        folder = posixpath.join(self.host.root, KERNELDEV_DIR)
        # Named like every kerneldev temporary file, so a leftover is found and removed by
        # the next push's clean-up.
        probe = posixpath.join(folder, f".doctor{TEMP_MARK}{secrets.token_hex(6)}")
        d, p = shlex.quote(folder), shlex.quote(probe)
        result = t.run(
            f"made=; if [ ! -d {d} ]; then mkdir -- {d} || exit 1; made=1; fi; "
            f': > {p} || {{ [ -n "$made" ] && rmdir -- {d}; exit 1; }}; '
            f'rm -f -- {p} || exit 1; if [ -n "$made" ]; then rmdir -- {d}; fi; exit 0',
            timeout=30,
        )
        if result.ok:
            return Check(WRITE, OK, f"created and removed a file in {folder}")
        lines = (result.stderr.strip() or f"exit {result.exited}").splitlines()
        return Check(
            WRITE,
            FAIL,
            f"cannot write in {folder}: {lines[-1]}",
            "push writes backups, temporary files and the deploy history there: log in as a "
            "user who may write under root (`user:` in hosts.yaml), or fix its permissions or "
            "mount",
        )

    def gpu(self) -> Check:
        report = self.gpus = query_gpus(self._transport())
        data = asdict(report)
        if report.failed:
            return Check(
                GPU, FAIL, report.note or "", "check the NVIDIA driver (run nvidia-smi there)", data
            )
        if not report.present:
            return Check(
                GPU,
                WARN,
                "no nvidia-smi on the host: no NVIDIA GPU or driver found",
                "bench and the server need an NVIDIA GPU; nothing to do on a host without one",
                data,
            )
        if not report.gpus:
            return Check(GPU, WARN, "nvidia-smi lists no GPU", None, data)
        names = sorted({g.name for g in report.gpus})
        caps = sorted({g.compute_cap for g in report.gpus if g.compute_cap})
        cap = (
            "compute capability " + ", ".join(f"{c} (sm_{c.replace('.', '')})" for c in caps)
            if caps
            else "compute capability not reported (driver too old for compute_cap)"
        )
        return Check(GPU, OK, f"{len(report.gpus)}x {', '.join(names)}, {cap}", data=data)

    def python(self) -> Check:
        t = self._transport()
        python = self.host.python
        result = t.run(f"{python} -", stdin=_host_script("versions.py"), timeout=60)
        if result.exited == 127:
            return Check(
                PYTHON,
                FAIL,
                f"`{python}` not found on the host",
                "set `python:` in hosts.yaml to the server's Python interpreter",
            )
        try:
            versions = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            tail = result.stderr.strip() or result.stdout.strip() or f"exit {result.exited}"
            return Check(
                PYTHON,
                FAIL,
                f"`{python}` did not run: {tail.splitlines()[-1]}",
                "set `python:` in hosts.yaml to a Python 3 interpreter",
            )
        if not str(versions.get("python", "")).startswith("3."):
            return Check(
                PYTHON,
                FAIL,
                f"`{python}` is Python {versions.get('python')}: kerneldev needs Python 3 there",
                "set `python:` in hosts.yaml to a Python 3 interpreter (the server's)",
                versions,
            )
        missing = [name for name in ("torch", "triton") if not versions.get(name)]
        found = ", ".join(f"{n} {versions[n]}" for n in ("torch", "triton") if versions.get(n))
        detail = f"Python {versions.get('python')} ({versions.get('executable')})"
        detail += f", {found}" if found else ""
        gpu_host = self.host.gpu is not None or bool(self.gpus and self.gpus.gpus)
        if not missing:
            return (
                self._cuda(detail, versions)
                if gpu_host
                else Check(PYTHON, OK, detail, data=versions)
            )
        return Check(
            PYTHON,
            FAIL if gpu_host else WARN,
            f"{detail}; no {' and no '.join(missing)}",
            f"`kerneldev bench` and the import check after a push need torch and triton in "
            f"`{python}`: install them there, or set `python:` to the server's interpreter"
            + ("" if gpu_host else " (fine for a host that never runs kernels)"),
            versions,
        )

    def _cuda(self, detail: str, versions: dict[str, Any]) -> Check:
        """On a GPU host: torch must be a CUDA build that sees the GPUs (this imports torch,
        a few seconds); reports the compute capability as torch sees it."""
        python = self.host.python
        result = self._transport().run(
            f"{python} -", stdin=_host_script("cuda_probe.py"), timeout=120
        )
        try:
            cuda = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            tail = result.stderr.strip() or result.stdout.strip() or f"exit {result.exited}"
            cuda = {"error": tail.splitlines()[-1]}
        data = {**versions, **cuda}
        fix = f"install a CUDA build of torch in `{python}` (the one the server runs)"
        if cuda.get("error"):
            return Check(PYTHON, FAIL, f"{detail}; import torch fails: {cuda['error']}", fix, data)
        if not cuda.get("cuda"):
            return Check(PYTHON, FAIL, f"{detail}; torch is a CPU build (no CUDA)", fix, data)
        if not cuda.get("devices"):
            return Check(
                PYTHON,
                FAIL,
                f"{detail}; torch (CUDA {cuda['cuda']}) sees no GPU",
                "check the driver and CUDA_VISIBLE_DEVICES in the login environment",
                data,
            )
        caps = ", ".join(sorted(set(cuda.get("caps") or [])))
        return Check(
            PYTHON,
            OK,
            f"{detail}; CUDA {cuda['cuda']}, {cuda['devices']} GPU(s), compute capability {caps}",
            data=data,
        )

    def service(self) -> Check:
        service = self.host.service
        if service is None:
            return Check(SERVICE, SKIP, "no `service` configured")
        if not service.health:
            return Check(SERVICE, SKIP, "no `service.health` configured")
        healthy, seen = check_health(self._transport(), service.health, HEALTH_TIMEOUT)
        data = {"health": service.health, "last_check": seen}
        if healthy:
            return Check(SERVICE, OK, f"healthy: {seen} from {service.health}", data=data)
        return Check(
            SERVICE,
            FAIL,
            f"not healthy: {seen} from {service.health}",
            "`kerneldev restart` restarts it"
            + (f"; `{service.logs}` on the host shows why" if service.logs else ""),
            data,
        )

    def env_file(self) -> Check:
        """`service.env_file` on the host: what `kernels status`, the import check after a push
        and an A/B's check read as the service's variables, and where an A/B writes its
        variants. A readable file: ok; missing in an existing folder: warn (those reads fall
        back to the login environment; an A/B creates it); a missing folder, something other
        than a file, or a file the login user cannot read: FAIL."""
        path = self.host.service.env_file if self.host.service is not None else None
        if not path:
            return Check(ENV_FILE, SKIP, "no `service.env_file` configured")
        kind, said = envfile.env_file_kind(self._transport(), path)
        data = {"env_file": path, "kind": kind}
        fix = (
            "set `service.env_file` in hosts.yaml to the KEY=VALUE file the service's restart "
            "reads (systemd EnvironmentFile=, docker --env-file, a sourced script)"
        )
        if kind == envfile.FILE:
            return self._env_file_reading(path, data)
        if kind == envfile.MISSING:
            return Check(
                ENV_FILE,
                WARN,
                f"{path} does not exist on the host: `kernels status` and the import check "
                "after a push read the service's variables from it (without it: the login "
                "environment's)",
                fix + ", or create it there (`bench --service` and `profile` create it for "
                "their variants)",
                data,
            )
        what = {
            envfile.UNREADABLE: "cannot be read by the login user",
            envfile.OTHER: "is not a regular file",
            envfile.NO_FOLDER: "does not exist on the host, nor does its folder",
        }.get(kind, f"cannot be looked at ({said})")
        return Check(ENV_FILE, FAIL, f"{path} {what}", fix, data)

    def _env_file_reading(self, path: str, data: dict) -> Check:
        """A readable env file: ok when a shell, systemd and docker read its lines alike;
        else a warning naming the first such line (every line's: `data["warnings"]`)."""
        try:
            text = self._transport().read_bytes(path).decode("utf-8", "replace")
        except KerneldevError as err:
            return Check(ENV_FILE, FAIL, f"{path} cannot be read: {err.message}", data=data)
        warnings = envfile.parse_env_file(text).warnings
        data["warnings"] = warnings
        if not warnings:
            return Check(ENV_FILE, OK, f"{path} is a readable file", data=data)
        more = f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else ""
        return Check(
            ENV_FILE,
            WARN,
            f"{path}: {warnings[0]}{more}",
            "write each variable kerneldev reads or switches on a plain KEY=VALUE line of its "
            "own (docs/service-bench.md, 'How kerneldev reads the env file'): kernels status, "
            "the import check and an A/B take the shell's reading meanwhile",
            data,
        )

    def _transport(self) -> Transport:
        assert self.transport is not None  # every check on the host needs AUTH first
        return self.transport


def _local_transport(host: HostConfig) -> Transport:
    from kerneldev.hosts.transport.local import LocalTransport

    return LocalTransport(host)


def _via(jump_host: str | None) -> str:
    return f" (jump host {jump_host})" if jump_host else ""
