"""`--variants ...,flashinfer`: the harness's plumbing for FlashInfer's sm_120 DSv4 decode.

Why a stand-in: FlashInfer's sm_120 DSv4 decode (`flashinfer.mla._sparse_mla_sm120`, SGLang
0.5.23's default on sm_120) is CUDA code for sm_120a / sm_121a only; neither this machine nor
the project's GPU (an H200, sm_90) can run it, and FlashInfer is not installed here. So these
tests give the harness a stand-in module with the same entry point and signature as FlashInfer
fb28d72's (`_sparse_mla_sm120_paged_attention(q, kv_cache, indices, output, out_lse, sm_scale,
*, d_v, topk_length, attn_sink, extra_kv_cache, extra_indices, extra_topk_length, mid_out,
mid_lse)`, writing out and a base-2 LSE in place) that checks it is called the way SGLang's
sm_120 wrapper calls it (q [T, H, 512], 64-token pages, 2-D indices, split-K scratch for
decode-sized calls) and computes with the float64 reference. What they prove is the plumbing:
the call convention, the page split, the LSE conversion, the accuracy check, the JSON, and the
one-line skip on a host without FlashInfer. The verdict on speed and accuracy needs an sm_120
GPU with FlashInfer installed (`kerneldev bench --variants simt,mma,flashinfer` there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.kernels.kernel_files import KERNELS
from tests.kernels.kernel_files import load_kernel_file as _load

torch = pytest.importorskip("torch")

bench = _load("_kd_test_fi_dsv4_bench", "dsv4_bench.py")
ref = _load("_kd_test_fi_dsv4_reference", "dsv4_reference.py")
cache_mod = _load("_kd_test_fi_dsv4_cache", "dsv4_cache.py")

# The stand-in, as a module file for the harness's own process (it imports it by name).
STANDIN = '''
"""Stand-in for flashinfer.mla._sparse_mla_sm120 (tests only): same entry point and call
convention, computed with the float64 reference; records every call's argument shapes."""
import math
import dsv4_reference

_DECODE_MAX_TOKENS = 64
CALLS = []


