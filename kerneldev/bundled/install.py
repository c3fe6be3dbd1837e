"""Deploying the bundled kernels safely: `kerneldev kernels install` and `kernels status`.

install: finds the live kernel file among the configured files by name, at one of SGLang's
layouts (`python/sglang/srt/layers/attention/`, 0.5.14 and older, or
`python/sglang/kernels/ops/attention/`, 0.5.23), pulls it when the workspace copy is not current,
and writes the bundled file over the workspace copy: an edit that `push` deploys (with its
import checks). The live wrapper stays unless `with_wrapper`, and then only when the bundled
wrapper defines every public name of the live one.

status: per kernel site, whether the live kernel file is this kerneldev's bundled file, an
older bundled release (by sha256, `kernel_releases.py`) or something else, and which backend
the live wrapper's entry reaches (FlashInfer, Triton with the MMA or SIMT kernel, torch) for a
decode call and a prefill-sized call: not read from the wrapper's text but from the live
dispatch, by `hostside/kernelprobe.py` run on the host with its python and the variables of
`service.env_file`, no `SGLANG_*` variable of the login environment that the file does not set
(SERVICE_ONLY_PREFIX), unknown, with the reason, when the wrapper cannot be imported there. The
wrapper reads its switch and imports the kernel once, so notes say when the env file changed
after the service's last restart by kerneldev, when the running server (found from
service.url's port) started before the live files changed, and when its own SGLANG_SM120_*
values differ from the env file's (changed since it started, or set elsewhere: the restart
command, the login environment); then what its values select is probed too (`running`).
One probe process answers every site (and every variant of an A/B's preflight,
`dispatches_under`): it imports torch once and forks a child per job (`hostside/kernelprobe.py`
says when a job gets a fresh interpreter instead).
"""

from __future__ import annotations

import ast
import datetime as _dt
import difflib
import hashlib
import importlib.resources
import json
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from kerneldev.atomic_file import write_bytes_atomic
from kerneldev.bundled import DEFAULT_HEADS, MAX_HEADS
from kerneldev.bundled.releases import RELEASED
from kerneldev.config import HostConfig
from kerneldev.errors import RefusedError, RemoteCommandError, TransferError, UsageError
from kerneldev.hosts.transport.base import Transport
from kerneldev.hostside import kernelprobe as _kernelprobe
from kerneldev.loop import sync
from kerneldev.loop.state import STATE_DIR, load_state
from kerneldev.service import restart_record, server_process
from kerneldev.service.envfile import export_prefix, parse_env_file

KERNEL_FILE = "flash_mla_sm120_triton.py"
WRAPPER_FILE = "flash_mla_sm120.py"
# SGLang's layouts: up to 0.5.14 under srt/layers/attention/, from 0.5.23 (at the latest) under
# kernels/ops/attention/. Both below SGLang's import root `python/`.
IMPORT_ROOT = "python"
LAYOUTS = {
    "python/sglang/srt/layers/attention": "sglang",
    "python/sglang/kernels/ops/attention": "sglang (kernels/ops)",
}

# SGLang's DSv4 attention backend (both layouts keep it here): the module whose imports say
# which kernel site the server runs when a tree holds more than one.
BACKEND_FILE = "python/sglang/srt/layers/attention/deepseek_v4_backend.py"

BUNDLED = "bundled"  # this kerneldev's file
BUNDLED_OLDER = "bundled-older"  # an earlier kerneldev release
OTHER = "other"
MISSING = "missing"


@dataclass
class KernelSite:
    layout: str
    folder: str  # relative to the host's root
    kernel: str  # path of the kernel file
    wrapper: str | None  # path of the wrapper when it is among the configured files
    wrapper_live: bool = True  # False: configured, but not on the host
    # Whether SGLang's backend imports this site's wrapper (True for a tree's only site); None
    # when a tree with several sites does not tell (see `_imported_sites`).
    imported: bool | None = True
    why: str = ""  # how `imported` was told, for a tree with several sites


def bundled_bytes(name: str) -> bytes:
    return (importlib.resources.files("kerneldev.kernels") / name).read_bytes()


def classify_file(name: str, sha256: str | None) -> tuple[str, str | None]:
    """(kind, release) of a live kernel file by its hash."""
    if sha256 is None:
        return MISSING, None
    if sha256 == hashlib.sha256(bundled_bytes(name)).hexdigest():
        return BUNDLED, "this kerneldev"
    release = RELEASED.get(name, {}).get(sha256)
    if release is not None:
        return BUNDLED_OLDER, release
    return OTHER, None


