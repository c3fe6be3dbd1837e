"""When a kept session no longer matches what a new command would do: the files it watches.

A holder keeps answering for a host only while a one-shot command would make the same
connection and trust the same key. It watches three kinds of file (their stat is compared
cheaply; only a file whose stat changed is read again):

- the config file the entry came from: the entry gone or its connection keys changed, or
  `session.keep` turned off -> retire; new `idle` / `max_age` values are taken as they are;
- the ssh_config file: the host's resolved target (address, user, port, keys, proxies)
  changed -> retire;
- the known_hosts files: the key the server showed is no longer trusted by them -> retire,
  cutting the clients still connected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kerneldev.config import HostConfig, SessionConfig, load_config
from kerneldev.errors import KerneldevError
from kerneldev.hosts import hostkeys
from kerneldev.hosts.transport.session.identity import connection_fields
from kerneldev.hosts.transport.ssh_connection import SSHConnection, SSHTarget

Stamp = tuple[int, int, int] | None  # (mtime ns, size, inode), None when missing


@dataclass(frozen=True)
class Verdict:
    """What a change means: `retire` with `why` (and `cut` the connected clients too), or
    keep going with `session` (the entry's settings, maybe new)."""

    retire: bool
    why: str = ""
    cut: bool = False
    session: SessionConfig | None = None


class Freshness:
    """The watched files of one holder and what they said when it connected."""

    def __init__(
        self,
        host: HostConfig,
        connection: SSHConnection,
        ssh_config: str,
        config_path: Path | None,
    ) -> None:
        self.host = host
        self.ssh_config = ssh_config
        self.config_path = config_path
        self.target: SSHTarget = connection.target()
        self.known_hosts = connection.known_hosts_files
        self.key_name = hostkeys.known_hosts_name(self.target.hostname, self.target.port)
        self.server_key = connection.transport().get_remote_server_key()
        self._stamps = {path: _stamp(path) for path in self._files()}

    def reconnected(self, connection: SSHConnection) -> None:
        """A new connection (after the maximum age): its key is the one to keep trusting."""
        self.server_key = connection.transport().get_remote_server_key()

    def _files(self) -> list[Path]:
        files = list(self.known_hosts)
        if self.config_path is not None:
            files.append(self.config_path)
        if self.ssh_config != "none":
            files.append(Path(self.ssh_config))
        return files

    def check(self) -> Verdict:
        """Look at the files whose stat changed since the last look."""
        changed = []
        for path in self._files():
            stamp = _stamp(path)
            if stamp != self._stamps.get(path):
                self._stamps[path] = stamp
                changed.append(path)
        session = None
        for path in changed:
            if path == self.config_path:
                verdict = self._config_verdict()
                if verdict.retire:
                    return verdict
                session = verdict.session
            if self.ssh_config != "none" and path == Path(self.ssh_config):
                verdict = self._ssh_config_verdict()
                if verdict.retire:
                    return verdict
            if path in self.known_hosts:
                verdict = self._known_hosts_verdict()
                if verdict.retire:
                    return verdict
        return Verdict(False, session=session)

    def _config_verdict(self) -> Verdict:
        try:
            entry = load_config(self.config_path).hosts.get(self.host.name)
        except KerneldevError as err:
            return Verdict(True, f"the config cannot be read: {err.message}")
        if entry is None:
            return Verdict(True, f"the config no longer has host '{self.host.name}'")
        if connection_fields(entry) != connection_fields(self.host):
            return Verdict(True, f"the config's entry for '{self.host.name}' changed")
        if not entry.session.keep:
            return Verdict(True, "the config turned kept sessions off (session.keep: false)")
        return Verdict(False, session=entry.session)

    def _ssh_config_verdict(self) -> Verdict:
        try:
            target = SSHConnection(self.host, ssh_config=self.ssh_config).target()
        except KerneldevError as err:
            return Verdict(True, f"the ssh config cannot be read: {err.message}")
        if target != self.target:
            return Verdict(True, f"the ssh config now says {target.address} for this host")
        return Verdict(False)

    def _known_hosts_verdict(self) -> Verdict:
        try:
            check = hostkeys.check_key(self.known_hosts, self.key_name, self.server_key)
        except KerneldevError as err:
            return Verdict(True, f"known_hosts cannot be read: {err.message}", cut=True)
        if check.status != "trusted":
            why = f"known_hosts no longer trusts the host's key ({check.status})"
            return Verdict(True, why, cut=True)
        return Verdict(False)


def _stamp(path: Path) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
