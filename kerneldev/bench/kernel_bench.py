"""`kerneldev bench`: run the DSv4 benchmark harness on the host's GPU and compare results.

`run_bench` copies the harness (`kernels/dsv4_bench.py` and the files it imports; what kerneldev
relies on from it is in `kerneldev.bench.harness`) and the chosen kernel file into a fresh temporary
folder on the host (`mktemp -d`), runs it there with the host's configured `python` on the
configured GPU, streams its progress, reads the JSON it writes (schema `kerneldev.bench/1`,
`docs/bench-json.md`), removes the folder (also on failure or Ctrl-C), saves the JSON locally
and returns it.

Where the kernel file comes from (`source`):
- `bundled`: `kernels/flash_mla_sm120_triton.py` of this kerneldev (uploaded);
- `workspace`: the local workspace copy of the configured file named
  `flash_mla_sm120_triton.py` (uploaded) - what `kerneldev push` would deploy;
- `live`: that file under the host's root, imported where it lies (nothing uploaded) - what
  the server runs now.

Where the host has `service.env_file`, the harness runs under its kernel switches
(`SGLANG_SM120_*`), so that `dispatch` is the kernel file's own choice in the service's
environment (recorded in the result's `kerneldev.service_env` and `settings.env`); the
wrapper's backend choice (FlashInfer, torch) is `kernels status`'s answer, not modelled here.
A configured file that does not exist (its folder does) is read as `kernels status` reads it:
the login environment's switches, with a warning; one that cannot be read otherwise stops a
`dispatch` run.

Results are saved as `<results_dir>/<UTC time>-<host>.json`; the CLI uses
`.kerneldev/results/` in the folder of the config file (hosts.yaml), so results sit next to
the config they were measured with, whatever the current folder.

`compare(current, baseline)` marks each shape and variant faster / slower / no change, where
"no change" means the two [p20, p80] intervals overlap: the difference lies inside the
measured spread. A variant that failed accuracy is "failed" and never faster.

The core never imports typer or rich; it returns dataclasses and plain dicts.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneldev import interrupt
from kerneldev.bench import harness
from kerneldev.config import HostConfig
from kerneldev.errors import BenchError, KerneldevError, UsageError
from kerneldev.gitrepo import GitUnavailable, head_commit
from kerneldev.hosts.transport.base import OutputCallback, Transport
from kerneldev.loop.workspace import literal_path, path_matches
from kerneldev.paths import RESULTS_DIR
from kerneldev.service.envfile import MISSING, env_file_kind, read_service_env

SCHEMA = harness.SCHEMA
SOURCES = ("bundled", "workspace", "live")
KERNEL_FILE = "flash_mla_sm120_triton.py"
# The kernel file's `variant=` values, the harness's "call it without variant=", and
# FlashInfer's sm_120 DSv4 decode (run where the host has it, else skipped).
KNOWN_VARIANTS = ("simt", "mma", harness.DISPATCH, harness.FLASHINFER)
# Where SGLang keeps it, used when no configured `files` entry names the kernel file.
DEFAULT_KERNEL_PATH = f"python/sglang/srt/layers/attention/{KERNEL_FILE}"
RESULT_NAME = "result.json"
# The service's variables a bench run takes from `service.env_file`: the kernel switches
# (the kernel file picks dispatch's variant by SGLANG_SM120_MMA_FLASHMLA at import).
SWITCH_PREFIX = "SGLANG_SM120_"

# Verdicts of `compare`, per shape and variant.
FASTER, SLOWER, NO_CHANGE = "faster", "slower", "no change"
FAILED, BASELINE_FAILED, NEW = "failed", "baseline failed", "new"


# --- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ratio:
    """A/B on one shape: `label` against the run's first variant (`baseline_label`)."""

    shape: str
    label: str
    baseline_label: str
    speedup: float | None  # baseline median / this median; None when either is not ok


@dataclass(frozen=True)
class ABSummary:
    baseline_label: str | None  # the first variant of the run; None when the run has none
    ratios: list[Ratio]
    geomean: dict[str, float | None]  # label -> geometric mean speed-up over shapes


@dataclass
class BenchResult:
    data: dict  # the harness's JSON (schema kerneldev.bench/1) plus the "kerneldev" section
    saved_to: Path | None
    ab: ABSummary
    # Why it was not saved (`saved_to` None): the run is kept, the caller shows it, then this.
    save_error: BenchError | None = None

    @property
    def ok(self) -> bool:
        """Every shape and variant ran and passed the accuracy check."""
        return bool(self.data.get("ok"))


