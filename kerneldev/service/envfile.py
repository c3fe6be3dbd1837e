"""The service's environment file (`service.env_file`): KEY=VALUE lines that the restart command
reads, as systemd's `EnvironmentFile=`, `docker run --env-file` or a shell `export` script.

`kernels status` reads it to tell which backend the live wrapper picks; the import check after
a push imports the pushed modules with it, as the server would; `bench` runs its kernel
switches (`SGLANG_SM120_*`) for `dispatch`.

Reading (`parse_env_file`): kerneldev cannot know which of the three readers the restart uses,
so it reads each stretch of the file (a line, or lines a reader joins) as a shell that sources
it, as systemd's EnvironmentFile= (src/basic/env-file.c) and as docker's --env-file
(cli/opts/envfile.go) do. Where they agree the answer is plain; where they do not (an inline
`#` after an unquoted value, several assignments on a line, a continuation, spaces around
`=`, `unset`, CR LF, expansions, ...) it takes the shell's reading and adds a warning naming
the line and each reader's. `export` is the shell's form of the line (systemd ignores such
lines, docker refuses the file): compared without it. docker counts only where it would take
the file at all. docs/service-bench.md has the rules.

Editing (`bench --service`, `profile`): `EnvFileEdit` only touches the lines of the keys it
manages (every key named by any `service.variants` entry): `apply` replaces or appends those
lines and removes the managed keys the variant does not set; every other line stays as it was,
byte for byte. A replaced line keeps its `export ` prefix; an appended one gets it when the
file's managed lines have it (else when any line has it: a shell script that is sourced,
where a plain `K=V` would not reach the server). Writes are atomic (temporary file + rename).
The lines are the same stretches: a continued line is rewritten whole, and a rewrite that
would change any reader's reading of a key it does not manage is refused (`RefusedError`).
`restore()` puts the managed lines back as they were before the first `apply` (and removes a
file that did not exist before and now holds nothing else).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from kerneldev.config import HostConfig
from kerneldev.errors import KerneldevError, RefusedError, TransferError
from kerneldev.hosts.transport.base import Transport

# --- reading: what a shell, systemd and docker make of the file ---------------------------

SH, SYSTEMD, DOCKER = "sh", "systemd", "docker"
READER_NAMES = {
    SH: "a shell that sources it",
    SYSTEMD: "systemd's EnvironmentFile=",
    DOCKER: "docker's --env-file",
}
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
_SH_META = "|&;<>()"
_SET_OPTION = re.compile(r"[-+][A-Za-z]+")
# commands that may set variables: kerneldev cannot tell what a shell gets from them
_SETTING_COMMANDS = {".", "source", "eval", "readonly", "declare", "typeset", "local", "read"}

Op = tuple[str, "str | None"]  # (key, value); value None: the key is unset


@dataclass
class _ShCommand:
    """One command line of the file as a POSIX shell lexes it (up to an unquoted newline)."""

    start: int  # first physical line, 1-based
    end: int  # last physical line
    words: list[tuple[str, str, bool]] = field(default_factory=list)  # (value, raw, expands)
    problem: str | None = None  # why kerneldev cannot tell what a shell does with it


def _sh_commands(text: str) -> list[_ShCommand]:
    """The file's command lines, lexed as a POSIX shell does: quotes, backslash escapes and
    continuation, `#` comments at the start of a word. Expansions are not performed: a word
    with `$`, a backquote or an unquoted `~` is marked."""
    out: list[_ShCommand] = []
    i, n, line = 0, len(text), 1
    cmd = _ShCommand(line, line)
    value: list[str] | None = None
    raw_start = 0
    expands = False

    def end_word(at: int) -> None:
        nonlocal value, expands
        if value is not None:
            cmd.words.append(("".join(value), text[raw_start:at], expands))
        value, expands = None, False

    def start_word(at: int) -> None:
        nonlocal value, raw_start
        if value is None:
            value, raw_start = [], at

    while i < n:
        c = text[i]
        if c == "\\":
            if text.startswith("\n", i + 1):  # continuation: both characters vanish
                i += 2
                line += 1
                continue
            start_word(i)
            value.append(text[i + 1 : i + 2] or "\\")
            i += 2
        elif c == "'":
            start_word(i)
            close = text.find("'", i + 1)
            if close < 0:
                cmd.problem = cmd.problem or "a quote that is never closed"
                close = n
            value.append(text[i + 1 : close])
            line += text.count("\n", i + 1, close)
            i = close + 1
        elif c == '"':
            start_word(i)
            i += 1
            while i < n and text[i] != '"':
                d = text[i]
                if d == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                    if text[i + 1] == "\n":
                        line += 1
                    else:
                        value.append(text[i + 1])
                    i += 2
                    continue
                if d in "$`":
                    expands = True
                if d == "\n":
                    line += 1
                value.append(d)
                i += 1
            if i >= n:
                cmd.problem = cmd.problem or "a quote that is never closed"
            i += 1
        elif c == "\n":
            end_word(i)
            cmd.end = line
            out.append(cmd)
            line += 1
            cmd = _ShCommand(line, line)
            i += 1
        elif c in " \t":
            end_word(i)
            i += 1
        elif c == "#" and value is None:
            while i < n and text[i] != "\n":
                i += 1
        else:
            start_word(i)
            if c in _SH_META:
                cmd.problem = cmd.problem or f"`{c}` (more than one command, or a redirection)"
            if c in "$`~":
                expands = True
            value.append(c)
            i += 1
    end_word(n)
    cmd.end = line
    if cmd.words or cmd.problem:
        out.append(cmd)
    return out


@dataclass
class _ShReading:
    ops: list[Op]
    export: bool = False  # an `export` line
    known: bool = True  # False: a shell may do something kerneldev cannot tell
    says: str = ""  # how the shell takes the line, when it is not a plain assignment


def _sh_reading(cmd: _ShCommand) -> _ShReading:
    if cmd.problem:
        return _ShReading([], known=False, says=f"kerneldev cannot tell: {cmd.problem}")
    if not cmd.words:
        return _ShReading([])
    words = cmd.words
    first = words[0][1]
    if first == "export":
        ops: list[Op] = []
        for value, raw, expands in words[1:]:
            m = _ASSIGN_RE.match(raw)
            if m and not expands:
                ops.append((m.group(1), value[len(m.group(0)) :]))
            elif not (_NAME_RE.fullmatch(raw)):  # `export NAME` alone changes no value
                return _ShReading([], True, False, f"kerneldev cannot tell what `{raw}` gives")
        return _ShReading(ops, export=True)
    if first == "unset":
        names = [raw for _, raw, _ in words[1:] if raw != "-v"]
        if all(_NAME_RE.fullmatch(name) for name in names):
            return _ShReading([(name, None) for name in names], says="unsets " + ", ".join(names))
        return _ShReading([], known=False, says="kerneldev cannot tell what this `unset` does")
    if first == "set" and all(_SET_OPTION.fullmatch(raw) for _, raw, _ in words[1:]):
        return _ShReading([])  # `set -a` and the like: shell options, no variable
    assigned: list[Op] = []
    for value, raw, expands in words:
        m = _ASSIGN_RE.match(raw)
        if not m:
            break
        if expands:
            return _ShReading([], known=False, says=f"expands `{raw}`: kerneldev cannot tell")
        assigned.append((m.group(1), value[len(m.group(0)) :]))
    else:
        return _ShReading(assigned)
    command = words[len(assigned)][1]
    # `A=1 export B=2`, `A=1 unset B`: shells differ on whether A stays, and the builtin still
    # sets or unsets its operands: not "sets nothing"
    if command in _SETTING_COMMANDS or command in ("export", "unset", "set"):
        return _ShReading([], known=False, says=f"kerneldev cannot tell what `{command}` sets")
    return _ShReading([], says=f"runs `{command}` as a command (sets nothing)")


_SD_WHITESPACE = " \t\n\r"
_SD_NEWLINE = "\n\r"
_SD_NEED_ESCAPE = '"\\`$'


@dataclass
class _SdEntry:
    start: int  # physical lines, 1-based
    end: int
    key: str
    value: str | None  # None: a line with no `=` (ignored)


def _systemd_entries(text: str) -> list[_SdEntry]:
    """The assignments systemd's EnvironmentFile= parser (src/basic/env-file.c) finds, with the
    lines each spans: comments (`#`, `;`) only at the start of a line; an unquoted value keeps
    its inner whitespace, `#` and quotes, drops the surrounding whitespace, takes `\\x` as x
    and joins a line ending in `\\`; quoted values as in a shell (spanning lines)."""
    entries: list[_SdEntry] = []
    state = "pre_key"
    key: list[str] = []
    value: list[str] = []
    line = start = 1
    last_ws: int | None = None  # index in value where trailing whitespace starts

    def push(end: int) -> None:
        k = "".join(key).rstrip(" \t\n\r")
        v = "".join(value)
        if state == "value" and last_ws is not None:
            v = v[:last_ws]
        entries.append(_SdEntry(start, end, k, v))

    for c in text:
        nl = c == "\n"
        if state == "pre_key":
            if c in "#;":
                state = "comment"
            elif c not in _SD_WHITESPACE:
                state, key, value, start = "key", [c], [], line
        elif state == "key":
            if c in _SD_NEWLINE:
                state = "pre_key"  # no `=`: ignored
            elif c == "=":
                state, last_ws = "pre_value", None
            else:
                key.append(c)
        elif state == "pre_value":
            if c in _SD_NEWLINE:
                push(line)
                state = "pre_key"
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif c not in _SD_WHITESPACE:
                state = "value"
                value.append(c)
        elif state == "value":
            if c in _SD_NEWLINE:
                push(line)
                state = "pre_key"
            elif c == "\\":
                state, last_ws = "value_escape", None
            else:
                if c not in _SD_WHITESPACE:
                    last_ws = None
                elif last_ws is None:
                    last_ws = len(value)
                value.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in _SD_NEWLINE:
                value.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                value.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value.append(c)
        elif state == "double_escape":
            state = "double"
            if c in _SD_NEED_ESCAPE:
                value.append(c)
            elif c != "\n":
                value.extend(("\\", c))
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in _SD_NEWLINE:
                state = "pre_key"
        elif state == "comment_escape":
            state = "pre_key" if c in _SD_NEWLINE else "comment"
        if nl:
            line += 1
    if state not in ("pre_key", "key", "comment", "comment_escape"):
        push(line)
    return entries


def _systemd_ops(entries: list[_SdEntry]) -> list[Op]:
    # Names that are not valid environment names are ignored ("Ignoring invalid environment
    # assignment"), `export KEY=V` among them.
    return [(e.key, e.value or "") for e in entries if _NAME_RE.fullmatch(e.key)]


# What docker's reader strips from a line's start (Go's unicode.IsSpace: not Python's
# str.isspace, which also takes \x1c-\x1f), and the only characters it refuses in a name.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_DOCKER_NAME_SPACE = " \t"
_DOCKER_MAX_LINE = 65536  # bytes: bufio.Scanner's token limit ("token too long")
_BOM = "\ufeff"


class FromDockerEnv(str):
    """The value docker takes for a line that names a variable without `=`: the variable's
    value in the environment the `docker` command runs in (the line is dropped where it is
    not set there), which kerneldev cannot know. A `str` (never a value read from a file: it
    is compared by identity) so that an `Op` stays (key, str | None)."""

    def __new__(cls) -> FromDockerEnv:
        return super().__new__(cls, "\0from the environment docker runs in")


FROM_DOCKER_ENV = FromDockerEnv()


def _docker_line(line: str, first: bool) -> tuple[list[Op], str | None]:
    """What `docker run --env-file` takes from one line (without its `\\n`; `first`: the
    file's first line), as its reader does (cli/opts/envfile.go, checked against the docker
    28 CLI: tests/test_env_file_docker.py): no quotes, escapes or inline comments; a UTF-8 BOM
    dropped from the first line, one CR from the end, then Go's whitespace from the start;
    the value as written, up to the line's end; a name alone is taken from docker's own
    environment. The second item: why docker refuses the whole file, else None."""
    if len(line.encode("utf-8", "surrogatepass")) >= _DOCKER_MAX_LINE:
        return [], "bufio.Scanner: token too long"
    if "\ufffd" in line:  # the file was read with its invalid UTF-8 bytes replaced
        return [], "invalid utf8 bytes"
    if first and line.startswith(_BOM):
        line = line[len(_BOM) :]
    stripped = line.removesuffix("\r").lstrip(_GO_SPACE)
    if not stripped or stripped.startswith("#"):
        return [], None
    name, eq, value = stripped.partition("=")
    if not name:
        return [], "no variable name"
    if any(ch in name for ch in _DOCKER_NAME_SPACE):
        return [], f"variable {name!r} contains whitespaces"
    return [(name, value if eq else FROM_DOCKER_ENV)], None


def docker_reading(physical: list[str]) -> tuple[list[list[Op]], str | None]:
    """What `docker run --env-file` takes from each of the file's lines (`_physical_lines`),
    and why it refuses the whole file (its message, with the line), else None."""
    taken: list[list[Op]] = []
    for no, row in enumerate(physical):
        ops, refused = _docker_line(row.removesuffix("\n"), no == 0)
        if refused is not None:
            return [[] for _ in physical], f"line {no + 1}: {refused}"
        taken.append(ops)
    return taken, None


@dataclass
class EnvLine:
    """A stretch of the file that every reader takes as one whole (a line, or lines joined by
    a continuation or a quote), and what each reader makes of it."""

    start: int  # physical lines, 1-based
    end: int
    text: str  # as written, with its newline(s)
    ops: list[Op]  # kerneldev's reading: the shell's (systemd's where the shell's is unknown)
    readings: dict[str, str]  # reader -> how it takes the stretch (only when they differ)
    export: bool = False  # written `export KEY=...`
    keys: list[str] = field(default_factory=list)  # every key a reader sets or unsets here
    # each reader's own reading, for the rewrite's check: the shell's (None: kerneldev cannot
    # tell), systemd's, docker's (None: docker refuses the file, so it is not its reader)
    own: dict[str, list[Op] | None] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"line {self.start}" if self.start == self.end else f"lines {self.start}-{self.end}"

    @property
    def shown(self) -> str:
        """The stretch as written: in backquotes, or as a Python string literal when it spans
        lines or holds a control character (a carriage return, say)."""
        text = self.text.rstrip("\n")
        return f"`{text}`" if text.replace("\t", " ").isprintable() else repr(text)

    @property
    def warning(self) -> str | None:
        if not self.readings:
            return None
        takes = "; ".join(f"{READER_NAMES[r]}: {how}" for r, how in self.readings.items())
        ours = _ops_text(self.ops) if self.ops else "nothing"
        return f"{self.where} {self.shown} is read differently ({takes}); kerneldev reads {ours}"


def _show(value: str) -> str:
    return value if _SAFE_VALUE.fullmatch(value) else repr(value)


def _op_text(key: str, value: str | None) -> str:
    if value is None:
        return f"unset {key}"
    if value is FROM_DOCKER_ENV:
        return f"{key} from the environment docker runs in"
    return f"{key}={_show(value)}"


def _ops_text(ops: list[Op]) -> str:
    return ", ".join(_op_text(k, v) for k, v in ops)


class EnvFile(dict):
    """`parse_env_file`'s answer: the variables (a dict), with `warnings` (one per stretch of
    the file that a shell, systemd and docker read differently) and the file's `lines`."""

    def __init__(self, env: dict[str, str], lines: list[EnvLine], warnings: list[str]) -> None:
        super().__init__(env)
        self.lines = lines
        self.warnings = warnings


