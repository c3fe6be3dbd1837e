"""Deploying the bundled kernels safely: `kerneldev kernels install` and `kernels status`.

install: finds the live kernel file among the configured files by name, at one of the known
layouts (SGLang's `python/sglang/srt/layers/attention/` or `python/sglang/kernels/ops/attention/`,
vLLM's `vllm/models/deepseek_v4/nvidia/`), pulls it when the workspace copy is not current,
and writes the bundled file over the workspace copy: an edit that `push` deploys (with its
import checks). The live wrapper stays unless `with_wrapper`, and then only when the bundled
wrapper defines every public name of the live one.

status: per kernel site, whether the live kernel file is this kerneldev's bundled file, an
older bundled release (by sha256, `kernel_releases.py`) or something else, and which backend
the live wrapper would pick (FlashInfer, Triton with the MMA or SIMT kernel, torch) under the
environment in `service.env_file` (unknown when none is configured).
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

from kerneldev import sync
from kerneldev.atomic_file import write_bytes_atomic
from kerneldev.config import HostConfig
from kerneldev.envfile import read_service_env
from kerneldev.errors import RefusedError, TransferError, UsageError
from kerneldev.kernel_releases import RELEASED
from kerneldev.state import STATE_DIR, load_state
from kerneldev.transport.base import Transport

KERNEL_FILE = "flash_mla_sm120_triton.py"
WRAPPER_FILE = "flash_mla_sm120.py"
LAYOUTS = {
    "python/sglang/srt/layers/attention": "sglang",
    "python/sglang/kernels/ops/attention": "sglang (kernels/ops)",
    "vllm/models/deepseek_v4/nvidia": "vllm",
}

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
    live_files, _ = transport.hash_files(host.root, list(host.files))
    live = {f.path: f for f in live_files}
    sites = find_sites(list(live))
    if not sites:
        raise UsageError(
            f"none of the files configured for host '{host.name}' is a {KERNEL_FILE} at a "
            "known layout (" + ", ".join(f"{f}/" for f in LAYOUTS) + ")",
            hint=f"add the live kernel file (and its {WRAPPER_FILE}) under hosts.{host.name}"
            ".files in hosts.yaml",
        )
    return sites, live


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
            if s.wrapper:
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
class BackendChoice:
    backend: str | None  # "flashinfer", "triton", "torch"; None when it cannot be told
    kernel_variant: str | None  # "mma" or "simt" when the Triton backend runs a bundled kernel
    environment: str  # where the variables came from, or "unknown"
    reason: str


@dataclass
class SiteStatus:
    layout: str
    kernel: FileStatus
    wrapper: FileStatus | None
    backend: BackendChoice


@dataclass
class KernelStatus:
    host: str
    env_file: str | None
    environment_known: bool
    sites: list[SiteStatus] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


BACKEND_VARS = (
    "SGLANG_SM120_FLASHMLA_BACKEND",
    "SGLANG_SM120_TRITON_FLASHMLA",
    "SGLANG_SM120_MMA_FLASHMLA",
)


def status(transport: Transport, host: HostConfig) -> KernelStatus:
    sites, live = _sites(transport, host)
    env_file = host.service.env_file if host.service is not None else None
    result = KernelStatus(host=host.name, env_file=env_file, environment_known=False)
    env: dict[str, str] = {}
    if env_file:
        try:
            env = read_service_env(transport, host) or {}
            result.environment_known = True
        except TransferError as err:
            result.notes.append(f"cannot read service.env_file: {err.message}")
    else:
        result.notes.append(
            "the service's environment is unknown (no service.env_file): backends are told "
            "for an environment without the SGLANG_SM120_* variables"
        )
    flashinfer: bool | None = None
    for s in sites:
        k_sha = live[s.kernel].sha256
        kernel = FileStatus(s.kernel, k_sha, *classify_file(KERNEL_FILE, k_sha))
        wrapper = None
        source = None
        if s.wrapper:
            w_sha = live[s.wrapper].sha256
            wrapper = FileStatus(s.wrapper, w_sha, *classify_file(WRAPPER_FILE, w_sha))
            source = transport.read_bytes(posixpath.join(host.root, s.wrapper))
        if flashinfer is None and source is not None and _auto_may_pick_flashinfer(source, env):
            flashinfer = _flashinfer_installed(transport, host)
        choice = wrapper_backend(source, wrapper, kernel, env, bool(flashinfer))
        if not result.environment_known:
            choice.environment = "unknown"
        elif env_file:
            choice.environment = env_file
        result.sites.append(SiteStatus(s.layout, kernel, wrapper, choice))
    return result


def _auto_may_pick_flashinfer(source: bytes, env: dict[str, str]) -> bool:
    return (
        b"SGLANG_SM120_FLASHMLA_BACKEND" in source
        and b"flashinfer" in source.lower()
        and env.get("SGLANG_SM120_FLASHMLA_BACKEND", "auto").strip().lower() == "auto"
    )


def wrapper_backend(
    source: bytes | None,
    wrapper: FileStatus | None,
    kernel: FileStatus,
    env: dict[str, str],
    flashinfer_installed: bool,
) -> BackendChoice:
    """Which backend the wrapper `source` picks under `env`, from the rules of the wrapper
    versions known (SGLang's older and newer wrappers, kerneldev's bundled one)."""
    choice = env.get("SGLANG_SM120_FLASHMLA_BACKEND", "auto").strip().lower()
    legacy = env.get("SGLANG_SM120_TRITON_FLASHMLA")
    backend: str | None
    if source is None:
        return BackendChoice(None, None, "", "the wrapper is not among the configured files")
    if wrapper is not None and wrapper.kind in (BUNDLED, BUNDLED_OLDER):
        if wrapper.kind == BUNDLED_OLDER:
            backend, reason = "triton", "older bundled wrapper: always the Triton kernel"
        elif choice in ("triton", "torch"):
            backend, reason = choice, f"SGLANG_SM120_FLASHMLA_BACKEND={choice}"
        elif legacy == "0" and choice != "flashinfer":
            backend, reason = "torch", "SGLANG_SM120_TRITON_FLASHMLA=0"
        else:
            backend, reason = "triton", "bundled wrapper: Triton unless told torch"
    elif b"SGLANG_SM120_FLASHMLA_BACKEND" in source:
        if choice in ("flashinfer", "triton", "torch"):
            backend, reason = choice, f"SGLANG_SM120_FLASHMLA_BACKEND={choice}"
        elif legacy is not None and b"SGLANG_SM120_TRITON_FLASHMLA" in source:
            backend = "torch" if legacy == "0" else "triton"
            reason = f"auto, SGLANG_SM120_TRITON_FLASHMLA={legacy}"
        elif flashinfer_installed:
            backend, reason = "flashinfer", "auto: FlashInfer's sm_120 sparse MLA is installed"
        else:
            backend, reason = "triton", "auto: FlashInfer's sm_120 sparse MLA is not installed"
    elif b"SGLANG_SM120_TRITON_FLASHMLA" in source:
        backend = "torch" if legacy == "0" else "triton"
        reason = f"SGLANG_SM120_TRITON_FLASHMLA={legacy if legacy is not None else '(unset: 1)'}"
    else:
        return BackendChoice(None, None, "", "wrapper not recognised (no SGLANG_SM120_* switch)")
    variant = None
    if backend == "triton" and kernel.kind in (BUNDLED, BUNDLED_OLDER):
        variant = "mma" if env.get("SGLANG_SM120_MMA_FLASHMLA", "0") == "1" else "simt"
    return BackendChoice(backend, variant, "", reason)


_FLASHINFER_PROBE = """
import importlib.util, json, os
spec = importlib.util.find_spec("flashinfer")
found = None
for folder in (spec.submodule_search_locations or []) if spec else []:
    for name in ("sparse_mla_sm120.py", "sparse_mla_sm120"):
        if os.path.exists(os.path.join(folder, name)):
            found = os.path.join(folder, name)
print(json.dumps({"installed": found is not None}))
"""


def _flashinfer_installed(transport: Transport, host: HostConfig) -> bool:
    """Whether the host's python has FlashInfer's sm_120 sparse MLA (found, not imported)."""
    command = f"{shlex.quote(host.python)} -c {shlex.quote(_FLASHINFER_PROBE)}"
    result = transport.run(command, timeout=60)
    try:
        return bool(result.ok and json.loads(result.stdout)["installed"])
    except (ValueError, KeyError):
        return False