def _sparse_mla_sm120_paged_attention(q, kv_cache, indices, output, out_lse, sm_scale, *,
                                      d_v=512, kv_scale_format="auto", topk_length=None,
                                      attn_sink=None, extra_kv_cache=None, extra_indices=None,
                                      extra_topk_length=None, mid_out=None, mid_lse=None):
    T, H, D = q.shape
    assert D == 512 and d_v == 512 and indices.dim() == 2 and indices.shape[0] == T
    assert kv_cache.dim() == 4 and kv_cache.shape[1] == 64 and kv_cache.shape[3] == 584
    assert kv_cache.stride(0) in (37440, 64 * 584), kv_cache.stride()
    assert tuple(output.shape) == (T, H, 512) and tuple(out_lse.shape) == (T, H)
    if T <= _DECODE_MAX_TOKENS:
        splits = -(-indices.shape[1] // 64)
        if extra_kv_cache is not None:
            splits += -(-extra_indices.shape[1] // 64)
        assert tuple(mid_out.shape) == (T, H, splits, 512)
        assert tuple(mid_lse.shape) == (T, H, splits)
    else:
        assert mid_out is None and mid_lse is None
    CALLS.append(dict(T=T, H=H, page=kv_cache.shape[1], stride=kv_cache.stride(0)))
    out, lse = dsv4_reference.reference_sparse_decode(
        q[:, None], kv_cache, indices, topk_length, attn_sink, sm_scale,
        extra_kv_cache, extra_indices, extra_topk_length)
    output.copy_(out[:, 0].to(output.dtype))
    out_lse.copy_((lse[..., 0] / math.log(2)).to(out_lse.dtype))  # FlashInfer's LSE: base 2
'''


@pytest.fixture
def standin(tmp_path, monkeypatch):
    (tmp_path / "fi_standin.py").write_text(STANDIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(KERNELS))
    monkeypatch.setenv(bench.FLASHINFER_MODULE_ENV, "fi_standin")
    sys.modules.pop("fi_standin", None)
    yield tmp_path
    sys.modules.pop("fi_standin", None)


def test_pages_split_into_flashinfer_64_token_pages_keep_every_token():
    kv = torch.randn(700, 512)
    for page, stride in [(256, cache_mod.padded_page_stride(256)), (128, None), (64, None)]:
        kc = cache_mod.pack_paged_cache(kv, page, stride)
        split = bench.split_pages_to_64(torch, kc)
        assert split.shape[1:] == (64, 1, 584)
        assert split.stride(0) == (37440 if page != 64 else kc.stride(0))
        assert torch.equal(cache_mod.unpack_paged_cache(split), cache_mod.unpack_paged_cache(kc))


def test_split_refuses_what_flashinfer_cannot_read():
    v41 = cache_mod.pack_paged_cache(torch.randn(10, 512), 64, layout="v41")
    with pytest.raises(bench.HarnessError, match="584 bytes per token"):
        bench.split_pages_to_64(torch, v41)
    odd = cache_mod.pack_paged_cache(torch.randn(10, 512), 48)
    with pytest.raises(bench.HarnessError, match="page size 48"):
        bench.split_pages_to_64(torch, odd)


@pytest.mark.parametrize("B", [3, 80])  # decode-sized (split-K scratch) and prefill-sized
def test_calls_follow_sglangs_convention_and_pass_the_check(standin, B):
    module, why = bench.load_flashinfer(torch, "cpu")
    assert why is None and module.__name__ == "fi_standin"
    inputs = ref.make_inputs(
        B, 8, 70, 256, extra_topk=40, extra_page_size=64, with_sink=True,
        topk_length="partial", invalid_fraction=0.1, page_stride="pad576", indices_3d=True,
        seed=B,
    )  # fmt: skip
    calls = bench.flashinfer_calls(torch, module, [inputs])
    result = calls[0]()
    assert module.CALLS == [dict(T=B, H=8, page=64, stride=37440)]
    out, lse = bench.flashinfer_outputs(result)
    assert out.shape == (B, 1, 8, 512) and lse.shape == (B, 8, 1)
    r_out, r_lse = ref.reference_sparse_decode(**inputs)
    acc = bench.check_sets(ref, [result], [(r_out, r_lse)], bench.flashinfer_outputs)
    assert acc["ok"], acc
    # Without the conversion the base-2 LSE fails the check: the conversion is load-bearing.
    assert not bench.check_sets(ref, [result], [(r_out, r_lse)])["ok"]


def test_no_flashinfer_is_a_reason_not_a_crash(monkeypatch, tmp_path):
    monkeypatch.delenv(bench.FLASHINFER_MODULE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # as if not installed
    module, why = bench.load_flashinfer(torch, "cuda")
    assert module is None and why.startswith("FlashInfer is not installed here")
    (tmp_path / "fi_empty.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(bench.FLASHINFER_MODULE_ENV, "fi_empty")
    module, why = bench.load_flashinfer(torch, "cuda")
    assert module is None and "has no _sparse_mla_sm120_paged_attention()" in why


def test_an_installed_flashinfer_on_a_non_sm120_gpu_is_skipped(monkeypatch):
    monkeypatch.delenv(bench.FLASHINFER_MODULE_ENV, raising=False)
    fake = types.ModuleType("flashinfer.mla._sparse_mla_sm120")
    fake._sparse_mla_sm120_paged_attention = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "flashinfer.mla._sparse_mla_sm120", fake)
    monkeypatch.setattr(bench.importlib, "import_module", lambda name: sys.modules[name])
    cuda = types.SimpleNamespace(get_device_capability=lambda: (9, 0))
    module, why = bench.load_flashinfer(types.SimpleNamespace(cuda=cuda), "cuda")
    assert module is None and why.endswith("needs an sm_120 / sm_121 GPU (this one is sm_90)")


# --- the harness end to end, in its own process (CPU interpreter) ---------------------------

SHAPE = "B=2,H=16,topk=8,page=128,extra_topk=16,extra_page=64,sink=1,lengths=partial,invalid=0.2"


def _harness(tmp_path: Path, env_extra: dict, variants: str):
    out = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k != bench.FLASHINFER_MODULE_ENV}
    env.update(env_extra)
    proc = subprocess.run(
        [sys.executable, str(KERNELS / "dsv4_bench.py"), "--cpu-mode", "--shapes", SHAPE,
         "--variants", variants, "--rotate", "1", "--out", str(out), "--no-table"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    return proc, (json.loads(out.read_text()) if out.exists() else None)


# Only the flashinfer variant in these runs: the kernel file's variants under the CPU
# interpreter are the harness's own tests (tests/test_bench_harness.py), and triton 3.6's
# interpreter (the GPU host's) cannot run them at all.


def test_harness_checks_and_times_the_standin(tmp_path):
    pytest.importorskip("triton")
    (tmp_path / "fi_standin.py").write_text(STANDIN)
    env = {bench.FLASHINFER_MODULE_ENV: "fi_standin", "PYTHONPATH": str(tmp_path)}
    proc, report = _harness(tmp_path, env, "flashinfer")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(r["label"], r["status"]) for r in report["results"]] == [("flashinfer", "ok")]
    assert report["results"][0]["accuracy"]["ok"]
    assert report["skipped"] == {}
    assert report["kernels"][-1]["provider"] == "flashinfer"


def test_harness_without_flashinfer_skips_it_in_one_line(tmp_path):
    pytest.importorskip("triton")
    proc, report = _harness(tmp_path, {}, "flashinfer")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("flashinfer: skipped")]
    assert len(lines) == 1 and "not installed" in lines[0]
    assert report["results"] == [] and report["ok"]
    assert "not installed" in report["skipped"]["flashinfer"]


# --- kerneldev's side: the variant is known, and a skip is one line under the table ----------


def test_kerneldev_bench_accepts_the_variant_and_prints_the_skip():
    import io

    kd_bench = pytest.importorskip("kerneldev.bench.kernel_bench")
    from kerneldev.cli import environment
    from kerneldev.cli.commands import bench as bench_cmd

    kd_bench.check_request(["simt", "mma", "flashinfer"], ["smoke"])  # no UsageError
    why = "FlashInfer is not installed here (ModuleNotFoundError: No module named 'flashinfer')"
    data = {"results": [], "skipped": {"flashinfer": why}, "device": {"name": "H200"}}
    result = kd_bench.BenchResult(data, None, kd_bench.ABSummary(None, [], {}))
    out = io.StringIO()
    with environment.use(environment.Environment(stdout=out, stdout_isatty=False)):
        bench_cmd.render(result, None)
    assert f"skipped flashinfer: {why}" in out.getvalue().splitlines()