def find_sites(live_paths: list[str]) -> list[KernelSite]:
    """The kernel sites among the configured live files (by file name and known folder)."""
    present = set(live_paths)
    sites = []
    for folder, layout in LAYOUTS.items():
        kernel = f"{folder}/{KERNEL_FILE}"
        if kernel in present:
            wrapper = f"{folder}/{WRAPPER_FILE}"
            sites.append(
                KernelSite(layout, folder, kernel, wrapper if wrapper in present else None)
            )
    return sites


def _sites(transport: Transport, host: HostConfig):
    """The kernel sites on the host (the one SGLang's backend imports first) and the live
    files by path."""
    live_files, _ = transport.hash_files(host.root, list(host.files))
    live = {f.path: f for f in live_files}
    sites = find_sites(list(live))
    configured = find_sites(list(host.files))
    for site in sites:
        wrapper = f"{site.folder}/{WRAPPER_FILE}"
        if site.wrapper is None and wrapper in host.files:  # configured, missing on the host
            site.wrapper, site.wrapper_live = wrapper, False
    if not sites and configured:
        # Configured at a known layout but absent on the host: a wrong root or a tree of
        # another release, not a config that lacks the file.
        missing = configured[0].kernel
        raise TransferError(
            f"the live kernel file {missing} is not on host '{host.name}' under root {host.root}",
            hint=f"check hosts.{host.name}.root in hosts.yaml, and that the live tree holds "
            "this release's layout",
        )
    if not sites:
        raise UsageError(
            f"none of the files configured for host '{host.name}' is a {KERNEL_FILE} at a "
            "known layout (" + ", ".join(f"{f}/" for f in LAYOUTS) + ")",
            hint=f"add the live kernel file (and its {WRAPPER_FILE}) under hosts.{host.name}"
            ".files in hosts.yaml",
        )
    if len(sites) > 1:
        sites = _imported_sites(transport, host, sites)
    return sites, live


