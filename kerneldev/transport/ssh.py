"""The host over SSH: commands, files and HTTP, all over one connection per CLI invocation.

The connection itself (ssh_config, ProxyJump / ProxyCommand, host keys, authentication) is
`kerneldev.transport.ssh_connection.SSHConnection`; `SSHTransport` opens it on first use and
runs everything through it: commands in `sh -c` sessions, files over its SFTP session (writes
to a temporary name, then a rename), HTTP health checks over direct-tcpip channels (so the
service's port need not be reachable from here).

File hashing runs one remote command for all files: the source of `_hashfiles.py` runs under the
host's `python3` (or the configured `python`) with the patterns as JSON on stdin. A host with
no Python 3 gets a clear `TransferError`; there is no shell fallback, because a POSIX sh loop
cannot pass names with newlines through safely.
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import json
import posixpath
import secrets
import select
import shlex
import socket
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import paramiko

from kerneldev import interrupt
from kerneldev.config import HostConfig
from kerneldev.errors import (
    ConnectionLostError,
    HostConnectionError,
    RemoteCommandError,
    TransferError,
)
from kerneldev.transport import _hashfiles
from kerneldev.transport.base import (
    CHUNK,
    TEMP_MARK,
    ByteCallback,
    CommandResult,
    OutputCallback,
    RemoteFile,
    Transport,
)
from kerneldev.transport.ssh_connection import (
    CONNECT_TIMEOUT,
    DEFAULT_KEYS,
    IO_TIMEOUT,
    SSH_CONFIG_ENV,
    SSHConnection,
    SSHTarget,
    describe_error,
    load_ssh_config,
    parse_jump,
    resolve_target,
    ssh_config_path,
)

# The connecting side's names stay importable from here, as before the split.
__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_KEYS",
    "IO_TIMEOUT",
    "SSH_CONFIG_ENV",
    "SSHConnection",
    "SSHTarget",
    "SSHTransport",
    "hash_command",
    "load_ssh_config",
    "parse_jump",
    "resolve_target",
    "ssh_config_path",
]

EXIT_GRACE = 2.0  # seconds to keep reading output after a command exited (see run())
SMALL_FILE = 4 << 20  # bytes up to which file_sha256 reads through SFTP instead of hashing there
_PID_MARK = "kerneldev-pid="
# Runs `sh -c <command>` after naming its pid on stderr; the command keeps that pid (exec).
_PID_PREAMBLE = f"printf '{_PID_MARK}%s\\n' $$ >&2; exec sh -c "


class SSHTransport(Transport):
    def __init__(self, host: HostConfig | SSHConnection) -> None:
        """Work over `host`'s connection: an `SSHConnection` (made with the ssh_config file or
        timeout to use), or a host config, connected with the defaults."""
        self.connection = host if isinstance(host, SSHConnection) else SSHConnection(host)
        self.host_config = self.connection.host_config
        self.host_name = self.connection.host_name

    def close(self) -> None:
        self.connection.close()

    # The connection's parts as this class uses them (opened on first use).
    def _connection(self) -> paramiko.Transport:
        return self.connection.transport()

    def _sftp_client(self) -> paramiko.SFTPClient:
        return self.connection.sftp()

    def _dropped(self, err: BaseException, doing: str) -> ConnectionLostError:
        return self.connection.dropped(err, doing)

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
            chan = t.open_session(timeout=self.connection.connect_timeout)
            # The login shell gets `sh -c '<command>'`, so the command means the same whatever
            # the user's shell is. It first names its pid on stderr (stripped from the output),
            # so an interrupt can end the command's process group on the host.
            chan.exec_command(f"sh -c {shlex.quote(_PID_PREAMBLE + shlex.quote(command))}")
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise self._dropped(err, f"starting `{command}`") from None
        if stdin is None:
            chan.shutdown_write()
        else:
            # A thread, so a command that does not read its input cannot block the timeout.
            threading.Thread(target=_feed_channel, args=(chan, stdin), daemon=True).start()

        out, errs = _Collector(on_output), _PidStrippingCollector()
        deadline = time.monotonic() + timeout if timeout is not None else None
        exited_at: float | None = None
        try:
            while True:
                if interrupt.requested():
                    self._end_remote(errs.pid)
                    chan.close()
                    interrupt.check()
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
                lost = t.get_exception() or EOFError()
                raise self._dropped(lost, f"running `{command}`")
            status = 255  # killed by a signal (paramiko does not report exit-signal), as ssh does
        return CommandResult(command, status, out.text(), errs.text())

    def _end_remote(self, pid: int | None) -> None:
        """End the process group of an interrupted command on the host: SIGTERM, then SIGKILL
        after 2 s. Best effort; a gone connection means sshd has closed its pipes anyway."""
        if pid is None:
            return
        # No `--` after kill: dash's builtin reads it as a pid. "-N" after the signal name is
        # the process group N.
        script = (
            f"pg=$(ps -o pgid= -p {pid} 2>/dev/null | tr -d ' '); "
            f"t=${{pg:+-$pg}}; t=${{t:-{pid}}}; "
            'kill -TERM "$t" 2>/dev/null || exit 0; i=0; while [ $i -lt 10 ]; do '
            'kill -0 "$t" 2>/dev/null || exit 0; sleep 0.2; i=$((i+1)); done; '
            'kill -KILL "$t" 2>/dev/null; exit 0'
        )
        with interrupt.shield():
            try:
                self.run(script, timeout=10)
            except Exception:  # noqa: BLE001, S110 - best effort on a possibly dead connection
                pass

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

    def _file_error(self, err: BaseException, path: str, doing: str) -> Exception:
        alive = self.connection.is_active()
        if (
            not alive
            or isinstance(err, (EOFError, paramiko.SSHException, socket.timeout))
            or not isinstance(err, OSError)
        ):
            return self._dropped(err, f"{doing} {path}")
        if err.errno == errno.ENOENT:
            return TransferError(f"{path}: no such file on {self.host_name}")
        return TransferError(f"cannot {doing} {path} on {self.host_name}: {describe_error(err)}")

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

    def put_file(
        self,
        path: str,
        source: BinaryIO,
        *,
        mode: int | None = None,
        on_bytes: ByteCallback | None = None,
        before_rename: Callable[[], None] | None = None,
    ) -> None:
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
        tmp = posixpath.join(folder, f".{name}{TEMP_MARK}{secrets.token_hex(6)}")
        try:
            # "x": exclusive create, never through something already at the temporary name.
            with sftp.open(tmp, "wbx") as f:
                f.chmod(mode)  # before any bytes land, so a private file is never readable
                if owner is not None:
                    _keep_owner(f, owner)
                f.set_pipelined(True)
                # Chunks, checking for Ctrl-C between them: memory stays bounded and an
                # interrupt lands between SFTP requests, never inside one.
                for chunk in iter(lambda: source.read(CHUNK), b""):
                    interrupt.check()
                    f.write(chunk)
                    if on_bytes:
                        on_bytes(len(chunk))
            interrupt.check()
            if before_rename is not None:
                before_rename()
            self._rename_over(sftp, tmp, path)
        except BaseException as err:
            with interrupt.shield():
                try:
                    sftp.remove(tmp)
                except Exception:  # noqa: BLE001, S110 - best effort; the connection may be gone
                    pass
            if isinstance(err, (OSError, EOFError, paramiko.SSHException)):
                raise self._file_error(err, path, "write") from None
            raise

    def rename(self, src: str, dst: str) -> None:
        sftp = self._sftp_client()
        try:
            self._rename_over(sftp, src, dst)
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, dst, "rename onto") from None

    def file_sha256(self, path: str) -> str | None:
        # Small files are read through SFTP in chunks (no process to start on the host);
        # big ones are hashed on the host, so their bytes do not cross the network again.
        sftp = self._sftp_client()
        try:
            st = sftp.stat(path)
        except FileNotFoundError:
            return None
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, path, "stat") from None
        if not stat.S_ISREG(st.st_mode or 0) or (st.st_size or 0) > SMALL_FILE:
            return super().file_sha256(path)
        digest = hashlib.sha256()
        try:
            with sftp.open(path, "rb") as f:
                f.prefetch(st.st_size)
                for chunk in iter(lambda: f.read(CHUNK), b""):  # noqa: B023
                    digest.update(chunk)
        except FileNotFoundError:
            return None
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, path, "read") from None
        return digest.hexdigest()

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
            raise HostConnectionError(f"GET {url}: {describe_error(err)}") from None
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
            raise HostConnectionError(f"GET {url}: {describe_error(err)}") from None
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


class _PidStrippingCollector(_Collector):
    """stderr of a command run with `_PID_PREAMBLE`: the first line names the pid and is not
    part of the command's output."""

    def __init__(self) -> None:
        super().__init__(None)
        self.pid: int | None = None
        self._head: bytes | None = b""  # None once the pid line is consumed

    def add(self, data: bytes) -> None:
        if self._head is not None:
            self._head += data
            if b"\n" not in self._head:
                if len(self._head) < 64:
                    return
                data, self._head = self._head, None
            else:
                line, rest = self._head.split(b"\n", 1)
                self._head = None
                text = line.decode("ascii", "replace")
                if text.startswith(_PID_MARK) and text[len(_PID_MARK) :].isdigit():
                    self.pid = int(text[len(_PID_MARK) :])
                    data = rest
                else:
                    data = line + b"\n" + rest
        if data:
            super().add(data)

    def text(self) -> str:
        if self._head:  # the command ended before the pid line was complete
            head, self._head = self._head, None
            super().add(head)
        return super().text()


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
