"""A real OpenSSH sshd on 127.0.0.1 for the tests: temporary host key, temporary user key,
free port. Nothing here mocks SSH; the tests talk to this server through paramiko."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


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

    def start(self) -> None:
        sshd = find_sshd()
        assert sshd, "sshd not found"
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege-separation folder sshd insists on
        config = self.dir / "sshd_config"
        config.write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {self.host_key}\n"
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}\n"
            f"PidFile {self.dir / 'sshd.pid'}\n"
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
        log = open(self.dir / "sshd.log", "ab")
        self.process = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
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
        raise RuntimeError("sshd did not start listening within 10 s")

    def rotate_host_key(self) -> None:
        """Restart with a new host key: what a reinstalled host (or an attacker) looks like."""
        self.stop()
        for p in (self.host_key, self.host_key.with_suffix(".pub")):
            p.unlink()
        keygen(self.host_key)
        self.start()


def start_sshd(tmp: Path) -> SSHServer:
    tmp.mkdir(parents=True, exist_ok=True)
    host_key = tmp / "ssh_host_ed25519_key"
    client_key = tmp / "id_ed25519"
    keygen(host_key)
    keygen(client_key)
    (tmp / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
    os.chmod(tmp / "authorized_keys", 0o600)
    server = SSHServer(
        port=free_port(),
        user=getpass.getuser(),
        host_key=host_key,
        client_key=client_key,
        dir=tmp,
    )
    server.start()
    return server
