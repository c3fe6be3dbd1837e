"""Compile the MMA kernel for a GPU architecture without the GPU, and report its resources.

Triton lowers a kernel to PTX with no device present (its CUDA backend and ptxas ship in the
pip wheel), so the per-architecture table can be checked where there is no such GPU: the shared
memory each table row needs (every build the launcher uses for it, with and without the extra
cache, and for the DSv4.1 pair of formats: the bf16-P loop, the exact PV for few-token requests
as a branch of that launch or as a second launch, and the exact PV for the whole call) against
the architecture's per-block limit, and, when a ptxas is found, registers and spills. Used
for sm_120 / sm_89, which we have no hardware for.

    python3 scripts/compile_check.py [--cc 120 --cc 89 --cc 90] [--json] [--save-ptx DIR]

`--save-ptx DIR` writes each build's PTX to DIR without its source-line directives, one file
per build: a refactor meant to change no code is checked by saving before and after and
`diff -r` (no GPU needed; each file's name is its report line's build).

Exit status 1 when a row does not fit its limit. Must run without TRITON_INTERPRET (the
interpreter replaces the compiled kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "kernels"))

# Largest shared memory one block may use (bytes, opt-in limit), per compute capability.
SMEM_LIMIT = {90: 232_448, 100: 232_448, 120: 101_376, 89: 101_376}

_PTR_TYPES = {
    "Q_ptr": "*bf16", "KV_ptr": "*u8", "IDX_ptr": "*i32", "LEN_ptr": "*i32", "EKV_ptr": "*u8",
    "EIDX_ptr": "*i32", "ELEN_ptr": "*i32", "SINK_ptr": "*fp32", "O_ptr": "*bf16",
    "LSE_ptr": "*fp32", "PO_ptr": "*fp32", "PLSE_ptr": "*fp32",
}  # fmt: skip
# Integer arguments the launcher's values make multiples of 16 (Triton specialises those).
_DIV16 = {"stride_kv_page", "stride_ekv_page", "stride_qb", "stride_ob", "stride_ib",
          "stride_eib", "stride_qh", "stride_oh"}  # fmt: skip


def _signature(fn, const: dict, ptr_types: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attributes) of a kernel compiled as the launcher calls it:
    pointers and the `_DIV16` integers 16-byte divisible (Triton specialises those)."""
    sig, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if fn.params[i].is_constexpr or (name in const and const[name] is None):
            sig[name] = "constexpr"  # a None pointer (PIECES_ptr without the plan) is one too
            constexprs[name] = const[name]
        elif name in ptr_types:
            sig[name] = ptr_types[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "qk_scale_log2":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name in _DIV16:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


def table_row(fl, cc: int, H: int = 64) -> dict:
    """The launch parameters `mma_config` takes for this compute capability (H heads), for the
    Triton loops: the row without its Gluon loop (what runs where Triton's Gluon is not the
    API it is written for); `ws`: whether the row takes the Gluon loop where it is."""
    table = fl.MMA_ROWS[fl.mma_row_name(divmod(cc, 10))]
    cfg = fl.mma_config(divmod(cc, 10), 132, 64, H, 2048, 0, row=table._replace(ws=False))
    ws_cfg = fl.mma_config(divmod(cc, 10), 132, 64, H, 2048, 0)
    return {"BLOCK_H": cfg.block_h, "BLOCK_N": cfg.block_n, "num_warps": cfg.num_warps,
            "num_stages": cfg.num_stages, "S_BY_GROUP": cfg.s_by_group,
            "EXACT_BLOCK_H": cfg.exact_block_h or cfg.block_h,
            "exact_in_launch": cfg.exact_in_launch, "prefetch_next": cfg.prefetch_next,
            "exact_concurrent": getattr(cfg, "exact_concurrent", False),
            "ws": getattr(ws_cfg, "ws", False), "ws_block_h": ws_cfg.block_h,
            "ws_block_n": ws_cfg.block_n,
            "ws_wide_tokens_per_sm": getattr(table, "ws_wide_tokens_per_sm", 0),
            "ws_exact_concurrent": getattr(ws_cfg, "exact_concurrent", False),
            "ws_exact": getattr(ws_cfg, "ws_exact", False),
            "ws_exact_launch": getattr(table, "ws_exact_launch", False),
            "ws_few": getattr(table, "ws_few_programs_per_sm", 0) > 0,
            "ws_few_tm": getattr(table, "ws_few_tm_heads", 0) > 0,
            "ws_small_dual": getattr(table, "ws_small_dual_programs", 0) > 0,
            "ws_small_dual_long": getattr(table, "ws_small_dual_long", False),
            "pack_rows": getattr(table, "pack_rows", 0)}  # fmt: skip


def compile_kernel(
    fl, cc: int, row: dict, has_extra: bool, pv_split: bool, exact_branch: bool,
    run_bf16_p: bool = True, formats: tuple[int, int] = (0, 0), run_exact: bool = True,
    token_major: bool = False,
):  # fmt: skip
    """Compile `_mma_split_kernel` for `cc` with a table row's parameters, as `mma_config` and
    the launcher do: `pv_split` (exact PV for the whole call) with the row's EXACT_BLOCK_H
    heads; `exact_branch`: the exact PV for few-token requests, beside the bf16-P loop or
    (`run_bf16_p` off) alone, as the second launch; `run_exact` off: the count alone, the
    bf16-P launch beside a concurrent exact one (`exact_concurrent`). `formats`: the (main,
    extra) caches' FMT (0 V4, 1 V4.1 FP8, 2 V4.1 FP4). `token_major`: the bf16-P launch's
    token-major loop of prefill-sized calls (`row` then holds its heads, tile and warps)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = fl._mma_split_kernel
    # the exact PV for the whole call, and the second launch, run exact-pass-sized programs
    exact_program = pv_split or not run_bf16_p
    block_h = row.get("EXACT_BLOCK_H", row["BLOCK_H"]) if exact_program else row["BLOCK_H"]
    stages = row["num_stages"] if run_bf16_p and not pv_split else 1
    const = dict(
        SINGLE_SPLIT=False, BLOCK_H=block_h, BLOCK_N=row["BLOCK_N"],
        HAS_EXTRA=has_extra, HAS_SINK=True, DOT_DTYPE=tl.bfloat16,
        PV_SPLIT=pv_split, RNE_BY_HAND=False, S_BY_GROUP=row.get("S_BY_GROUP", False),
        NUM_STAGES=stages, RUN_BF16_P=run_bf16_p, RUN_EXACT=run_exact,
        EXACT_BELOW=fl.PV_SPLIT_MAX_TOKENS if exact_branch else 0,
        EXACT_BLOCK_H=min(row.get("EXACT_BLOCK_H", block_h), block_h),
        COUNT_BLOCK=2048, COUNT_ONE_BLOCK=True, PREFETCH=row["prefetch_next"],
        FMT=formats[0], E_FMT=formats[1] if has_extra else formats[0],
        TOKEN_MAJOR=token_major,
        # prefill-sized calls of few heads run the plan first: its packed tokens' programs exit
        SKIP_PACKED=token_major, PLAN=False, PIECES_ptr=None, B_POW2=1, PLAN_BLOCK_N=16,
    )  # fmt: skip
    sig, constexprs, attrs = _signature(fn, const, _PTR_TYPES)
    options = {"num_warps": row["num_warps"], "num_stages": stages}
    return triton.compile(
        ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", cc, 32), options=options
    )


_WS_PTR_TYPES = {
    "Q_ptr": "*bf16", "KV8": "*fp8e4nv", "KVU": "*u8", "KVB": "*bf16", "IDX_ptr": "*i32",
    "LEN_ptr": "*i32", "EKV8": "*fp8e4nv", "EKVU": "*u8", "EKVB": "*bf16", "EIDX_ptr": "*i32",
    "ELEN_ptr": "*i32", "SINK_ptr": "*fp32", "O_ptr": "*bf16", "LSE_ptr": "*fp32",
    "PO_ptr": "*fp32", "PLSE_ptr": "*fp32", "PIECES_ptr": "*i32", "PERM_ptr": "*i32",
}  # fmt: skip


# The Gluon loop's (main, extra) cache formats, by name: V4, V4.1 FP8, V4.1 FP8 + FP4 extra
_WS_FORMATS = {"v4": (0, 0), "v41": (1, 1), "v41+v41_fp4": (1, 2)}


def _ws_v41(has_extra: bool) -> list[str]:
    """The V4.1 format names a Gluon build is compiled for (FP4 only as an extra cache)."""
    return ["v41", "v41+v41_fp4"] if has_extra else ["v41"]


def _ws_plans_and_formats(has_extra: bool) -> list[tuple[bool, str]]:
    """(planned, format name) of a Gluon tile's builds: V4 caches planned or not, V4.1 ones
    (their own loader and dequantization) unplanned."""
    return [(False, "v4"), (True, "v4"), *((False, f) for f in _ws_v41(has_extra))]


def compile_ws(
    fl, cc: int, has_extra: bool, exact_below: int, sync: bool = False, plan: bool = False,
    exact_in: bool = False, only_few: bool = False, tile: tuple[int, int] | None = None,
    skip_packed: bool = False, fmt: int = 0, e_fmt: int | None = None,
    prefetch: bool | None = None,
):  # fmt: skip
    """Compile `_ws_split_kernel` (Gluon, the bf16-P launch) for `cc` as `_launch_ws` launches
    it: wgmma's tile (the sm_90 row) or, `sync`, mma.sync's (the sm_120 row); exact_below > 0:
    the build beside the concurrent exact launch; `plan`: the length-aware split's build;
    `only_few`: the exact launch beside the Triton loop's bf16-P launch (`ws_exact_launch`);
    `tile`: mma.sync's (heads, tokens) when not the row's own (the sm_120 row's wide form, the
    few-head form); `skip_packed`: the per-token launch beside the packed plan; `fmt`, `e_fmt`:
    the caches' formats (0 V4, 1 V4.1 FP8, 2 V4.1 FP4: extra only; `e_fmt` defaults to
    `fmt`); `prefetch`: the start's L2 prefetch (default: as launched on a decode-sized grid,
    mma.sync's builds with it, wgmma's without)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = fl._ws_split_kernel
    if sync:
        bh, bn = tile or (fl.WS_SYNC_BLOCK_H, fl.WS_SYNC_BLOCK_N)
    else:
        bh, bn = fl.WS_BLOCK_H, fl.WS_BLOCK_N
    # as `_launch_ws` launches it: raw slots, warps, loader's registers, register cap
    e_fmt = fmt if e_fmt is None else e_fmt
    # (and, as it runs, the wgmma tile's programs signal the combine: programmatic dependent launch)
    build = fl.ws_build((bh, bn), has_extra, e_fmt, dependents=fl.SPLIT_LAUNCHES_DEPENDENTS)
    options = {k: build.pop(k) for k in ("num_warps", "maxnreg") if k in build}
    const = dict(
        SINGLE_SPLIT=False, HAS_EXTRA=has_extra, HAS_SINK=True, EXACT_BELOW=exact_below,
        COUNT_BLOCK=1024, PLAN=plan, EXACT_IN=exact_in,
        B_POW2=64, ONLY_FEW=only_few, SKIP_PACKED=skip_packed, BLOCK_H=bh, BLOCK_N=bn, FMT=fmt,
        E_FMT=e_fmt, POW2_PAGES=True,  # SGLang's page sizes
        PREFETCH_START=fl.WS_PREFETCH_START and (sync if prefetch is None else prefetch),
        num_warps=options["num_warps"], **build,
    )  # fmt: skip
    if not plan:
        const["PIECES_ptr"] = None
    if not skip_packed:  # the plan's order comes with its lengths
        const["PERM_ptr"] = None
    sig, constexprs, attrs = _signature(fn, const, _WS_PTR_TYPES)
    return triton.compile(
        GluonASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", cc, 32),
        options=options,
    )  # fmt: skip


