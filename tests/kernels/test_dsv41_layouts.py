"""DSv4.1 cache layouts (528-byte FP8 token, 288-byte FP4 extra cache) in the bundled kernels.

SGLang 0.5.23's DSv4 backend hands the kernel its caches as `[pages, P, 1, token_bytes]` views
and says the format is that last dimension: 584 (V4), 528 (V4.1 FP8) or 288 (V4.1 FP4, extra
cache only). These tests pin the byte layouts with hand-built pages (independent of the packer),
run both kernels against the float64 reference on V4.1 caches, and check that any other token
size is a ValueError naming it. CPU: Triton's interpreter; GPU: compiled, plus larger shapes.
"""

from __future__ import annotations

import pytest

from . import conftest as kconf
from .test_flash_mla_sm120_triton import (
    _FEW,
    _FEW120,
    _FEW_HM,
    _FEW_PREFILL,
    _FEW_PREFILL_CFG,
    _WIDE,
    _WS,
    _WS_DUAL,
    _WS_DUAL_RULE,
    _WS_SMALL_DUAL,
    _WS_SMALL_DUAL_32,
    _WSX,
    DEVICE,
    ON_GPU,
    G,
    _run_and_check,
    _seed,
    cache_mod,
    fl,
    ref,
)

torch = pytest.importorskip("torch")

if not kconf.KERNELS_RUNNABLE:  # see test_flash_mla_sm120_triton.test_kernel_suite_in_own_process
    pytestmark = pytest.mark.skipif(True, reason="triton imported without TRITON_INTERPRET")

decode = fl.flash_mla_sparse_decode_triton


def _view(page_bytes: torch.Tensor, page_size: int, token_bytes: int) -> torch.Tensor:
    """[pages, stride] bytes -> the kernel's [pages, P, 1, token_bytes] view, as SGLang does."""
    pages, stride = page_bytes.shape
    return page_bytes.view(-1).as_strided(
        (pages, page_size, 1, token_bytes), (stride, token_bytes, token_bytes, 1)
    )


# ----------------------------------------------------------------------------- byte layouts


def test_v41_fp8_bytes_where_sglang_puts_them():
    """Page of P = 2 tokens: [2 x 512 e4m3 values][2 x 16 UE8M0 bytes]; value d of slot t is
    byte t*512 + d times 2^(byte (P*512 + t*16 + d // 32) - 127)."""
    P = 2
    page = torch.zeros(1, P * 528, dtype=torch.uint8)
    e4m3 = torch.tensor([1.5, -3.0], dtype=torch.float8_e4m3fn).view(torch.uint8)
    page[0, 512 + 33] = e4m3[0]  # slot 1, value 33 (scale group 1)
    page[0, 512 + 511] = e4m3[1]  # slot 1, value 511 (scale group 15)
    page[0, P * 512 + 16 + 1] = 127 + 3  # slot 1, group 1: 2^3
    page[0, P * 512 + 16 + 15] = 127 - 2  # slot 1, group 15: 2^-2
    kv = cache_mod.unpack_paged_cache(_view(page, P, 528))
    expect = torch.zeros(P, 512)
    expect[1, 33] = 1.5 * 8
    expect[1, 511] = -3.0 / 4
    assert torch.equal(kv, expect)


def test_v41_fp4_bytes_where_sglang_puts_them():
    """Page of P = 2 tokens: [2 x 256 bytes of e2m1 pairs][2 x 32 e4m3 scales]; value 2i of a
    token is the low nibble of its byte i, 2i + 1 the high one, one scale per 16 values."""
    P = 2
    page = torch.zeros(1, P * 288, dtype=torch.uint8)
    page[0, 256 + 8] = 0x2B  # slot 1, byte 8 = values 16 (code 0xB = -1.5) and 17 (0x2 = 1.0)
    page[0, 256 + 255] = 0x70  # values 510 (code 0 = 0) and 511 (code 7 = 6.0)
    scales = torch.tensor([0.25, 3.0], dtype=torch.float8_e4m3fn).view(torch.uint8)
    page[0, P * 256 + 32 + 1] = scales[0]  # slot 1, group 1 (values 16..31)
    page[0, P * 256 + 32 + 31] = scales[1]  # slot 1, group 31 (values 496..511)
    kv = cache_mod.unpack_paged_cache(_view(page, P, 288))
    expect = torch.zeros(P, 512)
    expect[1, 16], expect[1, 17], expect[1, 511] = -1.5 * 0.25, 1.0 * 0.25, 6.0 * 3.0
    assert torch.equal(kv, expect)


