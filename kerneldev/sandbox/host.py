"""A self-contained sandbox host on this machine, for the demo and the tests.

`create_sandbox(folder)` builds, under `folder`:

    host/sglang/     the "live" SGLang repo root, with the two kernel files at
                     python/sglang/srt/layers/attention/flash_mla_sm120{_triton,}.py: the
                     bundled kernel (a placeholder when absent) and an SGLang-shaped wrapper,
                     plus a DSv4 backend and a test module that import them (fake_sglang.py)
    mirror/          a git clone of the same tree (git init + one commit)
    workspace/       empty; `kerneldev pull` fills it
    service/         a fake SGLang: restart.sh starts a tiny HTTP server on a free loopback
                     port that answers 503 for a short warm-up, then 200 on /health; or
                     the decode service, through its resident launcher (service/launcher.py:
                     torch imported once per environment, a fresh worker per restart)
    ssh/             a private OpenSSH sshd on 127.0.0.1 with temporary keys (when sshd is
                     installed), and a known_hosts file that already trusts it
    hosts.yaml       one host, `sandbox`, using that sshd (else the local transport)

`Sandbox.close()` stops the fake service and sshd. The sshd helpers here are also what the
test fixtures in tests/sshd.py use.

A sandbox folder outlives the demo with `--keep`; `sandbox_up`, `sandbox_down` and
`sandbox_status` (`kerneldev sandbox up|down|status --dir D`) start, stop and report its sshd
and fake service so its hosts.yaml can be used by hand.
"""

from __future__ import annotations

import importlib.resources
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kerneldev.atomic_file import write_bytes_atomic
from kerneldev.errors import SandboxError, UsageError
from kerneldev.local_user import local_user
from kerneldev.sandbox import fake_sglang
from kerneldev.sandbox.service.launcher import stop_launchers

ATTENTION_DIR = "python/sglang/srt/layers/attention"
KERNEL_FILES = (
    f"{ATTENTION_DIR}/flash_mla_sm120_triton.py",
    f"{ATTENTION_DIR}/flash_mla_sm120.py",
)
HOST_NAME = "sandbox"
SERVICE_TIMEOUT = 20.0  # seconds the sandbox's restart waits for health
DECODE_SERVICE_TIMEOUT = 120.0  # the decode service imports torch and triton: slower on 2 cores
ENV_FILE_NAME = "service.env"
DECODE_LOG_INTERVAL = 10  # steps between the decode service's "Decode batch." lines
# The kernel variants of the sandbox's decode service, as `service.variants` in hosts.yaml.
SANDBOX_VARIANTS = {
    "simt": {"SGLANG_SM120_FLASHMLA_BACKEND": "triton", "SGLANG_SM120_MMA_FLASHMLA": "0"},
    "mma": {"SGLANG_SM120_FLASHMLA_BACKEND": "triton", "SGLANG_SM120_MMA_FLASHMLA": "1"},
    "flashinfer": {"SGLANG_SM120_FLASHMLA_BACKEND": "flashinfer"},
}


# --- a private sshd ---------------------------------------------------------------------


def find_sshd() -> str | None:
    for candidate in (shutil.which("sshd"), "/usr/sbin/sshd", "/usr/local/sbin/sshd"):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, kind: str = "ed25519") -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


