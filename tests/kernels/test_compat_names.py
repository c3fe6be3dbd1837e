"""The compatibility names at the end of the kernel file (what SGLang's and vLLM's code imports
from it) against the float64 reference, composed the way SGLang's older entry point did."""

from __future__ import annotations

import pytest

from . import conftest as kconf
from .test_flash_mla_sm120_triton import DEVICE, fl, ref

torch = pytest.importorskip("torch")

if not kconf.KERNELS_RUNNABLE:
    pytestmark = pytest.mark.skipif(True, reason="triton imported without TRITON_INTERPRET")


def test_split_merge_and_sink_compose_to_the_reference():
    x = ref.make_inputs(
        2, 4, 16, 16, extra_topk=8, extra_page_size=4, with_sink=True,
        topk_length="partial", invalid_fraction=0.2, indices_3d=True, device=DEVICE, seed=11,
    )  # fmt: skip
    o1, l1 = fl._run_triton_sparse_decode(
        x["q"], x["k_cache"], x["indices"], x["topk_length"], x["softmax_scale"]
    )
    o2, l2 = fl._run_triton_sparse_decode(
        x["q"], x["extra_k_cache"], x["extra_indices"], x["extra_topk_length"], x["softmax_scale"]
    )
    assert o1.shape == (2, 1, 4, 512) and l1.shape == (2, 1, 4) and l1.dtype == torch.float32
    out, lse = fl._apply_attn_sink(*fl._merge_partial_attn(o1, l1, o2, l2), x["attn_sink"])
    r_out, r_lse = ref.reference_sparse_decode(**x)
    assert out.dtype == torch.bfloat16
    assert (out.float() - r_out.float()).abs().max() < 2e-2  # two bf16 roundings in between
    assert torch.allclose(lse.permute(0, 2, 1).double(), r_lse.double(), atol=1e-4)
    assert fl._D == 512 and fl._NOPE_DIM == 448 and fl._TOKEN_DATA_STRIDE == 576


def test_empty_parts_merge_to_nothing():
    empty = torch.full((1, 1, 2), float("-inf"))
    ones = torch.ones(1, 1, 2, 4, dtype=torch.bfloat16)
    zero = torch.zeros(1, 1, 2)
    out, lse = fl._merge_partial_attn(ones, zero, ones * 3, empty)  # an empty part: no weight
    assert torch.equal(out, ones) and torch.equal(lse, zero)
    out, lse = fl._merge_partial_attn(ones, empty, ones, empty)
    assert not out.float().any() and torch.isinf(lse).all()
    out, lse = fl._apply_attn_sink(ones, zero, torch.zeros(2))  # sink = lse: half the weight
    assert torch.allclose(out.float(), torch.full((1, 1, 2, 4), 0.5))
    assert torch.allclose(lse, torch.full_like(lse, 0.6931472))
    out, _ = fl._apply_attn_sink(ones, empty, torch.zeros(2))
    assert not out.float().any()