@dataclass(frozen=True)
class Change:
    shape: str
    label: str
    verdict: str  # faster | slower | no change | failed | baseline failed | new
    current_us: float | None
    baseline_us: float | None
    speedup: float | None  # baseline median / current median, when both passed


@dataclass
class Comparison:
    baseline: str | None  # where the baseline came from (path), for the report
    baseline_timestamp: str | None
    changes: list[Change]
    geomean: dict[str, float | None]  # label -> geometric mean speed-up over the baseline
    warnings: list[str] = field(default_factory=list)

    def verdict(self, shape: str, label: str) -> str | None:
        for change in self.changes:
            if change.shape == shape and change.label == label:
                return change.verdict
        return None


# --- running ------------------------------------------------------------------------------


def check_request(variants: list[str], shapes: list[str]) -> None:
    """Validate variants and shape specs here, before connecting; UsageError (exit 2)."""
    try:
        harness.parse_variants(variants)
        harness.parse_shapes(shapes)
    except harness.HarnessError as err:
        raise UsageError(str(err)) from None
    unknown = [v for v in variants if v not in KNOWN_VARIANTS]
    if unknown:
        raise UsageError(
            f"unknown variant(s) {', '.join(map(repr, unknown))} in --variants: "
            f"expected {', '.join(KNOWN_VARIANTS)}",
            hint="e.g. --variants simt,mma",
        )


def run_bench(
    transport: Transport,
    host: HostConfig,
    variants: list[str],
    shapes: list[str],
    source: str = "bundled",
    gpu: str | None = None,
    cpu_mode: bool = False,
    on_output: OutputCallback | None = None,
    *,
    results_dir: Path | None = None,
    rotate: int | None = None,
    timeout: float | None = None,
) -> BenchResult:
    """Run the harness on the host and return its result (also saved under `results_dir`,
    default `./.kerneldev/results`). Raises UsageError for bad variants/shapes/source and
    BenchError when the harness cannot run or its output is unusable. A variant failing
    accuracy is not an error: it is in the result (`ok` false)."""
    if source not in SOURCES:
        raise UsageError(f"unknown --source {source!r}: expected one of {', '.join(SOURCES)}")
    check_request(variants, shapes)
    gpu = gpu if gpu is not None else host.gpu

    kernel_upload: bytes | None = None
    if source == "live":
        kernel_origin = _live_kernel_path(transport, host)
    elif source == "workspace":
        local = _workspace_kernel_path(host)
        kernel_upload, kernel_origin = local.read_bytes(), str(local)
    else:
        local = harness.bundled_file(KERNEL_FILE)
        kernel_upload, kernel_origin = local.read_bytes(), str(local)

    service_env = _service_switches(transport, host, variants)
    made = transport.run('mktemp -d "${TMPDIR:-/tmp}/kerneldev-bench.XXXXXX"', timeout=60)
    tmp = made.stdout.strip()
    if not made.ok or not tmp.startswith("/"):
        raise BenchError(
            f"cannot create a temporary folder on {host.name}: "
            f"{(made.stderr or made.stdout).strip() or f'exit {made.exited}'}"
        )
    try:
        for name in harness.SUPPORT_FILES:
            data = harness.bundled_file(name).read_bytes()
            transport.write_atomic(posixpath.join(tmp, name), data)
        if kernel_upload is not None:
            kernel_path = posixpath.join(tmp, KERNEL_FILE)
            transport.write_atomic(kernel_path, kernel_upload)
        else:
            kernel_path = kernel_origin
        result_path = posixpath.join(tmp, RESULT_NAME)
        command = harness_command(
            host,
            tmp,
            kernel_path,
            source,
            variants,
            shapes,
            gpu,
            cpu_mode,
            rotate,
            env=service_env["variables"] if service_env else None,  # None: the login's
        )
        done = transport.run(command, timeout=timeout, on_output=on_output)
        output = done.stdout + done.stderr
        if done.exited not in (harness.EXIT_OK, harness.EXIT_FAILED):
            raise _harness_failure(
                host, done.exited, output, KernelFile(source, kernel_path, kernel_origin)
            )
        try:
            data = json.loads(transport.read_bytes(result_path))
        except (KerneldevError, ValueError) as err:
            raise BenchError(
                f"the harness exited {done.exited} but left no readable result: {err}",
                hint="its output:\n" + _tail(output),
            ) from None
    finally:
        # Shielded: after Ctrl-C the harness has been ended and its folder still goes.
        with interrupt.shield():
            try:
                transport.remove(tmp)
            except KerneldevError:
                pass  # a leftover temp folder must not hide the real outcome

    check_schema(data, f"{host.name}:{result_path}")
    skipped = data.get("skipped") or {}
    if skipped and not data.get("results"):
        # Every variant asked for was skipped: an empty table with exit 0 (and a saved result
        # that a later --compare reads as "no shapes") would look like a passing run.
        why = "; ".join(f"{name}: {reason}" for name, reason in skipped.items())
        raise BenchError(
            f"nothing was timed on {host.name}: every variant asked for was skipped ({why})",
            hint="add simt or mma to --variants (e.g. --variants simt,mma,flashinfer), or run "
            "where FlashInfer's sm_120 DSv4 decode is installed",
        )
    data["kerneldev"] = {
        "host": host.name,
        "source": source,
        "kernel_file": kernel_origin,
        "kernel_git_commit": _local_git_commit(kernel_origin) if source != "live" else None,
        "gpu": None if cpu_mode else gpu,
        "command": command,
        "service_env": service_env,
    }
    saved, save_error = try_save_result(data, results_dir or RESULTS_DIR, host.name)
    return BenchResult(data=data, saved_to=saved, ab=ab_summary(data), save_error=save_error)