@pytest.mark.parametrize("layout,tol", [("v41", 2**-4), ("v41_fp4", 0.5)])
def test_v41_packer_round_trip_and_padding(layout, tol):
    """The packer writes SGLang's pages: stride padded to 512 (FP8) / 256 (FP4) bytes."""
    kv = torch.randn(100, 512)
    fmt = cache_mod.FORMATS[layout]
    stride = cache_mod.padded_page_stride(48, layout=layout)
    assert stride % fmt.page_align == 0 and stride >= 48 * fmt.token_bytes
    kc = cache_mod.pack_paged_cache(kv, 48, stride, layout=layout)
    assert kc.shape[1:] == (48, 1, fmt.token_bytes) and kc.stride(0) == stride
    back = cache_mod.unpack_paged_cache(kc)[:100]
    group = kv.view(100, -1, fmt.group).abs().amax(-1, keepdim=True)
    err = ((back - kv).view(100, -1, fmt.group).abs() / group).amax()
    assert float(err) < tol  # e4m3 (3 mantissa bits) per 32; e2m1 (1 bit) per 16
    assert cache_mod.padded_page_stride(64, layout="v41") == 64 * 528  # 33792 = 66 x 512
    assert cache_mod.padded_page_stride(64, layout="v41_fp4") == 64 * 288


def test_nibbles_decode_all_sixteen_codes():
    """Every e2m1 code through the kernel's decoder equals its table value (one token whose
    bytes hold codes 0..15 twice, scale 1.0), via a one-token decode with one head."""
    P = 1
    page = torch.zeros(1, 288, dtype=torch.uint8)
    codes = torch.arange(512) % 16
    page[0, :256] = (codes[0::2] | (codes[1::2] << 4)).to(torch.uint8)
    page[0, 256:] = torch.tensor([1.0], dtype=torch.float8_e4m3fn).view(torch.uint8)
    extra = _view(page, P, 288)
    main = cache_mod.pack_paged_cache(torch.zeros(1, 512), 1, layout="v41")
    want = cache_mod.unpack_paged_cache(extra)[0]
    assert want[:16].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    H = 16
    q = torch.zeros(1, 1, H, 512, dtype=torch.bfloat16, device=DEVICE)
    idx = torch.tensor([[-1]], dtype=torch.int32, device=DEVICE)
    e_idx = torch.tensor([[0]], dtype=torch.int32, device=DEVICE)
    for variant in ("simt", "mma"):
        out, _ = decode(
            q, main.to(DEVICE), idx, None, None, 512, None, extra.to(DEVICE), e_idx, None,
            variant=variant,
        )  # fmt: skip
        # one valid token: out is its V row exactly (weight 1)
        assert torch.equal(out[0, 0, 0].float().cpu(), want), variant


# ----------------------------------------------------------------------------- kernels


