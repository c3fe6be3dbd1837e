"""Shared-memory bank conflicts of the Gluon loop's accesses, without a GPU.

Compiles `_ws_split_kernel` as `scripts/compile_check.py` does (Gluon: triton 3.6) and asks
Triton's own model (`get_shared_bank_conflicts`, what Gluon's `bank_conflicts` builtin
returns) about every shared-memory load, store and asynchronous copy whose registers are in a
blocked, linear or slice layout: the dequantization's reads of the raw tile and stores of the
K tile, the loader's copies, q's store. ldmatrix / mma operands are not modelled (their
swizzles are the compiler's own). The model is of ld.shared / st.shared: where the compiler
lowers a blocked load to ldmatrix anyway (the V4 dequantization's 8-bit reads: `LDSM` in the
SASS), check the SASS and ncu. A conflict of N is N excess wavefronts per wavefront: 1
doubles an access's shared-memory traffic, 3 quadruples it.

    python3 scripts/bank_conflicts.py [--cc 90] [--tile few|tm|sync|long|wide|wgmma ...]
        [--format v4|v41|v41_fp4 ...] [--all] [--json]
    python3 scripts/bank_conflicts.py --ttgir FILE.ttgir   # a TTGIR file of any kernel

Prints each access with a conflict (every modelled access with --all): its source line, op,
shape, element type and conflicts. Exit status 1 when any access has a conflict.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))

_BITS = {"f16": 16, "bf16": 16, "f32": 32, "i32": 32, "i16": 16, "i8": 8, "i64": 64,
         "f8E4M3FN": 8, "f8E5M2": 8}  # fmt: skip
# (cache format, extra cache format) codes of `_ws_split_kernel` (FMT, E_FMT)
_FORMATS = {"v4": (0, 0), "v41": (1, 1), "v41_fp4": (1, 2)}
_SHORT_OPS = {"local_load": "load", "local_store": "store",
              "async_copy_global_to_local": "async copy"}  # fmt: skip
_ACCESS = re.compile(
    r"\b(local_load|local_store|async_copy_global_to_local)\b.*?: (.*?) loc\((#loc\d*)\)"
)


@dataclass
class Access:
    """One shared-memory access of a kernel (`count` identical ones folded together)."""

    source: str  # file:line of the access (the innermost frame)
    op: str
    shape: str
    dtype: str
    conflicts: int | None  # None: not modelled (an ldmatrix / mma operand)
    count: int = 1


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text)]


def _bases(text: str | None) -> list[list[int]]:
    return [] if text in (None, "[]") else [_ints(b) for b in re.findall(r"\[([-\d, ]*)\]", text)]


def _field(attr: str, name: str) -> str | None:
    m = re.search(name + r" = (\[\[.*?\]\]|\[\]|\[[-\d, ]*\]|\d+|[a-z]+)", attr)
    return m.group(1) if m else None


class _Ttgir:
    """A TTGIR module's text: its layout aliases and source locations."""

    def __init__(self, text: str):
        self.alias = dict(re.findall(r"^(#[a-z_0-9]+) = (#ttg\.[^\n]*)$", text, re.M))
        self.locs = dict(re.findall(r"^(#loc[0-9]*) = loc\((.*)\)$", text, re.M))

    def source(self, loc: str) -> str:
        for _ in range(64):  # a call site's callee until a file position
            text = self.locs.get(loc)
            if text is None:
                break
            if m := re.match(r'"(?:[^"]*/)?([^/"]+)":(\d+)', text):
                return f"{m.group(1)}:{m.group(2)}"
            if m := re.match(r'(?:callsite\(|"[^"]*"\()(#loc\d*)', text):
                loc = m.group(1)
                continue
            break
        return loc

    def register_layout(self, gl, attr: str, shape: list[int]):
        attr = self.alias.get(attr.strip(), attr.strip())
        if attr.startswith("#ttg.blocked"):
            return gl.BlockedLayout(*(_ints(_field(attr, f)) for f in (
                "sizePerThread", "threadsPerWarp", "warpsPerCTA", "order")))  # fmt: skip
        if attr.startswith("#ttg.linear"):
            reg, lane, warp, block = (_bases(_field(attr, f))
                                      for f in ("register", "lane", "warp", "block"))  # fmt: skip
            # a slice's parent: its sliced dim's size from the bases
            span = [1 << max((b[i] for b in reg + lane + warp + block), default=0).bit_length()
                    for i in range(len(shape))]  # fmt: skip
            shape = [max(n, s) for n, s in zip(shape, span, strict=True)]
            return gl.DistributedLinearLayout(reg, lane, warp, block, shape)
        if m := re.match(r"#ttg\.slice<\{dim = (\d+), parent = (.*)\}>$", attr):
            dim = int(m.group(1))
            parent = self.register_layout(gl, m.group(2), shape[:dim] + [1] + shape[dim:])
            return gl.SliceLayout(dim, parent) if parent is not None else None
        return None  # ldmatrix / mma operands: not modelled

    def shared_layout(self, gl, attr: str, shape: list[int]):
        attr = self.alias.get(attr, attr)
        if attr.startswith("#ttg.swizzled_shared"):
            return gl.SwizzledSharedLayout(*(int(_field(attr, f)) for f in (
                "vec", "perPhase", "maxPhase")), _ints(_field(attr, "order")))  # fmt: skip
        if attr.startswith("#ttg.shared_linear"):
            # a slice of the buffer: the bases within its shape (its start is a whole period)
            bases = [b for b in _bases(_field(attr, "offset"))
                     if all(c < n for c, n in zip(b, shape, strict=True))]  # fmt: skip
            return gl.SharedLinearLayout(bases)
        if attr.startswith("#ttg.nvmma_shared"):
            return gl.NVMMASharedLayout(
                swizzle_byte_width=int(_field(attr, "swizzlingByteWidth")),
                element_bitwidth=int(_field(attr, "elementBitWidth")),
                rank=len(shape),
                transposed=_field(attr, "transposed") == "true",
            )
        return None