def harness_command(
    host: HostConfig,
    tmp: str,
    kernel_path: str,
    source: str,
    variants: list[str],
    shapes: list[str],
    gpu: str | None,
    cpu_mode: bool,
    rotate: int | None = None,
    *,
    env: dict[str, str] | None = None,
) -> str:
    """The shell command run on the host. `python` is used as configured (it may be a
    command such as `conda run -n sglang python`); stderr joins stdout so that the progress
    lines stream through the transport as they come. `env`: variables set for the harness
    (the service's kernel switches)."""
    q = shlex.quote
    args = harness.arguments(
        f"{source}={kernel_path}",
        variants,
        shapes,
        posixpath.join(tmp, RESULT_NAME),
        rotate=rotate,
        cpu_mode=cpu_mode,
    )
    env_text = "PYTHONUNBUFFERED=1"
    if gpu is not None and not cpu_mode:
        env_text = f"CUDA_VISIBLE_DEVICES={q(str(gpu))} {env_text}"
    switches = "".join(f"{k}={q(v)} " for k, v in (env or {}).items() if k.isidentifier())
    env_text = switches + env_text
    # With the service's switches known, none is inherited from the login (a `.bashrc` that
    # exports SGLANG_SM120_MMA_FLASHMLA=1 would pick the variant the service does not run).
    clear = f"unset $(env | sed -n {q(_INHERITED_SWITCHES)}); " if env is not None else ""
    script = q(posixpath.join(tmp, harness.SCRIPT))
    return f"{clear}cd {q(tmp)} && {env_text} {host.python} {script} {' '.join(args)} 2>&1"


_INHERITED_SWITCHES = r"s/^\(SGLANG_SM120_[A-Za-z0-9_]*\)=.*/\1/p"


def _service_switches(
    transport: Transport, host: HostConfig, variants: list[str]
) -> dict[str, Any] | None:
    """The kernel switches of `service.env_file` (`SGLANG_SM120_*`) the harness runs under, so
    that `dispatch` is the kernel file's own choice in the service's environment; with the env
    file's path and the warnings of its reading. None without an env file."""
    path = host.service.env_file if host.service is not None else None
    if not path:
        return None
    try:
        env = read_service_env(transport, host) or {}
    except KerneldevError as err:
        if harness.DISPATCH not in variants:  # only dispatch follows the service's switches
            return {"env_file": path, "variables": {}, "warnings": [], "error": err.message}
        if env_file_kind(transport, path)[0] == MISSING:
            # As `kernels status` and the import check read it (and `doctor` warns): the
            # login environment stands in; `bench --service` creates the file.
            return {
                "env_file": path,
                "variables": None,
                "warnings": [
                    f"does not exist on {host.name}: dispatch ran under the login "
                    "environment's kernel switches instead (as `kernels status` reads them)"
                ],
                "error": err.message,
            }
        raise BenchError(
            f"cannot read service.env_file: {err.message}",
            hint="`dispatch` runs under the service's kernel switches: make the file "
            "readable (`kerneldev doctor` checks it), or bench simt/mma without dispatch",
        ) from None
    variables = {k: v for k, v in env.items() if k.startswith(SWITCH_PREFIX)}
    return {
        "env_file": path,
        "variables": variables,
        "warnings": list(getattr(env, "warnings", [])),
    }