V41_CASES = [
    # (id, make_inputs kwargs, MMA configs: None = the table's choice)
    ("v41_single", dict(B=2, H=16, topk=40, page_size=16, kv_layout="v41"), [None]),
    (
        "v41_dual_fp8",
        dict(
            B=2,
            H=16,
            topk=24,
            page_size=32,
            extra_topk=40,
            extra_page_size=8,
            kv_layout="v41",
            with_sink=True,
            page_stride="pad576",
        ),
        [None, G(2)],
    ),  # fmt: skip
    (
        "v41_dual_fp4_partial_invalid",
        dict(
            B=3,
            H=16,
            topk=40,
            page_size=16,
            extra_topk=36,
            extra_page_size=4,
            kv_layout="v41",
            extra_kv_layout="v41_fp4",
            with_sink=True,
            page_stride="pad576",
            topk_length="partial",
            invalid_fraction=0.15,
            kv_scale_spread=3,
        ),
        [None, G(3)],
    ),  # fmt: skip
    (
        "v41_fp4_sink_inf_fp8_dtype",
        dict(
            B=2,
            H=20,
            topk=16,
            page_size=2,
            extra_topk=48,
            extra_page_size=2,
            kv_layout="v41",
            extra_kv_layout="v41_fp4",
            with_sink="inf",
            indices_3d=True,
        ),
        [None],
    ),  # fmt: skip
]
if ON_GPU:  # production-sized: SWA 128 over 256-token pages, extra 512 over 64-token pages
    V41_CASES += [
        (
            "gpu_v41_B64_dual_fp4",
            dict(
                B=64,
                H=64,
                topk=128,
                page_size=256,
                extra_topk=512,
                extra_page_size=64,
                kv_layout="v41",
                extra_kv_layout="v41_fp4",
                with_sink=True,
                page_stride="pad576",
                topk_length="partial",
                invalid_fraction=0.1,
            ),
            [None, fl.mma_config((12, 0), 132, 64, 64, 128, 512)],
        ),  # fmt: skip
        (
            "gpu_v41_B32_topk2048",
            dict(B=32, H=64, topk=2048, page_size=64, kv_layout="v41", with_sink=True),
            [None, fl.mma_config((12, 0), 132, 32, 64, 2048, 0)],
        ),  # fmt: skip
        (
            "gpu_v41_B16_H128_dual_fp8",
            dict(
                B=16,
                H=128,
                topk=128,
                page_size=256,
                extra_topk=512,
                extra_page_size=64,
                kv_layout="v41",
                page_stride="pad576",
            ),
            [None],
        ),  # fmt: skip
    ]


@pytest.mark.parametrize("variant", ["simt", "mma"])
@pytest.mark.parametrize("case_id,kwargs,configs", V41_CASES, ids=[c[0] for c in V41_CASES])
def test_v41_matches_reference(case_id, kwargs, configs, variant):
    if variant == "simt" and kwargs["B"] * kwargs["H"] > 2048:
        pytest.skip("SIMT on the largest shapes: covered by the smaller cases")
    inputs = ref.make_inputs(**kwargs, device=DEVICE, seed=_seed(case_id))
    if case_id.endswith("fp8_dtype"):
        inputs["k_cache"] = inputs["k_cache"].view(torch.float8_e4m3fn)
    for cfg in configs if variant == "mma" else [None]:
        _run_and_check(inputs, variant, cfg)


def test_v41_all_invalid_and_zero_lengths():
    inputs = ref.make_inputs(
        B=2, H=16, topk=20, page_size=8, extra_topk=20, extra_page_size=4, kv_layout="v41",
        extra_kv_layout="v41_fp4", with_sink=True, invalid_fraction=1.0, device=DEVICE, seed=3,
    )  # fmt: skip
    for variant in ("simt", "mma"):
        _run_and_check(inputs, variant, expect_all_invalid=True)