@dataclass
class SSHServer:
    port: int
    user: str
    host_key: Path  # private host key; .pub beside it
    client_key: Path  # private user key accepted by the server
    dir: Path
    process: subprocess.Popen | None = None

    @property
    def host_key_line(self) -> str:
        """The line that a known_hosts file needs to trust this server."""
        kind, blob = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {blob}\n"

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def start(self, detach: bool = False) -> None:
        """Start sshd and wait until it listens. `detach`: in its own session, so it outlives
        the command that started it (`kerneldev sandbox up`)."""
        sshd = find_sshd()
        if not sshd:
            raise RuntimeError("sshd not found")
        try:
            Path("/run/sshd").mkdir(exist_ok=True)  # privilege-separation folder sshd wants
        except OSError:
            pass  # not root: sshd only needs it when it runs as root
        config = self.dir / "sshd_config"
        config.write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            # Quoted: a sandbox folder may have spaces in its path.
            f'HostKey "{self.host_key}"\n'
            f'AuthorizedKeysFile "{self.dir / "authorized_keys"}"\n'
            f'PidFile "{self.dir / "sshd.pid"}"\n'
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\n"
            "PermitRootLogin prohibit-password\n"
            "StrictModes no\n"
            "UsePAM no\n"
            "AllowTcpForwarding yes\n"
            "Subsystem sftp internal-sftp\n"
            "LogLevel ERROR\n"
            "MaxStartups 50\n"
        )
        with open(self.dir / "sshd.log", "ab") as log:
            self.process = subprocess.Popen(
                [sshd, "-D", "-e", "-f", str(config)],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=detach,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"sshd exited early: {(self.dir / 'sshd.log').read_text(errors='replace')}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("sshd did not start listening within 10 s")

    def rotate_host_key(self) -> None:
        """Restart with a new host key: what a reinstalled host (or an attacker) looks like."""
        self.stop()
        for p in (self.host_key, self.host_key.with_suffix(".pub")):
            p.unlink()
        keygen(self.host_key)
        self.start()


def start_sshd(tmp: Path, detach: bool = False) -> SSHServer:
    tmp.mkdir(parents=True, exist_ok=True)
    host_key = tmp / "ssh_host_ed25519_key"
    client_key = tmp / "id_ed25519"
    keygen(host_key)
    keygen(client_key)
    (tmp / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
    os.chmod(tmp / "authorized_keys", 0o600)
    server = SSHServer(
        port=free_port(),
        user=local_user(),
        host_key=host_key,
        client_key=client_key,
        dir=tmp,
    )
    server.start(detach=detach)
    return server


# --- the fake service -------------------------------------------------------------------

_FAKE_SERVICE = importlib.resources.files("kerneldev.hostside") / "fake_sglang_server.py"


def _restart_script(
    python: str,
    service_dir: Path,
    port: int,
    warmup: float,
    decode_root: Path | None = None,
) -> str:
    q = shlex.quote
    pidfile = q(str(service_dir / "service.pid"))
    log = q(str(service_dir / "service.log"))
    script = q(str(service_dir / "fake_sglang.py"))
    command = f"{q(python)} {script} {port} {warmup}"
    env_setup = ""
    if decode_root is not None:
        # The decode service reads its switches from the env file, as SGLang's
        # unit would read an EnvironmentFile; it imports the kernels from the live tree.
        env_file = q(str(service_dir / ENV_FILE_NAME))
        profiles = q(str(service_dir / "profiles"))
        env_setup = (
            f"SGLANG_TORCH_PROFILER_DIR={profiles}; export SGLANG_TORCH_PROFILER_DIR\n"
            f"if [ -f {env_file} ]; then set -a; . {env_file}; set +a; fi\n"
        )
        if os.environ.get("PYTHONPATH"):
            # An SSH login does not inherit it: the service runs the kerneldev that made the
            # sandbox (a checkout run through PYTHONPATH), as the local transport does.
            pythonpath = q(os.environ["PYTHONPATH"])
            env_setup = f"PYTHONPATH={pythonpath}; export PYTHONPATH\n" + env_setup
        # Through the resident launcher (service/launcher.py): each restart is a new process
        # that reads the env file and the live kernel file, without importing torch again.
        command = (
            f"{q(python)} -m kerneldev.sandbox.service.launcher --dir {q(str(service_dir))} -- "
            f"--root {q(str(decode_root))} --port {port} "
            f"--decode-log-interval {DECODE_LOG_INTERVAL}"
        )
    # Stops the old instance (waiting until it is gone, zombies count as gone), then starts a
    # new one detached, with every descriptor redirected so the restart command returns at once.
    return f"""#!/bin/sh
if [ -f {pidfile} ]; then
  pid=$(cat {pidfile})
  kill "$pid" 2>/dev/null
  i=0
  while [ $i -lt 50 ] && kill -0 "$pid" 2>/dev/null \\
        && ! grep -q '^State:.*Z' /proc/"$pid"/status 2>/dev/null; do
    sleep 0.1; i=$((i+1))
  done
  kill -9 "$pid" 2>/dev/null
  rm -f {pidfile}
fi
{env_setup}nohup {command} >> {log} 2>&1 < /dev/null &
echo $! > {pidfile}
echo "fake-sglang restarted (pid $!)"
"""


# --- the sandbox ------------------------------------------------------------------------


@dataclass
class Sandbox:
    dir: Path
    config_path: Path
    host_name: str
    transport: str  # "ssh" or "local"
    root: Path
    workspace: Path
    mirror: Path
    service_dir: Path
    port: int
    files: tuple[str, ...] = KERNEL_FILES
    sshd: SSHServer | None = None
    notes: list[str] = field(default_factory=list)
    decode_service: bool = False  # the real decode service (not the health-only fake)

    def stop_service(self) -> None:
        pidfile = self.service_dir / "service.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        pidfile.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop the fake service, its launchers and sshd (the files stay; the caller removes
        the folder)."""
        self.stop_service()
        stop_launchers(self.service_dir)
        if self.sshd is not None:
            self.sshd.stop()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def kernel_source(path: str) -> bytes:
    """The bundled kernel file for `path`, or a small placeholder when it is not bundled."""
    name = path.rsplit("/", 1)[-1]
    try:
        resource = importlib.resources.files("kerneldev.kernels") / name
        if resource.is_file():
            return resource.read_bytes()
    except (ModuleNotFoundError, OSError):
        pass
    return (
        f'"""Placeholder for {name}: the bundled kernel was not found.\n\n'
        'kerneldev\'s sandbox only needs a file to pull, edit and push."""\n\n'
        "BLOCK_N = 64  # keys per tile\n"
        "NUM_WARPS = 4\n"
    ).encode()


