"""Prototype (issue 20, item 3's named lever): the sm_90 decode tile loop warp-specialized in
Gluon (triton 3.6). The default partition (8 warps, two warpgroups) runs S = q K^T (wgmma, q
resident in shared memory, each warpgroup half the tile's tokens), the online softmax and
O += P V (wgmma, P from registers, each warpgroup 256 of the 512 columns); a worker partition
(4 warps) feeds it. Three feeds (constexpr CA / DQ):
- default: the worker gathers each tile's rows through registers (448 fp8 + 7 UE8M0 scales + 64
  bf16 rope), dequantizes and stores bf16 into a ring the consumer reads (calls E-F);
- CA: the worker issues cp.async into a raw ring tiles ahead and dequantizes from shared memory
  into the bf16 ring (call G);
- DQ: the worker only issues cp.async; the consumer dequantizes each raw tile into the one K
  tile it owns, then runs the products (compiled for sm_90a, 0 spills; not run yet).
Same split-K grid as the Triton kernel, whose combine kernel merges the fp32 partials. One
cache, no sink, no exact pass: measurement only (docs/benchmarks.md, session 14)."""

try:
    import torch
except ImportError:  # compile-only environment
    torch = None
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
)

LOG2E = 1.4426950408889634


@gluon.jit
def _producer(KV_fp8, KV_u8, KV_bf16, IDX_ptr, k_bufs, ready, empty, b, start, end,
              stride_kv_page, page_size, stride_ib, num_tokens,
              NBUF: gl.constexpr, BLOCK_N: gl.constexpr, ROWS: gl.constexpr,
              ABLATE: gl.constexpr):  # fmt: skip
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, 512, layout=gl.SliceLayout(0, layout))
    is_nope = cols < 448
    group = cols // 64
    rope_col = gl.where(is_nope, 0, cols - 448)
    n_tiles = gl.cdiv(end - start, BLOCK_N)
    for i in range(n_tiles):
        slot = i % NBUF
        phase = (i // NBUF) & 1
        mbarrier.wait(empty.index(slot), phase ^ 1)
        buf = k_bufs.index(slot)
        t0 = start + i * BLOCK_N
        for r in gl.static_range(BLOCK_N // ROWS):
            if ABLATE == 1:  # no gather: a constant tile
                buf.slice(r * ROWS, ROWS, dim=0).store(
                    gl.full([ROWS, 512], 0.5, gl.bfloat16, layout)
                )
            else:
                t = t0 + r * ROWS + rows
                idx = gl.load(IDX_ptr + b * stride_ib + t, mask=t < end, other=-1)
                valid = (idx >= 0) & (idx < num_tokens)
                idx = gl.where(valid, idx, 0)
                page = (idx // page_size).to(gl.int64)
                off = (idx % page_size).to(gl.int64)
                base = page * stride_kv_page + off * 576
                sbase = page * stride_kv_page + page_size * 576 + off * 8
                m_nope = valid[:, None] & is_nope[None, :]
                x8 = gl.load(KV_fp8 + base[:, None] + cols[None, :], mask=m_nope, other=0.0)
                e8 = gl.load(KV_u8 + sbase[:, None] + group[None, :], mask=m_nope, other=127)
                rope = gl.load(
                    KV_bf16 + (base[:, None] + 448) // 2 + rope_col[None, :],
                    mask=valid[:, None] & (cols >= 448)[None, :],
                    other=0.0,
                )
                x = x8.to(gl.float32) * gl.exp2(e8.to(gl.float32) - 127.0)
                val = gl.where(is_nope[None, :], x, rope.to(gl.float32)).to(gl.bfloat16)
                buf.slice(r * ROWS, ROWS, dim=0).store(val)
        fence_async_shared()
        mbarrier.arrive(ready.index(slot), count=1)


@gluon.jit
def _issue_raw(KV_fp8, KV_u8, KV_bf16, IDX_ptr, raw8, rawr, raws, j, n_tiles, b, start, end,
               stride_kv_page, page_size, stride_ib, num_tokens, NR: gl.constexpr,
               BLOCK_N: gl.constexpr):  # fmt: skip
    """cp.async of tile j's rows (fp8 nope, bf16 rope, scale bytes) into raw slot j % NR; every
    copy masked off when j is past the last tile (the group is still committed)."""
    c8: gl.constexpr = gl.BlockedLayout([1, 1, 16], [2, 4, 4], [4, 1, 1], [2, 1, 0])
    cr: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    cs: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [4, 1], [1, 0])
    slot = j % NR
    live = j < n_tiles
    # fp8 part
    t = start + j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, c8)))
    idx = gl.load(IDX_ptr + b * stride_ib + t, mask=(t < end) & live, other=-1)
    valid = (idx >= 0) & (idx < num_tokens)
    idx = gl.where(valid, idx, 0)
    base = (idx // page_size).to(gl.int64) * stride_kv_page + (idx % page_size).to(gl.int64) * 576
    grp = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, c8)))
    col = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, c8)))
    offs = (grp * 64)[None, :, None] + col[None, None, :]
    async_copy.async_copy_global_to_shared(
        raw8.index(slot), KV_fp8 + base[:, None, None] + offs,
        mask=valid[:, None, None] & (grp < 7)[None, :, None],
    )  # fmt: skip
    # rope (64 bf16 after the 448 fp8 bytes)
    tr = start + j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cr))
    idr = gl.load(IDX_ptr + b * stride_ib + tr, mask=(tr < end) & live, other=-1)
    vr = (idr >= 0) & (idr < num_tokens)
    idr = gl.where(vr, idr, 0)
    br = (idr // page_size).to(gl.int64) * stride_kv_page + (idr % page_size).to(gl.int64) * 576
    rc = gl.arange(0, 64, layout=gl.SliceLayout(0, cr))
    async_copy.async_copy_global_to_shared(
        rawr.index(slot), KV_bf16 + (br[:, None] + 448) // 2 + rc[None, :], mask=vr[:, None]
    )
    # the 8 scale bytes (7 UE8M0 exponents + pad) of each row
    ts = start + j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cs))
    ids = gl.load(IDX_ptr + b * stride_ib + ts, mask=(ts < end) & live, other=-1)
    vs = (ids >= 0) & (ids < num_tokens)
    ids = gl.where(vs, ids, 0)
    bs = (
        (ids // page_size).to(gl.int64) * stride_kv_page
        + page_size * 576
        + (ids % page_size).to(gl.int64) * 8
    )
    sc = gl.arange(0, 8, layout=gl.SliceLayout(0, cs))
    async_copy.async_copy_global_to_shared(
        raws.index(slot), KV_u8 + bs[:, None] + sc[None, :], mask=vs[:, None]
    )


@gluon.jit
def _producer_ca(KV_fp8, KV_u8, KV_bf16, IDX_ptr, k_bufs, ready, empty, raw8, rawr, raws, b,
                 start, end, stride_kv_page, page_size, stride_ib, num_tokens,
                 NBUF: gl.constexpr, BLOCK_N: gl.constexpr, ROWS: gl.constexpr,
                 NR: gl.constexpr):  # fmt: skip
    """Gather by cp.async NR - 1 tiles ahead into raw slots, dequantize from shared memory."""
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [2, 2, 8], [4, 1, 1], [2, 1, 0])
    g = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    n_tiles = gl.cdiv(end - start, BLOCK_N)
    for j in gl.static_range(NR - 1):
        _issue_raw(KV_fp8, KV_u8, KV_bf16, IDX_ptr, raw8, rawr, raws, j, n_tiles, b, start, end,
                   stride_kv_page, page_size, stride_ib, num_tokens, NR, BLOCK_N)  # fmt: skip
        async_copy.commit_group()
    for i in range(n_tiles):
        _issue_raw(KV_fp8, KV_u8, KV_bf16, IDX_ptr, raw8, rawr, raws, i + NR - 1, n_tiles,
                   b, start, end, stride_kv_page, page_size, stride_ib, num_tokens, NR,
                   BLOCK_N)  # fmt: skip
        async_copy.commit_group()
        async_copy.wait_group(NR - 1)
        gl.thread_barrier()  # every thread's copies of tile i landed
        rslot = i % NR
        slot = i % NBUF
        phase = (i // NBUF) & 1
        mbarrier.wait(empty.index(slot), phase ^ 1)
        buf = k_bufs.index(slot)
        for r in gl.static_range(BLOCK_N // ROWS):
            x8 = raw8.index(rslot).slice(r * ROWS, ROWS).load(L3)
            e8 = raws.index(rslot).slice(r * ROWS, ROWS).load(gl.SliceLayout(2, L3))
            rope = rawr.index(rslot).slice(r * ROWS, ROWS).load(gl.SliceLayout(1, L3))
            x = x8.to(gl.float32) * gl.exp2(e8.to(gl.float32) - 127.0)[:, :, None]
            val = gl.where((g == 7)[None, :, None], rope.to(gl.float32)[:, None, :], x)
            buf.slice(r * ROWS, ROWS).store(gl.reshape(val.to(gl.bfloat16), [ROWS, 512]))
        fence_async_shared()
        mbarrier.arrive(ready.index(slot), count=1)
        gl.thread_barrier()  # reads of raw slot i % NR done before tile i + NR's copies


@gluon.jit
def _loader(KV_fp8, KV_u8, KV_bf16, IDX_ptr, raw8, rawr, raws, raw_full, raw_empty, b, start,
            end, stride_kv_page, page_size, stride_ib, num_tokens, NR: gl.constexpr,
            BLOCK_N: gl.constexpr):  # fmt: skip
    """cp.async only: tile i's rows into raw slot i % NR once the consumer freed it; raw_full
    of tile i - (NR - 1) arrived once this partition's copies of it have landed."""
    n_tiles = gl.cdiv(end - start, BLOCK_N)
    for i in range(n_tiles + NR - 1):
        if i < n_tiles:
            mbarrier.wait(raw_empty.index(i % NR), ((i // NR) & 1) ^ 1)
            _issue_raw(KV_fp8, KV_u8, KV_bf16, IDX_ptr, raw8, rawr, raws, i, n_tiles, b,
                       start, end, stride_kv_page, page_size, stride_ib, num_tokens, NR,
                       BLOCK_N)  # fmt: skip
        async_copy.commit_group()  # one group per iteration (empty past the last tile)
        j = i - (NR - 1)
        if j >= 0:
            async_copy.wait_group(NR - 1)
            gl.thread_barrier()  # every thread's copies of tile j landed
            mbarrier.arrive(raw_full.index(j % NR), count=1)


@gluon.jit
def _consumer_dq(q_smem, k_smem, raw8, rawr, raws, raw_full, raw_empty, IDX_ptr, b, start, end,
                 stride_ib, num_tokens, qk_scale_log2, NR: gl.constexpr, BLOCK_N: gl.constexpr,
                 BLOCK_H: gl.constexpr, ROWS: gl.constexpr, s_layout: gl.constexpr,
                 o_layout: gl.constexpr):  # fmt: skip
    """The consumer dequantizes each raw tile itself (no bf16 ring: one K tile it owns), then
    runs both products; the loader partition only issues copies."""
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [2, 2, 8], [8, 1, 1], [2, 1, 0])
    g = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout)
    n_tiles = gl.cdiv(end - start, BLOCK_N)
    for i in range(n_tiles):
        slot = i % NR
        t = start + i * BLOCK_N + cols
        idx = gl.load(IDX_ptr + b * stride_ib + t, mask=t < end, other=-1)
        valid = (idx >= 0) & (idx < num_tokens)
        mbarrier.wait(raw_full.index(slot), (i // NR) & 1)
        for r in gl.static_range(BLOCK_N // ROWS):
            x8 = raw8.index(slot).slice(r * ROWS, ROWS).load(L3)
            e8 = raws.index(slot).slice(r * ROWS, ROWS).load(gl.SliceLayout(2, L3))
            rope = rawr.index(slot).slice(r * ROWS, ROWS).load(gl.SliceLayout(1, L3))
            x = x8.to(gl.float32) * gl.exp2(e8.to(gl.float32) - 127.0)[:, :, None]
            val = gl.where((g == 7)[None, :, None], rope.to(gl.float32)[:, None, :], x)
            k_smem.slice(r * ROWS, ROWS).store(gl.reshape(val.to(gl.bfloat16), [ROWS, 512]))
        gl.thread_barrier()  # the whole tile stored, the raw slot read by every warp
        fence_async_shared()
        mbarrier.arrive(raw_empty.index(slot), count=1)
        s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), s_zero, use_acc=False)
        s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        acc = warpgroup_mma(p_op, k_smem, acc)
        gl.thread_barrier()  # both warpgroups' PV done before the next tile overwrites k_smem
    return (
        acc,
        gl.convert_layout(m_i, gl.SliceLayout(1, o_layout)),
        gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)),
    )


@gluon.jit
def _consumer(q_smem, k_bufs, ready, empty, IDX_ptr, b, start, end, stride_ib, num_tokens,
              qk_scale_log2,
              NBUF: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr,
              s_layout: gl.constexpr, o_layout: gl.constexpr, ABLATE: gl.constexpr):  # fmt: skip
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout)
    n_tiles = gl.cdiv(end - start, BLOCK_N)
    for i in range(n_tiles):
        slot = i % NBUF
        phase = (i // NBUF) & 1
        t = start + i * BLOCK_N + cols
        idx = gl.load(IDX_ptr + b * stride_ib + t, mask=t < end, other=-1)
        valid = (idx >= 0) & (idx < num_tokens)
        mbarrier.wait(ready.index(slot), phase)
        kbuf = k_bufs.index(slot)
        if ABLATE == 2:  # no products, no softmax: only the hand-off
            mbarrier.arrive(empty.index(slot), count=1)
        else:
            s = warpgroup_mma(q_smem, kbuf.permute((1, 0)), s_zero, use_acc=False)
            s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
            acc = warpgroup_mma(p_op, kbuf, acc)
            mbarrier.arrive(empty.index(slot), count=1)
    return (
        acc,
        gl.convert_layout(m_i, gl.SliceLayout(1, o_layout)),
        gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)),
    )