# ----------------------------------------------------------------------------- Gluon loops
# V4.1 caches (FP8 alone, or an FP8 main cache with an FP8 or FP4 extra cache) in the Gluon
# loops, with the V4 cases' shapes and configs (test_flash_mla_sm120_triton): the sm_90 row's
# wgmma tile (forced: its rule takes it for one cache), its exact launch beside the Triton
# loop, the sm_120 row's 32 x 32 and wide 64 x 16 mma.sync tiles and the few-head tile of
# both rows. They run where Triton has the Gluon API the file is written for (3.6) on a 9.x
# GPU (the H200 runs the sm_120 row's tiles too); each case checks that the Gluon launch ran.
_GLUON_RUNS = (
    ON_GPU and getattr(fl, "HAS_GLUON", False) and torch.cuda.get_device_capability()[0] == 9
)
_V41_DUAL = dict(_WS_DUAL, kv_layout="v41", invalid_fraction=0.1)
_FP4 = dict(extra_kv_layout="v41_fp4")
_WIDE_STATIC = _WIDE._replace(plan_splits=0)  # the wide tile, static splits
V41_GLUON_CASES = [
    ("v41_ws_dual_h64", dict(_V41_DUAL, B=4), [
        _WS,
        _WS._replace(ws_exact=True, num_splits=1, plan_splits=0),
        _WS_DUAL_RULE,  # the rule's wgmma Gluon loop for dual calls of 40+ programs
        _WS_SMALL_DUAL, _WS_SMALL_DUAL_32,  # the small dual-cache tile's two forms
        _WSX,
        fl.mma_config((12, 0), 132, 4, 64, 320, 200),
        _WIDE_STATIC,
    ]),
    ("v41_ws_one_cache_h96_page1", dict(B=3, H=96, topk=300, page_size=1, kv_layout="v41",
                                        with_sink=True, invalid_fraction=0.1), [
        fl.mma_config((9, 0), 132, 3, 96, 300, 0)._replace(ws=True),
        fl.mma_config((12, 0), 132, 3, 96, 300, 0),
    ]),
    ("v41_ws_few_h8_dual", dict(_V41_DUAL, B=5, H=8), [
        _FEW, _FEW120, _FEW._replace(ws_exact=False), _FEW._replace(num_splits=1), _FEW_HM,
    ]),
    ("v41_ws_few_prefill_h16", dict(_FEW_PREFILL, kv_layout="v41"), [_FEW_PREFILL_CFG]),
    # a V4.1 FP4 extra cache: each tile's loader and dequantization by its cache
    ("v41_fp4_ws_dual_h64", dict(_V41_DUAL, **_FP4, B=4), [
        _WS, _WS_DUAL_RULE, _WSX, fl.mma_config((12, 0), 132, 4, 64, 320, 200), _WIDE_STATIC,
        _WS_SMALL_DUAL_32, _WS_SMALL_DUAL,  # the rule's own form, then the long one forced
    ]),
    ("v41_fp4_ws_few_h8_dual", dict(_V41_DUAL, **_FP4, B=5, H=8), [_FEW, _FEW120, _FEW_HM]),
    ("v41_fp4_ws_few_prefill_h16", dict(_FEW_PREFILL, **_FP4, kv_layout="v41",
                                        with_sink="inf"), [_FEW_PREFILL_CFG]),
]  # fmt: skip