def _physical_lines(text: str) -> list[str]:
    """The lines as every reader counts them: ended by `\\n` only, each with its newline."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def env_lines(text: str) -> list[EnvLine]:
    """The file cut into stretches that every reader takes as a whole, each with its reading
    and, where the readers differ, how each takes it."""
    physical = _physical_lines(text)
    commands = _sh_commands(text)
    readings = {c.start: (c, _sh_reading(c)) for c in commands}
    # systemd and docker read an `export KEY=V` line as the same line without `export`: the
    # prefix is the shell's way to write what they take (systemd ignores it, docker refuses
    # the file); the file's form, not a difference between them, so compared without it.
    bare = list(physical)
    for c, r in readings.values():
        row = bare[c.start - 1] if c.start <= len(bare) else ""
        at = row.find("export")
        if r.export and at >= 0:
            bare[c.start - 1] = row[:at] + " " * len("export") + row[at + len("export") :]
    entries = _systemd_entries("".join(bare))
    docker, refused = docker_reading(physical)
    docker_reads = refused is None  # docker could be its reader
    # Cut between physical lines, except inside a stretch some reader takes as one.
    joined = set()
    for s, e in [(c.start, c.end) for c in commands] + [(x.start, x.end) for x in entries]:
        joined.update(range(s, e))  # no cut after lines s..e-1
    lines: list[EnvLine] = []
    first = 1
    for no in range(1, len(physical) + 1):
        if no in joined and no < len(physical):
            continue
        sh = [r for s, (_, r) in readings.items() if first <= s <= no]
        sd = _systemd_ops([x for x in entries if first <= x.start <= no])
        dk = [op for row in docker[first - 1 : no] for op in row]
        lines.append(
            _compare("".join(physical[first - 1 : no]), first, no, sh, sd, dk, docker_reads)
        )
        first = no + 1
    return lines


def _compare(
    text: str,
    start: int,
    end: int,
    sh: list[_ShReading],
    sd: list[Op],
    dk: list[Op],
    docker_reads: bool,
) -> EnvLine:
    sh_ops = [op for r in sh for op in r.ops]
    known = all(r.known for r in sh)
    ops = sh_ops if known else sd
    # A name docker takes from its own environment is shown, but is not a key the line sets:
    # kerneldev cannot know that value, and a rewrite that drops such a line (joined to a
    # managed one) is not refused for it.
    dk_set = [op for op in dk if op[1] is not FROM_DOCKER_ENV]
    keys = list(dict.fromkeys(k for k, _ in sh_ops + sd + (dk_set if docker_reads else [])))
    own = {SH: sh_ops if known else None, SYSTEMD: sd, DOCKER: dk_set if docker_reads else None}
    line = EnvLine(start, end, text, ops, {}, any(r.export for r in sh), keys, own)
    if not known or sd != sh_ops or (docker_reads and dk != sh_ops):
        says = "; ".join(r.says for r in sh if r.says)
        line.readings[SH] = _ops_text(sh_ops) if known and sh_ops else (says or "nothing")
        line.readings[SYSTEMD] = _ops_text(sd) if sd else "ignores it"
        if docker_reads:
            line.readings[DOCKER] = _ops_text(dk) if dk else "nothing"
    return line


def parse_env_file(text: str) -> EnvFile:
    """The variables the file gives the server (a dict), read as a shell that sources it
    does where a shell, systemd's EnvironmentFile= and docker's --env-file agree; where they
    do not, the shell's reading (systemd's where kerneldev cannot tell the shell's) and a
    warning naming the line and how each reader takes it (docs/service-bench.md)."""
    lines = env_lines(text)
    env: dict[str, str] = {}
    for line in lines:
        for key, value in line.ops:
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
    return EnvFile(env, lines, [w for w in (line.warning for line in lines) if w])


def read_service_env(transport: Transport, host: HostConfig) -> EnvFile | None:
    """The variables of `service.env_file` (`parse_env_file`: with its `warnings`), or None
    when none is configured. Raises
    `TransferError` when it is configured but cannot be read."""
    path = host.service.env_file if host.service is not None else None
    if not path:
        return None
    return parse_env_file(transport.read_bytes(path).decode("utf-8", "replace"))


# What `env_file_kind` finds at the path: a readable file, a file the login user cannot read,
# something other than a file, nothing in an existing folder (not created yet: `bench
# --service` creates it), nothing and no folder (a mistyped path)
FILE, UNREADABLE, OTHER, MISSING, NO_FOLDER = "file", "unreadable", "other", "missing", "no-folder"


def env_file_kind(transport: Transport, path: str) -> tuple[str, str]:
    """What is at `path` on the host (one of the kinds above), in one command; with the
    command's own words when it answered none of them (the kind is then those words)."""
    q, d = shlex.quote(path), shlex.quote(posixpath.dirname(path) or "/")
    result = transport.run(
        f"if [ -f {q} ]; then if [ -r {q} ]; then echo {FILE}; else echo {UNREADABLE}; fi; "
        f"elif [ -e {q} ]; then echo {OTHER}; elif [ -d {d} ]; then echo {MISSING}; "
        f"else echo {NO_FOLDER}; fi",
        timeout=30,
    )
    kind = result.stdout.strip()
    return kind, result.stderr.strip() or f"exit {result.exited}"