@gluon.jit
def ws_decode_kernel(
    Q_ptr, KV_fp8, KV_u8, KV_bf16, IDX_ptr, LEN_ptr, PO_ptr, PLSE_ptr, O_ptr, LSE_ptr,
    stride_qb, stride_qh, stride_kv_page, page_size, stride_ib, stride_ob, stride_oh,
    stride_lb, stride_lh, topk, H, num_splits, tiles_per_split, num_tokens, qk_scale_log2,
    HAS_LEN: gl.constexpr, SINGLE: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
    NBUF: gl.constexpr, ROWS: gl.constexpr, PRODUCER_REGS: gl.constexpr, ABLATE: gl.constexpr,
    CA: gl.constexpr, NR: gl.constexpr, DQ: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    pid = gl.program_id(0)
    split = gl.program_id(1)
    head_blocks = gl.cdiv(H, BLOCK_H)
    b = pid // head_blocks
    hb = pid % head_blocks
    end = topk
    if HAS_LEN:
        end = gl.minimum(gl.load(LEN_ptr + b), topk)
    start = split * tiles_per_split * BLOCK_N
    end = gl.maximum(gl.minimum(end, start + tiles_per_split * BLOCK_N), start)

    sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 512], sl)
    k_bufs = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BLOCK_N, 512], sl)
    ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    raw8 = gl.allocate_shared_memory(
        gl.float8e4nv, [NR, BLOCK_N, 8, 64], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    )
    rawr = gl.allocate_shared_memory(
        gl.bfloat16, [NR, BLOCK_N, 64], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    )
    raws = gl.allocate_shared_memory(
        gl.uint8, [NR, BLOCK_N, 8], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    )
    for s in gl.static_range(NBUF):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)

    ql: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    qh = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ql))
    qd = gl.arange(0, 512, layout=gl.SliceLayout(0, ql))
    q = gl.load(
        Q_ptr + b.to(gl.int64) * stride_qb + qh[:, None].to(gl.int64) * stride_qh + qd[None, :],
        mask=(qh < H)[:, None],
        other=0.0,
    )
    q_smem.store(q)
    fence_async_shared()

    WG: gl.constexpr = num_warps // 4
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, BLOCK_N // WG, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, 512 // WG, 16]
    )
    if DQ:
        acc, m_i, l_i = gl.warp_specialize(
            [
                (_consumer_dq, (q_smem, k_bufs.index(0), raw8, rawr, raws, ready, empty,
                                IDX_ptr, b, start, end, stride_ib, num_tokens, qk_scale_log2,
                                NR, BLOCK_N, BLOCK_H, ROWS, s_layout, o_layout)),
                (_loader, (KV_fp8, KV_u8, KV_bf16, IDX_ptr, raw8, rawr, raws, ready, empty, b,
                           start, end, stride_kv_page, page_size, stride_ib, num_tokens, NR,
                           BLOCK_N)),
            ],
            [4],
            [PRODUCER_REGS],
        )  # fmt: skip
    elif CA:
        acc, m_i, l_i = gl.warp_specialize(
            [
                (
                    _consumer,
                    (
                        q_smem,
                        k_bufs,
                        ready,
                        empty,
                        IDX_ptr,
                        b,
                        start,
                        end,
                        stride_ib,
                        num_tokens,
                        qk_scale_log2,
                        NBUF,
                        BLOCK_N,
                        BLOCK_H,
                        s_layout,
                        o_layout,
                        ABLATE,
                    ),
                ),
                (
                    _producer_ca,
                    (
                        KV_fp8,
                        KV_u8,
                        KV_bf16,
                        IDX_ptr,
                        k_bufs,
                        ready,
                        empty,
                        raw8,
                        rawr,
                        raws,
                        b,
                        start,
                        end,
                        stride_kv_page,
                        page_size,
                        stride_ib,
                        num_tokens,
                        NBUF,
                        BLOCK_N,
                        ROWS,
                        NR,
                    ),
                ),
            ],
            [4],
            [PRODUCER_REGS],
        )
    else:
        acc, m_i, l_i = gl.warp_specialize(
            [
                (_consumer, (q_smem, k_bufs, ready, empty, IDX_ptr, b, start, end, stride_ib,
                             num_tokens, qk_scale_log2, NBUF, BLOCK_N, BLOCK_H, s_layout,
                             o_layout, ABLATE)),
                (_producer, (KV_fp8, KV_u8, KV_bf16, IDX_ptr, k_bufs, ready, empty, b, start,
                             end, stride_kv_page, page_size, stride_ib, num_tokens, NBUF,
                             BLOCK_N, ROWS, ABLATE)),
            ],
            [4],
            [PRODUCER_REGS],
        )  # fmt: skip

    heads = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    d = gl.arange(0, 512, layout=gl.SliceLayout(0, o_layout))
    hmask = heads < H
    lse2 = gl.where(l_i > 0, m_i + gl.log2(l_i), float("-inf"))
    inv_l = gl.where(l_i > 0, 1.0 / l_i, 0.0)
    out = acc * inv_l[:, None]
    if SINGLE:
        o_ptrs = O_ptr + b.to(gl.int64) * stride_ob + heads[:, None].to(gl.int64) * stride_oh
        gl.store(o_ptrs + d[None, :], out.to(gl.bfloat16), mask=hmask[:, None])
        gl.store(LSE_ptr + b.to(gl.int64) * stride_lb + heads * stride_lh,
                 lse2 * 0.6931471805599453, mask=hmask)  # fmt: skip
    else:
        row = (b.to(gl.int64) * H + heads.to(gl.int64)) * num_splits + split
        gl.store(PO_ptr + row[:, None] * 512 + d[None, :], out, mask=hmask[:, None])
        gl.store(PLSE_ptr + row, lse2, mask=hmask)