def ptxas_lines(ptx: str, cc: int) -> list[str]:
    """ptxas -v's output for this PTX from the first bundled ptxas that accepts it (Triton may
    emit a PTX version newer than its plain `ptxas` takes); [] when none does."""
    import triton

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    arch = f"sm_{cc}a" if cc >= 90 else f"sm_{cc}"  # wgmma / setmaxnreg need the "a" target
    for exe in ("ptxas", "ptxas-blackwell"):
        path = os.path.join(bin_dir, exe)
        if not os.path.exists(path):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "k.ptx")
            with open(src, "w") as f:
                f.write(ptx)
            res = subprocess.run(
                [path, "-v", f"-arch={arch}", src, "-o", os.path.join(tmp, "k.cubin")],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
        if res.returncode == 0:
            return [ln.strip() for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
    return []


def ptxas_report(ptx: str, cc: int) -> str:
    """ptxas -v's register and spill lines, joined ('' when no ptxas accepts the PTX)."""
    lines = [ln.split(":", 1)[-1].strip() for ln in ptxas_lines(ptx, cc)]
    return "; ".join(ln for ln in lines if "Used" in ln or "spill" in ln)


def build_report(
    cc: int, row: dict, label: str, has_extra: bool, formats: str, ck, with_ptxas: bool
) -> dict:
    """One compiled build's line: its row's parameters, shared memory against the limit, and
    ptxas's registers and spills (and, for `--save-ptx`, its PTX)."""
    shared, limit = ck.metadata.shared, SMEM_LIMIT.get(cc)
    return {
        "cc": cc, **row, "pass": label, "extra_cache": has_extra, "formats": formats,
        "shared_bytes": shared, "limit_bytes": limit, "fits": limit is None or shared <= limit,
        "ptxas": ptxas_report(ck.asm["ptx"], cc) if with_ptxas else "", "_ptx": ck.asm["ptx"],
    }  # fmt: skip


def ptx_file_name(r: dict) -> str:
    """A build's PTX file name: its architecture, tile, build, caches and formats."""
    extra = "extra" if r["extra_cache"] else "main"
    return (f"sm{r['cc']}-h{r['BLOCK_H']}n{r['BLOCK_N']}w{r['num_warps']}-{r['pass']}-{extra}-"
            f"{r['formats']}.ptx").replace("+", "_")  # fmt: skip


def code_only(ptx: str) -> str:
    """PTX without what moves when source lines move: `.loc` / `.file` directives, the debug
    labels and the debug sections (which close the file), so a refactor that changes no
    instruction leaves the text unchanged."""
    out = []
    for line in ptx.splitlines():
        stripped = line.strip()
        if stripped.startswith(".section") and ".debug" in stripped:
            break
        if stripped.startswith((".loc", ".file", "$L__tmp", "$L__func_")):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def save_ptx(rows: list[dict], directory: str) -> None:
    """Write each build's code-only PTX under `directory` (created; same-named files replaced)."""
    os.makedirs(directory, exist_ok=True)
    for r in rows:
        with open(os.path.join(directory, ptx_file_name(r)), "w") as f:
            f.write(code_only(r["_ptx"]))


def check(ccs: list[int], with_ptxas: bool = True) -> list[dict]:
    import flash_mla_sm120_triton as fl

    rows = []
    for cc in ccs:
        row = table_row(fl, cc)
        # (build, exact branch, pv_split, bf16-P loop, exact PV): the row's launches for
        # few-token requests (one launch with both loops, or two: the first counting too when
        # the two run side by side), and the whole-call exact PV the table takes for topk +
        # extra topk <= 256.
        if row["exact_in_launch"]:
            builds = [("bf16-P+exact", True, False, True, True)]
        else:
            first = ("bf16-P+count", True, False, True, False) if row["exact_concurrent"] else (
                "bf16-P", False, False, True, True)  # fmt: skip
            builds = [first, ("exact", True, False, False, True)]
        for label, exact_branch, pv_split, run_bf16_p, run_exact in (
            *builds,
            ("exact-all", False, True, True, True),
        ):
            # V4 caches alone and paired, and the V4.1 pair with the most code (FP8 main, FP4
            # extra: the tile's gather branches on its cache).
            for has_extra, formats in ((False, (0, 0)), (True, (0, 0)), (True, (1, 2))):
                ck = compile_kernel(
                    fl, cc, row, has_extra, pv_split, exact_branch, run_bf16_p, formats,
                    run_exact,
                )  # fmt: skip
                fmt = "v41+v41_fp4" if formats[0] else "v4"
                rows.append(build_report(cc, row, label, has_extra, fmt, ck, with_ptxas))
        # Prefill-sized calls of few heads (8 and 16 heads, T 1024), where the row takes the
        # token-major loop (without the Gluon loop, which takes them where it runs): its
        # bf16-P launch (the exact launch is a head-major build above).
        triton_row = fl.MMA_ROWS[fl.mma_row_name(divmod(cc, 10))]._replace(ws=False)
        for H in (8, 16):
            cfg = fl.mma_config(divmod(cc, 10), 132, 1024, H, 128, 512, row=triton_row)
            if not getattr(cfg, "token_major", False):
                continue
            tm_row = dict(row, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
                          num_warps=cfg.num_warps, EXACT_BLOCK_H=cfg.block_h)  # fmt: skip
            for has_extra in (False, True):
                ck = compile_kernel(
                    fl, cc, tm_row, has_extra, False, True, True, (0, 0), False, token_major=True
                )
                rows.append(
                    build_report(cc, tm_row, f"prefill-tm-h{H}", has_extra, "v4", ck, with_ptxas)
                )
        # The row's head-major bf16-P launch as the Gluon kernel (wgmma on 9.x, mma.sync on
        # the sm_120 row; a Triton with the Gluon API it is written for; elsewhere
        # `_mma_split_kernel` above), without and with the length-aware plan, computing the
        # few-token requests itself (ws_exact) or with the exact launch beside it where the
        # Triton row has none (the sm_120 row's exact PV is otherwise a branch of its one
        # launch).
        if row.get("ws") and getattr(fl, "HAS_GLUON", False):
            # mma.sync's tiles (the row's own or its wide one), else wgmma's
            sync = (row["ws_block_h"], row["ws_block_n"]) in fl.WS_SYNC_TILES
            ws_row = dict(row, BLOCK_H=fl.WS_SYNC_BLOCK_H if sync else fl.WS_BLOCK_H,
                          BLOCK_N=fl.WS_SYNC_BLOCK_N if sync else fl.WS_BLOCK_N,
                          num_warps=8)  # fmt: skip
            exact_in = row.get("ws_exact", False)
            below = fl.PV_SPLIT_MAX_TOKENS if row["ws_exact_concurrent"] or exact_in else 0
            for has_extra in (False, True):
                for plan, fmt in _ws_plans_and_formats(has_extra):
                    m, e = _WS_FORMATS[fmt]
                    ck = compile_ws(fl, cc, has_extra, below, sync, plan, exact_in, fmt=m, e_fmt=e)
                    label = ("bf16-P-ws-sync" if sync else "bf16-P-ws") + ("-plan" if plan else "")
                    rows.append(build_report(cc, ws_row, label, has_extra, fmt, ck, with_ptxas))
                    if not sync and fmt == "v4":  # more head blocks than SMs: with the prefetch
                        ck = compile_ws(fl, cc, has_extra, below, sync, plan, exact_in, fmt=m,
                                        e_fmt=e, prefetch=True)  # fmt: skip
                        rows.append(build_report(cc, ws_row, label + "-prefetch", has_extra, fmt,
                                                 ck, with_ptxas))  # fmt: skip
                if sync and row.get("ws_wide_tokens_per_sm"):  # its wide tile, planned
                    wide = (fl.WS_SYNC_WIDE_BLOCK_H, fl.WS_SYNC_WIDE_BLOCK_N)
                    wide_row = dict(ws_row, BLOCK_H=wide[0], BLOCK_N=wide[1])
                    for fmt in ("v4", *_ws_v41(has_extra)):
                        m, e = _WS_FORMATS[fmt]
                        ck = compile_ws(fl, cc, has_extra, below, sync, True, exact_in, tile=wide,
                                        fmt=m, e_fmt=e)  # fmt: skip
                        rows.append(build_report(cc, wide_row, "bf16-P-ws-sync-wide", has_extra,
                                                 fmt, ck, with_ptxas))  # fmt: skip
                if row.get("ws_small_dual") and has_extra and not sync:
                    # small dual-cache calls: the mma.sync tile (32 x 32) and, where the row
                    # takes it, its long form (32 x 64), planned or not
                    tiles = [("", (fl.WS_SYNC_BLOCK_H, fl.WS_SYNC_BLOCK_N))]
                    if row.get("ws_small_dual_long"):
                        tiles.append(("-long", fl.WS_SYNC_LONG_TILE))
                    for form, tile in tiles:
                        sd_row = dict(ws_row, BLOCK_H=tile[0], BLOCK_N=tile[1])
                        for plan, fmt in _ws_plans_and_formats(has_extra):
                            m, e = _WS_FORMATS[fmt]
                            ck = compile_ws(fl, cc, has_extra, below, True, plan, exact_in,
                                            tile=tile, fmt=m, e_fmt=e)  # fmt: skip
                            label = "bf16-P-ws-small-dual" + form + ("-plan" if plan else "")
                            rows.append(build_report(cc, sd_row, label, has_extra, fmt, ck,
                                                     with_ptxas))  # fmt: skip
                few_tiles = []  # calls of at most 16 heads: the few-head tile
                if row.get("ws_few"):
                    few_tiles.append(("", (fl.WS_FEW_BLOCK_H, fl.WS_FEW_BLOCK_N)))
                if row.get("ws_few_tm"):  # ... and at most 8, token-major
                    few_tiles.append(("-tm", fl.WS_TM_TILE))
                for form, few in few_tiles:
                    few_row = dict(ws_row, BLOCK_H=few[0], BLOCK_N=few[1],
                                   num_warps=fl.WS_FEW_WARPS)  # fmt: skip
                    kinds = [(False, False, "v4"), (True, False, "v4")] + [
                        (False, False, f) for f in _ws_v41(has_extra)] + (
                        [(False, True, "v4")] if row.get("pack_rows") else [])  # fmt: skip
                    # static splits (the rule's; V4 and V4.1 FP8), planned (explicit configs),
                    # beside the packed plan
                    for plan, packed, fmt in kinds:
                        m, e = _WS_FORMATS[fmt]
                        ck = compile_ws(fl, cc, has_extra, below, True, plan, exact_in,
                                        tile=few, skip_packed=packed, fmt=m, e_fmt=e)  # fmt: skip
                        label = "bf16-P-ws-few" + form + ("-plan" if plan else "") + (
                            "-packed" if packed else "")  # fmt: skip
                        rows.append(build_report(cc, few_row, label, has_extra, fmt, ck,
                                                 with_ptxas))  # fmt: skip
                if row["exact_in_launch"] and not exact_in:
                    ck = compile_kernel(fl, cc, row, has_extra, False, True, False, (0, 0), True)
                    rows.append(build_report(cc, row, "exact", has_extra, "v4", ck, with_ptxas))
                if row.get("ws_exact_launch") and not sync:
                    # the exact launch beside the Triton loop's bf16-P launch (dual caches)
                    for fmt in ("v4", *_ws_v41(has_extra)):
                        m, e = _WS_FORMATS[fmt]
                        ck = compile_ws(fl, cc, has_extra, fl.PV_SPLIT_MAX_TOKENS, False, False,
                                        True, True, fmt=m, e_fmt=e)  # fmt: skip
                        rows.append(build_report(cc, ws_row, "exact-ws", has_extra, fmt, ck,
                                                 with_ptxas))  # fmt: skip
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", type=int, action="append", help="compute capability x10, e.g. 120")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-ptxas", action="store_true")
    ap.add_argument("--save-ptx", metavar="DIR", help="write each build's PTX (code only) here")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check: unset TRITON_INTERPRET (the interpreter compiles nothing)")
        return 2
    ccs = args.cc or [120, 89, 90]
    rows = check(ccs, with_ptxas=not args.no_ptxas)
    if args.save_ptx:
        save_ptx(rows, args.save_ptx)
    for r in rows:
        del r["_ptx"]
    import flash_mla_sm120_triton as fl

    if not getattr(fl, "HAS_GLUON", False):
        import triton

        # on stderr: --json stays one document
        print(f"compile_check: the rows' Gluon loops not compiled (written for triton 3.6; "
              f"this is {triton.__version__}: the launcher runs `_mma_split_kernel`)",
              file=sys.stderr)  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(
                f"sm_{r['cc']:<4d} H/N/w {r['BLOCK_H']}/{r['BLOCK_N']}/{r['num_warps']} "
                f"{r['pass']:12s} extra={int(r['extra_cache'])} {r['formats']:11s} "
                f"smem {r['shared_bytes']:>7d} / "
                f"{r['limit_bytes']} {'ok' if r['fits'] else 'OVER'}  {r['ptxas']}"
            )
    return 0 if all(r["fits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
