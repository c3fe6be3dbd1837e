"""The host over SSH: commands, files and HTTP, all over one connection per CLI invocation.

The connection itself (ssh_config, ProxyJump / ProxyCommand, host keys, authentication) is
`kerneldev.hosts.transport.ssh_connection.SSHConnection`; `SSHTransport` opens it on first use and
runs everything through it. By default it starts the host agent (`hostside/agent.py`) on one
exec channel, the connection's only login shell, and every later step is a request to it
(`over_agent.AgentTransport`); HTTP health checks go over direct-tcpip channels (so the
service's port need not be reachable from here). Where the agent cannot start (no python3)
or `$KERNELDEV_TRANSFER` is `stream`/`sftp`: commands in `sh -c` sessions, files over its SFTP
session (writes to a temporary name, then a rename) or one exec stream, as before.

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
import select
import shlex
import socket
import stat
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import BinaryIO

from kerneldev import interrupt
from kerneldev.config import HostConfig
from kerneldev.errors import (
    ConnectionLostError,
    HostConnectionError,
    RemoteCommandError,
    TransferError,
)
from kerneldev.hosts.sshlib import paramiko
from kerneldev.hosts.transport.agent_chain import AgentChain
from kerneldev.hosts.transport.agent_client import AgentClient
from kerneldev.hosts.transport.base import (
    CHUNK,
    TEMP_MARK,
    CommandResult,
    ExactReader,
    HostScan,
    OutputCallback,
    PutFilesCallbacks,
    PutItem,
    PutOptions,
    RemoteFile,
    RunOptions,
    Transport,
    hash_answer,
    host_scan,
    http_request_text,
    http_status,
    parse_reports,
    raise_put_failure,
    scan_request,
    send_file_records,
    sendfiles_chunks,
    settle_put_reports,
    temp_path,
)
from kerneldev.hosts.transport.hostscripts import agent_command, agent_source, hash_command
from kerneldev.hosts.transport.hostscripts import python_command as _python_command
from kerneldev.hosts.transport.hostscripts import script as _script
from kerneldev.hosts.transport.over_agent import AgentTransport
from kerneldev.hosts.transport.ssh_connection import (
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
from kerneldev.hosts.transport.transfer_mode import (  # re-exported: defined here before
    TRANSFER_ENV as TRANSFER_ENV,
)
from kerneldev.hosts.transport.transfer_mode import TRANSFER_MODES as TRANSFER_MODES
from kerneldev.hosts.transport.transfer_mode import transfer_mode as transfer_mode
from kerneldev.hostside import httpprobe as _httpprobe
from kerneldev.hostside import receivefiles as _receivefiles
from kerneldev.hostside import sendfiles as _sendfiles

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
# Receive window of a file-stream channel: large enough that the host never waits for us on a
# fast link (paramiko's default of 2 MiB would stall a 50 MB transfer on acknowledgements).
STREAM_WINDOW = 16 << 20
STREAM_PACKET = 1 << 18  # bytes per SSH packet the host may send on it (paramiko: 32 KiB)
# Files move one by one over SFTP or all in one stream over an exec channel, whichever this
# host makes cheaper. An exec channel starts the login shell (with its rc files: conda or pyenv
# init on many GPU boxes) and a Python on the host: 20-40 ms on a plain host, 0.5 s measured
# on one whose .bashrc runs `pyenv init`. The sftp subsystem starts neither; it costs a few
# requests per file (SFTP_REQUESTS_*), each one network round trip. The command's own hash
# request times the first, an SFTP stat the second (see docs/benchmarks.md, "Sync speed").
# Before either is known, BULK_MIN_FILES files or more go in one stream.
BULK_MIN_FILES = 16
# Both are today's paths for a host without the agent ($KERNELDEV_TRANSFER: transfer_mode.py).
SFTP_REQUESTS_READ = 4  # open, fstat, the pipelined reads, close
SFTP_REQUESTS_WRITE = 12  # lstat, stat, open, chmod, writes, close, the check's 4, rename
SMALL_FILE = 4 << 20  # bytes up to which file_sha256 reads through SFTP instead of hashing there
_PID_MARK = "kerneldev-pid="
NO_AGENT = object()  # `_agent_call`'s answer where the step is to be done without the agent
# Runs `sh -c <command>` after naming its pid on stderr; the command keeps that pid (exec).
_PID_PREAMBLE = f"printf '{_PID_MARK}%s\\n' $$ >&2; exec sh -c "


# "lost while <gerund> <path>" for the verbs of `_file_error`
_GERUNDS = {
    "read": "reading",
    "stat": "checking",
    "write": "writing",
    "create folder": "creating the folder",
    "rename onto": "renaming onto",
}


class SSHTransport(Transport):
    def __init__(self, host: HostConfig | SSHConnection) -> None:
        """Work over `host`'s connection: an `SSHConnection` (made with the ssh_config file or
        timeout to use), or a host config, connected with the defaults."""
        self.connection = host if isinstance(host, SSHConnection) else SSHConnection(host)
        self.host_config = self.connection.host_config
        self.host_name = self.connection.host_name
        self._exec_seconds: float | None = None  # fastest helper command seen (hash request)
        self._sftp_seconds: float | None = None  # one SFTP request's round trip
        self.transfer_mode = transfer_mode()
        self._agent: AgentTransport | None = None
        self._agent_chan: paramiko.Channel | None = None  # until the agent's HELLO came
        self._agent_tried = False
        # Why the steps do not go through the host agent (None: they do, or not tried yet).
        self.agent_unavailable: str | None = None

    def close(self) -> None:
        if self._agent is not None:
            self._agent.close()
            self._agent = None
        self.connection.close()

    # --- the host agent -------------------------------------------------------------------
    def _via_agent(self, wait: bool = True) -> AgentTransport | None:
        """The host agent's transport, started on first use (one exec channel: the only login
        shell of this connection); None where it cannot run (no python3) or is pinned off.
        `wait=False` returns it before its HELLO came, so that a first request follows the
        agent's source without a round trip (see `_agent_call`)."""
        if not self._agent_tried:
            self._agent_tried = True
            if self.transfer_mode in ("stream", "sftp"):
                self.agent_unavailable = f"${TRANSFER_ENV} is {self.transfer_mode}"
                return None
            client, self._agent_chan = start_agent(
                self.connection, ["python3", self.host_config.python]
            )
            # A first request sent before the HELLO waits no longer for it than this did.
            client.expect_hello_within(3 * self.connection.connect_timeout)
            if self.while_agent_starts is not None:
                self.while_agent_starts()
            self._agent = AgentTransport(client, self.host_config, self.host_name)
        if wait:
            return self._confirm_agent()
        return self._agent

    def _confirm_agent(self) -> AgentTransport | None:
        """The agent once its HELLO came; where it never started, the way without it is set
        up (None), or `TransferError` when the agent is required."""
        agent, chan = self._agent, self._agent_chan
        if agent is None or chan is None:
            return agent
        try:
            agent.client.wait_hello()
        except ConnectionLostError as err:
            if not self.connection.is_active():
                raise self._dropped(err, "starting the host agent") from None
            reason = agent_failure(chan)
            chan.close()
            self._agent = self._agent_chan = None
            if self.transfer_mode == "agent":
                raise TransferError(
                    f"cannot start the host agent on {self.host_name}: {reason}",
                    hint=f"unset {TRANSFER_ENV} to fall back to one command per step",
                ) from None
            self.agent_unavailable = reason
            return None
        self._agent_chan = None  # confirmed: nothing more to check
        return agent

    def _agent_call(self, name: str, *args):
        """The agent transport's `name(*args)`, or `NO_AGENT` where the agent cannot run (the
        caller then does the step the way without it). The connection's first request goes
        out right behind the agent's source, without waiting for its HELLO (one round trip
        less per command). When the agent never started (no python3: its stream ends without
        a HELLO), nothing of that request ran - the agent reads none before its HELLO - and
        the step is done without it; a stream lost after the HELLO is a lost connection.
        Only for steps whose arguments are plain data: a step that consumes a stream (an
        upload's source) waits for the HELLO first (`_via_agent()`)."""
        agent = self._via_agent(wait=False)
        if agent is None:
            return NO_AGENT
        try:
            return getattr(agent, name)(*args)
        except ConnectionLostError:
            if agent.client.started or self._confirm_agent() is not None:
                raise
            return NO_AGENT

    def begin(self) -> None:
        self._via_agent(wait=False)  # connects, asks for the agent, sends its source

    def chain(self) -> AgentChain | None:
        agent = self._via_agent()
        return agent.chain() if agent is not None else None

    # The connection's parts as this class uses them (opened on first use).
    def _connection(self) -> paramiko.Transport:
        return self.connection.transport()

    def _sftp_client(self) -> paramiko.SFTPClient:
        return self.connection.sftp()

    def _dropped(self, err: BaseException, doing: str) -> ConnectionLostError:
        return self.connection.dropped(err, doing)

    # --- commands -----------------------------------------------------------------------
    def _run(self, command: str, options: RunOptions) -> CommandResult:
        if (done := self._agent_call("_run", command, options)) is not NO_AGENT:
            return done
        timeout, stdin, on_output = options.timeout, options.stdin, options.on_output
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
                        # Closing the channel alone would leave the command running on the
                        # host (SSH sends no signal without a pty): end its process group.
                        self._end_remote(errs.pid)
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
        if (done := self._agent_call("hash_files", root, patterns)) is not NO_AGENT:
            return done
        data = self._hash_request({"root": root, "patterns": list(patterns)})
        return data["files"], data["unmatched"]

    def scan(
        self, root: str, patterns: list[str], markers: str | None = None, lock: dict | None = None
    ) -> HostScan:
        if (done := self._agent_call("scan", root, patterns, markers, lock)) is not NO_AGENT:
            return done
        # The same one remote command as hash_files, which also walks root for leftovers (and
        # takes the host lock first when asked).
        return host_scan(self._hash_request(scan_request(root, patterns, markers, lock)))

    def _hash_request(self, request: dict) -> dict:
        request = {**request, "sums": self.host_config.live_sums}
        command = hash_command(["python3", self.host_config.python])
        self._connection()  # connected first: the timing below is one command, not the login
        started = time.monotonic()
        result = self.run(command, stdin=json.dumps(request).encode("utf-8"))
        took = time.monotonic() - started
        self._exec_seconds = min(took, self._exec_seconds or took)
        if result.exited == 127 and "no python3" in result.stderr:
            raise TransferError(
                f"cannot hash files on {self.host_name}: no python3 on the host",
                hint="kerneldev hashes all files in one remote command with python3; install "
                "it on the host, or set `python:` in the config to a Python 3 interpreter",
            )
        return hash_answer(result, request, self.host_name)

    def stream_files(self, paths: list[str]) -> Iterator[tuple[str, Iterator[bytes]]]:
        if (agent := self._via_agent()) is not None:
            yield from agent.stream_files(paths)
            return
        # Few files (or a host where commands are slow to start): SFTP, file by file, in
        # chunks. Else one exec channel for all: `_sendfiles.py` runs under the host's python
        # and frames each file's bytes in bounded records (see its docstring); no per-file
        # round trips, and the bytes flow while the previous file is still being written here.
        if not self._stream_pays(len(paths), SFTP_REQUESTS_READ, paths[0] if paths else "/"):
            for path in paths:
                yield path, self._sftp_chunks(path)
            return
        command = _python_command(["python3", self.host_config.python], _script(_sendfiles))
        t = self._connection()
        try:
            chan = t.open_session(
                window_size=STREAM_WINDOW,
                max_packet_size=STREAM_PACKET,
                timeout=self.connection.connect_timeout,
            )
            chan.exec_command(f"sh -c {shlex.quote(command)}")
            chan.sendall(json.dumps({"paths": list(paths)}).encode("utf-8"))
            chan.shutdown_write()
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise self._dropped(err, "starting a file transfer") from None
        reader = _ChannelReader(chan, self)
        try:
            for path in paths:
                yield path, sendfiles_chunks(reader, path, self.host_name)
        finally:
            chan.close()

    def _stream_pays(self, files: int, requests: int, probe: str) -> bool:
        """Whether one exec stream is cheaper than `files` x `requests` SFTP round trips."""
        if self.transfer_mode != "auto":
            return self.transfer_mode == "stream"
        if files < 2:
            return False
        if self._exec_seconds is None:
            return files >= BULK_MIN_FILES
        if self._sftp_seconds is None:
            sftp = self._sftp_client()
            started = time.monotonic()
            try:
                sftp.stat(probe)
            except OSError:
                pass  # a missing path answers as fast
            except (EOFError, paramiko.SSHException) as err:
                raise self._dropped(err, "starting a file transfer") from None
            self._sftp_seconds = time.monotonic() - started
        return self._exec_seconds < files * requests * self._sftp_seconds

    def _sftp_chunks(self, path: str) -> Iterator[bytes]:
        sftp = self._sftp_client()
        try:
            with sftp.open(path, "rb") as f:
                st = f.stat()
                if not stat.S_ISREG(st.st_mode or 0):
                    raise TransferError(f"{path} on {self.host_name} is not a regular file")
                _prefetch(f, st.st_size)  # pipelined reads: one round trip's latency, not many
                # Chunks, checking for Ctrl-C between them: memory stays bounded.
                for chunk in iter(lambda: f.read(CHUNK), b""):  # noqa: B023
                    interrupt.check()
                    yield chunk
        except TransferError:
            raise
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, path, "read") from None

    def _file_error(self, err: BaseException, path: str, doing: str) -> Exception:
        """`doing` is a verb ("read"): "cannot read X", "lost while reading X"."""
        alive = self.connection.is_active()
        if (
            not alive
            or isinstance(err, (EOFError, paramiko.SSHException, socket.timeout))
            or not isinstance(err, OSError)
        ):
            return self._dropped(err, f"{_GERUNDS.get(doing, doing)} {path}")
        if err.errno == errno.ENOENT:
            return TransferError(f"{path}: no such file on {self.host_name}")
        return TransferError(f"cannot {doing} {path} on {self.host_name}: {describe_error(err)}")

    def read_bytes(self, path: str) -> bytes:
        if (done := self._agent_call("read_bytes", path)) is not NO_AGENT:
            return done
        return b"".join(self._sftp_chunks(path))

    def _put_file(self, path: str, source: BinaryIO, options: PutOptions) -> None:
        if (agent := self._via_agent()) is not None:
            return agent._put_file(path, source, options)
        mode, on_bytes, before_rename = options.mode, options.on_bytes, options.before_rename
        sftp = self._sftp_client()
        path = self._follow_symlink(sftp, path)
        folder, name = posixpath.split(path)
        self.mkdirs(folder)
        try:
            # The replaced file's owner and mode are kept, as receivefiles.py does.
            owner, mode = _receivefiles.replaced(sftp.stat, path, mode)
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, path, "stat") from None
        tmp = temp_path(folder, name)
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

    def _put_files(self, items: list[PutItem], callbacks: PutFilesCallbacks) -> None:
        if (agent := self._via_agent()) is not None:
            return agent._put_files(items, callbacks)
        # Few files (or slow-to-start commands): put_file one by one over SFTP. Else one exec
        # channel for all: `_receivefiles.py` on the host lands each one as put_file does
        # (temporary file, compare-and-swap, rename) and reports it by one line; the bytes of
        # the next file flow while the host renames the previous one.
        if not self._stream_pays(len(items), SFTP_REQUESTS_WRITE, posixpath.dirname(items[0].path)):
            super()._put_files(items, callbacks)
            return
        on_landed, on_start, on_bytes = callbacks.on_landed, callbacks.on_start, callbacks.on_bytes
        command = _python_command(["python3", self.host_config.python], _script(_receivefiles))
        request = json.dumps(
            {
                "mark": TEMP_MARK,
                "files": [
                    {"path": f.path, "mode": f.mode, "expect": f.expect_sha256, "check": f.check}
                    for f in items
                ],
            }
        ).encode("utf-8")
        t = self._connection()
        try:
            chan = t.open_session(timeout=self.connection.connect_timeout)
            chan.exec_command(f"sh -c {shlex.quote(command)}")
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise self._dropped(err, "starting a file transfer") from None
        sent: dict[int, tuple[str, int]] = {}
        stopped: BaseException | None = None
        try:
            try:
                chan.sendall(len(request).to_bytes(8, "big") + request)
                for i, item in enumerate(items):
                    if on_start is not None:
                        on_start(i)
                    interrupt.check()
                    sent[i] = send_file_records(chan.sendall, item.open, item.path, on_bytes)
            except (paramiko.SSHException, EOFError, OSError) as err:
                if not self.connection.is_active():
                    raise self._dropped(err, "uploading files") from None
                # The host stopped reading (a failed check or write): its report says why.
            except BaseException as err:  # Ctrl-C, or the workspace file could not be read
                stopped = err
                with interrupt.shield():
                    try:
                        chan.sendall(_sendfiles.HEADER.pack(b"A", 0))
                    except (paramiko.SSHException, EOFError, OSError):
                        pass
            with interrupt.shield():
                try:
                    chan.shutdown_write()
                except (paramiko.SSHException, EOFError, OSError):
                    pass
                # What landed is known only from the host's report: read it to the end even
                # after Ctrl-C (shielded; bounded by IO_TIMEOUT).
                reports = self._read_reports(chan)
        finally:
            chan.close()
        settle_put_reports(items, sent, reports, self.host_name, on_landed)
        if stopped is not None:
            raise stopped
        raise_put_failure(items, reports, self.host_name)
        if len(reports) < len(items):
            if not self.connection.is_active():
                raise self._dropped(EOFError(), "uploading files")
            raise TransferError(
                f"uploading to {self.host_name} ended after {len(reports)} of {len(items)} "
                "files without a reason (is python3 on the host?)"
            )

    def _read_reports(self, chan: paramiko.Channel) -> list[dict]:
        """The host's one-line JSON reports, read until it closes its output."""
        chan.settimeout(IO_TIMEOUT)
        data = b""
        try:
            while True:
                block = chan.recv(65536)
                if not block:
                    break
                data += block
        except (paramiko.SSHException, EOFError, OSError):
            pass  # a timeout or a dropped connection: what arrived is all that is known
        return parse_reports(data)

    def copy_on_host(self, pairs: list[tuple[str, str]]) -> dict[str, str | None]:
        if (done := self._agent_call("copy_on_host", pairs)) is not NO_AGENT:
            return done
        return super().copy_on_host(pairs)

    def rename(self, src: str, dst: str) -> None:
        if self._agent_call("rename", src, dst) is not NO_AGENT:
            return
        sftp = self._sftp_client()
        try:
            self._rename_over(sftp, src, dst)
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, dst, "rename onto") from None

    def file_sha256(self, path: str) -> str | None:
        if (done := self._agent_call("file_sha256", path)) is not NO_AGENT:
            return done
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
                _prefetch(f, st.st_size)
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
        if (done := self._agent_call("exists", path)) is not NO_AGENT:
            return done
        sftp = self._sftp_client()
        try:
            sftp.lstat(path)
            return True
        except FileNotFoundError:
            return False
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._file_error(err, path, "stat") from None

    def mkdirs(self, path: str) -> None:
        if self._agent_call("mkdirs", path) is not NO_AGENT:
            return
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

    # --- network ------------------------------------------------------------------------
    def http_get(self, url: str, timeout: float = 5.0) -> int:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme == "https":
            return self._https_get_with_curl(url, timeout)
        hostname, port, request = http_request_text(url)
        target = f"{hostname}:{port}"
        t = self._connection()
        try:
            chan = t.open_channel(
                "direct-tcpip", (hostname, port), ("127.0.0.1", 0), timeout=timeout
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
            head = _httpprobe.status_line(chan, request, timeout)
        except TimeoutError:
            raise HostConnectionError(f"GET {url}: no answer within {timeout:g}s") from None
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise HostConnectionError(f"GET {url}: {describe_error(err)}") from None
        finally:
            chan.close()
        return http_status(url, head)


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


def _prefetch(f: paramiko.SFTPFile, size: int) -> None:
    """`f.prefetch(size)`, whose read-ahead thread (paramiko's `_prefetch_thread`) ends quietly
    when the connection is cut or closed under it: the reading thread reports that loss itself
    (`ConnectionLostError`). Left alone, the thread died with `OSError: Socket is closed`, a
    traceback on stderr (an unhandled-thread warning under pytest, an error with -W error)."""
    send_requests = f._prefetch_thread  # paramiko starts `self._prefetch_thread` as the thread

    def read_ahead(*args) -> None:
        try:
            send_requests(*args)
        except EOFError:
            pass  # paramiko's writer: the socket is gone
        except (OSError, paramiko.SSHException):  # "Socket is closed": the channel went
            chan = f.sftp.sock
            if not chan.closed and chan.get_transport().is_active():
                raise  # not a closed connection: a real error, shown as before

    f._prefetch_thread = read_ahead
    f.prefetch(size)


def _feed_channel(chan: paramiko.Channel, data: bytes) -> None:
    try:
        chan.sendall(data)
        chan.shutdown_write()
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the command closed its input or the connection went; run() reports the latter


class _ChannelReader(ExactReader):
    """`ExactReader` over a command's stdout; a command that ends early is reported with its
    stderr."""

    def __init__(self, chan: paramiko.Channel, transport: SSHTransport) -> None:
        super().__init__(transport.host_name, IO_TIMEOUT)
        self.chan = chan
        self.transport = transport
        chan.settimeout(0.5)

    def _recv(self, n: int) -> bytes:
        try:
            return self.chan.recv(max(n, STREAM_WINDOW // 4))
        except TimeoutError:
            raise
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise self.transport._dropped(err, "transferring files") from None

    def _ended_early(self) -> None:
        t = self.transport
        if not t.connection.is_active():
            raise t._dropped(EOFError(), "transferring files")
        self.chan.status_event.wait(EXIT_GRACE)
        errs = b""
        while self.chan.recv_stderr_ready():
            errs += self.chan.recv_stderr(65536)
        text = errs.decode("utf-8", "replace").strip()
        if self.chan.exit_status == 127 and "no python3" in text:
            raise TransferError(
                f"cannot transfer files from {t.host_name}: no python3 on the host",
                hint="set `python:` in the config to a Python 3 interpreter on the host",
            )
        tail = text.splitlines()[-1:] or [f"exit {self.chan.exit_status}"]
        raise TransferError(f"file transfer from {t.host_name} ended early: {tail[0]}")


def start_agent(
    connection: SSHConnection, pythons: list[str]
) -> tuple[AgentClient, paramiko.Channel]:
    """Start the host agent (`hostside/agent.py`) over one exec channel of `connection`: the
    one login shell of the connection. Returns at once (the agent's HELLO arrives later:
    `AgentClient.wait_hello`); the channel's stderr holds why it did not start."""
    chan = agent_channel(connection, pythons)
    return AgentClient(chan.recv, chan.sendall, shutdown=chan.shutdown_write), chan


def agent_channel(connection: SSHConnection, pythons: list[str]) -> paramiko.Channel:
    """The exec channel the host agent runs on (its frames raw: a session holder relays them)."""
    t = connection.transport()
    try:
        chan = t.open_session(
            window_size=STREAM_WINDOW,
            max_packet_size=STREAM_PACKET,
            timeout=connection.connect_timeout,
        )
        # `exec`: the login shell does not stay behind as the agent's parent for its life.
        chan.exec_command(f"exec sh -c {shlex.quote(agent_command(pythons))}")
    except (paramiko.SSHException, EOFError, OSError) as err:
        raise connection.dropped(err, "starting the host agent") from None
    try:
        # The bootstrap reads the agent's source first (no round trip: a request written
        # after it, before the HELLO, simply follows it on stdin).
        chan.sendall(agent_source())
    except (paramiko.SSHException, EOFError, OSError):
        pass  # no python3 took it (the channel ended): its stderr says why, read below
    # The agent's stderr is read all along (unread, it would use up the channel's window,
    # which stdout shares); its last bytes say why an agent did not start.
    chan.kerneldev_stderr = bytearray()
    chan.kerneldev_drain = threading.Thread(target=_drain_stderr, args=(chan,), daemon=True)
    chan.kerneldev_drain.start()
    return chan


def _drain_stderr(chan: paramiko.Channel) -> None:
    tail: bytearray = chan.kerneldev_stderr
    while True:
        try:
            data = chan.recv_stderr(65536)
        except (paramiko.SSHException, EOFError, OSError):
            return
        if not data:
            return
        tail += data
        del tail[:-4096]


def agent_failure(chan: paramiko.Channel) -> str:
    """Why the agent on `chan` did not start, from its exit status and stderr."""
    chan.status_event.wait(EXIT_GRACE)
    drain = getattr(chan, "kerneldev_drain", None)
    if drain is not None:
        drain.join(EXIT_GRACE)  # it ends at the stderr's EOF: all of it read
    text = bytes(getattr(chan, "kerneldev_stderr", b"")).decode("utf-8", "replace").strip()
    if chan.exit_status == 127 and "no python3" in text:
        return "no python3 on the host"
    tail = text.splitlines()[-1:] or [f"exit {chan.exit_status}"]
    return f"it ended at once: {tail[0]}"