@pytest.fixture
def gluon_launches(monkeypatch):
    """How many times the launcher ran `_ws_split_kernel` (the Gluon loop)."""
    calls = []
    real = fl._launch_ws
    monkeypatch.setattr(fl, "_launch_ws", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


@pytest.mark.skipif(not _GLUON_RUNS, reason="the Gluon loops need triton 3.6 and a 9.x GPU")
@pytest.mark.parametrize(
    "case_id,kwargs,configs", V41_GLUON_CASES, ids=[c[0] for c in V41_GLUON_CASES]
)
def test_v41_in_gluon_loops(case_id, kwargs, configs, gluon_launches):
    inputs = ref.make_inputs(**kwargs, device=DEVICE, seed=_seed(case_id))
    for cfg in configs:
        before = len(gluon_launches)
        _run_and_check(inputs, "mma", cfg)
        assert len(gluon_launches) > before, cfg


@pytest.mark.skipif(not _GLUON_RUNS, reason="the Gluon loops need triton 3.6 and a 9.x GPU")
@pytest.mark.parametrize("H,tm_heads", [(64, 0), (8, 0), (8, 8)], ids=["64", "8", "8tm"])
def test_v41_nan_scale_byte_in_gluon_loops(H, tm_heads, gluon_launches):
    """Scale byte 255 (float8_e8m0fnu's NaN) in a group request 0 selects: its output is NaN,
    as in the reference, and its LSE the Triton loop's in the same config (both leave the
    NaN-weighted token out of it: docs/kernel-contract.md); the other requests are
    unaffected."""
    inputs = ref.make_inputs(B=3, H=H, topk=320, page_size=16, kv_layout="v41", with_sink=True,
                             device=DEVICE, seed=23)  # fmt: skip
    kc = inputs["k_cache"]
    slot = int(inputs["indices"].view(3, -1)[0, 5])
    P, stride = kc.shape[1], kc.stride(0)
    flat = kc.as_strided((kc.untyped_storage().nbytes(),), (1,), 0)
    flat[(slot // P) * stride + P * 512 + (slot % P) * 16 + 9] = 255
    row = fl.MMA_ROWS["sm90"]._replace(ws_few_tm_heads=tm_heads)  # 8 heads token-major or not
    cfg = fl.mma_config((9, 0), 132, 3, H, 320, 0, row=row)
    out, lse = decode(**inputs, variant="mma", _config=cfg)
    assert gluon_launches
    t_out, t_lse = decode(**inputs, variant="mma", _config=cfg._replace(ws=False))
    r_out, r_lse = ref.reference_sparse_decode(**inputs)
    assert torch.isnan(out[0].float()).all() and torch.isnan(t_out[0].float()).all()
    assert torch.isnan(r_out[0].float()).all()
    torch.testing.assert_close(lse[0], t_lse[0], equal_nan=True)
    acc = ref.check_accuracy(out[1:], lse[1:], r_out[1:], r_lse[1:])
    assert acc["ok"], acc


# ----------------------------------------------------------------------------- bad input


def _inputs(layout="v41", extra_layout=None):
    return ref.make_inputs(
        B=2, H=16, topk=8, page_size=16, extra_topk=8, extra_page_size=8, kv_layout=layout,
        extra_kv_layout=extra_layout, device=DEVICE, seed=11,
    )  # fmt: skip


def _resized(cache: torch.Tensor, token_bytes: int) -> torch.Tensor:
    pages, P = cache.shape[:2]
    flat = torch.zeros(pages * P * token_bytes, dtype=torch.uint8, device=cache.device)
    tb = token_bytes
    return flat.as_strided((pages, P, 1, tb), (P * tb, tb, tb, 1))


@pytest.mark.parametrize("token_bytes", [576, 512, 600, 1])
@pytest.mark.parametrize("which", ["k_cache", "extra_k_cache"])
def test_other_token_sizes_are_value_errors_naming_them(which, token_bytes):
    inputs = _inputs()
    inputs[which] = _resized(inputs[which], token_bytes)
    with pytest.raises(ValueError, match=rf"{which}: unsupported token size {token_bytes} bytes"):
        decode(**inputs, variant="mma")


def test_fp4_main_cache_and_mixed_generations_rejected():
    inputs = _inputs()
    inputs["k_cache"] = _resized(inputs["k_cache"], 288)
    with pytest.raises(ValueError, match=r"k_cache: unsupported token size 288 .*extra cache"):
        decode(**inputs, variant="simt")
    v4 = _inputs("v4")
    v4["extra_k_cache"] = _inputs("v41", "v41_fp4")["extra_k_cache"]
    with pytest.raises(ValueError, match=r"extra_k_cache: a V4.1 FP4 extra cache .* V4 main"):
        decode(**v4, variant="mma")
    v41 = _inputs("v41")
    v41["extra_k_cache"] = _inputs("v4")["extra_k_cache"]
    with pytest.raises(ValueError, match=r"a V4 extra cache \(584 bytes"):
        decode(**v41, variant="mma")


def test_wrapper_torch_path_refuses_v41_caches_by_name():
    """SGLANG_SM120_FLASHMLA_BACKEND=torch reads only V4 caches: a V4.1 one is a ValueError,
    not a silently wrong answer (the triton backend, the entry above, reads them)."""
    from .test_flash_mla_sm120_triton import _load

    wrapper = _load("_kd_test_v41_wrapper", "flash_mla_sm120.py")
    inputs = _inputs("v41", "v41_fp4")
    args = [inputs[k] for k in ("q", "k_cache", "indices", "topk_length", "attn_sink")]
    with pytest.raises(ValueError, match="k_cache: the torch path reads the V4 cache"):
        wrapper._sm120_sparse_decode_fwd(*args, 512, 0.04)
    v4 = _inputs("v4")
    with pytest.raises(ValueError, match="extra_k_cache: .* this one has 288"):
        wrapper._sm120_sparse_decode_fwd(
            v4["q"], v4["k_cache"], v4["indices"], None, None, 512, 0.04,
            inputs["extra_k_cache"], inputs["extra_indices"], None,
        )  # fmt: skip
