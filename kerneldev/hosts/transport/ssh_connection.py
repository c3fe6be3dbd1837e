"""Connecting to a host over SSH (paramiko): everything up to a logged-in connection.

`SSHConnection` works out where and as whom to connect (explicit keys in hosts.yaml win over
~/.ssh/config's HostName, User, Port, IdentityFile, ProxyCommand and ProxyJump, which win over
defaults; `KERNELDEV_SSH_CONFIG` or `ssh_config=` names another ssh_config file, `none` reads
none), dials the host directly, through a ProxyCommand or through each ProxyJump hop in turn,
verifies every host key on the way (see `kerneldev.hosts.hostkeys`; there is no switch to turn that
off), and authenticates. It opens on first use, keeps the connection and its SFTP session for
reuse, and closes them all (with the hops and ProxyCommand processes) in `close()`.

Authentication tries, in order: the configured identity files, the ssh-agent's keys, then
~/.ssh/id_ed25519, id_ecdsa, id_rsa. Passwords are never asked for.

What is done over the connection (commands, files, HTTP) is `kerneldev.hosts.transport.ssh`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from kerneldev.config import HostConfig
from kerneldev.errors import ConnectionLostError, HostConnectionError, HostKeyError
from kerneldev.hosts import hostkeys
from kerneldev.hosts.sshlib import allow_match_exec, paramiko

# Re-exported: defined here before (the OpenSSH path shares them without paramiko).
from kerneldev.hosts.transport.ssh_config_file import (
    CONNECT_TIMEOUT as CONNECT_TIMEOUT,
)
from kerneldev.hosts.transport.ssh_config_file import (
    DEFAULT_KEYS as DEFAULT_KEYS,
)
from kerneldev.hosts.transport.ssh_config_file import (
    SSH_CONFIG_ENV as SSH_CONFIG_ENV,
)
from kerneldev.hosts.transport.ssh_config_file import ssh_config_path as ssh_config_path
from kerneldev.local_user import local_user

# paramiko logs refused channels etc. as warnings; with no handler Python would print them to
# stderr next to our own messages, so they are dropped (the errors we raise say it better).
logging.getLogger("paramiko").addHandler(logging.NullHandler())

IO_TIMEOUT = 120.0  # seconds of silence on an SFTP transfer before the host counts as gone
_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE | re.MULTILINE)


class QuickAckSocket(socket.socket):
    """The dialled socket, acknowledging what it reads at once (TCP_QUICKACK after each read).

    sshd leaves Nagle's algorithm on for a session without a terminal: a small packet it
    writes waits for our ACK of the one before, and Linux delays that ACK by up to 40 ms
    while it expects to send it with data of ours. Right after authentication sshd writes
    two packets unasked (its host keys, and more) and then the confirmation of our channel
    open, on which our exec request waits: ~40 ms of every one-shot command (and of every
    holder's start and reconnect) went there, measured with strace on both sides
    (docs/benchmarks.md, issue 23, 2026-12-02). Linux drops quick-ACK mode again on its own,
    so it is re-armed after every read; paramiko reads only through `recv`."""

    @classmethod
    def wrap(cls, sock: socket.socket) -> socket.socket:
        if not hasattr(socket, "TCP_QUICKACK"):
            return sock  # not Linux: its delayed ACKs are another matter
        timeout = sock.gettimeout()
        quick = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        quick.settimeout(timeout)
        return quick

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        with contextlib.suppress(OSError):
            self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return data


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


def load_ssh_config(path: Path | None) -> paramiko.SSHConfig:
    if path is None:
        return paramiko.SSHConfig()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
        if _MATCH_EXEC.search(text):
            allow_match_exec()
        return paramiko.SSHConfig.from_text(text)
    except FileNotFoundError:
        raise HostConnectionError(f"ssh config file not found: {path}") from None
    except Exception as err:  # noqa: BLE001 - paramiko raises several types for bad files
        raise HostConnectionError(f"cannot read ssh config file {path}: {err}") from None


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
        user=user or found.get("user") or local_user(),
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


# --- the connection -----------------------------------------------------------------------


MAX_DOING = 100  # characters of a failed step quoted in a connection-lost error


class SSHConnection:
    """One logged-in SSH connection to a configured host (opened lazily; a context manager)."""

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
        self.hops: list[paramiko.Transport] = []  # jump-host connections, closed with us
        self.proxy_commands: list = []  # ProxyCommand processes, closed with us
        self.authenticated_with: str | None = None  # the key that logged in (for doctor)

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

    def current_transport(self) -> paramiko.Transport | None:
        """The logged-in transport as it is (None before the first login), without the
        reconnect `transport()` makes: what a liveness check asks for a reply."""
        return self._transport

    def is_active(self) -> bool:
        """Connected, and the connection still up."""
        return self._transport is not None and self._transport.is_active()

    def transport(self) -> paramiko.Transport:
        """The logged-in connection to the host, opened on the first call and reused;
        `ConnectionLostError` once it has dropped (reconnecting silently could run half an
        operation twice)."""
        if self._transport is not None:
            if self._transport.is_active():
                return self._transport
            raise self.dropped(self._transport.get_exception() or EOFError(), "idle")
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
                self.hops.append(via)
            return self._channel_to(via, target)
        if target.proxy_command:
            try:
                # Through sh, as OpenSSH does, so pipes and quoting in the command work; and
                # with `exec`, as OpenSSH does, so that the command replaces sh: closing kills
                # the command itself, where it used to kill only sh and leave the command running.
                command = shlex.quote(f"exec {target.proxy_command}")
                sock = paramiko.ProxyCommand(f"sh -c {command}")
            except Exception as err:  # noqa: BLE001
                raise HostConnectionError(
                    f"ProxyCommand for {target.alias} failed to start: {err}"
                ) from None
            self.proxy_commands.append(sock)
            return sock
        return self._dial(target)

    def _dial(self, target: SSHTarget, jump_host: str | None = None) -> socket.socket:
        where = f"{target.hostname}:{target.port}"
        try:
            sock = socket.create_connection(
                (target.hostname, target.port), timeout=self.connect_timeout
            )
        except (socket.gaierror, UnicodeError) as err:
            # UnicodeError: the name cannot even be encoded for DNS (an empty label, `a..b`,
            # or one over 63 characters).
            why = err.strerror if isinstance(err, socket.gaierror) else "not a valid DNS name"
            raise HostConnectionError(
                f"cannot resolve host name '{target.hostname}' (host '{self.host_name}'): {why}",
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
        # paramiko writes a request of several SSH packets in several sends; with Nagle's
        # algorithm on, the second waits for the ACK of the first, which sshd (nothing to
        # answer yet) delays by ~40 ms: measured on a kept no-op on loopback (2026-12-02).
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return QuickAckSocket.wrap(sock)

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
            raise self.dropped(
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
                f"(host '{self.host_name}'): {describe_error(err)}",
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
                    notes.append(f"{label}: {describe_error(err)}")
                if t.is_authenticated():
                    if jump_host is None:
                        self.authenticated_with = label
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

    def sftp(self) -> paramiko.SFTPClient:
        """The SFTP session on this connection, started on the first call and reused."""
        if self._sftp is None:
            t = self.transport()
            try:
                self._sftp = paramiko.SFTPClient.from_transport(t)
            except (paramiko.SSHException, EOFError, OSError) as err:
                raise HostConnectionError(
                    f"cannot start SFTP on host '{self.host_name}': {describe_error(err)}",
                    hint="the host's sshd needs the sftp subsystem enabled",
                ) from None
            self._sftp.get_channel().settimeout(IO_TIMEOUT)
        return self._sftp

    def close(self) -> None:
        for closable in (self._sftp, self._transport, *reversed(self.hops), *self.proxy_commands):
            if closable is None:
                continue
            try:
                closable.close()
            except Exception:  # noqa: BLE001, S110 - closing a dead connection may fail
                pass
        self._sftp = None
        self._transport = None
        self.hops = []
        self.proxy_commands = []

    def __enter__(self) -> SSHConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def dropped(
        self, err: BaseException, doing: str, jump_host: str | None = None
    ) -> ConnectionLostError:
        """The error for a connection that went away while `doing` something."""
        # `doing` may quote a whole remote script (the lock, a hashing loop): its start is enough.
        first = doing.split("\n", 1)[0]
        if first != doing or len(first) > MAX_DOING:
            doing = first[:MAX_DOING] + " ..." + ("`" if doing.endswith("`") else "")
        return ConnectionLostError(
            f"the connection to host '{self.host_name}' was lost while {doing}: "
            f"{describe_error(err)}",
            hint="check that the host is up and the network is stable, then run the command "
            "again (file writes are atomic: a target is either old or new)",
            jump_host=jump_host,
        )


# --- helpers ------------------------------------------------------------------------------


def describe_error(err: BaseException) -> str:
    """A short reason for a socket or paramiko error, for messages."""
    text = str(err).strip().rstrip(":").strip()  # paramiko: "Server connection dropped: "
    if isinstance(err, EOFError) or not text:
        return (
            "the server closed the connection" if isinstance(err, EOFError) else type(err).__name__
        )
    return text
