"""The bundled DSv4 sparse-decode kernels against the float64 reference.

Without a GPU the Triton kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set by
`tests/kernels/conftest.py` before triton is first imported). The interpreter computes a bf16
`tl.dot` on raw bits (triton-lang/triton#11584), so on CPU the kernels use float32 matrix
operands. With a CUDA GPU the same cases run compiled with bf16 operands, plus large shapes
(topk 2048, B 64).

Run: `pytest tests/kernels` (CPU: a few minutes on 2 cores; also fine inside `pytest tests`).
"""

from __future__ import annotations

import collections
import importlib.util
import itertools
import json
import math
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from . import conftest as kconf

torch = pytest.importorskip("torch")

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
ON_GPU = kconf.ON_GPU
DEVICE = "cuda" if ON_GPU else "cpu"
_CHILD_ENV = "KERNELDEV_KERNEL_TESTS_CHILD"

if not kconf.KERNELS_RUNNABLE:
    # triton was imported (by another test module) before TRITON_INTERPRET could be set: the
    # cases below cannot run in this process; test_kernel_suite_in_own_process runs them.
    pytestmark = pytest.mark.skipif(True, reason="triton imported without TRITON_INTERPRET")

triton = pytest.importorskip("triton")


def _load(name: str, file: str, env: dict[str, str] | None = None):
    """Import kernels/<file> as a private module `name` (with `env` set during the import)."""
    env = env or {}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        spec = importlib.util.spec_from_file_location(name, KERNELS / file)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


fl = _load("_kd_test_flash_mla_sm120_triton", "flash_mla_sm120_triton.py")
_SM120_TRITON = fl.MMA_ROWS["sm120"]._replace(ws=False)  # the sm_120 row's Triton loop
_SM90_TRITON = fl.MMA_ROWS["sm90"]._replace(ws=False)  # the sm_90 row's Triton loops
# the sm_120 row's wide Gluon tile (B32 topk2048: 496 tokens per SM): 4 splits, planned 8
_WIDE = fl.mma_config((12, 0), 132, 32, 64, 2048, 0)
ref = _load("_kd_test_dsv4_reference", "dsv4_reference.py")
cache_mod = _load("_kd_test_dsv4_cache", "dsv4_cache.py")
decode = fl.flash_mla_sparse_decode_triton
MMAConfig = fl.MMAConfig


def _seed(case_id: str) -> int:
    return zlib.crc32(case_id.encode()) & 0x7FFFFFFF


