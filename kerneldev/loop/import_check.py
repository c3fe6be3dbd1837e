"""The import check around every push and rollback: a file the live tree cannot import never
stays live, and a name other files import never silently disappears.

Before the upload (one remote command): `_importscan.py` runs on the host with its Python and
lists, for each Python module about to be replaced, the names the other files of the live tree
import from it (the files under the module's import root: for SGLang, `python/`). The new bytes
of the pushed files are read here with the same parser. A name that is imported but not
defined by the new file refuses the push (`ImportRefusedError`, exit 1), naming importer,
module and name; so does a new file that does not parse.

After the upload: the pushed modules are imported on the host with its configured `python`
and the variables of `service.env_file` (or `service.check`, a shell command, runs instead;
exit 0 = pass), writing no bytecode (`-B`, PYTHONDONTWRITEBYTECODE): the live tree holds
nothing afterwards but the pushed bytes, no `__pycache__`. On failure the push is
rolled back at once (always: a file that cannot import never stays live) and no restart
follows (`ImportFailedError`, exit 1).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from kerneldev import interrupt
from kerneldev.config import HostConfig
from kerneldev.errors import (
    DeployTally,
    RemoteCommandError,
    TransferError,
)
from kerneldev.errors import (
    ImportFailedError as ImportFailedError,  # re-exported: it was defined here
)
from kerneldev.errors import (
    ImportRefusedError as ImportRefusedError,  # re-exported: it was defined here
)
from kerneldev.hosts.transport.base import Transport
from kerneldev.hostside import importscan as _importscan
from kerneldev.loop import deploy_tally
from kerneldev.service.envfile import export_prefix, read_service_env

IMPORT_TIMEOUT = 600.0  # seconds; importing a whole SGLang package can take a while
OUTPUT_TAIL = 2000  # characters of a failed import's output kept in the report


@dataclass
class MissingImport:
    importer: str  # path relative to the host's root
    module: str
    name: str | None  # None: the module itself is imported but would be removed
    line: int


@dataclass
class ImportScan:
    modules: dict[str, str] = field(default_factory=dict)  # pushed path -> module name
    import_roots: dict[str, str] = field(default_factory=dict)  # pushed path -> its import root
    removed: list[str] = field(default_factory=list)  # pushed paths the deploy deletes
    scanned: int = 0  # files read on the host
    importers: list[str] = field(default_factory=list)  # files that import a pushed module
    missing: list[MissingImport] = field(default_factory=list)
    unparsable: list[str] = field(default_factory=list)  # pushed files that do not parse
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.unparsable


@dataclass
class ImportRun:
    command: str
    modules: list[str]
    ok: bool
    exited: int
    output: str  # the tail of stdout + stderr


@dataclass
class ImportCheckReport:
    scan: ImportScan | None = None
    after_upload: ImportRun | None = None
    rolled_back_by: str | None = None  # id of the automatic rollback after a failed import


# --- before the upload ------------------------------------------------------------------


def scan_before_upload(
    transport: Transport, host: HostConfig, new_files: dict[str, bytes | None]
) -> ImportScan:
    """Compare what the live tree imports from each replaced module with what its new bytes
    define (`None` bytes: the file is removed). `refuse_gaps(scan)` turns gaps into an error."""
    pushed = {p: d for p, d in new_files.items() if p.endswith(".py")}
    scan = ImportScan()
    if not pushed:
        return scan
    answer = _run_scanner(transport, host, sorted(pushed))
    for path, info in answer["modules"].items():
        if all(part.isidentifier() for part in info["module"].split(".")):
            scan.modules[path] = info["module"]
            scan.import_roots[path] = info["import_root"]
        else:
            scan.notes.append(f"{path}: not importable by name ({info['module']}); not checked")
            pushed.pop(path)
    scan.removed = sorted(p for p, d in pushed.items() if d is None)
    scan.scanned = answer["scanned"]
    if answer["unparsable"]:
        scan.notes.append(
            f"{len(answer['unparsable'])} file(s) on the host do not parse and were not read"
        )
    needs = [
        MissingImport(i["importer"], i["module"], i["name"], i["line"]) for i in answer["imports"]
    ]
    # The pushed files are excluded from the host's scan: their new bytes are what counts.
    targets = set(scan.modules.values())
    provided: dict[str, tuple[set[str], bool] | None] = {}
    for path, data in pushed.items():
        module = scan.modules[path]
        if data is None:
            provided[module] = None
            continue
        try:
            provided[module] = _importscan.provided_names(data)
            for mod, name, line in _importscan.imports_of(
                data, module, path.endswith("/__init__.py"), targets
            ):
                needs.append(MissingImport(path, mod, name, line))
        except SyntaxError as err:
            scan.unparsable.append(f"{path} does not parse: line {err.lineno}: {err.msg}")
    scan.importers = sorted({n.importer for n in needs})
    for need in needs:
        names = provided.get(need.module, ...)
        if names is ...:
            continue
        if names is None:  # the module would be removed
            scan.missing.append(need)
        elif need.name is not None and need.name not in names[0]:
            if names[1]:
                note = f"{need.module} defines names dynamically; {need.name} not checked"
                if note not in scan.notes:
                    scan.notes.append(note)
            else:
                scan.missing.append(need)
    scan.missing = _unique(scan.missing)
    return scan


def refuse_gaps(scan: ImportScan) -> None:
    """Raise `ImportRefusedError` naming, per replaced module, each missing name and who
    imports it."""
    refusals = list(scan.unparsable)
    by_module: dict[str, dict[str | None, list[str]]] = {}
    for m in scan.missing:
        by_module.setdefault(m.module, {}).setdefault(m.name, []).append(f"{m.importer}:{m.line}")
    for module, names in by_module.items():
        path = next(p for p, mod in scan.modules.items() if mod == module)
        gaps = [
            f"{name or 'the module itself'} (imported by {', '.join(where)})"
            for name, where in names.items()
        ]
        verb = "would remove" if path in scan.removed else "lacks"
        refusals.append(f"the new {path} ({module}) {verb} " + "; ".join(gaps))
    if refusals:
        raise ImportRefusedError(
            "refused before upload, the live tree would not import: " + ". ".join(refusals),
            hint=_refusal_hint(scan),
        )


def _refusal_hint(scan: ImportScan) -> str:
    """What to do: fix a file that does not parse (skipping the check would deploy it broken);
    keep the names the live tree imports."""
    broken = [
        p
        for p in scan.modules
        if any(u.startswith(f"{p} does not parse:") for u in scan.unparsable)
    ]
    keep = "keep the missing names in the new file (docs/kernels.md lists the compatibility names)"
    if not broken:
        return f"{keep}, or skip this check with --no-import-check"
    quoted = " ".join(shlex.quote(p) for p in broken)
    fix = (
        f"fix the syntax error in {', '.join(broken)} at the line named above (`python -m "
        f"py_compile {quoted}` in the workspace checks it), then push again"
    )
    return f"{fix}; {keep}" if scan.missing else fix


def _unique(items: list[MissingImport]) -> list[MissingImport]:
    seen, out = set(), []
    for m in items:
        key = (m.importer, m.module, m.name)
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


def _python_command(host: HostConfig, script: str, args: str = "", *, fallback: bool = True) -> str:
    """Run `script` with the host's configured python (else python3, with `fallback`); exit 127
    if none is there. No bytecode is written (-B): importing the pushed modules must leave
    nothing in the live tree but the pushed bytes (no `__pycache__`)."""
    pythons = [host.python, "python3"] if fallback else [host.python]
    candidates = " ".join(shlex.quote(p) for p in dict.fromkeys(pythons))
    missing = shlex.quote(f"kerneldev: no python on the host ({' or '.join(pythons)})")
    return (
        f"for p in {candidates}; do "
        f'if command -v "$p" >/dev/null 2>&1; then PYTHONUTF8=1 PYTHONDONTWRITEBYTECODE=1 '
        f'exec "$p" -B -c {shlex.quote(script)}'
        f"{args}; fi; done; echo {missing} >&2; exit 127"
    )


_SCANNER: str | None = None


def _run_scanner(transport: Transport, host: HostConfig, targets: list[str]) -> dict:
    global _SCANNER
    if _SCANNER is None:
        _SCANNER = Path(_importscan.__file__).read_text(encoding="utf-8")
    request = json.dumps({"root": host.root, "targets": targets, "exclude": targets})
    result = transport.run(_python_command(host, _SCANNER), stdin=request.encode("utf-8"))
    if not result.ok:
        tail = (result.stderr.strip().splitlines() or ["no error output"])[-1]
        raise TransferError(
            f"the import scan on {host.name} failed (exit {result.exited}): {tail}",
            hint="set `python:` in hosts.yaml to a Python 3 on the host, or push with "
            "--no-import-check",
        )
    try:
        return json.loads(result.stdout)
    except ValueError:
        raise TransferError(f"the import scan on {host.name} answered garbage") from None


# --- after the upload -------------------------------------------------------------------


def _importer_source() -> str:
    """hostside/importer.py, run with `python -c`."""
    return (resources.files("kerneldev.hostside") / "importer.py").read_text(encoding="utf-8")


def import_command(host: HostConfig, modules: dict[str, str], roots: dict[str, str]) -> str:
    """The default check: import each pushed module (path -> module) with the host's python,
    its import root first on sys.path."""
    pairs = [[posixpath.join(host.root, roots[p]), m] for p, m in modules.items()]
    first = pairs[0][0]
    args = " " + shlex.quote(json.dumps(pairs))
    # Only the configured python: another interpreter's verdict says nothing of the server's.
    return f"cd {shlex.quote(first)} && " + _python_command(
        host, _importer_source(), args, fallback=False
    )


def import_after_upload(
    transport: Transport, host: HostConfig, scan: ImportScan
) -> ImportRun | None:
    """Import the pushed modules on the host (or run `service.check`)."""
    modules = {p: m for p, m in scan.modules.items() if p not in scan.removed}
    if not modules:
        return None
    custom = host.service.check if host.service is not None else None
    try:  # import as the server would: with the variables its restart reads
        env = read_service_env(transport, host) or {}
    except TransferError:
        env = {}
    if custom:
        names = " ".join(modules.values())
        command = f"KERNELDEV_MODULES={shlex.quote(names)}; export KERNELDEV_MODULES; {custom}"
    else:
        command = import_command(host, modules, scan.import_roots)
    shown = custom or f"{host.python} -c 'import {', '.join(modules.values())}'"
    try:
        result = transport.run(export_prefix(env) + command, timeout=IMPORT_TIMEOUT)
    except RemoteCommandError as err:
        return ImportRun(shown, list(modules.values()), False, -1, err.message)
    output = (result.stdout + result.stderr)[-OUTPUT_TAIL:]
    return ImportRun(shown, list(modules.values()), result.ok, result.exited, output)


def verify_after_upload(
    transport: Transport,
    host: HostConfig,
    report: ImportCheckReport,
    undo: Callable[[], str] | None,
    what: str,
) -> None:
    """Run the import; on failure call `undo` (returns the rollback's deploy id) and raise
    `ImportFailedError`. `what` names the deploy in messages ("push 2026...")."""
    if report.scan is None:
        return
    run = import_after_upload(transport, host, report.scan)
    report.after_upload = run
    if run is None or run.ok:
        return
    last = [line for line in run.output.strip().splitlines() if line.strip()][-1:] or ["no output"]
    if undo is not None:
        report.rolled_back_by = undo()
        done = f"rolled back as {report.rolled_back_by}; nothing was restarted"
    else:
        done = "nothing was restarted"
    raise ImportFailedError(
        f"{what}: the pushed files do not import on {host.name} (exit {run.exited}): "
        f"{last[0]}; {done}",
        hint="fix the file and push again; the full output is in --json (import_check)",
    )


@contextmanager
def check_deploy(
    transport: Transport,
    host: HostConfig,
    result,
    new_files: dict[str, bytes | None],
    enabled: bool,
    undo: Callable[[], str] | None,
) -> Iterator[None]:
    """Around a deploy's uploads (the `with` body): scan before, import after. Fills
    `result.import_check`; errors carry it as `report`, so `--json` still prints it. `undo` rolls
    the deploy back after a failed import (None: report only, as for a rollback)."""
    if not enabled:
        yield
        return
    report = ImportCheckReport()
    result.import_check = report
    report.scan = scan_before_upload(transport, host, new_files)
    try:
        refuse_gaps(report.scan)
    except ImportRefusedError as err:
        err.report = result
        raise
    yield
    try:
        verify_after_upload(transport, host, report, undo, f"deploy {result.deploy_id}")
    except ImportFailedError as err:
        err.report = result
        raise
    except interrupt.Interrupted as err:
        if err.tally is not None:  # the undo itself was stopped: its summary stands
            err.report = result
            raise
        # The files have landed; say so, and that their import was not checked.
        landed = getattr(result, "deployed", None)
        if landed is None:
            landed = [f.path for f in result.files]
        stopped = interrupt.Interrupted(
            err.signum,
            f"deploy {result.deploy_id} {err.message} during the import check: its files are "
            "live, their import was not checked",
        )
        deploy_tally.attach(stopped, DeployTally(tuple(landed), ()))
        stopped.hint = "`kerneldev rollback` undoes it; pushing again re-runs the check"
        stopped.report = result
        raise stopped from None