def create_sandbox(
    folder: Path,
    *,
    use_ssh: bool | None = None,
    warmup: float = 1.0,
    decode_service: bool | None = None,
    detach: bool = False,
) -> Sandbox:
    """Build the sandbox under `folder` (created). `use_ssh=None` uses sshd when installed.
    `decode_service=None` runs the real decode service (kerneldev.sandbox.service) when its
    packages are installed, else the health-only fake; True requires it. `detach` starts it in
    its own session (it outlives this process)."""
    folder = Path(os.path.abspath(folder))
    root = folder / "host" / "sglang"
    mirror = folder / "mirror"
    workspace = folder / "workspace"
    service_dir = folder / "service"
    for d in (root, mirror, workspace, service_dir):
        d.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []

    for tree in (root, mirror):
        # SGLang's import structure (wrapper, DSv4 backend, a test module), the bundled kernel.
        fake_sglang.write_tree(tree, "srt", kernel=kernel_source(KERNEL_FILES[0]))
    (root / "README.md").write_text("Fake SGLang checkout made by kerneldev's sandbox.\n")
    (mirror / "README.md").write_text("Fake SGLang checkout made by kerneldev's sandbox.\n")
    notes.extend(_git_commit(mirror))

    port = free_port()
    (service_dir / "fake_sglang.py").write_bytes(_FAKE_SERVICE.read_bytes())
    if decode_service is None:
        decode_service = decode_service_available()
        if not decode_service:
            notes.append(
                "fastapi/uvicorn/torch/triton are not all installed: the sandbox's service "
                "is the health-only fake (no bench --service or profile)"
            )
    elif decode_service and not decode_service_available():
        raise RuntimeError("the decode service needs fastapi, uvicorn, torch and triton")
    if decode_service:
        (service_dir / ENV_FILE_NAME).write_text(
            "# Read by restart.sh before it starts the service (kerneldev edits its own keys).\n"
        )
    restart = service_dir / "restart.sh"
    restart.write_text(
        _restart_script(sys.executable, service_dir, port, warmup, root if decode_service else None)
    )
    restart.chmod(0o755)

    sshd = None
    if use_ssh is None or use_ssh:
        if find_sshd() is None or shutil.which("ssh-keygen") is None:
            if use_ssh:
                raise RuntimeError("sshd or ssh-keygen is not installed")
            notes.append("sshd is not installed: the sandbox uses the local transport")
        else:
            try:
                sshd = start_sshd(folder / "ssh", detach=detach)
            except (RuntimeError, OSError, subprocess.CalledProcessError) as err:
                if use_ssh:
                    raise
                notes.append(f"sshd did not start ({err}): the sandbox uses the local transport")

    try:
        sandbox = _finish(folder, root, mirror, workspace, service_dir, restart, port, sshd, notes)
        if decode_service:
            _add_decode_service(sandbox)
        return sandbox
    except BaseException:
        if sshd is not None:
            sshd.stop()  # never leave a server running behind a failed set-up
        raise