def imported_modules(source: bytes, package: str) -> set[str]:
    """Every module an `import` or `from ... import` of `source` names, anywhere in it (relative
    ones resolved against `package`), with `package.name` for each name a `from` imports (a
    submodule it may be)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _imported_sites(transport: Transport, host: HostConfig, sites: list[KernelSite]):
    """A tree with more than one site (a leftover of an older layout next to the release's):
    which one SGLang's DSv4 backend imports, from its import statements (read, not run). The
    imported site comes first (what `dispatches_under` probes); when the backend does not tell,
    every site's `imported` is None and the newest layout comes first (a tree that has it is
    a release that uses it)."""
    newest_first = sorted(sites, key=lambda s: list(LAYOUTS).index(s.folder), reverse=True)
    try:
        source = transport.read_bytes(posixpath.join(host.root, BACKEND_FILE))
        names = imported_modules(source, _module_of(BACKEND_FILE).rsplit(".", 1)[0])
    except (TransferError, SyntaxError, ValueError) as err:
        why = getattr(err, "message", None) or f"{type(err).__name__}: {err}"
        reason = f"which site SGLang's backend imports is unknown ({BACKEND_FILE}: {why})"
        for s in newest_first:
            s.imported, s.why = None, reason
        return newest_first
    modules = {
        id(s): (_module_of(s.wrapper or f"{s.folder}/{WRAPPER_FILE}"), _module_of(s.kernel))
        for s in sites
    }
    chosen = [s for s in sites if names & set(modules[id(s)])]
    if len(chosen) != 1:
        reason = (
            f"{BACKEND_FILE} imports the wrapper of "
            + ("none" if not chosen else "more than one")
            + " of the kernel sites: which one runs is unknown"
        )
        for s in newest_first:
            s.imported, s.why = None, reason
        return newest_first
    (site,) = chosen
    for s in sites:
        s.imported = s is site
        s.why = f"{BACKEND_FILE} imports {modules[id(site)][0]}"
    return [site] + [s for s in newest_first if s is not site]


# --- install ----------------------------------------------------------------------------


@dataclass
class InstalledFile:
    path: str
    role: str  # "kernel" or "wrapper"
    action: str  # "installed" or "unchanged" (the workspace already has the bundled bytes)
    live_sha256: str
    new_sha256: str
    patch: str  # unified diff, live -> bundled


@dataclass
class InstallResult:
    host: str
    workspace: str
    files: list[InstalledFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def install(
    transport: Transport, host: HostConfig, *, with_wrapper: bool = False, force: bool = False
) -> InstallResult:
    """Write the bundled kernel file (and with `with_wrapper` the wrapper) over the workspace
    copies of the live ones; `kerneldev push` deploys them. Files not yet pulled (or pulled
    and changed live since) are pulled first; unpushed workspace edits refuse unless `force`."""
    sites, live = _sites(transport, host)
    targets = [(s.kernel, KERNEL_FILE, "kernel") for s in sites]
    if with_wrapper:
        for s in sites:
            if s.wrapper is not None and not s.wrapper_live:
                raise TransferError(
                    f"--with-wrapper: the live wrapper {s.wrapper} is not on host '{host.name}'",
                    hint="check the live tree (or install only the kernel file)",
                )
            if s.wrapper is None:
                raise UsageError(
                    f"--with-wrapper: {s.folder}/{WRAPPER_FILE} is not among the configured files",
                    hint=f"add it under hosts.{host.name}.files, or install only the kernel file",
                )
            targets.append((s.wrapper, WRAPPER_FILE, "wrapper"))
    paths = [t[0] for t in targets]
    state = load_state(host.workspace, host.name)
    workspace = Path(host.workspace)
    stale = [
        p
        for p in paths
        if not (workspace / p).exists()
        or p not in state.files
        or state.files[p].sha256 != live[p].sha256
    ]
    if stale:
        sync.pull(transport, host, stale, force=force)  # refuses unpushed edits unless force
    bundled = {p: hashlib.sha256(bundled_bytes(name)).hexdigest() for p, name, _ in targets}
    edited = [
        p
        for p in paths
        if p not in stale
        and hashlib.sha256((workspace / p).read_bytes()).hexdigest()
        not in (live[p].sha256, bundled[p])  # an earlier install is no edit to protect
    ]
    if edited and not force:
        raise RefusedError(
            "not installed, the workspace has unpushed edits in: " + ", ".join(edited),
            hint="push or discard them first (`kerneldev diff --patch`), or overwrite them with "
            "`kerneldev kernels install --force`",
        )

    result = InstallResult(host=host.name, workspace=str(workspace))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    contents = {
        path: ((workspace / path).read_bytes(), bundled_bytes(name)) for path, name, _ in targets
    }
    for path, _, role in targets:  # every check before the first write
        old, new = contents[path]
        if role == "wrapper":
            _check_wrapper_interface(path, old, new)
            if b"flashinfer" in old.lower():
                result.notes.append(
                    f"{path}: the live wrapper can use FlashInfer; the bundled one cannot "
                    "(SGLANG_SM120_FLASHMLA_BACKEND=flashinfer falls back to Triton there)"
                )
    for path, _, role in targets:
        old, new = contents[path]
        live_sha = live[path].sha256
        new_sha = hashlib.sha256(new).hexdigest()
        action = "unchanged" if old == new else "installed"
        if old != new:
            try:
                if path in edited:  # --force: the edits are kept, as `pull --force` keeps them
                    keep = workspace / STATE_DIR / "discarded" / stamp / path
                    write_bytes_atomic(keep, old, live[path].mode)
                    result.notes.append(f"your edits to {path} were kept in {keep}")
                write_bytes_atomic(workspace / path, new, live[path].mode)
            except OSError as err:
                raise TransferError(f"cannot write {workspace / path}: {err}") from None
        patch = "".join(
            difflib.unified_diff(
                old.decode("utf-8", "replace").splitlines(keepends=True),
                new.decode("utf-8", "replace").splitlines(keepends=True),
                f"live/{path}",
                f"bundled/{path}",
            )
        )
        result.files.append(InstalledFile(path, role, action, live_sha, new_sha, patch))
    if not with_wrapper:
        for s in sites:
            if s.wrapper and s.wrapper_live:
                result.notes.append(f"{s.wrapper}: the live wrapper stays (--with-wrapper)")
    return result


def public_definitions(source: bytes) -> set[str]:
    """Names a module defines at top level (def, class, assignment) that do not start with _."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in names if not n.startswith("_")}


def _check_wrapper_interface(path: str, live: bytes, bundled: bytes) -> None:
    try:
        wanted = public_definitions(live)
    except SyntaxError as err:
        raise RefusedError(
            f"--with-wrapper: the live {path} does not parse (line {err.lineno}); its public "
            "interface cannot be compared, nothing was installed"
        ) from None
    lacking = sorted(wanted - public_definitions(bundled))
    if lacking:
        raise RefusedError(
            f"--with-wrapper refused: the bundled {WRAPPER_FILE} lacks public names of the live "
            f"{path}: {', '.join(lacking)}; nothing was installed",
            hint="install only the kernel file (the live wrapper calls its entry point)",
        )


