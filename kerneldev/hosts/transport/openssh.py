"""The host agent under the system's OpenSSH client: `ssh` as a child process, the agent's
frames over its stdin and stdout.

A one-shot command over paramiko pays `import paramiko` and a key exchange in Python (0.3-0.5 s
of a 0.8 s no-op on a 2-core machine, docs/benchmarks.md, issue 23); `ssh host python3 -c pass`
pays neither. `ssh_command` builds the command line that starts the same agent bootstrap as
`SSHTransport` (`hostscripts.agent_command`, its source on stdin) with kerneldev's rules:

- host keys checked strictly against exactly kerneldev's known_hosts files
  (`hostkeys.known_hosts_files`), nothing else (no global file, no KnownHostsCommand, no DNS,
  no IP check), and never written (UpdateHostKeys=no);
- the same user, port, identity file and ssh_config file (`-F`, "none" when there is none:
  neither reads /etc/ssh/ssh_config), keys only, never a prompt (BatchMode);
- nothing of the user's config that would change where or how it connects beyond what
  kerneldev's own reading of it does: no multiplexed master (whose host key was checked
  elsewhere), no forwardings, no LocalCommand or RemoteCommand.

Where the two readings could differ (ProxyJump, whose hop ssh would not get these options;
Include, Match, HostKeyAlias, canonicalisation; `@cert-authority` lines; names OpenSSH would
read as options or user@host) `ssh_command` returns None and a reason: the caller uses
paramiko. `OpenSSHAgent` runs the command, reads its stderr all along (never shown on the
terminal) and ends it on `close()`. This module never imports paramiko.
"""

from __future__ import annotations

import atexit
import fcntl
import math
import os
import re
import shlex
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from kerneldev.config import HostConfig
from kerneldev.errors import UsageError
from kerneldev.hosts.transport.agent_client import AgentClient
from kerneldev.hosts.transport.hostscripts import agent_command, agent_source
from kerneldev.hosts.transport.ssh_config_file import (
    CONNECT_TIMEOUT,
    DEFAULT_KEYS,
    ssh_config_path,
)
from kerneldev.hosts.transport.transfer_mode import TRANSFER_ENV, transfer_mode
from kerneldev.local_user import local_user

SSH_CLIENT_ENV = "KERNELDEV_SSH_CLIENT"
SSH_CLIENTS = ("auto", "openssh", "paramiko")
STDERR_TAIL = 4096  # bytes of ssh's stderr kept for messages
EXIT_GRACE = 1.0  # seconds for ssh to exit once its output ended
PIPE_SIZE = 1 << 20  # bytes a pipe to or from ssh may hold (`big_pipe`)
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031 if os.uname().sysname == "Linux" else None)
# ssh_config keywords whose meaning OpenSSH and kerneldev's reading (paramiko's SSHConfig)
# could disagree on, or which OpenSSH would apply without kerneldev's options (a ProxyJump
# hop's ssh gets only `-F`): with any of them, the connection is paramiko's.
_CONFIG_KEYWORDS = re.compile(
    r"^\s*(proxyjump|include|match|hostkeyalias|knownhostscommand|canonicalizehostname"
    r"|canonicaldomains|canonicalizepermittedcnames)\b",
    re.IGNORECASE | re.MULTILINE,
)
_CONFIG_USER = re.compile(r"^\s*user\b", re.IGNORECASE | re.MULTILINE)
# OpenSSH compares host names lowercased (hashed known_hosts entries too); kerneldev does not
# lowercase before hashing: a name with capitals is left to paramiko.
_CONFIG_HOSTNAME_CAPS = re.compile(r"^\s*hostname\s*=?\s*\S*[A-Z]", re.IGNORECASE | re.MULTILINE)
_CONFIG_KEX = re.compile(r"^\s*kexalgorithms\b", re.IGNORECASE | re.MULTILINE)
_NOT_PARAMIKO_KEX = ("sntrup761x25519-sha512", "sntrup761x25519-sha512@openssh.com")
_CERT_AUTHORITY = re.compile(r"^\s*@cert-authority\b", re.MULTILINE)
_UNQUOTABLE = ('"', "\\", "%")  # not expressible in an -o value (quotes, escapes, % tokens)


def ssh_client(host: HostConfig) -> str:
    """$KERNELDEV_SSH_CLIENT, else the host's `ssh_client` ("auto", "openssh" or "paramiko")."""
    raw = os.environ.get(SSH_CLIENT_ENV, "").strip().lower()
    if not raw:
        return host.ssh_client
    if raw not in SSH_CLIENTS:
        raise UsageError(
            f"${SSH_CLIENT_ENV} is {raw!r}, not one of {', '.join(SSH_CLIENTS)}",
            hint=f"unset {SSH_CLIENT_ENV} to use the config's `ssh_client` (default auto)",
        )
    return raw


@dataclass(frozen=True)
class SSHCommand:
    """The `ssh` command line for a host, or why there is none (`argv` None)."""

    argv: list[str] | None
    why_not: str | None = None


