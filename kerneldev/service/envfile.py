"""The service's environment file (`service.env_file`): KEY=VALUE lines that the restart command
reads, as systemd's `EnvironmentFile=`, `docker run --env-file` or a shell `export` script.

`kernels status` reads it to tell which backend the live wrapper picks; the import check after
a push imports the pushed modules with it, as the server would.

Editing (`bench --service`, `profile`): `EnvFileEdit` only touches the lines of the keys it
manages (every key named by any `service.variants` entry): `apply` replaces or appends those
lines and removes the managed keys the variant does not set; every other line stays as it was,
byte for byte. A replaced line keeps its `export ` prefix; an appended one gets it when the
file's managed lines have it (else when any line has it: a shell script that is sourced,
where a plain `K=V` would not reach the server). Writes are atomic (temporary file + rename).
`restore()` puts the managed lines back as they were before the first `apply` (and removes a
file that did not exist before and now holds nothing else).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from kerneldev.config import HostConfig
from kerneldev.errors import KerneldevError, TransferError
from kerneldev.hosts.transport.base import Transport


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines; blank lines, `#` comments and a leading `export ` are skipped, one pair
    of matching quotes around a value is removed."""
    env = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def read_service_env(transport: Transport, host: HostConfig) -> dict[str, str] | None:
    """The variables of `service.env_file`, or None when none is configured. Raises
    `TransferError` when it is configured but cannot be read."""
    path = host.service.env_file if host.service is not None else None
    if not path:
        return None
    return parse_env_file(transport.read_bytes(path).decode("utf-8", "replace"))


def export_prefix(env: dict[str, str]) -> str:
    """Shell text that exports `env` for the command that follows it."""
    return "".join(
        f"export {key}={shlex.quote(value)}; " for key, value in env.items() if key.isidentifier()
    )


# --- editing --------------------------------------------------------------------------

_LINE = re.compile(r"^\s*(export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_./:,+@%-]*")


def line_key(line: str) -> str | None:
    m = _LINE.match(line)
    return m.group(2) if m else None


def _exports(line: str) -> bool:
    m = _LINE.match(line)
    return bool(m and m.group(1))


def format_value(value: str) -> str:
    """Plain when that is unambiguous for both sh and systemd, else single-quoted."""
    return value if _SAFE_VALUE.fullmatch(value) else shlex.quote(value)


def uses_export(text: str, managed: Iterable[str] = ()) -> bool:
    """Whether a key added to `text` should be exported: as the file's lines of the `managed`
    keys are when it has some (a mixed file's author chose for these), else when any line is
    (a shell script that is sourced: a plain `K=V` would not reach the server)."""
    managed = set(managed)
    lines = [line for line in text.splitlines() if line_key(line) is not None]
    own = [line for line in lines if line_key(line) in managed]
    return any(_exports(line) for line in (own or lines))


def render(
    text: str,
    managed: Iterable[str],
    assignments: dict[str, str],
    export: bool | None = None,
) -> str:
    """`text` with the managed keys' lines set to `assignments` (others of `managed` removed).
    A rewritten line keeps its `export `; a new line gets one when `export` (default:
    `uses_export(text, managed)`)."""
    managed = set(managed) | set(assignments)
    lines = text.splitlines(keepends=True)
    export_new = uses_export(text, managed) if export is None else export
    out: list[str] = []
    placed: set[str] = set()
    for line in lines:
        key = line_key(line)
        if key is None or key not in managed:
            out.append(line)
            continue
        if key in assignments and key not in placed:
            prefix = "export " if _exports(line) else ""
            out.append(f"{prefix}{key}={format_value(assignments[key])}\n")
            placed.add(key)
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n"
    prefix = "export " if export_new else ""
    for key, value in assignments.items():
        if key not in placed:
            out.append(f"{prefix}{key}={format_value(value)}\n")
    return "".join(out)


def managed_lines(text: str, managed: Iterable[str]) -> list[str]:
    managed = set(managed)
    return [line for line in text.splitlines(keepends=True) if line_key(line) in managed]


class EnvFileEdit:
    """Edits of one env file on the host; remembers the original managed lines."""

    def __init__(self, transport: Transport, path: str, managed: Iterable[str]) -> None:
        self.transport = transport
        self.path = path
        self.managed = sorted(set(managed))
        self.original: str | None = None  # the file's text before the first apply; None: absent
        self.touched = False

    def read(self) -> str | None:
        if not self.transport.exists(self.path):
            return None
        try:
            return self.transport.read_bytes(self.path).decode("utf-8")
        except UnicodeDecodeError:
            raise TransferError(f"{self.path} on the host is not UTF-8 text") from None

    def apply(self, assignments: dict[str, str]) -> str:
        """Write the variant's assignments; returns the new text."""
        current = self.read()
        if not self.touched:
            self.original = current
        # The original file decides: an earlier variant may have removed its managed lines.
        export = uses_export(self.original or "", self.managed)
        text = render(current or "", self.managed, assignments, export=export)
        self.transport.write_atomic(self.path, text.encode("utf-8"))
        self.touched = True
        return text

    def restore(self) -> None:
        """Put the managed keys' lines back as they were (no-op when never applied)."""
        if not self.touched:
            return
        current = self.read() or ""
        originals = managed_lines(self.original or "", self.managed)
        kept = [
            line for line in current.splitlines(keepends=True) if line_key(line) not in self.managed
        ]
        if self.original is None:
            if any(line.strip() for line in kept):
                self.transport.write_atomic(self.path, "".join(kept).encode("utf-8"))
            else:
                try:
                    self.transport.remove(self.path)
                except KerneldevError:
                    self.transport.write_atomic(self.path, b"")
            self.touched = False
            return
        # Nothing else changed since: the original bytes exactly. Otherwise keep the other
        # lines as they are now (someone else's edit) and put the original managed lines back.
        others = [ln for ln in self.original.splitlines() if line_key(ln) not in self.managed]
        if [ln.rstrip("\n") for ln in kept] == others:
            text = self.original
        else:
            text = "".join(kept)
            if text and not text.endswith("\n"):
                text += "\n"
            text += "".join(ln if ln.endswith("\n") else ln + "\n" for ln in originals)
        self.transport.write_atomic(self.path, text.encode("utf-8"))
        self.touched = False
