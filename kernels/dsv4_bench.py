"""DSv4 sparse-MLA decode benchmark: check every variant against the reference, then time it.

Runs on the GPU host with only torch, triton and the standard library (no kerneldev, no
paramiko): `kerneldev bench` copies this file, `dsv4_cache.py`, `dsv4_reference.py`,
`interpreter_overhead.py` and the chosen kernel file(s) into a temporary folder on the host and
runs it there; it also runs by hand from a checkout:

    python3 kernels/dsv4_bench.py --variants simt,mma --shapes decode --out result.json

For every shape it builds `--rotate` input sets on the device (`dsv4_reference.make_inputs`,
one seed per set), computes the float64 reference once per set, and for every kernel file and
variant:

1. runs the variant eagerly on every set and checks it with `dsv4_reference.check_accuracy`
   (FlashMLA's tolerances). A variant that fails is recorded as `failed` and is not timed
   (`--time-failed` times it anyway, still `failed`); one that raises is recorded as `error`.
2. captures one call per input set into a CUDA graph and times graph replays with
   `triton.testing.do_bench` (L2 flushed before every replay, quantiles 0.5/0.2/0.8); the
   per-call time is the replay time divided by the number of sets. Rotating sets means a
   small shape cannot be served from the 50 MB L2 by the previous call's data. A throwaway
   graph is captured and timed first (`settle_cuda_graphs`): a process's first graph replays
   ~0.9 µs a call faster than its later ones, which would favour the first entry timed.
   `--graph-each` captures each call in a graph of its own and replays them in turn, one
   call after each flush, as the peers harness and FlashMLA's own benchmarks do: every call
   then starts cold (a small call's first loads, the flush's dirty lines in L2).
   Long rows (T4096 prefill): the first entry timed on a shape's inputs can run in a slower,
   steady mode (an H100, session 43: the same file 613 µs timed first, 575 second; T1024 rows
   not affected; cause unknown: it lasts until a few hundred graph replays of the call have
   run, session 44). So on a GPU every shape first times a warm-up
   entry, a second import of the first entry's kernel file with its variant (`warm_copy`;
   session 43's measured cure, `--kernel warm=<same path>` first, done for you; where that
   raises or fails accuracy, and so is not timed, the next entry's too), reported apart
   (`warm_entries` in the JSON, not in the table); `--no-warm-entry` skips it.
3. reports µs (median, p20, p80), effective GB/s (the minimal bytes of the spec's roofline
   over the time), % of the device's copy bandwidth (measured once, device-to-device copy),
   TFLOP/s, and "x floor" = time / (minimal bytes / copy bandwidth).

`--config LABEL=row:sm120,block_n:32,...` adds an MMA variant whose config is the kernel file's
`mma_config` rule on a table row with overrides (tuning without editing the file); `mma_v2:1`
compiles it with DISABLE_MMA_V3=1, so on Hopper it runs mma.sync instead of wgmma.
`--sm120-proxy` adds the variant `sm120`: the sm_120 row that way, next to the device's own
row (with triton 3.6 the row's bf16-P launch is its Gluon loop, whose mma.sync the kernel
writes itself; `--config LABEL=row:sm120,mma_v2:1,ws:0` is the row's Triton loop;
`length_aware:0`, `ws_exact:0` and `ws_dual:0` turn the Gluon loop's length-aware split and
its own exact PV off, or give the sm_90 row's dual-cache calls back to its Triton loop;
`ws_exact_launch:0` gives that loop's exact launch back to the Triton loop too;
`ws_wide_tokens_per_sm:0` keeps the sm_120 row's Gluon loop in its 32 x 32 tile). Every
variant's JSON entry lists the compiled kernels it launched (registers, spills, shared
memory, wgmma / mma.sync counts in the PTX).

`--smem-per-sm KB` keeps, for every kernel, as many programs resident per SM as a GPU with KB
of shared memory per SM would (100: sm_120): each kernel's preferred shared-memory carveout is
set as it loads (`cap_residency`), and the blocks per SM the driver reports go into the JSON's
`residency`. With `--sm120-proxy` it makes the proxy keep sm_120's residency (one program of
the sm_120 row per SM there, two on an H200 without it).

`--variants ...,flashinfer` also times FlashInfer's sm_120 DSv4 decode (SGLang 0.5.23's default
on sm_120: `flashinfer.mla._sparse_mla_sm120._sparse_mla_sm120_paged_attention`, called as
SGLang's wrapper calls it, `flashinfer_calls`) on the same input sets with the same accuracy
check, after the kernel files' variants; on a host without it (not installed, or not an sm_120
GPU) one progress line says why and the JSON's `skipped` keeps the reason.

`--phases` adds, for every kernel file, ablated copies of it as extra kernels, timed on the same
inputs in the same run (`PHASES`): `l2tile` (every tile gathers the same cache slots: the
gather's memory traffic gone, its ALU work kept), `nomma` (no tensor-core products: gather,
dequantize and softmax only), `nogather` (both), in the Triton loops and (where the file has
them) the Gluon loops. They compute wrong results by design: they are timed whatever their
accuracy, recorded as `ablated`, and a last table puts each phase's time next to the real
file's, per shape and variant; a copy that passed the accuracy check did not reach the loop
that ran (marked `*`, no saving read off it).

`--cpu-mode` runs the same path on the CPU under the Triton interpreter (TRITON_INTERPRET=1 is
set before triton is imported) on tiny shapes: correctness and the JSON schema are real, the
times are wall-clock of the interpreter and meaningless (`"timing": "cpu-wallclock"`). There
`interpreter_overhead.py` (copied with this file) trims the interpreter's per-operation work
that computes nothing; the outputs are bit-identical without it.

Output: progress on stderr, a short table on stdout, the JSON of `docs/bench-json.md` in
`--out` (rewritten after every entry, so a crash leaves what was measured).

Exit codes: 0 every entry passed (or is ablated); 1 some entry failed accuracy or raised (the
JSON is still complete); 2 bad command line or shape spec, or a `--phases` line missing from a
kernel file; 3 environment problem (no CUDA, torch/triton missing, a kernel file that cannot
be imported).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib.util
import itertools
import json
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

SCHEMA = "kerneldev.bench/1"
HEAD_DIM = 512  # q/k/v row: 448 "nope" + 64 "rope"
CACHE_TOKEN_BYTES = 584  # 448 fp8 + 64 bf16 + 8 scale bytes (spec: page layout)
# --layout of a shape -> (main, extra) cache formats of make_inputs and their token bytes.
LAYOUTS = {
    "v4": (("v4", "v4"), (584, 584)),
    "v41": (("v41", "v41"), (528, 528)),
    "v41_fp4": (("v41", "v41_fp4"), (528, 288)),  # V4.1 FP8 main, FP4 extra cache
}
INDEX_BYTES = 4  # int32 token id
QUANTILES = (0.5, 0.2, 0.8)  # median, p20, p80: the order do_bench returns them in
CPU_WORK_WARN = 1 << 16  # B * H * topk above which the interpreter takes minutes
COPY_BYTES = 1 << 30  # 1 GiB each way: far past L2, so the copy measures HBM
ENTRY_POINT = "flash_mla_sparse_decode_triton"
DISPATCH = "dispatch"  # pseudo-variant: call without `variant=`, i.e. what the file does by env
DISPATCH_ENV = "SGLANG_SM120_MMA_FLASHMLA"
# Pseudo-variant: FlashInfer's sm_120 DSv4 decode (SGLang 0.5.23's default on sm_120), timed on
# the same inputs with the same check, when the host has it (else one line says why not).
FLASHINFER = "flashinfer"
FLASHINFER_MODULE = "flashinfer.mla._sparse_mla_sm120"
FLASHINFER_ENTRY = "_sparse_mla_sm120_paged_attention"
# Tests only: import this module instead of FlashInfer's, and skip the sm_120 device check
# (a stand-in: no GPU here runs FlashInfer's sm_120 kernels).
FLASHINFER_MODULE_ENV = "KERNELDEV_FLASHINFER_MODULE"
FI_PAGE = 64  # FlashInfer's DSv4 decode reads 64-token pages of 584-byte tokens
FI_PAGE_STRIDE = 37440  # 64 * 584 rounded up to a multiple of 576, as SGLang's split pages
LN2 = 0.6931471805599453

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_ENV = 0, 1, 2, 3


class HarnessError(Exception):
    """An expected failure: printed as one line, exits with `exit_code`."""

    def __init__(self, message: str, exit_code: int = EXIT_ENV) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- shapes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One decode step's problem size. D is always 512 (the spec's head dim)."""

    name: str
    batch: int
    heads: int = 64
    topk: int = 2048
    page_size: int = 64
    extra_topk: int = 0  # 0 = no extra (compressed) cache
    extra_page_size: int = 64
    sink: bool | str = False  # True: random finite sinks; "inf": some +inf / -inf (FlashMLA's test)
    # topk_length mode of make_inputs: full, partial, zero, none; or causal (`_causal_lengths`:
    # each row of q a prefill token, its lengths from its position as SGLang's DSv4 backend
    # sets them)
    lengths: str = "full"
    invalid: float = 0.0  # fraction of indices that are negative or past the cache's end
    pad: bool = False  # FlashMLA's padded page stride (multiple of 576 bytes)
    layout: str = "v4"  # cache formats: v4, v41 (V4.1 FP8 both), v41_fp4 (FP4 extra cache)
    # Prefill-sized call: `batch` query tokens (named T...) in requests of `share` consecutive
    # tokens whose indices mostly coincide (main cache: a sliding window shifted by one token;
    # extra cache: one request-wide selection, 1 in 16 entries redrawn per token); 0: each row
    # of q draws its indices at random from a pool 1.25x the call's selections, so rows repeat
    # across the call's tokens by chance (about 30% of the selections at T1024 dual), which the
    # distinct floor counts once.
    share: int = 0
    prefill: bool = False
    # Each row of q draws its indices without replacement from a token range of its own: no
    # cache row is selected twice, the distinct floor is every selected row (the peers
    # harness's inputs, and issue 20's "each query token has its own tokens").
    own: bool = False

    @property
    def total_topk(self) -> int:
        return self.topk + self.extra_topk

    def min_bytes(self) -> int:
        """The spec's roofline bytes: each selected cache token once, q in, out back, the
        indices. Nominal topk (every slot counted), as in issue 4's floor column."""
        main_b, extra_b = LAYOUTS[self.layout][1]
        per_request = (
            self.topk * (main_b + INDEX_BYTES)
            + self.extra_topk * (extra_b + INDEX_BYTES)
            + 2 * self.heads * HEAD_DIM * 2
        )
        return self.batch * per_request

    def flops(self) -> int:
        """q.k and p.v: 2 FLOPs per multiply-add, 512 dims each, every head and token."""
        return self.batch * 4 * self.heads * self.total_topk * HEAD_DIM


def _shape_name(
    b: int,
    h: int,
    topk: int,
    page: int,
    extra: int,
    extra_page: int,
    sink: bool | str,
    lengths: str,
    invalid: float,
    pad: bool,
    layout: str = "v4",
    share: int = 0,
    prefill: bool = False,
    own: bool = False,
) -> str:
    parts = [f"T{b}" if prefill else f"B{b}"]
    if h != 64:
        parts.append(f"H{h}")
    if extra:
        parts.append(f"main{topk}/p{page}+extra{extra}/p{extra_page}")
    else:
        parts.append(f"topk{topk}" + (f"/p{page}" if page != 64 else ""))
    if sink:
        parts.append("sink-inf" if sink == "inf" else "sink")
    if lengths != "full":
        parts.append(f"len-{lengths}")
    if invalid:
        parts.append(f"invalid{invalid:g}")
    if pad:
        parts.append("pad576")
    if layout != "v4":
        parts.append({"v41": "V4.1", "v41_fp4": "V4.1+FP4"}[layout])
    if share:
        parts.append(f"share{share}")
    if own:
        parts.append("own")
    return " ".join(parts)