def ssh_command(
    host: HostConfig,
    known_hosts: list[Path],
    *,
    ssh_config: str | Path | None = None,
    connect_timeout: float | None = None,
) -> SSHCommand:
    """The system ssh's command line that starts the host agent on `host`, checking host keys
    against `known_hosts` only; `argv` None (with the reason) where OpenSSH could not do
    exactly what kerneldev's own connection does."""
    binary = shutil.which("ssh")
    if binary is None:
        return SSHCommand(None, "no `ssh` on PATH")
    hostname = host.hostname or ""
    if (
        not hostname
        or hostname.startswith(("-", "ssh://"))
        or "@" in hostname
        or any(c.isspace() or c.isupper() for c in hostname)
    ):
        return SSHCommand(None, f"the host name {hostname!r} reads differently to OpenSSH")
    config = ssh_config_path(ssh_config)
    config_text = ""
    if config is not None:
        try:
            config_text = config.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return SSHCommand(None, f"cannot read {config}")  # paramiko says it in its words
        if found := _CONFIG_KEYWORDS.search(config_text):
            return SSHCommand(None, f"{config} uses {found.group(1)}")
        if _CONFIG_HOSTNAME_CAPS.search(config_text):
            return SSHCommand(None, f"{config} has a HostName with capitals")
    for path in known_hosts:
        if any(c in str(path) for c in _UNQUOTABLE):
            return SSHCommand(None, f"the known_hosts path {path} cannot be passed to ssh")
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        except OSError:
            return SSHCommand(None, f"cannot read {path}")  # paramiko's check says it
        if _CERT_AUTHORITY.search(text):
            return SSHCommand(None, f"{path} has @cert-authority lines")
    seconds = CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
    files = " ".join(f'"{p}"' for p in known_hosts)
    argv = [
        binary,
        "-F",
        str(config) if config is not None else "none",
        "-T",  # no terminal
        "-x",  # no X11 forwarding
        "-a",  # no agent forwarding
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={files}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "KnownHostsCommand=none",
        "-o", "CheckHostIP=no",
        "-o", "VerifyHostKeyDNS=no",
        "-o", "UpdateHostKeys=no",
        "-o", "PreferredAuthentications=publickey",
        "-o", "ControlMaster=no",
        "-o", "ControlPath=none",
        "-o", "ClearAllForwardings=yes",
        "-o", "PermitLocalCommand=no",
        "-o", "RemoteCommand=none",
        "-o", "RequestTTY=no",
        "-o", "EscapeChar=none",
        "-o", f"ConnectTimeout={max(1, math.ceil(seconds))}",
        "-o", "ServerAliveInterval=15",
        "-o", "LogLevel=ERROR",
    ]  # fmt: skip
    identities = []
    if not _CONFIG_KEX.search(config_text):
        # The key exchanges paramiko offers, as today's connection negotiates them: OpenSSH
        # 9.x prefers sntrup761x25519, which paramiko has not, and which cost this 2-core
        # machine ~0.13 s of a 0.45 s `ssh host true` (docs/benchmarks.md, issue 23 round 5).
        # An ssh_config that names KexAlgorithms is the user's policy and is left to apply.
        argv += ["-o", f"KexAlgorithms=-{','.join(_NOT_PARAMIKO_KEX)}"]
    if host.identity_file is not None:
        identity = Path(os.path.expanduser(str(host.identity_file)))
        if not identity.exists():
            return SSHCommand(None, f"identity_file {identity} does not exist")
        identities.append(identity)
    # kerneldev also tries $HOME's default keys, where OpenSSH would take the passwd entry's
    # home, and only without any IdentityFile: named here, they are the same keys.
    for name in DEFAULT_KEYS:
        default = Path(os.path.expanduser(f"~/.ssh/{name}"))
        if default.exists() and default not in identities:
            identities.append(default)
    for identity in identities:
        if any(c in str(identity) for c in _UNQUOTABLE):
            return SSHCommand(None, f"the key path {identity} cannot be passed to ssh")
        argv += ["-i", str(identity)]
    if host.user is not None:
        argv += ["-l", host.user]
    elif not _CONFIG_USER.search(config_text):
        argv += ["-l", local_user()]  # kerneldev's default login name, as paramiko's path uses
    if host.port is not None:
        argv += ["-p", str(host.port)]
    pythons = ["python3", host.python]
    # `exec`: the login shell does not stay behind as the agent's parent (as in ssh.py).
    argv += ["--", hostname, f"exec sh -c {shlex.quote(agent_command(pythons))}"]
    return SSHCommand(argv)


def big_pipe(fd: int) -> None:
    """Let the pipe `fd` hold 1 MiB (Linux; the default is 64 KiB) where this user may: the
    frames of a large transfer are up to 1 MiB, and each 64 KiB more of them in a pipe costs
    the writer a wake-up of the reader (50 MB through a pipe: 50-67 ms with 64 KiB, ~20 ms
    with 1 MiB on the measured machine: docs/benchmarks.md, issue 23 round 6). Only the
    buffering changes; a refusal (an older kernel, the user's pipe quota) changes nothing."""
    if _F_SETPIPE_SZ is None:
        return
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass


class OpenSSHAgent:
    """The host agent behind a running `ssh` (see `ssh_command`): `client` speaks to it.

    ssh runs in its own session, so a Ctrl-C on the terminal reaches only kerneldev, which ends
    the host's processes with the agent's SIGNAL frames as over paramiko; when kerneldev dies,
    ssh sees its stdin close, the agent ends, and so does ssh."""

    def __init__(self, argv: list[str]) -> None:
        """Start ssh (`OSError` when it cannot be run) and send the agent's source."""
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        assert self.process.stdin and self.process.stdout and self.process.stderr
        self._stdin = self.process.stdin.fileno()
        for fd in (self._stdin, self.process.stdout.fileno()):
            big_pipe(fd)
        self._stdout = self.process.stdout
        self._stderr = bytearray()
        self._closed = False
        self._drain = threading.Thread(target=self._drain_stderr, daemon=True, name="ssh-stderr")
        self._drain.start()
        self.client = AgentClient(self._read, self._write, shutdown=self._close_stdin)
        try:
            # The bootstrap reads the agent's source first; a request written before the
            # HELLO simply follows it (as over paramiko: `ssh.agent_channel`).
            self._write(agent_source())
        except OSError:
            pass  # ssh already ended: its stderr says why (`failure`)

    # --- the pipes ----------------------------------------------------------------------
    def _read(self, n: int) -> bytes:
        data = self._stdout.read1(n)
        if not data:
            # ssh ended: a cut connection (exit 255) is said in ssh's own words.
            try:
                self.process.wait(EXIT_GRACE)
            except subprocess.TimeoutExpired:
                return b""
            if self.process.returncode == 255 and (line := self.stderr_line()):
                raise OSError(line)
        return data

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._stdin, view) :]

    def _close_stdin(self) -> None:
        stdin = self.process.stdin
        if stdin is not None and not stdin.closed:
            stdin.close()

    def _drain_stderr(self) -> None:
        stderr = self.process.stderr
        assert stderr is not None
        while data := stderr.read1(65536):
            self._stderr += data
            del self._stderr[:-STDERR_TAIL]

    def stderr_line(self) -> str:
        """The last line ssh (or the agent's bootstrap) wrote on stderr, "" for none."""
        lines = bytes(self._stderr).decode("utf-8", "replace").strip().splitlines()
        return lines[-1].strip() if lines else ""

    def failure(self) -> str:
        """Why the agent never said HELLO: ssh's exit status and last stderr line."""
        self.close()
        self._drain.join(EXIT_GRACE)
        status = self.process.returncode
        line = self.stderr_line()
        if status == 127 and "no python3" in line:
            return "no python3 on the host"
        return line or f"ssh exited with status {status}"

    def close(self) -> None:
        """End ssh and wait for it: nothing is left behind. Its stdin is closed first (the
        agent sees EOF); the connection is not waited on to wind down (one round trip per
        command), as paramiko's `close` does not wait either: the host ends the agent when
        the connection goes."""
        if self._closed:
            return
        self._closed = True
        self._close_stdin()
        if self.process.poll() is None:
            try:
                self.process.terminate()
            except ProcessLookupError:
                pass
        self.process.wait()
        self._drain.join(EXIT_GRACE)
        for pipe in (self._stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


# ssh processes started ahead of their transport (`start_early`), by command line.
_EARLY: dict[tuple[str, ...], OpenSSHAgent] = {}


def why_not_openssh(choice: str) -> str | None:
    """Why a one-shot command is not to try OpenSSH at all (None: it is); `UsageError` for a
    $KERNELDEV_TRANSFER that is none of its values, as over paramiko."""
    if choice == "paramiko":
        return "ssh_client is paramiko"
    mode = transfer_mode()
    if mode in ("stream", "sftp"):
        return f"${TRANSFER_ENV} is {mode}"  # paths without the agent: paramiko's only
    return None


def start_early(host: HostConfig) -> None:
    """Start `host`'s ssh and its agent now, for a one-shot command that is still importing
    its CLI (~0.45 s of a 2-core machine's Python, which this C process overlaps): the
    command's transport takes it over (`take_early`) when its command line is the same (same
    host, keys, known_hosts, ssh_config, timeout); else it is ended when this process exits.
    Where OpenSSH is not to be used, nothing is started (the command decides as always)."""
    if why_not_openssh(ssh_client(host)) is not None:
        return
    from kerneldev.hosts.known_hosts_paths import known_hosts_files

    command = ssh_command(host, known_hosts_files(host.known_hosts))
    if command.argv is None or tuple(command.argv) in _EARLY:
        return
    if not _EARLY:
        atexit.register(_end_untaken)
    _EARLY[tuple(command.argv)] = OpenSSHAgent(command.argv)


def take_early(argv: list[str]) -> OpenSSHAgent | None:
    """The ssh `start_early` started with exactly `argv`, now the caller's to close."""
    return _EARLY.pop(tuple(argv), None)


def _end_untaken() -> None:
    while _EARLY:
        _EARLY.popitem()[1].close()