def _finish(
    folder: Path,
    root: Path,
    mirror: Path,
    workspace: Path,
    service_dir: Path,
    restart: Path,
    port: int,
    sshd: SSHServer | None,
    notes: list[str],
) -> Sandbox:
    host: dict = {}
    if sshd is not None:
        known_hosts = folder / "ssh" / "known_hosts"
        known_hosts.write_text(sshd.host_key_line)
        host.update(
            transport="ssh",
            hostname="127.0.0.1",
            port=sshd.port,
            user=sshd.user,
            identity_file=str(sshd.client_key),
            known_hosts=str(known_hosts),
        )
    else:
        host["transport"] = "local"
    host.update(
        root=str(root),
        files=list(KERNEL_FILES),
        workspace="workspace",
        mirror="mirror",
        # The sandbox "host" is this machine: bench there with the interpreter running kerneldev.
        python=sys.executable,
        service={
            "restart": shlex.quote(str(restart)),
            "health": f"http://127.0.0.1:{port}/health",
            "timeout": SERVICE_TIMEOUT,
            "logs": f"tail -n 20 {shlex.quote(str(service_dir / 'service.log'))}",
        },
    )
    config_path = folder / "hosts.yaml"
    config_path.write_text(
        "# Made by kerneldev's sandbox: a fake live host on this machine.\n"
        + yaml.safe_dump({"default": HOST_NAME, "hosts": {HOST_NAME: host}}, sort_keys=False)
    )
    return Sandbox(
        dir=folder,
        config_path=config_path,
        host_name=HOST_NAME,
        transport=host["transport"],
        root=root,
        workspace=workspace,
        mirror=mirror,
        service_dir=service_dir,
        port=port,
        sshd=sshd,
        notes=notes,
    )


def decode_service_available() -> bool:
    """Whether this Python can run kerneldev.sandbox.service (the `service` and `kernels`
    extras)."""
    import importlib.util

    return all(
        importlib.util.find_spec(name) is not None
        for name in ("fastapi", "uvicorn", "torch", "triton")
    )


def _add_decode_service(sandbox: Sandbox) -> None:
    """hosts.yaml gains the decode service's keys: env file, URL, variants, longer timeout."""
    data = yaml.safe_load(sandbox.config_path.read_text())
    svc = data["hosts"][sandbox.host_name]["service"]
    svc["timeout"] = DECODE_SERVICE_TIMEOUT
    svc["env_file"] = str(sandbox.service_dir / ENV_FILE_NAME)
    svc["url"] = f"http://127.0.0.1:{sandbox.port}"
    svc["variants"] = SANDBOX_VARIANTS
    sandbox.config_path.write_text(
        "# Made by kerneldev's sandbox: a fake live host on this machine, serving the live\n"
        "# kernels through kerneldev's decode service.\n" + yaml.safe_dump(data, sort_keys=False)
    )
    sandbox.decode_service = True