# --- status -----------------------------------------------------------------------------


@dataclass
class FileStatus:
    path: str
    sha256: str | None
    kind: str  # bundled, bundled-older, other, missing
    release: str | None


@dataclass
class DispatchCall:
    """What the live wrapper's entry reached for one call (the probe's answer)."""

    call: str  # "decode" or "prefill"
    tokens: int  # query tokens of the call (prefill: more than SGLang's 64-token decode limit)
    heads: int
    # "flashinfer", "triton", "torch", "sparse_prefill" (0.5.14: SPARSE_PREFILL_*); None when it
    # cannot be told
    backend: str | None
    function: str | None  # the backend function reached (module.name)
    kernel_variant: str | None  # "mma" or "simt" when Triton runs a bundled kernel
    error: str | None = None  # why backend is None


@dataclass
class BackendChoice:
    backend: str | None  # the decode call's backend; None when it cannot be told
    kernel_variant: str | None  # the decode call's Triton variant (bundled kernels)
    environment: str  # where the variables came from, or "unknown"
    reason: str
    calls: list[DispatchCall] = field(default_factory=list)  # decode, then prefill
    switch: dict[str, str] = field(default_factory=dict)  # the SGLANG_SM120_* the probe saw
    # kerneldev's kernel file: whether its MMA variant takes the Gluon loops with the host's
    # Triton ({"available", "why_not", "triton"}); None for other kernel files
    gluon: dict | None = None

    def backend_of(self, call: str) -> str | None:
        return next((c.backend for c in self.calls if c.call == call), None)


@dataclass
class SiteStatus:
    layout: str
    kernel: FileStatus
    wrapper: FileStatus | None
    backend: BackendChoice
    # Whether SGLang's backend imports this site (a tree's only site: True; None: not told);
    # a site it does not import is not probed (see `KernelSite`).
    imported: bool | None = True
    # What the running server's own SGLANG_* values select (what runs now) where they differ
    # from the env file's (`backend` stays what the env file alone selects); None otherwise.
    running: BackendChoice | None = None


@dataclass
class StaleFile:
    """A live file that changed after the running server started (it imported it once)."""

    path: str
    changed: str  # when it last changed (its ctime), UTC on the host's clock


@dataclass
class RunningServer:
    """The service's running process (the one listening on service.url's port), where `ss`
    and /proc tell it (`service/server_process.py`)."""

    pid: int
    started: str | None  # UTC on the host's clock; None when /proc does not tell
    # Live kernel and wrapper files of the imported site changed after it started: it still
    # runs their earlier bytes until it restarts.
    stale_files: list[StaleFile] = field(default_factory=list)
    # Its SGLANG_SM120_* values (None: its environment cannot be read, or no env file to
    # compare it with), those that differ from the env file's, and where they come from:
    # "env file" (the same), "earlier env file" (the file changed after it started),
    # "elsewhere" (the file has not changed since: the restart command, the login environment).
    switch: dict[str, str] | None = None
    differs: list[str] = field(default_factory=list)
    values_from: str | None = None


@dataclass
class KernelStatus:
    host: str
    env_file: str | None
    environment_known: bool
    sites: list[SiteStatus] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    server: RunningServer | None = None  # None: no running server found (or no service.url)


BACKEND_VARS = (
    "SGLANG_SM120_FLASHMLA_BACKEND",
    "SGLANG_SM120_TRITON_FLASHMLA",
    "SGLANG_SM120_MMA_FLASHMLA",
)
DECODE_TOKENS = 4  # a small decode batch
PREFILL_TOKENS = 72  # more than SGLang 0.5.23's SM120_DECODE_MAX_TOKENS (64)
PROBE_TIMEOUT = 600.0  # seconds: importing SGLang's package can take a while on a busy host
# The variables the probe never takes from the login (or the caller's) environment: SGLang's
# settings, the wrapper's and the kernel's switches among them (SGLANG_SM120_*). A job's
# environment (the env file, a variant's) is the service's whole say on them: one it does not
# set is unset in the probe, as in the service, and SGLang's default applies.
SERVICE_ONLY_PREFIX = "SGLANG_"
SWITCH_PREFIX = "SGLANG_SM120_"  # the wrapper's and the kernel's switches


