"""The host over SSH (paramiko): one connection per CLI invocation, opened on first use and reused
for commands, SFTP and direct-tcpip channels (HTTP health checks through the connection).

Connection settings: explicit keys in hosts.yaml win over ~/.ssh/config (HostName, User, Port,
IdentityFile, ProxyCommand, ProxyJump), which wins over defaults. Set `KERNELDEV_SSH_CONFIG` (or
pass `ssh_config=`) to read another ssh_config file; `none` reads none.

Host keys are always verified (see `kerneldev.hostkeys`); there is no switch to turn that off.
Authentication tries, in order: the configured identity files, the ssh-agent's keys, then
~/.ssh/id_ed25519, id_ecdsa, id_rsa. Passwords are never asked for.

File hashing runs one remote command for all files: the source of `_hashfiles.py` runs under the
host's `python3` (or the configured `python`) with the patterns as JSON on stdin. A host with
no Python 3 gets a clear `TransferError`; there is no shell fallback, because a POSIX sh loop
cannot pass names with newlines through safely.
"""

from __future__ import annotations

import codecs
import errno
import json
import logging
import os
import posixpath
import secrets
import select
import shlex
import socket
import stat
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import paramiko

from kerneldev import hostkeys
from kerneldev.config import HostConfig
from kerneldev.errors import (
    ConnectionLostError,
    HostConnectionError,
    HostKeyError,
    RemoteCommandError,
    TransferError,
)
from kerneldev.transport import _hashfiles
from kerneldev.transport.base import CommandResult, OutputCallback, RemoteFile, Transport

# paramiko logs refused channels etc. as warnings; with no handler Python would print them to
# stderr next to our own messages, so they are dropped (the errors we raise say it better).
logging.getLogger("paramiko").addHandler(logging.NullHandler())

SSH_CONFIG_ENV = "KERNELDEV_SSH_CONFIG"
CONNECT_TIMEOUT = 10.0  # seconds for TCP connect, banner, key exchange and each auth step
IO_TIMEOUT = 120.0  # seconds of silence on an SFTP transfer before the host counts as gone
EXIT_GRACE = 2.0  # seconds to keep reading output after a command exited (see run())
DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")


