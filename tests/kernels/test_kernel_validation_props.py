"""Property test of the kernel entry's validation (issue 9): random shapes, dtypes, devices and
index values (past the end, negative, huge). Every call either raises ValueError before any
launch, or returns a result equal to the float64 reference. Runs under the Triton interpreter
on CPU, with tiny shapes and few examples so it stays fast."""

from __future__ import annotations

import pytest

from . import conftest as kconf

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

if not kconf.KERNELS_RUNNABLE:
    pytestmark = pytest.mark.skipif(True, reason="triton imported without TRITON_INTERPRET")

from .test_flash_mla_sm120_triton import DEVICE, decode, ref  # noqa: E402

INDEX_VALUES = st.sampled_from([0, 1, 5, 63, 64, 127, 128, 10**6, 2**31 - 1, -1, -2, -(2**31)])


@st.composite
def calls(draw):
    B = draw(st.sampled_from([0, 1, 1, 2, 2]))
    H = draw(st.sampled_from([1, 3, 16]))
    topk = draw(st.integers(1, 6))
    page_size = draw(st.sampled_from([1, 16, 64]))
    extra = draw(st.booleans())
    inputs = ref.make_inputs(
        B=max(B, 1),
        H=H,
        topk=topk,
        page_size=page_size,
        extra_topk=draw(st.integers(1, 4)) if extra else 0,
        num_pages=2,
        with_sink=draw(st.booleans()),
        topk_length=draw(st.sampled_from(["full", "partial", "zero", "none"])),
        device=DEVICE,
        seed=draw(st.integers(0, 1000)),
    )
    if B == 0:
        for k in ("q", "indices", "topk_length", "extra_indices", "extra_topk_length"):
            if inputs.get(k) is not None:
                inputs[k] = inputs[k][:0]
    # Index values anywhere, including past the end and negative: masked, never read.
    idx = inputs["indices"]
    if idx.numel():
        flat = idx.reshape(-1)
        for _ in range(draw(st.integers(0, 3))):
            flat[draw(st.integers(0, flat.numel() - 1))] = draw(INDEX_VALUES)
    # Then, in about half the calls, one wrong thing: dtype, device, shape.
    mutation = draw(
        st.sampled_from(
            [
                "none",
                "q-float32",
                "q-float16",
                "q-meta",
                "idx-int64",
                "q-rank",
                "len-shape",
                "sink-dtype",
                "cache-float32",
            ]
        )  # fmt: skip
    )
    if mutation == "q-float32":
        inputs["q"] = inputs["q"].float()
    elif mutation == "q-float16":
        inputs["q"] = inputs["q"].half()
    elif mutation == "q-meta":
        inputs["q"] = inputs["q"].to("meta")
    elif mutation == "idx-int64":
        inputs["indices"] = inputs["indices"].long()
    elif mutation == "q-rank":
        inputs["q"] = inputs["q"][:, 0]
    elif mutation == "len-shape" and inputs["topk_length"] is not None:
        inputs["topk_length"] = torch.cat([inputs["topk_length"], inputs["topk_length"]])
    elif mutation == "sink-dtype" and inputs["attn_sink"] is not None:
        inputs["attn_sink"] = inputs["attn_sink"].double()
    elif mutation == "cache-float32":
        inputs["k_cache"] = inputs["k_cache"].float()
    variant = draw(st.sampled_from(["simt", "mma"]))
    return inputs, variant


@settings(max_examples=24, deadline=None, suppress_health_check=list(HealthCheck))
@given(call=calls())
def test_validation_rejects_or_matches_reference(call):
    inputs, variant = call
    try:
        out, lse = decode(**inputs, variant=variant)
    except ValueError:
        return  # refused before any launch: the promised outcome for bad input
    B, _, H, _ = inputs["q"].shape
    assert out.shape == (B, 1, H, 512) and lse.shape == (B, H, 1)
    r_out, r_lse = ref.reference_sparse_decode(**inputs)
    acc = ref.check_accuracy(out, lse, r_out, r_lse)
    assert acc["ok"], acc