def audit(ttgir: str) -> list[Access]:
    """Every shared-memory access of a TTGIR module with its bank conflicts (Triton's model).
    Raises RuntimeError on a Triton other than 3.6 (the model's bindings move between
    releases: 3.9's crashes on this call)."""
    import triton

    if triton.__version__.split(".")[:2] != ["3", "6"]:
        raise RuntimeError(f"the bank model is read through triton 3.6, not {triton.__version__}")
    from triton._C.libtriton import gluon_ir, ir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.experimental.gluon import language as gl

    ctx = ir.context()
    ir.load_dialects(ctx)
    CUDABackend(GPUTarget("cuda", 90, 32)).load_dialects(ctx)
    builder = gluon_ir.GluonOpBuilder(ctx)
    module = _Ttgir(ttgir)
    found: dict[tuple, Access] = {}
    for line in ttgir.splitlines():
        m = _ACCESS.search(line)
        if not m:
            continue
        # "memdesc -> tensor" (a load) or "tensor -> memdesc" (a store, an async copy)
        sides = m.group(2).split(" -> ")
        tensor_side = next((t for t in sides if t.startswith("tensor<")), "")
        shared_side = next((t for t in sides if not t.startswith("tensor<")), "")
        tensor = re.match(r"tensor<([\dx]+)x(?:!tt\.ptr<)?([A-Za-z0-9]+)>?, (.*)>$", tensor_side)
        memdesc = re.search(r"<([\dx]+)x[A-Za-z0-9]+, (#[a-z_0-9]+)", shared_side)
        if not (tensor and memdesc):
            continue
        shape = [int(x) for x in tensor.group(1).split("x")]
        dtype, layout = tensor.group(2), tensor.group(3)
        regs = module.register_layout(gl, layout, shape)
        smem = module.shared_layout(gl, memdesc.group(2), shape)
        conflicts = None
        if regs is not None and smem is not None and dtype in _BITS:
            conflicts = builder.get_shared_bank_conflicts(
                regs._to_ir(builder), smem._to_ir(builder), shape, _BITS[dtype]
            )
        access = Access(module.source(m.group(3)), m.group(1), "x".join(map(str, shape)),
                        dtype, conflicts)  # fmt: skip
        key = tuple(asdict(access).values())
        if key in found:
            found[key].count += 1
        else:
            found[key] = access
    return list(found.values())


