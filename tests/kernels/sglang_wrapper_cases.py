"""Odd inputs through a real SGLang release's sm_120 wrapper (`flash_mla_with_kvcache_sm120`,
Triton backend) backed by the bundled kernel file, against the float64 reference.

Run by `test_sglang_wrapper_odd_inputs.py` as a script, in a process whose PYTHONPATH holds the
release's tree (with the bundled kernel file in it) and the variables that select the backend
and the variant: `python sglang_wrapper_cases.py PACKAGE`. Prints one JSON line per case:
{"case", "result": "ok" | "ValueError: ..." | "WRONG ..." | "<exception>: ..."}. Without a GPU
the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by the caller).
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))
import dsv4_reference as ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KW = dict(page_size=16, with_sink=True, topk_length="partial", device=DEVICE, seed=11)


def call(wrapper, x):
    return wrapper.flash_mla_with_kvcache_sm120(
        q=x["q"], k_cache=x["k_cache"], head_dim_v=x["head_dim_v"],
        softmax_scale=x["softmax_scale"], indices=x["indices"], topk_length=x["topk_length"],
        attn_sink=x["attn_sink"], extra_k_cache=x["extra_k_cache"],
        extra_indices_in_kvcache=x["extra_indices"], extra_topk_length=x["extra_topk_length"],
    )  # fmt: skip


def inputs(**kw):
    return ref.make_inputs(**{**KW, **kw})


def heads(H, B=2):
    return inputs(B=B, H=H, topk=20, extra_topk=7, extra_page_size=4, invalid_fraction=0.1)


def topk(t):
    return inputs(B=2, H=4, topk=t, page_size=64, invalid_fraction=0.1)


def pages(P):
    return inputs(B=2, H=4, topk=13, page_size=P, extra_topk=5, extra_page_size=P,
                  page_stride="pad576")  # fmt: skip


def empty_batch():
    x = inputs(B=1, H=4, topk=8, extra_topk=4, indices_3d=True)
    for k in ("q", "indices", "topk_length", "extra_indices", "extra_topk_length"):
        x[k] = x[k][:0]
    return x


def all_invalid():
    x = inputs(B=2, H=4, topk=8, extra_topk=4)
    x["indices"].fill_(-1)
    x["extra_indices"].fill_(-1)
    return x


def lengths(kind):
    x = inputs(B=3, H=4, topk=8, extra_topk=4)
    if kind == "zero":
        x["topk_length"].zero_()
        x["extra_topk_length"].zero_()
    else:  # past topk, and negative
        x["topk_length"][:2] = torch.tensor([100, -5])
        x["extra_topk_length"][1:] = torch.tensor([2**31 - 1, -(2**31)])
    return x


def edge_indices():
    """The last slot of the last page, and ids at and far past the cache's end (invalid)."""
    x = inputs(B=2, H=4, topk=8, num_pages=3, extra_topk=4, extra_page_size=4, extra_num_pages=2)
    x["indices"][:, 0] = 47
    x["indices"][1, 1:3] = torch.tensor([48, 10**9])
    x["extra_indices"][:, -1] = 7
    x["extra_indices"][0, 0] = 8
    return x


def strided_q(kind):
    x = inputs(B=4, H=8, topk=10)
    if kind == "head_slice":
        x["q"] = x["q"][:, :, 1:6]
        x["attn_sink"] = x["attn_sink"][1:6]
    elif kind == "token_slice":
        for k in ("q", "indices", "topk_length"):
            x[k] = x[k][::2]
    else:  # a head-major copy seen through a transposed view
        x["q"] = x["q"].permute(2, 1, 0, 3).contiguous().permute(2, 1, 0, 3)
    return x


def sinks(value):
    x = inputs(B=2, H=4, topk=10)
    x["attn_sink"][1] = value
    x["topk_length"][1] = 0
    return x


def prefill(T, H, topk=16, extra_topk=8):
    """0.5.23 sends more than 64 query tokens here with the layer's real head count."""
    x = inputs(B=T, H=H, topk=topk, page_size=64, extra_topk=extra_topk, extra_page_size=16)
    x["indices"][1:] = x["indices"][0]  # consecutive tokens selecting the same rows
    return x