@dataclass(frozen=True)
class SSHTarget:
    """Where and as whom to connect, after hosts.yaml and ssh_config are combined."""

    alias: str  # the name given (hosts.yaml `hostname` or a ProxyJump hop)
    hostname: str  # what is dialled
    port: int
    user: str
    identity_files: tuple[Path, ...] = ()
    explicit_identity: bool = False  # identity_file came from hosts.yaml: a missing one is an error
    proxy_command: str | None = None
    proxy_jump: str | None = None

    @property
    def address(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


# --- ssh_config ---------------------------------------------------------------------------


def ssh_config_path(explicit: str | Path | None = None) -> Path | None:
    """The ssh_config file to honour: `explicit`, $KERNELDEV_SSH_CONFIG, then ~/.ssh/config."""
    raw = str(explicit) if explicit else os.environ.get(SSH_CONFIG_ENV)
    if raw:
        return None if raw.lower() == "none" else Path(os.path.expanduser(raw))
    default = Path(os.path.expanduser("~/.ssh/config"))
    return default if default.exists() else None


def load_ssh_config(path: Path | None) -> paramiko.SSHConfig:
    if path is None:
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except FileNotFoundError:
        raise HostConnectionError(f"ssh config file not found: {path}") from None
    except Exception as err:  # noqa: BLE001 - paramiko raises several types for bad files
        raise HostConnectionError(f"cannot read ssh config file {path}: {err}") from None


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def resolve_target(
    alias: str,
    ssh_config: paramiko.SSHConfig,
    *,
    user: str | None = None,
    port: int | None = None,
    identity_file: Path | None = None,
) -> SSHTarget:
    """Combine explicit settings with what ssh_config says about `alias`."""
    try:
        found = ssh_config.lookup(alias)
    except Exception as err:  # noqa: BLE001 - e.g. an unsupported `Match` keyword
        raise HostConnectionError(f"cannot apply ssh config to {alias}: {err}") from None
    proxy_command = found.get("proxycommand")
    proxy_jump = found.get("proxyjump")
    if identity_file is not None:
        identities = (Path(os.path.expanduser(str(identity_file))),)
    else:
        identities = tuple(Path(os.path.expanduser(p)) for p in found.get("identityfile", []))
    try:
        resolved_port = port or int(found.get("port", 22))
    except ValueError:
        raise HostConnectionError(f"ssh config gives a bad Port for {alias}") from None
    return SSHTarget(
        alias=alias,
        hostname=found.get("hostname", alias),
        port=resolved_port,
        user=user or found.get("user") or _local_user(),
        identity_files=identities,
        explicit_identity=identity_file is not None,
        proxy_command=_unless_none(proxy_command),
        proxy_jump=_unless_none(proxy_jump),
    )


def _unless_none(value: str | None) -> str | None:
    return None if not value or value.lower() == "none" else value


def parse_jump(spec: str) -> tuple[str, str | None, int | None]:
    """One ProxyJump hop, `[user@]host[:port]` or `ssh://[user@]host[:port]` -> parts."""
    spec = spec.strip()
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://") :]
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    if spec.startswith("["):  # [v6addr]:port
        host, _, rest = spec[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif spec.count(":") == 1:
        host, _, p = spec.partition(":")
        port = int(p)
    else:
        host = spec
    return host, user or None, port


# --- the transport ------------------------------------------------------------------------


class SSHTransport(Transport):
    def __init__(
        self,
        host_config: HostConfig,
        *,
        ssh_config: str | Path | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        """`ssh_config`: the ssh_config file to honour (see `ssh_config_path`);
        `connect_timeout`: seconds per connection step, None for `CONNECT_TIMEOUT`."""
        if not host_config.hostname:
            raise HostConnectionError(f"host '{host_config.name}' has no hostname")
        self.host_config = host_config
        self.host_name = host_config.name
        self.connect_timeout = CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        self._ssh_config_path = ssh_config_path(ssh_config)
        self._ssh_config: paramiko.SSHConfig | None = None
        self._transport: paramiko.Transport | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._hops: list[paramiko.Transport] = []  # jump-host connections, closed with us
        self._socks: list = []  # ProxyCommand processes, closed with us

    # --- connection ---------------------------------------------------------------------
    @property
    def known_hosts_files(self) -> list[Path]:
        return hostkeys.known_hosts_files(self.host_config.known_hosts)

    @property
    def trust_path(self) -> Path:
        return hostkeys.trust_file(self.host_config.known_hosts)

    def target(self) -> SSHTarget:
        if self._ssh_config is None:
            self._ssh_config = load_ssh_config(self._ssh_config_path)
        hc = self.host_config
        return resolve_target(
            hc.hostname,
            self._ssh_config,
            user=hc.user,
            port=hc.port,
            identity_file=hc.identity_file,
        )

    def _connection(self) -> paramiko.Transport:
        if self._transport is not None:
            if self._transport.is_active():
                return self._transport
            raise self._dropped(self._transport.get_exception() or EOFError(), "idle")
        target = self.target()
        try:
            sock = self._open_socket(target)
            self._transport = self._login(target, sock)
        except BaseException:
            self.close()
            raise
        return self._transport

    def _open_socket(self, target: SSHTarget):
        """A socket-like object connected to the target's SSH port (direct, ProxyCommand, or a
        direct-tcpip channel through each ProxyJump hop in turn)."""
        if target.proxy_jump:
            via: paramiko.Transport | None = None
            for spec in target.proxy_jump.split(","):
                try:
                    host, user, port = parse_jump(spec)
                except ValueError:
                    raise HostConnectionError(
                        f"bad ProxyJump entry {spec!r} for {target.alias}",
                        hint="use [user@]host[:port], comma-separated",
                    ) from None
                hop = resolve_target(host, self._ssh_config, user=user, port=port)
                # A hop's own ProxyJump is not followed: the chain is exactly what was written.
                hop = SSHTarget(
                    alias=hop.alias,
                    hostname=hop.hostname,
                    port=hop.port,
                    user=hop.user,
                    identity_files=hop.identity_files or target.identity_files,
                    explicit_identity=False,
                )
                if via is None:
                    sock = self._dial(hop, jump_host=hop.alias)
                else:
                    sock = self._channel_to(via, hop, jump_host=hop.alias)
                via = self._login(hop, sock, jump_host=hop.alias)
                self._hops.append(via)
            return self._channel_to(via, target)
        if target.proxy_command:
            try:
                # Through sh, as OpenSSH does, so pipes and quoting in the command work.
                sock = paramiko.ProxyCommand(f"sh -c {shlex.quote(target.proxy_command)}")
            except Exception as err:  # noqa: BLE001
                raise HostConnectionError(
                    f"ProxyCommand for {target.alias} failed to start: {err}"
                ) from None
            self._socks.append(sock)
            return sock
        return self._dial(target)

    def _dial(self, target: SSHTarget, jump_host: str | None = None) -> socket.socket:
        where = f"{target.hostname}:{target.port}"
        try:
            return socket.create_connection(
                (target.hostname, target.port), timeout=self.connect_timeout
            )
        except socket.gaierror as err:
            raise HostConnectionError(
                f"cannot resolve host name '{target.hostname}' (host '{self.host_name}'): "
                f"{err.strerror}",
                hint="check `hostname` in the config (or HostName in ~/.ssh/config) and DNS",
                jump_host=jump_host,
            ) from None
        except ConnectionRefusedError:
            raise HostConnectionError(
                f"connection refused by {where} (host '{self.host_name}'): no SSH server there",
                hint="check `port` in the config and that sshd runs on the host",
                jump_host=jump_host,
            ) from None
        except TimeoutError:
            raise HostConnectionError(
                f"timed out after {self.connect_timeout:g}s connecting to {where} "
                f"(host '{self.host_name}')",
                hint="check the address, VPN and firewall",
                jump_host=jump_host,
            ) from None
        except OSError as err:
            raise HostConnectionError(
                f"cannot connect to {where} (host '{self.host_name}'): {err.strerror or err}",
                jump_host=jump_host,
            ) from None

    def _channel_to(self, via: paramiko.Transport, target: SSHTarget, jump_host: str | None = None):
        try:
            return via.open_channel(
                "direct-tcpip",
                (target.hostname, target.port),
                ("127.0.0.1", 0),
                timeout=self.connect_timeout,
            )
        except paramiko.ChannelException as err:
            raise HostConnectionError(
                f"the jump host could not reach {target.hostname}:{target.port} "
                f"(host '{self.host_name}'): {err.text}",
                jump_host=jump_host,
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise self._dropped(
                err, "opening a channel through the jump host", jump_host=jump_host
            ) from None

    def _handshake(
        self, target: SSHTarget, sock, jump_host: str | None = None
    ) -> tuple[paramiko.Transport, hostkeys.HostKeyCheck]:
        """Key exchange only (no authentication): the transport and how its key compares."""
        files = self.known_hosts_files
        name = hostkeys.known_hosts_name(target.hostname, target.port)
        t = paramiko.Transport(sock)
        t.banner_timeout = self.connect_timeout
        t.handshake_timeout = self.connect_timeout
        t.auth_timeout = self.connect_timeout
        preferred = hostkeys.preferred_key_types(files, name)
        if preferred:
            options = t.get_security_options()
            supported = list(options.key_types)
            first = [k for k in preferred if k in supported]
            options.key_types = first + [k for k in supported if k not in first]
        try:
            t.start_client(timeout=self.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as err:
            t.close()
            raise HostConnectionError(
                f"SSH handshake with {target.hostname}:{target.port} failed "
                f"(host '{self.host_name}'): {_describe(err)}",
                hint="is this an SSH server? check the port, ProxyCommand and the network",
                jump_host=jump_host,
            ) from None
        if not (t.is_active() and t.initial_kex_done):
            # start_client returns quietly when its timeout passes mid-negotiation.
            t.close()
            raise HostConnectionError(
                f"SSH handshake with {target.hostname}:{target.port} timed out after "
                f"{self.connect_timeout:g}s (host '{self.host_name}')",
                hint="is this an SSH server? check the port, ProxyCommand and the network",
                jump_host=jump_host,
            )
        return t, hostkeys.check_key(files, name, t.get_remote_server_key())

    def _login(self, target: SSHTarget, sock, jump_host: str | None = None) -> paramiko.Transport:
        """Handshake, verify the host key, authenticate. `jump_host` names a ProxyJump hop."""
        t, check = self._handshake(target, sock, jump_host)
        if check.status != "trusted":
            t.close()
            # The refusal carries `check`, so `kerneldev trust` can offer this key.
            raise hostkeys.refusal(check, self.host_name, self.trust_path, jump_host=jump_host)
        self._authenticate(t, target, jump_host)
        t.set_keepalive(15)
        return t

    def _authenticate(
        self, t: paramiko.Transport, target: SSHTarget, jump_host: str | None = None
    ) -> None:
        keys: list[tuple[str, paramiko.PKey]] = []
        notes: list[str] = []
        seen: set[Path] = set()

        def load(path: Path, explicit: bool) -> None:
            seen.add(path)
            if not path.exists():
                if explicit:
                    raise HostConnectionError(
                        f"identity_file {path} does not exist (host '{self.host_name}')",
                        hint="fix `identity_file` in the config",
                        jump_host=jump_host,
                    )
                return
            try:
                keys.append((str(path), paramiko.PKey.from_path(path)))
            except paramiko.PasswordRequiredException:
                notes.append(f"{path} is passphrase-protected: add it to ssh-agent")
            except (paramiko.SSHException, ValueError, OSError) as err:
                notes.append(f"{path} cannot be loaded: {err}")

        for path in target.identity_files:
            load(path, target.explicit_identity)
        agent = None
        try:
            agent = paramiko.Agent()
            keys += [(f"agent key {hostkeys.fingerprint(k)}", k) for k in agent.get_keys()]
        except paramiko.SSHException:
            pass
        for name in DEFAULT_KEYS:
            path = Path(os.path.expanduser(f"~/.ssh/{name}"))
            if path not in seen:
                load(path, False)

        tried: list[str] = []
        try:
            for label, key in keys:
                try:
                    t.auth_publickey(target.user, key)
                except paramiko.BadAuthenticationType as err:
                    if "publickey" not in err.allowed_types:
                        raise HostConnectionError(
                            f"{target.address} does not accept public keys "
                            f"(allowed: {', '.join(err.allowed_types)})",
                            hint="kerneldev logs in with keys only; set up key login for this user",
                            jump_host=jump_host,
                        ) from None
                    tried.append(label)
                except paramiko.AuthenticationException:
                    tried.append(label)
                except (paramiko.SSHException, EOFError, OSError) as err:
                    if not t.is_active():  # e.g. the server's MaxAuthTries cut us off
                        tried.append(label)
                        break
                    notes.append(f"{label}: {_describe(err)}")
                if t.is_authenticated():
                    return
        finally:
            if agent is not None:
                agent.close()
        t.close()
        detail = f"tried {', '.join(tried)}" if tried else "no usable key found"
        if notes:
            detail += "; " + "; ".join(notes)
        raise HostConnectionError(
            f"authentication failed for {target.address} (host '{self.host_name}'): {detail}",
            hint="check `user` and `identity_file` in the config, or load the key into "
            "ssh-agent; `ssh -i KEY user@host` should work",
            jump_host=jump_host,
        )

    def scan_host_key(self) -> hostkeys.HostKeyCheck:
        """Connect far enough to see the host key (no login to the target) and compare it with
        known_hosts. With ProxyJump, an untrusted jump host's key is returned instead, since
        that one has to be trusted first."""
        target = self.target()
        try:
            sock = self._open_socket(target)
        except HostKeyError as err:
            self.close()
            if err.check is None:
                raise
            return err.check
        try:
            t, check = self._handshake(target, sock)
            t.close()
            return check
        finally:
            self.close()

    def trust(self, check: hostkeys.HostKeyCheck) -> Path:
        """Record an *unknown* key from `scan_host_key` in the configured known_hosts."""
        if check.status != "unknown" or check.key is None:
            raise hostkeys.refusal(check, self.host_name, self.trust_path)
        hostkeys.add_known_host(self.trust_path, check.name, check.key)
        return self.trust_path

    def close(self) -> None:
        for closable in (self._sftp, self._transport, *reversed(self._hops), *self._socks):
            if closable is None:
                continue
            try:
                closable.close()
            except Exception:  # noqa: BLE001, S110 - closing a dead connection may fail
                pass
        self._sftp = None
        self._transport = None
        self._hops = []
        self._socks = []

    def _dropped(
        self, err: BaseException, doing: str, jump_host: str | None = None
    ) -> ConnectionLostError:
        return ConnectionLostError(
            f"the connection to host '{self.host_name}' was lost while {doing}: {_describe(err)}",
            hint="check that the host is up and the network is stable, then run the command "
            "again (file writes are atomic: a target is either old or new)",
            jump_host=jump_host,
        )

    # --- commands -----------------------------------------------------------------------
    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        on_output: OutputCallback | None = None,
    ) -> CommandResult:
        t = self._connection()
        try:
            chan = t.open_session(timeout=self.connect_timeout)
            # The login shell gets `sh -c '<command>'`, so the command means the same whatever
            # the user's shell is.
            chan.exec_command(f"sh -c {shlex.quote(command)}")
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise self._dropped(err, f"starting `{command}`") from None
        if stdin is None:
            chan.shutdown_write()
        else:
            # A thread, so a command that does not read its input cannot block the timeout.
            threading.Thread(target=_feed_channel, args=(chan, stdin), daemon=True).start()

        out, errs = _Collector(on_output), _Collector(None)
        deadline = time.monotonic() + timeout if timeout is not None else None
        exited_at: float | None = None
        try:
            while True:
                wait = 0.5
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        # Closing the channel is all SSH offers without a pty: the command
                        # loses its pipes (and dies on its next write) but gets no signal.
                        chan.close()
                        raise RemoteCommandError(
                            f"command timed out after {timeout:g}s on {self.host_name}: {command}",
                            result=CommandResult(command, -1, out.text(), errs.text()),
                        )
                    wait = min(wait, left)
                if chan.eof_received or chan.closed:
                    # The output pipe is at EOF and always "readable"; wait on the status.
                    chan.status_event.wait(wait)
                else:
                    select.select([chan], [], [], wait)
                while chan.recv_ready():
                    out.add(chan.recv(65536))
                while chan.recv_stderr_ready():
                    errs.add(chan.recv_stderr(65536))
                if not chan.exit_status_ready():
                    continue
                if chan.closed or chan.eof_received:
                    if chan.recv_ready() or chan.recv_stderr_ready():
                        continue
                    break
                # Exited, but a background process it started still holds the output open
                # (a restart command launching a daemon): read what is there, do not wait
                # for that process.
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > EXIT_GRACE:
                    break
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise self._dropped(err, f"running `{command}`") from None
        status = chan.exit_status
        chan.close()
        if status == -1:
            if not t.is_active():
                raise self._dropped(t.get_exception() or EOFError(), f"running `{command}`")
            status = 255  # killed by a signal (paramiko does not report exit-signal), as ssh does
        return CommandResult(command, status, out.text(), errs.text())

    # --- files --------------------------------------------------------------------------
    def hash_files(self, root: str, patterns: list[str]) -> tuple[list[RemoteFile], list[str]]:
        command = hash_command(["python3", self.host_config.python])
        request = json.dumps({"root": root, "patterns": list(patterns)}).encode("utf-8")
        result = self.run(command, stdin=request)
        if result.exited == 127 and "no python3" in result.stderr:
            raise TransferError(
                f"cannot hash files on {self.host_name}: no python3 on the host",
                hint="kerneldev hashes all files in one remote command with python3; install "
                "it on the host, or set `python:` in the config to a Python 3 interpreter",
            )
        if not result.ok:
            tail = result.stderr.strip().splitlines()[-1:] or ["no error output"]
            raise TransferError(
                f"hashing files under {root} on {self.host_name} failed "
                f"(exit {result.exited}): {tail[0]}"
            )
        try:
            data = json.loads(result.stdout)
            files = [RemoteFile(**f) for f in data["files"]]
        except (ValueError, KeyError, TypeError) as err:
            raise TransferError(
                f"hashing files on {self.host_name} gave unreadable output: {err}"
            ) from None
        return files, list(data["unmatched"])

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            t = self._connection()
            try:
                self._sftp = paramiko.SFTPClient.from_transport(t)
            except (paramiko.SSHException, EOFError, OSError) as err:
                raise HostConnectionError(
                    f"cannot start SFTP on host '{self.host_name}': {_describe(err)}",
                    hint="the host's sshd needs the sftp subsystem enabled",
                ) from None
            self._sftp.get_channel().settimeout(IO_TIMEOUT)
        return self._sftp

    def _file_error(self, err: BaseException, path: str, doing: str) -> Exception:
        alive = self._transport is not None and self._transport.is_active()
        if (
            not alive
            or isinstance(err, (EOFError, paramiko.SSHException, socket.timeout))
            or not isinstance(err, OSError)
        ):
            return self._dropped(err, f"{doing} {path}")
        if err.errno == errno.ENOENT:
            return TransferError(f"{path}: no such file on {self.host_name}")
        return TransferError(f"cannot {doing} {path} on {self.host_name}: {_describe(err)}")

    def read_bytes(self, path: str) -> bytes:
        sftp = self._sftp_client()
        try:
            with sftp.open(path, "rb") as f:
                st = f.stat()
                if not stat.S_ISREG(st.st_mode or 0):
                    raise TransferError(f"{path} on {self.host_name} is not a regular file")
                f.prefetch(st.st_size)  # pipelined reads: one round trip's latency, not many
                return f.read()
        except TransferError:
            raise
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, path, "read") from None

    def write_atomic(self, path: str, data: bytes, mode: int | None = None) -> None:
        sftp = self._sftp_client()
        path = self._follow_symlink(sftp, path)
        folder, name = posixpath.split(path)
        self.mkdirs(folder)
        owner: tuple[int, int] | None = None
        try:
            old = sftp.stat(path)
            owner = (old.st_uid, old.st_gid)
            if mode is None:
                mode = stat.S_IMODE(old.st_mode)
        except FileNotFoundError:
            if mode is None:
                mode = 0o644
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, path, "stat") from None
        tmp = posixpath.join(folder, f".{name}.kerneldev-tmp-{secrets.token_hex(6)}")
        try:
            # "x": exclusive create, never through something already at the temporary name.
            with sftp.open(tmp, "wbx") as f:
                f.chmod(mode)  # before any bytes land, so a private file is never readable
                if owner is not None:
                    _keep_owner(f, owner)
                f.set_pipelined(True)
                f.write(data)
            self._rename_over(sftp, tmp, path)
        except BaseException as err:
            try:
                sftp.remove(tmp)
            except Exception:  # noqa: BLE001, S110 - best effort; the connection may be gone
                pass
            if isinstance(err, (OSError, EOFError, paramiko.SSHException)):
                raise self._file_error(err, path, "write") from None
            raise

    def _rename_over(self, sftp: paramiko.SFTPClient, tmp: str, path: str) -> None:
        # posix-rename@openssh.com replaces the target in one step (plain SFTP rename refuses
        # to overwrite). Servers without that extension get `mv -f`, which is rename(2) too,
        # as both names are in the same folder.
        try:
            sftp.posix_rename(tmp, path)
            return
        except OSError as err:
            if err.errno is not None or "unsupported" not in str(err).lower():
                raise
        result = self.run(f"mv -f -- {shlex.quote(tmp)} {shlex.quote(path)}")
        if not result.ok:
            raise TransferError(f"cannot write {path} on {self.host_name}: {result.stderr.strip()}")

    def _follow_symlink(self, sftp: paramiko.SFTPClient, path: str) -> str:
        # Write through a symlink to its target (as hash_files reads through it), rather
        # than replacing the link with a plain file.
        try:
            if stat.S_ISLNK(sftp.lstat(path).st_mode or 0):
                return sftp.normalize(path)
        except FileNotFoundError:
            pass
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, path, "stat") from None
        return path

    def exists(self, path: str) -> bool:
        sftp = self._sftp_client()
        try:
            sftp.lstat(path)
            return True
        except FileNotFoundError:
            return False
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, path, "stat") from None

    def mkdirs(self, path: str) -> None:
        sftp = self._sftp_client()
        try:
            if stat.S_ISDIR(sftp.stat(path).st_mode or 0):
                return
            raise TransferError(f"{path} on {self.host_name} exists and is not a folder")
        except FileNotFoundError:
            pass
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, path, "stat") from None
        parent = posixpath.dirname(path.rstrip("/"))
        if parent and parent != path:
            self.mkdirs(parent)
        try:
            sftp.mkdir(path)
        except OSError as err:
            # Lost a race with another writer creating it: fine if it is a folder now.
            try:
                if stat.S_ISDIR(sftp.stat(path).st_mode or 0):
                    return
            except OSError:
                pass
            raise self._file_error(err, path, "create folder") from None
        except (EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, path, "create folder") from None

    def remove(self, path: str) -> None:
        if not path.startswith("/") or posixpath.normpath(path) == "/":
            raise TransferError(f"refusing to remove {path!r} on {self.host_name}")
        result = self.run(f"rm -rf -- {shlex.quote(path)}")
        if not result.ok:
            raise TransferError(
                f"cannot remove {path} on {self.host_name}: {result.stderr.strip()}"
            )

    # --- network ------------------------------------------------------------------------
    def http_get(self, url: str, timeout: float = 5.0) -> int:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme == "https":
            return self._https_get_with_curl(url, timeout)
        if parts.scheme != "http" or not parts.hostname:
            raise HostConnectionError(f"cannot GET {url}: only http:// and https:// URLs work")
        port = parts.port or 80
        target = f"{parts.hostname}:{port}"
        t = self._connection()
        try:
            chan = t.open_channel(
                "direct-tcpip", (parts.hostname, port), ("127.0.0.1", 0), timeout=timeout
            )
        except paramiko.ChannelException as err:
            raise HostConnectionError(
                f"GET {url}: nothing answers at {target} on host '{self.host_name}' ({err.text})"
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as err:
            if not t.is_active():
                raise self._dropped(err, f"opening a channel for GET {url}") from None
            raise HostConnectionError(f"GET {url}: {_describe(err)}") from None
        try:
            chan.settimeout(timeout)
            path = parts.path or "/"
            if parts.query:
                path += "?" + parts.query
            request = (
                f"GET {path} HTTP/1.0\r\nHost: {parts.netloc}\r\n"
                f"User-Agent: kerneldev\r\nConnection: close\r\n\r\n"
            )
            chan.sendall(request.encode("latin-1"))
            buf = b""
            while b"\r\n" not in buf and len(buf) < 8192:
                chunk = chan.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except TimeoutError:
            raise HostConnectionError(f"GET {url}: no answer within {timeout:g}s") from None
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise HostConnectionError(f"GET {url}: {_describe(err)}") from None
        finally:
            chan.close()
        status_line = buf.split(b"\r\n", 1)[0].decode("latin-1")
        fields = status_line.split()
        if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
            raise HostConnectionError(
                f"GET {url}: not an HTTP answer ({status_line[:60]!r})"
                if status_line
                else f"GET {url}: the connection closed without an answer"
            )
        return int(fields[1])

    def _https_get_with_curl(self, url: str, timeout: float) -> int:
        # TLS is not spoken through the channel; the host's own curl does it.
        result = self.run(
            f"curl -s -o /dev/null -w '%{{http_code}}' --max-time {timeout:g} "
            f"-- {shlex.quote(url)}",
            timeout=timeout + 10,
        )
        if result.exited == 127:
            raise HostConnectionError(
                f"GET {url}: https health checks need curl on host '{self.host_name}'",
                hint="install curl on the host, or use an http:// URL or a shell command",
            )
        code = result.stdout.strip()
        if not code.isdigit() or code == "000":
            raise HostConnectionError(f"GET {url}: no answer (curl exit {result.exited})")
        return int(code)


# --- helpers ------------------------------------------------------------------------------


class _Collector:
    """Decodes a byte stream as UTF-8 across chunk boundaries; optionally streams it on."""

    def __init__(self, on_output: OutputCallback | None) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.parts: list[str] = []
        self.on_output = on_output

    def add(self, data: bytes) -> None:
        text = self.decoder.decode(data)
        if text:
            self.parts.append(text)
            if self.on_output:
                self.on_output(text)

    def text(self) -> str:
        tail = self.decoder.decode(b"", final=True)
        if tail:
            self.parts.append(tail)
        return "".join(self.parts)


def _keep_owner(f: paramiko.SFTPFile, owner: tuple[int, int]) -> None:
    """Give the new file the replaced file's owner when it differs (a service user's repo
    edited as root); only root may do that, so a refusal is not an error."""
    current = f.stat()
    if (current.st_uid, current.st_gid) == owner:
        return
    try:
        f.chown(*owner)
    except PermissionError:
        pass


def _feed_channel(chan: paramiko.Channel, data: bytes) -> None:
    try:
        chan.sendall(data)
        chan.shutdown_write()
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the command closed its input or the connection went; run() reports the latter


def hash_command(pythons: list[str]) -> str:
    """The one shell command that hashes files on the host: the first interpreter of `pythons`
    found runs `_hashfiles.py` (request as JSON on stdin); none found -> exit 127."""
    candidates = " ".join(shlex.quote(p) for p in dict.fromkeys(pythons))
    script = shlex.quote(_hash_script())
    return (
        f"for p in {candidates}; do "
        f'if command -v "$p" >/dev/null 2>&1; then PYTHONUTF8=1 exec "$p" -c {script}; fi; '
        f"done; echo 'kerneldev: no python3 on the host' >&2; exit 127"
    )


_SCRIPT: str | None = None


def _hash_script() -> str:
    global _SCRIPT
    if _SCRIPT is None:
        _SCRIPT = Path(_hashfiles.__file__).read_text(encoding="utf-8")
    return _SCRIPT


def _describe(err: BaseException) -> str:
    text = str(err).strip()
    if isinstance(err, EOFError) or not text:
        return (
            "the server closed the connection" if isinstance(err, EOFError) else type(err).__name__
        )
    return text