def _run_and_check(inputs, variant, config=None, expect_all_invalid=False):
    """Run with poisoned preallocated outputs; every element must be written and accurate."""
    B, _, H, _ = inputs["q"].shape
    out = torch.full((B, 1, H, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    lse = torch.full((B, H, 1), float("nan"), dtype=torch.float32, device=DEVICE)
    o, lse_ret = decode(**inputs, variant=variant, out=out, lse=lse, _config=config)
    assert o is out and lse_ret is lse
    assert not torch.isnan(out).any(), "some output element was never written"
    assert not torch.isnan(lse).any(), "some lse element was never written"
    r_out, r_lse = ref.reference_sparse_decode(**inputs)
    acc = ref.check_accuracy(out, lse, r_out, r_lse)
    assert acc["ok"], acc
    if expect_all_invalid:
        assert (out == 0).all()
        if inputs["attn_sink"] is None:
            assert torch.isneginf(lse).all()
        else:
            torch.testing.assert_close(lse[..., 0], inputs["attn_sink"][None, :].expand(B, H))
    return out, lse


# (id, make_inputs kwargs, variants, MMA configs: None = the table's choice)
# MMAConfig(block_h, block_n, num_splits, num_warps, num_stages, pv_split, pv_split_below,
# s_by_group, exact_block_h); on CPU the table gives BLOCK_N = 16 so every case below spans
# several tiles.
BN = 16 if not ON_GPU else 64
W = 4 if not ON_GPU else 8


def C(splits: int, pv_split: bool | None = None) -> MMAConfig:
    """An explicit MMA config for the small cases. On the GPU these force pv_split (exact PV):
    with a few dozen tokens bf16 P can miss the 1e-3 bound, as FlashMLA's own bf16 P would;
    the table turns it on by itself for topk + extra topk <= PV_SPLIT_MAX_TOKENS."""
    return MMAConfig(64, BN, splits, W, 1, ON_GPU if pv_split is None else pv_split)


def G(splits: int, pv_split: bool | None = None, **over) -> MMAConfig:
    """The sm_120 row's structure: 32 heads, S as 8 products over 64-dim groups, 4 warps, the
    exact pass with 16 heads per program."""
    cfg = MMAConfig(32, 16 if not ON_GPU else 32, splits, 4, 1, ON_GPU if pv_split is None
                    else pv_split, 0, True, 16)  # fmt: skip
    return cfg._replace(**over)


CASES = [
    ("page1", dict(B=2, H=64, topk=37, page_size=1), ("simt", "mma"), [None]),
    (
        "page64_split1",
        dict(B=1, H=64, topk=80, page_size=64),
        ("mma",),
        [C(1)],
    ),
    (
        "page64_splits3",
        dict(B=2, H=64, topk=80, page_size=64, with_sink=True),
        ("mma",),
        [C(3)],
    ),
    (
        "page256_padded_stride",
        dict(B=2, H=64, topk=50, page_size=256, page_stride="pad576"),
        ("simt", "mma"),
        [None],
    ),
    (
        "page48_partial_invalid_sink",
        dict(
            B=3,
            H=64,
            topk=45,
            page_size=48,
            topk_length="partial",
            invalid_fraction=0.3,
            with_sink=True,
        ),
        ("simt", "mma"),
        [None, C(2)],
    ),
    (
        "page100_indices3d_no_len",
        dict(B=2, H=64, topk=29, page_size=100, topk_length="none", indices_3d=True),
        ("mma",),
        [None],
    ),
    (
        "extra_cache_sink_partial",
        dict(
            B=2,
            H=64,
            topk=24,
            page_size=256,
            extra_topk=40,
            extra_page_size=64,
            with_sink=True,
            topk_length="partial",
            invalid_fraction=0.2,
        ),
        ("simt", "mma"),
        [C(1), C(3)],
    ),
    (
        # One split holds tiles of both caches (main 2 tiles, extra 3, 2 splits of 3 tiles on
        # CPU): each tile must take its own cache's pointer, page size and page stride; here
        # only the main cache's pages are padded (an odd stride), the extra cache's are not.
        "split_spans_both_caches_main_stride_only",
        dict(
            B=2,
            H=64,
            topk=24,
            page_size=256,
            page_stride=256 * 584 + 96,
            extra_topk=40,
            extra_page_size=8,
            with_sink=True,
            topk_length="partial",
            invalid_fraction=0.1,
        ),
        ("mma",),
        [C(1), C(2)],
    ),
    (
        "extra_cache_padded_more_splits_than_tiles",
        dict(
            B=1,
            H=64,
            topk=20,
            page_size=64,
            extra_topk=17,
            extra_page_size=32,
            page_stride="pad576",
        ),
        ("mma",),
        [C(8)],
    ),
    (
        "h128",
        dict(B=1, H=128, topk=33, page_size=64, with_sink=True),
        ("simt", "mma"),
        [None, C(2)],
    ),
    ("h20_masked_heads", dict(B=2, H=20, topk=21, page_size=64), ("mma",), [None]),
    (
        "inf_sinks_pvsplit",
        dict(
            B=2,
            H=64,
            topk=40,
            page_size=16,
            extra_topk=24,
            extra_page_size=8,
            with_sink="inf",
            topk_length="partial",
            invalid_fraction=0.2,
        ),
        ("simt", "mma"),
        [
            C(1, pv_split=True),
            C(3),
            C(2, pv_split=True),
        ],
    ),
    (
        # Exact PV chosen per request in the kernel: with partial lengths and invalid indices
        # some requests fall under the threshold and some above, in one launch.
        "per_request_exact_pv",
        dict(
            B=4,
            H=64,
            topk=40,
            page_size=64,
            extra_topk=24,
            extra_page_size=32,
            topk_length="partial",
            invalid_fraction=0.2,
            with_sink=True,
        ),
        ("mma",),
        [
            MMAConfig(64, BN, 1, W, 1, pv_split_below=30),
            MMAConfig(64, BN, 3, W, 1, pv_split_below=30),
            # the second launch with 16-head programs (4 per head block of the first)
            MMAConfig(64, BN, 3, W, 1, pv_split_below=30, exact_block_h=16),
            G(2, pv_split=False, pv_split_below=30),
            # the same choice as a branch of the one launch (16-head sub-blocks on G)
            MMAConfig(64, BN, 3, W, 1, pv_split_below=30, exact_in_launch=True),
            G(2, pv_split=False, pv_split_below=30, exact_in_launch=True),
        ],
    ),
    (
        "batch5_past_end",
        dict(B=5, H=64, topk=19, page_size=64, invalid_fraction=0.5),
        ("mma",),
        [None],
    ),
]
# The sm_120 row's structure (S by 64-dim groups, 32 heads, exact pass with 16 heads):
# single cache, dual cache + sink, partial lengths, invalid indices, split count 1 and > 1,
# more splits than tiles, exact PV, masked heads.
CASES += [
    (
        "grp_single_partial_invalid",
        dict(B=3, H=64, topk=45, page_size=48, topk_length="partial", invalid_fraction=0.3),
        ("mma",),
        [G(1), G(3)],
    ),
    (
        "grp_dual_sink_partial",
        dict(
            B=2,
            H=64,
            topk=24,
            page_size=256,
            extra_topk=40,
            extra_page_size=64,
            with_sink=True,
            topk_length="partial",
            invalid_fraction=0.2,
            page_stride="pad576",
        ),
        ("mma",),
        [G(1), G(3), G(8)],
    ),
    ("grp_h20_masked_heads", dict(B=2, H=20, topk=21, page_size=64), ("mma",), [G(2)]),
]
# The sm_90 row's Triton-loop config for a dual-cache call with its Gluon loop forced (`ws`):
# on a GPU that can run it, that loop (both caches, sink, partial lengths, invalid indices,
# padded pages, 9 and 1 splits, few-token requests left to the exact launch, beside it or
# after it); elsewhere (the interpreter) the launcher's fallback to `_mma_split_kernel`, which
# must compute the same. (From the row without its Gluon loop on dual calls and without its
# small dual-cache rule, which give these shapes the Gluon loop's own exact PV or the
# mma.sync tile.)
_SM90_64 = fl.MMA_ROWS["sm90"]._replace(ws_small_dual_programs=0, ws_dual=False)
_WS = fl.mma_config((9, 0), 132, 4, 64, 320, 200, row=_SM90_64)._replace(ws=True)
_WSX = fl.mma_config((9, 0), 132, 6, 64, 320, 200, row=_SM90_64)._replace(ws_exact_launch=True)
# The rule's own choice for these small dual-cache calls: the mma.sync Gluon tile (here its
# long form, 32 x 64; then 32 x 32); for 20 requests (40 programs of 32 heads), the wgmma
# Gluon loop with its own exact PV
_WS_SMALL_DUAL = fl.mma_config((9, 0), 132, 4, 64, 320, 200)
_WS_SMALL_DUAL_32 = fl.mma_config(
    (9, 0), 132, 4, 64, 320, 200, row=fl.MMA_ROWS["sm90"]._replace(ws_small_dual_long=False)
)
_WS_DUAL_RULE = fl.mma_config((9, 0), 132, 20, 64, 320, 200)
_WS_DUAL_RULE_H96 = fl.mma_config((9, 0), 132, 11, 96, 320, 200)
_WS_H96 = fl.mma_config((9, 0), 132, 3, 96, 300, 0)._replace(ws=True)  # one cache, 96 heads
# both caches, sink, partial lengths, padded pages (B and the invalid share per case)
_WS_DUAL = dict(
    H=64, topk=320, page_size=64, extra_topk=200, extra_page_size=32, with_sink=True,
    topk_length="partial", page_stride="pad576",
)  # fmt: skip
CASES += [
    (
        "sm90_ws_dual_sink_partial_padded",
        dict(_WS_DUAL, B=4, invalid_fraction=0.1),
        ("mma",),
        [
            _WS,
            _WS._replace(num_splits=1),
            _WS._replace(exact_concurrent=not _WS.exact_concurrent),
            # the few-token requests in the Gluon loop itself (P's residue), planned or not
            _WS._replace(ws_exact=True),
            _WS._replace(ws_exact=True, plan_splits=0),
            # the rule's mma.sync tile for small dual-cache calls (32 x 64 or 32 x 32),
            # planned or not
            _WS_SMALL_DUAL,
            _WS_SMALL_DUAL._replace(plan_splits=0),
            _WS_SMALL_DUAL_32,
            _WS_SMALL_DUAL_32._replace(plan_splits=0),
        ],
    ),
    (
        # the rule's wgmma Gluon loop for larger dual-cache calls (the few-token count before
        # its fork), planned or not, V4 caches (the V4.1 ones: test_dsv41_layouts.py)
        "sm90_ws_dual_rule_sink_partial_padded",
        dict(_WS_DUAL, B=20, invalid_fraction=0.2),
        ("mma",),
        [_WS_DUAL_RULE, _WS_DUAL_RULE._replace(plan_splits=0)],
    ),
    (
        # ... with a partly masked head block (96 heads: 33 programs of 32 heads, past the
        # small-call bound)
        "sm90_ws_dual_rule_h96",
        dict(_WS_DUAL, B=11, H=96, invalid_fraction=0.1),
        ("mma",),
        # the rule's splits, then one split (the final outputs' 16-byte stores through shared
        # memory, 32 rows masked)
        [_WS_DUAL_RULE_H96, _WS_DUAL_RULE_H96._replace(num_splits=1, plan_splits=0)],
    ),
    (
        # page sizes not powers of two: the Gluon loader pages by division (`_ws_page_slot`),
        # its dual build with more registers (`ws_build`); one cache of the two so (main 256,
        # extra 48), then both (48, 100)
        "sm90_ws_dual_rule_pages_not_pow2",
        dict(_WS_DUAL, B=20, page_size=256, extra_page_size=48, invalid_fraction=0.1),
        ("mma",),
        [_WS_DUAL_RULE],
    ),
    (
        "sm90_ws_dual_rule_pages_48_100",
        dict(_WS_DUAL, B=20, page_size=48, extra_page_size=100, invalid_fraction=0.1),
        ("mma",),
        # the wgmma loop, then the mma.sync tile in its two forms (the same loader)
        [
            _WS_DUAL_RULE._replace(plan_splits=0),
            _WS_SMALL_DUAL._replace(plan_splits=0),
            _WS_SMALL_DUAL_32._replace(plan_splits=0),
        ],
    ),
    (
        # a partly masked head block (96 heads), one-slot pages, topk not a multiple of the
        # tile
        "sm90_ws_h96_page1_topk300",
        dict(B=3, H=96, topk=300, page_size=1, with_sink=True, invalid_fraction=0.1),
        ("mma",),
        [_WS_H96, _WS_H96._replace(num_splits=1, plan_splits=0)],  # split, then final outputs
    ),
    (
        # the Triton loop's dual-cache call with its exact launch as the Gluon loop computing
        # only the few-token requests (ws_exact_launch), beside the bf16-P launch or after it,
        # and with one split (final outputs, no combine); the interpreter: the Triton launch
        "sm90_exact_launch_gluon_dual_partial",
        dict(_WS_DUAL, B=6, invalid_fraction=0.2),
        ("mma",),
        [
            _WSX,
            _WSX._replace(exact_concurrent=not _WSX.exact_concurrent),
            _WSX._replace(num_splits=1),
        ],
    ),
]
# Calls of at most 16 heads: the Gluon loop's few-head tile (16 heads x 32 tokens, mma.sync, two
# raw slots, 4 consumer warps at a 128-register cap) on a GPU that runs it, both rows; the
# interpreter runs the launcher's fallback (`_mma_split_kernel` in the same tiles).
# At most 8 heads the tile may run token-major (`_ws_tm_consumer`, 8 heads x 32 tokens; the
# row's ws_few_tm_heads): _FEW token-major, _FEW_HM the same call head-major (16-row tile, 8
# padding rows), whatever the rows choose.
_TM90 = fl.MMA_ROWS["sm90"]._replace(ws_few_tm_heads=8, ws_few_tm_min_b=0)
_FEW = fl.mma_config((9, 0), 132, 5, 8, 320, 200, row=_TM90)  # 17 static splits, no plan
_FEW120 = fl.mma_config((12, 0), 132, 5, 8, 320, 200,
                        row=fl.MMA_ROWS["sm120"]._replace(ws_few_tm_heads=8,
                                                          ws_few_tm_min_b=0))  # fmt: skip
_FEW_HM = fl.mma_config((9, 0), 132, 5, 8, 320, 200,
                        row=fl.MMA_ROWS["sm90"]._replace(ws_few_tm_heads=0))  # fmt: skip
# 16 heads, prefill-sized (one split, no plan), partial lengths, 30% invalid indices
_FEW_PREFILL = dict(
    B=40, H=16, topk=192, page_size=64, extra_topk=96, extra_page_size=16, with_sink=True,
    topk_length="partial", invalid_fraction=0.3,
)  # fmt: skip
_FEW_PREFILL_CFG = fl.mma_config((9, 0), 132, 1024, 16, 192, 96)._replace(pack_tokens=0)
CASES += [
    (
        "ws_few_h8_dual_sink_partial_padded",
        dict(_WS_DUAL, H=8, B=5, invalid_fraction=0.1),
        ("mma",),
        [
            _FEW,
            _FEW._replace(plan_splits=17, plan_round=264),  # the length-aware plan, forced
            _FEW._replace(num_splits=1, plan_splits=0),
            # the few-token requests in an exact launch beside it instead of in the loop
            _FEW._replace(ws_exact=False),
            _FEW120,
            _FEW_HM,
            _FEW_HM._replace(num_splits=1, plan_splits=0),
        ],
    ),
    (
        # 5 heads (3 masked rows token-major, 11 head-major), one-slot pages, topk not a
        # multiple of the tile, one cache
        "ws_few_h5_page1_topk300",
        dict(B=3, H=5, topk=300, page_size=1, with_sink=True, invalid_fraction=0.1),
        ("mma",),
        [
            fl.mma_config((9, 0), 132, 3, 5, 300, 0, row=_TM90),
            fl.mma_config((12, 0), 132, 3, 5, 300, 0),
            fl.mma_config((9, 0), 132, 3, 5, 300, 0, row=_TM90)._replace(num_splits=1),
            fl.mma_config((9, 0), 132, 3, 5, 300, 0)._replace(block_h=fl.WS_FEW_BLOCK_H),
        ],
    ),
    ("ws_few_h16_prefill_zero_lengths", _FEW_PREFILL, ("mma",), [_FEW_PREFILL_CFG]),
    (
        # 8 heads prefill-sized: the token-major tile, one split, partial lengths, 30% invalid
        "ws_tm_h8_prefill_partial",
        dict(_FEW_PREFILL, H=8),
        ("mma",),
        [fl.mma_config((9, 0), 132, 1024, 8, 192, 96, row=_TM90)._replace(pack_tokens=0)],
    ),
]
# The production dual-cache shape with every awkward path on: partial lengths, invalid
# indices, sink, padded page stride.
GPU_DUAL_PARTIAL = dict(
    B=64,
    H=64,
    topk=128,
    page_size=256,
    extra_topk=512,
    extra_page_size=64,
    with_sink=True,
    topk_length="partial",
    invalid_fraction=0.1,
    page_stride="pad576",
)
if ON_GPU:  # bf16 operands at production sizes
    CASES += [
        (
            "gpu_B64_topk2048",
            dict(B=64, H=64, topk=2048, page_size=64, with_sink=True),
            ("simt", "mma"),
            [None],
        ),
        (
            "gpu_B64_main128_extra512",
            GPU_DUAL_PARTIAL,
            ("simt", "mma"),
            # partial lengths leave some requests a handful of tokens: the table's config
            # takes the exact PV for those requests by itself; the second forces it for all
            [None, MMAConfig(64, 64, 2, 8, 1, True)],
        ),
        (
            "gpu_B64_topk2048_partial_invalid_padded",
            dict(
                B=64,
                H=64,
                topk=2048,
                page_size=64,
                with_sink=True,
                topk_length="partial",
                invalid_fraction=0.1,
                page_stride="pad576",
            ),
            ("mma",),
            # the sm_90 row (two launches), with the exact PV in its launch, and pipelined
            # (two stages: the per-loop stage count, the exact loop unpipelined)
            [
                None,
                fl.mma_config((9, 0), 132, 64, 64, 2048, 0)._replace(exact_in_launch=True),
                fl.mma_config((9, 0), 132, 64, 64, 2048, 0)._replace(
                    exact_in_launch=True, num_stages=2
                ),
                # the two launches one after the other (the row runs them side by side)
                fl.mma_config((9, 0), 132, 64, 64, 2048, 0)._replace(exact_concurrent=False),
                # the second launch with 16- and 32-head programs
                fl.mma_config((9, 0), 132, 64, 64, 2048, 0)._replace(exact_block_h=16),
                fl.mma_config((9, 0), 132, 64, 64, 2048, 0)._replace(exact_block_h=32),
            ],
        ),
        (
            "gpu_B64_main128_extra512_full",
            dict(B=64, H=64, topk=128, page_size=256, extra_topk=512, with_sink="inf"),
            ("mma",),
            [None],
        ),
        (
            "gpu_B1_topk2048",
            dict(B=1, H=64, topk=2048, page_size=64, with_sink=True),
            ("mma",),
            [None],
        ),
        ("gpu_B2_H128_topk2048", dict(B=2, H=128, topk=2048, page_size=64), ("mma",), [None]),
        (
            "gpu_B128_topk512_splits",
            dict(B=128, H=64, topk=512, page_size=64),
            ("mma",),
            [None, MMAConfig(64, 64, 4, 8, 1)],
        ),
        # the sm_120 row (mma_config for (12, 0)) at production sizes, with its exact pass:
        # its Gluon loop (mma.sync; on this GPU too) and its Triton loop (the row without it)
        (
            "gpu_sm120row_B64_topk2048_partial_invalid",
            dict(
                B=64,
                H=64,
                topk=2048,
                page_size=64,
                with_sink=True,
                topk_length="partial",
                invalid_fraction=0.1,
            ),  # fmt: skip
            ("mma",),
            [
                fl.mma_config((12, 0), 132, 64, 64, 2048, 0),
                fl.mma_config((12, 0), 132, 64, 64, 2048, 0, row=_SM120_TRITON),
            ],
        ),
        (
            "gpu_sm120row_B64_main128_extra512",
            GPU_DUAL_PARTIAL,
            ("mma",),
            # the Gluon loop with the exact launch beside it or after it; the Triton loop's
            # one launch, and the exact PV as a second launch
            [
                fl.mma_config((12, 0), 132, 64, 64, 128, 512),
                fl.mma_config((12, 0), 132, 64, 64, 128, 512)._replace(exact_concurrent=False),
                fl.mma_config((12, 0), 132, 64, 64, 128, 512, row=_SM120_TRITON),
                fl.mma_config((12, 0), 132, 64, 64, 128, 512, row=_SM120_TRITON)._replace(
                    exact_in_launch=False
                ),
            ],
        ),
        (
            "gpu_sm120row_B1_topk2048",
            dict(B=1, H=64, topk=2048, page_size=64, with_sink=True),
            ("mma",),
            [
                fl.mma_config((12, 0), 132, 1, 64, 2048, 0),
                fl.mma_config((12, 0), 132, 1, 64, 2048, 0, row=_SM120_TRITON),
            ],
        ),
        (
            # the wide tile (64 heads x 16 tokens): both caches, sink, partial lengths, invalid
            # indices, padded pages; planned splits, 1 split, and the few-token requests left
            # to the exact launch
            "gpu_sm120row_ws_wide_dual_partial",
            dict(_WS_DUAL, B=4, invalid_fraction=0.1),
            ("mma",),
            [
                _WIDE,
                _WIDE._replace(plan_splits=0),
                _WIDE._replace(num_splits=1, plan_splits=0),
                _WIDE._replace(ws_exact=False),
            ],
        ),
        (
            # 96 heads: three whole 32-head blocks; one-slot pages, topk not a multiple of 32
            "gpu_sm120row_ws_h96_page1_topk300",
            dict(B=3, H=96, topk=300, page_size=1, with_sink=True, invalid_fraction=0.1),
            ("mma",),
            [fl.mma_config((12, 0), 132, 3, 96, 300, 0)],
        ),
    ]


def _cfg_id(cfg):
    if cfg is None:
        return "table"
    return (
        f"s{cfg.num_splits}-n{cfg.block_n}"
        + f"-h{cfg.block_h}"
        + ("-pv2" if cfg.pv_split else "")
        + (f"-pv2below{cfg.pv_split_below}" if cfg.pv_split_below else "")
        + ("-grp" if cfg.s_by_group else "")
        + (f"-x{cfg.exact_block_h}" if cfg.exact_block_h else "")
        + ("-inlaunch" if cfg.exact_in_launch else "")
        + ("-concurrent" if cfg.exact_concurrent else "")
        + (f"-st{cfg.num_stages}" if cfg.num_stages > 1 else "")
    )


PARAMS = [
    pytest.param(cid, kw, v, cfg, id=f"{cid}-{v}-{_cfg_id(cfg)}")
    for cid, kw, variants, cfgs in CASES
    for v in variants
    for cfg in (cfgs if v == "mma" else [None])
]


@pytest.mark.parametrize("case_id,kwargs,variant,config", PARAMS)
def test_matches_reference(case_id, kwargs, variant, config):
    inputs = ref.make_inputs(**kwargs, device=DEVICE, seed=_seed(case_id + variant))
    _run_and_check(inputs, variant, config)


@pytest.mark.parametrize(
    "config",
    [_WS, fl.mma_config((12, 0), 132, 3, 64, 200, 0)],
    ids=["sm90_ws", "sm120row_ws"],
)
def test_fp16_operands_keep_wide_ranges(config):
    """The Gluon loops multiply in fp16 (q scaled by a power of two per program): q entries up
    to 2^17 (past fp16's 65,504) and nope groups spread over 2^[-13, 13] (UE8M0 bytes ~107-134:
    fp16-subnormal scales to values near 57,344) stay within the bounds. Elsewhere the Triton
    loop computes the same inputs."""
    inputs = ref.make_inputs(
        B=3, H=64, topk=200, page_size=64, with_sink=True, kv_scale_spread=13, device=DEVICE,
        seed=19,
    )  # fmt: skip
    inputs["q"] = inputs["q"] * 2.0**17
    _run_and_check(inputs, "mma", config)


def _few_token_peaked_inputs(case: str) -> dict:
    """Requests of 1-256 valid tokens (10% of the indices invalid) whose nope groups are spread
    over 2^[-4, 4], so that a few tokens carry most of the softmax."""
    shape = dict(B=128, H=64, topk=128, page_size=256, extra_topk=512, extra_page_size=64)
    if case == "single_h128":
        shape = dict(B=64, H=128, topk=512, page_size=64)
    inputs = ref.make_inputs(
        **shape, with_sink=True, topk_length="partial", invalid_fraction=0.1,
        kv_scale_spread=4, device=DEVICE, seed=_seed("peaked" + case),
    )  # fmt: skip
    gen = torch.Generator(device=DEVICE).manual_seed(_seed("peaked-lengths" + case))
    B, topk = shape["B"], shape["topk"]

    def lengths(lo: int, hi: int):
        # (drawn as int64, then narrowed: the draws the session-49 run checked)
        return torch.randint(lo, hi + 1, (B,), generator=gen, device=DEVICE).to(torch.int32)

    inputs["topk_length"] = lengths(1, min(topk, 192))
    if "extra_topk" in shape:
        inputs["extra_topk_length"] = lengths(0, 128)
    return inputs


@pytest.mark.skipif(not ON_GPU, reason="the GPU rows' Gluon loops (fp16 P)")
@pytest.mark.parametrize("row", ["own", "sm120"])
@pytest.mark.parametrize("case", ["dual_h64", "single_h128"])
def test_few_token_requests_with_a_peaked_softmax(case, row):
    """The exact PV's per-request threshold holds FlashMLA's out bound where a few tokens carry
    the softmax: with only requests of at most 64 valid tokens taking the residue, the Gluon
    loops' fp16 P missed it (session 49, H100: 94-236 elements of such B128-B512 calls, up to
    4.4x the bound), so the table keeps 256. This GPU's row and the sm_120 row's Gluon tiles."""
    inputs = _few_token_peaked_inputs(case)
    B, _, H, _ = inputs["q"].shape
    topk = inputs["indices"].shape[-1]
    extra = inputs["extra_indices"]
    e_topk = 0 if extra is None else extra.shape[-1]
    config = None
    if row == "sm120":
        sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
        config = fl.mma_config((12, 0), sms, B, H, topk, e_topk)
        assert config.ws  # the sm_120 row's Gluon loop (mma.sync), run on this GPU
    else:
        assert fl._device_mma_config(torch.device(DEVICE), B, H, topk, e_topk).ws
    _run_and_check(inputs, "mma", config)


@pytest.mark.parametrize("variant", ["simt", "mma"])
@pytest.mark.parametrize("with_sink", [False, True])
def test_all_indices_invalid(variant, with_sink):
    inputs = ref.make_inputs(
        B=2,
        H=64,
        topk=20,
        page_size=64,
        with_sink=with_sink,
        invalid_fraction=1.0,
        device=DEVICE,
        seed=_seed(f"inv{with_sink}"),
    )
    _run_and_check(inputs, variant, expect_all_invalid=True)


@pytest.mark.parametrize("variant", ["simt", "mma"])
def test_topk_length_zero_with_extra_cache(variant):
    inputs = ref.make_inputs(
        B=2,
        H=64,
        topk=18,
        page_size=64,
        extra_topk=18,
        topk_length="zero",
        device=DEVICE,
        seed=_seed("zero" + variant),
    )
    _run_and_check(inputs, variant, expect_all_invalid=True)


@pytest.mark.parametrize("variant", ["simt", "mma"])
def test_empty_set_with_minus_inf_sink(variant):
    """No valid token and a -inf sink: out 0 and lse -inf (a -inf sink changes nothing). The
    reference gave NaN there (exp(-inf - -inf)), which check_accuracy then passed whatever
    the kernel wrote, and which turned off its cosine check for the whole tensor."""
    inputs = ref.make_inputs(
        B=2, H=4, topk=12, page_size=16, extra_topk=5, extra_page_size=4, with_sink=True,
        topk_length="partial", device=DEVICE, seed=_seed("empty-minus-inf-sink" + variant),
    )  # fmt: skip
    inputs["topk_length"][1] = 0
    inputs["extra_topk_length"][1] = 0
    inputs["attn_sink"][1:3] = torch.tensor([-math.inf, math.inf])
    r_out, r_lse = ref.reference_sparse_decode(**inputs)
    assert not torch.isnan(r_out).any() and not torch.isnan(r_lse).any()
    assert (r_out[1] == 0).all() and torch.isneginf(r_lse[1, 1]).all()
    out, lse = _run_and_check(inputs, variant)
    assert (out[1] == 0).all() and torch.isneginf(lse[1, 1]).all()
    assert torch.isposinf(lse[:, 2]).all() and (out[:, :, 2] == 0).all()


@pytest.mark.parametrize(
    "variant,config",
    [
        ("simt", None),
        ("mma", None),
        ("mma", "C3"),
        ("mma", "G2"),
        ("mma", (9, 0)),
        ("mma", (12, 0)),
    ],
    ids=["simt", "mma", "mma-splits3", "mma-grp-splits2", "mma-sm90row", "mma-sm120row"],
)
def test_non_finite_q_or_sink_stays_in_its_row(variant, config):
    """Garbage in, contained: a NaN in q[b, h] makes out[b, h] NaN, an inf there gives some
    non-finite or zero row (its lse is unspecified either way); a NaN sink makes head h's lse
    NaN in every request (its out is unspecified). Every other (request, head) is exact."""
    if isinstance(config, tuple):  # the GPU row's config (exact PV, its tiles), 8 SMs
        config = fl.mma_config(config, 8, 3, 20, 24, 9)
    else:
        config = {"C3": C(3), "G2": G(2)}.get(config)
    inputs = ref.make_inputs(
        B=3, H=20, topk=24, page_size=16, extra_topk=9, extra_page_size=4, with_sink=True,
        topk_length="partial", device=DEVICE, seed=_seed("non-finite" + variant),
    )  # fmt: skip
    inputs["q"][0, 0, 1, 7] = math.nan
    inputs["q"][2, 0, 5, 300] = math.inf
    inputs["attn_sink"][3] = math.nan
    out, lse = decode(**inputs, variant=variant, _config=config)
    assert torch.isnan(out[0, 0, 1]).all()
    assert torch.isnan(lse[:, 3]).all()
    clean = torch.ones(3, 20, dtype=torch.bool)
    clean[0, 1] = clean[2, 5] = False
    clean[:, 3] = False
    r_out, r_lse = ref.reference_sparse_decode(**inputs)
    acc = ref.check_accuracy(out[:, 0][clean], lse[..., 0][clean], r_out[:, 0][clean],
                             r_lse[..., 0][clean])  # fmt: skip
    assert acc["ok"], acc


@pytest.mark.parametrize(
    "config",
    [
        _WS,
        _WIDE,
        fl.mma_config((12, 0), 132, 3, 64, 200, 0),
        fl.mma_config((9, 0), 132, 3, 16, 300, 0),  # 4 head blocks of 16
    ],
    ids=["sm90_ws", "sm120row_ws_wide", "sm120row_ws", "sm90_ws_few_4_head_blocks"],
)
def test_non_finite_q_stays_in_its_row_gluon(config):
    """The Gluon loops' fp16 q is scaled per 64-head (or 32-head) block from its largest
    finite entry: an inf or NaN in one head's q leaves the block's other heads exact. The
    non-finite heads also hold a finite entry past fp16's range, so their blocks are scaled
    (by 2^-2: an infinite entry's magnitude would have given 2^-114 and flushed the other
    heads to zero); the other heads keep moderate scores (q scaled as a whole would make
    every score so large that the float32 sums' rounding alone moves near-tied tokens'
    weights past the bounds, in any kernel)."""
    inputs = ref.make_inputs(
        B=3, H=64, topk=200, page_size=64, with_sink=True, device=DEVICE, seed=23,
    )  # fmt: skip
    inputs["q"][0, 0, 1, 7] = math.nan
    inputs["q"][0, 0, 1, 8] = 2.0**16
    inputs["q"][2, 0, 5, 300] = math.inf
    inputs["q"][2, 0, 5, 301] = -(2.0**16)
    out, lse = decode(**inputs, variant="mma", _config=config)
    assert torch.isnan(out[0, 0, 1]).all()
    clean = torch.ones(3, 64, dtype=torch.bool)
    clean[0, 1] = clean[2, 5] = False
    r_out, r_lse = ref.reference_sparse_decode(**inputs)
    acc = ref.check_accuracy(out[:, 0][clean], lse[..., 0][clean], r_out[:, 0][clean],
                             r_lse[..., 0][clean])  # fmt: skip
    assert acc["ok"], acc


@pytest.mark.parametrize("variant", ["simt", "mma"])
def test_extreme_indices_are_masked(variant):
    """Indices at the cache end, INT32_MAX, INT32_MIN: masked, never read out of bounds."""
    inputs = ref.make_inputs(
        B=1,
        H=64,
        topk=24,
        page_size=64,
        num_pages=2,
        device=DEVICE,
        seed=_seed("extreme" + variant),
    )
    idx = inputs["indices"]
    idx[0, 0] = 128  # == num_tokens: one past the end
    idx[0, 1] = 2**31 - 1
    idx[0, 2] = -(2**31)
    idx[0, 3] = 127  # last valid token
    _run_and_check(inputs, variant)


@pytest.mark.parametrize("variant", ["simt", "mma"])
def test_empty_batch_matches_reference(variant):
    """B = 0 (an idle step): empty outputs, no launch; the reference, which failed reshaping
    the empty index rows (-1 is ambiguous at B 0), agrees."""
    inputs = ref.make_inputs(
        B=1, H=3, topk=8, page_size=16, extra_topk=4, extra_page_size=4, with_sink=True,
        indices_3d=True, device=DEVICE, seed=1,
    )  # fmt: skip
    for key in ("q", "indices", "topk_length", "extra_indices", "extra_topk_length"):
        inputs[key] = inputs[key][:0]
    out, lse = decode(**inputs, variant=variant)
    assert out.shape == (0, 1, 3, 512) and lse.shape == (0, 3, 1)
    r_out, r_lse = ref.reference_sparse_decode(**inputs)
    assert ref.check_accuracy(out, lse, r_out, r_lse)["ok"]


@pytest.mark.parametrize("variant", ["simt", "mma"])
@pytest.mark.parametrize("empty", ["main", "extra", "both"])
def test_cache_of_zero_pages(variant, empty):
    """A cache of no pages (num_tokens 0) selects nothing: its indices are all past its end.
    The float64 reference used to fail gathering from it (IndexError); the kernels give the
    empty-set result (out 0, lse -inf, or the sink alone) for that cache."""
    inputs = ref.make_inputs(
        B=2, H=4, topk=10, page_size=16, extra_topk=5, extra_page_size=4, with_sink=True,
        device=DEVICE, seed=_seed("zero-pages" + variant + empty),
    )  # fmt: skip
    for key in {"main": ["k_cache"], "extra": ["extra_k_cache"]}.get(
        empty, ["k_cache", "extra_k_cache"]
    ):
        inputs[key] = inputs[key][:0]
    out, lse = _run_and_check(inputs, variant)
    if empty == "both":
        assert (out == 0).all()
        torch.testing.assert_close(lse[..., 0], inputs["attn_sink"][None, :].expand(2, 4))


@pytest.mark.skipif(
    not ON_GPU or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"
)  # fmt: skip
@pytest.mark.parametrize("variant", ["simt", "mma"])
def test_tensors_on_a_device_other_than_the_current_one(variant):
    """Triton launches on the current device, not on the tensors': a call whose tensors are
    all on cuda:1 while cuda:0 is current must run on cuda:1 (it launched on cuda:0 with
    cuda:1's pointers)."""
    inputs = ref.make_inputs(
        B=3, H=64, topk=40, page_size=64, extra_topk=24, with_sink=True, topk_length="partial",
        device="cuda:1", seed=_seed("other-device" + variant),
    )  # fmt: skip
    with torch.cuda.device(0):
        out, lse = decode(**inputs, variant=variant)
        assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert out.device == lse.device == torch.device("cuda:1")
    acc = ref.check_accuracy(out, lse, *ref.reference_sparse_decode(**inputs))
    assert acc["ok"], acc


@pytest.mark.parametrize("variant", ["simt", "mma"])
def test_noncontiguous_q_fp8_cache_default_scale(variant):
    inputs = ref.make_inputs(
        B=2, H=64, topk=21, page_size=64, device=DEVICE, seed=_seed("noncontig" + variant)
    )
    q = inputs["q"]
    wide = torch.zeros(2, 64, 1, 1024, dtype=q.dtype, device=DEVICE)
    wide[..., ::2] = q.transpose(1, 2)
    inputs["q"] = wide[..., ::2].transpose(1, 2)  # [B, 1, H, 512], strides (.., 2) over dims
    assert not inputs["q"].is_contiguous() and inputs["q"].stride(-1) == 2
    inputs["k_cache"] = inputs["k_cache"].view(torch.float8_e4m3fn)
    inputs["softmax_scale"] = None
    _run_and_check(inputs, variant)


@pytest.mark.parametrize("with_sink", [False, True])
def test_s_by_group_all_indices_invalid(with_sink):
    inputs = ref.make_inputs(
        B=2,
        H=64,
        topk=20,
        page_size=64,
        extra_topk=12,
        with_sink=with_sink,
        invalid_fraction=1.0,
        device=DEVICE,
        seed=_seed(f"grp-inv{with_sink}"),
    )
    _run_and_check(inputs, "mma", G(2), expect_all_invalid=True)


def test_without_topk_length_same_result_as_full_lengths():
    """topk_length=None runs the kernel built for lengths (a runtime flag, not a separate
    specialisation): the same output, bit for bit, as full lengths passed."""
    inputs = ref.make_inputs(
        B=2, H=64, topk=40, page_size=64, extra_topk=24, with_sink=True, device=DEVICE, seed=5
    )
    with_len, lse_len = decode(**inputs, variant="mma")
    inputs.update(topk_length=None, extra_topk_length=None)
    no_len, lse_no = _run_and_check(inputs, "mma")
    assert torch.equal(with_len, no_len) and torch.equal(lse_len, lse_no)


def _split_plan(lens, elens, topk, e_topk, block_n, splits, per_round):
    """`_plan_piece` for every (request, split) of these lengths, as a [B, splits, 4] CPU
    tensor (start, end, e_start, e_end) and the pieces per request."""
    B = len(lens)
    ln = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    eln = torch.tensor(elens if elens is not None else lens, dtype=torch.int32, device=DEVICE)
    plan = torch.full((B, splits, 5), -7, dtype=torch.int32, device=DEVICE)
    fl._split_plan_kernel[(B, splits)](
        ln, 1, 1, eln, 1, int(elens is not None), plan, B, topk, e_topk, splits, per_round,
        BLOCK_N=block_n, B_POW2=fl.triton.next_power_of_2(B), HAS_EXTRA=elens is not None,
    )  # fmt: skip
    plan = plan.cpu()
    k = plan[:, 0, 4]
    s = torch.arange(splits)[None, :, None]
    return torch.where(s < k[:, None, None], plan[..., :4], 0), k


def _tiles_of(lo, hi, block_n):
    return -(-(hi - lo) // block_n)


PLAN_CASES = [
    # (lens, extra lens or None, topk, extra topk, BLOCK_N, splits, pieces per round)
    ([2048, 0, 5, 1000, 2047, 64, 65, 1], None, 2048, 0, 64, 8, 12),
    ([128, 3, 0, 77, 128], [512, 0, 511, 1, 200], 128, 512, 64, 6, 10),
    ([-5, 3000, 40], [9, -1, 600], 100, 300, 16, 5, 7),  # negative and past-topk lengths
    ([0, 0, 0], [0, 0, 0], 64, 64, 16, 4, 5),  # nothing to attend
    ([300] * 7, [90] * 7, 300, 90, 32, 6, 20),
]


@pytest.mark.parametrize("lens,elens,topk,e_topk,bn,splits,per_round", PLAN_CASES)
def test_split_plan_cuts_each_requests_valid_tiles(lens, elens, topk, e_topk, bn, splits,
                                                   per_round):  # fmt: skip
    """The length-aware plan: each request's valid positions (main, then extra) covered once,
    in order, by its k pieces of near-equal tiles (k <= splits, the count its program (b, 0)
    reports); all pieces fit one round whenever one piece per nonempty request does."""
    plan, pieces = _split_plan(lens, elens, topk, e_topk, bn, splits, per_round)
    total = 0
    nonempty = 0
    for b, n in enumerate(lens):
        ln = max(min(n, topk), 0)
        el = max(min(elens[b], e_topk), 0) if elens is not None else 0
        nonempty += (ln + el) > 0
        rows = plan[b].tolist()
        spans = [(e - s) + (ee - es) for s, e, es, ee in rows]
        k = sum(1 for x in spans if x > 0)
        assert k == pieces[b] and all(x > 0 for x in spans[:k])
        main_pos, extra_pos = 0, 0
        tiles = []
        for s, e, es, ee in rows[:k]:
            if e > s:
                assert s == main_pos and s % bn == 0
                main_pos = e
            if ee > es:
                assert main_pos == ln and es == extra_pos and es % bn == 0
                extra_pos = ee
            tiles.append(_tiles_of(s, e, bn) + _tiles_of(es, ee, bn))
        assert (main_pos, extra_pos) == (ln, el)
        assert not tiles or max(tiles) - min(tiles) <= 1
        total += k
    assert total <= max(per_round, nonempty)


def test_split_plan_full_lengths_are_the_static_splits():
    """Equal full lengths: two pieces of 16 tiles per request (B64 topk2048 on the H200's row,
    as the static split), whatever the plan's larger grid."""
    plan, pieces = _split_plan([2048] * 64, None, 2048, 0, 64, 4, 132)
    assert (pieces == 2).all()
    assert plan[:, :2].tolist() == [[[0, 1024, 0, 0], [1024, 2048, 0, 0]]] * 64


@pytest.mark.parametrize("exact", ["none", "second", "concurrent", "second-wider-tile"])
def test_split_plan_skewed_lengths_match_reference(exact):
    """One long request among short and empty ones, both caches, sink, invalid indices: the
    planned splits (and the few-token requests' exact launch reading the same plan, also with
    a tile of its own) give the reference's output, and the same as the static splits within
    bf16."""
    inputs = ref.make_inputs(
        B=6, H=64, topk=96, page_size=32, extra_topk=48, extra_page_size=16, with_sink=True,
        topk_length="partial", invalid_fraction=0.1, device=DEVICE,
        seed=_seed("plan-skewed"),
    )  # fmt: skip
    inputs["topk_length"] = torch.tensor([96, 0, 3, 33, 40, 1], dtype=torch.int32, device=DEVICE)
    inputs["extra_topk_length"] = torch.tensor(
        [48, 0, 48, 2, 0, 1], dtype=torch.int32, device=DEVICE
    )
    # "none": no few-token pass (on a GPU the exact PV for the whole call instead: a
    # request of 1-3 tokens misses the bound with bf16 P, as FlashMLA's would)
    below = {"none": 0, "second-wider-tile": 200}.get(exact, 64)  # 200: every request
    concurrent = exact == "concurrent"
    wider = exact == "second-wider-tile"
    # on a GPU the wider exact tile is 64 tokens over 32-token bf16-P tiles: 128 tokens,
    # doubled, would need 320 KB of shared memory at 64 heads
    bn = BN // 2 if ON_GPU and wider else BN
    static = MMAConfig(64, bn, 3, W, 1, ON_GPU and exact == "none", below,
                       exact_concurrent=concurrent,
                       exact_block_n=2 * bn if wider else 0)  # fmt: skip
    planned = static._replace(plan_splits=6, plan_round=7)
    a, la = _run_and_check(inputs, "mma", static)
    b, lb = _run_and_check(inputs, "mma", planned)
    assert (a.float() - b.float()).abs().max() <= 2**-6 * max(1.0, a.float().abs().max())
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5)


def test_small_dual_long_tile_not_with_an_fp4_extra_cache(monkeypatch):
    """The launcher's own config (`_device_mma_config`, here for an H200 as the driver would
    report it) takes the small dual-cache tile's long form for B16 dual, but not where the
    extra cache is V4.1 FP4 (its build spills there); the sm_120 row never."""
    monkeypatch.setattr(fl.torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(
        fl.torch.cuda, "get_device_properties",
        lambda device=None: type("Props", (), {"multi_processor_count": 132}),
    )  # fmt: skip
    gpu = torch.device("cuda", 0)
    assert fl._device_mma_config(gpu, 16, 64, 128, 512).block_n == fl.WS_SYNC_LONG_BLOCK_N
    fp4 = fl._device_mma_config(gpu, 16, 64, 128, 512, fp4_extra=True)
    assert (fp4.block_h, fp4.block_n, fp4.ws) == (32, 32, True)
    assert not fl._device_mma_config(gpu, 16, 64, 128, 512, ws=False).ws
    monkeypatch.setattr(fl.torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    assert fl._device_mma_config(gpu, 16, 64, 128, 512).block_n == 32


def test_mma_config_rule():
    """The public, pure config rule: table rows per compute capability, one wave of splits,
    small tiles where the tile count caps the grid, the exact PV where topk is small."""
    sm90 = fl.mma_config((9, 0), 132, 64, 64, 2048, 0)
    assert (sm90.block_h, sm90.block_n, sm90.num_splits, sm90.num_warps) == (64, 64, 2, 8)
    assert (sm90.pv_split, sm90.pv_split_below, sm90.s_by_group) == (False, 256, False)
    assert (sm90.num_stages, sm90.exact_in_launch) == (1, False)  # two launches
    assert sm90.exact_concurrent  # side by side (streams), not one after the other
    assert not fl.mma_config(None, 2, 64, 64, 2048, 0).exact_concurrent  # interpreter: no streams
    assert sm90.ws  # head-major 64-head calls: the Gluon loop's launch
    triton_loop = fl.MMA_ROWS["sm90"]._replace(ws=False)
    piped = triton_loop._replace(num_stages=2)
    assert fl.mma_config((9, 0), 132, 64, 64, 2048, 0, row=piped).num_stages == 2
    # a tile-capped grid (one tile per split) runs unpipelined whatever the row says
    assert fl.mma_config((9, 0), 132, 1, 64, 2048, 0, row=piped).num_stages == 1
    assert fl.mma_config((9, 0), 132, 128, 64, 2048, 0).num_splits == 1
    # 32 tiles of 64 < 132 SMs: the Triton loop takes tiles of 32, the Gluon loop its 64
    b1 = fl.mma_config((9, 0), 132, 1, 64, 2048, 0, row=triton_loop)
    assert (b1.block_n, b1.num_splits, b1.ws) == (32, 64, False)
    b1 = fl.mma_config((9, 0), 132, 1, 64, 2048, 0)
    assert (b1.block_n, b1.num_splits, b1.ws, b1.num_stages) == (64, 32, True, 1)
    dual = fl.mma_config((9, 0), 132, 1, 64, 128, 512, row=triton_loop)  # 4 + 16 tiles of 32
    assert (dual.block_n, dual.num_splits, dual.ws) == (32, 20, False)  # one per split
    # dual calls: the wgmma Gluon loop (ws_dual) ...
    dual = fl.mma_config((9, 0), 132, 64, 64, 128, 512)
    assert dual.ws and (dual.block_h, dual.block_n) == (fl.WS_BLOCK_H, fl.WS_BLOCK_N)
    # ... but dual calls of up to 32 programs of 32 heads: the mma.sync Gluon tile (the sm_120
    # row's 32 x 32, its exact PV in the same launch), launched as the sm_120 row would on a
    # 9.x GPU of as many SMs (without its long form: below)
    proxy_row = fl.MMA_ROWS["sm120"]
    short_row = fl.MMA_ROWS["sm90"]._replace(ws_small_dual_long=False)
    for B, H in ((1, 64), (16, 64), (8, 128), (32, 32)):
        small = fl.mma_config((9, 0), 132, B, H, 128, 512, row=short_row)
        assert small.ws and (small.block_h, small.block_n) == (32, 32), (B, H)
        like = fl.mma_config((9, 0), 132, B, H, 128, 512, row=proxy_row)
        fields = ("block_h", "block_n", "num_splits", "num_stages", "pv_split_below", "ws",
                  "plan_splits", "plan_round", "ws_exact", "ws_exact_launch", "exact_in_launch",
                  "token_major", "pack_tokens")  # fmt: skip
        assert [getattr(small, f) for f in fields] == [getattr(like, f) for f in fields]
    assert fl.mma_config((9, 0), 132, 1, 64, 128, 512).num_splits == 20
    # its long form (32 x 64) where the longest split's tiles cost less so (session 32's H200
    # A/B: B4 and B16 64 tokens, B1 and B8 32), sm_120's own row never (99 KB)
    for B, H, block_n, splits in ((1, 64, 32, 20), (4, 64, 64, 10), (8, 64, 32, 8),
                                  (16, 64, 64, 4), (8, 128, 64, 4), (16, 32, 32, 8)):  # fmt: skip
        small = fl.mma_config((9, 0), 132, B, H, 128, 512)
        assert small.ws and (small.block_h, small.block_n, small.num_splits) == (
            32, block_n, splits), (B, H)  # fmt: skip
        assert fl.mma_config((12, 0), 188, B, H, 128, 512).block_n != 64, (B, H)
    assert fl.small_dual_block_n(short_row, 132, 32, 128, 512) == 32
    for B, H, topk, extra in ((17, 64, 128, 512), (9, 128, 128, 512), (1, 64, 2048, 0),
                              (1, 64, 64, 128), (4, 48, 128, 512)):  # fmt: skip
        # more programs, one cache, the exact PV for the whole call, partly masked blocks
        assert fl.mma_config((9, 0), 132, B, H, topk, extra).block_h == 64, (B, H, topk)
    assert fl.mma_config((9, 0), 132, 16, 16, 128, 512).block_h == 16  # the few-head tile
    assert not fl.mma_config((9, 0), 132, 1, 64, 128, 512, row=_SM90_64).ws  # rules off
    # where the Gluon loop cannot run the launcher asks for the row without it: the Triton
    # loop in the row's own tile, as before
    assert fl.mma_config((9, 0), 132, 1, 64, 128, 512, row=triton_loop) == fl.mma_config(
        (9, 0), 132, 1, 64, 128, 512, row=_SM90_64._replace(ws=False)
    )
    assert fl.mma_config((12, 0), 188, 1, 64, 128, 512) == fl.mma_config(
        (12, 0), 188, 1, 64, 128, 512, row=proxy_row._replace(ws_small_dual_programs=32)
    )  # the sm_120 row's own rule: unchanged
    # not the Gluon loop: small topk (the exact PV), sm_100 (no wgmma), sm_120
    assert not fl.mma_config((9, 0), 132, 4, 64, 37, 0).ws
    assert not fl.mma_config((10, 0), 148, 64, 64, 2048, 0).ws
    assert fl.mma_config((9, 0), 132, 64, 96, 2048, 0).ws  # a partly masked head block too
    assert fl.mma_config((9, 0), 132, 64, 128, 512, 0).ws
    small = fl.mma_config((9, 0), 132, 4, 64, 37, 0)
    assert small.pv_split
    assert fl.mma_config((10, 0), 148, 64, 64, 2048, 0).block_n == 64  # sm_100: sm_90's row
    # sm_120: the Gluon loop's mma.sync form, one program per SM, the exact launch beside it;
    # 64 heads x 16 tokens from 400 selected tokens per SM (B x H / 64 x topk / SMs)
    ws120 = fl.mma_config((12, 0), 188, 64, 64, 2048, 0)  # 697 tokens per SM
    assert ws120.ws and (ws120.block_h, ws120.block_n, ws120.num_splits) == (64, 16, 2)
    assert (ws120.exact_in_launch, ws120.exact_concurrent) == (False, True)
    narrow = fl.mma_config((12, 0), 188, 64, 64, 128, 512)  # 218 tokens per SM
    assert narrow.ws and (narrow.block_h, narrow.block_n, narrow.num_splits) == (32, 32, 1)
    assert fl.mma_config((12, 0), 188, 128, 64, 128, 512).block_h == 64  # 436
    assert fl.mma_config((12, 0), 188, 1, 64, 2048, 0).block_h == 32  # 11
    wide96 = fl.mma_config((12, 0), 188, 64, 96, 2048, 0)  # 96 heads: no whole 64-head blocks
    assert wide96.ws and (wide96.block_h, wide96.block_n) == (32, 32)
    proxy = fl.MMA_ROWS["sm120"]
    assert fl.mma_config((9, 0), 132, 64, 64, 128, 512, row=proxy).block_h == 32  # 310
    assert fl.mma_config((9, 0), 132, 128, 64, 128, 512, row=proxy).block_h == 64  # 620
    no_wide = proxy._replace(ws_wide_tokens_per_sm=0)
    assert fl.mma_config((9, 0), 132, 128, 64, 128, 512, row=no_wide).block_h == 32
    # the wide tile is the Gluon loop's only: the Triton loop keeps the row's
    assert fl.mma_config((12, 0), 188, 64, 64, 2048, 0, row=proxy._replace(ws=False)).block_h == 32
    assert fl.mma_config((12, 0), 188, 64, 64, 128, 512).ws  # both caches
    assert fl.mma_config((9, 0), 132, 64, 64, 2048, 0, row=fl.MMA_ROWS["sm120"]).ws  # proxy
    assert not fl.mma_config((12, 0), 188, 64, 48, 2048, 0).ws  # a partly masked 32-head block
    # at most 16 heads: the few-head tile (16 x 32, mma.sync), both caches, decode and
    # prefill, in its own residency (two programs per SM on sm_90, one on sm_120)
    # (at most 8 heads token-major: `WS_TM_TILE`, 8 x 32; the row's ws_few_tm_heads, from
    # ws_few_tm_min_b rows of q: B8 H8 head-major, B64 token-major)
    for cc, sms, per_sm in (((9, 0), 132, 2), ((12, 0), 188, 1)):
        for B, H, topk, extra in ((64, 16, 2048, 0), (64, 8, 128, 512), (1024, 8, 128, 512),
                                  (1, 3, 128, 512), (4096, 16, 2048, 0),
                                  (8, 9, 2048, 0), (8, 8, 128, 512), (32, 8, 2048, 0)):  # fmt: skip
            few = fl.mma_config(cc, sms, B, H, topk, extra)
            assert few.ws and not few.token_major, (cc, B, H)
            tm = H <= 8 and B >= 32
            assert (few.block_h, few.block_n, few.num_warps) == (8 if tm else 16, 32, 4)
            for heads, min_b, block_h in (
                (0, 0, 16),
                (8, 0, 8 if H <= 8 else 16),
                (8, 32, 8 if tm else 16),
            ):
                row = fl.MMA_ROWS[fl.mma_row_name(cc)]._replace(
                    ws_few_tm_heads=heads, ws_few_tm_min_b=min_b
                )
                assert fl.mma_config(cc, sms, B, H, topk, extra, row=row).block_h == block_h
            tiles = fl._tiles(topk, extra, 32)
            assert few.num_splits == max(1, min(sms * per_sm // B, tiles)), (cc, B, H)
    assert fl.mma_config((9, 0), 132, 1024, 8, 128, 512).pack_tokens == 8  # the packed plan too
    assert not fl.mma_config((9, 0), 132, 64, 17, 2048, 0).ws  # 17 heads: two 16-head blocks
    assert not fl.mma_config((9, 0), 132, 4, 8, 64, 64).ws  # the exact PV for the whole call
    no_few = fl.MMA_ROWS["sm90"]._replace(ws_few_programs_per_sm=0)
    assert not fl.mma_config((9, 0), 132, 64, 16, 2048, 0, row=no_few).ws
    assert fl.mma_config((9, 0), 132, 1024, 8, 128, 512, row=no_few).token_major
    assert not fl.mma_config((12, 0), 188, 4, 64, 37, 0).ws  # the exact PV for the whole call
    assert not fl.mma_config((8, 9), 128, 64, 64, 2048, 0).ws  # no setmaxnreg on sm_89
    sm120 = fl.mma_config((12, 0), 188, 64, 64, 2048, 0, row=_SM120_TRITON)
    assert (sm120.block_h, sm120.block_n, sm120.num_warps, sm120.s_by_group) == (32, 32, 4, True)
    assert (sm120.num_splits, sm120.exact_block_h) == (2, 16)  # 188 SMs x 2 // 128 programs
    assert (sm120.num_stages, sm120.exact_in_launch) == (1, True)  # one launch
    assert not sm120.exact_concurrent
    assert fl.mma_config((12, 0), 188, 4, 64, 37, 0).block_h == 16  # exact PV: 16 heads
    assert fl.mma_config((8, 9), 128, 64, 64, 2048, 0) == fl.mma_config(
        (12, 0), 128, 64, 64, 2048, 0, row=_SM120_TRITON
    )
    cpu = fl.mma_config(None, 2, 2, 20, 70, 0)
    assert (cpu.block_h, cpu.block_n, cpu.pv_split, cpu.pv_split_below) == (32, 16, False, 0)
    big = fl.mma_config((9, 0), 132, 1, 64, 100_000, 0)
    assert big.num_splits == fl.MAX_SPLITS
    # the length-aware plan: twice the static splits (at most the tiles), one round of slots
    assert (sm90.plan_splits, sm90.plan_round) == (4, 132)
    assert (b1.plan_splits, b1.plan_round) == (32, 132)  # 32 tiles: no more splits than tiles
    assert fl.mma_config((9, 0), 132, 128, 64, 2048, 0).plan_splits == 0  # one split
    assert small.plan_splits == 0  # the exact PV for the whole call
    # dual-cache calls: the Gluon loop's plan too; none in the Triton loop (without ws_dual)
    assert fl.mma_config((9, 0), 132, 64, 64, 128, 512).plan_splits == 4
    tri = fl.MMA_ROWS["sm90"]._replace(ws_dual=False)
    assert fl.mma_config((9, 0), 132, 64, 64, 128, 512, row=tri).plan_splits == 0
    assert fl.mma_config((9, 0), 132, 8, 128, 2048, 0).plan_round == 66  # two head blocks
    # the Gluon loop computes the few-token requests itself (no exact launch), one cache or
    # two, on both rows; the sm_90 row's dual-cache calls in its wgmma tile (ws_dual), the
    # Triton loop without it
    assert sm90.ws_exact and dual.ws_exact and dual.ws  # `dual`: B64 H64 main 128 + extra 512
    assert not fl.mma_config((9, 0), 132, 64, 64, 128, 512, row=tri).ws
    assert ws120.ws_exact and fl.mma_config((12, 0), 188, 64, 64, 128, 512).ws_exact
    rule = _WS_DUAL_RULE  # 20 requests: 40 programs of 32 heads, past the small-call bound
    assert rule.ws and (rule.block_h, rule.block_n) == (fl.WS_BLOCK_H, fl.WS_BLOCK_N)
    off = fl.MMA_ROWS["sm90"]._replace(length_aware=False)
    assert fl.mma_config((9, 0), 132, 64, 64, 2048, 0, row=off).plan_splits == 0
    # the Triton loop's exact launch as the Gluon loop: 9.x dual-cache calls that loop runs
    assert fl.mma_config((9, 0), 132, 64, 64, 128, 512, row=tri).ws_exact_launch
    assert not dual.ws_exact_launch  # the Gluon loop itself (ws_exact)
    assert not sm90.ws_exact_launch
    r120 = fl.MMA_ROWS["sm120"]._replace(ws_exact_launch=True)
    assert not fl.mma_config((12, 0), 188, 64, 64, 128, 512, row=r120).ws_exact_launch
    assert not fl.mma_config(None, 2, 64, 64, 128, 512).ws_exact_launch


def test_gluon_builds_loader_registers():
    """The wgmma loop's loader gets more registers only on two caches whose loader would
    spill in its tile loop at the one-cache count: a V4.1 FP4 extra cache, or a page size
    that is not a power of two (the loader divides); one-cache builds lose with more. The
    mma.sync tiles keep theirs whatever the caches."""
    wgmma = (fl.WS_BLOCK_H, fl.WS_BLOCK_N)
    regs = lambda *a: fl.ws_build(wgmma, *a)["LOADER_REGS"]  # noqa: E731
    assert regs(True) == regs(True, fl.FMT_V41) == fl.WS_LOADER_REGS  # SGLang's pages: shifts
    assert regs(True, fl.FMT_V41_FP4) == regs(True, fl.FMT_V4, False) == fl.WS_DUAL_LOADER_REGS
    assert regs(False) == regs(False, fl.FMT_V4, False) == fl.WS_LOADER_REGS
    assert fl.WS_DUAL_LOADER_REGS > fl.WS_LOADER_REGS
    for tile in fl.WS_SYNC_TILES:
        for has_extra in (False, True):
            for e_fmt in (fl.FMT_V4, fl.FMT_V41_FP4):
                build = fl.ws_build(tile, has_extra, e_fmt, False)
                assert build["MMA_SYNC"] and build["LOADER_REGS"] == fl.WS_LOADER_REGS, tile


def test_gluon_builds_s_products():
    """The head-major mma.sync tiles hold some, not all, of q's 8 64-dim groups in registers;
    the wgmma tile, whose q is wgmma's shared-memory operand, none; the token-major tile (the
    only one built TOKEN_MAJOR) holds all of q^T its own way."""
    for tile in fl.WS_SYNC_TILES:
        tm = fl.ws_build(tile)["TOKEN_MAJOR"]
        assert tm == (tile == fl.WS_TM_TILE), tile
        if not tm:
            assert 0 < fl.ws_build(tile)["Q_HELD"] < 8, tile
    assert fl.ws_build((fl.WS_BLOCK_H, fl.WS_BLOCK_N))["Q_HELD"] == 0


def test_gluon_builds_signal_the_combine_only_from_the_wgmma_and_long_tiles():
    """Launched as the combine's predecessor (`dependents`), only the wgmma tile's and the
    long mma.sync tile's programs signal it early; the other mma.sync tiles never do, and no
    build does without a dependent."""
    wgmma = (fl.WS_BLOCK_H, fl.WS_BLOCK_N)
    for tile in (wgmma, fl.WS_SYNC_LONG_TILE):
        assert fl.ws_build(tile, dependents=True)["LAUNCH_DEPENDENTS"] is True, tile
        assert fl.ws_build(tile, True, dependents=True)["LAUNCH_DEPENDENTS"] is True, tile
    for tile in (wgmma, *fl.WS_SYNC_TILES):
        assert fl.ws_build(tile)["LAUNCH_DEPENDENTS"] is False, tile
    for tile in fl.WS_SYNC_TILES:
        if tile != fl.WS_SYNC_LONG_TILE:
            assert fl.ws_build(tile, dependents=True)["LAUNCH_DEPENDENTS"] is False, tile


def _coord(bases, index, rank=3):
    """The coordinate ([row, group, byte] by default) a linear layout's bases give `index`:
    the xor of its set bits' bases."""
    c = [0] * rank
    for bit, base in enumerate(bases):
        if index >> bit & 1:
            c = [a ^ b for a, b in zip(c, base, strict=True)]
    return c


def _layout_offsets(bases, shape):
    """Each coordinate of a shared-memory tile -> its offset, from a linear layout's bases
    (what each bit of an offset adds, by xor, to its coordinate)."""
    return {tuple(_coord(bases, off, len(shape))): off for off in range(math.prod(shape))}


@pytest.mark.parametrize("block_n", sorted({n for _, n in fl.WS_SYNC_TILES}))
def test_raw_v4_lines_keep_copies_whole_and_ldmatrix_conflict_free(block_n):
    """The layout places every byte of the tile once; a token's two-group line (the 128 bytes
    one copy lands) is one aligned 128-byte run; and the two tokens of one ldmatrix matrix
    (an even token and the next, one group) cover the 128 bytes of a bank row once each."""
    offsets = _layout_offsets(fl.ws_raw_v4_line_bases(block_n), (block_n, 8, 64))
    coords = {(t, g, x) for t in range(block_n) for g in range(8) for x in range(64)}
    assert set(offsets) == coords  # a bijection: 2^k offsets onto as many coordinates
    for t in range(block_n):
        for plane in range(4):
            line = sorted(offsets[t, 2 * plane + h, x] for h in range(2) for x in range(64))
            assert line == list(range(line[0], line[0] + 128)) and line[0] % 128 == 0
    for t in range(0, block_n, 2):
        for g in range(8):
            pair = {offsets[t + d, g, x] % 128 for d in range(2) for x in range(64)}
            assert pair == set(range(128)), (t, g)


def _wavefronts(byte_runs):
    """Shared-memory wavefronts of one warp access: its lanes' (offset, bytes) runs, in lane
    order. Accesses wider than 4 bytes a lane go in phases of 128 bytes (half-warps for 8,
    quarter-warps for 16); within a phase each 4-byte word is in one of 32 banks, and words of
    one bank cost a wavefront each."""
    per_phase = 128 // max(4, byte_runs[0][1])
    total = 0
    for p in range(0, len(byte_runs), per_phase):
        words = collections.defaultdict(set)
        for off, size in byte_runs[p : p + per_phase]:
            for w in range(off // 4, (off + size) // 4):
                words[w % 32].add(w)
        total += max(len(v) for v in words.values())
    return total


def _k_tile_offset(row, col):
    """Byte offset of fp16 element (row, col) of a [tokens, 512] K tile in the mma.sync tiles'
    shared layout (16-byte pieces xor the row mod 8: `SwizzledSharedLayout(8, 1, 8)`)."""
    piece = col // 8
    return row * 1024 + ((piece & ~7) | ((piece & 7) ^ (row % 8))) * 16 + col % 8 * 2


@pytest.mark.parametrize("rows", [fl.WS_TM_BLOCK_H, fl.WS_FEW_BLOCK_N])
def test_halves_view_is_the_same_bytes(rows):
    """The token-major tile's [rows, 2, 256] view (`ws_halves_bases`) of q's and the K tile's
    [rows, 512] buffers names every element where the buffers' own swizzled layout stores it:
    (row, half, dim) is (row, half * 256 + dim)."""
    offsets = _layout_offsets(fl.ws_halves_bases(rows), (rows, 2, 256))
    assert len(offsets) == rows * 512
    for (r, h, d), off in offsets.items():
        assert 2 * off == _k_tile_offset(r, h * 256 + d), (r, h, d)


# (consumer warps, tokens a tile) of the V4.1 dequantizing tiles: few-head, 32 x 32, wide, wgmma
_V41_TILES = [(4, 32), (8, 32), (8, 16), (8, 64)]


@pytest.mark.parametrize("cw,block_n", _V41_TILES)
def test_raw_v41_tile_keeps_rows_whole_and_dequant_is_conflict_free(cw, block_n):
    """The V4.1 FP8 raw tile places every byte once, each token's 512-byte row is one aligned
    run (the loader's copies) with each group's 32 bytes whole; the dequantization's loads of
    one group per warp take the fewest wavefronts their bytes need, and (4 byte columns a
    thread, 8-byte stores) so do its stores to the K tile. Token-major raw rows and 4
    consecutive rows a warp took 4 wavefronts a load and twice the stores' (sessions 29-30)."""
    shape = (block_n, 16, 32)
    offsets = _layout_offsets(fl.ws_raw_v41_bases(block_n), shape)
    assert set(offsets) == set(itertools.product(*map(range, shape)))
    for t in range(block_n):
        row = sorted(offsets[t, g, x] for g in range(16) for x in range(32))
        assert row == list(range(t * 512, t * 512 + 512))
        for g in range(16):  # one aligned 32-byte slot, in two whole 16-byte pieces
            group = [offsets[t, g, x] for x in range(32)]
            assert sorted(group) == list(range(min(group), min(group) + 32))
            assert min(group) % 32 == 0
            for half in (group[:16], group[16:]):
                assert half == list(range(half[0], half[0] + 16)) and half[0] % 16 == 0
    reg, lane, warp, (rows, _, _) = fl.ws_dequant_v41_bases(cw, block_n)
    assert len(warp) == (cw - 1).bit_length()

    width = 1 << sum(1 for b in reg if b[1] == 0)  # bytes a thread holds of a group
    held = set()
    for step in range(0, block_n, rows):
        for w in range(cw):
            for g in range(16):
                lanes = []
                for ln in range(32):
                    at = zip(_coord(lane, ln), _coord(warp, w), strict=True)
                    r, _, x = (a ^ b for a, b in at)
                    lanes.append((step + r, x))
                    held.update((step + r, g, x + k) for k in range(width))
                loads = [(offsets[r, g, x], width) for r, x in lanes]
                assert _wavefronts(loads) == max(1, width * 32 // 128), (w, g)
                if width == 4:  # 4 values a thread, 8 bytes of fp16 a store
                    stores = [(_k_tile_offset(r, g * 32 + x), 8) for r, x in lanes]
                    assert _wavefronts(stores) == 2, (w, g)
    assert held == set(itertools.product(*map(range, shape)))  # each value dequantized


@pytest.mark.parametrize("cw,block_n", _V41_TILES)
def test_fp4_view_is_the_same_bytes_and_its_dequant_is_conflict_free(cw, block_n):
    """An FP4 extra cache's tiles land in the V4.1 raw buffer through its FP8 view (the
    loader) and are read through `ws_raw_fp4_view_bases`: each byte of a token's row at the
    same offset in both. The FP4 dequantization (16 rows a step; a thread's 16 bytes, 2 scale
    groups) reads and stores (16-byte pieces, quarter-warp phases) at the fewest wavefronts;
    a thread's 64 contiguous bytes of fp16 with 8 lanes of one row took four times those."""
    fp8 = _layout_offsets(fl.ws_raw_v41_bases(block_n), (block_n, 16, 32))
    fp4 = _layout_offsets(fl.ws_raw_fp4_view_bases(block_n), (block_n, 64, 8))
    for t in range(block_n):
        for i in range(512):
            assert fp8[t, i // 32, i % 32] == fp4[t, i // 8, i % 8], (t, i)
    reg, lane, warp, shape = fl.ws_dequant_fp4_bases(cw)

    held = set()
    piece_regs = [i for i, b in enumerate(reg) if b[0] == 0]  # a thread's 16 bytes of a row
    row_regs = [i for i, b in enumerate(reg) if b[0] != 0]
    assert [reg[i] for i in piece_regs] == [[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 1, 0]]
    for step in range(0, block_n, shape[0]):
        for w in range(cw):
            for rr in range(1 << len(row_regs)):
                row_bits = _coord([reg[i] for i in row_regs], rr)
                lanes = []
                for ln in range(32):
                    r, c, _ = (a ^ b ^ d for a, b, d in zip(
                        _coord(lane, ln), _coord(warp, w), row_bits, strict=True))  # fmt: skip
                    assert c % 2 == 0
                    lanes.append((step + r, c))
                    held.update((step + r, c + k // 8, k % 8) for k in range(16))
                loads = [(fp4[r, c, 0], 16) for r, c in lanes]
                assert _wavefronts(loads) == 4, (w, rr)
                for k in range(4):  # the 32 values' 16-byte stores, 8 values each
                    stores = [(_k_tile_offset(r, c * 16 + k * 8), 16) for r, c in lanes]
                    assert _wavefronts(stores) == 4, (w, rr, k)
    assert held == {(t, c, k) for t in range(block_n) for c in range(32) for k in range(8)}


def test_prefill_rule_only_for_many_programs_of_16_heads():
    """The Triton loops' rule (where the Gluon loop's few-head tile cannot run: no Gluon, V4.1
    caches): prefill-sized calls (>= 4 programs per resident slot) with a 16-head block take
    the row's prefill tile and warps; 64-head prefill and decode-sized calls keep the row's."""
    pf = fl.mma_config((9, 0), 132, 1024, 8, 128, 512, row=_SM90_TRITON)
    row = fl.MMA_ROWS["sm90"]
    tile = (row.prefill_tm_block_n, row.prefill_tm_num_warps)
    assert (pf.block_h, (pf.block_n, pf.num_warps), pf.num_splits) == (8, tile, 1)
    assert pf.token_major and pf.exact_concurrent
    # the exact launch keeps the head-major prefill tile
    assert (pf.exact_block_n, pf.exact_num_warps) == (row.prefill_block_n, row.prefill_num_warps)
    h16 = fl.mma_config((9, 0), 132, 1024, 16, 2048, 0, row=_SM90_TRITON)
    tile16 = (row.prefill_tm16_block_n or tile[0], row.prefill_tm16_num_warps or tile[1])
    assert (h16.block_h, (h16.block_n, h16.num_warps), h16.num_splits) == (16, tile16, 1)
    assert h16.token_major
    h64 = fl.mma_config((9, 0), 132, 1024, 64, 128, 512, row=_SM90_TRITON)
    assert (h64.block_n, h64.num_warps) == (64, 8)
    assert not h64.token_major
    decode = fl.mma_config(
        (9, 0), 132, 64, 8, 128, 512, row=_SM90_TRITON
    )  # 64 programs < 4 x 132 slots
    assert (decode.block_n, decode.num_warps, decode.token_major) == (64, 8, False)
    sm120 = fl.mma_config((12, 0), 188, 1024, 8, 128, 512, row=_SM120_TRITON)
    assert (sm120.block_n, sm120.num_warps, sm120.token_major) == (32, 4, False)  # its row
    # few selected tokens: the whole call takes the exact PV, head-major
    small = fl.mma_config((9, 0), 132, 1024, 8, 64, 64, row=_SM90_TRITON)
    assert (small.pv_split, small.token_major, small.block_h, small.block_n) == (
        True, False, 16, 32)  # fmt: skip
    # the exact PV as a branch of the same launch: no token-major loop
    row = _SM90_TRITON._replace(exact_in_launch=True)
    assert not fl.mma_config((9, 0), 132, 1024, 8, 128, 512, row=row).token_major
    # without a token-major tile: the head-major prefill tile
    row = _SM90_TRITON._replace(prefill_tm_block_n=0)
    hm = fl.mma_config((9, 0), 132, 1024, 8, 128, 512, row=row)
    assert (hm.block_h, hm.block_n, hm.num_warps, hm.token_major) == (16, 32, 4, False)


def test_token_major_from_one_wave_when_one_round():
    """Between one and four head-major waves (SMs x programs per SM), the sm_90 row runs the
    token-major loop with one split when its programs fit one round of its slots (16 heads
    first, else 8), walk at most TM_ONE_ROUND_MAX_TILES tiles and fewer tile-times than the
    head-major rounds (v21); else as before. (The Triton loops' rule: where the Gluon loop's
    few-head tile runs, it takes these calls.)"""
    sm90 = fl.MMA_ROWS["sm90"]
    assert fl.tm_one_round(sm90, 132, 256, 8, 128, 512) == (16, 1)  # 20 x 0.8 < 2 x 10
    assert fl.tm_one_round(sm90, 132, 160, 8, 128, 512) == (16, 1)
    assert fl.tm_one_round(sm90, 132, 132, 8, 128, 512) is None  # one head-major round
    assert fl.tm_one_round(sm90, 132, 300, 8, 128, 512) is None  # 40 x 0.8 > 3 x 10
    assert fl.tm_one_round(sm90, 132, 512, 8, 128, 512) == (8, 1)  # 32 < 4 x 10
    assert fl.tm_one_round(sm90, 132, 300, 16, 128, 512) is None  # two 16-head rounds
    assert fl.tm_one_round(sm90, 132, 256, 8, 2048, 0) is None  # 64 tiles
    assert fl.tm_one_round(fl.MMA_ROWS["sm120"], 188, 256, 8, 128, 512) is None  # no slots
    cfgs = {
        B: fl.mma_config((9, 0), 132, B, 8, 128, 512, row=_SM90_TRITON)
        for B in (132, 160, 256, 300, 512)
    }
    assert {B: (c.token_major, c.block_h, c.num_splits) for B, c in cfgs.items()} == {
        132: (False, 16, 1), 160: (True, 16, 1), 256: (True, 16, 1), 300: (False, 16, 1),
        512: (True, 8, 1)}  # fmt: skip
    for B in (160, 256, 512):  # the exact launch beside it keeps the head-major prefill tile
        assert (cfgs[B].exact_block_n, cfgs[B].exact_num_warps, cfgs[B].exact_concurrent) == (
            32, 4, True)  # fmt: skip
    assert (cfgs[256].block_n, cfgs[256].num_warps, cfgs[512].block_n) == (32, 4, 16)
    assert (cfgs[300].block_n, cfgs[300].num_warps) == (64, 8)  # head-major, as before
    h16 = fl.mma_config((9, 0), 132, 256, 16, 128, 512, row=_SM90_TRITON)
    assert (h16.token_major, h16.block_h, h16.block_n, h16.num_splits) == (True, 16, 32, 1)
    assert not fl.mma_config(
        (9, 0), 132, 131, 8, 128, 512, row=_SM90_TRITON
    ).token_major  # under one wave
    k2048 = fl.mma_config((9, 0), 132, 256, 8, 2048, 0, row=_SM90_TRITON)
    assert (k2048.token_major, k2048.block_n, k2048.num_warps) == (False, 64, 8)
    assert fl.mma_config((9, 0), 132, 1024, 8, 128, 512, row=_SM90_TRITON).num_splits == 1
    few = fl.mma_config(
        (9, 0), 132, 256, 8, 64, 64, row=_SM90_TRITON
    )  # few tokens: head-major exact, main's tile
    assert (few.pv_split, few.token_major, few.block_n, few.num_warps) == (True, False, 64, 8)
    assert not fl.mma_config(
        (12, 0), 188, 256, 8, 128, 512, row=_SM120_TRITON
    ).token_major  # sm_120 row
    assert not fl.mma_config(
        (9, 0), 132, 256, 64, 128, 512, row=_SM90_TRITON
    ).token_major  # 64 heads


# (id, T, H, token-major block heads, splits, make_inputs kwargs, exact pass: (below, mode))
_TM_SMALL = dict(topk=40, page_size=16, extra_topk=24, extra_page_size=8)
_TM_GPU = dict(topk=128, page_size=64, extra_topk=512, extra_page_size=64)
_TM = _TM_GPU if ON_GPU else _TM_SMALL
TOKEN_MAJOR_CASES = [
    ("h8-dual-sink", 6, 8, 8, 1, dict(_TM, with_sink=True), None),
    ("h8-partial-invalid-2splits", 5, 8, 8, 2,
     dict(_TM, with_sink=True, topk_length="partial", invalid_fraction=0.2), None),
    ("h16-two-blocks-single-cache", 4, 16, 8, 1, dict(topk=_TM["topk"], page_size=16), None),
    ("h16-one-block-3splits", 3, 16, 16, 3, dict(_TM, with_sink=True), None),
    ("h5-masked-heads", 4, 5, 8, 1, dict(_TM, with_sink=True), None),
    ("h8-empty-and-inf-sink", 4, 8, 8, 1,
     dict(_TM, with_sink=True, topk_length="zero"), None),
    ("h8-exact-second-launch", 6, 8, 8, 1,
     dict(_TM, with_sink=True, topk_length="partial", invalid_fraction=0.3), (24, "second")),
    ("h8-exact-concurrent", 6, 8, 8, 2,
     dict(_TM, with_sink=True, topk_length="partial", invalid_fraction=0.3), (24, "concurrent")),
    # fewer heads than the block (v21: H <= 8 in the 16-head build, one round of it)
    ("h8-in-16-head-block", 5, 8, 16, 1, dict(_TM, with_sink=True), None),
    ("h6-in-16-head-block-partial-concurrent", 6, 6, 16, 1,
     dict(_TM, with_sink=True, topk_length="partial", invalid_fraction=0.3), (24, "concurrent")),
]  # fmt: skip


@pytest.mark.parametrize(
    "case_id,T,H,block_h,splits,kw,exact", TOKEN_MAJOR_CASES,
    ids=[c[0] for c in TOKEN_MAJOR_CASES],
)  # fmt: skip
def test_token_major_loop_matches_reference(case_id, T, H, block_h, splits, kw, exact):
    """The token-major bf16-P loop (`_split_heads_tm`, prefill-sized calls of few heads): 8 or
    16 heads per program (8: the products' N unpadded), masked heads, one or several splits,
    sink, partial lengths, invalid ids, empty requests, and the exact PV for few-token
    requests as a second head-major launch with its own tile (after it, or beside it skipping
    them; its splits cut in its own tiles)."""
    inputs = ref.make_inputs(T, H, device=DEVICE, seed=_seed(case_id), **kw)
    below, mode = exact or (0, "second")
    cfg = MMAConfig(block_h, 16, splits, 2, 1)._replace(
        token_major=True, pv_split_below=below, exact_block_h=16,
        exact_concurrent=mode == "concurrent", exact_block_n=32, exact_num_warps=4,
    )  # fmt: skip
    _run_and_check(inputs, "mma", cfg, expect_all_invalid=kw.get("topk_length") == "zero")


class _LaunchSpy:
    """Stands in for a Triton kernel object: records each launch's keyword arguments and
    launches the real kernel with them."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.mark.parametrize("layouts", [("v41", None), ("v41", "v41_fp4")])
def test_token_major_config_runs_head_major_for_v41_caches(monkeypatch, layouts):
    """A DSv4.1 cache (either one) takes the head-major loop even under a token-major config
    (their token-major builds spill): the kernel is launched with TOKEN_MAJOR off and 16-head
    blocks, and the result is accurate."""
    spy = _LaunchSpy(fl._mma_split_kernel)
    monkeypatch.setattr(fl, "_mma_split_kernel", spy)
    main_layout, extra_layout = layouts
    inputs = ref.make_inputs(
        4, 8, device=DEVICE, seed=_seed(str(layouts)), kv_layout=main_layout,
        extra_kv_layout=extra_layout, **dict(_TM, with_sink=True),
    )  # fmt: skip
    cfg = MMAConfig(8, 16, 1, 2, 1)._replace(
        token_major=True, exact_block_h=16, exact_block_n=32, exact_num_warps=4
    )
    _run_and_check(inputs, "mma", cfg)
    seen = [(kw["TOKEN_MAJOR"], kw["BLOCK_H"], kw["BLOCK_N"], kw["num_warps"])
            for kw in spy.launches]  # fmt: skip
    assert seen and all(s == (False, 16, 32, 4) for s in seen), seen
    assert fl._head_major(cfg) == cfg._replace(
        block_h=16, block_n=32, num_warps=4, token_major=False, exact_block_n=0,
        exact_num_warps=0,
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["second", "in_launch", "concurrent"])
@pytest.mark.parametrize("count_block_max", [16, 4096])
def test_exact_pass_count_in_one_block_or_a_loop(monkeypatch, count_block_max, mode):
    """The per-request count of valid indices that picks the exact PV, in one block (index
    rows up to COUNT_BLOCK_MAX) and in a loop (longer rows; forced here with a 16-entry
    block), as a second launch, a branch of the one launch, or a second launch beside the
    first (which then skips the few-token requests; here, without streams, one after the
    other): the few-token requests must get the exact PV and the others the bf16-P result,
    so every output is written (poisoned first) and accurate."""
    monkeypatch.setattr(fl, "COUNT_BLOCK_MAX", count_block_max)
    inputs = ref.make_inputs(
        B=4, H=64, topk=40, page_size=64, extra_topk=24, extra_page_size=32,
        topk_length="partial", invalid_fraction=0.2, with_sink=True, device=DEVICE, seed=77,
    )  # fmt: skip
    cfg = MMAConfig(
        64, BN, 2, W, 1, pv_split_below=30, exact_in_launch=mode == "in_launch",
        exact_concurrent=mode == "concurrent",
    )  # fmt: skip
    _run_and_check(inputs, "mma", cfg)


def _replay_with(graph, static, out, lse, inputs):
    """Replay a captured decode on new data: `inputs` copied into the graph's `static`
    buffers, its outputs poisoned (NaN) first so that an unwritten element shows."""
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor):
            static[k].copy_(v)
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()


def _check_written_and_accurate(out, lse, inputs):
    """Every output element written, and accurate against the float64 reference of `inputs`."""
    torch.cuda.synchronize()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any(), "unwritten output"
    acc = ref.check_accuracy(out, lse, *ref.reference_sparse_decode(**inputs))
    assert acc["ok"], acc


@pytest.mark.skipif(not ON_GPU, reason="CUDA streams and graphs need a GPU")
@pytest.mark.parametrize("form", ["side-made-before", "side-made-in-capture", "table"])
def test_exact_side_stream_in_cuda_graph_and_from_another_stream(form):
    """The exact launch on a side stream beside the bf16-P launch (`exact_concurrent`):
    captured in a CUDA graph (the side stream made before the capture, or inside it on first
    use) and replayed with new data copied into the same buffers, then the first data again,
    and called eagerly from a non-default current stream: every output written (poisoned
    before each run) and accurate against the float64 reference of the data it saw. "table":
    the table's config as is (on an H200 with triton 3.6: the Gluon loop with its own exact PV
    and the length-aware split, which each replay plans again from the new lengths)."""
    kw = dict(B=64, H=64, topk=2048, page_size=64, with_sink=True, topk_length="partial",
              invalid_fraction=0.1, device=DEVICE)  # fmt: skip
    cfg = fl._device_mma_config(torch.device(DEVICE), 64, 64, 2048, 0)
    if form != "table":
        cfg = cfg._replace(exact_in_launch=False, exact_concurrent=True, ws_exact=False)
    sets = [ref.make_inputs(**kw, seed=_seed(f"side-stream-{i}")) for i in range(2)]
    static = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in sets[0].items()}
    out = torch.empty(64, 1, 64, 512, dtype=torch.bfloat16, device=DEVICE)
    lse = torch.empty(64, 64, 1, dtype=torch.float32, device=DEVICE)

    def check(inputs):
        _check_written_and_accurate(out, lse, inputs)

    def call(inputs):
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        decode(**inputs, variant="mma", out=out, lse=lse, _config=cfg)

    call(static)  # compile outside the capture
    check(static)
    if form == "side-made-in-capture":
        fl._SIDE_STREAMS.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode(**static, variant="mma", out=out, lse=lse, _config=cfg)
    for inputs in (sets[1], sets[0]):
        _replay_with(graph, static, out, lse, inputs)
        check(inputs)
    other = torch.cuda.Stream()
    other.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(other):
        call(sets[1])
    torch.cuda.current_stream().wait_stream(other)
    check(sets[1])


def test_combine_launched_as_programmatic_dependent_only_on_9x_gpus(monkeypatch):
    """The combine is the split kernel's programmatic dependent (`launch_pdl`, waiting in the
    kernel before it reads the partials) on a 9.x or newer GPU; on the CPU interpreter (and
    older GPUs) it is launched plainly, so nothing there depends on `griddepcontrol`."""
    spy = _LaunchSpy(fl._combine_kernel)
    monkeypatch.setattr(fl, "_combine_kernel", spy)
    inputs = ref.make_inputs(B=2, H=16, topk=64, page_size=16, extra_topk=32, with_sink=True,
                             device=DEVICE, seed=_seed("pdl-launch"))  # fmt: skip
    cfg = MMAConfig(16, BN, 2, W, 1, ON_GPU)  # the exact PV on the GPU: 96 tokens
    out, lse = decode(**inputs, variant="mma", _config=cfg)
    assert len(spy.launches) == 1
    if ON_GPU and tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 4):
        assert fl.HAS_PDL  # its launcher has `launch_pdl` and the language `gdc_wait`
    expect = ON_GPU and torch.cuda.get_device_capability()[0] >= 9 and fl.HAS_PDL
    assert spy.launches[0].get("launch_pdl", False) is expect
    assert spy.launches[0]["PDL"] is expect
    acc = ref.check_accuracy(out, lse, *ref.reference_sparse_decode(**inputs))
    assert acc["ok"], acc


@pytest.mark.skipif(not ON_GPU, reason="programmatic dependent launch needs a GPU")
@pytest.mark.parametrize(
    "shape",
    [
        dict(B=32, H=64, topk=128, page_size=256, extra_topk=512, extra_page_size=64),
        dict(B=4, H=64, topk=128, page_size=256, extra_topk=512, extra_page_size=64),
        dict(B=1, H=64, topk=2048, page_size=64),
        dict(B=16, H=64, topk=2048, page_size=64, topk_length="partial", invalid_fraction=0.1),
    ],
    ids=["B32-dual", "B4-dual", "B1-topk2048", "B16-topk2048-partial"],
)
def test_programmatic_combine_matches_plain_launch_eagerly_and_in_graph(shape):
    """The combine launched early (programmatic dependent launch, the wgmma tile's programs
    signalling it before their partial stores) must read the finished partials: its outputs
    equal, bit for bit, those of the plain launch, called eagerly and replayed in one CUDA
    graph that runs two decodes back to back (the second's split kernel after the first's
    early-launched combine) on new data."""
    kw = dict(shape, with_sink=True, device=DEVICE)
    sets = [ref.make_inputs(**kw, seed=_seed(f"pdl-{i}-{shape['B']}")) for i in range(2)]
    B, H = shape["B"], shape["H"]

    def run(inputs, pdl):
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(fl, "HAS_PDL", fl.HAS_PDL and pdl)
                fl._pdl.cache_clear()
                return decode(**inputs, variant="mma")
        finally:
            fl._pdl.cache_clear()  # read again with HAS_PDL restored

    for inputs in sets:
        plain, early = run(inputs, False), run(inputs, True)
        assert torch.equal(plain[0], early[0]) and torch.equal(plain[1], early[1])
        acc = ref.check_accuracy(*early, *ref.reference_sparse_decode(**inputs))
        assert acc["ok"], acc
    static = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
              for s in sets]  # fmt: skip
    outs = [(torch.empty(B, 1, H, 512, dtype=torch.bfloat16, device=DEVICE),
             torch.empty(B, H, 1, dtype=torch.float32, device=DEVICE)) for _ in sets]  # fmt: skip
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for st, (o, lse) in zip(static, outs, strict=True):
            decode(**st, variant="mma", out=o, lse=lse)
    for k in static[0]:  # new data: each decode gets the other's inputs
        if isinstance(static[0][k], torch.Tensor):
            static[0][k].copy_(sets[1][k])
            static[1][k].copy_(sets[0][k])
    for o, lse in outs:
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for inputs, (o, lse) in zip((sets[1], sets[0]), outs, strict=True):
        expect = run(inputs, False)
        assert torch.equal(o, expect[0]) and torch.equal(lse, expect[1])


# ----------------------------------------------------------------------------- packed tokens

bench_mod = _load("_kd_test_dsv4_bench", "dsv4_bench.py")


def _share_inputs(T, H, seed, share=None, **kw):
    """Prefill-like inputs: requests of `share` consecutive tokens whose selections coincide
    (the benchmark's share rows: a sliding window in the main cache, one selection with 1 in
    16 entries redrawn per token in the extra cache)."""
    inputs = ref.make_inputs(T, H, device=DEVICE, seed=seed, **kw)
    bench_mod._share_indices(inputs, share or T, seed)
    return inputs


def _packed_config(T, H, topk, e_topk, G):
    return fl._device_mma_config(torch.device(DEVICE), T, H, topk, e_topk)._replace(
        pack_tokens=G, pv_split=False
    )


def _spy_plans(monkeypatch):
    """Record the packed groups' flags of each call (the plan `_launch_packed` gets)."""
    seen = []
    orig = fl._launch_packed

    def spy(q, main, extra, common, flags, plan):
        seen.append(plan["flag"].tolist())
        return orig(q, main, extra, common, flags, plan)

    monkeypatch.setattr(fl, "_launch_packed", spy)
    return seen


# (id, T, H, tokens per group, make_inputs kwargs, share)
_PACK_SMALL = dict(topk=32, page_size=16)
_PACK_GPU = dict(topk=128, page_size=256, extra_topk=512, extra_page_size=64)
PACK_CASES = [
    ("dual-sink", 16, 8, 8, dict(extra_topk=48, extra_page_size=16, with_sink=True), None),
    ("partial-invalid-tail", 20, 8, 8,
     dict(extra_topk=48, extra_page_size=16, with_sink=True, topk_length="partial",
          invalid_fraction=0.1), 8),
    ("single-cache", 24, 8, 8, {}, 12),
    ("h16-by-4", 16, 16, 4, dict(extra_topk=48, extra_page_size=16), None),
    ("h3-by-8", 16, 3, 8, dict(extra_topk=48, extra_page_size=16, with_sink=True), None),
]  # fmt: skip


@pytest.mark.parametrize("case_id,T,H,G,kw,share", PACK_CASES, ids=[c[0] for c in PACK_CASES])
def test_packed_tokens_match_reference(monkeypatch, case_id, T, H, G, kw, share):
    """Consecutive tokens whose selections coincide, attended as one block over the union
    of their selections (each row masked to its own token's keys): every output written
    and accurate, and the full groups whose tokens share were packed (a partial last group
    and any group that does not share go through the per-token launch)."""
    if ON_GPU:  # more than 256 valid tokens per token (fewer take the exact PV, never packed)
        kw = {**kw, **(_PACK_GPU if "extra_topk" in kw else dict(topk=512, page_size=64))}
    else:
        kw = {**_PACK_SMALL, **kw}
    inputs = _share_inputs(T, H, _seed(f"pack-{case_id}"), share, **kw)
    cfg = _packed_config(T, H, kw["topk"], kw.get("extra_topk", 0), G)
    seen = _spy_plans(monkeypatch)
    _run_and_check(inputs, "mma", cfg)
    assert len(seen) == 1 and len(seen[0]) == -(-T // G), seen
    assert T % G == 0 or seen[0][-1] == 0, seen  # a partial last group: per token
    # With partial lengths on the GPU nearly every group holds a token of <= 256 valid tokens
    # (those take the exact PV, per token); otherwise the groups share and are packed.
    assert sum(seen[0]) >= 1 or (ON_GPU and kw.get("topk_length") == "partial"), seen


def test_packed_tokens_own_rows_and_duplicates(monkeypatch):
    """Tokens that own their rows are not packed (the probe finds no shared selection); a
    token selecting one row several times weighs it that many times in a packed group too."""
    kw = _PACK_GPU if ON_GPU else dict(_PACK_SMALL, extra_topk=48, extra_page_size=16)
    own = ref.make_inputs(16, 8, device=DEVICE, seed=_seed("pack-own"), **kw)
    cfg = _packed_config(16, 8, kw["topk"], kw["extra_topk"], 8)
    seen = _spy_plans(monkeypatch)
    _run_and_check(own, "mma", cfg)
    assert seen == [[0, 0]], seen
    dup = _share_inputs(16, 8, _seed("pack-dup"), **kw)
    for key in ("indices", "extra_indices"):
        rows = dup[key].view(16, -1)
        rows[3, 1:4] = rows[3, 0]  # token 3 selects its first row 4 times
        rows[9, -2] = rows[9, 5]
    _run_and_check(dup, "mma", cfg)
    assert seen[1] == [1, 1], seen


def _valid_counts(inputs, key, len_key, cache_key, t):
    """Token t's valid selections in one cache as {index: times selected}."""
    row = inputs[key].view(inputs[key].shape[0], -1)[t].tolist()
    lens = inputs[len_key]
    n = len(row) if lens is None else min(int(lens[t]), len(row))
    cache = inputs[cache_key]
    num_tokens = cache.shape[0] * cache.shape[1]
    return collections.Counter(i for i in row[:n] if 0 <= i < num_tokens)


def test_pack_plan_union_counts_every_selection(monkeypatch):
    """The plan's union of a group, read back: per cache, every token's count of every index
    summed over the union's entries equals how often the token selects it, and the first
    token's indices come first, once each, in ascending order. Group 0 (coinciding rows,
    packed) has each index once; in group 1 six tokens select rows of their own, more than a
    second base row holds, so some indices get one entry per selection, and the group is
    not packed (its union is too large) but its union is still exact."""
    kw = _PACK_GPU if ON_GPU else dict(_PACK_SMALL, extra_topk=48, extra_page_size=16)
    T, H, G = 16, 8, 8
    inputs = _share_inputs(T, H, _seed("pack-union"), **kw)
    for key in ("indices", "extra_indices"):
        rows = inputs[key].view(T, -1)
        cache = inputs["k_cache" if key == "indices" else "extra_k_cache"]
        taken = set(rows.flatten().tolist())
        outside = min(set(range(cache.shape[0] * cache.shape[1])) - taken)  # selected by none
        rows[2, 3:5] = outside  # twice by token 2, once by token 5: not in token 0's row
        rows[5, 7] = outside
        rows[0, 1:3] = rows[0, 0]  # token 0 selects one index three times
        n = cache.shape[0] * cache.shape[1]
        for t in range(9, 15):  # rows of their own: far from the others' (mod the cache)
            rows[t] = (rows[8] + (t - 8) * (n // 7)) % n
        rows[14] = rows[13]  # selections past the second base shared by two tokens
    plans = []
    orig = fl._launch_packed

    def spy(q, main, extra, common, flags, plan):
        plans.append({k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in plan.items()})
        return orig(q, main, extra, common, flags, plan)

    monkeypatch.setattr(fl, "_launch_packed", spy)
    _run_and_check(inputs, "mma", _packed_config(T, H, kw["topk"], kw["extra_topk"], G))
    (plan,) = plans
    assert plan["flag"].tolist() == [1, 0], plan["flag"]
    caches = (
        ("indices", "topk_length", "k_cache", 0, plan["cap"]),
        ("extra_indices", "extra_topk_length", "extra_k_cache", 2 * plan["cap"], plan["e_cap"]),
    )
    for grp in range(T // G):
        for c, (key, len_key, cache_key, off, cap) in enumerate(caches):
            n = int(plan["union_len"][grp, c])
            keys = plan["union"][grp, off : off + n].tolist()
            words = plan["union"][grp, off + cap : off + cap + n].tolist()
            base = sorted(_valid_counts(inputs, key, len_key, cache_key, grp * G))
            assert keys[: len(base)] == base, (grp, key)
            if grp == 0:
                assert len(set(keys)) == len(keys), (grp, key)
            else:
                assert len(set(keys)) < len(keys), (grp, key)
            for g in range(G):
                got = collections.Counter()
                for i, w in zip(keys, words, strict=True):
                    got[i] += (w >> (4 * g)) & 15
                want = _valid_counts(inputs, key, len_key, cache_key, grp * G + g)
                assert +got == want, (grp, key, g)


def _lengths_with(inputs, T, zero=(), negative=(), main_zero=()):
    """Full topk_length / extra_topk_length tensors with some tokens' lengths 0 or negative
    (in both caches; `main_zero`: in the main cache only)."""
    for key, len_key in (("indices", "topk_length"), ("extra_indices", "extra_topk_length")):
        lens = torch.full((T,), inputs[key].view(T, -1).shape[1], dtype=torch.int32,
                          device=DEVICE)  # fmt: skip
        lens[list(zero)] = 0
        lens[list(negative)] = -5
        if key == "indices":
            lens[list(main_zero)] = 0
        inputs[len_key] = lens


def test_pack_plan_leaves_groups_with_a_short_token(monkeypatch):
    """A group holding a token whose lengths hold at most `exact_below` selections (that token
    takes the exact PV) is not packed, decided before the probe and the unions; the group
    beside it, sharing as much but for that token, is; every output accurate."""
    kw = _PACK_GPU if ON_GPU else dict(_PACK_SMALL, extra_topk=48, extra_page_size=16)
    T, H, G = 16, 8, 8
    inputs = _share_inputs(T, H, _seed("pack-short"), with_sink=True, **kw)
    cfg = _packed_config(T, H, kw["topk"], kw["extra_topk"], G)
    below = 0 if cfg.pv_split else cfg.pv_split_below
    _lengths_with(inputs, T)
    inputs["topk_length"][3] = min(kw["topk"], below // 2)
    inputs["extra_topk_length"][3] = below - int(inputs["topk_length"][3])
    seen = _spy_plans(monkeypatch)
    _run_and_check(inputs, "mma", cfg)
    assert seen == [[0, 1]], seen


def test_packed_tokens_skipped_by_per_token_launch(monkeypatch):
    """The plan gives the per-token launch length -1 for a packed group's tokens, whose
    programs then exit at once (`SKIP_PACKED`): with the packed launch left out their outputs
    stay unwritten, while the per-token launch writes every other token (a partial last group
    with a token of length 0 and one of negative length), accurately; with the packed launch
    every output is written and accurate."""
    kw = _PACK_GPU if ON_GPU else dict(_PACK_SMALL, extra_topk=48, extra_page_size=16)
    T, H, G = 20, 8, 8
    inputs = _share_inputs(T, H, _seed("pack-skip"), with_sink=True, **kw)
    _lengths_with(inputs, T, zero=[17], negative=[18])
    # One split, as every prefill-sized call the table packs has (with several, the combine
    # kernel writes every row from the partials, and the packed launch overwrites its rows).
    cfg = _packed_config(T, H, kw["topk"], kw["extra_topk"], G)._replace(num_splits=1)
    plans = []

    def no_packed_launch(q, main, extra, common, flags, plan):
        plans.append((plan["flag"].tolist(), main["LEN_ptr"].tolist(), extra["ELEN_ptr"].tolist()))

    monkeypatch.setattr(fl, "_launch_packed", no_packed_launch)
    out = torch.full((T, 1, H, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    lse = torch.full((T, H, 1), float("nan"), dtype=torch.float32, device=DEVICE)
    decode(**inputs, variant="mma", out=out, lse=lse, _config=cfg)
    ((flag, len2, e_len2),) = plans
    assert flag == [1, 1, 0], flag
    assert len2[:16] == [-1] * 16 and e_len2[:16] == [-1] * 16, (len2, e_len2)
    assert len2[16:] == [kw["topk"], 0, 0, kw["topk"]], len2  # -5 -> 0: written, never skipped
    assert torch.isnan(out[:16]).all() and torch.isnan(lse[:16]).all()
    assert not torch.isnan(out[16:]).any() and not torch.isnan(lse[16:]).any()
    r_out, r_lse = ref.reference_sparse_decode(**inputs)
    acc = ref.check_accuracy(out[16:], lse[16:], r_out[16:], r_lse[16:])
    assert acc["ok"], acc
    monkeypatch.undo()
    _run_and_check(inputs, "mma", cfg)


@pytest.mark.parametrize("lengths", [True, False], ids=["lengths", "no-lengths"])
def test_pack_plan_orders_tokens_longest_first(monkeypatch, lengths):
    """The plan's order for the per-token launch (`_token_order`): every token once, by its
    tiles in that launch's tokens per tile (main length, then extra length), most first;
    lengths 0 and negative count no tile. Steps of 8 tokens: each pass walks three."""
    kw = _PACK_GPU if ON_GPU else dict(_PACK_SMALL, extra_topk=48, extra_page_size=16)
    T, H, G = 20, 8, 8
    inputs = _share_inputs(T, H, _seed("pack-order"), with_sink=True, **kw)
    cfg = _packed_config(T, H, kw["topk"], kw["extra_topk"], G)._replace(num_splits=1)
    if lengths:
        gen = torch.Generator().manual_seed(_seed("pack-order-lengths"))
        for len_key, topk in (("topk_length", kw["topk"]), ("extra_topk_length", kw["extra_topk"])):
            lens = torch.randint(0, topk + 1, (T,), generator=gen, dtype=torch.int32)
            lens[[3, 17]] = 0
            lens[18] = -5
            inputs[len_key] = lens.to(DEVICE)
    else:
        inputs["topk_length"] = inputs["extra_topk_length"] = None
    monkeypatch.setattr(fl, "PACK_ORDER_CHUNK", 8)
    orders = []
    monkeypatch.setattr(
        fl, "_launch_packed", lambda q, main, extra, common, flags, plan: orders.append(plan)
    )
    decode(**inputs, variant="mma", _config=cfg)
    (plan,) = orders
    order = plan["order"][:T].tolist()
    assert sorted(order) == list(range(T)), order

    def tiles(len_key, topk):
        lens = inputs[len_key]
        lens = torch.full((T,), topk) if lens is None else lens.cpu().clamp(0, topk)
        return (lens + cfg.block_n - 1) // cfg.block_n

    work = (
        tiles("topk_length", kw["topk"]) + tiles("extra_topk_length", kw["extra_topk"])
    ).tolist()
    ranked = [work[t] for t in order]
    assert ranked == sorted(work, reverse=True), (order, work)


@pytest.mark.parametrize("chunk", [16, 512])
def test_pack_plan_probe_reads_the_whole_row(monkeypatch, chunk):
    """The plan's probe reads token t0's row in chunks (`PACK_PROBE_CHUNK`: the first beside
    the lengths, the rest in a loop): with t0's selections rotated so that the ones token
    t0 + 7 shares lie past the first 16 entries, chunks of 16 find them as one chunk does
    (both groups packed); with the loop skipped they would not be."""
    kw = _PACK_GPU if ON_GPU else dict(_PACK_SMALL, extra_topk=48, extra_page_size=16)
    T, H, G = 16, 8, 8
    inputs = _share_inputs(T, H, _seed("pack-probe"), **kw)
    rows = inputs["extra_indices"].view(T, -1)
    for t0 in (0, 8):
        rows[t0] = rows[t0].roll(kw["extra_topk"] // 2)
    monkeypatch.setattr(fl, "PACK_PROBE_CHUNK", chunk)
    seen = _spy_plans(monkeypatch)
    _run_and_check(inputs, "mma", _packed_config(T, H, kw["topk"], kw["extra_topk"], G))
    assert seen == [[1, 1]], seen


def _with_workspace_filled(monkeypatch, fill, call):
    """`call()` with every tensor the kernel allocates uninitialised (`torch.empty`: its plan's
    workspace, the split partials, the outputs) pre-filled with `fill` (None: as allocated; an
    int, or "random" int32 words; floating tensors get NaN either way)."""
    real = torch.empty

    def filled(*args, **kwargs):
        t = real(*args, **kwargs)
        if fill is not None and t.numel():
            if t.dtype.is_floating_point:
                t.fill_(float("nan"))
            elif fill == "random":
                gen = torch.Generator().manual_seed(_seed("workspace-fill") + t.numel())
                words = torch.randint(-(2**31), 2**31 - 1, t.shape, generator=gen)
                t.copy_(words.to(t.dtype))
            else:
                t.fill_(fill)
        return t

    with monkeypatch.context() as patch:
        patch.setattr(torch, "empty", filled)
        return call()


_WORKSPACE_FILLS = [-1, 0, 2**31 - 1, "random"]


@pytest.mark.parametrize("lengths", ["causal-own", "causal-share", "partial"])
def test_pack_plan_never_reads_its_workspace_before_writing_it(monkeypatch, lengths):
    """A CUDA graph replays into the same workspace and the caching allocator hands out memory
    with any old contents, so nothing the call computes may depend on them: with the
    workspace pre-filled four ways, the plan's decisions (packed groups, the packed groups'
    union lengths, the per-token lengths, the longest-first order) and the outputs are
    bit-identical to a plain call's. (Checked to fail with the plan's `len2` store removed.)"""
    kw = _PACK_GPU if ON_GPU else dict(_PACK_SMALL, extra_topk=48, extra_page_size=16)
    T, H, G = 24, 8, 8
    share = 8 if lengths == "causal-share" else 0
    extra = dict(topk_length="partial", invalid_fraction=0.1) if lengths == "partial" else {}
    inputs = ref.make_inputs(T, H, device=DEVICE, seed=_seed(f"ws-fill-{lengths}"),
                             with_sink=True, **kw, **extra)  # fmt: skip
    if lengths != "partial":
        if share:
            bench_mod._share_indices(inputs, share, 1)
        else:
            bench_mod._own_indices(inputs, 1)
        bench_mod._causal_lengths(inputs, share)
    cfg = _packed_config(T, H, kw["topk"], kw["extra_topk"], G)

    def one_call():
        seen = {}
        orig = fl._launch_packed

        def spy(q, main, extra, common, flags, plan):
            flag = plan["flag"].clone()
            seen.update(flag=flag, order=plan["order"][:T].clone(),
                        union_len=plan["union_len"][flag != 0].clone(),
                        len2=main["LEN_ptr"].clone(), e_len2=extra["ELEN_ptr"].clone())  # fmt: skip
            return orig(q, main, extra, common, flags, plan)

        with monkeypatch.context() as patch:
            patch.setattr(fl, "_launch_packed", spy)
            out, lse = decode(**inputs, variant="mma", _config=cfg)
        return seen, out, lse

    base, out, lse = one_call()
    assert set(base) == {"flag", "order", "union_len", "len2", "e_len2"}
    for fill in _WORKSPACE_FILLS:
        seen, o, lse2 = _with_workspace_filled(monkeypatch, fill, one_call)
        for key, value in base.items():
            assert torch.equal(seen[key], value), (fill, key, seen[key], value)
        assert torch.equal(o.view(torch.int16), out.view(torch.int16)), fill
        assert torch.equal(lse2.view(torch.int32), lse.view(torch.int32)), fill


def test_split_plan_never_reads_its_workspace_before_writing_it(monkeypatch):
    """The length-aware split plan (its pieces per request) and the split partials: the
    output is bit-identical whatever the workspace held (as above), on a call whose requests
    run from 0 tokens to the whole row. (Checked to fail with the plan's store of each
    request's piece count removed.)"""
    inputs = ref.make_inputs(
        B=6, H=64, topk=96, page_size=32, extra_topk=48, extra_page_size=16, with_sink=True,
        topk_length="partial", invalid_fraction=0.1, device=DEVICE, seed=_seed("ws-fill-split"),
    )  # fmt: skip
    inputs["topk_length"] = torch.tensor([96, 0, 3, 33, 40, 1], dtype=torch.int32, device=DEVICE)
    inputs["extra_topk_length"] = torch.tensor(
        [48, 0, 48, 2, 0, 1], dtype=torch.int32, device=DEVICE
    )
    cfg = MMAConfig(64, BN, 3, W, 1, False, 64)._replace(plan_splits=6, plan_round=7)
    out, lse = decode(**inputs, variant="mma", _config=cfg)
    for fill in _WORKSPACE_FILLS:
        o, lse2 = _with_workspace_filled(
            monkeypatch, fill, lambda: decode(**inputs, variant="mma", _config=cfg)
        )
        assert torch.equal(o.view(torch.int16), out.view(torch.int16)), fill
        assert torch.equal(lse2.view(torch.int32), lse.view(torch.int32)), fill


@pytest.mark.parametrize("split", [False, True], ids=["one-program", "split-caches"])
def test_pack_plan_split_caches_same_plan(monkeypatch, split):
    """The plan with the two caches' unions in two programs (`PACK_PLAN_SPLIT_CACHES`) decides
    as one program does, from both programs' results: group 0 is packed though token 3 selects
    nothing in the main cache (its valid count summed over the caches passes), group 1's
    tokens own their rows (union too large), group 2 holds a token with no valid selection in
    either cache (not packed). Unions, lengths and outputs agree with the one-program plan."""
    kw = _PACK_GPU if ON_GPU else dict(_PACK_SMALL, extra_topk=48, extra_page_size=16)
    T, H, G = 24, 8, 8
    inputs = _share_inputs(T, H, _seed("pack-split"), with_sink=True, **kw)
    for key in ("indices", "extra_indices"):
        rows = inputs[key].view(T, -1)
        cache = inputs["k_cache" if key == "indices" else "extra_k_cache"]
        n = cache.shape[0] * cache.shape[1]
        for t in range(9, 16):
            rows[t] = (rows[8] + (t - 8) * (n // 9)) % n
    _lengths_with(inputs, T, zero=[20], main_zero=[3])
    cfg = _packed_config(T, H, kw["topk"], kw["extra_topk"], G)
    results = {}
    for mode in (False, split):
        monkeypatch.setattr(fl, "PACK_PLAN_SPLIT_CACHES", mode)
        seen = []
        orig = fl._launch_packed

        def spy(q, main, extra, common, flags, plan, seen=seen, orig=orig):
            seen.append({
                "flag": plan["flag"].tolist(), "len": main["LEN_ptr"].tolist(),
                "elen": extra["ELEN_ptr"].tolist(), "union_len": plan["union_len"].tolist(),
                "union": plan["union"].clone(),
            })  # fmt: skip
            return orig(q, main, extra, common, flags, plan)

        monkeypatch.setattr(fl, "_launch_packed", spy)
        results[mode] = (_run_and_check(inputs, "mma", cfg), seen[0])
        monkeypatch.setattr(fl, "_launch_packed", orig)
    (out0, lse0), one = results[False]
    (out1, lse1), got = results[split]
    assert one["flag"] == [1, 0, 0], one["flag"]
    for key in ("flag", "len", "elen"):
        assert got[key] == one[key], key
    cap, e_cap = G * kw["topk"], G * kw["extra_topk"]
    for grp in range(T // G):
        assert got["union_len"][grp] == one["union_len"][grp] or one["flag"][grp] == 0, grp
        n, e_n = one["union_len"][grp]
        if one["flag"][grp]:  # the unions the packed launch reads: the same entries
            for off, m, c in ((0, n, cap), (2 * cap, e_n, e_cap)):
                for o in (off, off + c):
                    assert got["union"][grp, o : o + m].tolist() == (
                        one["union"][grp, o : o + m].tolist()
                    ), (grp, o)
    assert torch.equal(out0, out1) and torch.equal(lse0, lse1)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_packed_tokens_in_cuda_graph():
    """Captured once with coinciding selections, replayed with new ones and then with rows the
    tokens own (the plan, on the device, packs the first and not the second): every output
    written and accurate each time."""
    T, H = 64, 8
    sets = [
        _share_inputs(T, H, _seed("pack-graph-0"), 32, with_sink=True, **_PACK_GPU),
        _share_inputs(T, H, _seed("pack-graph-1"), 64, with_sink=True, **_PACK_GPU),
        ref.make_inputs(T, H, device=DEVICE, seed=_seed("pack-graph-2"), with_sink=True,
                        **_PACK_GPU),
    ]  # fmt: skip
    cfg = _packed_config(T, H, 128, 512, 8)
    static = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in sets[0].items()}
    out = torch.empty(T, 1, H, 512, dtype=torch.bfloat16, device=DEVICE)
    lse = torch.empty(T, H, 1, dtype=torch.float32, device=DEVICE)
    decode(**static, variant="mma", out=out, lse=lse, _config=cfg)  # compile outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode(**static, variant="mma", out=out, lse=lse, _config=cfg)
    for inputs in sets[1:] + sets[:1]:
        _replay_with(graph, static, out, lse, inputs)
        _check_written_and_accurate(out, lse, inputs)


def test_pack_rule_only_for_prefill_sized_calls_of_few_heads():
    """Packing is planned for prefill-sized calls of up to 32 heads (8 tokens x 8 heads, 4 x
    16 on sm_90's 64-row blocks; sm_120's 32-row blocks: 4 x 8), never for decode-sized calls,
    64 heads or the whole-call exact PV."""
    assert fl.mma_config((9, 0), 132, 1024, 8, 128, 512).pack_tokens == 8
    assert fl.mma_config((9, 0), 132, 1024, 16, 2048, 0).pack_tokens == 4
    assert fl.mma_config((12, 0), 188, 2048, 8, 128, 512).pack_tokens == 4  # 4 x 376 slots
    assert fl.mma_config((9, 0), 132, 1024, 64, 128, 512).pack_tokens == 0
    assert fl.mma_config((9, 0), 132, 64, 8, 128, 512).pack_tokens == 0
    assert fl.mma_config((9, 0), 132, 1024, 8, 64, 64).pack_tokens == 0  # exact PV


def test_splits_agree_with_single_split():
    inputs = ref.make_inputs(
        B=2,
        H=64,
        topk=70,
        page_size=64,
        extra_topk=33,
        with_sink=True,
        device=DEVICE,
        seed=_seed("splits-agree"),
    )
    a, la = _run_and_check(inputs, "mma", C(1))
    b, lb = _run_and_check(inputs, "mma", C(5))
    assert (a.float() - b.float()).abs().max() <= 2**-6 * max(1.0, a.float().abs().max())
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5)


def test_default_outputs_allocated_and_shapes():
    inputs = ref.make_inputs(B=1, H=64, topk=16, page_size=64, device=DEVICE, seed=1)
    out, lse = decode(**inputs, variant="mma")
    assert out.shape == (1, 1, 64, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (1, 64, 1) and lse.dtype == torch.float32


# ----------------------------------------------------------------------------- validation


def _valid_inputs():
    return ref.make_inputs(
        B=2, H=64, topk=8, page_size=64, extra_topk=8, num_pages=4, device=DEVICE, seed=7
    )


def _bad(**changes):
    def apply(inp):
        for k, v in changes.items():
            inp[k] = v(inp) if callable(v) else v
        return inp

    return apply


BAD_CASES = [
    ("q", _bad(q=lambda i: i["q"].float())),
    ("q", _bad(q=lambda i: i["q"][..., :448])),
    ("q", _bad(q=lambda i: i["q"].expand(2, 2, 64, 512))),
    # every tensor on the meta device (no data): the interpreter failed copying it
    ("q", lambda i: {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in i.items()}),
    ("head_dim_v", _bad(head_dim_v=576)),
    ("k_cache", _bad(k_cache=lambda i: i["k_cache"].float())),
    ("k_cache", _bad(k_cache=lambda i: i["k_cache"][..., :576])),
    (
        "k_cache",
        _bad(
            k_cache=lambda i: i["k_cache"].as_strided((2, 64, 1, 584), (64 * 584 - 2, 584, 584, 1))
        ),
    ),
    (
        "k_cache",
        _bad(k_cache=lambda i: i["k_cache"].as_strided((2, 32, 1, 584), (64 * 584, 1168, 584, 1))),
    ),
    ("indices", _bad(indices=lambda i: i["indices"].long())),
    ("indices", _bad(indices=lambda i: i["indices"][:1])),
    ("indices", _bad(indices=lambda i: i["indices"][:, None, None, :])),
    ("topk_length", _bad(topk_length=lambda i: i["topk_length"].long())),
    ("topk_length", _bad(topk_length=lambda i: i["topk_length"][:1])),
    ("attn_sink", _bad(attn_sink=lambda i: torch.zeros(63, device=DEVICE))),
    ("attn_sink", _bad(attn_sink=lambda i: torch.zeros(64, dtype=torch.bfloat16, device=DEVICE))),
    ("extra_indices", _bad(extra_indices=None)),
    ("extra_k_cache", _bad(extra_k_cache=None, extra_topk_length=None)),
    ("extra_indices", _bad(extra_indices=lambda i: i["extra_indices"].long())),
    ("softmax_scale", _bad(softmax_scale=lambda i: torch.tensor(0.1))),
]


@pytest.mark.parametrize(
    "argname,mutate", BAD_CASES, ids=[f"{n}-{k}" for k, (n, _) in enumerate(BAD_CASES)]
)
def test_invalid_input_raises_value_error_naming_the_argument(argname, mutate):
    inputs = mutate(_valid_inputs())
    with pytest.raises(ValueError, match=argname):
        decode(**inputs, variant="mma")


def test_odd_cache_pages_say_whether_the_stride_or_the_start_is_odd():
    """The rope's bf16 needs every page on an even byte: the message names which is odd (it
    named the even stride for an odd start)."""
    inputs = _valid_inputs()
    cache = inputs["k_cache"]  # [4, 64, 1, 584], contiguous
    shape, stride = (2, 64, 1, 584), cache.stride()
    cases = [
        (cache.as_strided(shape, stride, storage_offset=1), "the view starts at an odd address"),
        (cache.as_strided(shape, (stride[0] + 1, *stride[1:])), "page stride stride(0) 37377"),
        (
            cache.as_strided(shape, (stride[0] + 1, *stride[1:]), storage_offset=1),
            "37377 is odd and the view starts at an odd address (storage_offset 1)",
        ),
    ]
    for view, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            decode(**dict(inputs, k_cache=view), variant="mma")
    with pytest.raises(ValueError, match=r"even bytes \(bf16 rope\): the view starts"):
        decode(**dict(inputs, k_cache=cases[0][0]), variant="simt")


def test_invalid_variant_and_outputs():
    inputs = _valid_inputs()
    with pytest.raises(ValueError, match="variant"):
        decode(**inputs, variant="tensorcore")
    with pytest.raises(ValueError, match="out"):
        decode(**inputs, variant="mma", out=torch.empty(2, 1, 64, 512, device=DEVICE))
    with pytest.raises(ValueError, match="lse"):
        decode(**inputs, variant="mma", lse=torch.empty(2, 64, device=DEVICE))


# ----------------------------------------------------------------------------- packaging


@pytest.mark.parametrize(
    "env,expected",
    [
        ({"SGLANG_SM120_MMA_FLASHMLA": "1"}, "mma"),
        ({"SGLANG_SM120_MMA_FLASHMLA": "0"}, "simt"),
        ({"SGLANG_SM120_MMA_FLASHMLA": "true"}, "simt"),
    ],
)
def test_variant_env_read_once_at_import(env, expected):
    mod = _load(
        f"_kd_env_probe_{expected}_{env['SGLANG_SM120_MMA_FLASHMLA']}",
        "flash_mla_sm120_triton.py",
        env,
    )
    assert mod._DEFAULT_VARIANT == expected
    os.environ["SGLANG_SM120_MMA_FLASHMLA"] = "1" if expected == "simt" else "0"
    try:
        assert mod._DEFAULT_VARIANT == expected  # not re-read per call
    finally:
        os.environ.pop("SGLANG_SM120_MMA_FLASHMLA", None)


def test_wrapper_imports_as_package_module_and_by_path():
    try:
        from kerneldev.kernels import flash_mla_sm120 as pkg_wrapper
    except ImportError:  # e.g. a bare copy of the repo on a GPU host, kerneldev not installed
        pytest.skip("kerneldev is not installed")

    assert callable(pkg_wrapper.flash_mla_sparse_decode_triton)
    by_path = _load("flash_mla_sm120", "flash_mla_sm120.py")
    assert callable(by_path.flash_mla_sparse_decode_triton)
    sys.modules.pop("flash_mla_sm120", None)


@pytest.mark.parametrize("case", ["batch0", "zero_pages", "both_zero_pages", "plain"])
def test_wrapper_torch_path_empty_batch_and_empty_cache(case):
    """The wrapper's torch path (SGLANG_SM120_FLASHMLA_BACKEND=torch): an empty batch failed
    reshaping its indices (-1 is ambiguous at B 0) and a cache of no pages failed gathering
    its row 0. Its out must match the reference; its lse excludes the sink (SGLang's torch
    path), so it is compared with the reference's without one."""
    wrapper = _load("_kd_test_torch_path_wrapper", "flash_mla_sm120.py")
    inputs = ref.make_inputs(
        B=3, H=4, topk=10, page_size=16, extra_topk=5, extra_page_size=4, with_sink=True,
        topk_length="partial", invalid_fraction=0.2, device=DEVICE, seed=_seed("torch-" + case),
    )  # fmt: skip
    if case == "batch0":
        for key in ("q", "indices", "topk_length", "extra_indices", "extra_topk_length"):
            inputs[key] = inputs[key][:0]
    if case in ("zero_pages", "both_zero_pages"):
        inputs["k_cache"] = inputs["k_cache"][:0]
    if case == "both_zero_pages":
        inputs["extra_k_cache"] = inputs["extra_k_cache"][:0]
    keys = ("q", "k_cache", "indices", "topk_length", "attn_sink", "head_dim_v", "softmax_scale",
            "extra_k_cache", "extra_indices", "extra_topk_length")  # fmt: skip
    out, lse = wrapper._sm120_sparse_decode_fwd(*(inputs[k] for k in keys))
    B = inputs["q"].shape[0]
    assert out.shape == (B, 1, 4, 512) and lse.shape == (B, 4, 1)
    r_out, _ = ref.reference_sparse_decode(**inputs)
    _, r_lse = ref.reference_sparse_decode(**dict(inputs, attn_sink=None))
    acc = ref.check_accuracy(out, lse, r_out, r_lse)
    assert acc["ok"], acc
    sys.modules.pop("flash_mla_sm120_triton", None)


def test_packer_round_trip_and_padded_stride():
    kv = torch.randn(130, 512)
    for page, stride in [(1, None), (64, None), (48, cache_mod.padded_page_stride(48))]:
        kc = cache_mod.pack_paged_cache(kv, page, stride)
        assert kc.shape[1:] == (page, 1, 584)
        assert kc.stride(0) == (stride or page * 584)
        back = cache_mod.unpack_paged_cache(kc)[:130]
        assert (back[:, 448:] == kv[:, 448:].bfloat16().float()).all()
        rel = (back[:, :448] - kv[:, :448]).abs() / kv[:, :448].abs().amax(1, keepdim=True)
        assert float(rel.max()) < 2**-4  # e4m3: 3 mantissa bits, per-64 scale
    assert cache_mod.padded_page_stride(64) == 37440


def test_check_accuracy_nan_in_the_reference_is_not_a_free_pass():
    """A NaN in the reference (NaN input) must be matched by a NaN, and is left out of the
    bounds and the cosine: it used to pass any value there and skip the cosine of the whole
    tensor (a 1% error everywhere else then passed)."""
    gen = torch.Generator().manual_seed(3)
    y = torch.randn(2, 1, 4, 512, generator=gen, dtype=torch.float64)
    lse = torch.randn(2, 4, 1, generator=gen, dtype=torch.float64)
    x = y.to(torch.bfloat16)
    assert ref.check_accuracy(x, lse.float(), y, lse)["ok"]
    y_nan = y.clone()
    y_nan[0, 0, 1] = math.nan
    acc = ref.check_accuracy(x, lse.float(), y_nan, lse)  # finite where the reference is NaN
    assert not acc["ok"] and acc["out_mismatched"] == 512
    x_nan = x.clone()
    x_nan[0, 0, 1] = math.nan
    assert ref.check_accuracy(x_nan, lse.float(), y_nan, lse)["ok"]  # NaN matched: the rest ok
    x_nan[1] *= 1.01  # within the elementwise bound, not within the cosine's
    acc = ref.check_accuracy(x_nan, lse.float(), y_nan, lse)
    assert acc["out_mismatched"] == 0 and not acc["out_cos_ok"] and not acc["ok"]
    lse_nan = lse.clone()
    lse_nan[0, 1] = math.nan
    assert not ref.check_accuracy(x_nan, lse.float(), y_nan, lse_nan)["lse_ok"]
    assert ref.check_accuracy(x, lse_nan.float(), y, lse_nan)["lse_ok"]  # NaN matched
    assert not ref.check_accuracy(x, lse_nan.float(), y, lse)["lse_ok"]  # NaN not in the ref


def test_check_accuracy_of_an_all_nan_output_reports_no_perfect_figures():
    """An all-NaN out and lse failed, yet reported out_cos_diff_unrounded and lse_max_abs_err
    as 0.0; every error figure is now None (valid JSON, as the harness writes it)."""
    gen = torch.Generator().manual_seed(5)
    y = torch.randn(2, 1, 4, 512, generator=gen, dtype=torch.float64)
    lse = torch.randn(2, 4, 1, generator=gen, dtype=torch.float64)
    x_nan = torch.full(y.shape, math.nan, dtype=torch.bfloat16)
    acc = ref.check_accuracy(x_nan, torch.full(lse.shape, math.nan), y, lse)
    assert not acc["ok"] and not acc["lse_ok"] and not acc["out_finite"]
    figures = [k for k in acc if k.endswith("_err") or "cos_diff" in k]
    assert len(figures) == 6 and all(acc[k] is None for k in figures), acc
    json.dumps(acc, allow_nan=False)
    # One NaN lse entry among finite ones: the max error is unknown, not the others' max.
    lse_one = lse.float().clone()
    lse_one[1, 2] = math.nan
    acc = ref.check_accuracy(y.to(torch.bfloat16), lse_one, y, lse)
    assert acc["lse_max_abs_err"] is None and acc["lse_max_rel_err"] is None
    assert acc["out_cos_diff_unrounded"] is not None and acc["out_max_abs_err"] is not None
    # A passing check keeps its numbers.
    acc = ref.check_accuracy(y.to(torch.bfloat16), lse.float(), y, lse)
    assert acc["ok"] and all(isinstance(acc[k], float) for k in figures)


def test_reference_against_naive_loop():
    inputs = ref.make_inputs(
        B=2,
        H=3,
        topk=10,
        page_size=8,
        extra_topk=6,
        extra_page_size=4,
        with_sink=True,
        topk_length="partial",
        invalid_fraction=0.3,
        seed=5,
    )
    out, lse = ref.reference_sparse_decode(**inputs)
    kv1 = cache_mod.unpack_paged_cache(inputs["k_cache"]).double()
    kv2 = cache_mod.unpack_paged_cache(inputs["extra_k_cache"]).double()
    q = inputs["q"].double()
    for b in range(2):
        for h in range(3):
            ks = []
            for kv, idx, n in (
                (kv1, inputs["indices"], inputs["topk_length"]),
                (kv2, inputs["extra_indices"], inputs["extra_topk_length"]),
            ):
                ks += [kv[int(i)] for i in idx[b, : int(n[b])] if 0 <= int(i) < kv.shape[0]]
            s = [float(q[b, 0, h] @ k) * inputs["softmax_scale"] for k in ks]
            s.append(float(inputs["attn_sink"][h]))
            m = max(s)
            l_ = m + math.log(sum(math.exp(x - m) for x in s))
            o = sum(
                (math.exp(x - l_) * k for x, k in zip(s, ks, strict=False)),
                torch.zeros(512).double(),
            )
            assert abs(l_ - float(lse[b, h, 0])) < 1e-9
            assert float((o - out[b, 0, h]).abs().max()) < 1e-9


@pytest.mark.skipif(
    kconf.KERNELS_RUNNABLE or os.environ.get(_CHILD_ENV) == "1",
    reason="the kernel cases run in this process",
)
def test_kernel_suite_in_own_process():
    """Fallback when triton was imported before TRITON_INTERPRET could be set."""
    env = dict(os.environ, TRITON_INTERPRET="1", **{_CHILD_ENV: "1"})
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(Path(__file__).parent),
        ],
        env=env,
        cwd=str(KERNELS.parent),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
