"""A one-shot command's SSH transport: the host agent over the system's OpenSSH client where it
starts, else paramiko's `SSHTransport` exactly as before.

`OneShotTransport` starts `ssh` on first use (`openssh.ssh_command`: strict host keys against
kerneldev's known_hosts files, BatchMode) and sends the first request right behind the agent's
source, as `SSHTransport` does. Everything that can go wrong before the agent's HELLO (no `ssh`
binary, a config OpenSSH cannot express as kerneldev reads it, an unknown or changed host key,
no usable key, no python3 on the host, a timeout) sends the command to paramiko's transport,
which connects afresh and fails, prompts or falls back in today's words: nothing ran on the
host before the HELLO (the agent reads no request before it has sent it), so nothing runs
twice. After the HELLO nothing falls back: a cut connection is a `ConnectionLostError`, as
over paramiko. The host's `ssh_client` key (or $KERNELDEV_SSH_CLIENT) picks: "auto" (that
rule), "openssh" (no fallback: a failure before the HELLO is an error with ssh's own words),
"paramiko" (today's path). This module never imports paramiko (the fallback does, when used).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from kerneldev import interrupt
from kerneldev.config import HostConfig
from kerneldev.errors import ConnectionLostError, HostConnectionError
from kerneldev.hosts.known_hosts_paths import known_hosts_files
from kerneldev.hosts.transport.agent_chain import AgentChain
from kerneldev.hosts.transport.base import (
    CommandResult,
    HostScan,
    PutFilesCallbacks,
    PutItem,
    PutOptions,
    RemoteFile,
    RunOptions,
    Transport,
)
from kerneldev.hosts.transport.openssh import (
    OpenSSHAgent,
    ssh_client,
    ssh_command,
    take_early,
    why_not_openssh,
)
from kerneldev.hosts.transport.over_agent import AgentTransport
from kerneldev.hosts.transport.ssh_config_file import CONNECT_TIMEOUT
from kerneldev.hosts.transport.transfer_mode import transfer_mode

POLL = 0.2  # seconds between looks at Ctrl-C while waiting for the agent's HELLO


def paramiko_transport(
    host: HostConfig, *, ssh_config=None, connect_timeout: float | None = None
) -> Transport:
    """Today's one-shot transport: paramiko's `SSHTransport` (imported only here, when used)."""
    from kerneldev.hosts.transport.ssh import SSHConnection, SSHTransport

    return SSHTransport(SSHConnection(host, ssh_config=ssh_config, connect_timeout=connect_timeout))


class OneShotTransport(Transport):
    def __init__(
        self,
        host: HostConfig,
        *,
        ssh_config=None,
        connect_timeout: float | None = None,
    ) -> None:
        """`ssh_config` and `connect_timeout` as for `open_transport` (for both clients)."""
        self.host_config = host
        self.host_name = host.name
        self.choice = ssh_client(host)
        transfer_mode()  # a bad $KERNELDEV_TRANSFER is a usage error here, as over paramiko
        self._ssh_config = ssh_config
        self._connect_timeout = CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        self._tried = False
        self._hook_ran = False
        self._ssh: OpenSSHAgent | None = None
        self._agent: AgentTransport | None = None  # over OpenSSH, until known to have started
        self._settled: Transport | None = None  # what every step goes through once known
        # Why the command went over paramiko under "auto" (for tests and debugging).
        self.why_paramiko: str | None = None
        self._client: str | None = None

    @property
    def client(self) -> str | None:
        """Which client carries the command: "openssh", "paramiko", None while not known."""
        if self._client is None and self._agent is not None and self._agent.client.started:
            return "openssh"
        return self._client

    # --- choosing -----------------------------------------------------------------------
    def _start(self) -> AgentTransport | None:
        """The agent over OpenSSH, started on the first call (not waited for); None where
        OpenSSH is not to be used or could not be run."""
        if not self._tried:
            self._tried = True
            why = why_not_openssh(self.choice)
            if why is None:
                command = ssh_command(
                    self.host_config,
                    known_hosts_files(self.host_config.known_hosts),
                    ssh_config=self._ssh_config,
                    connect_timeout=self._connect_timeout,
                )
                why = command.why_not
            if why is None:
                try:
                    early = take_early(command.argv)
                    self._ssh = early or OpenSSHAgent(command.argv)
                except OSError as err:
                    why = f"cannot run ssh: {err.strerror or err}"
            if why is not None:
                self._no_openssh(why)
                return None
            client = self._ssh.client
            # As over paramiko: a request sent before the HELLO waits no longer than this.
            client.expect_hello_within(3 * self._connect_timeout)
            if self.while_agent_starts is not None:
                self._hook_ran = True
                self.while_agent_starts()
            self._agent = AgentTransport(client, self.host_config, self.host_name)
        return self._agent

    def _no_openssh(self, why: str) -> None:
        if self.choice == "openssh":
            raise HostConnectionError(
                f"cannot reach host '{self.host_name}' with the system's ssh: {why}",
                hint="set `ssh_client: auto` (or unset $KERNELDEV_SSH_CLIENT) to let kerneldev "
                "use its own SSH client where ssh cannot",
            )
        self.why_paramiko = why

    def _settle(self) -> Transport:
        """The transport every step goes through: the agent over OpenSSH once its HELLO came,
        else (it never started) paramiko's."""
        if self._settled is not None:
            return self._settled
        agent = self._start()
        if agent is not None:
            try:
                self._wait_hello(agent)
            except ConnectionLostError:
                assert self._ssh is not None
                why = self._ssh.failure()
                self._agent = self._ssh = None
                self._no_openssh(why)
            else:
                self._client = "openssh"
                self._settled = agent
                return agent
        self._client = "paramiko"
        self._settled = paramiko_transport(
            self.host_config, ssh_config=self._ssh_config, connect_timeout=self._connect_timeout
        )
        if not self._hook_ran:  # it ran when ssh started: once is enough
            self._settled.while_agent_starts = self.while_agent_starts
        return self._settled

    def _wait_hello(self, agent: AgentTransport) -> None:
        """Wait for the agent's HELLO, Ctrl-C honoured; `ConnectionLostError` when it never
        comes (the stream ended, or `expect_hello_within` gave up)."""
        while True:
            interrupt.check()
            try:
                agent.client.wait_hello(POLL)
                return
            except TimeoutError:
                continue

    def _call(self, name: str, *args, **kwargs):
        """`name(*args, **kwargs)` on the agent, sent before its HELLO is known (one round trip
        less); done over paramiko where the agent never started (then nothing of it ran). Only
        for steps whose arguments are plain data (a stream's source is consumed once)."""
        if self._settled is None:
            agent = self._start()
            if agent is not None:
                try:
                    return getattr(agent, name)(*args, **kwargs)
                except ConnectionLostError:
                    if agent.client.started:
                        raise
        return getattr(self._settle(), name)(*args, **kwargs)

    # --- the steps ----------------------------------------------------------------------
    def _run(self, command: str, options: RunOptions) -> CommandResult:
        return self._call("_run", command, options)

    def hash_files(self, root: str, patterns: list[str]) -> tuple[list[RemoteFile], list[str]]:
        return self._call("hash_files", root, patterns)

    def scan(
        self, root: str, patterns: list[str], markers: str | None = None, lock: dict | None = None
    ) -> HostScan:
        return self._call("scan", root, patterns, markers, lock)

    def read_bytes(self, path: str) -> bytes:
        return self._call("read_bytes", path)

    def stream_files(self, paths: list[str]) -> Iterator[tuple[str, Iterator[bytes]]]:
        yield from self._settle().stream_files(paths)

    def write_atomic(self, path: str, data: bytes, mode: int | None = None) -> None:
        self._settle().write_atomic(path, data, mode)

    def exists(self, path: str) -> bool:
        return self._call("exists", path)

    def mkdirs(self, path: str) -> None:
        self._call("mkdirs", path)

    def remove(self, path: str) -> None:
        self._call("remove", path)

    def _put_file(self, path: str, source: BinaryIO, options: PutOptions) -> None:
        self._settle()._put_file(path, source, options)

    def _put_files(self, items: list[PutItem], callbacks: PutFilesCallbacks) -> None:
        self._settle()._put_files(items, callbacks)

    def copy_on_host(self, pairs: list[tuple[str, str]]) -> dict[str, str | None]:
        return self._call("copy_on_host", pairs)

    def rename(self, src: str, dst: str) -> None:
        self._call("rename", src, dst)

    def file_sha256(self, path: str) -> str | None:
        return self._call("file_sha256", path)

    def find_temp_files(self, root: str, markers: str | None = None) -> list[str]:
        return self._call("find_temp_files", root, markers)

    def append_text(self, path: str, text: str, then: str = "") -> None:
        self._call("append_text", path, text, then)

    def http_get(self, url: str, timeout: float = 5.0) -> int:
        return self._call("http_get", url, timeout)

    def begin(self) -> None:
        if self._settled is None and self._start() is not None:
            return  # ssh started, the agent's source sent
        self._settle().begin()

    def chain(self) -> AgentChain | None:
        return self._settle().chain()

    def close(self) -> None:
        for closable in (self._agent, self._ssh, self._settled):
            if closable is not None:
                closable.close()
        self._agent = self._ssh = self._settled = None