def export_prefix(env: dict[str, str]) -> str:
    """Shell text that exports `env` for the command that follows it."""
    return "".join(
        f"export {key}={shlex.quote(value)}; " for key, value in env.items() if key.isidentifier()
    )


# --- editing --------------------------------------------------------------------------

_SAFE_VALUE = re.compile(r"[A-Za-z0-9_./:,+@%-]*")


def format_value(value: str) -> str:
    """Plain when that is unambiguous for both sh and systemd, else single-quoted."""
    return value if _SAFE_VALUE.fullmatch(value) else shlex.quote(value)


def _mine(line: EnvLine, managed: set[str]) -> list[str]:
    return [k for k in line.keys if k in managed]


def uses_export(text: str, managed: Iterable[str] = ()) -> bool:
    """Whether a key added to `text` should be exported: as the file's lines of the `managed`
    keys are when it has some (a mixed file's author chose for these), else when any line is
    (a shell script that is sourced: a plain `K=V` would not reach the server)."""
    managed = set(managed)
    lines = [line for line in env_lines(text) if line.keys]
    own = [line for line in lines if _mine(line, managed)]
    return any(line.export for line in (own or lines))


def render(
    text: str,
    managed: Iterable[str],
    assignments: dict[str, str],
    export: bool | None = None,
    *,
    path: str = "the env file",
) -> str:
    """`text` with the managed keys' lines set to `assignments` (others of `managed` removed).
    A line is a managed key's when a reader sets or unsets a managed key on it (a line
    continued or quoted over several is one); it is rewritten whole. A rewritten line keeps its
    `export `; a new line gets one when `export` (default: `uses_export(text, managed)`).
    Raises `RefusedError` where the rewrite would change how a shell, systemd or docker reads
    a key that is not managed (a line that sets a managed key and another)."""
    managed = set(managed) | set(assignments)
    export_new = uses_export(text, managed) if export is None else export
    out: list[str] = []
    placed: set[str] = set()
    for line in env_lines(text):
        mine = _mine(line, managed)
        if not mine:
            out.append(line.text)
            continue
        others = [k for k in line.keys if k not in managed]
        if others:
            raise _refuse(path, line, f"sets {', '.join(mine)} and also {', '.join(others)}")
        prefix = "export " if line.export else ""
        for key in mine:
            if key in assignments and key not in placed:
                out.append(f"{prefix}{key}={format_value(assignments[key])}\n")
                placed.add(key)
    prefix = "export " if export_new else ""
    added = [f"{prefix}{k}={format_value(v)}\n" for k, v in assignments.items() if k not in placed]
    if added and out and not out[-1].endswith("\n"):
        out[-1] += "\n"
    out += added
    new = "".join(out)
    _check_rewrite(path, text, new, managed, assignments)
    return new