def ws_decode(q, k_cache, indices, topk_length, softmax_scale, combine_kernel, sm_count,
              block_n=64, nbuf=2, rows=8, producer_regs=128, num_warps=8, splits=None, ablate=0,
              ca=False, nr=3, dq=False):  # fmt: skip
    """One cache, no sink: (out [B, 1, H, 512] bf16, lse [B, H, 1] fp32)."""
    B, _, H, _ = q.shape
    block_h = 64
    pages, page_size = k_cache.shape[0], k_cache.shape[1]
    stride_page = k_cache.stride(0)
    flat = k_cache.as_strided((pages * stride_page,), (1,)).view(torch.uint8)
    idx = indices.reshape(B, -1)
    topk = idx.shape[1]
    tiles = triton.cdiv(topk, block_n)
    programs = B * triton.cdiv(H, block_h)
    if splits is None:
        splits = max(1, min(sm_count // programs, tiles, 64))
    tps = triton.cdiv(tiles, splits)
    out = torch.empty(B, 1, H, 512, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(B, H, 1, dtype=torch.float32, device=q.device)
    single = splits == 1
    po = torch.empty(B, H, splits, 512, dtype=torch.float32, device=q.device) if not single else out
    plse = torch.empty(B, H, splits, dtype=torch.float32, device=q.device) if not single else lse
    lens = topk_length if topk_length is not None else idx
    ws_decode_kernel[(programs, splits)](
        q, flat.view(torch.float8_e4m3fn), flat, flat.view(torch.bfloat16), idx, lens, po, plse,
        out, lse, q.stride(0), q.stride(2), stride_page, page_size, idx.stride(0),
        out.stride(0), out.stride(2), lse.stride(0), lse.stride(1), topk, H, splits, tps,
        pages * page_size, softmax_scale * LOG2E,
        HAS_LEN=topk_length is not None, SINGLE=single, BLOCK_H=block_h, BLOCK_N=block_n,
        NBUF=nbuf, ROWS=rows, PRODUCER_REGS=producer_regs, ABLATE=ablate, CA=ca, NR=nr,
        DQ=dq, num_warps=num_warps,
    )  # fmt: skip
    if not single:
        sp2 = triton.next_power_of_2(splits)
        block_d = min(512, max(32, 8192 // sp2))
        combine_kernel[(B * H, 512 // block_d)](
            po, plse, lse, 0, out, out.stride(0), out.stride(2), lse, lse.stride(0),
            lse.stride(1), H, splits, SPLITS_POW2=sp2, BLOCK_D=block_d, HAS_SINK=False,
            RNE_BY_HAND=False, num_warps=4,
        )  # fmt: skip
    return out, lse


def compile_only(cc=90, **kw):
    """Compile for sm_`cc` without a GPU (triton 3.6): (registers, spills, shared bytes)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = ws_decode_kernel
    const = dict(HAS_LEN=True, SINGLE=False, BLOCK_H=64, BLOCK_N=kw.get("block_n", 64),
                 NBUF=kw.get("nbuf", 2), ROWS=kw.get("rows", 8),
                 PRODUCER_REGS=kw.get("producer_regs", 128), ABLATE=kw.get("ablate", 0),
                 CA=kw.get("ca", False), NR=kw.get("nr", 3), DQ=kw.get("dq", False),
                 num_warps=kw.get("num_warps", 8))  # fmt: skip
    ptrs = {"Q_ptr": "*bf16", "KV_fp8": "*fp8e4nv", "KV_u8": "*u8", "KV_bf16": "*bf16",
            "IDX_ptr": "*i32", "LEN_ptr": "*i32", "PO_ptr": "*fp32", "PLSE_ptr": "*fp32",
            "O_ptr": "*bf16", "LSE_ptr": "*fp32"}  # fmt: skip
    sig, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in ptrs or name in ("stride_kv_page", "stride_qb", "stride_qh", "stride_ib"):
            attrs[(i,)] = [["tt.divisibility", 16]]
        if fn.params[i].is_constexpr:
            sig[name] = "constexpr"
            constexprs[name] = const[name]
        elif name in ptrs:
            sig[name] = ptrs[name]
        elif name == "qk_scale_log2":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    k = triton.compile(
        GluonASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", cc, 32),
        options={"num_warps": const["num_warps"], "maxnreg": kw.get("maxnreg")},
    )  # fmt: skip
    return k


if __name__ == "__main__":
    import sys

    k = compile_only()
    print("shared", k.metadata.shared, "n_regs", getattr(k, "n_regs", None))
    open("/tmp/ws.ptx", "w").write(k.asm["ptx"])
    print(k.asm["ttgir"][:200] if "-v" in sys.argv else "")