def _git_commit(tree: Path) -> list[str]:
    git = shutil.which("git")
    if git is None:
        return ["git is not installed: the mirror is a plain folder (its commit is null)"]
    ident = ["-c", "user.name=kerneldev sandbox", "-c", "user.email=sandbox@kerneldev.invalid"]
    steps = [
        [git, "-c", "init.defaultBranch=main", "init", "-q"],
        [git, "add", "-A"],
        [git, *ident, "-c", "commit.gpgsign=false", "commit", "-q", "-m", "sandbox mirror"],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
        if proc.returncode != 0:
            return [f"git failed in the mirror ({proc.stderr.strip()}); its commit is null"]
    return []


# --- a kept sandbox: up, down, status ----------------------------------------------------

SSH_DIR = "ssh"


@dataclass
class SandboxStatus:
    """What runs of a sandbox folder; `sshd_running` is None for a local-transport sandbox."""

    dir: str
    config: str  # its hosts.yaml: `kerneldev --config <this> diff`
    host: str
    transport: str
    sshd_running: bool | None
    sshd_port: int | None
    service_running: bool
    service_health: str | None  # the health URL
    created: bool = False  # `up` built the sandbox (the folder was new or empty)
    notes: list[str] = field(default_factory=list)  # what creating it had to settle for


def sandbox_status(folder: Path) -> SandboxStatus:
    folder = Path(os.path.abspath(folder))
    host = _sandbox_host(folder)
    ssh = host.get("transport") == "ssh"
    return SandboxStatus(
        dir=str(folder),
        config=str(folder / "hosts.yaml"),
        host=HOST_NAME,
        transport=str(host.get("transport")),
        sshd_running=_running(*_sshd_marker(folder)) if ssh else None,
        sshd_port=host.get("port") if ssh else None,
        service_running=_running(*_service_marker(folder)),
        service_health=(host.get("service") or {}).get("health"),
    )


def sandbox_up(folder: Path) -> SandboxStatus:
    """Start what is stopped (sshd, the fake service) of the sandbox in `folder`; a new or
    empty folder gets a new sandbox first."""
    folder = Path(os.path.abspath(folder))
    created = False
    notes: list[str] = []
    _must_be_a_folder(folder)
    if not (folder / "hosts.yaml").exists() and (not folder.exists() or not any(folder.iterdir())):
        try:
            notes = create_sandbox(folder, detach=True).notes  # its sshd keeps running
        except (RuntimeError, OSError, subprocess.CalledProcessError) as err:
            raise SandboxError(f"cannot create a sandbox in {folder}: {err}") from None
        created = True
    status = sandbox_status(folder)
    if status.sshd_running is False:
        _restart_sshd(folder)
    if not status.service_running:
        restart = folder / "service" / "restart.sh"
        done = subprocess.run(
            [str(restart)], capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode != 0:
            raise SandboxError(
                f"the sandbox's service did not start: {done.stderr.strip() or done.stdout}"
            )
    status = sandbox_status(folder)
    status.created = created
    status.notes = notes
    return status


def sandbox_down(folder: Path) -> SandboxStatus:
    """Stop the sandbox's sshd and fake service (only the processes it started); files stay."""
    folder = Path(os.path.abspath(folder))
    _sandbox_host(folder)  # refuse folders that are not a sandbox
    for pidfile, marker in (_service_marker(folder), _sshd_marker(folder)):
        pid = _pid_if_running(pidfile, marker)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            _wait_gone(pid, 5.0)
        if pidfile.name == "service.pid":
            pidfile.unlink(missing_ok=True)  # sshd removes its own on exit
    stop_launchers(folder / "service")
    return sandbox_status(folder)


def _must_be_a_folder(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise UsageError(
            f"--dir {folder} is a file, not a folder",
            hint="name a new or empty folder for a new sandbox, or the folder of an existing one",
        )


def _sandbox_host(folder: Path) -> dict:
    _must_be_a_folder(folder)
    config = folder / "hosts.yaml"
    try:
        data = yaml.safe_load(config.read_text())
        host = data["hosts"][HOST_NAME]
        if not isinstance(host, dict):
            raise TypeError
    except FileNotFoundError:
        raise UsageError(
            f"{folder} holds no sandbox (no hosts.yaml)",
            hint="`kerneldev sandbox up --dir NEW_FOLDER` builds one, and so does "
            "`kerneldev demo --keep --dir NEW_FOLDER`",
        ) from None
    except (OSError, yaml.YAMLError, KeyError, TypeError) as err:
        raise SandboxError(f"{config} is not a sandbox's config ({err})") from None
    return host


def _sshd_marker(folder: Path) -> tuple[Path, str]:
    # sshd shows its command line (with our config path) as its process title.
    return folder / SSH_DIR / "sshd.pid", str(folder / SSH_DIR / "sshd_config")


def _service_marker(folder: Path) -> tuple[Path, str]:
    # The health-only fake runs `<folder>/service/fake_sglang.py`, the decode service
    # `-m kerneldev.sandbox.service --root <folder>/host/sglang`: both name the folder.
    return folder / "service" / "service.pid", str(folder) + os.sep


# A process between two programs (execve: restart.sh's `nohup python ...` just started) shows
# an empty command line for a moment; it is read again this many times, 10 ms apart.
CMDLINE_RETRIES = 50


def _pid_if_running(pidfile: Path, marker: str) -> int | None:
    """The pid in `pidfile` when that process runs and is ours (its command line names
    `marker`): a stale pid file may name an unrelated process by now."""
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:
        for _ in range(CMDLINE_RETRIES):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if cmdline:
                break
            time.sleep(0.01)
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return pid  # no /proc: trust the pid file
    names = (marker.encode(), _as_proctitle(marker))
    if not any(name in cmdline for name in names) or "\nState:\tZ" in status:
        return None
    return pid


def _as_proctitle(text: str) -> bytes:
    """`text` as sshd shows it in its process title: other bytes than printable ASCII as
    `\\ooo` (octal) and a backslash doubled; a non-ASCII folder name is only found so."""
    out = []
    for byte in text.encode():
        if byte == 0x5C:
            out.append(b"\\\\")
        elif 0x20 <= byte < 0x7F:
            out.append(bytes([byte]))
        else:
            out.append(b"\\%03o" % byte)
    return b"".join(out)


def _running(pidfile: Path, marker: str) -> bool:
    return _pid_if_running(pidfile, marker) is not None


def _wait_gone(pid: int, timeout: float) -> None:
    """Until `pid` has exited (a zombie counts: its parent, not us, reaps it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text(errors="replace"):
                return
        except OSError:
            return
        time.sleep(0.05)


def _restart_sshd(folder: Path) -> None:
    """Start the sandbox's sshd again with its keys; on another port (written to hosts.yaml
    and known_hosts) when its old one is taken by now."""
    config = folder / "hosts.yaml"
    data = yaml.safe_load(config.read_text())
    host = data["hosts"][HOST_NAME]
    ssh_dir = folder / SSH_DIR
    server = SSHServer(
        port=int(host["port"]),
        user=local_user(),
        host_key=ssh_dir / "ssh_host_ed25519_key",
        client_key=ssh_dir / "id_ed25519",
        dir=ssh_dir,
    )
    if not _port_free(server.port):
        old = server.port
        server.port = free_port()
        _set_port_in_place(config, old, server.port)
    (ssh_dir / "known_hosts").write_text(server.host_key_line)
    try:
        server.start(detach=True)
    except (RuntimeError, OSError) as err:
        raise SandboxError(f"the sandbox's sshd did not start: {err}") from None


def _set_port_in_place(config: Path, old: int, port: int) -> None:
    """Change only the sandbox host's `port:` value in `config`: the user's comments, other
    hosts and layout stay byte for byte. A file where that value cannot be changed alone (an
    alias, a flow style that would change more) is left untouched and refused."""
    text = config.read_text()
    new_text = _with_port(text, port)
    if new_text is None:
        raise SandboxError(
            f"the sandbox's sshd port {old} is taken, and `port:` of host '{HOST_NAME}' in "
            f"{config} cannot be changed without rewriting more of the file",
            hint=f"set `port: {port}` (or another free port) there by hand, or free port {old}, "
            "then run `kerneldev sandbox up` again",
        )
    write_bytes_atomic(config, new_text.encode(), config.stat().st_mode & 0o7777)


def _with_port(text: str, port: int) -> str | None:
    """`text` with the value node of hosts.<sandbox>.port replaced by `port`, or None when
    that edit would not give exactly the same config with the new port."""
    try:
        root = yaml.compose(text)
        expected = yaml.safe_load(text)
        expected["hosts"][HOST_NAME]["port"] = port
    except (yaml.YAMLError, KeyError, TypeError):
        return None
    node = root
    for key in ("hosts", HOST_NAME, "port"):
        node = _value_node(node, key)
    if not isinstance(node, yaml.ScalarNode):
        return None
    new_text = text[: node.start_mark.index] + str(port) + text[node.end_mark.index :]
    try:
        if yaml.safe_load(new_text) != expected:  # an anchor or alias shared the value
            return None
    except yaml.YAMLError:
        return None
    return new_text


def _value_node(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return v
    return None


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        # As sshd binds: connections of a killed sshd left in TIME_WAIT do not block it.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