CASES = {
    **{f"heads{H}": (lambda H=H: heads(H)) for H in (1, 3, 10, 130)},
    **{f"topk{t}": (lambda t=t: topk(t)) for t in (1, 65, 129)},
    "extra513": lambda: inputs(B=1, H=3, topk=9, extra_topk=513, extra_page_size=64),
    **{f"page{P}": (lambda P=P: pages(P)) for P in (1, 256)},
    "batch0": empty_batch,
    "batch1": lambda: inputs(B=1, H=4, topk=8, extra_topk=4),
    "all_invalid": all_invalid,
    "lengths_zero": lambda: lengths("zero"),
    "lengths_past_topk_negative": lambda: lengths("odd"),
    "edge_indices": edge_indices,
    **{f"q_{k}": (lambda k=k: strided_q(k)) for k in ("head_slice", "token_slice", "transposed")},
    "sink_plus_inf": lambda: sinks(math.inf),
    "sink_minus_inf": lambda: sinks(-math.inf),
    "prefill_T65_H8": lambda: prefill(65, 8),
}

# The SIMT kernel runs one program per (token, head), and the interpreter's cost is per
# program: its two largest cases (520 and 260 programs) cost ~23 s of the suite's CPU time, so
# it gets them smaller on the same paths (a head count past a power of two; more than 64 query
# tokens, which 0.5.23 routes here, at 2 heads: SIMT's programs are per head anyway).
SIMT_CASES = {k: v for k, v in CASES.items() if k != "prefill_T65_H8"}
SIMT_CASES.update(heads130=lambda: heads(130, B=1), prefill_T65_H2=lambda: prefill(65, 2, 5, 3))

# Bad input: a ValueError naming the argument, raised before any launch.
BAD = {
    "q_fp16": ("q", lambda x: x.update(q=x["q"].half())),
    "q_fp32": ("q", lambda x: x.update(q=x["q"].float())),
    "q_3d": ("q", lambda x: x.update(q=x["q"][:, 0])),
    "head_dim_v_448": ("head_dim_v", lambda x: x.update(head_dim_v=448)),
    "k_cache_bf16": ("k_cache", lambda x: x.update(k_cache=x["k_cache"].view(torch.bfloat16))),
    "k_cache_576": ("k_cache", lambda x: x.update(k_cache=x["k_cache"][..., :576])),
    "k_cache_meta": (
        "k_cache",
        lambda x: x.update(
            k_cache=torch.empty(x["k_cache"].shape, dtype=torch.uint8, device="meta")
        ),
    ),  # fmt: skip
    "indices_int64": ("indices", lambda x: x.update(indices=x["indices"].long())),
    "topk_length_int64": ("topk_length", lambda x: x.update(topk_length=x["topk_length"].long())),
    "attn_sink_bf16": ("attn_sink", lambda x: x.update(attn_sink=x["attn_sink"].bfloat16())),
}


def run(wrapper, name, make):
    x = make()
    try:
        out, lse = call(wrapper, x)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return f"{type(e).__name__}: {e}"
    r_out, r_lse = ref.reference_sparse_decode(**x)
    acc = ref.check_accuracy(out, lse, r_out, r_lse)
    if not acc["ok"]:
        return "WRONG " + json.dumps({k: v for k, v in acc.items() if k != "tolerances"})
    return "ok"


def main(package: str) -> None:
    wrapper = importlib.import_module(f"{package}.flash_mla_sm120")
    kernel = importlib.import_module(f"{package}.flash_mla_sm120_triton")
    variant = getattr(kernel, "_DEFAULT_VARIANT", None)
    print(json.dumps({"variant": variant}), flush=True)
    for name, make in (SIMT_CASES if variant == "simt" else CASES).items():
        print(json.dumps({"case": name, "result": run(wrapper, name, make)}), flush=True)
    for name, (arg, mutate) in BAD.items():
        x = inputs(B=2, H=4, topk=8)
        mutate(x)
        try:
            call(wrapper, x)
            result = "no error"
        except ValueError as e:
            result = f"ValueError: {e}" if arg in str(e) else f"ValueError without {arg}: {e}"
        except Exception as e:  # noqa: BLE001
            result = f"{type(e).__name__}: {e}"
        print(json.dumps({"case": name, "arg": arg, "result": result}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
