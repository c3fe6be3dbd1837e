"""Host-key trust: read known_hosts files (with line numbers), verify a server's key, fingerprint
it the way OpenSSH does, and record a newly trusted key.

The rules, the same for every connection kerneldev makes (target host and jump hosts):
- a key is accepted only if a known_hosts line for this host (plain, `[host]:port`, hashed
  `|1|...`, or a `*`/`?` pattern) holds exactly this key;
- no line for this key type: the key is *unknown* -> refused, the message names the key type
  and its SHA256 fingerprint and points at `kerneldev trust`;
- a line of the same key type with a different key: the key has *changed* -> refused loudly,
  naming both fingerprints and the file and line of the recorded key;
- a key listed under `@revoked` is refused.
Nothing is ever added without the user asking (`kerneldev trust`).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kerneldev.errors import HostKeyError, TransferError, on_jump_host
from kerneldev.hosts.known_hosts_paths import (  # re-exported: defined here before
    USER_KNOWN_HOSTS as USER_KNOWN_HOSTS,
)
from kerneldev.hosts.known_hosts_paths import known_hosts_files as known_hosts_files
from kerneldev.hosts.known_hosts_paths import trust_file as trust_file
from kerneldev.hosts.known_hosts_paths import user_known_hosts as user_known_hosts
from kerneldev.hosts.sshlib import paramiko


@dataclass(frozen=True)
class KnownKey:
    """One key recorded for a host: where it is, and the key itself."""

    file: Path
    line: int
    key_type: str
    fingerprint: str
    key: paramiko.PKey
    revoked: bool = False


@dataclass(frozen=True)
class HostKeyCheck:
    """How a server key compares with what the known_hosts files say about the host."""

    name: str  # the known_hosts name: `host` or `[host]:port`
    key_type: str
    fingerprint: str
    status: str  # "trusted", "unknown", "changed" or "revoked"
    recorded: tuple[KnownKey, ...] = ()  # same-type keys on record (for "changed": the old ones)
    key: paramiko.PKey | None = None


def known_hosts_name(hostname: str, port: int) -> str:
    """The name a host has in known_hosts: OpenSSH writes `[host]:port` for ports other than 22."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's fingerprint: SHA256 of the key blob, base64 without padding."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def _glob_match(name: str, pattern: str) -> bool:
    # OpenSSH patterns know only `*` and `?`; `[` is literal (as in `[host]:port`).
    regex = "".join(
        ".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower()
    )
    return re.fullmatch(regex, name.lower()) is not None


def _name_matches(name: str, patterns: list[str]) -> bool:
    matched = False
    for pattern in patterns:
        if pattern.startswith("|1|"):
            # Hashed entry: HMAC-SHA1 of the name with the entry's own salt.
            if paramiko.hostkeys.HostKeys.hash_host(name, pattern) == pattern:
                matched = True
        elif pattern.startswith("!"):
            if _glob_match(name, pattern[1:]):
                return False  # an explicit negation wins, as in OpenSSH
        elif _glob_match(name, pattern):
            matched = True
    return matched


def recorded_keys(files: list[Path], name: str) -> list[KnownKey]:
    """Every key recorded for `name` in `files`, in file order, with file and line."""
    found: list[KnownKey] = []
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            continue
        except OSError as err:
            raise HostKeyError(f"cannot read known_hosts file {path}: {err}") from None
        for lineno, raw in enumerate(lines, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            revoked = False
            if line.startswith("@"):
                marker, _, line = line.partition(" ")
                if marker != "@revoked":
                    continue  # @cert-authority: certificates are not supported here
                revoked = True
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
            except Exception:  # noqa: BLE001 - a malformed or unsupported line is skipped
                continue
            if entry is None or entry.key is None or not _name_matches(name, entry.hostnames):
                continue
            found.append(
                KnownKey(
                    file=path,
                    line=lineno,
                    key_type=entry.key.get_name(),
                    fingerprint=fingerprint(entry.key),
                    key=entry.key,
                    revoked=revoked,
                )
            )
    return found


def check_key(files: list[Path], name: str, key: paramiko.PKey) -> HostKeyCheck:
    """Compare the server's key with the records; never raises for an unknown key."""
    records = recorded_keys(files, name)
    key_type = key.get_name()
    fp = fingerprint(key)
    blob = key.asbytes()
    if any(r.revoked and r.key.asbytes() == blob for r in records):
        return HostKeyCheck(name, key_type, fp, "revoked", (), key)
    same_type = tuple(r for r in records if not r.revoked and r.key_type == key_type)
    if any(r.key.asbytes() == blob for r in same_type):
        return HostKeyCheck(name, key_type, fp, "trusted", same_type, key)
    if same_type:
        return HostKeyCheck(name, key_type, fp, "changed", same_type, key)
    return HostKeyCheck(name, key_type, fp, "unknown", (), key)


def preferred_key_types(files: list[Path], name: str) -> list[str]:
    """Host-key algorithms to ask for first: the types already on record for this host, so a
    host recorded with an RSA key is not reported as unknown just because ed25519 is offered."""
    types: list[str] = []
    for r in recorded_keys(files, name):
        if r.revoked:
            continue
        algos = ["rsa-sha2-512", "rsa-sha2-256"] if r.key_type == "ssh-rsa" else [r.key_type]
        types += [a for a in algos if a not in types]
    return types


def refusal(
    check: HostKeyCheck, host_name: str, trust_path: Path, *, jump_host: str | None = None
) -> HostKeyError:
    """The error for a key that is not trusted, carrying `check`; the caller raises it.
    `jump_host` names the ProxyJump hop that offered the key, if it was not the host."""
    if check.status == "unknown":
        message = (
            f"the host key of {check.name} (host '{host_name}') is not known: "
            f"{check.key_type} {check.fingerprint}"
        )
        hint = (
            f"check the fingerprint with the host's admin, then run "
            f"`kerneldev trust --host {host_name}` to add it to {trust_path}"
        )
    elif check.status == "revoked":
        message = (
            f"the host key of {check.name} (host '{host_name}') is marked @revoked: "
            f"{check.key_type} {check.fingerprint}"
        )
        hint = "do not connect; ask the host's admin"
    else:
        old = "; ".join(f"{r.fingerprint} at {r.file}:{r.line}" for r in check.recorded)
        message = (
            f"WARNING: THE HOST KEY OF {check.name} (host '{host_name}') HAS CHANGED - someone "
            f"may be intercepting the connection (man-in-the-middle), or the host was "
            f"reinstalled. Server now offers {check.key_type} {check.fingerprint}; recorded: "
            f"{old}. Refusing to connect."
        )
        hint = (
            f"if the change is expected, remove the old key with "
            f"`ssh-keygen -R '{check.name}' -f {check.recorded[0].file}` and run "
            f"`kerneldev trust --host {host_name}`"
        )
    return HostKeyError(on_jump_host(message, jump_host), hint, check=check)


def add_known_host(path: Path, name: str, key: paramiko.PKey) -> None:
    """Append `name keytype base64` to the known_hosts file (created with mode 600)."""
    path = Path(os.path.expanduser(str(path)))
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab+") as f:
            # Start on a fresh line if the file does not end with one.
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode("utf-8"))
    except OSError as err:
        raise TransferError(f"cannot write known_hosts file {path}: {err}") from None