def status(transport: Transport, host: HostConfig, *, heads: int = DEFAULT_HEADS) -> KernelStatus:
    """Per kernel site: the live files (bundled? which release?) and, from the live dispatch
    (`_kernelprobe.py` run on the host in the service's environment), the backend the wrapper's
    entry reaches for a decode call and a prefill-sized call at `heads` query heads."""
    if not 1 <= heads <= MAX_HEADS:
        raise UsageError(
            f"--heads must be between 1 and {MAX_HEADS} (got {heads}): the query heads per "
            "GPU of the server's attention layers",
            hint="DeepSeek-V4 has 128 query heads: 128 / tensor-parallel size",
        )
    sites, live = _sites(transport, host)
    env_file = host.service.env_file if host.service is not None else None
    result = KernelStatus(host=host.name, env_file=env_file, environment_known=False)
    env: dict[str, str] = {}
    env_bytes: bytes | None = None
    if env_file:
        try:
            env_bytes = transport.read_bytes(env_file)
            env = parse_env_file(env_bytes.decode("utf-8", "replace"))
            result.environment_known = True
            # Lines a shell, systemd and docker read differently: the answer below takes the
            # shell's reading, so say which lines that concerns.
            result.notes.extend(f"{env_file}: {w}" for w in env.warnings)
        except TransferError as err:
            result.notes.append(f"cannot read service.env_file: {err.message}")
    else:
        result.notes.append(
            "the service's environment is unknown (no service.env_file): the wrapper was "
            "probed in the login environment of the host"
        )
    read = None
    if env_bytes is not None and env_file:
        read = _EnvFile(env_file, env, env_bytes)
        changed = restart_record.changed_since_restart(host.name, env_file, env_bytes)
        if changed:
            result.notes.append(changed)
    probed = [s for s in sites if s.imported is not False and s.wrapper_live]
    result.server, notes, now = _running_server(transport, host, probed, read)
    result.notes.extend(notes)
    jobs = [_job(s, env, heads) for s in probed]
    if now is not None:  # what the running server's own values select: a job more per site
        jobs += [_job(s, now, heads) for s in probed]
    # Without the env file the service's environment is unknown: the login's stands in for it.
    choices = probe_dispatches(transport, host, jobs, inherit=not result.environment_known)
    answered = {id(s): c for s, c in zip(probed, choices, strict=False)}
    running = {id(s): c for s, c in zip(probed, choices[len(probed) :], strict=False)}
    if any(s.folder == SPARSE_PREFILL_LAYOUT for s in probed):
        result.notes += _sparse_prefill(transport, host, probed, answered, env, running, now)
    for s in sites:
        choice = answered.get(id(s)) or BackendChoice(None, None, "", _not_probed(s))
        k_sha = live[s.kernel].sha256
        kernel = FileStatus(s.kernel, k_sha, *classify_file(KERNEL_FILE, k_sha))
        wrapper = None
        if s.wrapper:
            w_sha = live[s.wrapper].sha256 if s.wrapper_live else None
            wrapper = FileStatus(s.wrapper, w_sha, *classify_file(WRAPPER_FILE, w_sha))
        if not result.environment_known:
            choice.environment = "unknown"
        elif env_file:
            choice.environment = env_file
        site = SiteStatus(s.layout, kernel, wrapper, choice, s.imported)
        if id(s) in running and result.server is not None:
            site.running = running[id(s)]
            site.running.environment = f"the running server's, pid {result.server.pid}"
        result.sites.append(site)
        if s.imported is None and s.why not in result.notes:
            result.notes.append(s.why)
    return result


# SGLang 0.5.14's DSv4 backend sends an extend (prefill) call to sgl_kernel's sparse prefill
# kernel BEFORE its sm_120 branch when the call has more query tokens than this, or when
# SGLANG_OPT_FLASHMLA_SPARSE_PREFILL is true (0.5.23 keeps sm_120 out of that path): the
# wrapper's entry, which the probe calls, is then not reached for that prefill.
SPARSE_PREFILL_LAYOUT = "python/sglang/srt/layers/attention"
SPARSE_PREFILL_SWITCH = "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"
SPARSE_PREFILL_TOKENS = 11673  # 0.5.14's _LARGE_INDEXER_QUERY_THRESHOLD (dsv4/metadata.py)
SPARSE_PREFILL_FUNCTION = "sgl_kernel.flash_mla.flash_mla_sparse_fwd"


