"""Kernel developer's quick GPU loop for the DSv4 sparse-decode kernels (not the product harness).

Imports only torch, triton and the files in `kernels/`. For each target shape of issue 4 it
checks simt and mma (and a sweep of MMA configs) against the float64 reference, times each with
CUDA-graph replay + triton.testing.do_bench (L2 flushed per call, rotating input sets), and
reads the compiler's report (n_regs, n_spills, shared memory, wgmma or mma.sync in the PTX).

    PYTHONUNBUFFERED=1 python3 scripts/kernel_dev_bench.py [--out DIR] [--sweep] [--simt]
        [--colsplit]

--colsplit also runs the v4 candidate rows of the kernel file (`_SM90_COLSPLIT_ROWS`: column
split over two programs per head block) next to the default table config, on the same inputs,
each with the split count the table rule gives that row.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "kernels"))
sys.path.insert(0, HERE)  # compile_check

import compile_check  # noqa: E402  (this folder: the ptxas report)
import dsv4_reference as ref  # noqa: E402

if "--kernel" in sys.argv:  # time another copy of the kernel file (A/B against an old version)
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "flash_mla_sm120_triton_ab", sys.argv[sys.argv.index("--kernel") + 1]
    )
    fl = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = fl
    _spec.loader.exec_module(fl)
else:
    import flash_mla_sm120_triton as fl  # noqa: E402

SHAPES = [
    # name, B, H, topk, page, extra_topk, extra_page, target_us
    ("B1_topk2048", 1, 64, 2048, 64, 0, 64, 30),
    ("B1_main128+extra512", 1, 64, 128, 256, 512, 64, 25),
    ("B64_topk2048", 64, 64, 2048, 64, 0, 64, 150),
    ("B128_topk2048", 128, 64, 2048, 64, 0, 64, 250),
    ("B64_main128+extra512", 64, 64, 128, 256, 512, 64, 80),
    ("B128_main128+extra512", 128, 64, 128, 256, 512, 64, 100),
    ("B64_H128_topk512", 64, 128, 512, 64, 0, 64, 70),
]


class _Capture:
    """Wraps a JITFunction so the launcher's CompiledKernels (n_regs, n_spills, asm) are kept:
    `first` is the first launch since `reset()` (the bf16-P pass when there are two)."""

    def __init__(self, fn):
        self.fn = fn
        self.last = None
        self.first = None

    only_exact_pass = False  # drop the first (bf16-P) launch: times the exact pass alone

    def reset(self):
        self.first = self.last = None

    def __getitem__(self, grid):
        launch = self.fn[grid]

        def call(*args, **kwargs):
            if self.only_exact_pass and not kwargs.get("EXACT_PASS_BELOW", 0):
                return None
            self.last = launch(*args, **kwargs)
            if self.first is None:
                self.first = self.last
            return self.last

        return call


_PTXAS_SEEN: dict = {}


def ptxas_report(ck) -> list[str]:
    """ptxas's own verdict on the kernel's PTX (-v): register use, spills and the performance
    warnings (e.g. wgmma serialisation) that Triton does not surface."""
    ptx = ck.asm.get("ptx", "") if ck is not None and hasattr(ck, "asm") else ""
    if not ptx:
        return []
    key = hash(ptx)
    if key not in _PTXAS_SEEN:
        major, minor = torch.cuda.get_device_capability()
        try:
            lines = compile_check.ptxas_lines(ptx, 10 * major + minor)
            lines = lines or ["ptxas: no bundled ptxas accepted this PTX"]
        except Exception as e:  # a diagnostic only: never lose the run over it
            lines = [f"ptxas failed: {e!r}"]
        _PTXAS_SEEN[key] = lines
    return _PTXAS_SEEN[key]


def compile_report(ck) -> dict:
    if ck is None:
        return {}
    ptx = ck.asm.get("ptx", "") if hasattr(ck, "asm") else ""
    return {
        "n_regs": getattr(ck, "n_regs", None),
        "n_spills": getattr(ck, "n_spills", None),
        "shared": getattr(ck.metadata, "shared", None),
        "num_warps": getattr(ck.metadata, "num_warps", None),
        "wgmma": ptx.count("wgmma.mma_async"),
        "mma_sync": ptx.count("mma.sync"),
        "cp_async": ptx.count("cp.async"),
        "ttgir_convert_layout": ck.asm.get("ttgir", "").count("ttg.convert_layout"),
        "ttgir_local_alloc": ck.asm.get("ttgir", "").count("ttg.local_alloc"),
        "ptxas": ptxas_report(ck) if PTXAS else [],
    }


def time_graph(fns) -> list[float]:
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graphs = []
    for fn in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        graphs.append(g)
    torch.cuda.synchronize()
    cyc = itertools.cycle(graphs)
    return triton.testing.do_bench(
        lambda: next(cyc).replay(), warmup=25, rep=200, quantiles=[0.5, 0.2, 0.8]
    )


def copy_bandwidth() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=5, rep=100)
    return 2 * x.numel() / (ms * 1e-3) / 1e9


# Config variants tried on top of the table's choice: name -> MMAConfig field overrides.
VARIANTS = [
    ("default", {}),
    ("pv2", {"pv_split": True}),
    ("bn32", {"block_n": 32}),
    ("bn32_pv2", {"block_n": 32, "pv_split": True}),
    ("bh32_w4", {"block_h": 32, "num_warps": 4}),
    ("bh32_w4_pv2", {"block_h": 32, "num_warps": 4, "pv_split": True}),
    ("bh32_w4_bn32_pv2", {"block_h": 32, "num_warps": 4, "block_n": 32, "pv_split": True}),
]


COLSPLIT = "--colsplit" in sys.argv  # also run the v4 candidate rows (see module docstring)
PTXAS = "--ptxas" in sys.argv  # also run ptxas -v on each kernel's PTX (warnings, spills)
EXTRA_VARIANTS: list = []  # --variant NAME=field:value,field:value (repeatable)


CS_ROWS = {0: "off", 1: "n64", 2: "n32x2", 3: "auto"}  # variant key cs:N
# Variants (key exact_pass_only:1) timed without the first launch: the exact pass + combine
# alone (their accuracy fails by construction).
EXACT_ONLY: set = set()


def parse_variant(text: str):
    """'n128=block_n:128,num_stages:2' -> ('n128', {'block_n': 128, 'num_stages': 2})."""
    name, _, spec = text.partition("=")
    over = {}
    for item in filter(None, spec.split(",")):
        k, _, v = item.partition(":")
        over[k] = int(v)
    return name, over


def candidate_configs(B, H, topk, e_topk):
    """(name, MMAConfig) of each `_SM90_COLSPLIT_ROWS` mode, as the table rule would pick it."""
    rows = getattr(fl, "_SM90_COLSPLIT_ROWS", {})
    saved = fl._SM90_COLSPLIT_MODE if rows else None
    out = []
    try:
        for mode in rows:
            fl._SM90_COLSPLIT_MODE = mode
            out.append(("cs_" + mode, fl._mma_config(torch.device("cuda"), H, topk, e_topk, B)))
    finally:
        if rows:
            fl._SM90_COLSPLIT_MODE = saved
    return out


def configs_for(B, H, topk, e_topk, sweep):
    base = fl._mma_config(torch.device("cuda"), H, topk, e_topk, B)
    out, seen = [], set()
    for name, over in (VARIANTS if sweep else VARIANTS[:1]) + EXTRA_VARIANTS:
        over = dict(over)
        if over.pop("exact_pass_only", 0):
            EXACT_ONLY.add(name)
        row = CS_ROWS.get(over.pop("cs", -1))
        c = base
        if row is not None:  # the table rule's config for that `_SM90_COLSPLIT_ROWS` row
            saved = fl._SM90_COLSPLIT_MODE
            try:
                fl._SM90_COLSPLIT_MODE = row
                c = fl._mma_config(torch.device("cuda"), H, topk, e_topk, B)
            finally:
                fl._SM90_COLSPLIT_MODE = saved
        c = c._replace(**over)
        key = (c, name in EXACT_ONLY)
        if key not in seen:
            seen.add(key)
            out.append((name, c))
    if COLSPLIT:
        for name, c in candidate_configs(B, H, topk, e_topk):
            if c not in seen:
                seen.add(c)
                out.append((name, c))
    return out


STRESS = [  # small valid sets, where P's bf16 rounding shows
    dict(B=4, H=64, topk=8, page_size=1, with_sink=True),
    dict(B=4, H=64, topk=37, page_size=64, topk_length="partial", invalid_fraction=0.2),
    dict(
        B=4,
        H=64,
        topk=128,
        page_size=256,
        extra_topk=64,
        extra_page_size=64,
        with_sink="inf",
        topk_length="partial",
    ),
    dict(B=8, H=128, topk=300, page_size=48, page_stride="pad576", invalid_fraction=0.3),
    dict(B=2, H=64, topk=2048, page_size=64, kv_scale_spread=2),
]


def accuracy_stress(sweep) -> list[dict]:
    rows = []
    for i, kw in enumerate(STRESS):
        inp = ref.make_inputs(**kw, device="cuda", seed=1000 + i)
        r_out, r_lse = ref.reference_sparse_decode(**inp)
        cfgs = configs_for(kw["B"], kw["H"], kw["topk"], kw.get("extra_topk", 0), sweep)
        for label, variant, cfg in [("simt", "simt", None)] + [
            ("mma:" + n, "mma", c) for n, c in cfgs
        ]:
            try:
                o, lse_k = fl.flash_mla_sparse_decode_triton(**inp, variant=variant, _config=cfg)
                a = ref.check_accuracy(o, lse_k, r_out, r_lse)
                row = {
                    "case": i,
                    "variant": label,
                    "ok": a["ok"],
                    "mismatched": a["out_mismatched"],
                    "max_abs": a["out_max_abs_err"],
                    "cos": a["out_cos_diff"],
                    "lse_ok": a["lse_ok"],
                }
            except Exception as e:
                row = {"case": i, "variant": label, "ok": False, "error": repr(e)[:300]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-stress", action="store_true", help="skip the small-set accuracy pass")
    ap.add_argument("--simt", action="store_true", help="also time the SIMT baseline")
    ap.add_argument("--shapes", default="")
    ap.add_argument("--kernel", default="", help="path of another flash_mla_sm120_triton.py")
    ap.add_argument("--tag", default="", help="suffix of the JSON file name")
    ap.add_argument("--sets", type=int, default=2)
    ap.add_argument("--colsplit", action="store_true", help="also run the v4 candidate rows")
    ap.add_argument("--ptxas", action="store_true", help="ptxas -v report of each kernel")
    ap.add_argument(
        "--variant", action="append", default=[],
        help="NAME=field:int,... MMAConfig overrides on the table's config (cs:0-3 = the "
        "off/n64/n32x2/auto column-split row); repeatable",
    )  # fmt: skip
    args = ap.parse_args()
    EXTRA_VARIANTS.extend(parse_variant(v) for v in args.variant)

    cap = _Capture(fl._mma_split_kernel)
    fl._mma_split_kernel = cap
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    info = {
        "device": props.name,
        "cc": list(torch.cuda.get_device_capability(dev)),
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    info["copy_GBps"] = copy_bandwidth()
    print(json.dumps(info), flush=True)
    bw = info["copy_GBps"]
    stress = [] if args.no_stress else accuracy_stress(args.sweep)
    rows = []
    wanted = set(args.shapes.split(",")) if args.shapes else None
    for name, B, H, topk, page, e_topk, e_page, target in SHAPES:
        if wanted and name not in wanted:
            continue
        sets = [
            ref.make_inputs(
                B,
                H,
                topk,
                page,
                extra_topk=e_topk,
                extra_page_size=e_page,
                with_sink=True,
                device="cuda",
                seed=100 + i,
            )  # fmt: skip
            for i in range(args.sets)
        ]
        r_out, r_lse = ref.reference_sparse_decode(**sets[0])
        tot = topk + e_topk
        floor_bytes = ref.roofline_bytes(B, H, tot)
        flops = ref.roofline_flops(B, H, tot)
        variants = [("mma:" + n, "mma", c) for n, c in configs_for(B, H, topk, e_topk, args.sweep)]
        if args.simt:
            variants.append(("simt", "simt", None))
        for label, variant, cfg in variants:
            try:
                cap.reset()
                cap.only_exact_pass = label.split(":", 1)[-1] in EXACT_ONLY
                o, lse_k = fl.flash_mla_sparse_decode_triton(
                    **sets[0], variant=variant, _config=cfg
                )
                acc = ref.check_accuracy(o, lse_k, r_out, r_lse)
                rep = compile_report(cap.first) if variant == "mma" else {}
                safe = "".join(ch if ch.isalnum() else "_" for ch in name)
                ttgir_path = os.path.join(args.out, f"ttgir_{safe}.mlir")
                keep_ir = name in ("B64_topk2048", "B64_main128+extra512")
                if keep_ir and cap.first is not None and not os.path.exists(ttgir_path):
                    with open(ttgir_path, "w") as f:  # the IR of the shape's first variant
                        f.write(cap.first.asm.get("ttgir", ""))
                fns = [
                    (
                        lambda s=s, v=variant, c=cfg: fl.flash_mla_sparse_decode_triton(
                            **s, variant=v, _config=c
                        )
                    )
                    for s in sets
                ]
                med, p20, p80 = time_graph(fns)
                us = med * 1e3
                row = {
                    "shape": name, "variant": label, "cfg": cfg._asdict() if cfg else None,
                    "us": us, "p20_us": p20 * 1e3, "p80_us": p80 * 1e3, "target_us": target,
                    "GBps": floor_bytes / (us * 1e-6) / 1e9,
                    "pct_copy_bw": 100 * floor_bytes / (us * 1e-6) / 1e9 / bw,
                    "TFLOPs": flops / (us * 1e-6) / 1e12,
                    "x_floor": us / (floor_bytes / (bw * 1e9) * 1e6),
                    "ok": acc["ok"], "acc": acc, "compile": rep,
                }  # fmt: skip
            except Exception as e:  # keep going: one bad config must not lose the run
                row = {"shape": name, "variant": label, "error": repr(e)[:500], "ok": False}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "acc"}), flush=True)
        del sets
        torch.cuda.empty_cache()

    with open(os.path.join(args.out, f"kernel_dev_bench{args.tag}.json"), "w") as f:
        json.dump({"info": info, "stress": stress, "rows": rows}, f, indent=1, default=str)
    if PTXAS:
        print("\nptxas -v (first launch of each variant; warnings and resource lines)")
        for r in rows:
            lines = (r.get("compile") or {}).get("ptxas") or []
            keep = [ln.strip() for ln in lines if "arning" in ln or "Used" in ln or "spill" in ln]
            if keep:
                print(f"  {r['shape']} {r['variant']}:")
                for ln in keep[:8]:
                    print(f"    {ln[:160]}")
    print("\naccuracy stress (small valid sets): failures by variant")
    for v in sorted({r["variant"] for r in stress}):
        rs = [r for r in stress if r["variant"] == v]
        bad = [f"case{r['case']}:{r.get('mismatched', 'ERR')}" for r in rs if not r["ok"]]
        print(f"  {v:24s} {len(rs) - len(bad)}/{len(rs)} ok  {' '.join(bad)}")
    print(f"\n{info['device']} torch {info['torch']} triton {info['triton']} "
          f"copy {bw:.0f} GB/s")  # fmt: skip
    print(f"{'shape':24s} {'variant':16s} {'us':>9s} {'p20-p80':>15s} {'tgt':>5s} {'%bw':>6s} "
          f"{'TF/s':>6s} ok  regs spill smem  wgmma/mma.sync cp.async")  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:24s} {r['variant']:16s} ERROR {r['error'][:80]}")
            continue
        c = r["compile"] or {}
        print(
            f"{r['shape']:24s} {r['variant']:16s} {r['us']:9.1f} "
            f"{r['p20_us']:7.1f}-{r['p80_us']:<7.1f} {r['target_us']:5d} {r['pct_copy_bw']:6.1f} "
            f"{r['TFLOPs']:6.1f} {'Y' if r['ok'] else 'N'}  {c.get('n_regs', '')} "
            f"{c.get('n_spills', '')} {c.get('shared', '')} "
            f"{c.get('wgmma', '')}/{c.get('mma_sync', '')} {c.get('cp_async', '')}"
        )


if __name__ == "__main__":
    main()