@dataclass(frozen=True)
class KernelFile:
    """The kernel file a run benchmarks: `path` as the harness was given it on the host (for
    bundled and workspace a copy in the run's temporary folder), `origin` the file the user
    knows (bundled, workspace: this machine's; live: the host's)."""

    source: str
    path: str
    origin: str


def _kernel_file_hint(host: HostConfig, kernel: KernelFile, message: str) -> str:
    """What to do when the kernel file itself does not import or lacks the entry point."""
    entry = f"import cleanly and define {harness.ENTRY_POINT}()"
    if kernel.source == "workspace":
        hint = f"fix {kernel.origin} (your workspace copy): it must {entry}; then bench again"
    elif kernel.source == "live":
        hint = (
            f"the file the server runs on {host.name} must {entry}: fix it with "
            f"`kerneldev push --host {host.name}`, or `kerneldev rollback --host {host.name}`"
        )
    else:
        hint = (
            f"this kerneldev's bundled kernel file must {entry}: reinstall kerneldev, or bench "
            "your copy with --source workspace"
        )
    if "ModuleNotFoundError" in message:
        hint += f"; or install the module it imports into `{host.python}` on {host.name}"
    return hint


def _harness_failure(
    host: HostConfig, exited: int, output: str, kernel: KernelFile | None = None
) -> BenchError:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    message = errors[-1].split("error:", 1)[1].strip() if errors else None
    if exited == harness.EXIT_ENV and message and kernel is not None and kernel.path in message:
        # The kernel file, not the interpreter: its error names the path the harness was given,
        # for bundled and workspace a copy in a temporary folder that is gone by now.
        message = message.replace(kernel.path, kernel.origin)
        return BenchError(
            f"the benchmark harness failed on {host.name} (exit {exited}): {message}",
            hint=_kernel_file_hint(host, kernel, message),
        )
    if exited in (126, 127) and not errors:
        return BenchError(
            f"cannot run the host's python ({host.python!r}) on {host.name}: "
            f"{lines[-1] if lines else f'exit {exited}'}",
            hint=f"set `python:` for host '{host.name}' in hosts.yaml to an interpreter "
            "with torch and triton (e.g. /opt/venv/bin/python)",
        )
    if exited == harness.EXIT_ENV and message and "no CUDA device" in message:
        # torch and triton imported fine: the host has no GPU torch can use. The harness's
        # own flag is --cpu-mode; kerneldev's is --cpu.
        message = message.split("; use --cpu-mode", 1)[0]
        hint = (
            f"run `kerneldev bench --cpu` to check correctness under the Triton interpreter "
            f"(times are meaningless), or pick a visible GPU with --gpu / `gpu:` for host "
            f"'{host.name}'"
        )
    elif exited == harness.EXIT_ENV:
        hint = (
            f"the harness needs torch and triton in `{host.python}` on {host.name}; set "
            "`python:` in hosts.yaml to the interpreter that runs SGLang"
        )
    else:
        hint = "the harness's output:\n" + _tail(output)
    return BenchError(
        f"the benchmark harness failed on {host.name} (exit {exited}): "
        f"{message or (lines[-1] if lines else 'no output')}",
        hint=hint,
    )


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _kernel_patterns(host: HostConfig) -> list[str]:
    """Configured `files` entries that can name the kernel file (globs allowed)."""
    found = [p for p in host.files if path_matches(KERNEL_FILE, posixpath.basename(p))]
    return found or [DEFAULT_KERNEL_PATH]


def _workspace_kernel_path(host: HostConfig) -> Path:
    for pattern in _kernel_patterns(host):
        literal = literal_path(pattern)
        if literal is not None:
            candidates = [host.workspace / literal]
        else:
            candidates = sorted(host.workspace.glob(pattern))
        for candidate in candidates:
            if candidate.name == KERNEL_FILE and candidate.is_file():
                return candidate
    raise BenchError(
        f"no {KERNEL_FILE} in the workspace of '{host.name}' ({host.workspace})",
        hint=f"run `kerneldev pull --host {host.name}` first, or use --source bundled",
    )


def _live_kernel_path(transport: Transport, host: HostConfig) -> str:
    files, _ = transport.hash_files(host.root, _kernel_patterns(host))
    for f in files:
        if posixpath.basename(f.path) == KERNEL_FILE:
            return posixpath.join(host.root, f.path)
    raise BenchError(
        f"no {KERNEL_FILE} under {host.root} on {host.name}",
        hint="add its path to `files:` in hosts.yaml, or use --source bundled",
    )