def _sparse_prefill(transport, host, sites, answered, env, running, now) -> list[str]:
    """0.5.14's sparse prefill path (see SPARSE_PREFILL_*) applied to the probe's answers for
    the sites of that layout whose backend has it: the prefill call goes to it when the switch
    is true in that environment (SGLang's EnvBool: true, 1, yes, y); always a note on the long
    prefills."""
    try:
        source = transport.read_bytes(posixpath.join(host.root, BACKEND_FILE))
    except TransferError:
        return []
    if SPARSE_PREFILL_SWITCH.encode() not in source:
        return []
    for s in sites:
        if s.folder != SPARSE_PREFILL_LAYOUT:
            continue
        for choices, values in ((answered, env), (running, now or {})):
            choice = choices.get(id(s))
            switched = str(values.get(SPARSE_PREFILL_SWITCH, "")).lower() in (
                "true",
                "1",
                "yes",
                "y",
            )
            if choice is None or not switched:
                continue
            for call in choice.calls:
                if call.call == "prefill":
                    # the probe called the wrapper's entry; the backend never does for this call
                    said = f"{call.call} ({call.tokens} tokens, {call.heads} heads): "
                    old = said + (call.function or f"unknown, {call.error}")
                    call.backend, call.function = "sparse_prefill", SPARSE_PREFILL_FUNCTION
                    call.kernel_variant = call.error = None
                    choice.reason = choice.reason.replace(
                        old, f"{said}{SPARSE_PREFILL_FUNCTION} ({SPARSE_PREFILL_SWITCH})"
                    )
    return [
        f"{BACKEND_FILE}: prefill calls of more than {SPARSE_PREFILL_TOKENS:,} query tokens (and "
        f"every prefill with {SPARSE_PREFILL_SWITCH} true) go to {SPARSE_PREFILL_FUNCTION} "
        "before its sm_120 branch, not to the wrapper's entry"
    ]


def _not_probed(site: KernelSite) -> str:
    if site.imported is False:
        return f"not imported: {site.why}, so the server does not run this site"
    return f"the wrapper {site.wrapper} is missing on the host: SGLang's backend cannot import it"


def _iso(seconds: float) -> str:
    moment = _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _EnvFile:
    """The env file as status read it (for comparing the running server's values with)."""

    path: str
    env: dict[str, str]
    raw: bytes


def _running_server(
    transport: Transport, host: HostConfig, sites: list[KernelSite], env_file: _EnvFile | None
) -> tuple[RunningServer | None, list[str], dict[str, str] | None]:
    """The running server, the notes on it, and the environment to probe what it runs now
    when its SGLANG_SM120_* values differ from the env file's (None when they do not, or
    cannot be told). The notes: a live kernel or wrapper file of `sites` changed after it
    started (a push without --restart: it imported the file once and runs the earlier bytes
    until it restarts); its values differ from the env file's, either because the file
    changed after it started (it runs the old ones until it restarts) or, with the file
    unchanged since it started (or since kerneldev's last restart of it), because they come
    from elsewhere (the restart command, the login environment), so every restart sets them
    again."""
    found = server_process.find(transport, host)
    if found is None:
        return None, [], None
    files = [s.kernel for s in sites] + [s.wrapper for s in sites if s.wrapper and s.wrapper_live]
    paths = [posixpath.join(host.root, f) for f in files]
    times = server_process.times(
        transport, found.pid, paths + ([env_file.path] if env_file else [])
    )
    server = RunningServer(found.pid, _iso(times.started) if times.started is not None else None)
    notes = []
    if times.started is not None:
        for rel, path in zip(files, paths, strict=True):
            changed = times.changed.get(path)
            # ctime has whole seconds: a change in the second the server started is not told
            if changed is not None and changed > times.started:
                server.stale_files.append(StaleFile(rel, _iso(changed)))
    if server.stale_files:
        changes = ", ".join(f"{f.path} ({f.changed})" for f in server.stale_files)
        notes.append(
            f"the running server (pid {found.pid}) started at {server.started}, before the "
            f"live files last changed: {changes}; it imported them once at its start and runs "
            "their earlier bytes until it restarts (`kerneldev restart`); the table shows the "
            "live files"
        )
    running = server_process.environment(transport, found.pid) if env_file else None
    if env_file is None or running is None:
        return server, notes, None
    env = env_file.env
    server.switch = {k: v for k, v in sorted(running.items()) if k.startswith(SWITCH_PREFIX)}
    keys = sorted(k for k in set(env) | set(running) if k.startswith(SWITCH_PREFIX))
    server.differs = [k for k in keys if env.get(k) != running.get(k)]
    if not server.differs:
        server.values_from = "env file"
        return server, notes, None
    shown = ", ".join(
        f"{k}={running.get(k, '(unset)')} (env file: {env.get(k, '(unset)')})"
        for k in server.differs
    )
    changed = times.changed.get(env_file.path)
    before = after = False
    if changed is not None and times.started is not None:
        before = changed + 1 <= times.started  # whole seconds: certainly before it started
        after = changed > times.started
    restarted = restart_record.unchanged_since_restart(host.name, env_file.path, env_file.raw)
    if before or (restarted and not after):
        server.values_from = "elsewhere"
        since = "it started" if before else "kerneldev last restarted it"
        notes.append(
            f"the running server (pid {found.pid}) has other values than {env_file.path}, "
            f"which has not changed since {since}: {shown}; they come from elsewhere (the "
            "service's restart command or the login environment), so every restart sets them "
            "again. decode/prefill shows what they select: what runs now; what the env file "
            "alone selects is said below"
        )
    else:
        server.values_from = "earlier env file"
        notes.append(
            f"the running server (pid {found.pid}) started with other values than "
            f"{env_file.path}: {shown}; it runs what those select until it restarts "
            "(decode/prefill shows that; what the env file selects is said below)"
        )
    # What the server runs now: its own SGLang settings, the env file's other variables (those
    # the probe needs to import: PYTHONPATH, ...)
    now = {k: v for k, v in env.items() if not k.startswith(SERVICE_ONLY_PREFIX)}
    now.update((k, v) for k, v in running.items() if k.startswith(SERVICE_ONLY_PREFIX))
    return server, notes, now


