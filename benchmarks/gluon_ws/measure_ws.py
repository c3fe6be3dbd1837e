"""Device run: the Gluon warp-specialized prototype (gluon_ws.py) next to the shipped MMA kernel
on the same inputs (make_inputs, FlashMLA's padded stride, 2 input sets): accuracy against the
float64 reference (FlashMLA's bounds) and CUDA-graph time with L2 flushed (do_bench).
`--smoke [--ca | --dq]`: one tiny call of the prototype (run first in its own process: a hang
or a crash there must not take the main run with it). Issue 20, session 14 (docs/benchmarks.md;
calls E-G ran ws64 / ws32 / the ablations / ca32; dq64 and dq32 are compiled, not yet run):

    python3 benchmarks/gluon_ws/measure_ws.py --smoke --dq
    python3 benchmarks/gluon_ws/measure_ws.py mma,ca32,dq64,dq32 B64_k2048,B128_k2048,B64_H128_k512
"""

import json
import os
import statistics
import sys
import time

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the checkout
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "kernels"))
import flash_mla_sm120_triton as K  # noqa: E402
import gluon_ws as G  # noqa: E402
from dsv4_reference import check_accuracy, make_inputs, reference_sparse_decode  # noqa: E402

SM = torch.cuda.get_device_properties(0).multi_processor_count
OUT = os.environ.get("OUT", "/tmp")


def ws_call(inp, **kw):
    return lambda: G.ws_decode(
        inp["q"], inp["k_cache"], inp["indices"], inp["topk_length"], inp["softmax_scale"],
        K._combine_kernel, SM, **kw,
    )  # fmt: skip


def mma_call(inp):
    return lambda: K.flash_mla_sparse_decode_triton(**inp, variant="mma")


PROVIDERS = {
    "mma": lambda inp: mma_call(inp),
    "ws64": lambda inp: ws_call(inp),
    "ws32": lambda inp: ws_call(inp, block_n=32, nbuf=4),
    "ws_nogather": lambda inp: ws_call(inp, ablate=1),
    "ws_nomma": lambda inp: ws_call(inp, ablate=2),
    "ca32": lambda inp: ws_call(inp, ca=True, block_n=32, nr=3),
    "ca32_nomma": lambda inp: ws_call(inp, ca=True, block_n=32, nr=3, ablate=2),
    # the consumer dequantizes; the loader partition only issues cp.async (compiled, not run)
    "dq64": lambda inp: ws_call(inp, dq=True, block_n=64, nr=2, nbuf=1, rows=16, producer_regs=56),
    "dq32": lambda inp: ws_call(inp, dq=True, block_n=32, nr=4, nbuf=1, rows=16, producer_regs=56),
}

SHAPES = [
    ("B64_k2048", dict(B=64, H=64, topk=2048, page_size=64)),
    ("B128_k2048", dict(B=128, H=64, topk=2048, page_size=64)),
    ("B32_k2048", dict(B=32, H=64, topk=2048, page_size=64)),
    ("B1_k2048", dict(B=1, H=64, topk=2048, page_size=64)),
    ("B64_H128_k512", dict(B=64, H=128, topk=512, page_size=64)),
    ("B64_k2048_partial_inv", dict(B=64, H=64, topk=2048, page_size=64, topk_length="partial",
                                   invalid_fraction=0.1)),
]  # fmt: skip


def smoke():
    kw = dict(ca=True, block_n=32, nr=3) if "--ca" in sys.argv else {}
    if "--dq" in sys.argv:
        kw = dict(dq=True, block_n=64, nr=2, nbuf=1, rows=16, producer_regs=56)
    inp = make_inputs(B=2, H=64, topk=256, page_size=64, page_stride="pad576", device="cuda")
    out, lse = ws_call(inp, **kw)()
    torch.cuda.synchronize()
    ref = reference_sparse_decode(**inp)
    acc = check_accuracy(out, lse, *ref)
    print("smoke", acc["ok"], acc["out_max_abs_err"], acc["lse_max_abs_err"], flush=True)
    inp = make_inputs(B=64, H=64, topk=2048, page_size=64, page_stride="pad576", device="cuda")
    out, lse = ws_call(inp, **kw)()
    torch.cuda.synchronize()
    acc = check_accuracy(out, lse, *reference_sparse_decode(**inp))
    print("smoke-big", acc["ok"], acc["out_max_abs_err"], acc["lse_max_abs_err"], flush=True)


def main():
    only = sys.argv[1].split(",") if len(sys.argv) > 1 else list(PROVIDERS)
    res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
           "torch": torch.__version__, "kernel_sha256": None, "rows": []}  # fmt: skip
    import hashlib

    res["kernel_sha256"] = hashlib.sha256(open(K.__file__, "rb").read()).hexdigest()
    t_start = time.time()
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else [n for n, _ in SHAPES]
    for name, kw in SHAPES:
        if name not in shapes:
            continue
        sets = [make_inputs(**kw, page_stride="pad576", device="cuda", seed=s) for s in (1, 2)]
        refs = [reference_sparse_decode(**inp) for inp in sets]
        for prov in only:
            row = {"shape": name, "provider": prov}
            try:
                ok = True
                worst = {}
                for inp, ref in zip(sets, refs, strict=True):
                    out, lse = PROVIDERS[prov](inp)()
                    torch.cuda.synchronize()
                    a = check_accuracy(out, lse, *ref)
                    ok = ok and (a["ok"] or "_no" in prov)
                    worst = a if not a["ok"] or not worst else worst
                row["acc_ok"] = ok
                row["out_max_abs_err"] = worst["out_max_abs_err"]
                row["lse_max_abs_err"] = worst["lse_max_abs_err"]
                row["out_cos_diff"] = worst["out_cos_diff"]
                times = []
                for inp in sets:
                    call = PROVIDERS[prov](inp)
                    call()
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        call()
                    torch.cuda.synchronize()
                    times.append(triton.testing.do_bench(g.replay, warmup=25, rep=100) * 1000)
                row["us"] = statistics.median(times)
                row["us_sets"] = times
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            res["rows"].append(row)
            print(f"{name:24s} {prov:6s} {row.get('us', float('nan')):8.1f} us  acc "
                  f"{row.get('acc_ok')} {row.get('error', '')}", flush=True)  # fmt: skip
        if time.time() - t_start > 200:
            print("deadline", flush=True)
            break
    json.dump(res, open(os.path.join(OUT, "ws.json"), "w"), indent=1)
    print("\n(us; ratio = mma / ws)")
    by = {(r["shape"], r["provider"]): r for r in res["rows"]}
    for name, _ in SHAPES:
        m = by.get((name, "mma"), {}).get("us")
        cells = []
        for p in only:
            r = by.get((name, p), {})
            u = r.get("us")
            cells.append(f"{u:7.1f}{'' if r.get('acc_ok') else '!'}" if u else "      -")
        ratio = [f"{m / by[(name, p)]['us']:.2f}" for p in only
                 if m and by.get((name, p), {}).get("us")]  # fmt: skip
        print(f"{name:24s} {' '.join(cells)}  {' '.join(ratio)}")


if __name__ == "__main__":
    if "--smoke" in sys.argv:
        smoke()
    else:
        main()