def _local_git_commit(path: str) -> str | None:
    try:
        return head_commit(os.path.dirname(path))
    except GitUnavailable:
        return None


def save_result(data: dict, results_dir: Path, host_name: str) -> Path:
    """Write the result as `<results_dir>/<UTC time>-<host>.json`; never overwrites. BenchError
    ("cannot save the result to ...") when the folder cannot be made or the file written."""
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file where a folder should be, no permission
        raise _cannot_save(results_dir, results_dir, err) from None
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe_host = re.sub(r"[^A-Za-z0-9_.-]", "_", host_name)
    for n in range(1000):
        path = results_dir / f"{stamp}-{safe_host}{f'-{n}' if n else ''}.json"
        try:
            f = open(path, "x", encoding="utf-8")
        except FileExistsError:
            continue
        except OSError as err:
            raise _cannot_save(path, results_dir, err) from None
        try:
            with f:
                json.dump(data, f, indent=2)
                f.write("\n")
        except OSError as err:  # disk full: no half-written result for a later --compare
            path.unlink(missing_ok=True)
            raise _cannot_save(path, results_dir, err) from None
        return path
    raise BenchError(f"cannot find a free result file name in {results_dir}")


def try_save_result(
    data: dict, results_dir: Path, host_name: str
) -> tuple[Path | None, BenchError | None]:
    """`save_result`, its error returned rather than raised: a finished run is still shown."""
    try:
        return save_result(data, results_dir, host_name), None
    except BenchError as err:
        return None, err


def _cannot_save(path: Path, results_dir: Path, err: OSError) -> BenchError:
    return BenchError(
        f"cannot save the result to {path}: {err.strerror or err}",
        hint=f"the result is printed but not saved; make {results_dir} a folder you can "
        "write (a file may be in the way), then run again",
    )


# --- reading and checking results ---------------------------------------------------------