def dispatches_under(
    transport: Transport,
    host: HostConfig,
    envs: list[dict[str, str]],
    *,
    heads: int = DEFAULT_HEADS,
) -> list[BackendChoice]:
    """The dispatch under each of `envs` (an A/B's variants) of the kernel site SGLang's backend
    imports (`_sites` puts it first), in one probe on the host."""
    sites, _ = _sites(transport, host)
    return probe_dispatches(transport, host, [_job(sites[0], env, heads) for env in envs])


@dataclass
class ProbeJob:
    """One probe of the live dispatch: the site's files, the environment, the head count."""

    kernel: str  # path of the live kernel file
    wrapper: str  # path of the live wrapper
    env: dict[str, str]
    heads: int
    timeout: float = PROBE_TIMEOUT  # seconds this job may take on the host


def _job(site: KernelSite, env: dict[str, str], heads: int) -> ProbeJob:
    return ProbeJob(site.kernel, site.wrapper or f"{site.folder}/{WRAPPER_FILE}", env, heads)


def _module_of(path: str) -> str:
    """The module name of a file under SGLang's import root `python/`."""
    return path[len(IMPORT_ROOT) + 1 : -len(".py")].replace("/", ".")


def shared_environment(envs: list[dict[str, str]]) -> dict[str, str]:
    """The variables every one of `envs` sets to the same value (those the shell can export):
    the probe process's own environment."""
    if not envs:
        return {}
    first, rest = envs[0], envs[1:]
    return {k: v for k, v in first.items() if k.isidentifier() and all(e.get(k) == v for e in rest)}


_PROBE: str | None = None