def _traces(text: str, managed: set[str]) -> dict[str, list]:
    """Per reader, what it does with the keys that are not managed, in order (docker's: only
    that it refuses the file, when it does)."""
    traces: dict[str, list] = {SH: [], SYSTEMD: [], DOCKER: []}
    for line in env_lines(text):
        for reader, ops in line.own.items():
            if ops is not None:
                traces[reader].extend(op for op in ops if op[0] not in managed)
            elif reader == SH and not _mine(line, managed):
                # kept as written: the same either way (its line end aside: a last line without
                # one gets it when a line is appended after it)
                traces[reader].append(("?", line.text.rstrip("\r\n")))
            elif reader == DOCKER:
                traces[reader] = ["refuses the file"]
    return traces


def _check_rewrite(
    path: str, old: str, new: str, managed: set[str], assignments: dict[str, str]
) -> None:
    """The rewrite must leave every reader's reading of the other keys as it was, and give
    kerneldev's reading the assignments."""
    before, after = _traces(old, managed), _traces(new, managed)
    # docker's reading counts only where docker takes the file as it was (else it is not
    # the reader: the service could not start with it)
    readers = [r for r in after if r != DOCKER or before[DOCKER] != ["refuses the file"]]
    changed = [READER_NAMES[r] for r in readers if before[r] != after[r]]
    got = parse_env_file(new)
    wrong = sorted(k for k in managed if got.get(k) != assignments.get(k))
    if changed or wrong:
        what = (
            f"it would change what {' and '.join(changed)} read(s) of its other variables"
            if changed
            else f"{', '.join(wrong)} would not read as set"
        )
        raise RefusedError(
            f"kerneldev cannot rewrite {path} for "
            f"{_ops_text(list(assignments.items())) or 'a variant that sets nothing'}: {what}",
            hint="put each variable kerneldev manages (service.variants) on a plain "
            "KEY=VALUE line of its own, then run again",
        )