def builds(tiles: list[str], formats: list[str]):
    """(label, tile, (FMT, E_FMT), has_extra) of the Gluon builds to audit."""
    for tile in tiles:
        for name in formats:
            for has_extra in (False, True):
                if name == "v41_fp4" and not has_extra:
                    continue  # FP4 is an extra cache's format only
                label = f"{tile} {name} {'dual' if has_extra else 'one cache'}"
                yield label, tile, _FORMATS[name], has_extra


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", type=int, default=90, help="compute capability x10 (default 90)")
    ap.add_argument(
        "--tile", action="append", choices=("few", "tm", "sync", "long", "wide", "wgmma")
    )
    ap.add_argument("--format", action="append", choices=tuple(_FORMATS))
    ap.add_argument("--ttgir", help="audit this TTGIR file instead of compiling the kernel")
    ap.add_argument("--all", action="store_true", help="also the accesses without conflicts")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    def fail(message: str) -> int:
        if args.json:  # scripts read the failure too
            print(json.dumps({"error": message}))
        print(f"error: {message}", file=sys.stderr)
        return 2

    if os.environ.get("TRITON_INTERPRET"):
        return fail("unset TRITON_INTERPRET (the interpreter compiles nothing)")
    if args.ttgir:
        try:
            with open(args.ttgir) as f:
                reports = [(args.ttgir, audit(f.read()))]
        except (OSError, RuntimeError) as e:
            return fail(str(e))
    else:
        sys.path[:0] = [HERE, os.path.join(HERE, "..", "kernels")]
        import compile_check as cc
        import flash_mla_sm120_triton as fl

        if not fl.HAS_GLUON:
            return fail("the Gluon loop needs triton 3.6 (found another release)")
        tiles = {"few": (fl.WS_FEW_BLOCK_H, fl.WS_FEW_BLOCK_N),
                 "tm": fl.WS_TM_TILE,  # the few-head tile token-major (at most 8 heads)
                 "sync": (fl.WS_SYNC_BLOCK_H, fl.WS_SYNC_BLOCK_N),
                 "long": fl.WS_SYNC_LONG_TILE,  # Hopper only
                 "wide": (fl.WS_SYNC_WIDE_BLOCK_H, fl.WS_SYNC_WIDE_BLOCK_N),
                 "wgmma": (fl.WS_BLOCK_H, fl.WS_BLOCK_N)}  # fmt: skip
        reports = []
        for label, tile, (fmt, e_fmt), has_extra in builds(
            args.tile or list(tiles), args.format or list(_FORMATS)
        ):
            ck = cc.compile_ws(fl, args.cc, has_extra, 256, sync=tile != "wgmma",
                               tile=tiles[tile], fmt=fmt, e_fmt=e_fmt)  # fmt: skip
            reports.append((label, audit(ck.asm["ttgir"])))
    shown = [(label, [a for a in accesses if args.all or a.conflicts])
             for label, accesses in reports]  # fmt: skip
    if args.json:
        print(json.dumps([{"build": label, "accesses": [asdict(a) for a in accesses]}
                          for label, accesses in shown], indent=1))  # fmt: skip
    else:
        for label, accesses in shown:
            print(
                f"== {label}: {len(accesses)} access(es)" + ("" if args.all else " with conflicts")
            )
            for a in accesses:
                c = "not modelled" if a.conflicts is None else str(a.conflicts)
                op = _SHORT_OPS[a.op]  # 80 columns
                print(f"  {a.source:30} {op:10} {a.shape:10} {a.dtype:8} x{a.count:<2} {c}")
    return 1 if any(a.conflicts for _, accesses in reports for a in accesses) else 0


if __name__ == "__main__":
    sys.exit(main())
