"""DSv4 sparse-MLA decode in Triton: a SIMT baseline and a tensor-core (MMA) split-K kernel.

Drop-in for SGLang's `python/sglang/srt/layers/attention/flash_mla_sm120_triton.py`; imports only
torch, triton and the standard library. Contract: `docs/kernel-contract.md` in kerneldev.

Math, per request b and head h, over the valid set S_b of selected tokens (index >= 0, position
< topk_length[b], index < num_pages * page_size), for the main and the optional extra cache:

    K_j = concat(dequant(nope_j), rope_j)                  (512 values; V_j = K_j)
    s_j = softmax_scale * <q[b, h], K_j>
    lse = log sum_j exp(s_j)     out = sum_j exp(s_j - lse) K_j   (-inf / 0 when S_b is empty)
    with the sink:  lse' = logaddexp(lse, sink[h]),  out' = out * exp(lse - lse')

The kernels work in base 2: `qk_scale_log2 = softmax_scale * LOG2E`, p = exp2(s * LOG2E - m),
and convert the LSE back with LN2 at the end. The returned lse includes the sink (sm_120 path).

Paged caches, page size P, page p at byte p * k_cache.stride(0) (>= P * token bytes, may be
padded); the format is the view's last dimension (SGLang 0.5.23 hands it over so), per cache:

  584 (V4):  [t * 576, + 448) float8_e4m3fn nope of slot t   [t * 576 + 448, + 128) bf16 rope
             [P * 576 + t * 8, + 7) UE8M0 exponents (one per 64 nope dims), x = fp8 * 2^(e - 127)
  528 (V4.1 FP8): [t * 512, + 512) float8_e4m3fn   [P * 512 + t * 16, + 16) UE8M0, one per 32
  288 (V4.1 FP4, extra cache only): [t * 256, + 256) e2m1 pairs (value 2i in the low nibble of
             byte i)   [P * 256 + t * 32, + 32) float8_e4m3fn scales, one per 16, x = e2m1 * s

Kernels:
  * `_simt_decode_kernel`, grid (B, H): one program per request and head walks the selected
    tokens of both caches in tiles of BLOCK_N, scores with multiply-reduce, online softmax,
    sink, and writes out/lse. Every program gathers and dequantizes every tile for its head.
  * `_mma_split_kernel`, grid (B * ceil(H / BLOCK_H), num_splits): one program per request,
    block of heads and KV split. The two caches' tile lists (BLOCK_N tokens each) are laid end
    to end and cut into equal runs, one per split; one loop walks the split's tiles, each
    picking its cache. Each tile is gathered and dequantized once (`_tile_k`) into the
    matrix-operand dtype as the spec's 512-wide K rows (nope in columns 0..447, rope in
    448..511) and shared by all BLOCK_H heads: S = q K^T (one product 512 deep, or, with
    S_BY_GROUP for mma.sync, 8 products 64 deep), O += P K, `tl.dot` with fp32 accumulation.
    Once a tile's rows are loaded, the program asks L2 for the next tile's rows
    (`prefetch.global.L2`, no registers held), so their HBM latency passes under this tile's
    products (the sm_90 row; on the sm_120 row it spilled).
    With one split it finishes in place (sink, normalisation, bf16 store); otherwise it
    writes a normalised fp32 partial and its base-2 LSE, and `_combine_kernel`, grid
    (B * H, 512 / BLOCK_D), merges the splits by LSE and adds the sink. For accuracy on
    requests with few valid tokens each program counts its request's valid tokens on the
    device and gives those requests the exact PV (P's bf16 rounding residue added): as a
    branch of the same launch (the sm_120 row), or in a second launch of the same kernel that
    does them and returns at once for the others (the sm_90 row, where the branch made the
    bf16-P loop spill). On the sm_90 row that launch runs on a side stream beside the first,
    which then skips the few-token requests (disjoint outputs; device-side events, no host
    sync): their exact pass uses the SMs that short requests leave idle instead of following
    the longest split.
  * `_ws_split_kernel` (Gluon, triton 3.6): the bf16-P launch warp-specialized, a loader
    partition copying raw tiles into a ring while the consumer warps dequantize and multiply
    (wgmma on 9.x for one cache; mma.sync for the sm_120 row, both caches, and on 9.x for
    small dual-cache calls; V4 caches, V4.1 FP8 ones alone or paired, or a V4.1 FP8 main
    cache with an FP4 extra cache, each tile read in its cache's format). It computes its
    few-token requests itself (P's rounding residue as a second PV product), and with
    `topk_length` passed and two or more splits it cuts each request's valid tiles into
    pieces that fit one round of programs (`_plan_piece`, computed by every program from the
    lengths), so short requests do not leave SMs idle behind long ones.

  * Prefill-sized calls of <= 16 heads where the Gluon loop cannot run (a Triton without it,
    V4 caches; the sm_90 row): the bf16-P launch runs
    `_split_heads_tm`, the same loop token-major (S^T = K q^T, O^T += K^T P^T: the heads are
    the products' N, 8 per program at H <= 8, and the K tile's two staged copies are not live
    at once: a third to half of the head-major program's shared memory, more per SM).
  * Prefill-sized calls of few heads: `_pack_plan_kernel` finds, per group of consecutive
    query tokens, whether their selections coincide (from the indices, on the device) and
    their union; `_mma_packed_kernel` attends a packed group's heads as one block over the
    union, each row masked to its own token's keys, after the per-token launch, whose
    programs for the packed tokens exit at once (the plan gives them length -1) and which
    takes its tokens longest first (the plan's order, `_token_order`).

Launch parameters come from `mma_config(cc, sm_count, B, H, topk, extra_topk)`: a table row
per GPU family (`MMA_ROWS`) and a split rule; pure, so the launcher, `scripts/compile_check.py`
and the tests use the same rule. No autotuning, no host synchronisation: CUDA-graph
capturable. Design notes and measurements: `docs/kernels.md`, `docs/benchmarks.md` in
kerneldev.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

# ----------------------------------------------------------------------------- constants

D_NOPE = tl.constexpr(448)  # fp8-quantized dims of a K/V row
D_QK = tl.constexpr(512)  # full K/V row: nope 448 + rope 64 (also the query width)
DATA_BYTES = tl.constexpr(576)  # 448 fp8 bytes + 64 bf16 rope values, per token slot
SCALE_BYTES = tl.constexpr(8)  # 7 UE8M0 exponents + 1 pad byte, per token slot
NUM_GROUPS_POW2 = tl.constexpr(8)  # 7 scale groups, padded to a power of two
GROUP = tl.constexpr(64)  # nope dims per scale group
LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E), folded in scale
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): base-2 LSE -> natural-log LSE
UE8M0_ZERO_BITS = tl.constexpr(0x00400000)  # float32 bits of 2^-127 (scale byte 0, subnormal)

TOKEN_BYTES = 584  # the V4 format (the compatibility constants below name its parts)
HEAD_DIM = 512
# Cache formats by token size (the view's last dimension) -> the kernels' FMT constexpr.
FMT_V4, FMT_V41, FMT_V41_FP4 = 0, 1, 2
CACHE_FORMATS = {584: FMT_V4, 528: FMT_V41, 288: FMT_V41_FP4}
FORMAT_NAMES = {584: "V4", 528: "V4.1 FP8", 288: "V4.1 FP4"}

# Triton decides at decoration (import) time whether kernels run in its CPU interpreter.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Programmatic dependent launch (sm_90 on): the combine is queued behind the split kernel and
# its programs start while the split's last programs still run, each waiting (`gdc_wait`) only
# before it reads their partials, so the gap between the two launches is not paid. FlashMLA's
# combine is launched so too. Needs Triton's `gdc_wait` and its CUDA launcher's `launch_pdl`
# option; without them (older Triton, the interpreter) the combine is launched plainly.
try:
    from triton.backends.nvidia.compiler import CUDAOptions
    from triton.language.extra.cuda import gdc_wait

    HAS_PDL = not _INTERPRET and "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})
except ImportError:  # pragma: no cover  (older Triton)
    HAS_PDL = False

    @triton.jit
    def gdc_wait():
        pass


# The Gluon split kernel's programs (wgmma tile) signal the combine
# (`griddepcontrol.launch_dependents`) once their tiles are done, before their partial stores:
# its programs are then placed on the SMs as the split's leave them, not after the last one
# has finished. Without the signal the early launch alone measured 1.00x (session 27).
SPLIT_LAUNCHES_DEPENDENTS = True

# `variant=None` follows this, read once at import as the deployed original does.
_DEFAULT_VARIANT = "mma" if os.environ.get("SGLANG_SM120_MMA_FLASHMLA", "0") == "1" else "simt"

# ----------------------------------------------------------------------------- shared helpers


@triton.jit
def _gather_indices(IDX_row_ptr, stride_it, pos, end, num_tokens):
    """Indices of one tile; invalid ones (negative, past `end`, past the cache) -> 0, masked."""
    in_range = pos < end
    idx = tl.load(IDX_row_ptr + pos * stride_it, mask=in_range, other=-1)
    valid = in_range & (idx >= 0) & (idx < num_tokens)
    return tl.where(valid, idx, 0), valid


@triton.jit
def _count_valid(
    IDX_row_ptr, stride_it, length, topk, num_tokens, COUNT_BLOCK: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
):  # fmt: skip
    """How many of the first `length` indices select a token (same masking as the attention).

    The index loads are bounded by `topk` (an argument), not by `length` (a load), so they do
    not wait for it; ONE_BLOCK (COUNT_BLOCK >= topk): one load, no loop, so the two caches'
    counts are in flight together (this count is the whole cost of the exact pass for the
    requests it skips)."""
    offs = tl.arange(0, COUNT_BLOCK)
    if ONE_BLOCK:
        idx = tl.load(IDX_row_ptr + offs * stride_it, mask=offs < topk, other=-1)
        valid = (offs < length) & (idx >= 0) & (idx < num_tokens)
        return tl.sum(valid.to(tl.int32))
    n = tl.full([], 0, tl.int32)
    for p0 in range(0, topk, COUNT_BLOCK):
        pos = p0 + offs
        idx = tl.load(IDX_row_ptr + pos * stride_it, mask=pos < topk, other=-1)
        valid = (pos < length) & (idx >= 0) & (idx < num_tokens)
        n += tl.sum(valid.to(tl.int32))
    return n


@triton.jit
def _length(LEN_ptr, stride_len, has_len, b, topk):
    """min(topk_length[b], topk), or topk without lengths. `has_len` is a runtime argument (not
    specialised), so calls with and without `topk_length` run the same compiled kernel (as two
    specialisations they measured 9-16% apart at B >= 64)."""
    return tl.minimum(tl.load(LEN_ptr + b * stride_len, mask=has_len != 0, other=topk), topk)


@triton.jit
def _lengths(LEN_ptr, stride_len, has_len, t, topk):
    """`_length` of the tokens `t` (a vector; the mask broadcast to it)."""
    mask = (t * 0 + has_len) != 0
    return tl.minimum(tl.load(LEN_ptr + t * stride_len, mask=mask, other=topk), topk)


@triton.jit
def _plan_piece(LEN_ptr, stride_len, has_len, ELEN_ptr, stride_elen, has_elen, B, split,
                length, e_length, topk, e_topk, num_splits, per_round, BLOCK_N: tl.constexpr,
                B_POW2: tl.constexpr, HAS_EXTRA: tl.constexpr):  # fmt: skip
    """The length-aware split, as every program computes it from the lengths (no host sync, no
    launch of its own): request r's valid tiles n_r (BLOCK_N tokens of its main length, then
    of its extra length) cut into cdiv(n_r, t) pieces of near-equal tiles, t the fewest tiles
    per piece for which all pieces fit `per_round` programs (and at most num_splits per
    request). Returns the piece count of the program's request (its lengths `length`,
    `e_length`, as `_length` gives them) and piece `split`'s main start, end, extra start, end
    (positions in the index rows; empty past its pieces). Equal lengths give the static
    splits' tile counts."""
    r = tl.arange(0, B_POW2)
    inb = r < B
    ln = tl.load(LEN_ptr + r * stride_len, mask=inb & ((r * 0 + has_len) != 0), other=topk)
    ln = tl.where(inb, tl.maximum(tl.minimum(ln, topk), 0), 0)
    n = tl.cdiv(ln, BLOCK_N)
    if HAS_EXTRA:
        el = tl.load(ELEN_ptr + r * stride_elen, mask=inb & ((r * 0 + has_elen) != 0), other=e_topk)
        n += tl.cdiv(tl.where(inb, tl.maximum(tl.minimum(el, e_topk), 0), 0), BLOCK_N)
    n_max = tl.max(n)
    t = tl.maximum(tl.maximum(tl.cdiv(tl.sum(n), per_round), tl.cdiv(n_max, num_splits)), 1)
    pieces = tl.sum(tl.cdiv(n, t))
    while (pieces > per_round) & (t < n_max):
        t += 1
        pieces = tl.sum(tl.cdiv(n, t))
    ln_b = tl.maximum(length, 0)
    m_b = tl.cdiv(ln_b, BLOCK_N)
    el_b = ln_b * 0
    if HAS_EXTRA:
        el_b = tl.maximum(e_length, 0)
    n_b = m_b + tl.cdiv(el_b, BLOCK_N)
    k_b = tl.cdiv(n_b, t)
    live = split < k_b
    kk = tl.maximum(k_b, 1)
    a = tl.where(live, split * n_b // kk, 0)  # the piece's tiles [a, c): the request's main
    c = tl.where(live, (split + 1) * n_b // kk, 0)  # tiles, then its extra tiles
    start = tl.minimum(a, m_b) * BLOCK_N
    end = tl.maximum(tl.minimum(tl.minimum(c, m_b) * BLOCK_N, ln_b), start)
    e_start = tl.maximum(a - m_b, 0) * BLOCK_N
    e_end = tl.maximum(tl.minimum(tl.maximum(c - m_b, 0) * BLOCK_N, el_b), e_start)
    return k_b, start, end, e_start, e_end


@triton.jit
def _row_offsets(stride_kv_page, page_size, idx, FMT: tl.constexpr):
    """Byte offsets, from the cache's start, of the data row and of the scale bytes of the
    cache slots `idx` in format FMT (int64: page * stride can pass 2^31)."""
    if FMT == 1:  # V4.1 FP8: 512 data bytes, 16 scale bytes
        row_b, scale_b = 512, 16
    elif FMT == 2:  # V4.1 FP4: 256 data bytes, 32 scale bytes
        row_b, scale_b = 256, 32
    else:
        row_b, scale_b = DATA_BYTES, SCALE_BYTES
    page = idx // page_size
    slot = idx - page * page_size
    page_off = page.to(tl.int64) * stride_kv_page
    row_off = page_off + slot.to(tl.int64) * row_b
    scale_off = page_off + (page_size * row_b + slot * scale_b).to(tl.int64)
    return row_off, scale_off


@triton.jit
def _online_softmax_step(s, valid, m_i, l_i, qk_scale_log2):
    """Fold one tile's raw scores s [rows, BLOCK_N] into the running max m_i and sum l_i
    (base 2). Returns p = exp2(scaled s - new max) (0 where not `valid`), alpha (the factor
    for what was accumulated so far), the new max and the new sum."""
    s = tl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid token yet: no NaN
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _online_softmax_counts(s, cnt, m_i, l_i, qk_scale_log2):
    """`_online_softmax_step` for packed rows (several query tokens' heads in one block): key j
    counts cnt[r, j] times for row r (0: not in that row's token's selection), so its score
    gets log2(cnt) added (exp2(s + log2 c) = c exp2(s): a key a token selects twice weighs
    twice, as in the per-token loop)."""
    bias = tl.log2(tl.maximum(cnt, 1).to(tl.float32))
    s = tl.where(cnt > 0, s * qk_scale_log2 + bias, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _exact_pv_operands(p, p_op, k, BLOCK_N: tl.constexpr):
    """The exact PV as one product with the token axis doubled: P = P_hi + P_lo, both halves
    in the operand dtype (~16 significant bits for bf16), as [P_hi | P_lo] (interleaved) and
    [K; K] (each row twice), so there is a single accumulator. Costs 2x PV tensor work; P's
    bf16 rounding (2^-9 relative) otherwise exceeds FlashMLA's abs bound 1e-3 when a few
    tokens carry the weight. Returns (P2 [rows, 2 BLOCK_N], K2 [2 BLOCK_N, k columns])."""
    p_lo = (p - p_op.to(tl.float32)).to(p_op.dtype)
    p2 = tl.reshape(tl.join(p_op, p_lo), (p_op.shape[0], 2 * BLOCK_N))
    return p2, _rows_twice(k, BLOCK_N)


@triton.jit
def _rows_twice(k, BLOCK_N: tl.constexpr):
    """[BLOCK_N, W] -> [2 BLOCK_N, W] with each row repeated (matches `_exact_pv_operands`' P)."""
    return tl.reshape(tl.permute(tl.join(k, k), (0, 2, 1)), (2 * BLOCK_N, k.shape[1]))


@triton.jit
def _ue8m0(exps):
    """UE8M0 scale bytes -> float32 2^(e - 127), built from its float bits: exact, unlike a
    fast exp2 (byte 0 is the subnormal 2^-127)."""
    bits = tl.where(exps == 0, UE8M0_ZERO_BITS, exps.to(tl.int32) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _tile_k(KV_ptr, stride_kv_page, page_size, idx, valid, BLOCK_N: tl.constexpr,
            FMT: tl.constexpr):  # fmt: skip
    """The spec's K rows of the cache slots `idx` as float32 [BLOCK_N, 512] (zero where not
    `valid`), from a cache in format FMT (0: V4, 1: V4.1 FP8, 2: V4.1 FP4). Every product
    of a code and its scale is exact in bf16 (at most 4 + 4 significant bits)."""
    if FMT == 1:
        k = _tile_k_v41(KV_ptr, stride_kv_page, page_size, idx, valid, BLOCK_N)
    elif FMT == 2:
        k = _tile_k_v41_fp4(KV_ptr, stride_kv_page, page_size, idx, valid, BLOCK_N)
    else:
        k = _tile_k_v4(KV_ptr, stride_kv_page, page_size, idx, valid, BLOCK_N)
    return k


@triton.jit
def _tile_k_v41(KV_ptr, stride_kv_page, page_size, idx, valid, BLOCK_N: tl.constexpr):
    """V4.1 FP8 rows: 512 float8_e4m3fn values, one UE8M0 exponent per 32 (byte 255 is NaN,
    as float8_e8m0fnu). Built as [BLOCK_N, 16, 32] so each exponent broadcasts."""
    row_off, scale_off = _row_offsets(stride_kv_page, page_size, idx, 1)
    g = tl.arange(0, 16)
    c = tl.arange(0, 32)
    raw = tl.load(
        KV_ptr + (row_off[:, None, None] + (g[None, :, None] * 32 + c[None, None, :])),
        mask=valid[:, None, None],
        other=0,
    )
    exps = tl.load(KV_ptr + (scale_off[:, None] + g[None, :]), mask=valid[:, None], other=0)
    mult = tl.where(exps == 255, float("nan"), _ue8m0(exps))
    k = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * mult[:, :, None]
    return tl.reshape(k, (BLOCK_N, D_QK))


@triton.jit
def _e2m1(code):
    """4-bit e2m1 codes (bit 3 the sign) -> float32, from the float bits: exponent field
    e = bits 1-2, mantissa bit 0; e = 0 is 0 or the subnormal 0.5."""
    c = code.to(tl.int32)
    e = (c >> 1) & 3
    m = c & 1
    bits = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))
    return (bits | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _tile_k_v41_fp4(KV_ptr, stride_kv_page, page_size, idx, valid, BLOCK_N: tl.constexpr):
    """V4.1 FP4 rows: 256 bytes of e2m1 pairs (value 2i in the low nibble of byte i), one
    float8_e4m3fn scale per 16 values. Built as [BLOCK_N, 32, 8] bytes (group, byte in group);
    the low and high nibbles joined on a last axis give value 16 g + 2 b + nibble."""
    row_off, scale_off = _row_offsets(stride_kv_page, page_size, idx, 2)
    g = tl.arange(0, 32)
    c = tl.arange(0, 8)
    raw = tl.load(
        KV_ptr + (row_off[:, None, None] + (g[None, :, None] * 8 + c[None, None, :])),
        mask=valid[:, None, None],
        other=0,
    )
    sc = tl.load(KV_ptr + (scale_off[:, None] + g[None, :]), mask=valid[:, None], other=0)
    scale = sc.to(tl.float8e4nv, bitcast=True).to(tl.float32)[:, :, None]
    k = tl.join(_e2m1(raw & 0xF) * scale, _e2m1(raw >> 4) * scale)
    return tl.reshape(k, (BLOCK_N, D_QK))


@triton.jit
def _tile_k_v4(KV_ptr, stride_kv_page, page_size, idx, valid, BLOCK_N: tl.constexpr):
    """V4 rows: dequantized nope in columns 0..447, the bf16 rope in 448..511. Built as
    [BLOCK_N, 8, 64] (group, dim in group), so each scale exponent broadcasts along the last
    axis in registers and the rope fills group 7, then viewed as [BLOCK_N, 512]."""
    row_off, scale_off = _row_offsets(stride_kv_page, page_size, idx, 0)
    g = tl.arange(0, NUM_GROUPS_POW2)
    c = tl.arange(0, GROUP)
    is_nope = g < NUM_GROUPS_POW2 - 1
    raw = tl.load(
        KV_ptr + (row_off[:, None, None] + (g[None, :, None] * GROUP + c[None, None, :])),
        mask=valid[:, None, None] & is_nope[None, :, None],
        other=0,
    )
    exps = tl.load(
        KV_ptr + (scale_off[:, None] + g[None, :]),
        mask=valid[:, None] & is_nope[None, :],
        other=0,
    )
    nope = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * _ue8m0(exps)[:, :, None]
    rope_ptr = (KV_ptr + (row_off + D_NOPE)).to(tl.pointer_type(tl.bfloat16))
    rope = tl.load(rope_ptr[:, None] + c[None, :], mask=valid[:, None], other=0.0)
    k = tl.where(is_nope[None, :, None], nope, rope.to(tl.float32)[:, None, :])
    return tl.reshape(k, (BLOCK_N, D_QK))


@triton.jit
def _attend_cache(
    acc, m_i, l_i, q,
    KV_ptr, stride_kv_page, page_size, num_tokens, IDX_row_ptr, stride_it, end,
    qk_scale_log2,
    BLOCK_N: tl.constexpr,
    FMT: tl.constexpr,
):  # fmt: skip
    """SIMT: online softmax (base 2) of one head q [1, 512] over tokens [0, end) of one cache
    (format FMT), scores and PV as fp32 multiply-reduce."""
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(0, end, BLOCK_N):
        idx, valid = _gather_indices(IDX_row_ptr, stride_it, n0 + offs_n, end, num_tokens)
        k = _tile_k(KV_ptr, stride_kv_page, page_size, idx, valid, BLOCK_N, FMT)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        p, alpha, m_new, l_i = _online_softmax_step(s, valid, m_i, l_i, qk_scale_log2)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * k[None, :, :], axis=1)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _to_out_dtype(x, O_ptr, RNE_BY_HAND: tl.constexpr):
    """fp32 -> output dtype. The interpreter converts fp32 -> bf16 by truncation, so there the
    round-to-nearest-even is done on the bits first (the GPU's conversion already is RNE)."""
    if RNE_BY_HAND:
        bits = x.to(tl.int32, bitcast=True)
        bits = bits + (0x7FFF + ((bits >> 16) & 1))
        x = (bits & -65536).to(tl.float32, bitcast=True)
    return x.to(O_ptr.dtype.element_ty)


@triton.jit
def _final_coef(l_i, lse2, heads, head_mask, SINK_ptr, stride_sink, HAS_SINK: tl.constexpr):
    """(1 / l scaled for the sink, base-2 lse including the sink) per head.

    A sink of +inf takes all the weight (out 0, lse +inf); -inf is no sink; empty set: out 0,
    lse = sink (or -inf without one).
    """
    if HAS_SINK:
        sink2 = tl.load(SINK_ptr + heads * stride_sink, mask=head_mask, other=0.0) * LOG2E
        mx = tl.maximum(lse2, sink2)
        mx = tl.where(tl.abs(mx) == float("inf"), 0.0, mx)
        total2 = mx + tl.log2(tl.exp2(lse2 - mx) + tl.exp2(sink2 - mx))
    else:
        total2 = lse2
    coef = tl.where(l_i > 0, tl.exp2(lse2 - total2) / l_i, 0.0)
    return coef, total2


@triton.jit
def _store_final(
    acc,
    l_i,
    lse2,
    b,
    heads,
    head_mask,
    SINK_ptr,
    stride_sink,
    O_ptr,
    stride_ob,
    stride_oh,
    LSE_ptr,
    stride_lb,
    stride_lh,
    HAS_SINK: tl.constexpr,
    RNE_BY_HAND: tl.constexpr,
):
    """acc / l with the sink folded in -> bf16 out; base-2 lse (+ sink) -> natural-log lse."""
    coef, total2 = _final_coef(l_i, lse2, heads, head_mask, SINK_ptr, stride_sink, HAS_SINK)
    out = acc * coef[:, None]
    d = tl.arange(0, D_QK)
    o_ptrs = O_ptr + b.to(tl.int64) * stride_ob + heads[:, None].to(tl.int64) * stride_oh
    tl.store(o_ptrs + d[None, :], _to_out_dtype(out, O_ptr, RNE_BY_HAND), mask=head_mask[:, None])
    lse_ptrs = LSE_ptr + b.to(tl.int64) * stride_lb + heads * stride_lh
    tl.store(lse_ptrs, total2 * LN2, mask=head_mask)


# ----------------------------------------------------------------------------- SIMT kernel


@triton.jit(do_not_specialize=["has_len", "has_elen"])
def _simt_decode_kernel(
    Q_ptr,
    stride_qb,
    stride_qh,
    stride_qd,
    KV_ptr,
    stride_kv_page,
    page_size,
    num_tokens,
    IDX_ptr,
    stride_ib,
    stride_it,
    topk,
    LEN_ptr,
    stride_len,
    EKV_ptr,
    stride_ekv_page,
    e_page_size,
    e_num_tokens,
    EIDX_ptr,
    stride_eib,
    stride_eit,
    e_topk,
    ELEN_ptr,
    stride_elen,
    SINK_ptr,
    stride_sink,
    O_ptr,
    stride_ob,
    stride_oh,
    LSE_ptr,
    stride_lb,
    stride_lh,
    qk_scale_log2,
    has_len,
    has_elen,
    BLOCK_N: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    HAS_SINK: tl.constexpr,
    RNE_BY_HAND: tl.constexpr,
    FMT: tl.constexpr = 0,
    E_FMT: tl.constexpr = 0,
):
    b = tl.program_id(0)
    heads = tl.program_id(1) + tl.arange(0, 1)  # one head, kept as a length-1 vector
    head_mask = heads >= 0
    d = tl.arange(0, D_QK)
    q_ptrs = Q_ptr + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    q = tl.load(q_ptrs + d[None, :] * stride_qd).to(tl.float32)

    acc = tl.zeros([1, D_QK], dtype=tl.float32)
    m_i = tl.full([1], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([1], dtype=tl.float32)

    end = _length(LEN_ptr, stride_len, has_len, b, topk)
    acc, m_i, l_i = _attend_cache(
        acc, m_i, l_i, q, KV_ptr, stride_kv_page, page_size, num_tokens,
        IDX_ptr + b.to(tl.int64) * stride_ib, stride_it, end, qk_scale_log2, BLOCK_N, FMT,
    )  # fmt: skip
    if HAS_EXTRA:
        e_end = _length(ELEN_ptr, stride_elen, has_elen, b, e_topk)
        acc, m_i, l_i = _attend_cache(
            acc, m_i, l_i, q, EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens,
            EIDX_ptr + b.to(tl.int64) * stride_eib, stride_eit, e_end, qk_scale_log2, BLOCK_N,
            E_FMT,
        )  # fmt: skip
    lse2 = tl.where(l_i > 0, m_i + tl.log2(l_i), float("-inf"))
    _store_final(
        acc, l_i, lse2, b, heads, head_mask, SINK_ptr, stride_sink,
        O_ptr, stride_ob, stride_oh, LSE_ptr, stride_lb, stride_lh, HAS_SINK, RNE_BY_HAND,
    )  # fmt: skip


# ----------------------------------------------------------------------------- MMA kernels


@triton.jit
def _split8(x):
    """[R, 8, 64] -> its 8 [R, 64] slices along axis 1 (Triton has no slicing: split the
    trailing axis of size 2 three times)."""
    y = tl.reshape(tl.permute(x, (0, 2, 1)), (x.shape[0], x.shape[2], 2, 2, 2))
    a, b = tl.split(y)  # last bit of the group index
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    x0, x4 = tl.split(a0)
    x2, x6 = tl.split(a1)
    x1, x5 = tl.split(b0)
    x3, x7 = tl.split(b1)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _scores_by_group(q_row, stride_qd, head_mask, k, BLOCK_N: tl.constexpr):
    """S = q K^T as 8 products over 64-dim groups, each group of q loaded here (an L1 hit
    after the first tile). mma.sync takes its A operand from registers: one 512-deep product
    holds all of q there (BLOCK_H x 512 per warp, past the register file), 64 deep an eighth;
    loaded inside the loop, the 8 groups are not hoisted out of it together."""
    k0, k1, k2, k3, k4, k5, k6, k7 = _split8(tl.reshape(k, (BLOCK_N, 8, 64)))
    s = tl.dot(_q_group(q_row, stride_qd, head_mask, 0, k0.dtype), tl.trans(k0))
    s = tl.dot(_q_group(q_row, stride_qd, head_mask, 1, k0.dtype), tl.trans(k1), s)
    s = tl.dot(_q_group(q_row, stride_qd, head_mask, 2, k0.dtype), tl.trans(k2), s)
    s = tl.dot(_q_group(q_row, stride_qd, head_mask, 3, k0.dtype), tl.trans(k3), s)
    s = tl.dot(_q_group(q_row, stride_qd, head_mask, 4, k0.dtype), tl.trans(k4), s)
    s = tl.dot(_q_group(q_row, stride_qd, head_mask, 5, k0.dtype), tl.trans(k5), s)
    s = tl.dot(_q_group(q_row, stride_qd, head_mask, 6, k0.dtype), tl.trans(k6), s)
    s = tl.dot(_q_group(q_row, stride_qd, head_mask, 7, k0.dtype), tl.trans(k7), s)
    return s


@triton.jit
def _q_group(q_row, stride_qd, head_mask, g: tl.constexpr, dtype: tl.constexpr):
    """Columns [64 g, 64 g + 64) of the program's query rows, in the operand dtype."""
    c = g * GROUP + tl.arange(0, GROUP)
    return tl.load(q_row + c[None, :] * stride_qd, mask=head_mask[:, None], other=0.0).to(dtype)


@triton.jit
def _attend_split_mma(
    acc, m_i, l_i, q, q_row, stride_qd, head_mask,
    KV_ptr, stride_kv_page, page_size, num_tokens, idx_row, stride_it, start, end,
    EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens, e_idx_row, stride_eit, e_start, e_end,
    qk_scale_log2, w_off, e_w_off, row_shift,
    HAS_EXTRA: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PV_SPLIT: tl.constexpr,
    S_BY_GROUP: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PREFETCH: tl.constexpr,
    FMT: tl.constexpr,
    E_FMT: tl.constexpr,
    PACKED: tl.constexpr,
):  # fmt: skip
    """Online softmax (base 2) of BLOCK_H heads over the split's tokens: [start, end) of the
    main cache, then [e_start, e_end) of the extra cache, in one loop whose tile picks its
    cache (one copy of the tile body: two loops, one per cache, spilled ~20x more registers).

    Per tile: S = q K^T and O += P K, `tl.dot` on DOT_DTYPE operands with fp32 accumulation,
    K the whole 512-wide row (nope and rope in one operand: one MMA chain each, no padding).
    PV_SPLIT adds P's bf16 rounding residue to the PV product (`_exact_pv_operands`);
    S_BY_GROUP computes S as 8 products 64 deep (`_scores_by_group`, the mma.sync row).
    PREFETCH asks L2 for the next tile's rows once this tile's are loaded, so that they
    arrive while this tile's products run (`_prefetch_rows`). FMT / E_FMT: the two caches'
    formats; when they differ (a V4.1 FP4 extra cache), the tile's gather branches on its cache
    (one launch per cache instead measured 11% slower at B64 dual, run P3).
    PACKED: the rows are several query tokens' heads over the union of their selections
    (`_mma_packed_kernel`); each key's per-token counts are the int32 word w_off (e_w_off in
    the extra cache) entries after its index, 4 bits per token, the row's at `row_shift`.
    """
    offs_n = tl.arange(0, BLOCK_N)
    n_main = tl.cdiv(tl.maximum(end - start, 0), BLOCK_N)
    n_tiles = n_main
    if HAS_EXTRA:
        n_tiles += tl.cdiv(tl.maximum(e_end - e_start, 0), BLOCK_N)
    for i in tl.range(0, n_tiles, num_stages=NUM_STAGES):
        kv, kv_stride, psize, ntok, irow, istride, n0, stop = _tile_source(
            i, n_main, KV_ptr, stride_kv_page, page_size, num_tokens, idx_row, stride_it,
            start, end, EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens, e_idx_row,
            stride_eit, e_start, e_end, HAS_EXTRA, BLOCK_N,
        )  # fmt: skip
        idx, valid = _gather_indices(irow, istride, n0 + offs_n, stop, ntok)
        if PREFETCH:
            nkv, nstride, npsize, nntok, nirow, nistride, nn0, nstop = _tile_source(
                i + 1, n_main, KV_ptr, stride_kv_page, page_size, num_tokens, idx_row,
                stride_it, start, end, EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens,
                e_idx_row, stride_eit, e_start, e_end, HAS_EXTRA, BLOCK_N,
            )  # fmt: skip
            next_idx, next_valid = _gather_indices(nirow, nistride, nn0 + offs_n, nstop, nntok)
        # Exact in bf16: fp8 * 2^e has 4 significant bits, the rope already is bf16.
        if FMT == E_FMT:
            k = _tile_k(kv, kv_stride, psize, idx, valid, BLOCK_N, FMT)
        elif i < n_main:
            k = _tile_k(kv, kv_stride, psize, idx, valid, BLOCK_N, FMT)
        else:
            k = _tile_k(kv, kv_stride, psize, idx, valid, BLOCK_N, E_FMT)
        k = k.to(DOT_DTYPE)
        if PREFETCH:
            if nntok > 0:  # an empty cache's pointer may not be an address
                if FMT == E_FMT:
                    _prefetch_rows(nkv, nstride, npsize, next_idx, next_valid, FMT)
                elif i + 1 < n_main:
                    _prefetch_rows(nkv, nstride, npsize, next_idx, next_valid, FMT)
                else:
                    _prefetch_rows(nkv, nstride, npsize, next_idx, next_valid, E_FMT)
        if S_BY_GROUP:
            s = _scores_by_group(q_row, stride_qd, head_mask, k, BLOCK_N)
        else:
            s = tl.dot(q, tl.trans(k))
        if PACKED:
            woff = w_off
            if HAS_EXTRA:
                woff = tl.where(i < n_main, w_off, e_w_off)
            w = tl.load(irow + woff + (n0 + offs_n), mask=valid, other=0)
            cnt = (w[None, :] >> row_shift[:, None]) & 15
            p, alpha, m_new, l_i = _online_softmax_counts(s, cnt, m_i, l_i, qk_scale_log2)
        else:
            p, alpha, m_new, l_i = _online_softmax_step(s, valid, m_i, l_i, qk_scale_log2)
        p_op = p.to(DOT_DTYPE)
        if PV_SPLIT:
            p2, k2 = _exact_pv_operands(p, p_op, k, BLOCK_N)
            acc = tl.dot(p2, k2, acc * alpha[:, None])
        else:
            acc = tl.dot(p_op, k, acc * alpha[:, None])
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _tile_source(
    i, n_main,
    KV_ptr, stride_kv_page, page_size, num_tokens, idx_row, stride_it, start, end,
    EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens, e_idx_row, stride_eit, e_start, e_end,
    HAS_EXTRA: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Tile i of the split's tile list (the main cache's tiles, then the extra cache's): its
    cache (pointer, page stride, page size, token count), its index row and stride, its first
    position and the end of its cache's range."""
    if HAS_EXTRA:
        in_main = i < n_main
        kv = tl.where(in_main, KV_ptr, EKV_ptr)
        kv_stride = tl.where(in_main, stride_kv_page, stride_ekv_page)
        psize = tl.where(in_main, page_size, e_page_size)
        ntok = tl.where(in_main, num_tokens, e_num_tokens)
        irow = tl.where(in_main, idx_row, e_idx_row)
        istride = tl.where(in_main, stride_it, stride_eit)
        n0 = tl.where(in_main, start + i * BLOCK_N, e_start + (i - n_main) * BLOCK_N)
        stop = tl.where(in_main, end, e_end)
    else:
        kv, kv_stride, psize, ntok = KV_ptr, stride_kv_page, page_size, num_tokens
        irow, istride, n0, stop = idx_row, stride_it, start + i * BLOCK_N, end
    return kv, kv_stride, psize, ntok, irow, istride, n0, stop


@triton.jit
def _prefetch_rows(KV_ptr, stride_kv_page, page_size, idx, valid, FMT: tl.constexpr):
    """Ask L2 for the cache lines of slots `idx` (format FMT): the data row (576, 512 or 256
    bytes: its 128-byte lines and its last byte) and the scale bytes. `prefetch.global.L2` has no
    destination register and nothing waits for it; slots that are not `valid` are slot 0
    (`_gather_indices`), a valid address of a non-empty cache."""
    row_off, scale_off = _row_offsets(stride_kv_page, page_size, idx, FMT)
    if FMT == 1:
        last = 511
    elif FMT == 2:
        last = 255
    else:
        last = DATA_BYTES - 1
    j = tl.arange(0, 8)[None, :]
    line = row_off[:, None] + tl.minimum(j * 128, last)
    off = tl.where(j < 6, line, scale_off[:, None])
    ptrs = KV_ptr + tl.where(valid[:, None], off, 0)
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _split_heads(
    heads, b, split, H, num_splits,
    Q_ptr, stride_qb, stride_qh, stride_qd,
    KV_ptr, stride_kv_page, page_size, num_tokens, idx_row, stride_it, start, end,
    EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens, e_idx_row, stride_eit, e_start, e_end,
    SINK_ptr, stride_sink, O_ptr, stride_ob, stride_oh, LSE_ptr, stride_lb, stride_lh,
    PO_ptr, PLSE_ptr, qk_scale_log2, h_real, w_off, e_w_off,
    SINGLE_SPLIT: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    HAS_SINK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PV_SPLIT: tl.constexpr,
    RNE_BY_HAND: tl.constexpr,
    S_BY_GROUP: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PREFETCH: tl.constexpr,
    FMT: tl.constexpr,
    E_FMT: tl.constexpr,
    PACKED: tl.constexpr,
):  # fmt: skip
    """One split of one request for the heads `heads`: attend over the split's tiles, then
    store the result (final bf16 out and lse with one split, else the fp32 partial).
    PACKED: `heads` are rows of a block of several query tokens' h_real heads each (row r:
    token r // h_real, head r % h_real)."""
    head_mask = heads < H
    if PACKED:
        sink_heads = heads % h_real
        row_shift = (heads // h_real) * 4
    else:
        sink_heads = heads
        row_shift = heads
    d = tl.arange(0, D_QK)
    q_row = Q_ptr + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    # q stays unscaled in the operand dtype (bf16 q is exact; scaling happens on fp32 scores).
    q = tl.load(q_row + d[None, :] * stride_qd, mask=head_mask[:, None], other=0.0)
    q = q.to(DOT_DTYPE)
    acc = tl.zeros([heads.shape[0], D_QK], dtype=tl.float32)
    m_i = tl.full([heads.shape[0]], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([heads.shape[0]], dtype=tl.float32)
    acc, m_i, l_i = _attend_split_mma(
        acc, m_i, l_i, q, q_row, stride_qd, head_mask,
        KV_ptr, stride_kv_page, page_size, num_tokens, idx_row, stride_it, start, end,
        EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens, e_idx_row, stride_eit,
        e_start, e_end,
        qk_scale_log2, w_off, e_w_off, row_shift, HAS_EXTRA, BLOCK_N, DOT_DTYPE, PV_SPLIT,
        S_BY_GROUP, NUM_STAGES, PREFETCH, FMT, E_FMT, PACKED,
    )  # fmt: skip
    lse2 = tl.where(l_i > 0, m_i + tl.log2(l_i), float("-inf"))
    if SINGLE_SPLIT:
        coef, total2 = _final_coef(
            l_i, lse2, sink_heads, head_mask, SINK_ptr, stride_sink, HAS_SINK
        )
        o_row = O_ptr + b.to(tl.int64) * stride_ob + heads[:, None].to(tl.int64) * stride_oh
        out = _to_out_dtype(acc * coef[:, None], O_ptr, RNE_BY_HAND)
        lse_ptrs = LSE_ptr + b.to(tl.int64) * stride_lb + heads * stride_lh
        tl.store(lse_ptrs, total2 * LN2, mask=head_mask)
    else:
        # Partials [B, H, num_splits, 512] fp32 (normalised) and [B, H, num_splits] base-2 LSE.
        row = (b.to(tl.int64) * H + heads.to(tl.int64)) * num_splits + split
        inv_l = tl.where(l_i > 0, 1.0 / l_i, 0.0)
        o_row = PO_ptr + row[:, None] * D_QK
        out = acc * inv_l[:, None]
        tl.store(PLSE_ptr + row, lse2, mask=head_mask)
    tl.store(o_row + d[None, :], out, mask=head_mask[:, None])


@triton.jit
def _split_heads_tm(
    heads, b, split, H, num_splits,
    Q_ptr, stride_qb, stride_qh, stride_qd,
    KV_ptr, stride_kv_page, page_size, num_tokens, idx_row, stride_it, start, end,
    EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens, e_idx_row, stride_eit, e_start, e_end,
    SINK_ptr, stride_sink, O_ptr, stride_ob, stride_oh, LSE_ptr, stride_lb, stride_lh,
    PO_ptr, PLSE_ptr, qk_scale_log2,
    SINGLE_SPLIT: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    HAS_SINK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    RNE_BY_HAND: tl.constexpr,
    PREFETCH: tl.constexpr,
    FMT: tl.constexpr,
    E_FMT: tl.constexpr,
):  # fmt: skip
    """`_split_heads` token-major (the bf16-P loop only): S^T = K q^T [BLOCK_N, heads] with the
    dequantized tile as the first operand, softmax over axis 0, O^T += K^T P^T [512, heads].
    For few heads (prefill-sized calls): the heads are the products' N (8 heads need no
    padding to 16 rows, mma.sync's n8), and the two uses of the K tile are staged one after
    the other, so a program needs about half the shared memory of the head-major loop's
    (q^T 8 KB + one 16-token tile 16 KB at a time, sm_90, triton 3.6: 40,960 B against
    81,920): more programs per SM (docs/kernel-optimisation-log.md, v14)."""
    head_mask = heads < H
    d = tl.arange(0, D_QK)
    q_col = Q_ptr + b.to(tl.int64) * stride_qb + heads[None, :].to(tl.int64) * stride_qh
    qt = tl.load(q_col + d[:, None] * stride_qd, mask=head_mask[None, :], other=0.0)
    qt = qt.to(DOT_DTYPE)
    acc = tl.zeros([D_QK, heads.shape[0]], dtype=tl.float32)
    m_i = tl.full([heads.shape[0]], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([heads.shape[0]], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    n_main = tl.cdiv(tl.maximum(end - start, 0), BLOCK_N)
    n_tiles = n_main
    if HAS_EXTRA:
        n_tiles += tl.cdiv(tl.maximum(e_end - e_start, 0), BLOCK_N)
    for i in range(0, n_tiles):
        kv, kv_stride, psize, ntok, irow, istride, n0, stop = _tile_source(
            i, n_main, KV_ptr, stride_kv_page, page_size, num_tokens, idx_row, stride_it,
            start, end, EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens, e_idx_row,
            stride_eit, e_start, e_end, HAS_EXTRA, BLOCK_N,
        )  # fmt: skip
        # (written apart from the head-major loop's line: `--phases` edits each loop's own)
        idx, valid = _gather_indices(irow, istride, offs_n + n0, stop, ntok)
        if PREFETCH:
            nkv, nstride, npsize, nntok, nirow, nistride, nn0, nstop = _tile_source(
                i + 1, n_main, KV_ptr, stride_kv_page, page_size, num_tokens, idx_row,
                stride_it, start, end, EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens,
                e_idx_row, stride_eit, e_start, e_end, HAS_EXTRA, BLOCK_N,
            )  # fmt: skip
            next_idx, next_valid = _gather_indices(nirow, nistride, nn0 + offs_n, nstop, nntok)
        if FMT == E_FMT:
            k = _tile_k(kv, kv_stride, psize, idx, valid, BLOCK_N, FMT)
        elif i < n_main:
            k = _tile_k(kv, kv_stride, psize, idx, valid, BLOCK_N, FMT)
        else:
            k = _tile_k(kv, kv_stride, psize, idx, valid, BLOCK_N, E_FMT)
        k = k.to(DOT_DTYPE)
        if PREFETCH:
            if nntok > 0:  # an empty cache's pointer may not be an address
                if FMT == E_FMT:
                    _prefetch_rows(nkv, nstride, npsize, next_idx, next_valid, FMT)
                elif i + 1 < n_main:
                    _prefetch_rows(nkv, nstride, npsize, next_idx, next_valid, FMT)
                else:
                    _prefetch_rows(nkv, nstride, npsize, next_idx, next_valid, E_FMT)
        st = tl.dot(k, qt)
        st = tl.where(valid[:, None], st * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(st, axis=0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid token yet: no NaN
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(st - m_use[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = tl.dot(tl.trans(k), p.to(DOT_DTYPE), acc * alpha[None, :])
        m_i = m_new
    lse2 = tl.where(l_i > 0, m_i + tl.log2(l_i), float("-inf"))
    if SINGLE_SPLIT:
        coef, total2 = _final_coef(l_i, lse2, heads, head_mask, SINK_ptr, stride_sink, HAS_SINK)
        o_col = O_ptr + b.to(tl.int64) * stride_ob + heads[None, :].to(tl.int64) * stride_oh
        out = _to_out_dtype(acc * coef[None, :], O_ptr, RNE_BY_HAND)
        lse_ptrs = LSE_ptr + b.to(tl.int64) * stride_lb + heads * stride_lh
        tl.store(lse_ptrs, total2 * LN2, mask=head_mask)
    else:
        row = (b.to(tl.int64) * H + heads.to(tl.int64)) * num_splits + split
        inv_l = tl.where(l_i > 0, 1.0 / l_i, 0.0)
        o_col = PO_ptr + row[None, :] * D_QK
        out = acc * inv_l[None, :]
        tl.store(PLSE_ptr + row, lse2, mask=head_mask)
    tl.store(o_col + d[:, None], out, mask=head_mask[None, :])


@triton.jit(do_not_specialize=["has_len", "has_elen"])
def _mma_split_kernel(
    Q_ptr,
    stride_qb,
    stride_qh,
    stride_qd,
    KV_ptr,
    stride_kv_page,
    page_size,
    num_tokens,
    IDX_ptr,
    stride_ib,
    stride_it,
    topk,
    LEN_ptr,
    stride_len,
    tiles_per_split,
    EKV_ptr,
    stride_ekv_page,
    e_page_size,
    e_num_tokens,
    EIDX_ptr,
    stride_eib,
    stride_eit,
    e_topk,
    ELEN_ptr,
    stride_elen,
    SINK_ptr,
    stride_sink,
    O_ptr,
    stride_ob,
    stride_oh,
    LSE_ptr,
    stride_lb,
    stride_lh,
    PO_ptr,
    PLSE_ptr,
    H,
    qk_scale_log2,
    num_splits,
    has_len,
    has_elen,
    SINGLE_SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    HAS_SINK: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PV_SPLIT: tl.constexpr,
    RNE_BY_HAND: tl.constexpr,
    S_BY_GROUP: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    RUN_BF16_P: tl.constexpr,
    EXACT_BELOW: tl.constexpr,
    EXACT_BLOCK_H: tl.constexpr,
    COUNT_BLOCK: tl.constexpr,
    COUNT_ONE_BLOCK: tl.constexpr,
    PREFETCH: tl.constexpr,
    FMT: tl.constexpr = 0,
    E_FMT: tl.constexpr = 0,
    RUN_EXACT: tl.constexpr = True,
    TOKEN_MAJOR: tl.constexpr = False,
    SKIP_PACKED: tl.constexpr = False,
    PIECES_ptr=None,
    B=0,
    per_round=0,
    PLAN: tl.constexpr = False,
    B_POW2: tl.constexpr = 1,
    PLAN_BLOCK_N: tl.constexpr = 16,
):
    tl.static_assert(BLOCK_H >= 16 or TOKEN_MAJOR, "tl.dot needs at least 16 rows")
    tl.static_assert(
        not TOKEN_MAJOR or not RUN_EXACT or EXACT_BELOW == 0,
        "token-major: the exact PV runs as a second (head-major) launch",
    )
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs at least 16 columns")
    tl.static_assert(BLOCK_H % EXACT_BLOCK_H == 0, "the exact path splits the head block")
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    num_head_blocks = tl.cdiv(H, BLOCK_H)
    b = pid_bh // num_head_blocks
    h0 = (pid_bh % num_head_blocks) * BLOCK_H

    length = _length(LEN_ptr, stride_len, has_len, b, topk)
    if SKIP_PACKED:
        # Lengths from `_pack_plan_kernel`: -1 marks a token of a packed group, which
        # `_mma_packed_kernel` writes; its program exits here (no count, no q, no store).
        if length < 0:
            return
    # The split's tiles of the two caches' tile lists laid end to end (main, then extra), so
    # that splits get equal tile counts whatever the two topk are (B1 dual cache: 2 + 8 tiles
    # over 10 splits, one tile each).
    e_length = e_topk
    if HAS_EXTRA:
        e_length = _length(ELEN_ptr, stride_elen, has_elen, b, e_topk)
    if PLAN:
        # The length-aware split (`_plan_piece`, in the bf16-P launch's tiles, so that an exact
        # launch of other tiles cuts the same pieces): this piece's ranges; a split past the
        # request's pieces stores nothing (the combine reads the count program (b, 0) stores).
        k_b, start, end, e_start, e_end = _plan_piece(
            LEN_ptr, stride_len, has_len, ELEN_ptr, stride_elen, has_elen, B, split, length,
            e_length, topk, e_topk, num_splits, per_round, PLAN_BLOCK_N, B_POW2, HAS_EXTRA,
        )  # fmt: skip
        if RUN_BF16_P:
            if (split == 0) & (h0 == 0):
                tl.store(PIECES_ptr + b, k_b)
        if split >= k_b:
            return
    else:
        t0 = split * tiles_per_split
        t1 = t0 + tiles_per_split
        main_tiles = tl.cdiv(topk, BLOCK_N)
        start = tl.minimum(t0, main_tiles) * BLOCK_N
        end = tl.minimum(tl.minimum(t1, main_tiles) * BLOCK_N, length)
        e_start = 0
        e_end = 0
        if HAS_EXTRA:
            e_start = tl.maximum(t0 - main_tiles, 0) * BLOCK_N
            e_end = tl.minimum(tl.maximum(t1 - main_tiles, 0) * BLOCK_N, e_length)
    idx_row = IDX_ptr + b.to(tl.int64) * stride_ib
    e_idx_row = EIDX_ptr + b.to(tl.int64) * stride_eib
    exact = False
    if EXACT_BELOW > 0:
        # Requests with at most EXACT_BELOW valid tokens (counted here from the index rows: no
        # host sync) take the exact PV, in sub-blocks of EXACT_BLOCK_H heads (its doubled
        # tile must fit).
        n_valid = _count_valid(
            idx_row, stride_it, length, topk, num_tokens, COUNT_BLOCK, COUNT_ONE_BLOCK
        )
        if HAS_EXTRA:
            n_valid += _count_valid(
                e_idx_row, stride_eit, e_length, e_topk, e_num_tokens, COUNT_BLOCK,
                COUNT_ONE_BLOCK,
            )  # fmt: skip
        exact = n_valid <= EXACT_BELOW
    # RUN_EXACT off: the bf16-P launch of a pair whose other launch (on a side stream, running
    # beside this one) does the few-token requests: they return here, so the two write
    # disjoint outputs. RUN_BF16_P off: that other launch, which returns for the rest.
    if exact:
        if RUN_EXACT:
            for sub in tl.static_range(BLOCK_H // EXACT_BLOCK_H):
                _split_heads(
                    h0 + sub * EXACT_BLOCK_H + tl.arange(0, EXACT_BLOCK_H), b, split, H,
                    num_splits, Q_ptr, stride_qb, stride_qh, stride_qd,
                    KV_ptr, stride_kv_page, page_size, num_tokens, idx_row, stride_it, start, end,
                    EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens, e_idx_row, stride_eit,
                    e_start, e_end,
                    SINK_ptr, stride_sink, O_ptr, stride_ob, stride_oh, LSE_ptr, stride_lb,
                    stride_lh, PO_ptr, PLSE_ptr, qk_scale_log2, H, 0, 0,
                    SINGLE_SPLIT, HAS_EXTRA, HAS_SINK, BLOCK_N, DOT_DTYPE, True, RNE_BY_HAND,
                    S_BY_GROUP, 1, PREFETCH, FMT, E_FMT, False,
                )  # fmt: skip
    else:
        if RUN_BF16_P and TOKEN_MAJOR:
            _split_heads_tm(
                h0 + tl.arange(0, BLOCK_H), b, split, H,
                num_splits, Q_ptr, stride_qb, stride_qh, stride_qd,
                KV_ptr, stride_kv_page, page_size, num_tokens, idx_row, stride_it, start, end,
                EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens, e_idx_row, stride_eit,
                e_start, e_end,
                SINK_ptr, stride_sink, O_ptr, stride_ob, stride_oh, LSE_ptr, stride_lb,
                stride_lh, PO_ptr, PLSE_ptr, qk_scale_log2,
                SINGLE_SPLIT, HAS_EXTRA, HAS_SINK, BLOCK_N, DOT_DTYPE, RNE_BY_HAND, PREFETCH,
                FMT, E_FMT,
            )  # fmt: skip
        elif RUN_BF16_P:
            _split_heads(
                h0 + tl.arange(0, BLOCK_H), b, split, H,
                num_splits, Q_ptr, stride_qb, stride_qh, stride_qd,
                KV_ptr, stride_kv_page, page_size, num_tokens, idx_row, stride_it, start, end,
                EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens, e_idx_row, stride_eit,
                e_start, e_end,
                SINK_ptr, stride_sink, O_ptr, stride_ob, stride_oh, LSE_ptr, stride_lb,
                stride_lh, PO_ptr, PLSE_ptr, qk_scale_log2, H, 0, 0,
                SINGLE_SPLIT, HAS_EXTRA, HAS_SINK, BLOCK_N, DOT_DTYPE, PV_SPLIT, RNE_BY_HAND,
                S_BY_GROUP, NUM_STAGES, PREFETCH, FMT, E_FMT, False,
            )  # fmt: skip


@triton.jit(do_not_specialize=["has_len", "has_elen"])
def _split_plan_kernel(
    LEN_ptr, stride_len, has_len, ELEN_ptr, stride_elen, has_elen, PLAN_ptr, B, topk, e_topk,
    num_splits, per_round, BLOCK_N: tl.constexpr, B_POW2: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
):  # fmt: skip
    """`_plan_piece` of program (b, split) of a (B, num_splits) grid into PLAN[b, split] =
    (start, end, e_start, e_end, pieces of b): the plan the split launches compute, as a table
    (tests)."""
    b = tl.program_id(0)
    split = tl.program_id(1)
    k_b, start, end, e_start, e_end = _plan_piece(
        LEN_ptr, stride_len, has_len, ELEN_ptr, stride_elen, has_elen, B, split,
        _length(LEN_ptr, stride_len, has_len, b, topk),
        _length(ELEN_ptr, stride_elen, has_elen, b, e_topk), topk, e_topk, num_splits,
        per_round, BLOCK_N, B_POW2, HAS_EXTRA,
    )  # fmt: skip
    piece = PLAN_ptr + (b * num_splits + split) * 5
    tl.store(piece, start)
    tl.store(piece + 1, end)
    tl.store(piece + 2, e_start)
    tl.store(piece + 3, e_end)
    tl.store(piece + 4, k_b)


@triton.jit
def _combine_kernel(
    PO_ptr,
    PLSE_ptr,
    SINK_ptr,
    stride_sink,
    O_ptr,
    stride_ob,
    stride_oh,
    LSE_ptr,
    stride_lb,
    stride_lh,
    H,
    num_splits,
    SPLITS_POW2: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_SINK: tl.constexpr,
    RNE_BY_HAND: tl.constexpr,
    PIECES_ptr=None,
    PLAN: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """Merge the splits of one (request, head) by their base-2 LSE, adding the sink. PLAN: only
    the request's first PIECES[b] splits (`_plan_piece`; the others stored nothing). PDL:
    launched as the split kernel's programmatic dependent: waits for it before reading."""
    pid = tl.program_id(0)  # b * H + h
    b = pid // H
    h = pid % H
    s = tl.arange(0, SPLITS_POW2)
    row0 = pid.to(tl.int64) * num_splits
    live = s < num_splits
    if PDL:
        gdc_wait()  # the split kernel has finished and its partials are visible
    lse = tl.load(PLSE_ptr + row0 + s, mask=live, other=float("-inf"))
    if PLAN:  # loaded beside the partial LSEs; the splits past it hold stale values
        live = live & (s < tl.load(PIECES_ptr + b))
        lse = tl.where(live, lse, float("-inf"))
    mx = tl.max(lse, axis=0)
    if HAS_SINK:
        sink2 = tl.load(SINK_ptr + h * stride_sink) * LOG2E
        mx = tl.maximum(mx, sink2)
    mx = tl.where(tl.abs(mx) == float("inf"), 0.0, mx)
    w = tl.exp2(lse - mx)
    den = tl.sum(w, axis=0)
    if HAS_SINK:
        den += tl.exp2(sink2 - mx)
    coef = tl.where(den > 0, w / den, 0.0)

    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    parts = tl.load(PO_ptr + (row0 + s[:, None]) * D_QK + d[None, :], mask=live[:, None], other=0.0)
    out = tl.sum(parts * coef[:, None], axis=0)
    o_ptrs = O_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    tl.store(o_ptrs + d, _to_out_dtype(out, O_ptr, RNE_BY_HAND))
    if tl.program_id(1) == 0:
        tl.store(LSE_ptr + b.to(tl.int64) * stride_lb + h * stride_lh, (mx + tl.log2(den)) * LN2)


# ------------------------------------------------------------ Hopper: the warp-specialized loop
# The sm_90 row's bf16-P launch as a Gluon kernel (explicit warp specialization): a loader
# partition of 4 warps only issues cp.async of each tile's raw rows (fp8 nope, bf16 rope, scale
# bytes) into a ring of NR slots, tiles ahead; the default partition (8 warps, two
# warpgroups) dequantizes each raw tile into the one bf16 K tile it owns and runs S = q K^T and
# O += P K as wgmma, q resident in shared memory. The gather's latency passes under the
# products of earlier tiles, which one Triton program (one instruction stream) cannot arrange.
# Same split grid, partials and combine as `_mma_split_kernel`; the few-token requests' exact
# PV in the same programs (EXACT_IN) or `_mma_split_kernel`'s second launch. wgmma on 9.x, an
# mma.sync consumer for the sm_120 row; Gluon has no CPU interpreter, so the interpreter and
# other GPUs run `_mma_split_kernel`. Measured: issue 20, sessions 15-17 (docs/benchmarks.md).

try:
    if _INTERPRET:
        raise ImportError("the Triton interpreter runs no Gluon kernel")
    if triton.__version__.split(".")[:2] != ["3", "6"]:
        # Gluon is experimental and its API moves between releases (3.9 has no
        # thread_barrier): only the release this kernel was built and measured with
        raise ImportError(f"Gluon kernel written for triton 3.6, not {triton.__version__}")
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
    )

    HAS_GLUON = True
    GLUON_UNAVAILABLE = None
except Exception as _gluon_err:  # noqa: BLE001  (older Triton, or an API this file does not know)
    HAS_GLUON = False
    # why the MMA variant runs its Triton loops here (`kernels status` and the bench say it)
    GLUON_UNAVAILABLE = str(_gluon_err) or type(_gluon_err).__name__

WS_BLOCK_H = 64  # heads per program: the wgmma M of both products
WS_BLOCK_N = 64  # tokens per tile
WS_RAW_SLOTS = 2  # raw tiles in flight (2 x 37.4 KB + q 64 KB + K 64 KB: 218 KB of 227)
WS_LOADER_REGS = 56  # the loader only computes addresses
# ... of two caches in the wgmma tile where 56 spill in its tile loop: a V4.1 FP4 extra cache
# (72 B at 56, 40 at 64; session 26: V4.1 FP8 + FP4 dual 44.7 against 43.9 µs) or a page size
# not a power of two (the loader divides: 4 B reloaded every tile at 56; session 24: B128 dual
# 63.2 -> 56.8 µs at 64). Two V4 or V4.1 FP8 caches of SGLang's page sizes (64, 256) take 56:
# their loader pages tokens by shifts (`_ws_page_slot`), no spills, the consumers keep 224
# (session 26: B128 dual 45.5 -> 44.3 µs at 56). One cache: 56 (at 64 the consumers' 8 fewer
# registers cost 2-9%, session 24).
WS_DUAL_LOADER_REGS = 64
# The mma.sync form (the sm_120 row, 99 KB per block): 32 heads x 32 tokens, one raw slot (the
# K tile is the second buffer: q 32 KB + K 32 KB + raw 20 KB, 88,348 B), 8 consumer warps at
# 168 registers: one program per SM by registers as by sm_120's 100 KB of shared memory.
WS_SYNC_BLOCK_H = 32
WS_SYNC_BLOCK_N = 32
WS_SYNC_RAW_SLOTS = 1
# Its long form, Hopper only (143,900 B): 32 heads x 64 tokens, for the sm_90 row's small
# dual-cache calls where fewer, longer tiles per split cost less (`small_dual_block_n`).
WS_SYNC_LONG_BLOCK_N = 64
# What a tile of the small dual-cache calls costs beyond its tokens (its barriers, softmax
# and raw-slot hand-over), in tokens: fitted to session 32's H200 A/B of the two forms (B1,
# B8: 32 tokens faster; B4, B16: 64), which bound it between 16 and 32.
WS_SYNC_TILE_COST_TOKENS = 24
# Its wide form: 64 heads x 16 tokens (q 64 KB + K 16 KB + raw 10 KB: 94,364 B, one program
# per SM as well), for calls with many selected tokens per SM (`ws_wide_tokens_per_sm`): each
# K tile is gathered and dequantized once for 64 heads instead of twice (two 32-head blocks).
WS_SYNC_WIDE_BLOCK_H = 64
WS_SYNC_WIDE_BLOCK_N = 16
# The few-head form, for calls of at most 16 heads (prefill-sized calls of a TP 8 layer, and
# its decode): 16 heads x 32 tokens, two raw slots (q 16 KB + K 32 KB + raw 2 x 18.7 KB: 91,684
# B), 4 consumer warps, built for 128 registers a thread (the consumers take 232 from the
# loader's share through setmaxnreg, no spills): two programs per SM on sm_90 (one on sm_120,
# 100 KB per SM). Session 20: 1.4-1.9x the token-major and head-major Triton loops there.
WS_FEW_BLOCK_H = 16
WS_FEW_BLOCK_N = 32
WS_FEW_RAW_SLOTS = 2
WS_FEW_WARPS = 4
WS_FEW_MAXNREG = 128
# The mma.sync tiles' S: q's first 64-dim groups held in registers across the tiles (the
# consumer sums the 8 groups' products in two independent accumulators). ncu (session 28, the
# wide tile at B64 topk2048 on the proxy): 55% of the consumer warps' stall samples in S's
# products, each waiting for the ldmatrix issued just before it (ptxas keeps them next to
# their product however the source orders them). Two groups held (32 registers; three or
# more spill) and two sums: the sm_120 row 1.04-1.10x on the proxy, the small dual tile and
# the few-head tile (one group held: 128 registers) 1.02-1.03x on the H200; two sums alone
# 0.99-1.01x, four slower on the wide tile (a 16 B spill).
WS_SYNC_Q_HELD = {
    (WS_SYNC_BLOCK_H, WS_SYNC_BLOCK_N): 2,
    (WS_SYNC_BLOCK_H, WS_SYNC_LONG_BLOCK_N): 1,  # two spill 28-36 B (its 64-token S)
    (WS_SYNC_WIDE_BLOCK_H, WS_SYNC_WIDE_BLOCK_N): 2,
    (WS_FEW_BLOCK_H, WS_FEW_BLOCK_N): 1,
}
WS_SYNC_LONG_TILE = (WS_SYNC_BLOCK_H, WS_SYNC_LONG_BLOCK_N)  # 9.x only
# The few-head tile token-major (`_ws_tm_consumer`), for calls of at most 8 heads: S^T = K q^T
# and O^T += K^T P^T, the heads mma.sync's N (8: no padding rows), q^T held in registers for
# the whole loop (the head-major tile reloads 7 of q's 8 groups every tile: ~480 of a tile's
# ~1,680 shared-memory wavefronts, session 29's ncu). Same buffers, warps and residency as the
# few-head tile (`ws_build`). Session 35 (its first build, since lost): T1024 H8 dual prefill
# 1.15x, B64 H8 dual decode 1.08x; at 16 heads 0.84-0.88x (q no longer fits in registers).
WS_TM_BLOCK_H = 8
WS_TM_TILE = (WS_TM_BLOCK_H, WS_FEW_BLOCK_N)
WS_SYNC_TILES = (
    (WS_SYNC_BLOCK_H, WS_SYNC_BLOCK_N),
    WS_SYNC_LONG_TILE,
    (WS_SYNC_WIDE_BLOCK_H, WS_SYNC_WIDE_BLOCK_N),
    (WS_FEW_BLOCK_H, WS_FEW_BLOCK_N),
    WS_TM_TILE,
)


def ws_raw_v4_line_bases(block_n):
    """The mma.sync tiles' V4 raw tile [tokens, 8 groups, 64 bytes] in shared memory, as a
    linear layout's bases (what each bit of a byte's offset adds, by xor, to its [token,
    group, byte]): planes of two groups (128 bytes, a token's line as the loader copies
    it), token after token, the plane's two 64-byte halves swapped on odd tokens, so that
    the two tokens of an ldmatrix matrix (one group) fall in different banks and a copied
    line stays whole."""
    bases = [[0, 0, 1 << i] for i in range(6)]  # the 64 bytes of a group
    bases.append([0, 1, 0])  # the half: the group's low bit ...
    bases.append([1, 1, 0])  # ... xor the token's low bit
    bases += [[1 << i, 0, 0] for i in range(1, block_n.bit_length() - 1)]  # the token
    bases += [[0, 2, 0], [0, 4, 0]]  # the plane
    return bases


def ws_raw_v41_bases(block_n):
    """A V4.1 raw tile [tokens, 16 groups, 32 bytes] in shared memory, as a linear layout's
    bases (what each bit of a byte's offset adds, by xor, to its [token, group, byte]):
    token after token (its 512-byte row whole, as the loader copies it), in 16-byte pieces
    whose place within the row is the piece's xor the token's low three bits (the group's
    low two bits with the token's bits 0 and 2, the half with bit 1). A warp's FP8
    dequantization load of one group reads tokens {0, 1, 4, 5} (+2, +8k;
    `ws_dequant_v41_bases`): their 32-byte pieces then fall in different banks. An FP4
    extra cache's dequantization reads 8 tokens' same 16-byte piece per quarter-warp
    (`ws_dequant_fp4_bases`, the same bytes seen as `ws_raw_fp4_view_bases`): in 8 banks'
    quads. Token-major, both read 512 bytes apart: the same banks."""
    bases = [[0, 0, 1 << i] for i in range(5)]  # the 32 bytes of a group
    bases += [[0, 1 << i, 0] for i in range(4)]  # the group
    bases += [[1, 1, 0], [2, 0, 16], [4, 2, 0]]  # the token's bits 0-2, xor the piece's
    bases += [[1 << i, 0, 0] for i in range(3, block_n.bit_length() - 1)]  # the token
    return bases


def ws_raw_fp4_view_bases(block_n):
    """`ws_raw_v41_bases` seen as [tokens, 64 pieces of 8 bytes, 8 bytes]: the FP4 extra
    cache's view of the same buffer (its dequantization reinterprets it)."""
    bases = [[0, 0, 1 << i] for i in range(3)]  # the 8 bytes of a scale group's codes
    bases += [[0, 1 << i, 0] for i in range(6)]  # the 8-byte piece
    bases += [[1, 4, 0], [2, 2, 0], [4, 8, 0]]  # as `ws_raw_v41_bases`, in 8-byte pieces
    bases += [[1 << i, 0, 0] for i in range(3, block_n.bit_length() - 1)]  # the token
    return bases


def ws_dequant_fp4_bases(cw):
    """The FP4 dequantization's register layout over one step's [16 rows, 32 pieces of 8
    bytes, 8 bytes] (`cw` = 4 or 8 warps), as (register, lane, warp bases, shape): a thread
    holds 2 whole scale groups of a row (16 bytes, 32 values: their 2 scales in
    registers); lanes 0-7 of each quarter-warp take rows 0-7 at the same column, so that
    its 16-byte stores into the K tile (16-byte pieces xor the row mod 8) fill a bank row
    (one thread's 64 contiguous bytes, 8 lanes of a row 64 bytes apart, took four times
    the wavefronts)."""
    reg = [[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 1, 0]]
    lane = [[1, 0, 0], [2, 0, 0], [4, 0, 0], [0, 2, 0], [0, 4, 0]]
    warp = [[0, 8, 0], [0, 16, 0]]
    if cw == 8:
        warp.append([8, 0, 0])
    else:
        reg.append([8, 0, 0])
    return reg, lane, warp, [16, 32, 8]


def ws_dequant_v41_bases(cw, block_n):
    """The V4.1 FP8 dequantization's register layout over one step's [rows, 16 groups, 32
    bytes] (`cw` warps), as (register, lane, warp bases, shape): a thread holds all 16 groups
    of its row's 4 byte columns, one scale load per row; a warp's lanes take rows 0 and 4
    (lanes 0-15) and 1 and 5 (16-31), not 4 consecutive rows: each half-warp's 8-byte stores
    to the K tile (64 bytes a row per group, in the tile's swizzle of 16-byte pieces by row
    mod 8) then fill both halves of a bank row, where rows 0 and 1 land in the same half
    (twice the wavefronts; Triton's own bank model agrees: `scripts/bank_conflicts.py`).
    The wide tile (16 tokens: fewer than 4 rows a warp): 2 byte columns a thread, 2
    consecutive rows a warp, as before."""
    warp_bits = (cw - 1).bit_length()
    if 4 * cw <= block_n:
        reg = [[0, 0, 1], [0, 0, 2]] + [[0, 1 << i, 0] for i in range(4)]
        lane = [[0, 0, 4], [0, 0, 8], [0, 0, 16], [4, 0, 0], [1, 0, 0]]
        rows = [2] + [8 << i for i in range(warp_bits - 1)]
        return reg, lane, [[r, 0, 0] for r in rows], [4 * cw, 16, 32]
    reg = [[0, 0, 1]] + [[0, 1 << i, 0] for i in range(4)]
    lane = [[0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 0, 16], [4, 0, 0]]
    rows = [1, 2] + [8 << i for i in range(warp_bits - 2)]
    return reg, lane, [[r, 0, 0] for r in rows], [2 * cw, 16, 32]


def ws_halves_bases(rows):
    """The mma.sync tiles' [rows, 512] fp16 buffers (q, the K tile: 16-byte pieces xor the
    row mod 8, `SwizzledSharedLayout(8, 1, 8)`) seen as [rows, 2 halves, 256 dims], as a linear
    layout's bases (what each bit of an element's offset adds, by xor, to its [row, half,
    dim]): the token-major tile's batched products run over the two halves of the dims."""
    bases = [[0, 0, 1 << i] for i in range(8)]  # the dim within its half
    bases.append([0, 1, 0])  # the half
    bases += [[1 << i, 0, 8 << i] for i in range(3)]  # the row's low bits, xor the piece's
    bases += [[1 << i, 0, 0] for i in range(3, rows.bit_length() - 1)]  # the row
    return bases


def ws_build(
    tile: tuple[int, int],
    has_extra: bool = False,
    e_fmt: int = FMT_V4,
    pow2_pages: bool = True,
    dependents: bool = False,
) -> dict:
    """The launch options of `_ws_split_kernel` in `tile` (heads, tokens), on one cache or two
    (`has_extra`, the extra one of format `e_fmt`; `pow2_pages`: both page sizes powers of
    two): mma.sync or not, its raw slots, its consumer warps, its loader's registers, (where
    set) its register cap, q's groups an mma.sync tile holds in registers (`WS_SYNC_Q_HELD`),
    and whether its programs signal the combine launched as their programmatic dependent
    (`dependents`): the wgmma tile and the small dual-cache calls' long mma.sync tile (session
    32: 1.01-1.04x, both orders); the other mma.sync builds measured 0.94-1.04x with it
    (session 27)."""
    q_held = WS_SYNC_Q_HELD.get(tile, 0)
    if tile in ((WS_FEW_BLOCK_H, WS_FEW_BLOCK_N), WS_TM_TILE):
        return dict(MMA_SYNC=True, NR=WS_FEW_RAW_SLOTS, num_warps=WS_FEW_WARPS,
                    maxnreg=WS_FEW_MAXNREG, LOADER_REGS=WS_LOADER_REGS,
                    Q_HELD=q_held, LAUNCH_DEPENDENTS=False,
                    TOKEN_MAJOR=tile == WS_TM_TILE)  # fmt: skip
    sync = tile in WS_SYNC_TILES
    more = has_extra and not sync and (e_fmt == FMT_V41_FP4 or not pow2_pages)
    loader = WS_DUAL_LOADER_REGS if more else WS_LOADER_REGS
    signals = dependents and (not sync or tile == WS_SYNC_LONG_TILE)
    return dict(MMA_SYNC=sync, NR=WS_SYNC_RAW_SLOTS if sync else WS_RAW_SLOTS, num_warps=8,
                LOADER_REGS=loader, Q_HELD=q_held, LAUNCH_DEPENDENTS=signals,
                TOKEN_MAJOR=False)  # fmt: skip


if HAS_GLUON:
    # The Gluon loops' product operands: fp16, not bf16. e4m3 -> fp16 is one paired
    # conversion and the UE8M0 scale one paired multiply (bf16 went through float32: two
    # conversions and two multiplies per pair; 43% fewer instructions per tile's
    # dequantization, 1.03-1.06x on the rows of these loops, session 19). Every code times
    # its scale is exact in fp16 for scale bytes 113-134 (values below 2^-14 round to fp16's
    # subnormal step, 2^-24: absolute error under 3e-8); from 135 up (a group's largest value
    # past 57,344) the largest codes overflow (docs/kernel-contract.md). q is scaled per
    # program (`_ws_q_f16`), P in [0, 1] gains precision (2^-11 against bf16's 2^-8).
    WS_OPERAND = gl.constexpr(gl.float16)

    @gluon.jit
    def _ws_page_slot(idx, psize, pshift, POW2: gl.constexpr):
        """(page, slot) of non-negative token ids: shifts where both caches' page sizes are
        powers of two (SGLang's 64 and 256), else a division by the runtime page size (~20
        instructions each: the loader computes 13 a thread per tile)."""
        if POW2:
            return idx >> pshift, idx & (psize - 1)
        else:
            return idx // psize, idx % psize

    @gluon.jit
    def _ws_tile(j, n_main, b, start, end, e_start, e_end,
                 KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib,
                 stride_it,
                 EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr,
                 stride_eib, stride_eit, BLOCK_N: gl.constexpr):  # fmt: skip
        """Tile j of a split: the main cache's tiles, then the extra cache's. Returns its first
        position, its end, and its cache's pointers and geometry."""
        # selects, not branches: an argument Triton specialised (a page size or stride of 1)
        # is a constant in one cache and a value in the other
        main = j < n_main
        t0 = gl.where(main, start + j * BLOCK_N, e_start + (j - n_main) * BLOCK_N)
        lim = gl.where(main, end, e_end)
        kv8 = gl.where(main, KV8, EKV8)
        kvu = gl.where(main, KVU, EKVU)
        kvb = gl.where(main, KVB, EKVB)
        stride_page = gl.where(main, stride_kv_page, stride_ekv_page).to(gl.int64)
        psize = gl.where(main, page_size, e_page_size)
        ntok = gl.where(main, num_tokens, e_num_tokens)
        idx_row = gl.where(main, IDX_ptr + b.to(gl.int64) * stride_ib,
                           EIDX_ptr + b.to(gl.int64) * stride_eib)  # fmt: skip
        s_it = gl.where(main, stride_it, stride_eit)
        return t0, lim, kv8, kvu, kvb, stride_page, psize, ntok, idx_row, s_it

    @gluon.jit
    def _ws_issue(j, n_tiles, n_main, raw8, rawr, raws, b, start, end, e_start, e_end,
                  KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib,
                  stride_it,
                  EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr,
                  stride_eib, stride_eit, page_shift, e_page_shift, NR: gl.constexpr,
                  BLOCK_N: gl.constexpr, FMT: gl.constexpr, E_FMT: gl.constexpr,
                  POW2: gl.constexpr):  # fmt: skip
        """cp.async of tile j's rows into raw slot j % NR: V4 (FMT 0): fp8 nope (7 groups of 64
        bytes), bf16 rope (64 values), the 8 scale bytes; V4.1 FP8 (FMT 1): the 512 fp8 bytes
        (16 groups of 32) and the 16 scale bytes; a V4.1 FP4 extra cache (E_FMT 2): its tiles'
        256 data bytes and 32 scale bytes. Masked off past the last tile and for
        invalid slots (their rows are never read: S is -inf there)."""
        t0, lim, kv8, kvu, kvb, stride_page, psize, ntok, idx_row, s_it = _ws_tile(
            j, n_main, b, start, end, e_start, e_end,
            KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib, stride_it,
            EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr, stride_eib,
            stride_eit, BLOCK_N,
        )  # fmt: skip
        slot = j % NR
        live = j < n_tiles
        pshift = gl.where(j < n_main, page_shift, e_page_shift)
        if FMT == 1:
            if E_FMT == 2:
                if j < n_main:
                    _ws_issue_v41(raw8.index(slot), raws.index(slot).slice(0, 16, dim=1), live,
                                  t0, lim, kv8, kvu, stride_page, psize, pshift, ntok, idx_row,
                                  s_it, BLOCK_N, False, POW2)  # fmt: skip
                else:
                    _ws_issue_v41(raw8.index(slot), raws.index(slot), live, t0, lim, kv8, kvu,
                                  stride_page, psize, pshift, ntok, idx_row, s_it, BLOCK_N,
                                  True, POW2)  # fmt: skip
            else:
                _ws_issue_v41(raw8.index(slot), raws.index(slot), live, t0, lim, kv8, kvu,
                              stride_page, psize, pshift, ntok, idx_row, s_it, BLOCK_N, False,
                              POW2)  # fmt: skip
        else:
            _ws_issue_v4(raw8, rawr, raws, slot, live, t0, lim, kv8, kvu, kvb, stride_page,
                         psize, pshift, ntok, idx_row, s_it, BLOCK_N, POW2)  # fmt: skip

    @gluon.jit
    def _ws_issue_v4(raw8, rawr, raws, slot, live, t0, lim, kv8, kvu, kvb, stride_page, psize,
                     pshift, ntok, idx_row, s_it, BLOCK_N: gl.constexpr,
                     POW2: gl.constexpr):  # fmt: skip
        """`_ws_issue` for a V4 cache: a slot's 448 fp8 bytes (7 groups of 64) and 64 bf16 rope
        values at `slot * 576` in its page, its 8 scale bytes at `P * 576 + slot * 8`."""
        c8: gl.constexpr = gl.BlockedLayout([1, 1, 16], [2, 4, 4], [4, 1, 1], [2, 1, 0])
        cr: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        cs: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [4, 1], [1, 0])
        # fp8 nope
        t = t0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, c8)))
        idx = gl.load(idx_row + t * s_it, mask=(t < lim) & live, other=-1)
        valid = (idx >= 0) & (idx < ntok)
        idx = gl.where(valid, idx, 0)
        pg, sl = _ws_page_slot(idx, psize, pshift, POW2)
        base = pg.to(gl.int64) * stride_page + sl.to(gl.int64) * 576
        grp = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, c8)))
        col = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, c8)))
        offs = (grp * 64)[None, :, None] + col[None, None, :]
        async_copy.async_copy_global_to_shared(
            raw8.index(slot), kv8 + base[:, None, None] + offs,
            mask=valid[:, None, None] & (grp < 7)[None, :, None],
        )  # fmt: skip
        # bf16 rope, after the 448 fp8 bytes
        tr = t0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cr))
        idr = gl.load(idx_row + tr * s_it, mask=(tr < lim) & live, other=-1)
        vr = (idr >= 0) & (idr < ntok)
        idr = gl.where(vr, idr, 0)
        pg, sl = _ws_page_slot(idr, psize, pshift, POW2)
        br = pg.to(gl.int64) * stride_page + sl.to(gl.int64) * 576
        rc = gl.arange(0, 64, layout=gl.SliceLayout(0, cr))
        async_copy.async_copy_global_to_shared(
            rawr.index(slot), kvb + (br[:, None] + 448) // 2 + rc[None, :], mask=vr[:, None]
        )
        # scale bytes: 7 UE8M0 exponents + pad, after the page's data rows
        ts = t0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cs))
        ids = gl.load(idx_row + ts * s_it, mask=(ts < lim) & live, other=-1)
        vs = (ids >= 0) & (ids < ntok)
        ids = gl.where(vs, ids, 0)
        pg, sl = _ws_page_slot(ids, psize, pshift, POW2)
        bs = pg.to(gl.int64) * stride_page + psize * 576 + sl.to(gl.int64) * 8
        sc = gl.arange(0, 8, layout=gl.SliceLayout(0, cs))
        async_copy.async_copy_global_to_shared(
            raws.index(slot), kvu + bs[:, None] + sc[None, :], mask=vs[:, None]
        )

    @gluon.jit
    def _ws_issue_v41(raw8_s, raws_s, live, t0, lim, kv8, kvu, stride_page, psize, pshift, ntok,
                      idx_row, s_it, BLOCK_N: gl.constexpr, FP4: gl.constexpr,
                      POW2: gl.constexpr):  # fmt: skip
        """`_ws_issue` for a V4.1 cache into one raw slot (`raw8_s`, `raws_s`), its data row
        as 16 groups of 32 bytes (docs/kernel-contract.md). FP8: a token's 512 data bytes at
        `slot * 512` in its page, its 16 scale bytes (UE8M0, one per 32 values) at `P * 512 +
        slot * 16`. FP4 (an extra cache): its 256 bytes of e2m1 pairs at `slot * 256`, into
        the row's first 8 groups, its 32 scale bytes (e4m3, one per 16 values) at `P * 256 +
        slot * 32`."""
        c8: gl.constexpr = gl.BlockedLayout([1, 1, 16], [2, 8, 2], [4, 1, 1], [2, 1, 0])
        if FP4:
            ROW_BYTES: gl.constexpr = 256
            SCALES: gl.constexpr = 32
            cs: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0])
        else:
            ROW_BYTES: gl.constexpr = 512
            SCALES: gl.constexpr = 16
            cs: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [4, 1], [1, 0])
        t = t0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, c8)))
        idx = gl.load(idx_row + t * s_it, mask=(t < lim) & live, other=-1)
        valid = (idx >= 0) & (idx < ntok)
        idx = gl.where(valid, idx, 0)
        pg, sl = _ws_page_slot(idx, psize, pshift, POW2)
        base = pg.to(gl.int64) * stride_page + sl.to(gl.int64) * ROW_BYTES
        grp = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, c8)))
        col = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, c8)))
        offs = (grp * 32)[None, :, None] + col[None, None, :]
        mask = valid[:, None, None]
        if FP4:
            mask = mask & (grp < 8)[None, :, None]
        async_copy.async_copy_global_to_shared(raw8_s, kv8 + base[:, None, None] + offs, mask=mask)
        ts = t0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cs))
        ids = gl.load(idx_row + ts * s_it, mask=(ts < lim) & live, other=-1)
        vs = (ids >= 0) & (ids < ntok)
        ids = gl.where(vs, ids, 0)
        pg, sl = _ws_page_slot(ids, psize, pshift, POW2)
        bs = pg.to(gl.int64) * stride_page + psize * ROW_BYTES + sl.to(gl.int64) * SCALES
        sc = gl.arange(0, SCALES, layout=gl.SliceLayout(0, cs))
        async_copy.async_copy_global_to_shared(
            raws_s, kvu + bs[:, None] + sc[None, :], mask=vs[:, None]
        )

    @gluon.jit
    def _ws_loader(raw8, rawr, raws, raw_full, raw_empty, n_tiles, n_main, b, start, end,
                   e_start, e_end,
                   KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib,
                   stride_it,
                   EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr,
                   stride_eib, stride_eit, page_shift, e_page_shift, NR: gl.constexpr,
                   BLOCK_N: gl.constexpr, FMT: gl.constexpr, E_FMT: gl.constexpr,
                   POW2: gl.constexpr):  # fmt: skip
        """Worker partition: tile i's copies once the consumer freed slot i % NR; raw_full of
        tile i - (NR - 1) arrives when this partition's copies of it have landed."""
        for i in range(n_tiles + NR - 1):
            if i < n_tiles:
                mbarrier.wait(raw_empty.index(i % NR), ((i // NR) & 1) ^ 1)
                _ws_issue(
                    i, n_tiles, n_main, raw8, rawr, raws, b, start, end, e_start, e_end,
                    KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib,
                    stride_it,
                    EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr,
                    stride_eib, stride_eit, page_shift, e_page_shift, NR, BLOCK_N, FMT, E_FMT,
                    POW2,
                )  # fmt: skip
            async_copy.commit_group()  # one group per iteration (empty past the last tile)
            j = i - (NR - 1)
            if j >= 0:
                async_copy.wait_group(NR - 1)
                gl.thread_barrier()  # every loader thread's copies of tile j landed
                mbarrier.arrive(raw_full.index(j % NR), count=1)

    @gluon.jit
    def _ws_tile_in(i, slot, n_main, b, start, end, e_start, e_end,
                    KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib,
                    stride_it,
                    EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr,
                    stride_eib, stride_eit, cols, g, k_smem, raw8, rawr, raws, raw_full,
                    NR: gl.constexpr, BLOCK_N: gl.constexpr, ROWS: gl.constexpr,
                    L3: gl.constexpr, FMT: gl.constexpr, E_FMT: gl.constexpr,
                    CW: gl.constexpr):  # fmt: skip
        """A consumer's tile i (both consumers): its valid slots (in `cols`' layout), and, once
        the loader's copies landed, raw slot `slot` dequantized into k_smem in its cache's
        format (FMT, E_FMT; CW: the consumer warps), ROWS rows at a time in layout L3 (`g`: V4's
        group index, made once outside the tile loop)."""
        t0, lim, kv8, kvu, kvb, stride_page, psize, ntok, idx_row, s_it = _ws_tile(
            i, n_main, b, start, end, e_start, e_end,
            KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib, stride_it,
            EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr, stride_eib,
            stride_eit, BLOCK_N,
        )  # fmt: skip
        t = t0 + cols
        idx = gl.load(idx_row + t * s_it, mask=t < lim, other=-1)
        valid = (idx >= 0) & (idx < ntok)
        mbarrier.wait(raw_full.index(slot), (i // NR) & 1)
        if FMT == 1:
            if E_FMT == 2:
                if i < n_main:
                    _ws_dequant_v41(raw8.index(slot), raws.index(slot).slice(0, 16, dim=1),
                                    k_smem, BLOCK_N, ROWS, L3)  # fmt: skip
                else:
                    _ws_dequant_fp4(raw8.index(slot), raws.index(slot), k_smem, BLOCK_N, CW)
            else:
                _ws_dequant_v41(raw8.index(slot), raws.index(slot), k_smem, BLOCK_N, ROWS, L3)
        else:
            _ws_dequant_v4(slot, g, k_smem, raw8, rawr, raws, BLOCK_N, ROWS, L3)
        return valid

    @gluon.jit
    def _ws_dequant_v4(slot, g, k_smem, raw8, rawr, raws, BLOCK_N: gl.constexpr,
                       ROWS: gl.constexpr, L3: gl.constexpr):  # fmt: skip
        """Raw slot `slot` of a V4 cache into k_smem: x = fp8 * 2^(e - 127) for the 7 nope
        groups, the rope as is in group 7 (`g`), in fp16; L3 over [ROWS, 8, 64]."""
        for r in gl.static_range(BLOCK_N // ROWS):
            x8 = raw8.index(slot).slice(r * ROWS, ROWS).load(L3)
            e8 = raws.index(slot).slice(r * ROWS, ROWS).load(gl.SliceLayout(2, L3))
            rope = rawr.index(slot).slice(r * ROWS, ROWS).load(gl.SliceLayout(1, L3))
            # 2^(e - 127) from its float bits, then fp16 (bytes under 103 are 0 there)
            sc = (e8.to(gl.int32) << 23).to(gl.float32, bitcast=True).to(WS_OPERAND)
            x = x8.to(WS_OPERAND) * sc[:, :, None]
            val = gl.where((g == 7)[None, :, None], rope.to(WS_OPERAND)[:, None, :], x)
            k_smem.slice(r * ROWS, ROWS).store(gl.reshape(val, [ROWS, 512]))

    @gluon.jit
    def _ws_dequant_v41(raw8_s, raws_s, k_smem, BLOCK_N: gl.constexpr, ROWS: gl.constexpr,
                        L3: gl.constexpr):  # fmt: skip
        """A raw slot (`raw8_s`, `raws_s`) of a V4.1 FP8 cache into k_smem: x = fp8 *
        2^(e - 127), one scale byte per 32 values, in fp16; L3 over [ROWS, 16, 32] (a thread
        holds all 16 groups of its row's 4 columns, 2 in the wide tile: one 16-byte scale load
        per row). Byte 255 is NaN (float8_e8m0fnu), as in `_tile_k_v41`. SGLang's writer
        stores bytes 114 and up (scale >= 2^-13), where every code times its scale is exact in
        fp16 up to byte 134."""
        for r in gl.static_range(BLOCK_N // ROWS):
            x8 = raw8_s.slice(r * ROWS, ROWS).load(L3)
            e8 = raws_s.slice(r * ROWS, ROWS).load(gl.SliceLayout(2, L3))
            sc = (e8.to(gl.int32) << 23).to(gl.float32, bitcast=True)
            sc = gl.where(e8 == 255, float("nan"), sc).to(WS_OPERAND)
            x = x8.to(WS_OPERAND) * sc[:, :, None]
            k_smem.slice(r * ROWS, ROWS).store(gl.reshape(x, [ROWS, 512]))

    @gluon.jit
    def _ws_dequant_fp4(raw8_s, raws_s, k_smem, BLOCK_N: gl.constexpr, CW: gl.constexpr):
        """A raw slot of a V4.1 FP4 extra cache into k_smem: x = e2m1 * e4m3 scale (one per 16
        values), in fp16. A thread holds 2 whole scale groups of a row (16 bytes, 32 values:
        their 2 scales in registers). An e2m1 code (sign bit 3, exponent bits 1-2, mantissa
        bit 0) is placed in fp16's bits 15 and 9-11 (2^-14 times its value, a subnormal at
        exponent 0) and multiplied by 2^14: exact (sm_90 has no e2m1 conversion); every code
        times its scale is exact in fp16 too (at most 2 + 4 significant bits, 2^-10 to
        2,688)."""
        ROWS: gl.constexpr = 16
        L4: gl.constexpr = _ws_dequant_fp4_layout(CW)
        bytes_s = raw8_s._reinterpret(gl.uint8, [BLOCK_N, 64, 8],
                                      _ws_raw_fp4_view_layout(BLOCK_N))  # fmt: skip
        for r in gl.static_range(BLOCK_N // ROWS):
            b = bytes_s.slice(r * ROWS, ROWS).slice(0, 32, dim=1).load(L4).to(gl.int16)
            s8 = raws_s.slice(r * ROWS, ROWS).load(gl.SliceLayout(2, L4))
            sc = s8.to(gl.float8e4nv, bitcast=True).to(WS_OPERAND)[:, :, None]
            lo = (((b & 8) << 12) | ((b & 7) << 9)).to(WS_OPERAND, bitcast=True)
            hi = (((b & 0x80) << 8) | ((b & 0x70) << 5)).to(WS_OPERAND, bitcast=True)
            x = gl.join(lo * 16384.0 * sc, hi * 16384.0 * sc)  # value 2i low nibble, 2i+1 high
            k_smem.slice(r * ROWS, ROWS).store(gl.reshape(x, [ROWS, 512]))

    # (Triton's compiler follows only its own kinds of function from a kernel.)
    _ws_raw_v4_line_bases = gluon.constexpr_function(ws_raw_v4_line_bases)
    _ws_raw_v41_bases = gluon.constexpr_function(ws_raw_v41_bases)
    _ws_raw_fp4_view_bases = gluon.constexpr_function(ws_raw_fp4_view_bases)
    _ws_dequant_v41_bases = gluon.constexpr_function(ws_dequant_v41_bases)
    _ws_dequant_fp4_bases = gluon.constexpr_function(ws_dequant_fp4_bases)
    _ws_halves_bases = gluon.constexpr_function(ws_halves_bases)

    @gluon.constexpr_function
    def _ws_halves_layout(rows):
        """An mma.sync tile's [rows, 512] buffer as [rows, 2, 256] (`ws_halves_bases`)."""
        return gl.SharedLinearLayout(_ws_halves_bases(rows))

    @gluon.constexpr_function
    def _ws_raw_v41_layout(block_n):
        """A V4.1 raw tile [tokens, 16 groups, 32 bytes] in shared memory (FP8, and an FP4
        extra cache's tiles in the same buffer): `ws_raw_v41_bases`."""
        return gl.SharedLinearLayout(_ws_raw_v41_bases(block_n))

    @gluon.constexpr_function
    def _ws_raw_fp4_view_layout(block_n):
        """The same buffer as [tokens, 64, 8] bytes (`ws_raw_fp4_view_bases`)."""
        return gl.SharedLinearLayout(_ws_raw_fp4_view_bases(block_n))

    @gluon.constexpr_function
    def _ws_dequant_fp4_layout(cw):
        reg, lane, warp, shape = _ws_dequant_fp4_bases(cw)
        return gl.DistributedLinearLayout(reg, lane, warp, [], shape)

    @gluon.constexpr_function
    def _ws_raw_v4_layout(block_n, lines):
        """A V4 raw tile [tokens, 8 groups, 64 bytes] in shared memory. lines (the mma.sync
        tiles): `ws_raw_v4_line_bases`. Else group-major (a group's 64 bytes of every token,
        then the next group): the wgmma loop's B128 dual row read 3% slower in lines
        (session 30)."""
        if not lines:
            return gl.SwizzledSharedLayout(1, 1, 1, [2, 0, 1])
        return gl.SharedLinearLayout(_ws_raw_v4_line_bases(block_n))

    @gluon.constexpr_function
    def _ws_groups(fmt):
        """Scale groups of a main-cache row as the dequantization holds it (V4.1 FP8: 16 of
        32 values; V4: 8 of 64, the 8th the rope)."""
        return 16 if fmt == 1 else 8

    @gluon.constexpr_function
    def _ws_dequant_rows(fmt, cw, block_n):
        """Rows of a K tile dequantized per step by `cw` consumer warps: V4.1 FP8 takes 4 per
        warp where the tile has them (4 columns a thread); V4 32 in the wgmma tile's 64 rows,
        else 16. Each step's store to the K tile ends at a barrier (Triton's shared-memory
        analysis sees the steps' stores to one buffer as conflicting): 2 steps instead of 4
        measured 1.02-1.03x on the wgmma rows, 1 instead of 2 in the mma.sync tiles 0.96-1.01x
        (session 23)."""
        if fmt == 1 and 4 * cw <= block_n:
            return 4 * cw
        return 32 if block_n == WS_BLOCK_N else 16

    @gluon.constexpr_function
    def _ws_dequant_layout(fmt, cw, block_n):
        """The main cache's dequantization layout, a thread holding all scale groups of its
        row's columns (each value's scale in registers, one scale load per row): V4 [ROWS, 8,
        64], 4 columns (the rope group's select and wasted dequantization vanish at compile
        time); V4.1 FP8 [ROWS, 16, 32], 4 columns (4-byte loads, 8-byte stores) or, where the
        tile has fewer rows (the wide tile's 16), 2."""
        if fmt != 1:
            return gl.BlockedLayout([1, 8, 4], [2, 1, 16], [cw, 1, 1], [2, 1, 0])
        reg, lane, warp, shape = _ws_dequant_v41_bases(cw, block_n)
        return gl.DistributedLinearLayout(reg, lane, warp, [], shape)

    @gluon.jit
    def _ws_q_f16(q, qk_scale_log2):
        """q (bf16) as the fp16 operand of the products, scaled by a power of two 2^-k that
        keeps its largest finite magnitude under 2^15 (k = 0 unless it is 2^15 or more: exact;
        bf16's range would overflow fp16), and the softmax's scale times 2^k to undo it. A
        non-finite entry stays one in its head's row and does not set k (the other heads of
        the block are computed as if it were finite)."""
        qf = q.to(gl.float32)
        qa = gl.abs(qf)
        amax = gl.max(gl.max(gl.where(qa < float("inf"), qa, 0.0), axis=1), axis=0)
        k = gl.maximum(((amax.to(gl.int32, bitcast=True) >> 23) & 0xFF) - 141, 0)
        down = ((127 - k) << 23).to(gl.float32, bitcast=True)
        up = ((127 + k) << 23).to(gl.float32, bitcast=True)
        return (qf * down).to(WS_OPERAND), qk_scale_log2 * up

    @gluon.jit
    def _ws_q_to_smem(q_smem, Q_ptr, stride_qb, stride_qh, b, h0, H, keep, qk_scale_log2,
                      BLOCK_H: gl.constexpr, NW: gl.constexpr):  # fmt: skip
        """A consumer's q rows h0.. of request b (zero where `keep` is false or past H) into
        q_smem as `_ws_q_f16`'s operand (NW: the consumer's warps); returns the softmax's
        scale that undoes its power of two."""
        q = _ws_q_load(Q_ptr, stride_qb, stride_qh, b, h0, H, keep, BLOCK_H, NW)
        return _ws_q_store(q_smem, q, qk_scale_log2)

    @gluon.jit
    def _ws_prefetch_start(Q_ptr, stride_qb, stride_qh, b, h0, H, IDX_ptr, stride_ib,
                           stride_it, topk, EIDX_ptr, stride_eib, stride_eit, e_topk,
                           BLOCK_H: gl.constexpr, HAS_EXTRA: gl.constexpr,
                           NW: gl.constexpr):  # fmt: skip
        """An L2 prefetch of what a program's start reads from DRAM before its first tile: q's
        rows h0.. (1 KB each, at most H) and the request's index rows, one 128-byte line a
        thread, issued as soon as b is known. Every address is one the program reads."""
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
        LINES: gl.constexpr = 32 * NW
        line = gl.arange(0, LINES, layout=layout)
        q_row = Q_ptr + b.to(gl.int64) * stride_qb
        for l0 in gl.static_range(0, BLOCK_H * 8, LINES):  # 8 lines a row of q
            head = gl.minimum(h0 + (l0 + line) // 8, H - 1)
            ptr = q_row + head.to(gl.int64) * stride_qh + ((l0 + line) % 8) * 64
            gl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [ptr],
                                      dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip
        _ws_prefetch_row(IDX_ptr + b.to(gl.int64) * stride_ib, stride_it, topk, line, LINES)
        if HAS_EXTRA:
            _ws_prefetch_row(EIDX_ptr + b.to(gl.int64) * stride_eib, stride_eit, e_topk, line,
                             LINES)  # fmt: skip

    @gluon.jit
    def _ws_prefetch_row(row, stride, n, line, LINES: gl.constexpr):
        """`_ws_prefetch_start`'s L2 prefetch of a row of n int32 at `stride`: entries 0, 32,
        64, ... (each line of a unit-stride row), one a lane; never past the row's last entry
        (a stride of 0 prefetches its one entry)."""
        lines = gl.cdiv(n, 32)
        for l0 in range(0, lines, LINES):
            at = (gl.minimum(l0 + line, lines - 1) * 32).to(gl.int64) * stride
            gl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [row + at],
                                      dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip

    @gluon.jit
    def _ws_q_load(Q_ptr, stride_qb, stride_qh, b, h0, H, keep, BLOCK_H: gl.constexpr,
                   NW: gl.constexpr):  # fmt: skip
        """`_ws_q_to_smem`'s load: q rows h0.. of request b in registers."""
        ql: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        qh = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ql))
        qd = gl.arange(0, 512, layout=gl.SliceLayout(0, ql))
        return gl.load(
            Q_ptr + b.to(gl.int64) * stride_qb + qh[:, None].to(gl.int64) * stride_qh
            + qd[None, :],
            mask=(qh < H)[:, None] & keep,
            other=0.0,
        )  # fmt: skip

    @gluon.jit
    def _ws_q_store(q_smem, q, qk_scale_log2):
        """`_ws_q_to_smem`'s store: q as `_ws_q_f16`'s operand; returns its scale."""
        q16, qk_scale_log2 = _ws_q_f16(q, qk_scale_log2)
        q_smem.store(q16)
        return qk_scale_log2

    @gluon.jit
    def _ws_probs(s, valid, m_i, qk_scale_log2):
        """`_online_softmax_step` for the Gluon consumers (which cannot call a `@triton.jit`
        helper), without the sum: P of the tile's scores, the old sum's rescale alpha and the
        new max."""
        s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        return gl.exp2(s - m_use[:, None]), alpha, m_new

    @gluon.jit
    def _ws_softmax(s, valid, m_i, l_i, qk_scale_log2):
        """`_ws_probs` and the new row sum."""
        p, alpha, m_new = _ws_probs(s, valid, m_i, qk_scale_log2)
        return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)

    @gluon.jit
    def _ws_softmax_lazy(s, valid, m_i, l_part, qk_scale_log2):
        """`_ws_softmax` with the row sums kept per element (`l_part`, S's shape), added up
        once after the loop: in the mma.sync tiles a row's tokens span the warps, so each
        tile's sum was a cross-warp reduction through shared memory and a barrier (session
        21: 1.04-1.06x on the few-head tile, 1.06-1.11x on the sm_120 row's proxy rows; on
        the wgmma loop, whose row spans two warpgroups, 0.93-0.96x: not used there)."""
        p, alpha, m_new = _ws_probs(s, valid, m_i, qk_scale_log2)
        return p, alpha, m_new, l_part * alpha[:, None] + p

    @gluon.jit
    def _ws_consumer(q_smem, k_smem, raw8, rawr, raws, raw_full, raw_empty, n_tiles, n_main, b,
                     start, end, e_start, e_end,
                     KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib,
                     stride_it,
                     EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr,
                     stride_eib, stride_eit, qk_scale_log2, few_pre,
                     Q_ptr, stride_qb, stride_qh, h0, H, length, topk, e_length, e_topk,
                     NR: gl.constexpr,
                     BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, s_layout: gl.constexpr,
                     o_layout: gl.constexpr, HAS_EXTRA: gl.constexpr,
                     EXACT_BELOW: gl.constexpr, COUNT_BLOCK: gl.constexpr,
                     EXACT_IN: gl.constexpr, ONLY_FEW: gl.constexpr,
                     FMT: gl.constexpr, E_FMT: gl.constexpr):  # fmt: skip
        """Default partition: q into shared memory and the request's valid-index count (one
        cache; with two, `few_pre`, counted before the fork) while the loader's first copies
        fly; then per tile: dequantize raw tile i into k_smem (x = fp8 * 2^(e - 127), rope as
        is), free the raw slot, S, the online softmax and PV. A request left to the exact
        launch consumes its tiles without computing; EXACT_IN: a few-token request is
        computed here, P's bf16 rounding residue added by a second PV product (the exact
        launch's P_hi + P_lo, without its doubled tile). ONLY_FEW (with EXACT_IN): the request
        is a few-token one (the kernel counted), computed exact."""
        qk_scale_log2 = _ws_q_to_smem(q_smem, Q_ptr, stride_qb, stride_qh, b, h0, H,
                                      True, qk_scale_log2, BLOCK_H, 8)  # fmt: skip
        fence_async_shared()
        gl.thread_barrier()  # q stored by every consumer warp before the first wgmma
        skipped = n_tiles < 0  # False: a scalar to assign below
        exact = n_tiles < 0
        if ONLY_FEW:
            exact = n_tiles >= 0  # True
        elif EXACT_BELOW > 0:
            if HAS_EXTRA:
                few = few_pre  # counted before the fork
            else:
                few = _ws_few_tokens(b, IDX_ptr, stride_ib, stride_it, length, topk, num_tokens,
                                     EIDX_ptr, stride_eib, stride_eit, e_length, e_topk,
                                     e_num_tokens, HAS_EXTRA, EXACT_BELOW, COUNT_BLOCK,
                                     8)  # fmt: skip
            if EXACT_IN:
                exact = few
            else:
                skipped = few
        n_compute = gl.where(skipped, 0, n_tiles)
        CW: gl.constexpr = 8  # consumer warps
        ROWS: gl.constexpr = _ws_dequant_rows(FMT, CW, BLOCK_N)
        L3: gl.constexpr = _ws_dequant_layout(FMT, CW, BLOCK_N)
        g = gl.arange(0, _ws_groups(FMT), layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout)
        for i in range(n_compute):
            slot = i % NR
            valid = _ws_tile_in(
                i, slot, n_main, b, start, end, e_start, e_end,
                KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib,
                stride_it,
                EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr,
                stride_eib, stride_eit, cols, g, k_smem, raw8, rawr, raws, raw_full, NR,
                BLOCK_N, ROWS, L3, FMT, E_FMT, CW,
            )  # fmt: skip
            fence_async_shared()  # this thread's K stores, before wgmma reads them
            gl.thread_barrier()  # the whole tile stored; the raw slot read by every warp
            mbarrier.arrive(raw_empty.index(slot), count=1)
            s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), s_zero, use_acc=False)
            p, alpha, m_i, l_i = _ws_softmax(s, valid, m_i, l_i, qk_scale_log2)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            p_hi = p.to(WS_OPERAND)
            acc = warpgroup_mma(gl.convert_layout(p_hi, p_layout), k_smem, acc)
            if EXACT_IN:
                if exact:  # P's rounding residue: P_hi + P_lo is P to ~2^-16
                    p_lo = (p - p_hi.to(gl.float32)).to(WS_OPERAND)
                    acc = warpgroup_mma(gl.convert_layout(p_lo, p_layout), k_smem, acc)
            gl.thread_barrier()  # both warpgroups' PV done before the next tile overwrites K
        for i in range(n_compute, n_tiles):  # a skipped request: its slots handed back
            mbarrier.wait(raw_full.index(i % NR), (i // NR) & 1)
            mbarrier.arrive(raw_empty.index(i % NR), count=1)
        # l = -1 marks a request left to the exact launch (nothing is stored for it)
        l_i = gl.where(skipped, -1.0, l_i)
        return (
            acc,
            gl.convert_layout(m_i, gl.SliceLayout(1, o_layout)),
            gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)),
        )

    @gluon.jit
    def _ws_sync_start(q_smem, Q_ptr, stride_qb, stride_qh, b, h0, H, keep, qk_scale_log2,
                       n_tiles, IDX_ptr, stride_ib, stride_it, length, topk, num_tokens,
                       EIDX_ptr, stride_eib, stride_eit, e_length, e_topk, e_num_tokens,
                       BLOCK_H: gl.constexpr, CW: gl.constexpr, HAS_EXTRA: gl.constexpr,
                       EXACT_BELOW: gl.constexpr, COUNT_BLOCK: gl.constexpr,
                       EXACT_IN: gl.constexpr):  # fmt: skip
        """The mma.sync consumers' start (head- and token-major), while the loader's first
        copies fly: q (zero for a request `keep` leaves to the exact launch) into shared
        memory, visible to every consumer warp on return, and, with EXACT_IN, whether the
        request is a few-token one (computed exact). Returns (q's scale, exact)."""
        exact = n_tiles < 0  # False
        if EXACT_IN and EXACT_BELOW > 0:
            # q's load and the count's first index blocks in flight together, not one after
            # the other: a program's start is on the consumers' path (session 43, H100, with
            # the extra length loaded beside the length: the T1024 H8 causal prefill's split
            # launch 90.9 -> 86.2 us; with the plan's probe change T1024 H8 / H16 prefill
            # 1.03-1.05x, B64 H8 decode 1.04x; the sm_120 proxy 1.02-1.05x).
            q = _ws_q_load(Q_ptr, stride_qb, stride_qh, b, h0, H, keep, BLOCK_H, CW)
            idx_row = IDX_ptr + b.to(gl.int64) * stride_ib
            first = _ws_idx_first(idx_row, stride_it, topk, COUNT_BLOCK, CW)
            e_idx_row = EIDX_ptr + b.to(gl.int64) * stride_eib
            e_first = first
            if HAS_EXTRA:
                e_first = _ws_idx_first(e_idx_row, stride_eit, e_topk, COUNT_BLOCK, CW)
            qk_scale_log2 = _ws_q_store(q_smem, q, qk_scale_log2)
            n_valid = _ws_count_after(first, idx_row, stride_it, length, topk, num_tokens,
                                      COUNT_BLOCK, CW)  # fmt: skip
            if HAS_EXTRA:
                n_valid += _ws_count_after(e_first, e_idx_row, stride_eit, e_length, e_topk,
                                           e_num_tokens, COUNT_BLOCK, CW)  # fmt: skip
            exact = n_valid <= EXACT_BELOW
        else:
            qk_scale_log2 = _ws_q_to_smem(q_smem, Q_ptr, stride_qb, stride_qh, b, h0, H, keep,
                                          qk_scale_log2, BLOCK_H, CW)  # fmt: skip
        gl.thread_barrier()  # q stored by every consumer warp before it is read
        return qk_scale_log2, exact

    @gluon.jit
    def _ws_sync_consumer(q_smem, k_smem, raw8, rawr, raws, raw_full, raw_empty, n_tiles, n_main, b,
                         start, end, e_start, e_end,
                         KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib,
                         stride_it,
                         EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr,
                         stride_eib, stride_eit, qk_scale_log2, keep, Q_ptr, stride_qb,
                         stride_qh, h0, H, length, topk, e_length, e_topk, NR: gl.constexpr,
                         BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, CW: gl.constexpr,
                         mma_layout: gl.constexpr, HAS_EXTRA: gl.constexpr,
                         EXACT_BELOW: gl.constexpr, COUNT_BLOCK: gl.constexpr,
                         EXACT_IN: gl.constexpr, FMT: gl.constexpr,
                         E_FMT: gl.constexpr, Q_HELD: gl.constexpr):  # fmt: skip
        """`_ws_consumer` with mma.sync (the sm_120 row; 99 KB): the same dequantized K tile in
        shared memory, S as 8 products 64 deep (the operands of mma.sync live in registers:
        q's first Q_HELD 64-dim groups loaded once, the others and K's per product; the
        products summed in two independent accumulators), PV 512 wide; S and O share one
        layout; the row sums kept per element until the loop ends (`_ws_softmax_lazy`). As in
        `_ws_consumer`, q (zero for a request `keep` leaves to the exact launch) and, with
        EXACT_IN, the few-token count come here, while the loader's first copies fly."""
        qk_scale_log2, exact = _ws_sync_start(
            q_smem, Q_ptr, stride_qb, stride_qh, b, h0, H, keep, qk_scale_log2, n_tiles,
            IDX_ptr, stride_ib, stride_it, length, topk, num_tokens, EIDX_ptr, stride_eib,
            stride_eit, e_length, e_topk, e_num_tokens, BLOCK_H, CW, HAS_EXTRA, EXACT_BELOW,
            COUNT_BLOCK, EXACT_IN,
        )  # fmt: skip
        ROWS: gl.constexpr = _ws_dequant_rows(FMT, CW, BLOCK_N)
        L3: gl.constexpr = _ws_dequant_layout(FMT, CW, BLOCK_N)
        g = gl.arange(0, _ws_groups(FMT), layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        qa: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
        kb: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma_layout, k_width=2)
        acc = gl.zeros([BLOCK_H, 512], gl.float32, mma_layout)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, mma_layout))
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_layout))
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, mma_layout)
        l_part = s_zero
        # Each product waits for the ldmatrix issued just before it (in-order issue; ptxas
        # places them so): q's groups held in registers take most of those loads off S's
        # chain, and independent accumulators let the products of one warp overlap.
        q_held = ()
        for gi in gl.static_range(Q_HELD):
            q_held = q_held + (q_smem.slice(gi * 64, 64, dim=1).load(qa),)
        for i in range(n_tiles):
            slot = i % NR
            valid = _ws_tile_in(
                i, slot, n_main, b, start, end, e_start, e_end,
                KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib,
                stride_it,
                EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr,
                stride_eib, stride_eit, cols, g, k_smem, raw8, rawr, raws, raw_full, NR,
                BLOCK_N, ROWS, L3, FMT, E_FMT, CW,
            )  # fmt: skip
            gl.thread_barrier()  # the whole tile stored; the raw slot read by every warp
            mbarrier.arrive(raw_empty.index(slot), count=1)
            s_even = s_zero  # the even and the odd groups' products
            s_odd = s_zero
            for gi in gl.static_range(8):
                if gi < Q_HELD:
                    qg = q_held[gi]
                else:
                    qg = q_smem.slice(gi * 64, 64, dim=1).load(qa)
                kg = k_smem.slice(gi * 64, 64, dim=1).permute((1, 0)).load(kb)
                if gi % 2 == 0:
                    s_even = mma_v2(qg, kg, s_even)
                else:
                    s_odd = mma_v2(qg, kg, s_odd)
            s = s_even + s_odd
            p, alpha, m_i, l_part = _ws_softmax_lazy(s, valid, m_i, l_part, qk_scale_log2)
            acc = acc * alpha[:, None]
            p_hi = p.to(WS_OPERAND)
            acc = mma_v2(gl.convert_layout(p_hi, qa), k_smem.load(kb), acc)
            if EXACT_IN:
                if exact:  # P's rounding residue (`_ws_consumer`)
                    p_lo = (p - p_hi.to(gl.float32)).to(WS_OPERAND)
                    acc = mma_v2(gl.convert_layout(p_lo, qa), k_smem.load(kb), acc)
            gl.thread_barrier()  # every warp's PV done before the next tile overwrites K
        return acc, m_i, gl.sum(l_part, axis=1)

    @gluon.jit
    def _ws_tm_consumer(q_smem, k_smem, raw8, rawr, raws, raw_full, raw_empty, n_tiles, n_main,
                        b, start, end, e_start, e_end,
                        KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr,
                        stride_ib, stride_it,
                        EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr,
                        stride_eib, stride_eit, qk_scale_log2, keep, Q_ptr, stride_qb,
                        stride_qh, h0, H, length, topk, e_length, e_topk, NR: gl.constexpr,
                        BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, CW: gl.constexpr,
                        mma3: gl.constexpr, HAS_EXTRA: gl.constexpr,
                        EXACT_BELOW: gl.constexpr, COUNT_BLOCK: gl.constexpr,
                        EXACT_IN: gl.constexpr, FMT: gl.constexpr,
                        E_FMT: gl.constexpr):  # fmt: skip
        """`_ws_sync_consumer` token-major (at most 8 heads): S^T [tokens, heads] = K q^T and
        O^T [512, heads] += K^T P^T, the heads mma.sync's N. Both run as batched products over
        the two 256-dim halves (`mma3`, [2, rows, heads], warps [2, 2, 1]: a pair of warps
        per half, each warp 16 tokens of S^T and 128 dims of O^T); S^T's halves are summed
        across the pairs. q^T (its half: 256 dims x 8 heads) is loaded once into registers;
        each K element is read once by S and once by PV. The softmax runs over the tokens,
        the row sums kept per element until the loop ends. Returns O^T as [2, 256, heads],
        the max and the sum per head."""
        qk_scale_log2, exact = _ws_sync_start(
            q_smem, Q_ptr, stride_qb, stride_qh, b, h0, H, keep, qk_scale_log2, n_tiles,
            IDX_ptr, stride_ib, stride_it, length, topk, num_tokens, EIDX_ptr, stride_eib,
            stride_eit, e_length, e_topk, e_num_tokens, BLOCK_H, CW, HAS_EXTRA, EXACT_BELOW,
            COUNT_BLOCK, EXACT_IN,
        )  # fmt: skip
        ROWS: gl.constexpr = _ws_dequant_rows(FMT, CW, BLOCK_N)
        L3: gl.constexpr = _ws_dequant_layout(FMT, CW, BLOCK_N)
        g = gl.arange(0, _ws_groups(FMT), layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        opa: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma3, k_width=2)
        opb: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma3, k_width=2)
        s2: gl.constexpr = gl.SliceLayout(0, mma3)  # S^T [tokens, heads], halves summed
        # [2 halves, dims, heads] and [2 halves, tokens, dims] views of q and the K tile
        q3 = q_smem._reinterpret(WS_OPERAND, [BLOCK_H, 2, 256], _ws_halves_layout(BLOCK_H))
        k3 = k_smem._reinterpret(WS_OPERAND, [BLOCK_N, 2, 256], _ws_halves_layout(BLOCK_N))
        q_t = q3.permute((1, 2, 0))
        k_s = k3.permute((1, 0, 2))  # S's A operand: [2, tokens, dims]
        k_pv = k3.permute((1, 2, 0))  # PV's A operand: [2, dims, tokens]
        q_held = ()  # q^T in 4 pieces of 64 dims (per thread 32 registers in all)
        for gi in gl.static_range(4):
            q_held = q_held + (q_t.slice(gi * 64, 64, dim=1).load(opb),)
        acc = gl.zeros([2, 256, BLOCK_H], gl.float32, mma3)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(0, s2))
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s2))
        s_zero = gl.zeros([2, BLOCK_N, BLOCK_H], gl.float32, mma3)
        p_zero = gl.zeros([2, BLOCK_N, BLOCK_H], WS_OPERAND, mma3)
        l_part = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, s2)
        for i in range(n_tiles):
            slot = i % NR
            valid = _ws_tile_in(
                i, slot, n_main, b, start, end, e_start, e_end,
                KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib,
                stride_it,
                EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr,
                stride_eib, stride_eit, cols, g, k_smem, raw8, rawr, raws, raw_full, NR,
                BLOCK_N, ROWS, L3, FMT, E_FMT, CW,
            )  # fmt: skip
            gl.thread_barrier()  # the whole tile stored; the raw slot read by every warp
            mbarrier.arrive(raw_empty.index(slot), count=1)
            s_even = s_zero
            s_odd = s_zero
            for gi in gl.static_range(4):
                kg = k_s.slice(gi * 64, 64, dim=2).load(opa)
                if gi % 2 == 0:
                    s_even = mma_v2(kg, q_held[gi], s_even)
                else:
                    s_odd = mma_v2(kg, q_held[gi], s_odd)
            s = gl.sum(s_even + s_odd, axis=0)  # the two halves' partial products
            s = gl.where(valid[:, None], s * qk_scale_log2, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=0))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(s - m_use[None, :])
            l_part = l_part * alpha[None, :] + p
            m_i = m_new
            acc = acc * gl.expand_dims(gl.expand_dims(alpha, 0), 0)
            p_hi = p.to(WS_OPERAND)
            kt = k_pv.load(opa)
            acc = mma_v2(kt, gl.convert_layout(p_hi[None, :, :] + p_zero, opb), acc)
            if EXACT_IN:
                if exact:  # P's rounding residue (`_ws_consumer`)
                    p_lo = (p - p_hi.to(gl.float32)).to(WS_OPERAND)
                    acc = mma_v2(kt, gl.convert_layout(p_lo[None, :, :] + p_zero, opb), acc)
            gl.thread_barrier()  # every warp's PV done before the next tile overwrites K
        return acc, m_i, gl.sum(l_part, axis=0)

    @gluon.jit
    def _ws_count(idx_row, stride_it, length, topk, num_tokens, COUNT_BLOCK: gl.constexpr,
                  NW: gl.constexpr):  # fmt: skip
        """`_count_valid`'s count: the first `length` indices that select a token (NW: the
        calling partition's warps)."""
        first = _ws_idx_first(idx_row, stride_it, topk, COUNT_BLOCK, NW)
        return _ws_count_after(first, idx_row, stride_it, length, topk, num_tokens, COUNT_BLOCK,
                               NW)  # fmt: skip

    @gluon.jit
    def _ws_idx_first(idx_row, stride_it, topk, COUNT_BLOCK: gl.constexpr, NW: gl.constexpr):
        """`_ws_count`'s first block of indices (-1 past topk)."""
        layout: gl.constexpr = gl.BlockedLayout([4], [32], [NW], [0])
        offs = gl.arange(0, COUNT_BLOCK, layout=layout)
        return gl.load(idx_row + offs * stride_it, mask=offs < topk, other=-1)

    @gluon.jit
    def _ws_count_after(first, idx_row, stride_it, length, topk, num_tokens,
                        COUNT_BLOCK: gl.constexpr, NW: gl.constexpr):  # fmt: skip
        """`_ws_count` of a row whose first block of indices is loaded (`_ws_idx_first`)."""
        layout: gl.constexpr = gl.BlockedLayout([4], [32], [NW], [0])
        offs = gl.arange(0, COUNT_BLOCK, layout=layout)
        valid = (offs < length) & (first >= 0) & (first < num_tokens)
        n = gl.sum(valid.to(gl.int32), axis=0)
        for p0 in range(COUNT_BLOCK, topk, COUNT_BLOCK):
            pos = p0 + offs
            idx = gl.load(idx_row + pos * stride_it, mask=pos < topk, other=-1)
            valid = (pos < length) & (idx >= 0) & (idx < num_tokens)
            n += gl.sum(valid.to(gl.int32), axis=0)
        return n

    @gluon.jit
    def _ws_few_tokens(b, IDX_ptr, stride_ib, stride_it, length, topk, num_tokens, EIDX_ptr,
                       stride_eib, stride_eit, e_length, e_topk, e_num_tokens,
                       HAS_EXTRA: gl.constexpr, EXACT_BELOW: gl.constexpr,
                       COUNT_BLOCK: gl.constexpr, NW: gl.constexpr):  # fmt: skip
        """Whether request b has at most EXACT_BELOW valid tokens in its two caches (the
        requests that take the exact PV)."""
        n_valid = _ws_count(IDX_ptr + b.to(gl.int64) * stride_ib, stride_it, length, topk,
                            num_tokens, COUNT_BLOCK, NW)  # fmt: skip
        if HAS_EXTRA:
            n_valid += _ws_count(EIDX_ptr + b.to(gl.int64) * stride_eib, stride_eit, e_length,
                                 e_topk, e_num_tokens, COUNT_BLOCK, NW)  # fmt: skip
        return n_valid <= EXACT_BELOW

    @gluon.jit
    def _ws_plan_piece(LEN_ptr, stride_len, has_len, ELEN_ptr, stride_elen, has_elen, B,
                       split, length, e_length, topk, e_topk, num_splits, per_round,
                       BLOCK_N: gl.constexpr, B_POW2: gl.constexpr, HAS_EXTRA: gl.constexpr,
                       NW: gl.constexpr):  # fmt: skip
        """`_plan_piece` (the same arithmetic; Gluon cannot call a `@triton.jit` helper)."""
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
        r = gl.arange(0, B_POW2, layout=layout)
        inb = r < B
        ln = gl.load(LEN_ptr + r * stride_len, mask=inb & ((r * 0 + has_len) != 0), other=topk)
        ln = gl.where(inb, gl.maximum(gl.minimum(ln, topk), 0), 0)
        n = gl.cdiv(ln, BLOCK_N)
        if HAS_EXTRA:
            el = gl.load(ELEN_ptr + r * stride_elen, mask=inb & ((r * 0 + has_elen) != 0),
                         other=e_topk)  # fmt: skip
            n += gl.cdiv(gl.where(inb, gl.maximum(gl.minimum(el, e_topk), 0), 0), BLOCK_N)
        n_max = gl.max(n, axis=0)
        t = gl.maximum(gl.cdiv(gl.sum(n, axis=0), per_round), gl.cdiv(n_max, num_splits))
        t = gl.maximum(t, 1)
        pieces = gl.sum(gl.cdiv(n, t), axis=0)
        while (pieces > per_round) & (t < n_max):
            t += 1
            pieces = gl.sum(gl.cdiv(n, t), axis=0)
        ln_b = gl.maximum(length, 0)
        m_b = gl.cdiv(ln_b, BLOCK_N)
        el_b = ln_b * 0
        if HAS_EXTRA:
            el_b = gl.maximum(e_length, 0)
        n_b = m_b + gl.cdiv(el_b, BLOCK_N)
        k_b = gl.cdiv(n_b, t)
        live = split < k_b
        kk = gl.maximum(k_b, 1)
        a = gl.where(live, split * n_b // kk, 0)
        c = gl.where(live, (split + 1) * n_b // kk, 0)
        start = gl.minimum(a, m_b) * BLOCK_N
        end = gl.maximum(gl.minimum(gl.minimum(c, m_b) * BLOCK_N, ln_b), start)
        e_start = gl.maximum(a - m_b, 0) * BLOCK_N
        e_end = gl.maximum(gl.minimum(gl.maximum(c - m_b, 0) * BLOCK_N, el_b), e_start)
        return k_b, start, end, e_start, e_end

    @gluon.jit(do_not_specialize=["has_len", "has_elen"])
    def _ws_split_kernel(
        Q_ptr, stride_qb, stride_qh,
        KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib, stride_it,
        topk, LEN_ptr, stride_len, has_len,
        EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr, stride_eib,
        stride_eit, e_topk, ELEN_ptr, stride_elen, has_elen,
        SINK_ptr, stride_sink, O_ptr, stride_ob, stride_oh, LSE_ptr, stride_lb, stride_lh,
        PO_ptr, PLSE_ptr, H, qk_scale_log2, num_splits, tiles_per_split,
        SINGLE_SPLIT: gl.constexpr, HAS_EXTRA: gl.constexpr, HAS_SINK: gl.constexpr,
        EXACT_BELOW: gl.constexpr, COUNT_BLOCK: gl.constexpr, BLOCK_H: gl.constexpr,
        BLOCK_N: gl.constexpr, NR: gl.constexpr, LOADER_REGS: gl.constexpr,
        MMA_SYNC: gl.constexpr, num_warps: gl.constexpr, PIECES_ptr=None, B=0, per_round=0,
        PLAN: gl.constexpr = False, B_POW2: gl.constexpr = 1, EXACT_IN: gl.constexpr = False,
        ONLY_FEW: gl.constexpr = False, SKIP_PACKED: gl.constexpr = False,
        FMT: gl.constexpr = 0, E_FMT: gl.constexpr = 0, page_shift=0, e_page_shift=0,
        POW2_PAGES: gl.constexpr = False, LAUNCH_DEPENDENTS: gl.constexpr = False,
        Q_HELD: gl.constexpr = 0, TOKEN_MAJOR: gl.constexpr = False, PERM_ptr=None,
        PREFETCH_START: gl.constexpr = False,
    ):  # fmt: skip
        """`_mma_split_kernel`'s bf16-P launch (RUN_BF16_P, PV_SPLIT off) on a main cache of
        format FMT and an extra one of E_FMT (V4 and V4, or V4.1 FP8 and V4.1 FP8 or FP4): grid
        (B * ceil(H / BLOCK_H), num_splits), the same split of the two caches' tile lists
        and the same outputs. EXACT_BELOW > 0: requests with at most that many valid tokens
        are left to the exact launch (no tile walked, nothing stored), or with EXACT_IN computed
        here with P's rounding residue (no exact launch). MMA_SYNC: the consumer is
        `_ws_sync_consumer` (mma.sync: the sm_120 row's tiles, the few-head tile), else
        `_ws_consumer` (wgmma, sm_90); TOKEN_MAJOR (mma.sync, at most 8 heads):
        `_ws_tm_consumer`. ONLY_FEW (wgmma): the exact launch beside
        `_mma_split_kernel`'s bf16-P one: only the requests with at most EXACT_BELOW valid
        tokens, each with P's rounding residue; the others' programs return after the count.
        SKIP_PACKED: lengths from `_pack_plan_kernel`, -1 for a token of a packed group
        (`_mma_packed_kernel` writes it): its programs exit; PERM_ptr (given with it): the
        token of each rank of programs, the longest first (`_token_order`)."""
        pid = gl.program_id(0)
        split = gl.program_id(1)
        head_blocks = gl.cdiv(H, BLOCK_H)
        b = pid // head_blocks
        if PERM_ptr is not None:
            b = gl.load(PERM_ptr + b)
        h0 = (pid % head_blocks) * BLOCK_H
        if PREFETCH_START:
            _ws_prefetch_start(Q_ptr, stride_qb, stride_qh, b, h0, H, IDX_ptr, stride_ib,
                               stride_it, topk, EIDX_ptr, stride_eib, stride_eit, e_topk,
                               BLOCK_H, HAS_EXTRA, num_warps)  # fmt: skip
        length = gl.minimum(gl.load(LEN_ptr + b * stride_len, mask=has_len != 0, other=topk), topk)
        e_length = e_topk
        if HAS_EXTRA:  # loaded beside the length, before the exit below reads it
            e_length = gl.minimum(
                gl.load(ELEN_ptr + b * stride_elen, mask=has_elen != 0, other=e_topk), e_topk
            )
        if SKIP_PACKED:
            if length < 0:
                return
        if PLAN:  # the length-aware split (`_plan_piece`)
            k_b, start, end, e_start, e_end = _ws_plan_piece(
                LEN_ptr, stride_len, has_len, ELEN_ptr, stride_elen, has_elen, B, split, length,
                e_length, topk, e_topk, num_splits, per_round, BLOCK_N, B_POW2, HAS_EXTRA,
                num_warps,
            )  # fmt: skip
            if (split == 0) & (h0 == 0):
                gl.store(PIECES_ptr + b, k_b)
            if split >= k_b:
                return  # past the request's pieces: nothing to store (the combine skips it)
        else:
            t0 = split * tiles_per_split
            t1 = t0 + tiles_per_split
            main_tiles = gl.cdiv(topk, BLOCK_N)
            start = gl.minimum(t0, main_tiles) * BLOCK_N
            end = gl.maximum(gl.minimum(gl.minimum(t1, main_tiles) * BLOCK_N, length), start)
            e_start = start * 0
            e_end = start * 0
            if HAS_EXTRA:
                e_start = gl.maximum(t0 - main_tiles, 0) * BLOCK_N
                e_end = gl.maximum(
                    gl.minimum(gl.maximum(t1 - main_tiles, 0) * BLOCK_N, e_length), e_start
                )
        if ONLY_FEW:  # the other requests are the bf16-P launch's: nothing to load or store
            if not _ws_few_tokens(b, IDX_ptr, stride_ib, stride_it, length, topk, num_tokens,
                                  EIDX_ptr, stride_eib, stride_eit, e_length, e_topk,
                                  e_num_tokens, HAS_EXTRA, EXACT_BELOW, COUNT_BLOCK,
                                  num_warps):  # fmt: skip
                return
        n_main = gl.cdiv(end - start, BLOCK_N)
        n_tiles = n_main
        if HAS_EXTRA:
            n_tiles = n_main + gl.cdiv(e_end - e_start, BLOCK_N)
        if MMA_SYNC:  # ldmatrix's swizzle; wgmma's own otherwise
            sl: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8,
                                                       order=[1, 0])  # fmt: skip
        else:
            sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                    rank=2)  # fmt: skip
        q_smem = gl.allocate_shared_memory(WS_OPERAND, [BLOCK_H, 512], sl)
        k_smem = gl.allocate_shared_memory(WS_OPERAND, [BLOCK_N, 512], sl)
        if FMT == 1:  # V4.1 FP8: 512 fp8 bytes (16 groups of 32) and 16 scale bytes a token
            raw8 = gl.allocate_shared_memory(gl.float8e4nv, [NR, BLOCK_N, 16, 32],
                                             _ws_raw_v41_layout(BLOCK_N))  # fmt: skip
            rawr = gl.allocate_shared_memory(  # unused: no bf16 rope in this format
                gl.bfloat16, [NR, BLOCK_N, 8], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
            )
            raws = gl.allocate_shared_memory(  # 32 a token with an FP4 extra cache
                gl.uint8, [NR, BLOCK_N, 32 if E_FMT == 2 else 16],
                gl.SwizzledSharedLayout(1, 1, 1, [1, 0]),
            )  # fmt: skip
        else:  # V4: 448 fp8 bytes (7 groups of 64, an 8th unused), 64 bf16 rope, 8 scale bytes
            # The dequantization's ldmatrix reads two tokens' bytes of one group per 8 x 8
            # matrix: token-major they were 512 bytes apart (the same banks: twice the
            # wavefronts; 6.8% of the few-head tile's, session 29). Group-major fixed that but
            # split each token's 128-byte line in two for the loader's copies (their excess
            # 1.40 M -> 3.85 M wavefronts); `_ws_raw_v4_layout` keeps the line whole for the
            # mma.sync tiles (1.01-1.02x on the few-head rows, session 30).
            raw8 = gl.allocate_shared_memory(gl.float8e4nv, [NR, BLOCK_N, 8, 64],
                                             _ws_raw_v4_layout(BLOCK_N, MMA_SYNC))  # fmt: skip
            rawr = gl.allocate_shared_memory(
                gl.bfloat16, [NR, BLOCK_N, 64], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
            )
            raws = gl.allocate_shared_memory(
                gl.uint8, [NR, BLOCK_N, 8], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
            )
        raw_full = gl.allocate_shared_memory(gl.int64, [NR, 1], mbarrier.MBarrierLayout())
        raw_empty = gl.allocate_shared_memory(gl.int64, [NR, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(NR):
            mbarrier.init(raw_full.index(s), count=1)
            mbarrier.init(raw_empty.index(s), count=1)
        fence_async_shared()

        if MMA_SYNC:
            # The loader first: q and (EXACT_IN) the few-token count in the consumer, beside
            # the loader's first copies; only a count that decides the loader's tiles (a
            # request left to the exact launch) before the fork.
            keep = n_tiles >= 0
            if EXACT_BELOW > 0 and not EXACT_IN:
                few = _ws_few_tokens(b, IDX_ptr, stride_ib, stride_it, length, topk,
                                     num_tokens, EIDX_ptr, stride_eib, stride_eit, e_length,
                                     e_topk, e_num_tokens, HAS_EXTRA, EXACT_BELOW,
                                     COUNT_BLOCK, num_warps)  # fmt: skip
                keep = not few
                n_tiles = gl.where(keep, n_tiles, 0)
        if MMA_SYNC and TOKEN_MAJOR:
            mma3: gl.constexpr = gl.NVMMADistributedLayout(
                version=[2, 0], warps_per_cta=[2, num_warps // 2, 1], instr_shape=[1, 16, 8]
            )
            acc_t, m_i, l_i = gl.warp_specialize(
                [
                    (_ws_tm_consumer, (q_smem, k_smem, raw8, rawr, raws, raw_full, raw_empty,
                                       n_tiles, n_main, b, start, end, e_start, e_end,
                                       KV8, KVU, KVB, stride_kv_page, page_size, num_tokens,
                                       IDX_ptr, stride_ib, stride_it,
                                       EKV8, EKVU, EKVB, stride_ekv_page, e_page_size,
                                       e_num_tokens, EIDX_ptr, stride_eib, stride_eit,
                                       qk_scale_log2, keep, Q_ptr, stride_qb, stride_qh, h0,
                                       H, length, topk, e_length, e_topk, NR, BLOCK_N,
                                       BLOCK_H, num_warps, mma3, HAS_EXTRA, EXACT_BELOW,
                                       COUNT_BLOCK, EXACT_IN, FMT, E_FMT)),
                    (_ws_loader, (raw8, rawr, raws, raw_full, raw_empty, n_tiles, n_main, b,
                                  start, end, e_start, e_end,
                                  KV8, KVU, KVB, stride_kv_page, page_size, num_tokens,
                                  IDX_ptr, stride_ib, stride_it,
                                  EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens,
                                  EIDX_ptr, stride_eib, stride_eit, page_shift, e_page_shift, NR,
                                  BLOCK_N, FMT, E_FMT, POW2_PAGES)),
                ],
                [4],
                [LOADER_REGS],
            )  # fmt: skip
            # O^T [2, 256, heads] as O [heads, 512], after the fork (its buffers free for the
            # conversion's scratch)
            o_layout: gl.constexpr = gl.BlockedLayout([1, 8], [BLOCK_H // num_warps,
                                                               32 // (BLOCK_H // num_warps)],
                                                      [num_warps, 1], [1, 0])  # fmt: skip
            acc = gl.convert_layout(
                gl.reshape(gl.permute(acc_t, (2, 0, 1)), [BLOCK_H, 512]), o_layout
            )
            m_i = gl.convert_layout(m_i, gl.SliceLayout(1, o_layout))
            l_i = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
            l_i = gl.where(keep, l_i, -1.0)  # nothing stored for a request left to the exact launch
        elif MMA_SYNC:
            o_layout: gl.constexpr = gl.NVMMADistributedLayout(
                version=[2, 0],
                warps_per_cta=[BLOCK_H // 16, num_warps // (BLOCK_H // 16)],
                instr_shape=[16, 8],
            )
            acc, m_i, l_i = gl.warp_specialize(
                [
                    (_ws_sync_consumer, (q_smem, k_smem, raw8, rawr, raws, raw_full, raw_empty,
                                         n_tiles, n_main, b, start, end, e_start, e_end,
                                         KV8, KVU, KVB, stride_kv_page, page_size, num_tokens,
                                         IDX_ptr, stride_ib, stride_it,
                                         EKV8, EKVU, EKVB, stride_ekv_page, e_page_size,
                                         e_num_tokens, EIDX_ptr, stride_eib, stride_eit,
                                         qk_scale_log2, keep, Q_ptr, stride_qb, stride_qh, h0, H,
                                         length, topk, e_length, e_topk, NR, BLOCK_N, BLOCK_H,
                                         num_warps, o_layout, HAS_EXTRA, EXACT_BELOW,
                                         COUNT_BLOCK, EXACT_IN, FMT, E_FMT, Q_HELD)),
                    (_ws_loader, (raw8, rawr, raws, raw_full, raw_empty, n_tiles, n_main, b,
                                  start, end, e_start, e_end,
                                  KV8, KVU, KVB, stride_kv_page, page_size, num_tokens,
                                  IDX_ptr, stride_ib, stride_it,
                                  EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens,
                                  EIDX_ptr, stride_eib, stride_eit, page_shift, e_page_shift, NR,
                                  BLOCK_N, FMT, E_FMT, POW2_PAGES)),
                ],
                [4],
                [LOADER_REGS],
            )  # fmt: skip
            l_i = gl.where(keep, l_i, -1.0)  # nothing stored for a request left to the exact launch
        else:
            WG: gl.constexpr = num_warps // 4
            # Two caches: the few-token count here, before the fork, not in the consumer
            # beside the loader's first copies as for one cache: counted there, both caches'
            # index rows and the exact PV's branch spilled 168 B in its tile loop (wgmma
            # descriptors), 1.19x slower at B128 (session 24).
            few_pre = n_tiles < 0  # False
            if HAS_EXTRA and EXACT_BELOW > 0 and not ONLY_FEW:
                few_pre = _ws_few_tokens(b, IDX_ptr, stride_ib, stride_it, length, topk,
                                         num_tokens, EIDX_ptr, stride_eib, stride_eit, e_length,
                                         e_topk, e_num_tokens, HAS_EXTRA, EXACT_BELOW,
                                         COUNT_BLOCK, num_warps)  # fmt: skip
            s_layout: gl.constexpr = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, BLOCK_N // WG, 16]
            )
            o_layout: gl.constexpr = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, 512 // WG, 16]
            )
            acc, m_i, l_i = gl.warp_specialize(
                [
                    (_ws_consumer, (q_smem, k_smem, raw8, rawr, raws, raw_full, raw_empty, n_tiles,
                                    n_main, b, start, end, e_start, e_end,
                                    KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr,
                                    stride_ib, stride_it,
                                    EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens,
                                    EIDX_ptr, stride_eib, stride_eit, qk_scale_log2, few_pre,
                                    Q_ptr, stride_qb, stride_qh, h0, H, length, topk, e_length,
                                    e_topk, NR, BLOCK_N, BLOCK_H, s_layout, o_layout, HAS_EXTRA,
                                    EXACT_BELOW, COUNT_BLOCK, EXACT_IN or ONLY_FEW, ONLY_FEW,
                                    FMT, E_FMT)),
                    (_ws_loader, (raw8, rawr, raws, raw_full, raw_empty, n_tiles, n_main, b, start,
                                  end, e_start, e_end,
                                  KV8, KVU, KVB, stride_kv_page, page_size, num_tokens, IDX_ptr,
                                  stride_ib, stride_it,
                                  EKV8, EKVU, EKVB, stride_ekv_page, e_page_size, e_num_tokens,
                                  EIDX_ptr, stride_eib, stride_eit, page_shift, e_page_shift, NR,
                                  BLOCK_N, FMT, E_FMT, POW2_PAGES)),
                ],
                [4],
                [LOADER_REGS],
            )  # fmt: skip

        if LAUNCH_DEPENDENTS:  # tiles done: the combine's programs may be placed
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [],
                                      dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip
        heads = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
        d = gl.arange(0, 512, layout=gl.SliceLayout(0, o_layout))
        hmask = (heads < H) & (l_i != -1.0)  # a NaN row (NaN in q) is stored: NaN out
        lse2 = gl.where(l_i > 0, m_i + gl.log2(l_i), float("-inf"))
        if SINGLE_SPLIT:
            # `_final_coef`: the sink takes its weight (+inf: all of it; -inf: none)
            if HAS_SINK:
                sink2 = (
                    gl.load(SINK_ptr + heads * stride_sink, mask=hmask, other=0.0)
                    * 1.4426950408889634
                )
                mx = gl.maximum(lse2, sink2)
                mx = gl.where(gl.abs(mx) == float("inf"), 0.0, mx)
                total2 = mx + gl.log2(gl.exp2(lse2 - mx) + gl.exp2(sink2 - mx))
            else:
                total2 = lse2
            coef = gl.where(l_i > 0, gl.exp2(lse2 - total2) / l_i, 0.0)
            out = (acc * coef[:, None]).to(gl.bfloat16)
            if MMA_SYNC:
                o_ptrs = (O_ptr + b.to(gl.int64) * stride_ob
                          + heads[:, None].to(gl.int64) * stride_oh)  # fmt: skip
                gl.store(o_ptrs + d[None, :], out, mask=hmask[:, None])
            else:
                # 16-byte stores, the tile passed through shared memory (the fork's buffers
                # are free by now), not the wgmma layout's 4-byte ones, whose queue stalled
                # the program's end: 1.04-1.14x on single-split rows (session 25; the
                # split partials' fp32 stores lost 2-5% that way and stay direct)
                st: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
                hs = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, st))
                ds = gl.arange(0, 512, layout=gl.SliceLayout(0, st))
                hmask_st = gl.convert_layout(hmask, gl.SliceLayout(1, st))
                o_ptrs = O_ptr + b.to(gl.int64) * stride_ob + hs[:, None].to(gl.int64) * stride_oh
                gl.store(o_ptrs + ds[None, :], gl.convert_layout(out, st), mask=hmask_st[:, None])
            gl.store(LSE_ptr + b.to(gl.int64) * stride_lb + heads * stride_lh,
                     total2 * 0.6931471805599453, mask=hmask)  # fmt: skip
        else:
            inv_l = gl.where(l_i > 0, 1.0 / l_i, 0.0)
            row = (b.to(gl.int64) * H + heads.to(gl.int64)) * num_splits + split
            gl.store(PO_ptr + row[:, None] * 512 + d[None, :], acc * inv_l[:, None],
                     mask=hmask[:, None])  # fmt: skip
            gl.store(PLSE_ptr + row, lse2, mask=hmask)


# ----------------------------------------------------------------------------- packed tokens
# Prefill-sized calls: consecutive query tokens (one request's prefill tokens) select mostly
# the same cache rows, but the entry gets no request boundaries. `_pack_plan_kernel` finds,
# per group of PACK_G consecutive tokens, the union of their selections from the indices
# themselves (on the device, no host sync); where it is small, `_mma_packed_kernel` attends
# the group's PACK_G x H heads as one block over the union, each row masked to its own
# token's keys, so each shared row is gathered and dequantized once per group instead of once
# per token (and the H8 block's 8 padding rows carry another token's heads). The per-token
# launch, run first, gets length -1 for the packed tokens: their programs exit at once.


@triton.jit
def _probe_rows(IDX_ptr, stride_ib, stride_it, topk, t0, t1, PROBE_CHUNK: tl.constexpr):
    """`_found_share`'s loads: token t1's first 16 indices and token t0's first PROBE_CHUNK
    (-1 and -2 past topk)."""
    pr = tl.arange(0, 16)
    pi = tl.load(IDX_ptr + t1.to(tl.int64) * stride_ib + pr * stride_it, mask=pr < topk, other=-1)
    c = tl.arange(0, PROBE_CHUNK)
    r0 = tl.load(IDX_ptr + t0.to(tl.int64) * stride_ib + c * stride_it, mask=c < topk, other=-2)
    return pi, r0


@triton.jit
def _found_share(IDX_ptr, stride_ib, stride_it, topk, len0, len1, num_tokens, t0, pi, r0,
                 PROBE_CHUNK: tl.constexpr):  # fmt: skip
    """How many of token t1's first 16 valid-looking indices occur in token t0's row, and how
    many were probed: a cheap test before the union (tokens that own their rows stop here).
    pi, r0: `_probe_rows`'s loads, issued beside the plan's lengths (on calls the plan does
    not pack its programs' time is their chain of loads)."""
    pr = tl.arange(0, 16)
    pvalid = (pr < len1) & (pi >= 0) & (pi < num_tokens)
    c = tl.arange(0, PROBE_CHUNK)
    r = tl.where(c < len0, r0, -2)
    found = tl.max((pi[:, None] == r[None, :]).to(tl.int32), axis=1)
    for c0 in range(PROBE_CHUNK, topk, PROBE_CHUNK):
        pos = c0 + c
        r = tl.load(
            IDX_ptr + t0.to(tl.int64) * stride_ib + pos * stride_it,
            mask=(pos < topk) & (pos < len0), other=-2,
        )  # fmt: skip
        found = tl.maximum(found, tl.max((pi[:, None] == r[None, :]).to(tl.int32), axis=1))
    return tl.sum(found * pvalid.to(tl.int32)), tl.sum(pvalid.to(tl.int32))


_INT32_MAX = tl.constexpr(0x7FFFFFFF)  # an empty slot of a sorted base row: after every index


@triton.jit
def _base_counts(key, find, base, SC_ptr, PACK_G: tl.constexpr, TOPK_POW2: tl.constexpr,
                 TOPK_LOG2: tl.constexpr):  # fmt: skip
    """Which of the keys `find` ([PACK_G, TOPK_POW2]: token, position) the sorted row `base`
    holds (`match`), and per entry of `base` its tokens' counts as a word of 4-bit counts
    (token g's at bits 4g; nonzero only at an index's first occurrence: `first`), with the
    largest count (a count past 15 carries into the next token's nibble). Every key's lower
    bound in `base` by a branchless binary search (TOPK_LOG2 dependent loads, L1), one relaxed
    atomic add per found key into its own token's count row (no two tokens on one address).
    SC_ptr: (PACK_G + 1) x TOPK_POW2 int32 of scratch (the row, then the count rows)."""
    g = tl.arange(0, PACK_G)
    j = tl.arange(0, TOPK_POW2)
    cnt_ptr = SC_ptr + TOPK_POW2
    cnt_off = g[:, None] * TOPK_POW2 + j[None, :]
    tl.store(SC_ptr + j, base)
    tl.store(cnt_ptr + cnt_off, 0)
    tl.debug_barrier()
    pos = tl.zeros([PACK_G, TOPK_POW2], dtype=tl.int32)  # base entries below the key
    for s in tl.static_range(TOPK_LOG2):
        step = TOPK_POW2 >> (s + 1)
        probe = tl.load(SC_ptr + pos + (step - 1))
        pos = tl.where(probe < key, pos + step, pos)
    match = find & (tl.load(SC_ptr + pos) == key)
    tl.atomic_add(cnt_ptr + g[:, None] * TOPK_POW2 + pos, 1, mask=match, sem="relaxed")
    prev = tl.load(SC_ptr + j - 1, mask=j > 0, other=-1)
    tl.debug_barrier()
    cnt = tl.load(cnt_ptr + cnt_off, cache_modifier=".cg")  # the atomics' results, from L2
    word = tl.sum(cnt << (4 * g)[:, None], axis=0)
    first = (base != prev) & (base != _INT32_MAX)
    return match, word, first, tl.max(tl.max(cnt, axis=1))


@triton.jit
def _singles(idx, keep, at, UI_ptr, UW_ptr, PACK_G: tl.constexpr):
    """Write the keys `keep` ([PACK_G, ...]) one entry each (word 1 << 4g), token by token
    from entry `at` on; returns how many."""
    g = tl.arange(0, PACK_G)
    per_token = tl.sum(keep.to(tl.int32), axis=1)
    row_at = at + tl.cumsum(per_token, 0) - per_token
    slot = row_at[:, None] + tl.cumsum(keep.to(tl.int32), 1) - 1
    tl.store(UI_ptr + slot, idx, mask=keep)
    tl.store(UW_ptr + slot, tl.zeros_like(idx) + (1 << (4 * g))[:, None], mask=keep)
    return tl.sum(per_token)


@triton.jit
def _union_rows(IDX_ptr, stride_ib, stride_it, topk, LEN_ptr, stride_len, has_len, num_tokens,
                t0, SC_ptr, UI_ptr, UW_ptr, PACK_G: tl.constexpr, TOPK_POW2: tl.constexpr,
                TOPK_LOG2: tl.constexpr):  # fmt: skip
    """A union of tokens t0 .. t0 + PACK_G - 1's valid selections in one cache: its entries at
    UI_ptr[0, U) and, per entry, an int32 word of 4-bit counts (token g's count at bits 4g)
    at UW_ptr[0, U). Up to two sorted base rows: token t0's row (its distinct indices first,
    ascending, with every token's counts), then, where the other tokens select more than
    TOPK_POW2 / 4 indices that it does not hold, the first TOPK_POW2 of those (their distinct
    indices next, likewise); any index left (fewer than that outside the first base, or more
    than TOPK_POW2) gets one entry per selection (word 1 << 4g). An index may thus have
    several entries, which the packed launch weighs as one with their counts summed (count x
    exp(s) is additive): the union is exact for any indices, the smallest one unless indices
    are left. Costs one or two sorts of TOPK_POW2 int32 keys and binary searches
    (`_base_counts`), not a sort or a hash table of all the group's keys.
    Returns (U, each token's valid count, ok): not ok when a count passed 15 (its nibble would
    carry)."""
    g = tl.arange(0, PACK_G)
    j = tl.arange(0, TOPK_POW2)
    t = t0 + g
    idx = tl.load(
        IDX_ptr + t[:, None].to(tl.int64) * stride_ib + j[None, :] * stride_it,
        mask=j[None, :] < topk, other=-1,
    )  # fmt: skip
    length = _lengths(LEN_ptr, stride_len, has_len, t, topk)
    valid = (j[None, :] < length[:, None]) & (idx >= 0) & (idx < num_tokens)
    n_valid = tl.sum(valid.to(tl.int32), axis=1)
    key = tl.where(valid, idx, _INT32_MAX)  # an invalid key matches nothing
    b0 = tl.load(IDX_ptr + t0.to(tl.int64) * stride_ib + j * stride_it, mask=j < topk, other=-1)
    len0 = _length(LEN_ptr, stride_len, has_len, t0, topk)
    base = tl.sort(tl.where((j < len0) & (b0 >= 0) & (b0 < num_tokens), b0, _INT32_MAX))
    match, word, first, top = _base_counts(key, valid, base, SC_ptr, PACK_G, TOPK_POW2,
                                           TOPK_LOG2)  # fmt: skip
    n_base = tl.sum(first.to(tl.int32))
    run = tl.cumsum(first.to(tl.int32), 0) - 1
    tl.store(UI_ptr + run, base, mask=first)
    tl.store(UW_ptr + run, word, mask=first)
    # The other tokens' indices outside the first base, one entry each after it; where they
    # are many (more than a quarter of a row: a second sort then costs less than the rows it
    # may save the packed launch), the first TOPK_POW2 of them sorted as the second base.
    rest = valid & (match == 0)
    n_rest = _singles(idx, rest, n_base, UI_ptr, UW_ptr, PACK_G)
    n_base2 = n_rest * 0
    n_left = n_rest
    top2 = top * 0
    if 4 * n_rest > TOPK_POW2:
        tl.debug_barrier()
        staged = tl.load(UI_ptr + n_base + j, mask=j < n_rest, other=_INT32_MAX)
        base2 = tl.sort(staged)
        match2, word2, first2, top2 = _base_counts(key, rest, base2, SC_ptr, PACK_G, TOPK_POW2,
                                                   TOPK_LOG2)  # fmt: skip
        n_base2 = tl.sum(first2.to(tl.int32))
        run2 = n_base + tl.cumsum(first2.to(tl.int32), 0) - 1
        tl.store(UI_ptr + run2, base2, mask=first2)
        tl.store(UW_ptr + run2, word2, mask=first2)
        n_left = _singles(idx, rest & (match2 == 0), n_base + n_base2, UI_ptr, UW_ptr, PACK_G)
    return n_base + n_base2 + n_left, n_valid, tl.maximum(top, top2) <= 15


@triton.jit
def _tiles_of(LEN_ptr, stride_len, has_len, ELEN_ptr, stride_elen, has_elen, topk, e_topk, t,
              BLOCK_N: tl.constexpr, HAS_EXTRA: tl.constexpr):  # fmt: skip
    """Tokens `t`'s tiles of BLOCK_N: their main length's, plus their extra length's."""
    w = tl.cdiv(tl.maximum(_lengths(LEN_ptr, stride_len, has_len, t, topk), 0), BLOCK_N)
    if HAS_EXTRA:
        el = _lengths(ELEN_ptr, stride_elen, has_elen, t, e_topk)
        w += tl.cdiv(tl.maximum(el, 0), BLOCK_N)
    return w


@triton.jit
def _token_order(LEN_ptr, stride_len, has_len, ELEN_ptr, stride_elen, has_elen, topk, e_topk,
                 B, ORD_ptr, HIST_ptr, BLOCK_N: tl.constexpr, W_POW2: tl.constexpr,
                 HAS_EXTRA: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    """The per-token launch's order, longest first: ORD_ptr[r] = the token its programs of rank
    r attend, the tokens by their tiles of BLOCK_N (main length, then extra length), most
    first (in a bucket of equal tiles, in the order the atomics gave). The GPU starts programs
    about in rank order, so the longest ones no longer end the launch alone (SGLang's prefill
    lengths grow with the position: the last tokens are the longest; session 42, H100:
    partial lengths 1.10x, topk2048 causal 1.14x, share256 full 0.98x: each split program
    reads its token before its lengths; its causal T4096 1.07x was timed in the bench's
    first-entry mode, not settled, session 43). ORD_ptr[B:2B]: each token's place
    in its bucket; HIST_ptr: W_POW2 counters (zeroed by the launcher), then the W_POW2
    buckets' first ranks. One program: two passes over the lengths."""
    c = tl.arange(0, CHUNK)
    for t0 in range(0, B, CHUNK):
        t = t0 + c
        inb = t < B
        w = _tiles_of(LEN_ptr, stride_len, has_len, ELEN_ptr, stride_elen, has_elen, topk,
                      e_topk, tl.minimum(t, B - 1), BLOCK_N, HAS_EXTRA)  # fmt: skip
        place = tl.atomic_add(HIST_ptr + w, 1, mask=inb, sem="relaxed")
        tl.store(ORD_ptr + B + t, place, mask=inb)
    tl.debug_barrier()  # every thread's counts in
    k = tl.arange(0, W_POW2)
    n = tl.load(HIST_ptr + k, cache_modifier=".cg")
    tl.store(HIST_ptr + W_POW2 + k, tl.sum(n) - tl.cumsum(n, axis=0))  # tokens of more tiles
    tl.debug_barrier()
    for t0 in range(0, B, CHUNK):
        t = t0 + c
        inb = t < B
        w = _tiles_of(LEN_ptr, stride_len, has_len, ELEN_ptr, stride_elen, has_elen, topk,
                      e_topk, tl.minimum(t, B - 1), BLOCK_N, HAS_EXTRA)  # fmt: skip
        place = tl.load(ORD_ptr + B + t, mask=inb, other=0, cache_modifier=".cg")
        first = tl.load(HIST_ptr + W_POW2 + w, mask=inb, other=0, cache_modifier=".cg")
        tl.store(ORD_ptr + first + place, t, mask=inb)


@triton.jit(do_not_specialize=["has_len", "has_elen"])
def _pack_plan_kernel(
    IDX_ptr, stride_ib, stride_it, topk, LEN_ptr, stride_len, num_tokens,
    EIDX_ptr, stride_eib, stride_eit, e_topk, ELEN_ptr, stride_elen, e_num_tokens,
    U_ptr, stride_u, e_u_off, w_off, e_w_off, ULEN_ptr, FLAG_ptr, LEN2_ptr, ELEN2_ptr, HT_ptr,
    stride_ht, e_ht_off, SYNC_ptr, B, has_len, has_elen, exact_below, max_keys, ORD_ptr,
    HIST_ptr,
    PACK_G: tl.constexpr,
    TOPK_POW2: tl.constexpr,
    E_TOPK_POW2: tl.constexpr,
    TOPK_LOG2: tl.constexpr,
    E_TOPK_LOG2: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    PROBE_CHUNK: tl.constexpr,
    SPLIT_CACHES: tl.constexpr = False,
    ORDER_BLOCK_N: tl.constexpr = 32,
    W_POW2: tl.constexpr = 32,
    ORDER_CHUNK: tl.constexpr = 1024,
):  # fmt: skip
    """Plan of group `program_id(0)` (tokens t0 .. t0 + PACK_G - 1): FLAG 1 when its tokens
    are attended packed (every token of it present, the probe finds a shared selection, every
    token has more than exact_below valid tokens, the union at most max_keys rows, no count
    past 15), the unions and their lengths (ULEN [2]: main, extra) for `_mma_packed_kernel`,
    and each token's lengths for the per-token launch (-1 where packed: its program exits at
    once, `SKIP_PACKED`; else its own, at least 0).
    SPLIT_CACHES (with the extra cache): the two caches' unions in two programs side by side
    (`program_id(1)` 0: the extra cache's, 1: the main cache's) instead of one after the
    other. Each stores its union's length, its tokens' valid counts and its count check in
    SYNC_ptr's row of the group ([counter, then per cache: PACK_G counts and the check], the
    counter zeroed by the launcher), then counts itself in with an acq_rel atomic; the one
    that arrives second reads the other's and decides (no program waits on another).
    The program after the last group (`program_id(0)` = its count, `program_id(1)` 0) writes
    the per-token launch's order instead (`_token_order`, tiles of ORDER_BLOCK_N)."""
    grp = tl.program_id(0)
    cache = tl.program_id(1)
    if grp == tl.cdiv(B, PACK_G):
        if cache == 0:
            _token_order(LEN_ptr, stride_len, has_len, ELEN_ptr, stride_elen, has_elen, topk,
                         e_topk, B, ORD_ptr, HIST_ptr, ORDER_BLOCK_N, W_POW2, HAS_EXTRA,
                         ORDER_CHUNK)  # fmt: skip
        return
    t0 = grp * PACK_G
    g = tl.arange(0, PACK_G)
    t = t0 + g
    present = t < B
    t_in = tl.minimum(t, B - 1)  # the last group may be partial: no read past the lengths
    length = _lengths(LEN_ptr, stride_len, has_len, t_in, topk)
    e_length = length
    if HAS_EXTRA:
        e_length = _lengths(ELEN_ptr, stride_elen, has_elen, t_in, e_topk)
    packed = tl.zeros([], dtype=tl.int32)
    decide = cache == 0  # the program that writes the flag and the lengths
    # A token whose lengths hold at most exact_below selections has at most that many valid
    # ones (it takes the exact PV): its group is never packed, so neither the probe nor the
    # unions run for it (SGLang's prefill lengths grow from position 0: a request's first
    # ~256 tokens; session 41, H100: T1024 H8 share256 with those lengths ran 89.4 µs with the
    # plan's unions, 65.6 without the plan).
    most = tl.maximum(length, 0)
    if HAS_EXTRA:
        most += tl.maximum(e_length, 0)
    # The probe's rows load beside the lengths (its first and last token's; t1 clamped for a
    # partial last group, which is never packed): the extra (compressed) cache's selections
    # are the ones that coincide.
    p_idx, p_sb, p_st, p_topk, p_ntok, p_len = (
        IDX_ptr, stride_ib, stride_it, topk, num_tokens, length
    )  # fmt: skip
    if HAS_EXTRA:
        p_idx, p_sb, p_st, p_topk, p_ntok, p_len = (
            EIDX_ptr, stride_eib, stride_eit, e_topk, e_num_tokens, e_length
        )  # fmt: skip
    t1 = tl.minimum(t0 + PACK_G - 1, B - 1)
    pi, r0 = _probe_rows(p_idx, p_sb, p_st, p_topk, t0, t1, PROBE_CHUNK)
    if (t0 + PACK_G <= B) & (tl.min(most, axis=0) > exact_below):
        l0 = tl.sum(tl.where(g == 0, p_len, 0))
        l1 = tl.sum(tl.where(g == PACK_G - 1, p_len, 0))
        found, probed = _found_share(p_idx, p_sb, p_st, p_topk, l0, l1, p_ntok, t0, pi, r0,
                                     PROBE_CHUNK)  # fmt: skip
        if (probed > 0) & (2 * found >= probed):
            u_row = U_ptr + grp.to(tl.int64) * stride_u
            # Per cache: the sorted base row, then PACK_G count rows (`_union_rows`).
            ht = HT_ptr + grp.to(tl.int64) * stride_ht
            if SPLIT_CACHES and HAS_EXTRA:
                sync = SYNC_ptr + grp * (3 + 2 * PACK_G)
                if cache == 0:
                    n_u, n_valid, ok = _union_rows(
                        EIDX_ptr, stride_eib, stride_eit, e_topk, ELEN_ptr, stride_elen,
                        has_elen, e_num_tokens, t0, ht + e_ht_off, u_row + e_u_off,
                        u_row + e_u_off + e_w_off, PACK_G, E_TOPK_POW2, E_TOPK_LOG2,
                    )  # fmt: skip
                else:
                    n_u, n_valid, ok = _union_rows(
                        IDX_ptr, stride_ib, stride_it, topk, LEN_ptr, stride_len, has_len,
                        num_tokens, t0, ht, u_row, u_row + w_off, PACK_G, TOPK_POW2, TOPK_LOG2,
                    )  # fmt: skip
                mine = sync + 1 + cache * (PACK_G + 1)
                tl.store(mine + g, n_valid)
                tl.store(mine + PACK_G, ok.to(tl.int32))
                tl.store(ULEN_ptr + grp * 2 + 1 - cache, n_u)
                tl.debug_barrier()  # every thread's stores before the release below
                arrived = tl.atomic_add(sync, 1, sem="acq_rel")
                decide = arrived == 1
                if decide:
                    other = sync + 1 + (1 - cache) * (PACK_G + 1)
                    n_valid += tl.load(other + g, cache_modifier=".cg")
                    ok = ok & (tl.load(other + PACK_G, cache_modifier=".cg") != 0)
                    n_all = n_u + tl.load(ULEN_ptr + grp * 2 + cache, cache_modifier=".cg")
                    fits = (tl.min(n_valid) > exact_below) & (n_all <= max_keys) & ok
                    packed = fits.to(tl.int32)
            else:
                n_u, n_valid, ok = _union_rows(
                    IDX_ptr, stride_ib, stride_it, topk, LEN_ptr, stride_len, has_len,
                    num_tokens, t0, ht, u_row, u_row + w_off, PACK_G, TOPK_POW2, TOPK_LOG2,
                )  # fmt: skip
                e_n_u = 0
                if HAS_EXTRA:
                    e_n_u, e_n_valid, e_ok = _union_rows(
                        EIDX_ptr, stride_eib, stride_eit, e_topk, ELEN_ptr, stride_elen,
                        has_elen, e_num_tokens, t0, ht + e_ht_off, u_row + e_u_off,
                        u_row + e_u_off + e_w_off, PACK_G, E_TOPK_POW2, E_TOPK_LOG2,
                    )  # fmt: skip
                    n_valid += e_n_valid
                    ok = ok & e_ok
                fits = (tl.min(n_valid) > exact_below) & (n_u + e_n_u <= max_keys) & ok
                packed = fits.to(tl.int32)
                tl.store(ULEN_ptr + grp * 2, n_u)
                tl.store(ULEN_ptr + grp * 2 + 1, e_n_u)
    if decide:
        tl.store(FLAG_ptr + grp, packed)
        tl.store(LEN2_ptr + t, tl.where(packed != 0, -1, tl.maximum(length, 0)), mask=present)
        if HAS_EXTRA:
            e_len2 = tl.where(packed != 0, -1, tl.maximum(e_length, 0))
            tl.store(ELEN2_ptr + t, e_len2, mask=present)


@triton.jit
def _mma_packed_kernel(
    Q_ptr, stride_qb, stride_qh, stride_qd,
    KV_ptr, stride_kv_page, page_size, num_tokens, IDX_ptr, stride_ib, w_off,
    EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens, EIDX_ptr, e_w_off,
    ULEN_ptr, FLAG_ptr,
    SINK_ptr, stride_sink, O_ptr, stride_ob, stride_oh, LSE_ptr, stride_lb, stride_lh,
    H, h_real, qk_scale_log2,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    HAS_SINK: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    RNE_BY_HAND: tl.constexpr,
    S_BY_GROUP: tl.constexpr,
    PREFETCH: tl.constexpr,
    FMT: tl.constexpr = 0,
    E_FMT: tl.constexpr = 0,
):  # fmt: skip
    """One packed group (a "request" of H = PACK_G x h_real rows, q / out / lse rows of
    consecutive tokens being consecutive) and block of rows over the group's unions, one
    split; returns at once for groups the plan left to the per-token launch."""
    pid = tl.program_id(0)
    num_head_blocks = tl.cdiv(H, BLOCK_H)
    b = pid // num_head_blocks
    h0 = (pid % num_head_blocks) * BLOCK_H
    if tl.load(FLAG_ptr + b) != 0:
        end = tl.load(ULEN_ptr + b * 2)
        e_end = 0
        if HAS_EXTRA:
            e_end = tl.load(ULEN_ptr + b * 2 + 1)
        _split_heads(
            h0 + tl.arange(0, BLOCK_H), b, 0, H, 1, Q_ptr, stride_qb, stride_qh, stride_qd,
            KV_ptr, stride_kv_page, page_size, num_tokens, IDX_ptr + b.to(tl.int64) * stride_ib,
            1, 0, end,
            EKV_ptr, stride_ekv_page, e_page_size, e_num_tokens,
            EIDX_ptr + b.to(tl.int64) * stride_ib, 1, 0, e_end,
            SINK_ptr, stride_sink, O_ptr, stride_ob, stride_oh, LSE_ptr, stride_lb, stride_lh,
            O_ptr, LSE_ptr, qk_scale_log2, h_real, w_off, e_w_off,
            True, HAS_EXTRA, HAS_SINK, BLOCK_N, DOT_DTYPE, False, RNE_BY_HAND, S_BY_GROUP, 1,
            PREFETCH, FMT, E_FMT, True,
        )  # fmt: skip


# ----------------------------------------------------------------------------- launch configs


class MMARow(NamedTuple):
    """One row of the per-architecture table: the launch parameters of one GPU family."""

    block_h: int  # heads per program, at most (fewer when H is smaller: next power of 2, >= 16)
    block_n: int  # tokens per tile
    num_warps: int
    # Triton's software pipelining of the bf16-P loop's tile loads (1: none; grids capped by
    # the tile count, one or two tiles per split, always run 1)
    num_stages: int
    programs_per_sm: int  # resident programs the split rule fills each SM with
    s_by_group: bool  # S as 8 products 64 deep (mma.sync holds its A operand in registers)
    exact_block_h: int  # heads per program of the exact-PV pass (its doubled tile must fit)
    # Tokens per tile when the grid is capped by the tile count (every split one tile and SMs
    # left idle, the B1 shapes): smaller tiles, more splits.
    small_grid_block_n: int
    # The exact PV for few-token requests as a branch of the same launch (True) or as a
    # second launch (False): the branch costs the bf16-P loop registers on some rows.
    exact_in_launch: bool
    # Each tile asks L2 for the next tile's rows (`prefetch.global.L2`; not in the CPU
    # interpreter, which has no inline assembly).
    prefetch_next: bool
    # Prefill-sized calls with few heads (a head block of 16, PREFILL_PROGRAMS_PER_SLOT or
    # more programs per resident slot: one split each): tokens per tile and warps there (0:
    # the row's). Their time is the per-row gather and dequantization of programs that hold
    # 16 rows, one program per SM on the sm_90 row (8 warps, 212 registers, two copies of the
    # 64-token K tile in shared memory): 32-token tiles and 4 warps fit two per SM.
    prefill_block_n: int = 0
    prefill_num_warps: int = 0
    # With the exact PV as a second launch: that launch runs on a side stream beside the
    # bf16-P launch (which then counts too and skips the few-token requests), not after it,
    # so its time passes under the bf16-P launch's longest split instead of adding to it.
    exact_concurrent: bool = False
    # Prefill-sized calls with few heads: consecutive query tokens whose selections mostly
    # coincide are attended as one block of up to this many rows (PACK_MAX_TOKENS tokens'
    # heads) over the union of their selections (`_pack_plan_kernel`); 0: never. That
    # block's tokens per tile and warps (the row's decode block of as many rows).
    pack_rows: int = 0
    pack_block_n: int = 0
    pack_num_warps: int = 0
    # Prefill-sized calls with few heads: the bf16-P launch token-major (`_split_heads_tm`:
    # the heads are the products' N, 8 heads per program at H <= 8), with tiles of this many
    # tokens and prefill_tm_num_warps warps (0: off, the head-major prefill tile above); for
    # 16-head blocks (9 to 16 heads) prefill_tm16_* (0: the same). Only with the exact PV as
    # a second launch, which keeps the head-major prefill tile.
    prefill_tm_block_n: int = 0
    prefill_tm_num_warps: int = 0
    prefill_tm16_block_n: int = 0
    prefill_tm16_num_warps: int = 0
    # The token-major builds' resident programs per SM (8-head and 16-head blocks; 0: token-
    # major only from PREFILL_PROGRAMS_PER_SLOT on). With them a call of more than one
    # head-major wave whose token-major programs fit in one round of these slots may take the
    # token-major loop too, one split (tm_one_round).
    prefill_tm_programs_per_sm: int = 0
    prefill_tm16_programs_per_sm: int = 0
    # The bf16-P launch of head-major 64-head single-cache calls as the warp-specialized Gluon
    # kernel (`_ws_split_kernel`: wgmma, so compute capability 9.x only; V4 or V4.1 caches;
    # elsewhere the launcher falls back to `_mma_split_kernel`).
    ws: bool = False
    # Gluon-loop calls of two or more splits with `topk_length` passed: the splits cut each
    # request's valid tiles, not topk (`_plan_piece`: every program computes the plan from
    # the lengths on the device): a request of few tokens gets few pieces, a long one more,
    # all in one round of programs, instead of every request the same splits of topk (the
    # launch then lasting as long as the longest request's split, short requests' SMs idle).
    length_aware: bool = False
    # The Gluon loop computes the few-token requests itself, P's bf16 rounding residue added
    # by a second PV product on their tiles (no exact launch beside it).
    ws_exact: bool = False
    # The Gluon loop (wgmma, 9.x) takes dual-cache calls too, not only single-cache ones.
    ws_dual: bool = False
    # Calls the Triton loop runs with the exact PV as a second launch (9.x: dual caches): that
    # launch as the Gluon loop computing only the few-token requests (ONLY_FEW), where it can.
    ws_exact_launch: bool = False
    # The mma.sync Gluon loop (sm_120 row) in its wide tile (WS_SYNC_WIDE_*) when the call's
    # selected tokens per SM, B x H / 64 x (topk + extra topk) / SMs, reach this (0: never).
    # Proxy, 100 KB per SM (session 19): 1.15-1.27x at 496-1,986 tokens per SM, 0.86-0.95x
    # at 5-310 (the 16-token tile halves each step's work; few programs then).
    ws_wide_tokens_per_sm: int = 0
    # Calls of at most 16 heads (a TP 8 layer's prefill and decode): the Gluon
    # loop in its few-head tile (WS_FEW_*), this many programs per SM (0: never; then the
    # token-major or head-major Triton loops). Session 20: 1.4-1.9x over those on the H200,
    # 1.5-2.3x on the sm_120 proxy at 100 KB per SM.
    ws_few_programs_per_sm: int = 0
    # Those calls with at most this many heads (8 at most; 0: none) and at least
    # ws_few_tm_min_b rows of q (requests, or a prefill's tokens): the few-head tile
    # token-major (`WS_TM_TILE`, `_ws_tm_consumer`). Session 38, H100, H8 dual decode (v45):
    # 1.03-1.07x at B48-B128, 1.08-1.17x on prefill-sized calls, equal at B1 and B32, but
    # 0.95-0.97x at B8-B16 (head-major there).
    ws_few_tm_heads: int = 0
    ws_few_tm_min_b: int = 0
    # Dual-cache calls of up to this many 32-head programs (B x H / 32; 0: never) on a 9.x
    # GPU: the mma.sync Gluon loop's 32 x 32 tile (the sm_120 row's), its exact PV in the same
    # launch, instead of the Triton loop and its second (exact) launch. Session 23 (v31),
    # H200, H64: 1.05-1.19x at B1-B16 full lengths, 1.77-1.96x with partial lengths and
    # invalid slots; 0.80-0.86x at B24 and B32.
    ws_small_dual_programs: int = 0
    # Those calls may take the tile's long form (32 x 64, Hopper's shared memory) where its
    # fewer tiles per split cost less (`small_dual_block_n`). Session 32 (v40), H200: B4
    # dual 1.13-1.16x, B16 1.05-1.06x (and with +-inf sinks, V4.1, H128 B8), B1 / B8 stay 32.
    ws_small_dual_long: bool = False


# Shared memory per block: sm_90 227 KB, sm_120 / sm_89 99 KB (`scripts/compile_check.py`
# checks every build of every row against it). Measured rows: docs/benchmarks.md.
MMA_ROWS: dict[str, MMARow] = {
    # wgmma, 64 heads x 64 tokens: q 64 KB + K tile 64 KB in shared memory (192 KB for the
    # exact pass); the 64 x 512 fp32 accumulator is 128 registers per thread: one program per
    # SM. Unpipelined (2 or 3 stages fit, 169-172 KB, but measured 3-13% slower), and the
    # exact PV a second launch (as a branch of the first it made the bf16-P loop spill:
    # +20-30%). The next tile's rows prefetched into L2: 7-11% faster at B >= 32.
    # Prefill with H <= 16: 32-token tiles, 4 warps (runs P1, P2: T1024 / T4096 H8 dual
    # 430 / 1673 -> 392 / 1513 µs; 16-token tiles or 2 warps slower, 2 pipeline stages 1.6x
    # slower; at H 64 the same change is 3.8x slower, so only for 16-head blocks).
    # The exact launch beside the bf16-P one (side stream): edge rows' ~40 µs exact pass under
    # the longest split (issue 20, session 4: docs/benchmarks.md).
    # Prefill tokens whose selections coincide: 8 tokens' 8 heads as one 64-row block
    # (issue 20, session 7).
    # Prefill-sized calls with up to 16 heads (V4 caches): the bf16-P launch token-major, 8
    # heads x 16 tokens x 2 warps (40,960 B, 168 registers: five per SM) at H <= 8, 16 x 32 x
    # 4 warps at 16 heads (50,240 B: two per SM): 1.09-1.29x over the head-major loop (run H2,
    # v14; fewer warps per tile because a token-major tile of 16 tokens is one MMA row block,
    # which more warps compute again).
    # Between one head-major wave (132 programs) and four: the token-major loop when its
    # programs fit one round of its slots (five per SM at 8 heads, two at 16: run W1, v20),
    # one split (tm_one_round: T256 H8 dual in one round of 16-head programs, 109 -> 91 us,
    # with partial lengths 99 -> 83; v21).
    # Head-major 64-head calls on one cache: the warp-specialized Gluon loop (v23, one run:
    # B64 topk2048 101.0 -> 81.5 us, B128 177.1 -> 143.0, B1 19.6 -> 18.6 with its 64-token
    # tiles where the Triton loop takes 32, B64 H128 topk512 53.5 -> 50.9).
    # Dual-cache calls the Triton loop runs: the exact launch as the Gluon loop computing only
    # the few-token requests (issue 20, session 18: dual edge rows 1.2-1.4x).
    # Dual-cache calls of 64-head blocks: the Gluon loop too (`ws_dual`, session 24: its
    # build without the 168 B spill, 1.02-1.14x over the Triton loop at B24-B256, 1.10x V4.1
    # FP8, 1.89x V4.1 FP4), but the small ones (`ws_small_dual_programs`).
    # Calls of at most 16 heads: the Gluon loop's few-head tile, two programs
    # per SM (session 20: T1024 H8 dual prefill 354.8 -> 230.5 us, B64 H8 dual decode 40.4 ->
    # 27.0); the token-major loop and the packed plan's per-token launch then run only where
    # the Gluon loop cannot (a Triton without Gluon, odd strides).
    "sm90": MMARow(
        64, 64, 8, 1, 1, False, 64, 32, False, True, 32, 4, True, 64, 64, 8, 16, 2, 32, 4, 5, 2,
        ws=True, length_aware=True, ws_exact=True, ws_dual=True, ws_exact_launch=True,
        ws_few_programs_per_sm=2, ws_small_dual_programs=32, ws_small_dual_long=True,
        ws_few_tm_heads=8, ws_few_tm_min_b=32,
    ),
    # mma.sync, 99 KB per block: 32 heads x 32 tokens, 4 warps, S over 64-dim groups; the
    # exact PV for few-token requests a branch of the same launch, 16 heads at a time (2-7%
    # faster than a second launch, 33% on partial lengths). Unpipelined (2 stages spill).
    # 255 registers x 128 threads: two programs per SM by registers (one on sm_120 by shared
    # memory, 100 KB per SM). Measured on an H200 as a proxy (mma.sync forced). No L2
    # prefetch: at 4 warps its addresses spill, 12-17% slower on the proxy.
    "sm120": MMARow(
        32, 32, 4, 1, 2, True, 16, 32, True, False, 0, 0, False, 32, 32, 4, ws=True,
        length_aware=True, ws_exact=True, ws_wide_tokens_per_sm=400, ws_few_programs_per_sm=1,
        ws_few_tm_heads=8, ws_few_tm_min_b=32,
    ),
    # CPU interpreter (tests): small tiles so that the cases span several tiles.
    "interpreter": MMARow(
        64, 16, 4, 1, 1, False, 64, 16, False, False, 0, 0, False, 64, 16, 4, length_aware=True
    ),
}  # fmt: skip


def mma_row_name(cc: tuple[int, int] | None) -> str:
    """The table row for a compute capability (None: the CPU interpreter). sm_100 takes sm_90's
    row (not measured); sm_89 (99 KB per block, mma.sync) sm_120's; sm_80 and older cannot run
    the kernels (no float8e4nv in Triton there) and get sm_120's, the smaller row."""
    if cc is None:
        return "interpreter"
    return "sm90" if cc[0] in (9, 10) else "sm120"


class MMAConfig(NamedTuple):
    """What one call launches: the row's parameters with the split count for its shape."""

    block_h: int
    block_n: int
    num_splits: int
    num_warps: int
    num_stages: int
    pv_split: bool = False  # exact PV (P's bf16 rounding residue added) in the first pass
    # Requests with at most this many valid tokens (counted on the device) take the exact PV;
    # 0: none.
    pv_split_below: int = 0
    s_by_group: bool = False
    exact_block_h: int = 0  # heads per exact-PV sub-block of a program (0: block_h)
    exact_in_launch: bool = False  # few-token requests' exact PV: same launch or a second
    prefetch_next: bool = False  # L2 prefetch of the next tile's rows (GPU only)
    exact_concurrent: bool = False  # the second (exact) launch on a side stream (GPU only)
    # Consecutive query tokens packed into one block where their selections coincide (found on
    # the device; the tokens per block, 0: off).
    pack_tokens: int = 0
    pack_block_h: int = 0  # the packed launch's rows per program, tokens per tile and warps
    pack_block_n: int = 0
    pack_num_warps: int = 0
    # The bf16-P launch token-major (`_split_heads_tm`; block_h may then be 8): prefill-sized
    # calls of few heads. The exact launch keeps the head-major loop with exact_block_h (>= 16)
    # heads and its own tile and warps (exact_block_n, exact_num_warps; 0: block_n, num_warps).
    token_major: bool = False
    exact_block_n: int = 0
    exact_num_warps: int = 0
    ws: bool = False  # the bf16-P launch as `_ws_split_kernel` (Hopper, Gluon)
    # With `topk_length` passed: this many splits (0: the static ones), cut by
    # `_plan_piece` so that all pieces fit plan_round programs per head block.
    plan_splits: int = 0
    plan_round: int = 0
    ws_exact: bool = False  # the Gluon loop computes the few-token requests too (EXACT_IN)
    ws_exact_launch: bool = False  # the second (exact) launch as the Gluon loop (ONLY_FEW)


MAX_SPLITS = 64
# Up to this many selected tokens (topk + extra topk, known from shapes, no data read) the
# kernel adds P's bf16 rounding residue to PV (pv_split): with only a few valid tokens each one
# carries a large weight, and bf16 P (2^-9 relative, as in FlashMLA) can miss the 1e-3
# absolute bound on near-zero outputs. At larger topk the residue averages out; pv_split
# costs 2-3x there on sm_90 (measured), so it stays off. The same count (per request, on the
# device) picks the requests that take the residue in larger calls: in the Gluon loops too,
# whose fp16 P rounds 8x finer, since with a peaked softmax (nope groups spread over 2^[-4, 4])
# requests of 65-256 valid tokens missed the out bound there with a threshold of 64 (session
# 49, H100: up to 4.4x the bound; T1024 H64 causal would have gained 1.04x).
PV_SPLIT_MAX_TOKENS = 256
# A call is prefill-sized for the table's `prefill_*` fields from this many programs per
# resident slot (SMs x programs per SM) on: every program then has one split.
PREFILL_PROGRAMS_PER_SLOT = 4
# Calls of one to four head-major waves with up to 16 heads (sm_90 row): the token-major loop
# in one round of its slots (tm_one_round) only while a program walks at most this many tiles
# (~176 us on the H200; measured winning with full and partial lengths: T512 H8 dual's 40-tile
# programs, T256's 20; the topk2048 rows' 64-tile programs lost with partial lengths, v21),
# and fewer tile-times than the head-major rounds, a token-major tile (16 tokens x 8 heads or
# 32 x 16) costing this much of a head-major one (64 tokens x 16 heads): ~4.4 us (T1024 H8 /
# H16 dual, 176 / 88 us a round of 40 / 20 tiles) against ~5.5 (T256 H8 dual, 2 rounds of 10
# tiles in 109 us). So T132 (one head-major round) and T300 H8 (three) keep the head-major loop.
TM_ONE_ROUND_MAX_TILES = 40
TM_TILE_PER_HM_TILE = 0.8
# Index rows up to this long are counted (exact pass) in one block; longer ones in a loop.
COUNT_BLOCK_MAX = 4096
# The exact launch runs beside the bf16-P launch (a row's `exact_concurrent`) only when each
# split walks at least this many tiles: the exact programs' work is at most a split's tiles,
# and with one or two the serial launch costs less than the fork, join and count (run S1:
# B1 and B16 rows 1-2 µs slower side by side in the one-call-per-graph peers harness).
EXACT_CONCURRENT_MIN_TILES = 3
# At most this many query tokens per packed block (each key's word holds 4-bit counts of 8).
PACK_MAX_TOKENS = 8
# The plan's two unions (main and extra cache) in two programs side by side (a grid of groups
# x caches) instead of one after the other in one program, and its 8-warp build capped at 128
# registers (ptxas's own choice: 252-254, one program per SM; capped: 40 bytes of spill, two
# per SM, so the two caches' programs of a group do run side by side). Run M1 (issue 20,
# session 12): plan T1024 / T4096 H8 dual share256 40.3 / 138.5 -> 35.0 / 103.7 us; the split
# alone 37.4 / 141.9.
PACK_PLAN_SPLIT_CACHES = True
PACK_PLAN_MAXNREG = 128
# The Gluon builds prefetch q's rows and the index rows into L2 as a program starts
# (`_ws_prefetch_start`): the consumers' q and count, and the loader's first index load, then
# find them in L2. Session 43, H100, mma.sync builds: T1024 H8 / H16 causal 1.016x, partial
# 1.011x, full lengths and decode even. The wgmma builds (one program per SM) only when an SM
# runs several programs in a row (more head blocks than SMs): session 49, H100, T1024 H64
# causal 1.03x, but B64 H64 dual decode (one wave) 0.97x.
WS_PREFETCH_START = True
# Entries of token t0's row the plan's probe reads in one load (`_probe_rows`, beside the
# lengths): the extra cache's 512 in one, not two of 256 (session 43); a longer row in a loop.
PACK_PROBE_CHUNK = 512
# Tokens per step of the plan's order program (`_token_order`: one program, two passes).
PACK_ORDER_CHUNK = 1024
# A group is packed when its union has at most (tokens per group) x (topk + extra topk) /
# PACK_KEYS_DIVISOR rows: a 64-row block costs ~1.2x a 16-row block per row (T1024 H64 against
# H8 dual, 464 against 383 µs), so the margin is wide.
PACK_KEYS_DIVISOR = 2


def mma_config(
    cc: tuple[int, int] | None,
    sm_count: int,
    B: int,
    H: int,
    topk: int,
    extra_topk: int,
    row: MMARow | None = None,
) -> MMAConfig:
    """The MMA kernel's launch config for compute capability `cc` (None: CPU interpreter)
    with `sm_count` SMs and this shape; `row` replaces the table's row (tuning). Pure: reads
    no device.

    The grid is sized to one full wave: splits = floor(SMs x programs per SM / (B x head
    blocks)), at least 1, at most the tiles of the two caches together. Fewer, fuller programs
    beat a second partial wave: each split also writes a BLOCK_H x 512 fp32 partial that the
    combine kernel re-reads.
    """
    if row is None:
        row = MMA_ROWS[mma_row_name(cc)]
    on_gpu = cc is not None
    block_h = min(row.block_h, max(16, triton.next_power_of_2(H)))
    programs = B * triton.cdiv(H, block_h)
    slots = prefill_slots = sm_count * row.programs_per_sm
    block_n, stages, warps = row.block_n, row.num_stages, row.num_warps
    prefill = block_h <= 16 and programs >= PREFILL_PROGRAMS_PER_SLOT * slots
    one_round = None  # (token-major heads per program, splits): one round of them (v21)
    if (
        not prefill and block_h <= 16 and programs >= slots and row.prefill_tm_block_n
        and not row.exact_in_launch and not (on_gpu and topk + extra_topk <= PV_SPLIT_MAX_TOKENS)
    ):  # fmt: skip
        one_round = tm_one_round(row, sm_count, B, H, topk, extra_topk)
    prefill = prefill or one_round is not None
    if row.prefill_block_n and prefill:
        block_n, warps = row.prefill_block_n, row.prefill_num_warps or warps
    token_major = prefill and row.prefill_tm_block_n > 0 and not row.exact_in_launch
    small_dual = (
        on_gpu and cc[0] == 9 and extra_topk > 0 and topk + extra_topk > PV_SPLIT_MAX_TOKENS
        and row.ws and H > WS_FEW_BLOCK_H and H % WS_SYNC_BLOCK_H == 0
        and B * (H // WS_SYNC_BLOCK_H) <= row.ws_small_dual_programs
    )  # fmt: skip
    if small_dual:  # the mma.sync tile below (ws_sync)
        block_h = WS_SYNC_BLOCK_H
        programs = B * (H // block_h)
        block_n = small_dual_block_n(row, sm_count, programs, topk, extra_topk)
    exact_block_h = min(row.exact_block_h, block_h)
    exact_block_n = exact_warps = 0
    if token_major:
        exact_block_n, exact_warps = block_n, warps
        block_h = one_round[0] if one_round else min(16, max(8, triton.next_power_of_2(H)))
        block_n, tm_warps = row.prefill_tm_block_n, row.prefill_tm_num_warps
        if block_h == 16:
            block_n, tm_warps = (
                row.prefill_tm16_block_n or block_n,
                row.prefill_tm16_num_warps or tm_warps,
            )
        warps = tm_warps or warps
    # Few tokens: P's bf16 rounding would show, and the exact PV is cheap there. Larger
    # shapes: the requests whose valid tokens are few take it (the interpreter computes in
    # fp32 and needs neither).
    pv_split = on_gpu and topk + extra_topk <= PV_SPLIT_MAX_TOKENS
    # The warp-specialized loop: wgmma (compute capability 9.x), its 64 x 64 tile, bf16 P;
    # single-cache rows 1.12-1.32x over the Triton loop (session 16, v24; H128 the least).
    # Dual-cache calls with the row's `ws_dual`: 0.80-0.93x at B32-B256 until session 24
    # found its dual build spilling (now counted before the fork: 1.02-1.14x). Small
    # dual-cache calls (`small_dual` above) take its mma.sync form instead.
    ws_wgmma = (
        on_gpu and cc[0] == 9 and (extra_topk == 0 or row.ws_dual)
        and (block_h, block_n) == (WS_BLOCK_H, WS_BLOCK_N)
    )  # fmt: skip
    # Its mma.sync form (the sm_120 row on sm_120, or on a 9.x GPU as the proxy; sm_89 has no
    # setmaxnreg for the loader's registers), one 88 KB program per SM: both caches, whole
    # 32-head blocks. Measured on the H200 as a proxy (session 16, v24, residency capped at
    # sm_120's 100 KB per SM): 1.43-1.58x faster than the Triton loop at B >= 64.
    ws_sync = (
        on_gpu and cc[0] in (9, 12) and H % block_h == 0
        and ((block_h, block_n) == (WS_SYNC_BLOCK_H, WS_SYNC_BLOCK_N) or small_dual)
    )  # fmt: skip
    ws = row.ws and not token_major and not pv_split and (ws_wgmma or ws_sync)
    wide = WS_SYNC_WIDE_BLOCK_H
    if (
        ws and ws_sync and row.ws_wide_tokens_per_sm and H % wide == 0
        and B * (H // wide) * (topk + extra_topk) >= row.ws_wide_tokens_per_sm * sm_count
    ):  # fmt: skip
        block_h, block_n = wide, WS_SYNC_WIDE_BLOCK_N
        programs = B * (H // wide)
    # At most 16 heads: the Gluon loop's few-head tile (mma.sync; 8 heads pad to 16 rows),
    # both caches, decode and prefill-sized calls alike, in its own residency.
    few = (
        on_gpu and cc[0] in (9, 12) and row.ws and row.ws_few_programs_per_sm > 0
        and H <= WS_FEW_BLOCK_H and not pv_split
    )  # fmt: skip
    if few:
        block_h, block_n, warps, stages = WS_FEW_BLOCK_H, WS_FEW_BLOCK_N, WS_FEW_WARPS, 1
        if H <= min(row.ws_few_tm_heads, WS_TM_BLOCK_H) and B >= row.ws_few_tm_min_b:
            block_h = WS_TM_BLOCK_H
        ws, token_major, one_round = True, False, None
        exact_block_n = exact_warps = 0
        programs = B
    exact_in_launch = row.exact_in_launch and not ws  # the Gluon loop: its own (ws_exact)
    if few:
        slots = sm_count * row.ws_few_programs_per_sm
    elif ws:
        stages = 1  # the Gluon loop's own ring of raw tiles is its pipeline
        if not ws_wgmma:
            slots = sm_count  # one program per SM
    elif programs * _tiles(topk, extra_topk, block_n) < slots:
        # one or two tiles per split: smaller tiles, nothing to pipeline
        block_n, stages = row.small_grid_block_n, 1
    tiles = _tiles(topk, extra_topk, block_n)
    splits = _wave_splits(slots, programs, tiles)
    if one_round:
        splits = one_round[1]
    below = PV_SPLIT_MAX_TOKENS if on_gpu else 0
    if pv_split:  # the first pass is the exact one: its doubled tile must fit
        block_h, token_major = exact_block_h, False
        block_n, warps = exact_block_n or block_n, exact_warps or warps
        exact_block_n = exact_warps = 0
        splits = _wave_splits(slots, B * triton.cdiv(H, block_h), tiles)
    concurrent = triton.cdiv(tiles, splits) >= EXACT_CONCURRENT_MIN_TILES
    pack = 0
    if row.pack_rows and block_h <= 16 and programs >= PREFILL_PROGRAMS_PER_SLOT * prefill_slots:
        pack = min(PACK_MAX_TOKENS, row.pack_rows // triton.next_power_of_2(H))
    # Up to twice the static splits for the length-aware plan: with lengths spread evenly
    # from 0 to topk the longest request holds about twice the mean's tiles. The Gluon loop
    # only: in the Triton loop (dual-cache calls on 9.x) it measured 0.97x on the dual edge
    # row and cost 3.5-6 us on full lengths (session 17, v25).
    plan_splits = plan_round = 0
    # (not the few-head tile: measured with its static splits only, session 20)
    if row.length_aware and ws and splits >= 2 and not pv_split and not token_major and not few:
        plan_splits = min(2 * splits, tiles, MAX_SPLITS)
        plan_round = slots // triton.cdiv(H, block_h)
    return MMAConfig(
        block_h, block_n, splits, warps, stages, pv_split, below,
        row.s_by_group, exact_block_h, exact_in_launch, on_gpu and row.prefetch_next,
        on_gpu and (row.exact_concurrent or ws) and concurrent,
        pack if pack >= 2 and not pv_split else 0,
        row.pack_rows, row.pack_block_n, row.pack_num_warps, token_major, exact_block_n,
        exact_warps, ws, plan_splits, plan_round, ws and row.ws_exact,
        on_gpu and cc[0] == 9 and row.ws_exact_launch and not ws and not token_major,
    )  # fmt: skip


def small_dual_block_n(row: MMARow, sm_count: int, programs: int, topk: int, e_topk: int) -> int:
    """The tokens of a tile of the sm_90 row's small dual-cache calls: 32, or (the row's
    `ws_small_dual_long`) 64 where the longest split's tiles cost less so, a tile costing its
    tokens plus WS_SYNC_TILE_COST_TOKENS. One program per SM, as `mma_config` splits them: B1
    dual (2 programs) keeps 32 (one tile of 32 tokens against one of 64), B4 takes 64 (two
    tiles against one), B8 32 (three against two), B16 64 (five against three)."""
    if not row.ws_small_dual_long:
        return WS_SYNC_BLOCK_N

    def cost(block_n):
        tiles = _tiles(topk, e_topk, block_n)
        return triton.cdiv(tiles, _wave_splits(sm_count, programs, tiles)) * (
            block_n + WS_SYNC_TILE_COST_TOKENS
        )

    return min((WS_SYNC_LONG_BLOCK_N, WS_SYNC_BLOCK_N), key=cost)  # ties: the longer tile


def tm_one_round(
    row: MMARow, sm_count: int, B: int, H: int, topk: int, extra_topk: int
) -> tuple[int, int] | None:
    """(heads per program, 1) of the token-major build that runs a call of B tokens of H <= 16
    heads in one round of its resident slots (SMs x `prefill_tm16_programs_per_sm` at 16
    heads, preferred: its programs walk half the tiles; else SMs x
    `prefill_tm_programs_per_sm` at 8 heads, H <= 8), one split, or None. Taken only when a
    program walks at most TM_ONE_ROUND_MAX_TILES tiles and fewer tile-times than the
    head-major loop's rounds (ceil(B x head blocks / SMs x programs per SM) programs of its
    64-token tiles; a token-major tile costs TM_TILE_PER_HM_TILE of one). No splits: every
    split form measured (8 heads, 2-5 splits) lost with partial lengths (v21). Pure: from
    shapes, no device read."""
    hm_rounds = triton.cdiv(B * triton.cdiv(H, 16), sm_count * row.programs_per_sm)
    hm_tiles = hm_rounds * _tiles(topk, extra_topk, row.block_n)
    for bh, per_sm, bn in (
        (16, row.prefill_tm16_programs_per_sm or row.prefill_tm_programs_per_sm,
         row.prefill_tm16_block_n or row.prefill_tm_block_n),
        (8, row.prefill_tm_programs_per_sm, row.prefill_tm_block_n),
    ):  # fmt: skip
        if bh < H or per_sm <= 0 or B > sm_count * per_sm:
            continue
        tiles = _tiles(topk, extra_topk, bn)
        if tiles <= TM_ONE_ROUND_MAX_TILES and tiles * TM_TILE_PER_HM_TILE < hm_tiles:
            return bh, 1
        return None
    return None


def _tiles(topk: int, extra_topk: int, block_n: int) -> int:
    return max(triton.cdiv(topk, block_n) + triton.cdiv(extra_topk, block_n), 1)


def _wave_splits(slots: int, programs: int, tiles: int) -> int:
    """Splits per program that fill one wave of `slots` (at least 1, at most the tiles and
    MAX_SPLITS)."""
    return max(1, min(slots // programs, tiles, MAX_SPLITS))


def _device_mma_config(
    device: torch.device, B: int, H: int, topk: int, e_topk: int, ws: bool = True,
    fp4_extra: bool = False,
):  # fmt: skip
    """`mma_config` for this device; `ws` off: its row without the Gluon loop; `fp4_extra`
    (a V4.1 FP4 extra cache): without the small dual-cache tile's long form, whose FP4 build
    spills (16 B; session 32, B16 dual 0.96-0.97x)."""
    if device.type != "cuda":
        return mma_config(None, 2, B, H, topk, e_topk)
    cc = torch.cuda.get_device_capability(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    row = MMA_ROWS[mma_row_name(cc)]
    if not ws:
        row = row._replace(ws=False)
    if fp4_extra:
        row = row._replace(ws_small_dual_long=False)
    return mma_config(cc, sms, B, H, topk, e_topk, row)


# ----------------------------------------------------------------------------- launchers


# Kernel argument names of one cache's group: the main cache, and the extra cache.
_MAIN_CACHE_ARGS = ("KV_ptr", "stride_kv_page", "page_size", "num_tokens", "IDX_ptr",
                    "stride_ib", "stride_it", "topk", "LEN_ptr", "stride_len")  # fmt: skip
_EXTRA_CACHE_ARGS = ("EKV_ptr", "stride_ekv_page", "e_page_size", "e_num_tokens", "EIDX_ptr",
                     "stride_eib", "stride_eit", "e_topk", "ELEN_ptr", "stride_elen")  # fmt: skip


def _cache_args(k_cache, indices, topk_length, names=_MAIN_CACHE_ARGS) -> dict:
    """One cache's kernel arguments by name: byte view, page stride in bytes, page size, token
    count, index rows and strides, topk, lengths (the index tensor stands in when there are
    none: never read, `has_len` is 0) and their stride (1 then: the same specialisation)."""
    raw = k_cache if k_cache.dtype == torch.uint8 else k_cache.view(torch.uint8)
    page_size = k_cache.shape[1]
    values = (
        raw, k_cache.stride(0) * k_cache.element_size(), page_size, k_cache.shape[0] * page_size,
        indices, indices.stride(0), indices.stride(-1), indices.shape[-1],
        topk_length if topk_length is not None else indices,
        topk_length.stride(0) if topk_length is not None else 1,
    )  # fmt: skip
    return dict(zip(names, values, strict=True))


def _common_args(q, attn_sink, out, lse, scale_log2) -> dict:
    """q, sink, out and lse arguments shared by both kernels (lse stands in for a missing sink:
    never read, HAS_SINK is off)."""
    return dict(
        Q_ptr=q, stride_qb=q.stride(0), stride_qh=q.stride(2), stride_qd=q.stride(3),
        SINK_ptr=attn_sink if attn_sink is not None else lse,
        stride_sink=attn_sink.stride(0) if attn_sink is not None else 0,
        O_ptr=out, stride_ob=out.stride(0), stride_oh=out.stride(2),
        LSE_ptr=lse, stride_lb=lse.stride(0), stride_lh=lse.stride(1),
        qk_scale_log2=scale_log2,
    )  # fmt: skip


def _launch_simt(q, main, extra, common, flags):
    B, _, H, _ = q.shape
    _simt_decode_kernel[(B, H)](
        **common, **main, **extra, BLOCK_N=16, **flags, num_warps=4, num_stages=1,
    )  # fmt: skip


# One side stream per device for the exact launch (exact_concurrent), made on first use.
_SIDE_STREAMS: dict = {}


@functools.cache
def _pdl(device: torch.device) -> bool:
    """Whether the combine is launched as the split kernel's programmatic dependent: a 9.x or
    newer GPU (`griddepcontrol`) and a Triton that has it."""
    return (
        HAS_PDL and device.type == "cuda" and torch.version.hip is None
        and torch.cuda.get_device_capability(device)[0] >= 9
    )  # fmt: skip


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _side_stream(device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def _rows_consecutive(q, out, lse) -> bool:
    """Whether token t + 1's head rows follow token t's in q, out and lse (a packed group's
    rows are then one "request" of PACK_G x H heads)."""
    H = q.shape[2]
    return (q.stride(0) == H * q.stride(2) and out.stride(0) == H * out.stride(2)
            and lse.stride(0) == H * lse.stride(1))  # fmt: skip


def _launch_pack_plan(q, main, extra, flags, cfg, exact_below):
    """Queue `_pack_plan_kernel`; returns the buffers `_launch_packed` reads and the per-token
    launch's cache arguments (the packed tokens' lengths 0)."""
    B, _, H, _ = q.shape
    G = cfg.pack_tokens
    has_extra = flags["HAS_EXTRA"]
    topk = main["topk"]
    e_topk = extra["e_topk"] if has_extra else 0
    groups = triton.cdiv(B, G)
    cap, e_cap = G * topk, G * e_topk
    dev = q.device
    # Per group: main union indices | their count words | extra union indices | their words.
    union = torch.empty(groups, 2 * (cap + e_cap), dtype=torch.int32, device=dev)
    union_len = torch.empty(groups, 2, dtype=torch.int32, device=dev)
    flag = torch.empty(groups, dtype=torch.int32, device=dev)
    len2 = torch.empty(B, dtype=torch.int32, device=dev)
    e_len2 = torch.empty(B, dtype=torch.int32, device=dev) if has_extra else len2
    topk_pow2 = triton.next_power_of_2(max(topk, 1))
    e_topk_pow2 = triton.next_power_of_2(max(e_topk, 1))
    # Scratch per cache: the sorted base row (topk_pow2), then G count rows (`_union_rows`).
    e_ht_off = (G + 1) * topk_pow2
    scratch = torch.empty(groups, e_ht_off + (G + 1) * e_topk_pow2, dtype=torch.int32, device=dev)
    max_keys = G * (topk + e_topk) // PACK_KEYS_DIVISOR
    table_slots = G * max(topk_pow2, e_topk_pow2)
    split = PACK_PLAN_SPLIT_CACHES and has_extra
    # With the unions in two programs: per group a counter, then per cache G valid counts and
    # a count check (the counter must start at 0: one memset node, also in a CUDA graph).
    # Then the order's bucket counters (`_token_order`: its tiles are the per-token launch's).
    n_sync = groups * (3 + 2 * G) if split else 1
    buckets = triton.next_power_of_2(
        triton.cdiv(topk, cfg.block_n) + triton.cdiv(e_topk, cfg.block_n) + 1
    )  # fmt: skip
    sync = torch.zeros(n_sync + 2 * buckets, dtype=torch.int32, device=dev)
    order = torch.empty(2 * B, dtype=torch.int32, device=dev)  # the order, then scratch
    probe_chunk = min(PACK_PROBE_CHUNK, e_topk_pow2 if has_extra else topk_pow2)
    warps = 16 if table_slots > 4096 else 8
    options = {"maxnreg": PACK_PLAN_MAXNREG} if PACK_PLAN_MAXNREG and warps == 8 else {}
    _pack_plan_kernel[(groups + 1, 2 if split else 1)](
        main["IDX_ptr"], main["stride_ib"], main["stride_it"], topk, main["LEN_ptr"],
        main["stride_len"], main["num_tokens"],
        extra["EIDX_ptr"], extra["stride_eib"], extra["stride_eit"], extra["e_topk"],
        extra["ELEN_ptr"], extra["stride_elen"], extra["e_num_tokens"],
        union, union.stride(0), 2 * cap, cap, e_cap, union_len, flag, len2, e_len2, scratch,
        scratch.stride(0), e_ht_off, sync, B, flags["has_len"], flags["has_elen"], exact_below,
        max_keys, order, sync[n_sync:],
        PACK_G=G, TOPK_POW2=topk_pow2, E_TOPK_POW2=e_topk_pow2,
        TOPK_LOG2=topk_pow2.bit_length() - 1, E_TOPK_LOG2=e_topk_pow2.bit_length() - 1,
        HAS_EXTRA=has_extra, PROBE_CHUNK=probe_chunk, SPLIT_CACHES=split, ORDER_BLOCK_N=cfg.block_n,
        W_POW2=buckets, ORDER_CHUNK=PACK_ORDER_CHUNK, num_warps=warps, **options,
    )  # fmt: skip
    # The per-token launch reads the plan's lengths: -1 (a packed token: its programs exit at
    # once, SKIP_PACKED) or the token's own.
    main = {**main, "LEN_ptr": len2, "stride_len": 1}
    if has_extra:
        extra = {**extra, "ELEN_ptr": e_len2, "stride_elen": 1}
    flags = {**flags, "has_len": 1, "has_elen": int(has_extra), "SKIP_PACKED": True}
    plan = dict(union=union, union_len=union_len, flag=flag, cap=cap, e_cap=e_cap, G=G, cfg=cfg,
                order=order)  # fmt: skip
    return plan, main, extra, flags


def _launch_packed(q, main, extra, common, flags, plan):
    """Queue `_mma_packed_kernel` over the groups the plan packed (the others return)."""
    B, _, H, _ = q.shape
    G, union = plan["G"], plan["union"]
    groups = union.shape[0]
    rows = G * H
    has_extra = flags["HAS_EXTRA"]
    cfg = plan["cfg"]
    block_h = min(cfg.pack_block_h, triton.next_power_of_2(rows))
    o, lse = common["O_ptr"], common["LSE_ptr"]
    _mma_packed_kernel[(groups * triton.cdiv(rows, block_h),)](
        q, G * q.stride(0), q.stride(2), q.stride(3),
        main["KV_ptr"], main["stride_kv_page"], main["page_size"], main["num_tokens"],
        union, union.stride(0), plan["cap"],
        extra["EKV_ptr"], extra["stride_ekv_page"], extra["e_page_size"], extra["e_num_tokens"],
        union[:, 2 * plan["cap"]:] if has_extra else union, plan["e_cap"],
        plan["union_len"], plan["flag"],
        common["SINK_ptr"], common["stride_sink"], o, G * o.stride(0), o.stride(2),
        lse, G * lse.stride(0), lse.stride(1), rows, H, common["qk_scale_log2"],
        BLOCK_H=block_h, BLOCK_N=cfg.pack_block_n, HAS_EXTRA=has_extra,
        HAS_SINK=flags["HAS_SINK"],
        DOT_DTYPE=tl.bfloat16 if q.is_cuda else tl.float32, RNE_BY_HAND=flags["RNE_BY_HAND"],
        S_BY_GROUP=cfg.s_by_group, PREFETCH=cfg.prefetch_next and q.is_cuda,
        FMT=flags["FMT"], E_FMT=flags["E_FMT"], num_warps=cfg.pack_num_warps, num_stages=1,
    )  # fmt: skip


def _head_major(cfg: MMAConfig) -> MMAConfig:
    """A token-major config's head-major form: the exact launch's heads, tile and warps for the
    bf16-P launch too (the DSv4.1 formats: their token-major builds spill, run H2: the V4.1
    FP8 + FP4 prefill row 0.69x, V4.1 FP8 0.94x of the head-major loop)."""
    if not cfg.token_major:
        return cfg
    return cfg._replace(
        block_h=max(cfg.exact_block_h, 16), block_n=cfg.exact_block_n or cfg.block_n,
        num_warps=cfg.exact_num_warps or cfg.num_warps, token_major=False, exact_block_n=0,
        exact_num_warps=0,
    )  # fmt: skip


# (main, extra) cache formats the Gluon loop reads (without an extra cache E_FMT is FMT)
_WS_FORMAT_PAIRS = ((FMT_V4, FMT_V4), (FMT_V41, FMT_V41), (FMT_V41, FMT_V41_FP4))


def _ws_runnable(q, main, extra, flags, tile: tuple[int, int]) -> bool:
    """Whether `_ws_split_kernel` can run this call with `tile` (heads, tokens): Gluon present,
    a 9.x GPU (wgmma's 64 x 64 tile, mma.sync's long 32 x 64) or a 9.x / 12.x one (mma.sync's
    other `WS_SYNC_TILES`: 32 x 32, the wide 64 x 16 and the few-head 16 x 32), cache formats
    in `_WS_FORMAT_PAIRS` (V4 and V4, V4.1 FP8 and V4.1 FP8 or FP4), their bytes and page
    strides 16-byte aligned (cp.async of 16 bytes; the bf16 view of V4's rope needs even
    strides), q rows contiguous."""
    cap = torch.cuda.get_device_capability(q.device) if q.is_cuda else (0, 0)
    return (
        HAS_GLUON and q.is_cuda
        and ((cap[0] == 9 and tile in ((WS_BLOCK_H, WS_BLOCK_N), WS_SYNC_LONG_TILE))
             or (cap[0] in (9, 12) and tile in WS_SYNC_TILES and tile != WS_SYNC_LONG_TILE))
        and (flags["FMT"], flags["E_FMT"]) in _WS_FORMAT_PAIRS and q.stride(3) == 1
        and main["KV_ptr"].data_ptr() % 16 == 0 and extra["EKV_ptr"].data_ptr() % 16 == 0
        and main["stride_kv_page"] % 16 == 0 and extra["stride_ekv_page"] % 16 == 0
    )  # fmt: skip


def _launch_ws(
    q, main, extra, common, flags, splits, tiles_per_split, part_o, part_lse, exact_below,
    block_h, block_n, plan=None, exact_in=False, only_few=False, dependents=False, order=None,
):  # fmt: skip
    """The bf16-P launch as `_ws_split_kernel` (same grid, split of the tile lists and outputs
    as `_mma_split_kernel`'s) in tiles of block_h x block_n (wgmma's, else one of mma.sync's);
    exact_below > 0: the few-token requests are left out; `order` (with the packed plan's
    lengths): the token of each rank of programs (`_token_order`)."""
    B, _, H, _ = q.shape
    kv, ekv = main["KV_ptr"], extra["EKV_ptr"]  # uint8 views (strided: no copy, no reshape)
    ps, eps = main["page_size"], extra["e_page_size"]
    pow2 = ps & (ps - 1) == 0 and eps & (eps - 1) == 0  # the loader's page by shifts
    build = ws_build((block_h, block_n), flags["HAS_EXTRA"], flags["E_FMT"], pow2, dependents)
    head_blocks = B * triton.cdiv(H, block_h)
    prefetch = WS_PREFETCH_START and (
        build["MMA_SYNC"] or head_blocks > _sm_count(q.device)
    )  # fmt: skip
    _ws_split_kernel[(head_blocks, splits)](
        q, common["stride_qb"], common["stride_qh"],
        kv.view(torch.float8_e4m3fn), kv, kv.view(torch.bfloat16), main["stride_kv_page"],
        main["page_size"], main["num_tokens"], main["IDX_ptr"], main["stride_ib"],
        main["stride_it"], main["topk"], main["LEN_ptr"], main["stride_len"], flags["has_len"],
        ekv.view(torch.float8_e4m3fn), ekv, ekv.view(torch.bfloat16), extra["stride_ekv_page"],
        extra["e_page_size"], extra["e_num_tokens"], extra["EIDX_ptr"], extra["stride_eib"],
        extra["stride_eit"], extra["e_topk"], extra["ELEN_ptr"], extra["stride_elen"],
        flags["has_elen"],
        common["SINK_ptr"], common["stride_sink"], common["O_ptr"], common["stride_ob"],
        common["stride_oh"], common["LSE_ptr"], common["stride_lb"], common["stride_lh"],
        part_o, part_lse, H, common["qk_scale_log2"], splits, tiles_per_split,
        SINGLE_SPLIT=splits == 1, HAS_EXTRA=flags["HAS_EXTRA"], HAS_SINK=flags["HAS_SINK"],
        EXACT_BELOW=exact_below, COUNT_BLOCK=1024, BLOCK_H=block_h, BLOCK_N=block_n,
        EXACT_IN=exact_in, ONLY_FEW=only_few,
        SKIP_PACKED=flags.get("SKIP_PACKED", False), PERM_ptr=order, FMT=flags["FMT"],
        E_FMT=flags["E_FMT"], page_shift=ps.bit_length() - 1, e_page_shift=eps.bit_length() - 1,
        POW2_PAGES=pow2, PREFETCH_START=prefetch, **build,
        **(plan or {}),
    )  # fmt: skip


def _launch_mma(q, main, extra, common, flags, cfg):
    B, _, H, _ = q.shape
    topk, e_topk = main["topk"], (extra["e_topk"] if flags["HAS_EXTRA"] else 0)
    derived = cfg is None
    fp4_extra = flags["HAS_EXTRA"] and flags["E_FMT"] == FMT_V41_FP4
    if cfg is None:
        cfg = _device_mma_config(q.device, B, H, topk, e_topk, fp4_extra=fp4_extra)
    ws_ok = not cfg.token_major and not cfg.pv_split and not cfg.exact_in_launch
    if cfg.ws and not (ws_ok and _ws_runnable(q, main, extra, flags, (cfg.block_h, cfg.block_n))):
        # the Triton loop instead, with the tile its row takes then
        cfg = (_device_mma_config(q.device, B, H, topk, e_topk, ws=False) if derived
               else cfg._replace(ws=False))  # fmt: skip
    if not cfg.ws and not cfg.token_major and cfg.block_h < 16:
        cfg = cfg._replace(block_h=16)  # the Triton loop's head-major tl.dot needs 16 rows
    if flags["FMT"] != FMT_V4 or flags["E_FMT"] != FMT_V4:
        cfg = _head_major(cfg)  # the token-major loop only for V4 caches
    plan = None
    if cfg.pack_tokens >= 2 and _rows_consecutive(q, common["O_ptr"], common["LSE_ptr"]):
        # Packed groups first planned; the per-token launch's programs then exit at once for
        # their tokens (length -1), and the packed launch after it writes them.
        exact_below = 0 if cfg.pv_split else cfg.pv_split_below
        plan, main, extra, flags = _launch_pack_plan(q, main, extra, flags, cfg, exact_below)
    splits = cfg.num_splits
    split_plan = combine_plan = None
    triton_plan = {}
    if cfg.plan_splits > 1 and plan is None and (flags["has_len"] or flags["has_elen"]):
        # the length-aware split: every program computes its piece (`_plan_piece`); the
        # request's piece count, for the combine, from its program (b, 0)
        splits = cfg.plan_splits
        pieces = torch.empty(B, dtype=torch.int32, device=q.device)
        split_plan = dict(PIECES_ptr=pieces, B=B, per_round=max(cfg.plan_round, 1), PLAN=True,
                          B_POW2=triton.next_power_of_2(B))  # fmt: skip
        triton_plan = dict(split_plan, PLAN_BLOCK_N=cfg.block_n)  # the pieces in these tiles
        combine_plan = dict(PIECES_ptr=pieces, PLAN=True)
    if splits > 1:
        part_o = torch.empty(B, H, splits, HEAD_DIM, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(B, H, splits, dtype=torch.float32, device=q.device)
    else:
        part_o, part_lse = common["O_ptr"], common["LSE_ptr"]  # unused
    # The interpreter computes a bf16 tl.dot on raw bit patterns (triton-lang/triton#11584, an
    # unsupported interpreter limitation), so on CPU the operands are float32 instead.
    dot_dtype = tl.bfloat16 if q.is_cuda else tl.float32
    # pv_split: the exact PV for every request (small topk), one launch. Otherwise, with
    # pv_split_below > 0, requests with at most that many valid tokens (each program counts its
    # request's indices: one block up to COUNT_BLOCK_MAX) take the exact PV: in the same launch
    # as the bf16-P loop (exact_in_launch), or in a second launch over the same splits that
    # overwrites the first one's results for them and returns for the others. The second
    # launch's programs hold exact_block_h heads each: the few requests it redoes are spread
    # over more SMs, and the doubled tile and smaller accumulator do not spill. With
    # exact_concurrent the pair splits the requests instead (the bf16-P launch counts too and
    # skips the few-token ones) and the exact launch runs on a side stream beside it: with
    # partial lengths most of the bf16-P launch's programs end early, and the exact programs
    # take their SMs while its longest splits still run.
    exact_below = 0 if cfg.pv_split else cfg.pv_split_below
    # (bf16-P loop, exact PV, count below) per launch
    if exact_below == 0 or cfg.exact_in_launch or (cfg.ws and cfg.ws_exact):
        launches = [(True, True, exact_below)]
    elif cfg.exact_concurrent:
        launches = [(True, False, exact_below), (False, True, exact_below)]
    else:
        launches = [(True, True, 0), (False, True, exact_below)]
    count_block = min(triton.next_power_of_2(max(topk, e_topk, 16)), COUNT_BLOCK_MAX)
    # (at least 16: the exact launch is the Triton loop, head-major, beside the few-head tile's 8)
    exact_block_h = max(min(cfg.exact_block_h or cfg.block_h, cfg.block_h), 16)
    if cfg.token_major:  # the exact launch keeps the head-major loop (>= 16 heads)
        exact_block_h = max(cfg.exact_block_h, 16)
    side = _side_stream(q.device) if cfg.exact_concurrent and q.is_cuda else None
    # the exact launch as the Gluon loop (ws_exact_launch): 64-head blocks (decode), the
    # caches `_ws_runnable` takes, no packed plan (whose tokens of length -1 the Gluon loop
    # would count as few-token ones)
    exact_ws = (
        cfg.ws_exact_launch and len(launches) == 2 and cfg.block_h == WS_BLOCK_H and plan is None
        and _ws_runnable(q, main, extra, flags, (WS_BLOCK_H, WS_BLOCK_N))
    )  # fmt: skip
    forked = side is not None and len(launches) == 2  # the exact launch on the side stream
    # The combine as the last split launch's programmatic dependent; after the join it has two
    # predecessors and is launched plainly.
    pdl = splits > 1 and _pdl(q.device) and not forked
    dependents = pdl and SPLIT_LAUNCHES_DEPENDENTS
    if forked:
        # Fork: the side stream waits for what the caller queued (the inputs); the join below
        # orders the combine (and the caller) after both. Device-side only: no host sync, and
        # CUDA-graph capture records it as two branches. part_o / part_lse are allocated on the
        # current stream and freed after the join, so the allocator never reuses them early.
        current = torch.cuda.current_stream(q.device)
        side.wait_stream(current)
    for n, (run_bf16_p, run_exact, below) in enumerate(launches):
        # Pipelined loads only in the bf16-P loop: the exact loop's doubled tile leaves no room.
        stages = cfg.num_stages if run_bf16_p and not cfg.pv_split else 1
        block_h = cfg.block_h if run_bf16_p else exact_block_h
        token_major = cfg.token_major and run_bf16_p
        block_n, warps = cfg.block_n, cfg.num_warps
        if not run_bf16_p:  # the exact launch: its own tile where the config gives one
            block_n, warps = cfg.exact_block_n or block_n, cfg.exact_num_warps or warps
        # tiles per split over the two caches' tile lists laid end to end, in this launch's tiles
        tiles_per_split = max(triton.cdiv(_tiles(topk, e_topk, block_n), splits), 1)
        with torch.cuda.stream(side) if forked and n == 1 else contextlib.nullcontext():
            if run_bf16_p and cfg.ws:
                exact_in = run_exact and cfg.ws_exact
                _launch_ws(q, main, extra, common, flags, splits, tiles_per_split, part_o,
                           part_lse, below if exact_in or not run_exact else 0, cfg.block_h,
                           cfg.block_n, split_plan, exact_in, dependents=dependents,
                           order=plan["order"] if plan else None)  # fmt: skip
                continue
            if not run_bf16_p and exact_ws:  # the few-token requests, in the Gluon loop's tiles
                _launch_ws(q, main, extra, common, flags, splits,
                           max(triton.cdiv(_tiles(topk, e_topk, WS_BLOCK_N), splits), 1),
                           part_o, part_lse, below, WS_BLOCK_H, WS_BLOCK_N, None, True,
                           True, dependents)  # fmt: skip
                continue
            _mma_split_kernel[(B * triton.cdiv(H, block_h), splits)](
                **common, **main, **extra,
                tiles_per_split=tiles_per_split, PO_ptr=part_o, PLSE_ptr=part_lse,
                H=H, num_splits=splits, **flags,
                SINGLE_SPLIT=splits == 1, BLOCK_H=block_h, BLOCK_N=block_n,
                DOT_DTYPE=dot_dtype, PV_SPLIT=cfg.pv_split, S_BY_GROUP=cfg.s_by_group,
                NUM_STAGES=stages, RUN_BF16_P=run_bf16_p, RUN_EXACT=run_exact,
                EXACT_BELOW=below, EXACT_BLOCK_H=block_h if token_major else exact_block_h,
                COUNT_BLOCK=count_block, COUNT_ONE_BLOCK=count_block >= max(topk, e_topk),
                PREFETCH=cfg.prefetch_next and q.is_cuda, TOKEN_MAJOR=token_major,
                **triton_plan, num_warps=warps, num_stages=stages,
            )  # fmt: skip
    if forked:
        current.wait_stream(side)  # join
    if splits > 1:
        splits_pow2 = triton.next_power_of_2(splits)
        block_d = min(HEAD_DIM, max(32, 8192 // splits_pow2))
        _combine_kernel[(B * H, HEAD_DIM // block_d)](
            part_o, part_lse, common["SINK_ptr"], common["stride_sink"],
            common["O_ptr"], common["stride_ob"], common["stride_oh"],
            common["LSE_ptr"], common["stride_lb"], common["stride_lh"],
            H, splits,
            SPLITS_POW2=splits_pow2, BLOCK_D=block_d,
            HAS_SINK=flags["HAS_SINK"], RNE_BY_HAND=flags["RNE_BY_HAND"],
            **(combine_plan or {}), PDL=pdl, num_warps=4, **({"launch_pdl": True} if pdl else {}),
        )  # fmt: skip
    if plan is not None:
        _launch_packed(q, main, extra, common, flags, plan)


# ----------------------------------------------------------------------------- validation


def _check_cache(name: str, cache, device, token_sizes=(584, 528)) -> None:
    if not isinstance(cache, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(cache).__name__}")
    if cache.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise ValueError(f"{name} must be uint8 or float8_e4m3fn, got {cache.dtype}")
    if cache.dim() != 4 or cache.shape[2] != 1:
        raise ValueError(
            f"{name} must be [num_pages, page_size, 1, token_bytes], got {tuple(cache.shape)}"
        )
    token_bytes = cache.shape[3]
    if token_bytes not in token_sizes:
        known = ", ".join(f"{n} ({FORMAT_NAMES[n]})" for n in token_sizes)
        also = "; 288 (V4.1 FP4) only as the extra cache" if 288 not in token_sizes else ""
        raise ValueError(
            f"{name}: unsupported token size {token_bytes} bytes (the last dimension); "
            f"supported: {known}{also}"
        )
    if cache.device != device:
        raise ValueError(f"{name} must be on {device} like q, got {cache.device}")
    pages, page_size = cache.shape[0], cache.shape[1]
    if page_size < 1:
        raise ValueError(f"{name}: page_size (shape[1]) must be >= 1, got {page_size}")
    if cache.stride(3) != 1 or (page_size > 1 and cache.stride(1) != token_bytes):
        raise ValueError(
            f"{name}: the bytes of one page must be contiguous (stride(1) == {token_bytes}, "
            f"stride(3) == 1), got strides {cache.stride()}"
        )
    page_bytes = page_size * token_bytes
    stride0 = cache.stride(0)
    if pages > 1 and stride0 < page_bytes:
        raise ValueError(
            f"{name}: page stride stride(0) must be >= page_size * {token_bytes} = {page_bytes} "
            f"bytes, got {stride0}"
        )
    if token_bytes == TOKEN_BYTES and (stride0 % 2 or cache.data_ptr() % 2):
        # Name what is odd: the page stride, the view's start address, or both.
        odd = [f"page stride stride(0) {stride0} is odd"] if stride0 % 2 else []
        if cache.data_ptr() % 2:
            odd.append(
                f"the view starts at an odd address (storage_offset {cache.storage_offset()})"
            )
        raise ValueError(f"{name}: pages must start on even bytes (bf16 rope): {' and '.join(odd)}")
    if pages > 0:
        need = (pages - 1) * stride0 + page_bytes
        have = cache.untyped_storage().nbytes() - cache.storage_offset()
        if have < need:
            raise ValueError(
                f"{name}: {pages} pages of {page_size} tokens at stride {stride0} need {need} "
                f"bytes from the view's start, its storage holds {have}"
            )


def _check_indices(name: str, indices, B: int, device) -> None:
    if not isinstance(indices, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {indices.dtype}")
    ok = (indices.dim() == 2) or (indices.dim() == 3 and indices.shape[1] == 1)
    if not ok or indices.shape[0] != B:
        raise ValueError(
            f"{name} must be [B={B}, topk] or [B={B}, 1, topk], got {tuple(indices.shape)}"
        )
    if indices.device != device:
        raise ValueError(f"{name} must be on {device} like q, got {indices.device}")


def _check_lengths(name: str, lens, B: int, device) -> None:
    if lens is None:
        return
    if not isinstance(lens, torch.Tensor) or lens.dtype != torch.int32 or tuple(lens.shape) != (B,):
        desc = f"{lens.dtype} {tuple(lens.shape)}" if isinstance(lens, torch.Tensor) else type(lens)
        raise ValueError(f"{name} must be None or an int32 tensor of shape [B={B}], got {desc}")
    if lens.device != device:
        raise ValueError(f"{name} must be on {device} like q, got {lens.device}")


def _validate(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale,
              extra_k_cache, extra_indices, extra_topk_length, variant, out, lse):  # fmt: skip
    if variant not in (None, "simt", "mma"):
        raise ValueError(f"variant must be None, 'simt' or 'mma', got {variant!r}")
    if not isinstance(q, torch.Tensor):
        raise ValueError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"q must be bfloat16, got {q.dtype}")
    if q.dim() != 4 or q.shape[1] != 1 or q.shape[3] != HEAD_DIM:
        raise ValueError(f"q must be [B, 1, H, {HEAD_DIM}], got {tuple(q.shape)}")
    if q.device.type != "cuda" and not (_INTERPRET and q.device.type == "cpu"):
        raise ValueError(
            f"q must be on a CUDA device (or on the CPU with TRITON_INTERPRET=1), got {q.device}"
        )
    if head_dim_v != HEAD_DIM:
        raise ValueError(f"head_dim_v must be {HEAD_DIM}, got {head_dim_v!r}")
    if softmax_scale is not None and (
        isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))
    ):
        raise ValueError(f"softmax_scale must be None or a Python number, got {softmax_scale!r}")
    B, _, H, _ = q.shape
    dev = q.device
    _check_cache("k_cache", k_cache, dev)
    _check_indices("indices", indices, B, dev)
    _check_lengths("topk_length", topk_length, B, dev)
    if attn_sink is not None and (
        not isinstance(attn_sink, torch.Tensor)
        or attn_sink.dtype != torch.float32
        or tuple(attn_sink.shape) != (H,)
        or attn_sink.device != dev
    ):
        raise ValueError(f"attn_sink must be None or a float32 tensor [H={H}] on {dev}")
    if extra_k_cache is None:
        if extra_indices is not None or extra_topk_length is not None:
            raise ValueError("extra_indices / extra_topk_length given without extra_k_cache")
    else:
        if extra_indices is None:
            raise ValueError("extra_indices must be given with extra_k_cache")
        _check_cache("extra_k_cache", extra_k_cache, dev, (584, 528, 288))
        # The pairs SGLang 0.5.23 builds: V4 with V4; V4.1 FP8 with V4.1 FP8 or FP4.
        main_tb, extra_tb = k_cache.shape[3], extra_k_cache.shape[3]
        if (main_tb == 584) != (extra_tb == 584):
            raise ValueError(
                f"extra_k_cache: a {FORMAT_NAMES[extra_tb]} extra cache ({extra_tb} bytes per "
                f"token) cannot pair with a {FORMAT_NAMES[main_tb]} main cache ({main_tb}): V4 "
                "pairs with V4, V4.1 FP8 with V4.1 FP8 or FP4"
            )
        _check_indices("extra_indices", extra_indices, B, dev)
        _check_lengths("extra_topk_length", extra_topk_length, B, dev)
    if out is not None and (
        out.dtype != torch.bfloat16 or tuple(out.shape) != (B, 1, H, HEAD_DIM)
        or out.stride(3) != 1 or out.device != dev
    ):  # fmt: skip
        raise ValueError(f"out must be bf16 [B, 1, H, {HEAD_DIM}] (last dim contiguous) on {dev}")
    if lse is not None and (
        lse.dtype != torch.float32 or tuple(lse.shape) != (B, H, 1) or lse.device != dev
    ):
        raise ValueError(f"lse must be float32 [B, H, 1] on {dev}")


# ----------------------------------------------------------------------------- public entry


def flash_mla_sparse_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    head_dim_v: int,
    softmax_scale: float | None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    *,
    variant: str | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    _config: MMAConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DSv4 sparse-MLA decode: returns (out [B, 1, H, 512] bf16, lse [B, H, 1] float32).

    `variant`: "mma" (tensor-core split-K), "simt" (one program per request and head), or None
    for the choice made at import by SGLANG_SM120_MMA_FLASHMLA=1. `out` / `lse` may be given
    preallocated (every element is written). No host synchronisation: CUDA-graph capturable.
    `_config` (an MMAConfig) overrides the per-device table; for tests and tuning only.
    """
    _validate(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale,
              extra_k_cache, extra_indices, extra_topk_length, variant, out, lse)  # fmt: skip
    B, _, H, _ = q.shape
    if out is None:
        out = torch.empty(B, 1, H, HEAD_DIM, dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty(B, H, 1, dtype=torch.float32, device=q.device)
    if B == 0 or H == 0:
        return out, lse
    scale = HEAD_DIM**-0.5 if softmax_scale is None else float(softmax_scale)
    scale_log2 = scale * 1.4426950408889634  # fold log2(e) into the scale: exp -> exp2

    main = _cache_args(k_cache, indices, topk_length)
    has_extra = extra_k_cache is not None
    # Without an extra cache its group repeats the main cache's tensors (never read).
    extra = _cache_args(
        extra_k_cache if has_extra else k_cache,
        extra_indices if has_extra else indices,
        extra_topk_length if has_extra else None,
        _EXTRA_CACHE_ARGS,
    )
    common = _common_args(q, attn_sink, out, lse, scale_log2)
    flags = dict(
        has_len=int(topk_length is not None), has_elen=int(extra_topk_length is not None),
        HAS_EXTRA=has_extra, HAS_SINK=attn_sink is not None,
        RNE_BY_HAND=not q.is_cuda,
        # Each cache's format from its token size; without an extra cache, the main one's.
        FMT=CACHE_FORMATS[k_cache.shape[3]],
        E_FMT=CACHE_FORMATS[(extra_k_cache if has_extra else k_cache).shape[3]],
    )  # fmt: skip
    # Triton launches on the current CUDA device, not on the tensors' one: tensors on another
    # device (a multi-GPU host, cuda:1 while cuda:0 is current) are run there under a guard.
    on_other = q.is_cuda and q.device.index != torch.cuda.current_device()
    with torch.cuda.device(q.device) if on_other else contextlib.nullcontext():
        if (variant or _DEFAULT_VARIANT) == "mma":
            if _config is not None and not isinstance(_config, MMAConfig):
                _config = MMAConfig(**_config)
            _launch_mma(q, main, extra, common, flags, _config)
        else:
            _launch_simt(q, main, extra, common, flags)
    return out, lse


# ============================================================================ compatibility names
# Names that live code imports from SGLang's and vLLM's copies of this module (SGLang's sm_120
# tests import `_merge_partial_attn` and `_apply_attn_sink`; benchmark scripts import
# `_run_triton_sparse_decode`; the wrapper's tests read the layout constants). They keep the
# callers' signatures and conventions: outputs [B, 1, H, 512] bf16, LSEs [B, 1, H] float32 with
# -inf for "no valid token". Built only on the public entry above and plain torch, so the kernel
# internals can change freely. Documented in kerneldev's docs/kernels.md; keep this block last.

_NOPE_DIM = 448  # fp8-quantized dims of a K/V row
_ROPE_DIM = 64  # bf16 dims of a K/V row
_D = _NOPE_DIM + _ROPE_DIM  # 512
_TOKEN_DATA_STRIDE = 576  # data bytes per token slot (nope fp8 + rope bf16)
_SCALE_STRIDE = 8  # scale bytes per token slot (7 UE8M0 exponents + 1 pad)


def _run_triton_sparse_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    softmax_scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over one paged cache without a sink: (out [B, 1, H, 512] bf16,
    lse [B, 1, H] float32, -inf where no token is valid)."""
    out, lse = flash_mla_sparse_decode_triton(
        q, k_cache, indices, topk_length, None, HEAD_DIM, softmax_scale
    )
    return out, lse.permute(0, 2, 1)


_run_triton_sparse_decode_legacy = _run_triton_sparse_decode  # an older name of the same call


def _merge_partial_attn(
    out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions by their LSEs (out [B, 1, H, D], lse [B, 1, H]); a part
    whose LSE is -inf contributes nothing. Returns (bf16 out, float32 lse)."""
    lse1, lse2 = lse1.float(), lse2.float()
    top = torch.maximum(lse1, lse2)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # both empty: no NaN
    w1 = torch.exp(lse1 - top)  # exp(-inf) = 0 for an empty part
    w2 = torch.exp(lse2 - top)
    total = w1 + w2
    safe = torch.where(total > 0, total, torch.ones_like(total))
    merged = (w1.unsqueeze(-1) * out1.float() + w2.unsqueeze(-1) * out2.float()) / safe.unsqueeze(
        -1
    )
    merged_lse = torch.where(total > 0, top + torch.log(safe), torch.full_like(top, float("-inf")))
    return merged.to(torch.bfloat16), merged_lse


def _apply_attn_sink(
    out: torch.Tensor, lse: torch.Tensor, attn_sink: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add the per-head sink logit (attn_sink [H]) to the softmax denominator: out scaled by
    exp(lse - lse'), lse' = logaddexp(lse, sink). Returns (bf16 out, float32 lse')."""
    lse = lse.float()
    sink = attn_sink.float().view(*([1] * (lse.dim() - 1)), -1).expand_as(lse)
    combined = torch.logaddexp(lse, sink)
    weight = torch.exp(lse - combined)
    weight = torch.where(torch.isnan(weight), torch.zeros_like(weight), weight)  # -inf - -inf
    return (out.float() * weight.unsqueeze(-1)).to(torch.bfloat16), combined
