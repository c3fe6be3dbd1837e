"""Would FP8 block-scaled MMA (`tl.dot_scaled`) pay for the MMA kernel's S = q K^T?

Two questions, answered without a GPU (issue 20, item 4; docs/kernel-optimisation-log.md v46):

- `--compile`: which PTX product Triton emits for `tl.dot_scaled` on each compute capability
  (a 32 x 32 x 64 test kernel compiled for a GPU this machine need not have). sm_120's
  native block-scaled product needs both operands in FP8 with one UE8M0 scale per 32 of K.
- `--accuracy`: q quantized to MX e4m3 (one UE8M0 scale per 32 dims) in 1, 2 or 3 terms
  (q ~ t1 + t2 + ..., each term quantizing what the earlier ones left), the float64 reference
  run on it, and the result checked against the reference of the bf16 q under FlashMLA's
  bounds (`kernels/dsv4_reference.py`). The cache's own FP8 values are the other operand as
  they lie, so this is the error the native S would add.

    python3 scripts/fp8_mma_probe.py --compile --accuracy [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "kernels"))

from dsv4_reference import check_accuracy, make_inputs, reference_sparse_decode  # noqa: E402

E4M3_MAX = 448.0
E4M3_EMAX = 8  # the largest power of two below E4M3_MAX: the OCP MX scale rule's emax
MX_BLOCK = 32  # values per UE8M0 scale in a block-scaled product's K

# name -> make_inputs keywords; DU: the production dual-cache decode shape
_DU = dict(topk=128, page_size=256, extra_topk=512, extra_page_size=64)
SHAPES = {
    "B64 H64 topk2048": dict(B=64, H=64, topk=2048, page_size=64),
    "B64 H64 dual": dict(B=64, H=64, **_DU),
    "B16 H64 dual, +-inf sinks": dict(B=16, H=64, **_DU, with_sink="inf"),
    "B8 H64 dual, scale spread 2": dict(B=8, H=64, **_DU, kv_scale_spread=2),
    "B8 H64 dual, V4.1": dict(B=8, H=64, **_DU, kv_layout="v41"),
    "B8 H64 topk64": dict(B=8, H=64, topk=64, page_size=64),
}


def mx_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x [..., 32k] (float64) as MX e4m3 values times their UE8M0 scale (one per 32), back in
    float64: scale 2^(floor(log2 amax) - 8), values rounded to e4m3, saturated at 448."""
    shape = x.shape
    groups = x.reshape(*shape[:-1], shape[-1] // MX_BLOCK, MX_BLOCK)
    amax = groups.abs().amax(-1, keepdim=True).clamp_min(2.0**-126)
    scale = torch.exp2(torch.floor(torch.log2(amax)) - E4M3_EMAX)
    codes = (groups / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (codes.to(torch.float64) * scale).reshape(shape)


def q_in_terms(q: torch.Tensor, terms: int, dims: int) -> torch.Tensor:
    """q with its first `dims` dims (the FP8 part of a cache row: 448 in V4, whose 64 rope
    dims are bf16, 512 in V4.1) replaced by the sum of `terms` MX e4m3 terms."""
    q64 = q.to(torch.float64)
    fp8_part = q64[..., :dims]
    total = torch.zeros_like(fp8_part)
    for _ in range(terms):
        total += mx_e4m3(fp8_part - total)
    return torch.cat([total, q64[..., dims:]], -1)


def accuracy(terms_list=(1, 2, 3), seed: int = 1) -> list[dict]:
    rows = []
    for name, kw in SHAPES.items():
        inputs = make_inputs(**kw, seed=seed)
        ref_out, ref_lse = reference_sparse_decode(**inputs)
        dims = 512 if kw.get("kv_layout") == "v41" else 448
        for terms in terms_list:
            q = q_in_terms(inputs["q"], terms, dims)
            out, lse = reference_sparse_decode(**dict(inputs, q=q))
            # as a kernel returns them: out in bf16, lse in float32
            acc = check_accuracy(out.to(torch.bfloat16), lse.to(torch.float32), ref_out, ref_lse)
            keys = ("ok", "out_cos_diff", "out_max_abs_err", "lse_max_abs_err", "lse_mismatched")
            rows.append({"shape": name, "terms": terms, **{k: acc[k] for k in keys}})
    return rows


def _probe_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def probe(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr,
              K: tl.constexpr, B_FP8: tl.constexpr):  # fmt: skip
        rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
        rs = tl.arange(0, K // 32)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
        a_scale = tl.load(as_ptr + rm[:, None] * (K // 32) + rs[None, :])
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
        if B_FP8:
            b_scale = tl.load(bs_ptr + rn[:, None] * (K // 32) + rs[None, :])
            c = tl.dot_scaled(a, a_scale, "e4m3", b, b_scale, "e4m3")
        else:
            c = tl.dot_scaled(a, a_scale, "e4m3", b, None, "bf16")
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], c)

    return probe


def compiled_products(ccs=(120, 90)) -> list[dict]:
    """The distinct `mma` instructions (opcode and types, no operands) in the PTX of the probe
    kernel for each compute capability, with the other operand e4m3 or bf16."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    probe = _probe_kernel()
    rows = []
    for cc in ccs:
        for b_fp8 in (True, False):
            sig = {"a_ptr": "*fp8e4nv", "as_ptr": "*u8",
                   "b_ptr": "*fp8e4nv" if b_fp8 else "*bf16", "bs_ptr": "*u8",
                   "c_ptr": "*fp32", "M": "constexpr", "N": "constexpr", "K": "constexpr",
                   "B_FP8": "constexpr"}  # fmt: skip
            consts = {"M": 32, "N": 32, "K": 64, "B_FP8": b_fp8}
            src = ASTSource(probe, sig, consts)
            ptx = triton.compile(src, target=GPUTarget("cuda", cc, 32)).asm["ptx"]
            ops = sorted({ln.split()[0] for ln in ptx.splitlines() if ln.strip().startswith("mma")})
            rows.append({"cc": cc, "operands": "e4m3 x " + ("e4m3" if b_fp8 else "bf16"),
                         "mma": ops})  # fmt: skip
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile", action="store_true", help="the PTX products per cc")
    ap.add_argument("--accuracy", action="store_true", help="q in 1-3 FP8 terms vs bounds")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    if not (args.compile or args.accuracy):
        ap.error("give --compile, --accuracy or both")
    result = {}
    if args.compile:
        try:
            result["compile"] = compiled_products()
        except ImportError as e:  # no triton (or one without its compiler API) here
            print(f"error: --compile needs triton: {e}", file=sys.stderr)
            return 2
    if args.accuracy:
        result["accuracy"] = accuracy()
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    # 80 columns: the product's shape and whether it is the native block-scaled one (the full
    # PTX opcodes are in --json)
    for row in result.get("compile", []):
        kinds = [_product_kind(op) for op in row["mma"]]
        print(f"cc {row['cc']}  {row['operands']:12s} {', '.join(kinds)}")
    for row in result.get("accuracy", []):
        lse, cos = (_sci(row[k]) for k in ("lse_max_abs_err", "out_cos_diff"))
        print(f"{row['shape']:27s} {row['terms']} term(s) ok={row['ok']!s:5} "
              f"lse err {lse} cos diff {cos}")  # fmt: skip
    return 0


def _sci(value) -> str:
    """An error figure as 1.2e-03; check_accuracy's None (not finite) as "-"."""
    return "-" if value is None else f"{value:.1e}"


def _product_kind(opcode: str) -> str:
    """`mma.sync.aligned.m16n8k32...block_scale...` -> "m16n8k32 block-scaled (native FP8)"."""
    shape = next((part for part in opcode.split(".") if re.fullmatch(r"m\d+n\d+k\d+", part)), "?")
    if "block_scale" in opcode:
        return f"{shape} block-scaled (native FP8)"
    return f"{shape} {opcode.split('.')[-2]} (operands upcast)"


if __name__ == "__main__":
    sys.exit(main())
