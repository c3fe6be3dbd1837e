"""Summarise a torch.profiler Chrome trace: top kernels by device time, grouped by family.

Standard library only: `kerneldev profile` uploads this file and runs it on the host with the
host's python, next to the trace (traces of a busy server run to hundreds of MB, so only the
summary travels). It streams the `traceEvents` array one event at a time, so memory stays flat
however large the (optionally gzipped) trace is.

    python3 trace_summary.py TRACE [--top K] [--json-out PATH]

GPU traces: events with `cat` "kernel" (plus "gpu_memcpy" / "gpu_memset") are summed by name.
CPU-only traces (the sandbox service without a GPU) have no kernels: then the
`user_annotation` ranges (`torch.profiler.record_function`) are summed instead and `time_kind`
says "cpu": the shares are of CPU time, not GPU time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys

SCHEMA = "kerneldev.trace-summary/1"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_CATS = ("user_annotation",)

# Families, tried in order; the first pattern that matches a kernel's name wins. The attention
# kernels are told apart by who wrote them, so an A/B's attention share names the kernel that ran:
# FlashInfer's sm_120 sparse MLA (SGLang 0.5.23's default: sparse_mla_decode_dsv4_kernel and its
# _merge_kernel), FlashMLA's (flash_fwd_splitkv_mla_kernel, its combine, the sparse kernels),
# SGLang's own Triton kernel file (_tiled_sparse_decode_kernel) and kerneldev's bundled kernels
# (_mma_split_kernel, _simt_decode_kernel and their _combine_kernel).
ATTN_FLASHINFER = "attention: FlashInfer"
ATTN_FLASHMLA = "attention: FlashMLA"
ATTN_SGLANG_TRITON = "attention: SGLang Triton"
ATTN_KERNELDEV = "attention: kerneldev"
ATTENTION_FAMILIES = (ATTN_FLASHINFER, ATTN_FLASHMLA, ATTN_SGLANG_TRITON, ATTN_KERNELDEV)
ATTENTION = ATTN_KERNELDEV  # the bundled kernels' family (older name of the single family)
COMBINE, GEMM, GLUE, OTHER = ("combine", "GEMM", "elementwise/copy glue", "other")
FAMILY_PATTERNS = (
    (ATTN_FLASHINFER, r"sparse_mla_decode_dsv4|sparse_mla_sm120|flashinfer"),
    (ATTN_FLASHMLA, r"flash_mla|flashmla|splitkv_mla|mla_combine|sparse_attn_fwd|sparse_mla_fwd"),
    (ATTN_SGLANG_TRITON, r"_tiled_sparse_decode_kernel"),
    (ATTN_KERNELDEV, r"_mma_split_kernel|_simt_decode_kernel|^_combine_kernel$|sparse_decode"),
    (COMBINE, r"combine|merge_attn|merge_state"),
    (
        ATTN_SGLANG_TRITON,
        r"decode_attention|_fwd_kernel_stage|sparse_attn",  # other Triton attention in SGLang
    ),
    (GEMM, r"gemm|cublas|cutlass|nvjet|xmma|wgmma|matmul|\bmm\b|_mm_|sm\d+_.*_tn|o_proj"),
    (
        GLUE,
        r"elementwise|vectorized|copy|memcpy|memset|fill|cat_|index|gather|scatter|reduce|norm|"
        r"add|mul|clamp|cast|convert|argmax|softmax|sampling|residual|unrolled",
    ),
)
_COMPILED = [(family, re.compile(p, re.IGNORECASE)) for family, p in FAMILY_PATTERNS]


def family(name: str) -> str:
    for fam, pattern in _COMPILED:
        if pattern.search(name):
            return fam
    return OTHER


def _open_text(path: str):
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def iter_events(path: str, chunk: int = 1 << 20):
    """Yield the objects of the trace's `traceEvents` array, reading `chunk` chars at a time."""
    decoder = json.JSONDecoder()
    with _open_text(path) as f:
        buf = ""
        # Find the start of the array.
        while True:
            pos = buf.find('"traceEvents"')
            if pos >= 0:
                bracket = buf.find("[", pos)
                if bracket >= 0:
                    buf = buf[bracket + 1 :]
                    break
            more = f.read(chunk)
            if not more:
                raise ValueError(f"{path}: no traceEvents array (not a Chrome trace?)")
            buf = buf[-64:] + more if pos < 0 else buf + more
        eof = False
        i = 0  # parse position in buf; the consumed prefix is dropped only when reading more
        while True:
            while i < len(buf) and buf[i] in " \t\r\n,":
                i += 1
            if buf.startswith("]", i):
                return
            if i < len(buf):
                try:
                    obj, end = decoder.raw_decode(buf, i)
                except ValueError:
                    obj = None
                if obj is not None and (end < len(buf) or eof):
                    i = end
                    if isinstance(obj, dict):
                        yield obj
                    continue
            if eof:
                if buf[i:].strip():
                    raise ValueError(f"{path}: the trace ends in the middle of an event")
                return
            more = f.read(chunk)
            if not more:
                eof = True
            buf, i = buf[i:] + more, 0


def summarise(path: str, top: int = 15) -> dict:
    """The top entries by total time, with family, calls, total ms, share and mean µs."""
    per_kind: dict[str, dict[str, list[float]]] = {"gpu": {}, "cpu": {}}
    for ev in iter_events(path):
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        kind = "gpu" if cat in GPU_CATS else "cpu" if cat in CPU_CATS else None
        if kind is None:
            continue
        name = str(ev.get("name", "?"))
        dur = float(ev.get("dur") or 0.0)  # microseconds
        slot = per_kind[kind].setdefault(name, [0, 0.0])
        slot[0] += 1
        slot[1] += dur
    kind = "gpu" if per_kind["gpu"] else "cpu"
    entries = per_kind[kind]
    total_us = sum(v[1] for v in entries.values())
    rows = []
    for name, (calls, dur) in sorted(entries.items(), key=lambda kv: -kv[1][1]):
        rows.append(
            {
                "name": name,
                "family": family(name),
                "calls": int(calls),
                "total_ms": dur / 1000.0,
                "share": dur / total_us if total_us else None,
                "mean_us": dur / calls if calls else None,
            }
        )
    families: dict[str, dict] = {}
    for r in rows:
        fam = families.setdefault(r["family"], {"family": r["family"], "calls": 0, "total_ms": 0.0})
        fam["calls"] += r["calls"]
        fam["total_ms"] += r["total_ms"]
    for fam in families.values():
        fam["share"] = fam["total_ms"] * 1000.0 / total_us if total_us else None
    return {
        "schema": SCHEMA,
        "trace": path,
        "time_kind": kind,
        "total_ms": total_us / 1000.0,
        "kernels_seen": len(entries),
        "top": rows[: max(0, top)],
        "families": sorted(families.values(), key=lambda f: -f["total_ms"]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Summarise a torch.profiler Chrome trace.")
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json-out", help="write the summary here (default: stdout)")
    args = p.parse_args(argv)
    try:
        summary = summarise(args.trace, args.top)
    except (OSError, ValueError, EOFError) as err:
        sys.stderr.write(f"trace_summary.py: error: {err}\n")
        return 1
    text = json.dumps(summary, indent=1)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