def _refuse(path: str, line: EnvLine, why: str) -> RefusedError:
    return RefusedError(
        f"kerneldev cannot rewrite {line.where} of {path} ({line.shown}): it {why}, and "
        "rewriting it would change how the server reads the variables it does not manage",
        hint="put each variable kerneldev manages (service.variants) on a line of its own, "
        "then run again",
    )


def managed_lines(text: str, managed: Iterable[str]) -> list[str]:
    managed = set(managed)
    return [line.text for line in env_lines(text) if _mine(line, managed)]


def _other_lines(text: str, managed: Iterable[str]) -> list[str]:
    managed = set(managed)
    return [line.text for line in env_lines(text) if not _mine(line, managed)]


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
        text = render(current or "", self.managed, assignments, export=export, path=self.path)
        self.transport.write_atomic(self.path, text.encode("utf-8"))
        self.touched = True
        return text

    def restore(self) -> None:
        """Put the managed keys' lines back as they were (no-op when never applied)."""
        if not self.touched:
            return
        current = self.read() or ""
        originals = managed_lines(self.original or "", self.managed)
        kept = _other_lines(current, self.managed)
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
        others = _other_lines(self.original, self.managed)
        if [ln.rstrip("\n") for ln in kept] == [ln.rstrip("\n") for ln in others]:
            text = self.original
        else:
            text = "".join(kept)
            if text and not text.endswith("\n"):
                text += "\n"
            text += "".join(ln if ln.endswith("\n") else ln + "\n" for ln in originals)
        self.transport.write_atomic(self.path, text.encode("utf-8"))
        self.touched = False