def probe_answers(
    transport: Transport, host: HostConfig, jobs: list[ProbeJob], *, inherit: bool = False
) -> list[dict] | str:
    """The host-side probe's answer per job (`hostside/kernelprobe.py`, one process for all
    jobs, started with the host's python in the variables the jobs share, from the live tree's
    import root, writing no bytecode there), or why there is none for any job.

    Each job's `env` is the service's whole environment as far as SGLang's settings go: the
    probe unsets every inherited `SGLANG_*` variable (SERVICE_ONLY_PREFIX) that the jobs do
    not set, so the login's (or the caller's) switches never stand in for the service's.
    `inherit` keeps them: where the service's environment is unknown (no env file), the
    login's is the best guess and is said to be."""
    global _PROBE
    if _PROBE is None:
        _PROBE = Path(_kernelprobe.__file__).read_text(encoding="utf-8")
    shared = shared_environment([job.env for job in jobs])
    request = {
        "jobs": [
            {
                "wrapper": _module_of(job.wrapper),
                "kernel": _module_of(job.kernel),
                "calls": [
                    {"name": "decode", "tokens": DECODE_TOKENS, "heads": job.heads},
                    {"name": "prefill", "tokens": PREFILL_TOKENS, "heads": job.heads},
                ],
                # what sets this job apart: the jobs' environments hold every shared variable
                "env": {k: v for k, v in job.env.items() if k.isidentifier() and k not in shared},
                "timeout": job.timeout,
            }
            for job in jobs
        ],
        "source": _PROBE,
        "clear": None if inherit else {"prefix": SERVICE_ONLY_PREFIX, "keep": sorted(shared)},
    }
    command = (
        export_prefix(shared)
        + f"cd {shlex.quote(posixpath.join(host.root, IMPORT_ROOT))} && "
        + f"PYTHONDONTWRITEBYTECODE=1 {shlex.quote(host.python)} -B -c {shlex.quote(_PROBE)}"
    )
    try:
        # jobs run one after the other, each within its timeout; one more for torch's import
        run = transport.run(
            command,
            stdin=json.dumps(request).encode(),
            timeout=sum(job.timeout for job in jobs) + PROBE_TIMEOUT,
        )
    except RemoteCommandError as err:
        return f"the probe did not run: {err.message}"
    try:
        answers = json.loads(run.stdout.strip().splitlines()[-1])["answers"]
        if len(answers) != len(jobs):
            raise ValueError
    except (ValueError, IndexError, KeyError, TypeError):
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the probe failed with {host.python} (exit {run.exited}): {tail}"
    return answers


def probe_dispatches(
    transport: Transport, host: HostConfig, jobs: list[ProbeJob], *, inherit: bool = False
) -> list[BackendChoice]:
    """Per job, the backend the live wrapper's entry reaches (`probe_answers`)."""
    if not jobs:
        return []
    answers = probe_answers(transport, host, jobs, inherit=inherit)
    if isinstance(answers, str):
        return [BackendChoice(None, None, "", answers) for _ in jobs]
    return [backend_choice(host, answer) for answer in answers]


def backend_choice(host: HostConfig, answer: dict) -> BackendChoice:
    """The probe's answer for one job (`probe_answers`) as a BackendChoice."""
    unknown = BackendChoice(None, None, "", "")
    if "failed" in answer:  # this job's interpreter died or hung: the others still answered
        unknown.reason = f"the probe failed with {host.python} ({answer['failed']})"
        return unknown
    unknown.switch = answer.get("switch", {})
    if not answer.get("imported"):
        unknown.reason = f"the wrapper cannot be imported: {answer.get('error')}"
        return unknown
    calls = [
        DispatchCall(
            c["call"],
            c["tokens"],
            c["heads"],
            c["backend"],
            c["function"],
            c["variant"],
            c["error"],
        )
        for c in answer["calls"]
    ]
    decode = calls[0]
    parts = []
    for c in calls:
        where = f"{c.call} ({c.tokens} tokens, {c.heads} heads): "
        parts.append(where + (c.function or f"unknown, {c.error}"))
    if answer.get("_sm120_default_backend") is not None:
        parts.append(f"wrapper switch _sm120_default_backend={answer['_sm120_default_backend']}")
    gluon = answer.get("gluon") if isinstance(answer.get("gluon"), dict) else None
    if gluon is not None and any(c.kernel_variant == "mma" for c in calls):
        parts.append(mma_loops(gluon))
    uses_flashinfer = any(c.backend == "flashinfer" for c in calls)
    if uses_flashinfer and not answer.get("flashinfer"):
        parts.append(
            "FlashInfer's sm_120 sparse MLA is not installed for this python: those calls fail"
        )
    return BackendChoice(
        decode.backend,
        decode.kernel_variant if decode.backend == "triton" else None,
        "",
        "; ".join(parts),
        calls,
        answer.get("switch", {}),
        gluon,
    )


def mma_loops(gluon: dict) -> str:
    """Which tile loops the MMA variant runs on the host: the Gluon loops (what
    docs/benchmarks.md measures) or, with another Triton, its Triton loops."""
    triton = f"triton {gluon.get('triton') or '?'}"
    if gluon.get("available"):
        return f"MMA tile loops: Gluon ({triton}; on 9.x and 12.x GPUs, Triton's on others)"
    return (
        f"MMA tile loops: Triton's, not Gluon ({gluon.get('why_not') or triton}; the Gluon "
        "loops, which the benchmarks measure, run with triton 3.6)"
    )
