"""The FP8 block-scaled MMA probe (`scripts/fp8_mma_probe.py`, log v46): q in two MX e4m3
terms is bf16 q exactly, one term misses FlashMLA's bounds and two keep them, and Triton
emits sm_120's native block-scaled product only for two FP8 operands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import fp8_mma_probe as probe  # noqa: E402


def test_two_terms_are_bf16_q_exactly_within_2_to_14_of_the_group_max():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(64, 8, 512, generator=gen).clamp(-1, 1).to(torch.bfloat16)
    two = probe.q_in_terms(q, 2, 512)
    q64 = q.to(torch.float64)
    amax = q64.reshape(64, 8, 16, 32).abs().amax(-1, keepdim=True).expand(64, 8, 16, 32)
    near = q64.abs() >= amax.reshape(64, 8, 512) * 2.0**-14
    assert torch.equal(two[near], q64[near])
    assert float((two - q64).abs().max()) <= 2.0**-20  # the rest: below fp16's subnormals
    one = probe.q_in_terms(q, 1, 512)
    assert float((one - q64).abs().max()) > 2.0**-8  # one term: 4 significant bits


def test_one_term_misses_the_bounds_two_keep_them(monkeypatch):
    monkeypatch.setattr(probe, "SHAPES", {"B8 H64 topk64": probe.SHAPES["B8 H64 topk64"]})
    rows = {r["terms"]: r for r in probe.accuracy(terms_list=(1, 2))}
    assert not rows[1]["ok"] and rows[1]["lse_mismatched"] > 0
    assert rows[2]["ok"] and rows[2]["lse_mismatched"] == 0


def test_native_block_scaled_product_only_for_two_fp8_operands_on_sm120():
    pytest.importorskip("triton")
    # its own process: the kernel tests set TRITON_INTERPRET, which replaces compiled kernels
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "fp8_mma_probe.py"),
                          "--compile", "--json"], capture_output=True, text=True, env=env,
                         timeout=600, cwd=ROOT)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {(r["cc"], r["operands"]): r["mma"] for r in json.loads(res.stdout)["compile"]}
    native = "kind::mxf8f6f4.block_scale"
    assert any(native in op for op in rows[(120, "e4m3 x e4m3")])
    assert not any(native in op for op in rows[(120, "e4m3 x bf16")])
    assert not any(native in op for op in rows[(90, "e4m3 x e4m3")])  # Hopper: upcast