def make_shape(
    batch: int,
    heads: int = 64,
    topk: int = 2048,
    page_size: int = 64,
    extra_topk: int = 0,
    extra_page_size: int = 64,
    sink: bool | str = False,
    lengths: str = "full",
    invalid: float = 0.0,
    pad: bool = False,
    layout: str = "v4",
    share: int = 0,
    prefill: bool = False,
    own: bool = False,
) -> Shape:
    if share and own:
        raise ValueError("share=N and own=1 exclude each other (tokens share indices or own them)")
    fields = (batch, heads, topk, page_size, extra_topk, extra_page_size, sink, lengths, invalid)
    tail = (pad, layout, share, prefill, own)
    return Shape(_shape_name(*fields, *tail), *fields, *tail)


# The seven DSv4 decode shapes (issue 4's targets table and the sm_120 table, in that order):
# H 64, D 512, page 64 unless noted. `issue4` is an alias of `decode`.
SHAPE_SETS: dict[str, list[Shape]] = {
    "decode": [
        make_shape(1, topk=2048),
        make_shape(64, topk=2048),
        make_shape(128, topk=2048),
        make_shape(1, topk=128, page_size=256, extra_topk=512, extra_page_size=64),
        make_shape(64, topk=128, page_size=256, extra_topk=512, extra_page_size=64),
        make_shape(128, topk=128, page_size=256, extra_topk=512, extra_page_size=64),
        make_shape(64, heads=128, topk=512),
    ],
    # Tiny, for the CPU interpreter (CI): one single-cache shape, one dual-cache shape with a
    # sink, partial topk_length and invalid indices. H 16: the interpreter's cost grows with
    # heads x tokens, and the kernels mask a partial head block.
    "smoke": [
        make_shape(1, heads=16, topk=16, page_size=16),
        make_shape(
            2,
            heads=16,
            topk=8,
            page_size=16,
            extra_topk=16,
            extra_page_size=16,
            sink=True,
            lengths="partial",
            invalid=0.25,
        ),
    ],
}

SHAPE_SETS["issue4"] = SHAPE_SETS["decode"]
# FlashMLA's side-by-side table (issue 13): topk_length not passed, B 1-256, single and dual
# cache, and the edge cases (sink, partial lengths, 10% invalid indices).
_DUAL = dict(topk=128, page_size=256, extra_topk=512, extra_page_size=64)
SHAPE_SETS["flashmla"] = [
    *(make_shape(b, topk=2048, lengths="none") for b in (1, 32, 64, 128, 256)),
    *(make_shape(b, lengths="none", **_DUAL) for b in (1, 32, 64, 128, 256)),
    make_shape(64, heads=128, topk=512, lengths="none"),
    make_shape(64, topk=2048, sink=True, lengths="partial", invalid=0.1),
    make_shape(64, sink=True, lengths="partial", invalid=0.1, **_DUAL),
]
# The accuracy paths part 3 of issue 4 must hold (sink, topk_length, invalid indices, padded
# page stride, dual cache) at sizes a GPU checks in seconds.
SHAPE_SETS["paths"] = [
    make_shape(64, topk=2048, sink=True, lengths="partial", invalid=0.1, pad=True),
    make_shape(
        64,
        topk=128,
        page_size=256,
        extra_topk=512,
        sink=True,
        lengths="partial",
        invalid=0.1,
        pad=True,
    ),
    make_shape(8, heads=128, topk=512, sink=True, lengths="zero"),
    make_shape(16, topk=128, page_size=256, extra_topk=512, sink="inf"),
    make_shape(3, topk=300, lengths="none", invalid=0.5),
]
# Prefill-sized calls through the decode entry (SGLang 0.5.23 on sm_120 with the Triton
# backend sends more than 64 query tokens here, with the layer's real head count: 8 with TP 8,
# 16 with TP 4, 64 with TP 1). T query tokens; "share" rows give consecutive tokens coinciding
# indices, as one request's prefill tokens have (requests of 256 tokens).
_PF = dict(prefill=True, sink=True, **_DUAL)
SHAPE_SETS["prefill"] = [
    *(make_shape(t, heads=8, **_PF) for t in (256, 1024, 4096, 8192)),
    make_shape(1024, heads=16, **_PF),
    make_shape(1024, heads=64, **_PF),
    make_shape(1024, heads=8, topk=2048, prefill=True),
    make_shape(1024, heads=16, topk=2048, prefill=True),
    make_shape(1024, heads=8, lengths="partial", invalid=0.1, **_PF),
    # each row of q owns its tokens (no row selected twice: issue 20's own-token inputs)
    *(make_shape(t, heads=8, own=True, **_PF) for t in (256, 1024, 4096)),
    make_shape(1024, heads=8, topk=2048, prefill=True, own=True),
    # the lengths SGLang sends a prefill from position 0 (window and compressed rows growing
    # with the token's position); at T256 the call is as long as its longest request's program
    *(make_shape(t, heads=8, own=True, lengths="causal", **_PF) for t in (256, 1024, 4096)),
    *(make_shape(1024, heads=h, own=True, lengths="causal", **_PF) for h in (16, 64)),
    make_shape(1024, heads=8, share=256, **_PF),
    make_shape(4096, heads=8, share=256, **_PF),
    make_shape(1024, heads=64, share=256, **_PF),
    make_shape(1024, heads=8, topk=2048, share=256, prefill=True),
]
# The DSv4.1 cache formats (528-byte FP8 token, 288-byte FP4 extra cache) on decode and
# prefill shapes, SGLang's padded strides.
SHAPE_SETS["v41"] = [
    make_shape(64, pad=True, sink=True, layout="v41_fp4", **_DUAL),
    make_shape(64, pad=True, sink=True, layout="v41", **_DUAL),
    make_shape(64, topk=2048, pad=True, layout="v41"),
    make_shape(64, pad=True, sink=True, lengths="partial", invalid=0.1, layout="v41_fp4", **_DUAL),
    make_shape(1024, heads=8, pad=True, layout="v41_fp4", **_PF),
    make_shape(1024, heads=8, pad=True, layout="v41", **_PF),
    make_shape(64, heads=8, pad=True, layout="v41", **_DUAL),
]

# spec key (lower case) -> Shape field
_SPEC_KEYS = {
    "b": "batch",
    "batch": "batch",
    "h": "heads",
    "heads": "heads",
    "topk": "topk",
    "page": "page_size",
    "page_size": "page_size",
    "extra_topk": "extra_topk",
    "extra": "extra_topk",
    "extra_page": "extra_page_size",
    "extra_page_size": "extra_page_size",
    "sink": "sink",
    "lengths": "lengths",
    "invalid": "invalid",
    "pad": "pad",
    "layout": "layout",
    "share": "share",
    "prefill": "prefill",
    "own": "own",
}
_BOOLS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
_LENGTHS = ("full", "partial", "zero", "none", "causal")
SPEC_HELP = (
    "a named set (" + ", ".join(SHAPE_SETS) + ") or B=..,H=..,topk=..[,page=..,extra_topk=..,"
    "extra_page=..,sink=0|1|inf,lengths=full|partial|zero|none|causal,invalid=0.1,pad=1,"
    "layout=v4|v41|v41_fp4,share=N,prefill=1,own=1]; several separated by ';'"
)


def parse_shapes(items: list[str]) -> list[Shape]:
    """`--shapes` values -> shapes, in order, without duplicates. Raises HarnessError(2)."""
    shapes: list[Shape] = []
    for item in items:
        for part in (p.strip() for p in item.split(";")):
            if not part:
                continue
            if "=" in part:
                shapes.append(_parse_spec(part))
                continue
            for name in (n.strip() for n in part.split(",")):
                if name not in SHAPE_SETS:
                    raise HarnessError(
                        f"unknown shape set {name!r}: expected {SPEC_HELP}", EXIT_USAGE
                    )
                shapes.extend(SHAPE_SETS[name])
    if not shapes:
        raise HarnessError(f"no shapes given: expected {SPEC_HELP}", EXIT_USAGE)
    seen: set[Shape] = set()
    return [s for s in shapes if not (s in seen or seen.add(s))]


def _parse_spec(spec: str) -> Shape:
    def bad(what: str) -> HarnessError:
        return HarnessError(f"bad shape spec {spec!r}: {what}", EXIT_USAGE)

    values: dict[str, object] = {}
    for field in spec.split(","):
        field = field.strip()
        if not field:
            continue
        written, sep, raw = field.partition("=")
        written, raw = written.strip(), raw.strip()
        key = written.lower()
        if not sep or key not in _SPEC_KEYS:
            raise bad(
                f"unknown field {field!r} (known: B, H, topk, page, extra_topk, extra_page, "
                "sink, lengths, invalid, pad, layout, share, prefill, own)"
            )
        attr = _SPEC_KEYS[key]
        if attr in values:
            raise bad(f"{written} given twice")
        if attr == "sink" and raw.lower() == "inf":
            values[attr] = "inf"
        elif attr == "layout":
            if raw not in LAYOUTS:
                raise bad(f"layout must be one of {', '.join(LAYOUTS)}, got {raw!r}")
            values[attr] = raw
        elif attr in ("sink", "pad", "prefill", "own"):
            if raw.lower() not in _BOOLS:
                choices = "0, 1 or inf" if attr == "sink" else "0 or 1"
                raise bad(f"{written} must be {choices}, got {raw!r}")
            values[attr] = _BOOLS[raw.lower()]
        elif attr == "lengths":
            if raw not in _LENGTHS:
                raise bad(f"lengths must be one of {', '.join(_LENGTHS)}, got {raw!r}")
            values[attr] = raw
        elif attr == "invalid":
            try:
                fraction = float(raw)
            except ValueError:
                fraction = -1.0
            if not 0.0 <= fraction <= 1.0:
                raise bad(f"invalid must be a fraction in [0, 1], got {raw!r}")
            values[attr] = fraction
        else:
            number = int(raw) if re.fullmatch(r"\d+", raw) else -1
            if number < (0 if attr in ("extra_topk", "share") else 1):
                raise bad(f"{written} must be a positive integer, got {raw!r}")
            values[attr] = number
    for required, key in (("batch", "B"), ("topk", "topk")):
        if required not in values:
            raise bad(f"{key}= is required")
    try:
        return make_shape(**values)  # type: ignore[arg-type]
    except ValueError as e:  # fields that exclude each other (share and own)
        raise bad(str(e)) from None