def check_schema(data: Any, where: str) -> None:
    """The minimal shape every consumer relies on; BenchError naming what is wrong."""
    if not isinstance(data, dict):
        raise BenchError(f"{where}: not a benchmark result (expected a JSON object)")
    schema = data.get("schema")
    if not isinstance(schema, str) or not schema.startswith("kerneldev.bench/"):
        raise BenchError(f"{where}: not a kerneldev benchmark result (schema {schema!r})")
    if schema != SCHEMA:
        raise BenchError(
            f"{where}: schema {schema} is not the supported {SCHEMA}",
            hint="re-run the benchmark with this kerneldev",
        )
    results = data.get("results")
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        raise BenchError(f"{where}: 'results' must be a list of objects")
    for i, r in enumerate(results):
        for key in ("shape", "label", "status", "median_us", "p20_us", "p80_us"):
            if key not in r:
                raise BenchError(f"{where}: results[{i}] has no {key!r}")
        # The types compare() and the table rely on: a list label cannot be a key, and an
        # Infinity time would make --json print Infinity (not JSON).
        for key in ("shape", "label", "status"):
            if not isinstance(r[key], str):
                raise BenchError(
                    f"{where}: results[{i}].{key} must be a string, not {_kind(r[key])}"
                )
        for key in ("median_us", "p20_us", "p80_us"):
            if r[key] is not None and not _finite(r[key]):
                raise BenchError(
                    f"{where}: results[{i}].{key} must be a finite number or null, not {r[key]!r}"
                )
    device = data.get("device")
    if device is not None and not isinstance(device, dict):
        raise BenchError(f"{where}: 'device' must be an object, not {_kind(device)}")
    if device and device.get("name") is not None and not isinstance(device["name"], str):
        raise BenchError(f"{where}: device.name must be a string, not {_kind(device['name'])}")
    for key in ("timing", "timestamp"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise BenchError(f"{where}: {key!r} must be a string, not {_kind(data[key])}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def load_result(path: Path | str) -> dict:
    """A saved result, or the output of `kerneldev bench --json` (its "result" member)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"result file not found: {path}") from None
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read result file {path}: {err}") from None
    if isinstance(data, dict) and "schema" not in data and isinstance(data.get("result"), dict):
        data = data["result"]
    try:
        check_schema(data, str(path))
    except BenchError as err:  # the user named the wrong file: a usage error (exit 2)
        raise UsageError(err.message, err.hint) from None
    return data


def _labels(data: dict) -> list[str]:
    labels: list[str] = []
    for r in data["results"]:
        if r["label"] not in labels:
            labels.append(r["label"])
    return labels


def _timed_ok(entry: dict | None) -> bool:
    return bool(entry) and entry["status"] == "ok" and _positive(entry.get("median_us"))


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def geometric_mean(values: list[float]) -> float | None:
    values = [v for v in values if v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def ab_summary(data: dict) -> ABSummary:
    """Speed-up of every variant over the run's first one, per shape, and its geometric mean
    over the shapes where both passed accuracy (a failed shape has no ratio)."""
    labels = _labels(data)
    if not labels:
        return ABSummary(None, [], {})
    base_label = labels[0]
    by_key = {(r["shape"], r["label"]): r for r in data["results"]}
    shapes = list(dict.fromkeys(r["shape"] for r in data["results"]))
    ratios: list[Ratio] = []
    geomean: dict[str, float | None] = {}
    for label in labels[1:]:
        speedups = []
        for shape in shapes:
            base, this = by_key.get((shape, base_label)), by_key.get((shape, label))
            if this is None:
                continue
            speedup = None
            if _timed_ok(base) and _timed_ok(this):
                speedup = base["median_us"] / this["median_us"]
                speedups.append(speedup)
            ratios.append(Ratio(shape, label, base_label, speedup))
        geomean[label] = geometric_mean(speedups)
    return ABSummary(base_label, ratios, geomean)


def compare(current: dict, baseline: dict, baseline_name: str | None = None) -> Comparison:
    """Each shape and variant of `current` against the same shape and label in `baseline`.

    faster: current p80 < baseline p20; slower: current p20 > baseline p80; no change: the
    [p20, p80] intervals overlap. failed: the current variant failed accuracy (or did not
    run) - never faster. baseline failed: the baseline has no passing time for it. new: the
    baseline does not have that shape and variant.
    """
    base_by_key = {(r["shape"], r["label"]): r for r in baseline["results"]}
    changes: list[Change] = []
    per_label: dict[str, list[float]] = {}
    for r in current["results"]:
        base = base_by_key.get((r["shape"], r["label"]))
        speedup = None
        if not _timed_ok(r):
            verdict = FAILED
        elif base is None:
            verdict = NEW
        elif not _timed_ok(base):
            verdict = BASELINE_FAILED
        else:
            speedup = base["median_us"] / r["median_us"]
            per_label.setdefault(r["label"], []).append(speedup)
            verdict = _verdict(r, base)
        changes.append(
            Change(
                shape=r["shape"],
                label=r["label"],
                verdict=verdict,
                current_us=r.get("median_us") if _timed_ok(r) else None,
                baseline_us=base.get("median_us") if _timed_ok(base) else None,
                speedup=speedup,
            )
        )
    warnings = []
    cur_dev = (current.get("device") or {}).get("name")
    base_dev = (baseline.get("device") or {}).get("name")
    if cur_dev != base_dev:
        warnings.append(f"different devices: now {cur_dev}, baseline {base_dev}")
    if current.get("timing") != baseline.get("timing"):
        warnings.append(
            f"different timing methods: now {current.get('timing')}, "
            f"baseline {baseline.get('timing')}"
        )
    if "cpu-wallclock" in (current.get("timing"), baseline.get("timing")):
        warnings.append("cpu-wallclock times are the interpreter's: the verdicts mean nothing")
    return Comparison(
        baseline=baseline_name,
        baseline_timestamp=baseline.get("timestamp"),
        changes=changes,
        geomean={label: geometric_mean(v) for label, v in per_label.items()},
        warnings=warnings,
    )


def _verdict(current: dict, baseline: dict) -> str:
    """Interval rule; without a spread (p20/p80 missing) a point is its own interval."""
    c_lo = _num(current.get("p20_us"), current["median_us"])
    c_hi = _num(current.get("p80_us"), current["median_us"])
    b_lo = _num(baseline.get("p20_us"), baseline["median_us"])
    b_hi = _num(baseline.get("p80_us"), baseline["median_us"])
    if c_hi < b_lo:
        return FASTER
    if c_lo > b_hi:
        return SLOWER
    return NO_CHANGE


def _num(value: Any, default: float) -> float:
    return float(value) if _positive(value) else float(default)


def bench_report(result: BenchResult, comparison: Comparison | None = None) -> dict:
    """The object `kerneldev bench --json` prints and its table is drawn from."""
    return {
        "result": result.data,
        "saved_to": str(result.saved_to) if result.saved_to else None,
        "ab": result.ab,
        "comparison": comparison,
    }