# --- environment ----------------------------------------------------------------------------


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _output_of(argv: list[str], timeout: float) -> str | None:
    """What `argv` printed on stdout when it ran and exited 0; None when it failed, timed out or
    is not installed (what it would have said is optional metadata)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _git(folder: Path, *args: str) -> str | None:
    out = _output_of(["git", "-C", str(folder), *args], timeout=10)
    return None if out is None else out.strip()


def kernel_file_info(name: str, path: Path) -> dict:
    """sha256 of the file and, when it lies in a git checkout, the commit and whether the file
    differs from it (a benchmark of uncommitted edits is not a benchmark of that commit)."""
    data = path.read_bytes()
    commit = _git(path.parent, "rev-parse", "HEAD")
    dirty = None
    if commit is not None:
        status = _git(path.parent, "status", "--porcelain", "--", path.name)
        dirty = None if status is None else bool(status)
    return {
        "name": name,
        "path": str(path),
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "git_commit": commit,
        "git_dirty": dirty,
    }


def gluon_of(module) -> dict | None:
    """Whether a kerneldev kernel file's MMA variant takes its Gluon loops in this process
    (written for one Triton release: elsewhere, and under the interpreter, it runs its Triton
    loops), and why not; None for a file without the flag."""
    has = getattr(module, "HAS_GLUON", None)
    if not isinstance(has, bool):
        return None
    why = getattr(module, "GLUON_UNAVAILABLE", None)
    return {"available": has, "why_not": why if isinstance(why, str) else None}


# Compute capabilities whose GPUs take the kernel's Gluon loops (`_ws_runnable`)
GLUON_MAJORS = ("9", "12")


def gluon_notes(report: dict) -> list[str]:
    """One line per kernel file whose MMA variant ran its Triton loops on a GPU, where the
    numbers in docs/benchmarks.md are its Gluon loops': another Triton release, or a GPU
    other than 9.x / 12.x. None under the interpreter, nor for a run of SIMT (or FlashInfer)
    alone."""
    if report.get("timing") == "cpu-wallclock":
        return []
    settings = report.get("settings") or {}
    variants = settings.get("variants") or []
    if not settings.get("configs") and all(v in ("simt", FLASHINFER) for v in variants):
        return []
    cap = (report.get("device") or {}).get("capability") or ""
    notes = []
    for k in report.get("kernels") or []:
        gluon = k.get("gluon")
        if not gluon or k.get("phase") is not None:
            continue
        if not gluon["available"]:
            why = gluon["why_not"] or "unavailable"
        elif cap and cap.split(".")[0] not in GLUON_MAJORS:
            why = f"compute capability {cap}: the Gluon loops run on 9.x and 12.x"
        else:
            continue
        notes.append(f"note: {k['name']}: the MMA tile loops here are Triton's, not Gluon ({why})")
    return notes


def trim_interpreter() -> bool:
    """Apply `interpreter_overhead.py` (shipped beside this file) to the Triton interpreter; False
    where that file is absent or the interpreter is not the shape it expects (nothing changes)."""
    try:
        from interpreter_overhead import trim_interpreter_overhead
    except ImportError:
        return False
    return trim_interpreter_overhead()


def import_by_path(module_name: str, path: Path):
    """Import a kernel file as its own module (triton's @jit needs the real source file)."""
    if not path.is_file():
        raise HarnessError(f"kernel file not found: {path}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise HarnessError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - any import-time failure is the file's problem
        raise HarnessError(f"cannot import kernel file {path}: {_one_line(err)}") from None
    return module


def _one_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text.splitlines()[0] if text else type(err).__name__


def device_info(torch, device: str) -> dict:
    if device == "cpu":
        return {
            "type": "cpu",
            "name": platform.processor() or platform.machine() or "cpu",
            "capability": None,
            "sm_count": None,
            "memory_bytes": None,
            "driver": None,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
    props = torch.cuda.get_device_properties(0)
    return {
        "type": "cuda",
        "name": torch.cuda.get_device_name(0),
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_bytes": int(props.total_memory),
        "driver": _driver_version(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def _driver_version() -> str | None:
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"]
    line = (_output_of(query, timeout=20) or "").strip().splitlines()
    return line[0].strip() if line else None


def measure_copy_bandwidth(torch, triton) -> dict:
    """Device-to-device copy of 1 GiB: (bytes read + bytes written) / median time."""
    buffers = [torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda") for _ in range(2)]
    buffers[0].random_(0, 255)
    ms = triton.testing.do_bench(
        lambda: buffers[1].copy_(buffers[0]), warmup=25, rep=200, quantiles=[0.5]
    )
    ms = ms[0] if isinstance(ms, (list, tuple)) else ms
    buffers.clear()
    torch.cuda.empty_cache()
    return {"bytes": 2 * COPY_BYTES, "median_us": ms * 1e3, "gbs": 2 * COPY_BYTES / (ms * 1e6)}


# --- correctness and timing -----------------------------------------------------------------


def _jsonable(value):
    """check_accuracy's dict -> JSON: tensors to numbers, non-finite floats to null."""
    if callable(getattr(value, "item", None)) and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (what torch.quantile does)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def make_calls(entry, input_sets: list[dict], variant: str, config=None) -> list:
    """One zero-argument call per input set. `dispatch` passes no `variant=` at all, so a live
    SGLang file that predates the keyword still runs; `config` is passed as `_config=`."""
    calls = []
    for inputs in input_sets:
        kwargs = dict(inputs)
        if variant != DISPATCH:
            kwargs["variant"] = variant
        if config is not None:
            kwargs["_config"] = config
        calls.append(lambda kwargs=kwargs: entry(**kwargs))
    return calls


# --- residency of another GPU's shared memory (--smem-per-sm) -------------------------------

CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9  # CUfunction_attribute (cuda.h)


def carveout_percent(kb: int, smem_per_sm: int) -> int:
    """The carveout hint (percent of the SM's shared memory) for `kb` KB per SM: rounded down,
    so that the driver, which rounds the hint up to the next configuration it has, lands on
    the configuration of at least `kb` KB nearest to it (the H200's are 0, 8, 16, 32, 64, 100,
    132, 164, 196 and 228 KB: 100 KB -> 43% -> 100 KB)."""
    return max(1, min(100, kb * 1024 * 100 // smem_per_sm))


def cap_residency(torch, kb: int) -> list:
    """Give every Triton kernel loaded from now on a preferred shared-memory carveout of about
    `kb` KB per SM (`cuFuncSetAttribute`, a per-function attribute: no device setting), so that
    an SM keeps as many of its programs resident as a GPU with `kb` KB per SM would (sm_120:
    100 KB; the H200 has 228). A block needing more than the carveout still runs (the driver
    then takes a larger one); the returned list gets, per kernel build loaded, its name, shared
    memory, warps and the blocks per SM `cuOccupancyMaxActiveBlocksPerMultiprocessor` reports,
    so the JSON shows what was capped. Raises HarnessError where it cannot (no libcuda, a Triton
    without the kernel-load hook)."""
    import ctypes

    import triton

    props = torch.cuda.get_device_properties(0)
    per_sm = getattr(props, "shared_memory_per_multiprocessor", None)
    if not per_sm:
        raise HarnessError("--smem-per-sm: torch does not report the SM's shared memory")
    if kb * 1024 >= per_sm:
        raise HarnessError(
            f"--smem-per-sm {kb}: this GPU has {per_sm // 1024} KB per SM, nothing to cap",
            EXIT_USAGE,
        )
    knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
    if knobs is None or not hasattr(knobs, "kernel_load_end_hook"):
        raise HarnessError(f"--smem-per-sm: triton {triton.__version__} has no kernel-load hook")
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        raise HarnessError(f"--smem-per-sm: cannot load libcuda ({_one_line(err)})") from None
    percent = carveout_percent(kb, per_sm)
    records: list = []

    def on_load(module, function, name, metadata_group, hash_=None):
        fn = ctypes.c_void_p(function)
        cuda.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, percent)
        meta = {}
        for key, path in (metadata_group or {}).items():
            if key.endswith(".json"):
                with open(path) as f:
                    meta = json.load(f)
        shared, warps = int(meta.get("shared", 0)), int(meta.get("num_warps", 4))
        blocks = ctypes.c_int(-1)
        cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), fn, warps * 32, ctypes.c_size_t(shared)
        )
        record = {"kernel": name, "shared": shared, "num_warps": warps,
                  "carveout_percent": percent, "blocks_per_sm": blocks.value}  # fmt: skip
        if record not in records:
            records.append(record)

    hooks = knobs.kernel_load_end_hook
    if hasattr(hooks, "add"):  # triton >= 3.5: a chain of hooks
        hooks.add(on_load)
    else:
        knobs.kernel_load_end_hook = on_load
    return records


# --- MMA configs as variants (--config, --sm120-proxy) ---------------------------------------

# Keys of --config: the table row to start from, its fields, the config fields set after the
# rule, and mma_v2 (compile with DISABLE_MMA_V3=1: mma.sync instead of wgmma on Hopper).
_ROW_KEYS = ("block_h", "block_n", "num_warps", "num_stages", "programs_per_sm", "s_by_group",
             "exact_block_h", "small_grid_block_n", "exact_in_launch", "prefetch_next",
             "prefill_block_n", "prefill_num_warps", "exact_concurrent", "prefill_tm_block_n",
             "prefill_tm_num_warps", "prefill_tm16_block_n", "prefill_tm16_num_warps",
             "prefill_tm_programs_per_sm", "prefill_tm16_programs_per_sm", "ws", "length_aware",
             "ws_exact", "ws_dual", "ws_exact_launch", "ws_wide_tokens_per_sm",
             "ws_few_programs_per_sm", "ws_small_dual_programs", "ws_small_dual_long",
             "ws_few_tm_heads", "ws_few_tm_min_b", "pack_rows")  # fmt: skip
# plan_splits / plan_round: the length-aware plan's grid (`_ws_plan_piece`; with topk_length
# only), e.g. for calls the rule gives none, such as the few-head tile's (issue 20, session 47)
_CONFIG_KEYS = ("num_splits", "pv_split", "pv_split_below", "plan_splits", "plan_round")
SM120_PROXY = "sm120=row:sm120,mma_v2:1"


@dataclass(frozen=True)
class ConfigVariant:
    """An MMA variant run with a config of the kernel file's `mma_config` rule, from a named
    table row with overrides, for the device's SM count."""

    label: str
    row: str | None = None  # None: the device's own row
    row_over: tuple = ()
    config_over: tuple = ()
    mma_v2: bool = False

    def config(self, module, torch, shape: Shape):
        rule = getattr(module, "mma_config", None)
        if rule is None:
            raise HarnessError(f"--config {self.label}: the kernel file has no mma_config()")
        props = torch.cuda.get_device_properties(0)
        cc = (props.major, props.minor)
        row = module.MMA_ROWS[self.row or module.mma_row_name(cc)]
        row = self._override(row, self.row_over, "table row")
        cfg = rule(cc, props.multi_processor_count, shape.batch, shape.heads, shape.topk,
                   shape.extra_topk, row=row)  # fmt: skip
        return self._override(cfg, self.config_over, "MMAConfig")

    def _override(self, fields, over: tuple, what: str):
        """`fields._replace` with the overrides; a bool field takes 0/1 as False/True. A field
        the kernel file does not have (an older file) is a HarnessError, not a traceback."""
        missing = [k for k, _ in over if k not in fields._fields]
        if missing:
            raise HarnessError(
                f"--config {self.label}: the kernel file's {what} has no field "
                + ", ".join(missing)
            )
        typed = {k: bool(v) if isinstance(getattr(fields, k), bool) else v for k, v in over}
        return fields._replace(**typed)


def parse_config(text: str) -> ConfigVariant:
    """'sm120=row:sm120,block_n:32,mma_v2:1' -> ConfigVariant. Raises HarnessError(2)."""
    label, sep, spec = text.partition("=")
    label = label.strip()
    if not sep or not re.fullmatch(r"[A-Za-z0-9_]+", label):
        raise HarnessError(f"bad --config {text!r}: expected LABEL=key:value,...", EXIT_USAGE)
    row, row_over, cfg_over, mma_v2 = None, [], [], False
    for item in filter(None, (i.strip() for i in spec.split(","))):
        key, _, value = item.partition(":")
        if key == "row":
            row = value
        elif key == "mma_v2":
            mma_v2 = value in ("1", "true")
        elif key in _ROW_KEYS + _CONFIG_KEYS and re.fullmatch(r"\d+", value):
            (row_over if key in _ROW_KEYS else cfg_over).append((key, int(value)))
        else:
            raise HarnessError(
                f"bad --config item {item!r}: keys row, mma_v2, "
                + ", ".join(_ROW_KEYS + _CONFIG_KEYS)
                + " (integer values)",
                EXIT_USAGE,
            )
    return ConfigVariant(label, row, tuple(row_over), tuple(cfg_over), mma_v2)


# --- FlashInfer's sm_120 DSv4 decode (--variants ...,flashinfer) ---------------------------


def load_flashinfer(torch, device: str):
    """(module, None) when FlashInfer's sm_120 DSv4 decode can run here, else (None, why not).

    The module is `flashinfer.mla._sparse_mla_sm120`, the one SGLang 0.5.23's sm_120 wrapper
    imports, or `$KERNELDEV_FLASHINFER_MODULE` (tests: a stand-in; no device check then)."""
    standin = os.environ.get(FLASHINFER_MODULE_ENV)
    try:
        module = importlib.import_module(standin or FLASHINFER_MODULE)
    except Exception as err:  # noqa: BLE001 - not installed, or broken: either way a skip
        return None, f"FlashInfer is not installed here ({_one_line(err)})"
    if not callable(getattr(module, FLASHINFER_ENTRY, None)):
        version = getattr(sys.modules.get("flashinfer"), "__version__", "?")
        return None, f"the installed FlashInfer ({version}) has no {FLASHINFER_ENTRY}()"
    if not standin:
        if device != "cuda":
            return None, "FlashInfer's sm_120 kernels need a CUDA GPU"
        major, minor = torch.cuda.get_device_capability()
        if major != 12:
            return None, (
                f"FlashInfer's sm_120 DSv4 decode needs an sm_120 / sm_121 GPU "
                f"(this one is sm_{major}{minor})"
            )
    return module, None


def split_pages_to_64(torch, k_cache):
    """A V4 cache re-paged into FlashInfer's 64-token pages (stride FI_PAGE_STRIDE), as SGLang
    0.5.23's wrapper does before each call (it copies the pages a call touches; here every
    page, once, outside the timing). Token ids are unchanged: id = page * 64 + slot."""
    pages, P, _, token_b = k_cache.shape
    if token_b != 584:
        raise HarnessError(
            f"FlashInfer's sm_120 DSv4 decode reads the V4 cache (584 bytes per token), this "
            f"one has {token_b}"
        )
    raw = k_cache.view(torch.uint8) if k_cache.dtype != torch.uint8 else k_cache
    if P == FI_PAGE:
        return raw
    if P % FI_PAGE:
        raise HarnessError(f"page size {P} is not a multiple of FlashInfer's {FI_PAGE}")
    stride = k_cache.stride(0) * k_cache.element_size()
    page_bytes = raw.as_strided((pages, P * 584), (stride, 1), raw.storage_offset())
    n = pages * (P // FI_PAGE)
    new = torch.zeros(n, FI_PAGE_STRIDE, dtype=torch.uint8, device=k_cache.device)
    new[:, : FI_PAGE * 576] = page_bytes[:, : P * 576].reshape(n, FI_PAGE * 576)
    new[:, FI_PAGE * 576 : FI_PAGE * 584] = page_bytes[:, P * 576 :].reshape(n, FI_PAGE * 8)
    return new.view(-1).as_strided((n, FI_PAGE, 1, 584), (FI_PAGE_STRIDE, 584, 584, 1))


def flashinfer_calls(torch, module, input_sets: list[dict]) -> list:
    """One zero-argument call per input set, calling FlashInfer as SGLang 0.5.23's sm_120
    wrapper (`_flash_mla_flashinfer`) does: q [T, H, 512], the main cache in 64-token pages,
    indices [T, topk], the extra cache as is, out / lse written in place, and for decode-sized
    calls (T <= FlashInfer's _DECODE_MAX_TOKENS) split-K scratch of one split per 64 indices.
    Buffers are made here, outside the timing. Each call returns (out [T, 1, H, 512], lse
    [T, H] base 2, with the sink): `flashinfer_outputs` turns it into the contract's."""
    max_tokens = int(getattr(module, "_DECODE_MAX_TOKENS", 64))
    entry = getattr(module, FLASHINFER_ENTRY)
    calls = []
    for inputs in input_sets:
        q = inputs["q"].squeeze(1)
        T, H, _ = q.shape
        kv = split_pages_to_64(torch, inputs["k_cache"])
        idx = inputs["indices"].reshape(T, -1)
        e_kv, e_idx = inputs["extra_k_cache"], inputs["extra_indices"]
        if e_kv is not None:
            e_kv = e_kv.view(torch.uint8) if e_kv.dtype != torch.uint8 else e_kv
            e_idx = e_idx.reshape(T, -1)
        out = torch.empty(T, H, HEAD_DIM, dtype=torch.bfloat16, device=q.device)
        lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
        mid_out = mid_lse = None
        if T <= max_tokens:
            splits = -(-idx.shape[1] // 64) + (-(-e_idx.shape[1] // 64) if e_kv is not None else 0)
            mid_out = torch.empty(T, H, splits, HEAD_DIM, dtype=torch.bfloat16, device=q.device)
            mid_lse = torch.empty(T, H, splits, dtype=torch.float32, device=q.device)
        scale = inputs["softmax_scale"]
        kwargs = dict(
            d_v=HEAD_DIM, topk_length=inputs["topk_length"], attn_sink=inputs["attn_sink"],
            extra_kv_cache=e_kv, extra_indices=e_idx,
            extra_topk_length=inputs["extra_topk_length"], mid_out=mid_out, mid_lse=mid_lse,
        )  # fmt: skip
        args = (q, kv, idx, out, lse, HEAD_DIM**-0.5 if scale is None else float(scale))

        def call(args=args, kwargs=kwargs):
            entry(*args, **kwargs)
            return args[3].unsqueeze(1), args[4]

        calls.append(call)
    return calls


def flashinfer_outputs(result):
    """FlashInfer's (out, base-2 lse [T, H]) -> the contract's (out, natural-log lse [T, H, 1]),
    after the timing (the conversion is not FlashInfer's work)."""
    out, lse2 = result
    return out, (lse2 * LN2).unsqueeze(-1)


# --- phase ablations (--phases) ------------------------------------------------------------

# Each phase is a list of (line, replacement) text substitutions in the MMA tile loops
# (`_attend_split_mma`, and `_split_heads_tm`'s token-major loop): `line` is a whole statement
# line that must occur exactly once in the kernel file (a trailing comment allowed); the
# replacement stays on that line, so compiler messages give the real file's line numbers.
_GATHER_LINE = "idx, valid = _gather_indices(irow, istride, n0 + offs_n, stop, ntok)"
# Keeps the index load and the `valid` mask, gathers slots 0..BLOCK_N-1 (the minimum only
# matters for a cache smaller than a tile): after the first tile every row is in L1/L2.
_L2TILE = (_GATHER_LINE, _GATHER_LINE + "; idx = tl.minimum(offs_n, ntok - 1)")
# The token-major loop's (`_split_heads_tm`, prefill-sized calls of few heads) own lines.
_GATHER_TM_LINE = "idx, valid = _gather_indices(irow, istride, offs_n + n0, stop, ntok)"
_L2TILE_TM = (_GATHER_TM_LINE, _GATHER_TM_LINE + "; idx = tl.minimum(offs_n, ntok - 1)")
# Cheap stand-ins that still consume k (S: its row sums) and p (PV: its row sums), so the
# gather, the dequantization and the softmax are not dead code; fp32, no shared memory.
_CHEAP_S = "s = tl.broadcast_to(tl.sum(k.to(tl.float32), axis=1)[None, :], (acc.shape[0], BLOCK_N))"
_CHEAP_PV = "acc = acc * alpha[:, None] + tl.sum(p, axis=1)[:, None]"
_NOMMA = (
    ("s = tl.dot(q, tl.trans(k))", _CHEAP_S),
    ("s = _scores_by_group(q_row, stride_qd, head_mask, k, BLOCK_N)", _CHEAP_S),
    ("acc = tl.dot(p_op, k, acc * alpha[:, None])", _CHEAP_PV),
    ("acc = tl.dot(p2, k2, acc * alpha[:, None])", _CHEAP_PV),
    (
        "st = tl.dot(k, qt)",
        "st = tl.broadcast_to(tl.sum(k.to(tl.float32), axis=1)[:, None], (BLOCK_N, acc.shape[1]))",
    ),
    (
        "acc = tl.dot(tl.trans(k), p.to(DOT_DTYPE), acc * alpha[None, :])",
        "acc = acc * alpha[None, :] + tl.sum(p, axis=0)[None, :]",
    ),
)
PHASES: dict[str, tuple[tuple[str, str], ...]] = {
    "l2tile": (_L2TILE, _L2TILE_TM),  # the gather's HBM latency and bandwidth removed
    "nomma": _NOMMA,  # the two tensor-core products (and K's shared-memory staging) removed
    "nogather": (
        _L2TILE,
        _L2TILE_TM,
        *_NOMMA,
    ),  # both: loop, L1-resident gather, dequant and softmax
}
# The same phases in the Gluon loops (`_ws_split_kernel`: what Hopper runs for most shapes
# with triton 3.6), applied where the file has them. l2tile: every slot the loader copies
# maps to one of the first 64 slots of page 0 (`_ws_page_slot`; the valid masks stay the
# real indices'). nomma: no wgmma / mma.sync products; S is zero and PV adds P's row sums,
# so the dequantization (stored to shared memory) and the softmax still run.
GLUON_LOOP_MARK = "def _ws_split_kernel("
_GLUON_L2TILE = (
    (
        "return idx >> pshift, idx & (psize - 1)",
        "return idx * 0, idx & (gl.minimum(psize, 64) - 1)",
    ),
    ("return idx // psize, idx % psize", "return idx * 0, idx % gl.minimum(psize, 64)"),
)
_P_ROWS = "gl.sum(p_{}.to(gl.float32), axis=1)"  # P's row sums: PV's cheap stand-in
_GLUON_NOMMA = (
    ("s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), s_zero, use_acc=False)", "s = s_zero"),
    *(
        (
            f"acc = warpgroup_mma(gl.convert_layout(p_{h}, p_layout), k_smem, acc)",
            f"acc = acc + gl.convert_layout({_P_ROWS.format(h)}, "
            "gl.SliceLayout(1, o_layout))[:, None]",
        )
        for h in ("hi", "lo")
    ),
    ("s_even = mma_v2(qg, kg, s_even)", "s_even = s_even"),
    ("s_odd = mma_v2(qg, kg, s_odd)", "s_odd = s_odd"),
    *(
        (
            f"acc = mma_v2(gl.convert_layout(p_{h}, qa), k_smem.load(kb), acc)",
            f"acc = acc + {_P_ROWS.format(h)}[:, None]",
        )
        for h in ("hi", "lo")
    ),
    # the token-major tile: S^T and O^T (heads last), as its alpha is applied
    ("s_even = mma_v2(kg, q_held[gi], s_even)", "s_even = s_even"),
    ("s_odd = mma_v2(kg, q_held[gi], s_odd)", "s_odd = s_odd"),
    *(
        (
            f"acc = mma_v2(kt, gl.convert_layout(p_{h}[None, :, :] + p_zero, opb), acc)",
            f"acc = acc + gl.expand_dims(gl.expand_dims(gl.sum(p_{h}.to(gl.float32), axis=0), "
            "0), 0)",
        )
        for h in ("hi", "lo")
    ),
)
GLUON_PHASES: dict[str, tuple[tuple[str, str], ...]] = {
    "l2tile": _GLUON_L2TILE,
    "nomma": _GLUON_NOMMA,
    "nogather": (*_GLUON_L2TILE, *_GLUON_NOMMA),
}
ABLATED = "ablated"  # the status of an ablated copy's entries
# The variant whose loop the phases do not touch: its ablated copies would time the real file.
_NOT_ABLATED_VARIANTS = ("simt", FLASHINFER)


def parse_phases(text: str | None) -> list[str]:
    """`--phases` value -> phase names in order; None (option absent) -> []."""
    if text is None:
        return []
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in PHASES]
    if unknown or not names:
        raise HarnessError(
            f"bad --phases {text!r}: expected a comma list of {', '.join(PHASES)}", EXIT_USAGE
        )
    return names


def ablate(source: str, phase: str, where: str) -> str:
    """The kernel source with `phase`'s substitutions; HarnessError(2) naming the line and
    the file when a line is missing or not unique."""
    substitutions = PHASES[phase]
    if GLUON_LOOP_MARK in source:  # a file with the Gluon loops: theirs too
        substitutions += GLUON_PHASES[phase]
    for line, replacement in substitutions:
        pattern = re.compile(r"^([ \t]*)" + re.escape(line) + r"[ \t]*(#.*)?$", re.MULTILINE)
        found = len(pattern.findall(source))
        if found != 1:
            what = "not found" if found == 0 else f"found {found} times"
            raise HarnessError(
                f"--phases {phase}: line `{line}` {what} in {where} (expected exactly once)",
                EXIT_USAGE,
            )
        new_line = f"{replacement}  # phase:{phase}"
        source = pattern.sub(lambda m, new=new_line: m.group(1) + new, source)
    return source


def ablated_copies(
    kernel_paths: list[tuple[str, Path]], phases: list[str]
) -> list[tuple[str, str, str]]:
    """(kernel name, phase, ablated source) for every kernel file and phase. Reads the files
    only (no import), so a bad pattern is refused before torch loads."""
    copies = []
    for name, path in kernel_paths:
        if not path.is_file():
            raise HarnessError(f"kernel file not found: {path}")
        source = path.read_text(encoding="utf-8")
        copies.extend((name, phase, ablate(source, phase, str(path))) for phase in phases)
    return copies


def phase_rows(report: dict) -> list[dict]:
    """One row per real entry that has ablated copies: its time and each phase's, per shape."""
    phases = report["settings"].get("phases") or []
    copies = {
        (r["shape"], r["phase_of"], r["phase"]): r for r in report["results"] if r.get("phase")
    }
    rows = []
    for r in report["results"]:
        if r.get("phase") or not any((r["shape"], r["label"], p) in copies for p in phases):
            continue
        row = {"shape": r["shape"], "label": r["label"], "status": r["status"]}
        row["full_us"] = r["median_us"]
        mine = {p: copies.get((r["shape"], r["label"], p)) for p in phases}
        row.update({f"{p}_us": c and c["median_us"] for p, c in mine.items()})
        # An ablated copy is wrong by design: one that passed the accuracy check ran none of
        # the phase's lines (e.g. a loop the phase does not ablate), so its time is the real
        # file's again, not the cost of what the phase removes.
        row["unreached"] = [p for p, c in mine.items() if c and (c.get("accuracy") or {}).get("ok")]
        rows.append(row)
    return rows


def phase_table(rows: list[dict], phases: list[str]) -> str:
    """The phase rows as a fixed-width table, with the time each removal saved."""
    header = ["shape", "variant", "full us", *(f"{p} us" for p in phases)]
    header += [f"full-{p}" for p in phases if p in ("l2tile", "nomma")]
    table_rows = [header]
    for row in rows:
        full = row["full_us"] if row["status"] == "ok" else None
        unreached = row.get("unreached") or []
        cells = [row["shape"], row["label"], _fmt(row["full_us"], ".1f")]
        cells += [_fmt(row[f"{p}_us"], ".1f") + ("*" if p in unreached else "") for p in phases]
        for p in phases:
            if p in ("l2tile", "nomma"):
                part = None if p in unreached else row[f"{p}_us"]
                cells.append("-" if full is None or part is None else f"{full - part:.1f}")
        table_rows.append(cells)
    widths = [max(len(r[i]) for r in table_rows) for i in range(len(header))]
    lines = ["phases (median us): the real file, then each ablated copy on the same inputs"]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table_rows
    ]
    lines.append(
        "l2tile: every tile gathers the same slots (L2-resident); nomma: no tensor-core "
        "products; nogather: both"
    )
    lines.append("full-X: the time removing X saved (phases overlap: the savings need not add up)")
    if any(row.get("unreached") for row in rows):
        lines.append("*: matched the reference: the ablation did not reach the loop that ran")
    return "\n".join(lines)


class _KernelRecorder:
    """Wraps the kernel file's `_mma_split_kernel` so the compiled kernels a call launches are
    recorded (registers, spills, shared memory, wgmma / mma.sync instructions in the PTX)."""

    def __init__(self, module) -> None:
        self.module = module
        self.fn = getattr(module, "_mma_split_kernel", None)
        self.seen: dict = {}

    def __enter__(self):
        if self.fn is not None:
            self.module._mma_split_kernel = self
        return self

    def __exit__(self, *exc) -> None:
        if self.fn is not None:
            self.module._mma_split_kernel = self.fn

    def __getitem__(self, grid):
        launch = self.fn[grid]

        def call(*args, **kwargs):
            compiled = launch(*args, **kwargs)
            if compiled is not None and id(compiled) not in self.seen:
                ptx = getattr(compiled, "asm", {}).get("ptx", "")
                self.seen[id(compiled)] = {
                    # few-token requests take the exact PV in this launch (older files: a
                    # second launch, EXACT_PASS_BELOW)
                    "exact_below": kwargs.get("EXACT_BELOW", kwargs.get("EXACT_PASS_BELOW", 0)),
                    "num_stages": kwargs.get("num_stages"),
                    "block_h": kwargs.get("BLOCK_H"),
                    "block_n": kwargs.get("BLOCK_N"),
                    "single_split": kwargs.get("SINGLE_SPLIT"),
                    "token_major": kwargs.get("TOKEN_MAJOR"),
                    "tail": kwargs.get("TAIL"),
                    "n_regs": getattr(compiled, "n_regs", None),
                    "n_spills": getattr(compiled, "n_spills", None),
                    "shared": getattr(getattr(compiled, "metadata", None), "shared", None),
                    "wgmma": ptx.count("wgmma.mma_async"),
                    "mma_sync": ptx.count("mma.sync"),
                }
            return compiled

        return call

    def report(self) -> list[dict]:
        return list(self.seen.values())


def time_cuda_graph(torch, triton, calls: list, warmup_ms: int, rep_ms: int, each: bool = False):
    """Capture every call once into one CUDA graph, time its replays (L2 flushed before each
    replay by do_bench); return ([median, p20, p80] µs per call, the graph's outputs, the
    graphs). `each`: one graph per call instead, the graphs replayed in turn, each replay one
    call after the flush (no call follows another: the peers harness's and FlashMLA's own
    way; a small call then pays its cold start every time instead of once per set)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile / autotune outside the capture
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    groups = [[call] for call in calls] if each else [calls]
    graphs, outputs = [], []
    for group in groups:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs += [call() for call in group]
        graphs.append(graph)
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    replay = graphs[0].replay
    if each:
        turn = itertools.cycle(graphs)
        replay = lambda: next(turn).replay()  # noqa: E731
    ms = triton.testing.do_bench(replay, warmup=warmup_ms, rep=rep_ms, quantiles=list(QUANTILES))
    per_call = [m * 1e3 / len(groups[0]) for m in ms]
    return per_call, outputs, graphs


def graph_timing(each: bool) -> str:
    """The timing method's name in the JSON (`time_cuda_graph`'s two ways)."""
    return "cuda-graph-each" if each else "cuda-graph"


def settle_cuda_graphs(torch, triton) -> None:
    """Capture and time one throwaway graph before any kernel's. Measured on an H200 (torch
    2.11, session 31): the first CUDA graph captured in a process replays ~0.9 us per call
    faster than every later one (B1 dual 13.2 against 13.8-14.1 us, B16 dual 23.3 against
    24.2; the same file, inputs and order), so without this the first entry timed, of
    whatever kernel, would win a ~1 us A/B it has not earned. A server captures many graphs:
    the later graphs' time is the one it sees."""
    scratch = torch.zeros(1 << 20, device="cuda")
    try:
        time_cuda_graph(torch, triton, [lambda: scratch.add_(1)], 1, 5)
    except Exception:  # noqa: BLE001 - no graphs here: the entries are then timed eagerly
        torch.cuda.synchronize()


def measure_launch_floor(torch, triton, rotate: int, each: bool, warmup_ms: int, rep_ms: int):
    """What this harness reads for a call that does almost nothing: a 4-byte fill kernel,
    `rotate` of them timed as the entries' calls are (one graph, or one graph each; L2 flushed
    before each replay). Every entry's time holds it and neither floor (`floor_us`,
    `distinct_floor_us`) does, so for small calls it is the part of `x floor` no kernel can
    remove (session 48, H100: 4.45 us for a one-program Triton kernel; a T256 H8 call with
    zero lengths 9.2). A failure is recorded, never raised: the entries do not need it."""
    try:
        x = torch.zeros(1, dtype=torch.int32, device="cuda")
        calls = [lambda: x.fill_(0) for _ in range(rotate)]
        us, _, _ = time_cuda_graph(torch, triton, calls, warmup_ms, rep_ms, each=each)
    except Exception as err:  # noqa: BLE001 - reported in the JSON, the run goes on
        with contextlib.suppress(Exception):  # a sticky error shows again in the entries
            torch.cuda.synchronize()
        return {"median_us": None, "p20_us": None, "p80_us": None, "error": _one_line(err)}
    return {"median_us": us[0], "p20_us": us[1], "p80_us": us[2], "error": None}


def time_cuda_eager(triton, calls: list, warmup_ms: int, rep_ms: int) -> list[float]:
    """Fallback when a kernel cannot be captured: all sets back to back, eagerly."""

    def run_all():
        for call in calls:
            call()

    ms = triton.testing.do_bench(run_all, warmup=warmup_ms, rep=rep_ms, quantiles=list(QUANTILES))
    return [m * 1e3 / len(calls) for m in ms]


def check_sets(reference, outputs: list, refs: list, convert=None) -> dict:
    """check_accuracy on every input set; ok only when every set is. The tolerances are the
    same for every set, so they are kept once. `convert` maps a call's result to the
    contract's (out, lse) first (FlashInfer's base-2 LSE)."""
    sets, tolerances = [], None
    for result, (ref_out, ref_lse) in zip(outputs, refs, strict=True):
        out, lse = convert(result) if convert else result
        one = _jsonable(reference.check_accuracy(out, lse, ref_out, ref_lse))
        if not isinstance(one, dict):
            one = {"ok": False, "error": f"check_accuracy returned {one!r}"}
        tolerances = one.pop("tolerances", tolerances)
        one["ok"] = bool(one.get("ok"))
        sets.append(one)
    ok = len(sets) == len(refs) and all(s["ok"] for s in sets)
    return {"ok": ok, "tolerances": tolerances, "sets": sets}


def _metrics(
    shape: Shape, median_us: float, copy_gbs: float | None, distinct: int | None = None
) -> dict:
    gbs = shape.min_bytes() / (median_us * 1e3)
    floor_us = shape.min_bytes() / (copy_gbs * 1e3) if copy_gbs else None
    d_floor_us = distinct / (copy_gbs * 1e3) if copy_gbs and distinct else None
    return {
        "gbs": gbs,
        "pct_copy_bw": 100.0 * gbs / copy_gbs if copy_gbs else None,
        "tflops": shape.flops() / (median_us * 1e6),
        "x_floor": median_us / floor_us if floor_us else None,
        # time / (distinct bytes of the first input set / copy bandwidth)
        "x_distinct_floor": median_us / d_floor_us if d_floor_us else None,
    }


def _synchronize(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_entry(ctx: dict, shape: Shape, kernel: dict, variant: str, inputs, refs) -> dict:
    torch = ctx["torch"]
    # Starts as an error entry; filled in as the checks and timings succeed.
    result = _error_entry(shape, kernel, variant, ctx["label"], None)
    conf = ctx["configs"].get(variant)
    saved_env = os.environ.get("DISABLE_MMA_V3")
    try:
        if kernel.get("provider") == FLASHINFER:
            calls = flashinfer_calls(torch, kernel["module"], inputs)
        elif conf is not None:
            config = conf.config(kernel["module"], torch, shape)
            result["config"] = config._asdict()
            calls = make_calls(kernel["entry"], inputs, "mma", config)
            if conf.mma_v2:  # read by Triton while it compiles (first eager call below)
                os.environ["DISABLE_MMA_V3"] = "1"
        else:
            calls = make_calls(kernel["entry"], inputs, variant)
        return _run_calls(ctx, shape, kernel, result, calls, refs)
    except HarnessError as err:
        result["error"] = str(err)
        return result
    finally:
        if saved_env is None:
            os.environ.pop("DISABLE_MMA_V3", None)
        else:
            os.environ["DISABLE_MMA_V3"] = saved_env


def _run_calls(ctx: dict, shape: Shape, kernel: dict, result: dict, calls: list, refs) -> dict:
    torch, triton, device = ctx["torch"], ctx["triton"], ctx["device"]
    args = ctx["args"]
    wall: list[float] = []
    try:
        outputs = []
        with _KernelRecorder(kernel["module"]) as recorder:
            for call in calls:
                start = time.perf_counter()
                outputs.append(call())
                _synchronize(torch, device)
                wall.append((time.perf_counter() - start) * 1e6)
        result["compiled"] = recorder.report()
        convert = kernel.get("convert_outputs")
        accuracy = check_sets(ctx["reference"], outputs, refs, convert)
    except Exception as err:  # noqa: BLE001 - a variant that raises is a result, not a crash
        if isinstance(err, TypeError) and "variant" in str(err):
            result["error"] = (
                f"{_one_line(err)} (this kernel file has no variant= keyword; "
                f"use --variants {DISPATCH})"
            )
        else:
            result["error"] = _one_line(err)
        if args.verbose:
            traceback.print_exc()
        return result
    del outputs
    result["accuracy"] = accuracy
    result["status"] = "ok" if accuracy["ok"] else "failed"
    ablated = kernel.get("phase") is not None
    if ablated:  # wrong results by design: timed whatever the accuracy says
        result["status"] = ABLATED
    elif not accuracy["ok"] and not args.time_failed:
        return result

    try:
        if device == "cpu":
            # The interpreter's wall-clock from the correctness runs: meaningless as speed,
            # present so the schema and the table are the same as on a GPU.
            times = sorted(wall)
            quant = [_quantile(times, q) for q in QUANTILES]
            result["timing_method"] = "cpu-wallclock"
        else:
            try:
                quant, graph_outputs, graph = time_cuda_graph(
                    torch, triton, calls, args.warmup, args.rep, each=args.graph_each
                )
                result["timing_method"] = graph_timing(args.graph_each)
                # The replayed graph must compute what the eager calls did.
                replay = check_sets(ctx["reference"], graph_outputs, refs, convert)
                if not replay["ok"] and not ablated:
                    result["status"] = "failed"
                    result["timing_note"] = "CUDA-graph replay output fails the accuracy check"
                del graph_outputs, graph
            except Exception as err:  # noqa: BLE001 - e.g. a host sync inside the kernel
                torch.cuda.synchronize()
                quant = time_cuda_eager(triton, calls, args.warmup, args.rep)
                result["timing_method"] = "eager"
                result["timing_note"] = f"CUDA-graph capture failed: {_one_line(err)}"
    except Exception as err:  # noqa: BLE001
        result["status"] = "error"
        result["error"] = f"timing failed: {_one_line(err)}"
        return result
    result["median_us"], result["p20_us"], result["p80_us"] = quant
    result.update(_metrics(shape, quant[0], ctx["copy_gbs"], ctx.get("distinct_bytes")))
    return result


# --- report ---------------------------------------------------------------------------------


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _columns() -> int:
    """The terminal's width, 80 columns when there is none (a log, a host under `kerneldev
    bench`): what the table and the result lines fit."""
    return shutil.get_terminal_size((80, 24)).columns


def _aligned(rows: list[tuple]) -> list[str]:
    """Rows of cells as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def table(report: dict, width: int | None = None) -> str:
    """A short fixed-width table: one row per shape and variant, ratio vs the first label.
    Wider than `width` columns (default: the terminal's, 80 when not a terminal), each shape's
    name goes on a line of its own above its variants' rows."""
    rows = [("shape", "variant", "us", "p20-p80", "GB/s", "%BW", "TFLOP/s", "x floor", "acc", "vs")]
    labels: list[str] = []
    for r in report["results"]:
        if r["label"] not in labels:
            labels.append(r["label"])
    by_key = {(r["shape"], r["label"]): r for r in report["results"]}
    for r in report["results"]:
        base = by_key.get((r["shape"], labels[0]))
        ratio = "-"
        if (
            r["label"] != labels[0]
            and base
            and base["status"] == "ok"
            and r["status"] == "ok"
            and r["median_us"]
            and base["median_us"]
        ):
            ratio = f"{base['median_us'] / r['median_us']:.2f}x"
        acc = {"ok": "ok", "failed": "FAIL", "error": "ERROR"}.get(r["status"], r["status"])
        spread = f"{r['p20_us']:.1f}-{r['p80_us']:.1f}" if r["p20_us"] is not None else "-"
        rows.append(
            (
                r["shape"],
                r["label"],
                _fmt(r["median_us"], ".1f"),
                spread,
                _fmt(r["gbs"], ".0f"),
                _fmt(r["pct_copy_bw"], ".1f"),
                _fmt(r["tflops"], ".1f"),
                _fmt(r["x_floor"], ".1f"),
                acc,
                ratio,
            )
        )
    if width is None:
        width = _columns()
    lines = _aligned(rows)
    if max(map(len, lines)) > width:  # each shape's name on a line of its own
        body = _aligned([row[1:] for row in rows])
        lines, shape = ["  " + body[0]], None
        for row, line in zip(rows[1:], body[1:], strict=True):
            if row[0] != shape:
                lines.append(shape := row[0])
            lines.append("  " + line)
    if report["timing"] == "cpu-wallclock":
        lines.append("(cpu-wallclock: interpreter times, meaningless as speed)")
    if len(labels) > 1:
        lines.append(f"vs = speed-up over {labels[0]} (its time / this time)")
    launch = (report.get("launch_floor") or {}).get("median_us")
    if launch is not None:  # in every time above and in neither byte floor
        lines.append(f"launch floor = {launch:.1f} us (a 4-byte fill timed as these calls are)")
    lines += report.get("notes") or []
    if report.get("phases"):
        lines += ["", phase_table(report["phases"], report["settings"]["phases"])]
    return "\n".join(lines)


def write_json(path: Path, report: dict) -> None:
    """Whole or not at all (a temporary file beside it, renamed); HarnessError when it cannot
    be written, with no temporary file left behind."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise HarnessError(f"cannot write --out {path}: {err.strerror or err}") from None


def check_out(text: str) -> Path:
    """--out, checked before anything runs (exit 2): a file path whose folder exists and takes
    a new file (the result is written beside it, then renamed over it)."""
    if not text:
        raise HarnessError("--out is empty: give a file path (e.g. --out result.json)", EXIT_USAGE)
    path = Path(text)
    if path.is_dir() or text.endswith("/"):
        raise HarnessError(
            f"--out {text} is a folder: give a file path (e.g. --out {path / 'result.json'})",
            EXIT_USAGE,
        )
    if not path.resolve().parent.is_dir():
        raise HarnessError(f"--out {text}: its folder does not exist", EXIT_USAGE)
    if path.exists() and not path.is_file():
        raise HarnessError(f"--out {text} is not a regular file", EXIT_USAGE)
    # Try it: permissions, read-only mounts, /proc. A fresh file beside it, removed at once.
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.resolve().parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise HarnessError(
            f"--out {text}: cannot write in {path.resolve().parent}: {err.strerror or err}",
            EXIT_USAGE,
        ) from None
    return path


def progress(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def progress_result(what: str, outcome: str, width: int | None = None) -> None:
    """A result's progress line, "what: outcome", within `width` columns (default: the
    terminal's, 80 when there is none, as for the table): when longer, the outcome goes on
    the lines after it, indented, and any part still too long wraps between words."""
    width = max(width or _columns(), 40)
    line = f"{what}: {outcome}"
    parts = [line] if len(line) <= width else [what + ":", outcome]
    lines = []
    for n, part in enumerate(parts):
        lines += textwrap.wrap(part, width, initial_indent="    " if n else "",
                               subsequent_indent="    ", break_long_words=False,
                               break_on_hyphens=False)  # fmt: skip
    progress("\n".join(lines))


# --- main -----------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line + exit 2, like every other usage error here
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="dsv4_bench.py",
        description="Check and time DSv4 sparse-decode kernel variants (see module docstring).",
    )
    p.add_argument(
        "--kernel",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="kernel file to import by path (repeatable); default: "
        "bundled=<this folder>/flash_mla_sm120_triton.py",
    )
    p.add_argument(
        "--variants",
        default="simt,mma",
        help="comma-separated variant= values of the entry point, plus 'dispatch' (the "
        "file's own choice, variant not passed) and 'flashinfer' (FlashInfer's sm_120 DSv4 "
        "decode, where installed and on an sm_120 GPU; else skipped); default simt,mma",
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="LABEL=key:value,...",
        help="an extra MMA variant LABEL with the kernel file's mma_config rule on a table row "
        "with overrides: row:sm90|sm120, block_h, block_n, num_warps, num_stages, "
        "programs_per_sm, s_by_group, exact_block_h, small_grid_block_n, exact_in_launch, "
        "exact_concurrent, "
        f"prefetch_next, then {', '.join(_CONFIG_KEYS)}; "
        "mma_v2:1 compiles it with DISABLE_MMA_V3=1 (mma.sync on Hopper); repeatable",
    )
    p.add_argument(
        "--sm120-proxy",
        action="store_true",
        help=f"add the variant sm120: the sm_120 table row compiled with mma.sync on this GPU "
        f"(= --config {SM120_PROXY}); its 99 KB shared-memory limit is the row's own",
    )
    p.add_argument(
        "--smem-per-sm",
        type=int,
        default=None,
        metavar="KB",
        help="keep only as many programs of each kernel resident per SM as KB of shared memory "
        "per SM would (100: sm_120 / sm_89), by the kernels' preferred shared-memory carveout; "
        "the blocks per SM the driver reports go into the JSON (`residency`); CUDA only",
    )
    p.add_argument("--shapes", action="append", default=[], help=SPEC_HELP + "; default decode")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--cpu-mode",
        action="store_true",
        help="Triton interpreter on the CPU, tiny shapes; times are meaningless",
    )
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("--rotate", type=int, default=3, help="input sets per shape (default 3)")
    p.add_argument(
        "--graph-each",
        action="store_true",
        help="time each call in a graph of its own (the sets' graphs in turn, each replay "
        "after the L2 flush) instead of the sets' calls back to back in one graph: the peers "
        "harness's way",
    )
    p.add_argument(
        "--warm-entry",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="on every shape, time a second import of the first entry's kernel file (same "
        "variant, inputs and settings; the next entry's where it is not timed) before the "
        "entries, and report it apart: the first entry timed on a shape's fresh inputs can "
        "run long rows in a slower mode (see the module docstring); default on with CUDA, "
        "off with --cpu-mode",
    )
    p.add_argument("--warmup", type=int, default=25, help="do_bench warmup, ms (default 25)")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetition, ms (default 100)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the input sets")
    p.add_argument(
        "--time-failed",
        action="store_true",
        help="time variants that fail accuracy too (still reported as failed)",
    )
    p.add_argument(
        "--phases",
        nargs="?",
        const=",".join(PHASES),
        default=None,
        metavar="PHASE,...",
        help="add ablated copies of every kernel file, timed on the same inputs (MMA variants "
        "only; wrong results by design, reported as ablated): l2tile (every tile gathers the "
        "same L2-resident slots), nomma (no tensor-core products), nogather (both); "
        f"default all: {','.join(PHASES)}",
    )
    p.add_argument("--no-table", action="store_true", help="do not print the table on stdout")
    p.add_argument("--verbose", action="store_true", help="tracebacks of failing variants")
    return p


def _parse_kernels(items: list[str], here: Path) -> list[tuple[str, Path]]:
    if not items:
        return [("bundled", here / "flash_mla_sm120_triton.py")]
    kernels: list[tuple[str, Path]] = []
    for item in items:
        name, sep, path = item.partition("=")
        name = name.strip()
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not path.strip():
            raise HarnessError(f"bad --kernel {item!r}: expected NAME=PATH", EXIT_USAGE)
        if any(name == k for k, _ in kernels):
            raise HarnessError(f"--kernel name {name!r} given twice", EXIT_USAGE)
        kernels.append((name, Path(path.strip()).expanduser()))
    return kernels


def _parse_variants(text: str) -> list[str]:
    variants = [v.strip() for v in text.split(",") if v.strip()]
    if not variants:
        raise HarnessError("--variants is empty", EXIT_USAGE)
    for v in variants:
        if not re.fullmatch(r"[A-Za-z0-9_]+", v):
            raise HarnessError(f"bad variant name {v!r}", EXIT_USAGE)
    return list(dict.fromkeys(variants))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        # Ablated kernel copies (--phases) live here for the run: triton's @jit reads the source.
        with tempfile.TemporaryDirectory(prefix="dsv4_bench_") as scratch:
            return _main(args, argv if argv is not None else sys.argv[1:], Path(scratch))
    except HarnessError as err:
        sys.stderr.write(f"dsv4_bench.py: error: {err}\n")
        return err.exit_code


def _main(args, argv: list[str], scratch: Path) -> int:
    here = Path(__file__).resolve().parent
    cpu = args.cpu_mode or args.device == "cpu"
    device = "cpu" if cpu else "cuda"
    shapes = parse_shapes(args.shapes or ["decode"])
    variants = _parse_variants(args.variants)
    configs = {}
    for text in args.config + ([SM120_PROXY] if args.sm120_proxy else []):
        conf = parse_config(text)
        if conf.label in variants:
            raise HarnessError(f"--config label {conf.label!r} given twice", EXIT_USAGE)
        configs[conf.label] = conf
        variants.append(conf.label)
    if configs and cpu:
        raise HarnessError("--config / --sm120-proxy need a CUDA device", EXIT_USAGE)
    if args.smem_per_sm is not None and (cpu or args.smem_per_sm < 1):
        raise HarnessError("--smem-per-sm needs a CUDA device and KB >= 1", EXIT_USAGE)
    if args.graph_each and cpu:  # the interpreter's wall clock has no graphs to split
        raise HarnessError("--graph-each needs a CUDA device (it times CUDA graphs)", EXIT_USAGE)
    kernel_paths = _parse_kernels(args.kernel, here)
    phases = parse_phases(args.phases)
    if phases and all(v in _NOT_ABLATED_VARIANTS for v in variants):
        raise HarnessError(
            "--phases ablates the MMA tile loop: give an MMA variant (mma, dispatch, a --config "
            "label or --sm120-proxy)",
            EXIT_USAGE,
        )
    copies = ablated_copies(kernel_paths, phases)  # before any import: a bad pattern is exit 2
    if args.rotate < 1 or args.warmup < 0 or args.rep < 1:
        raise HarnessError("--rotate and --rep must be >= 1, --warmup >= 0", EXIT_USAGE)
    if args.out is not None:
        args.out = check_out(args.out)

    if cpu:
        # Must be set before triton is imported: the interpreter is chosen at import time.
        os.environ["TRITON_INTERPRET"] = "1"
        # numpy's divide-by-zero notes from the interpreter (masked lanes) are not news.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.")
        big = [s.name for s in shapes if s.batch * s.heads * s.total_topk > CPU_WORK_WARN]
        if big:
            progress(f"warning: the interpreter will take very long on {', '.join(big)}")
    try:
        import torch
        import triton
        import triton.testing  # noqa: F401 - do_bench
    except ImportError as err:
        raise HarnessError(
            f"{sys.executable} cannot import torch/triton ({_one_line(err)}); install them "
            "or point the host's `python` at an interpreter that has them"
        ) from None
    if not cpu and not torch.cuda.is_available():
        raise HarnessError(
            f"no CUDA device visible to torch {torch.__version__} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
            "use --cpu-mode for the interpreter"
        )

    # Before any kernel is loaded: the load hook caps each one's residency as it loads.
    residency = cap_residency(torch, args.smem_per_sm) if args.smem_per_sm is not None else None

    sys.path.insert(0, str(here))  # dsv4_reference / dsv4_cache live beside this file
    try:
        import dsv4_reference as reference
    except Exception as err:  # noqa: BLE001
        raise HarnessError(
            f"cannot import dsv4_reference.py from {here}: {_one_line(err)}"
        ) from None
    # Under the interpreter: drop its per-operation work that computes nothing (the module beside
    # this file says what; the outputs are bit-identical with and without).
    interpreter_trims = cpu and trim_interpreter()
    kernels = []
    for i, (name, path) in enumerate(kernel_paths):
        info = kernel_file_info(name, path) if path.is_file() else None
        module = import_by_path(f"_dsv4_bench_kernel_{i}_{name.replace('.', '_')}", path)
        entry = getattr(module, ENTRY_POINT, None)
        if not callable(entry):
            raise HarnessError(f"{path} has no function {ENTRY_POINT}()")
        kernels.append(
            {**(info or {}), "phase": None, "ablated_from": None, "gluon": gluon_of(module),
             "entry": entry, "module": module}
        )  # fmt: skip
    for name, phase, source in copies:
        # Same file name as the original, one folder per copy: tracebacks read naturally.
        source_path = next(path for n, path in kernel_paths if n == name)
        path = scratch / f"{name}@{phase}" / source_path.name
        path.parent.mkdir()
        path.write_text(source, encoding="utf-8")
        module = import_by_path(f"_dsv4_bench_phase_{phase}_{name.replace('.', '_')}", path)
        info = {**kernel_file_info(f"{name}@{phase}", path), "git_commit": None}
        info.update(git_dirty=None, phase=phase, ablated_from=name)
        kernels.append({**info, "entry": getattr(module, ENTRY_POINT), "module": module})
    skipped: dict[str, str] = {}
    if FLASHINFER in variants:
        fi_module, why_not = load_flashinfer(torch, device)
        if fi_module is None:
            skipped[FLASHINFER] = why_not
            progress(f"{FLASHINFER}: skipped ({why_not})")
        else:
            kernels.append({
                "name": FLASHINFER, "path": getattr(fi_module, "__file__", None),
                "version": getattr(sys.modules.get("flashinfer"), "__version__", None),
                "phase": None, "ablated_from": None, "provider": FLASHINFER, "entry": None,
                "module": fi_module, "convert_outputs": flashinfer_outputs,
            })  # fmt: skip

    def label(kernel_name: str, variant: str) -> str:
        if variant == FLASHINFER:
            return FLASHINFER
        # An ablated copy `NAME@PHASE` is labelled `phase:PHASE:` + its original's label.
        name, _, phase = kernel_name.partition("@")
        base = variant if len(kernel_paths) == 1 else f"{name}:{variant}"
        return f"phase:{phase}:{base}" if phase else base

    def variants_of(kern: dict) -> list[str]:
        if kern.get("provider") == FLASHINFER:
            return [FLASHINFER]
        if kern["phase"] is None:
            return [v for v in variants if v != FLASHINFER]
        return [v for v in variants if v not in _NOT_ABLATED_VARIANTS]

    entries = [(kern, v) for kern in kernels for v in variants_of(kern)]
    warm_on = bool(entries) and ((not cpu) if args.warm_entry is None else args.warm_entry)
    warm_copies: dict[str, dict] = {}  # kernel name -> its second import, made when needed

    copy = measure_copy_bandwidth(torch, triton) if device == "cuda" else None
    launch = None
    if device == "cuda":
        settle_cuda_graphs(torch, triton)
        # after the throwaway graph, as every entry is (a first graph replays faster)
        launch = measure_launch_floor(
            torch, triton, args.rotate, args.graph_each, args.warmup, args.rep
        )
    report = {
        "schema": SCHEMA,
        "timestamp": _now(),
        "timing": "cpu-wallclock" if cpu else graph_timing(args.graph_each),
        "ok": True,
        "exit_code": EXIT_OK,
        "device": device_info(torch, device),
        "copy_bandwidth": copy,
        "launch_floor": launch,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
        },
        "host": socket.gethostname(),
        "settings": {
            "variants": variants,
            "rotate": args.rotate,
            "graph_each": args.graph_each,
            "warmup_ms": args.warmup,
            "rep_ms": args.rep,
            "quantiles": list(QUANTILES),
            "l2_flush": not cpu,
            "seed": args.seed,
            "time_failed": args.time_failed,
            "phases": phases,
            "configs": {c.label: asdict(c) for c in configs.values()},
            "env": {k: os.environ.get(k) for k in (DISPATCH_ENV, "TRITON_INTERPRET")},
            "interpreter_trims": interpreter_trims,
            "argv": list(argv),
            "smem_per_sm_kb": args.smem_per_sm,
            "warm_entry": warm_on,
        },
        # --smem-per-sm: per kernel build loaded, the blocks per SM the driver reports
        "residency": residency,
        "kernels": [
            {k: v for k, v in kern.items() if k not in ("entry", "module", "convert_outputs")}
            for kern in kernels
        ],
        # variants that could not run on this host, with the reason (one line each)
        "skipped": skipped,
        "shapes": [],
        "results": [],
        # --warm-entry: per shape, the warm-up entries timed before the entries (not results)
        "warm_entries": [],
    }
    report["notes"] = gluon_notes(report)  # what the table's reader must know (one line each)
    copy_gbs = copy["gbs"] if copy else None
    if copy:
        progress(f"copy bandwidth: {copy['gbs']:.0f} GB/s ({report['device']['name']})")
    if launch and launch["median_us"] is not None:
        progress(f"launch floor: {launch['median_us']:.2f} us a call (a 4-byte fill, timed alike)")
    ctx = {
        "torch": torch,
        "triton": triton,
        "device": device,
        "args": args,
        "reference": reference,
        "label": label,
        "copy_gbs": copy_gbs,
        "configs": configs,
    }

    total = len(shapes) * sum(len(variants_of(kern)) for kern in kernels)
    step = 0
    for shape_index, shape in enumerate(shapes):
        floor_us = shape.min_bytes() / (copy_gbs * 1e3) if copy_gbs else None
        report["shapes"].append(
            {
                **{k: v for k, v in asdict(shape).items()},
                "head_dim": HEAD_DIM,
                "bytes": shape.min_bytes(),
                "flops": shape.flops(),
                "floor_us": floor_us,
            }
        )
        try:
            inputs, refs = build_inputs(reference, shape, args, device, shape_index)
        except Exception as err:  # noqa: BLE001 - e.g. out of memory for one shape
            message = f"building inputs/reference failed: {_one_line(err)}"
            if args.verbose:
                traceback.print_exc()
            for kern in kernels:
                for variant in variants_of(kern):
                    step += 1
                    progress_result(f"[{step}/{total}] {shape.name} {label(kern['name'], variant)}",
                                    message)  # fmt: skip
                    report["results"].append(_error_entry(shape, kern, variant, label, message))
            _finish(report, args)
            continue
        ctx["distinct_bytes"] = distinct_bytes(inputs[0], shape)
        report["shapes"][-1]["distinct_bytes"] = ctx["distinct_bytes"]
        report["shapes"][-1]["distinct_floor_us"] = (
            ctx["distinct_bytes"] / (copy_gbs * 1e3) if copy_gbs else None
        )
        # The first entries in order until one is timed: the slow mode is the first timed
        # entry's, and one that raises or fails accuracy is not timed.
        for kern, variant in entries if warm_on else []:
            if kern["name"] not in warm_copies:
                warm_copies[kern["name"]] = warm_copy(kern)
            tag = f"[warm-up] {shape.name} {label(kern['name'], variant)}"
            progress(f"{tag} ...")
            entry = run_entry(ctx, shape, warm_copies[kern["name"]], variant, inputs, refs)
            report["warm_entries"].append(
                {"shape": shape.name, "of": label(kern["name"], variant),
                 **{k: entry.get(k) for k in ("status", "median_us", "p20_us", "p80_us")}}
            )  # fmt: skip
            progress_result(tag, f"not in the table: {_summary(entry)}")
            if entry.get("median_us") is not None:
                break
        for kern in kernels:
            for variant in variants_of(kern):
                step += 1
                tag = f"[{step}/{total}] {shape.name} {label(kern['name'], variant)}"
                progress(f"{tag} ...")
                entry = run_entry(ctx, shape, kern, variant, inputs, refs)
                report["results"].append(entry)
                progress_result(tag, _summary(entry))
                _finish(report, args)
        del inputs, refs
        if device == "cuda":
            torch.cuda.empty_cache()

    _finish(report, args)
    if not args.no_table:
        sys.stdout.write(table(report) + "\n")
        sys.stdout.flush()
    return report["exit_code"]


def warm_copy(kern: dict) -> dict:
    """An entry's kernel once more, for `--warm-entry`. A kernel file is imported a second
    time, as a module of its own: what session 43 measured as the cure (`--kernel warm=<same
    path>` first, H100: T4096 causal 613.4 µs timed first, 575.4 after it, same file).
    FlashInfer is used as it is."""
    if kern.get("provider") == FLASHINFER:
        return kern
    name = re.sub(r"\W", "_", kern["name"])
    module = import_by_path(f"_dsv4_bench_warm_{name}", Path(kern["path"]))
    return {**kern, "entry": getattr(module, ENTRY_POINT), "module": module}


def build_inputs(reference, shape: Shape, args, device: str, shape_index: int):
    """`--rotate` input sets (distinct seeds) and their float64 references."""
    inputs, refs = [], []
    for r in range(args.rotate):
        kwargs = dict(
            device=device,
            seed=args.seed + 1000 * shape_index + r,
            with_sink=shape.sink,
            topk_length="full" if shape.lengths == "causal" else shape.lengths,
            invalid_fraction=shape.invalid,
            page_stride="pad576" if shape.pad else None,
        )
        if shape.extra_topk:
            kwargs.update(extra_topk=shape.extra_topk, extra_page_size=shape.extra_page_size)
        if shape.layout != "v4":  # older reference files know only V4: never asked for it
            main_fmt, extra_fmt = LAYOUTS[shape.layout][0]
            kwargs.update(kv_layout=main_fmt, extra_kv_layout=extra_fmt)
        one = reference.make_inputs(shape.batch, shape.heads, shape.topk, shape.page_size, **kwargs)
        if shape.share:
            _share_indices(one, shape.share, kwargs["seed"])
        if shape.own:
            _own_indices(one, kwargs["seed"])
        if shape.lengths == "causal":
            _causal_lengths(one, shape.share)
        inputs.append(one)
        refs.append(reference.reference_sparse_decode(**one))
    return inputs, refs


# The entry's length argument of each cache (main, extra), in `_index_rows`' order.
_LENGTH_KEYS = ("topk_length", "extra_topk_length")


def _index_rows(inputs: dict):
    """(0 for the main cache, 1 for the extra one; its index rows as a [rows, topk] view;
    its cache's tokens) for each cache the inputs have."""
    for which, (key, cache_key) in enumerate(
        (("indices", "k_cache"), ("extra_indices", "extra_k_cache"))
    ):
        idx = inputs.get(key)
        if idx is not None:
            cache = inputs[cache_key]
            yield which, idx.reshape(idx.shape[0], -1), cache.shape[0] * cache.shape[1]


def _rewrite_valid(flat, num_tokens: int, ids) -> None:
    """Give the index rows `flat` the new ids where they select a token; the entries the
    original rows made invalid (negative, past the cache) stay as they were."""
    import torch

    bad = (flat < 0) | (flat >= num_tokens)
    flat.copy_(torch.where(bad, flat, ids.to(flat.dtype)))


def _share_indices(inputs: dict, share: int, seed: int) -> None:
    """Rewrite the index rows as prefill tokens' are: requests of `share` consecutive query
    tokens; in the main cache token i of a request selects the window of topk tokens starting
    at the request's base + i (consecutive rows overlap in topk - 1 tokens, shifted by one
    position); in the extra cache every token of a request selects the request's own topk
    tokens in one order, 1 in 16 entries redrawn from topk more. Entries the original rows
    made invalid (negative, past the cache) stay invalid; lengths are kept."""
    import torch

    for which, flat, num_tokens in _index_rows(inputs):
        window = which == 0
        T, topk = flat.shape
        dev = flat.device
        gen = torch.Generator(device=dev).manual_seed(seed + which)
        t = torch.arange(T, device=dev)
        req, pos = t // share, t % share
        cols = torch.arange(topk, device=dev)
        if window:
            ids = req[:, None] * (share + topk) + pos[:, None] + cols[None, :]
        else:
            n_req = int(req[-1]) + 1 if T else 0
            perm = torch.argsort(torch.rand(n_req, 2 * topk, generator=gen, device=dev), dim=1)
            base = req[:, None] * (2 * topk)
            ids = base + perm[req][:, :topk]
            other = base + perm[req].gather(
                1, topk + torch.randint(0, topk, (T, topk), generator=gen, device=dev)
            )
            redraw = torch.rand(T, topk, generator=gen, device=dev) < 1 / 16
            ids = torch.where(redraw, other, ids)
        _rewrite_valid(flat, num_tokens, ids % max(num_tokens, 1))


def _own_indices(inputs: dict, seed: int) -> None:
    """Rewrite the index rows so that each row of q owns its tokens: row t draws its valid
    entries without replacement from the cache tokens [t * R, (t + 1) * R), R the cache's
    tokens per row (at least topk: `make_inputs` sizes each cache at 1.25x the call's
    selections). Entries the original rows made invalid stay invalid; lengths are kept."""
    import torch

    for which, flat, num_tokens in _index_rows(inputs):
        T, topk = flat.shape
        if T == 0 or topk == 0:
            continue
        per_row = num_tokens // T
        if per_row < topk:  # cannot happen with make_inputs' cache size; never alias silently
            raise HarnessError(f"own=1: {num_tokens} cache tokens for {T} rows of {topk}")
        dev = flat.device
        gen = torch.Generator(device=dev).manual_seed(seed + 2 + which)
        picks = torch.argsort(torch.rand(T, per_row, generator=gen, device=dev), dim=1)
        ids = torch.arange(T, device=dev)[:, None] * per_row + picks[:, :topk]
        _rewrite_valid(flat, num_tokens, ids)


# SGLang 0.5.23's DSv4 backend (srt/layers/attention/deepseek_v4_backend.py): a token at
# position p (seq_lens_casual = p + 1) sees min(p + 1, SWA_WINDOW = 128) window rows and, in a
# compress-ratio-4 layer, max((p + 1) // 4, 1) compressed rows, at most the index top-k.
CAUSAL_COMPRESS_RATIO = 4


def _causal_lengths(inputs: dict, share: int) -> None:
    """Set the lengths as a prefill's tokens have them: row t is the token at position p = t
    (one request from position 0), or p = t mod `share` (requests of `share` tokens); its main
    cache length min(p + 1, topk) (the window: the dual shapes' topk is SGLang's 128), its
    extra cache's min(max((p + 1) // CAUSAL_COMPRESS_RATIO, 1), extra topk). The indices past
    a length stay as they were (a kernel must ignore them)."""
    import torch

    q = inputs["q"]
    pos = torch.arange(q.shape[0], device=q.device)
    if share:
        pos = pos % share
    seen = pos + 1
    for which, flat, _ in _index_rows(inputs):
        topk = flat.shape[1]
        if which == 0:
            lens = seen.clamp(max=topk)
        else:
            lens = (seen // CAUSAL_COMPRESS_RATIO).clamp(min=1, max=topk)
        inputs[_LENGTH_KEYS[which]] = lens.to(torch.int32)


def distinct_bytes(inputs: dict, shape: Shape) -> int:
    """The bytes a call must move at least: every distinct valid cache token it selects once
    (per cache, at its format's token size), every index, q in and out back. For inputs
    whose tokens own their rows it is about `min_bytes`; for prefill rows that coincide, far
    less (the floor of item 5 of issue 20)."""
    import torch

    total = 2 * shape.batch * shape.heads * HEAD_DIM * 2
    token_bytes = LAYOUTS[shape.layout][1]  # (main, extra)
    for which, flat, num_tokens in _index_rows(inputs):
        token_b = token_bytes[which]
        valid = (flat >= 0) & (flat < num_tokens)
        lens = inputs.get(_LENGTH_KEYS[which])
        if lens is not None:
            pos = torch.arange(flat.shape[1], device=flat.device)
            valid &= pos[None, :] < lens[:, None]
        total += int(torch.unique(flat[valid]).numel()) * token_b + flat.numel() * INDEX_BYTES
    return total


def _error_entry(shape: Shape, kern: dict, variant: str, label, message: str | None) -> dict:
    phase = kern.get("phase")
    return {
        "shape": shape.name,
        "kernel": kern["name"],
        "variant": variant,
        "label": label(kern["name"], variant),
        # --phases: the ablation and the label of the real entry it is a copy of
        "phase": phase,
        "phase_of": label(kern["ablated_from"], variant) if phase else None,
        "status": "error",
        "error": message,
        "accuracy": None,
        "timing_method": None,
        "timing_note": None,
        "median_us": None,
        "p20_us": None,
        "p80_us": None,
        "gbs": None,
        "pct_copy_bw": None,
        "tflops": None,
        "x_floor": None,
        "x_distinct_floor": None,
    }


def _summary(entry: dict) -> str:
    if entry["status"] == "error":
        return f"ERROR {entry['error']}"
    words = {"ok": "ok", ABLATED: "ablated (wrong by design, timed)"}
    text = words.get(entry["status"], "FAILED accuracy")
    if entry["status"] == "failed":
        bad = [s for s in entry["accuracy"]["sets"] if not s.get("ok")]
        if bad:
            # Which checks failed, then the headline errors; the JSON has every number.
            failed = [k for k, v in bad[0].items() if k.endswith("_ok") and v is False]
            numbers = [
                f"{k}={v:.3g}"
                for k, v in bad[0].items()
                if k in ("out_max_abs_err", "out_cos_diff", "lse_max_abs_err")
                and isinstance(v, (int, float))
            ]
            details = ", ".join(failed + numbers) or bad[0].get("error", "")
            text += f" in {len(bad)}/{len(entry['accuracy']['sets'])} sets ({details})"
    if entry["median_us"] is not None:
        text += (
            f"  {entry['median_us']:.1f} us [{entry['p20_us']:.1f}-{entry['p80_us']:.1f}]"
            f"  {entry['gbs']:.0f} GB/s"
        )
        if entry["pct_copy_bw"] is not None:
            text += f"  {entry['pct_copy_bw']:.1f}% BW  x{entry['x_floor']:.1f} floor"
        text += f"  {entry['tflops']:.1f} TFLOP/s"
    if entry["timing_note"]:
        text += f"  ({entry['timing_note']})"
    return text


def _finish(report: dict, args) -> None:
    report["ok"] = all(r["status"] in ("ok", ABLATED) for r in report["results"])
    if report["settings"]["phases"]:
        report["phases"] = phase_rows(report)
    report["exit_code"] = EXIT_OK if report["ok"] else EXIT_FAILED
    if args.out is not None:
        write_json(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
