"""The harness's MMA-config variants (`--config`, `--sm120-proxy`) and shape sets, without a
GPU: parsing, the config each variant resolves to, and the usage errors."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, KERNELS / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bench = _load("_kd_test_dsv4_bench", "dsv4_bench.py")


def _fake_torch(major: int, minor: int, sms: int):
    props = types.SimpleNamespace(major=major, minor=minor, multi_processor_count=sms)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(get_device_properties=lambda i: props))


def test_parse_config():
    conf = bench.parse_config(
        "n16=row:sm120,block_n:16,programs_per_sm:1,pv_split_below:0,mma_v2:1"
    )
    assert conf.label == "n16" and conf.row == "sm120" and conf.mma_v2
    assert dict(conf.row_over) == {"block_n": 16, "programs_per_sm": 1}
    assert dict(conf.config_over) == {"pv_split_below": 0}
    assert bench.parse_config(bench.SM120_PROXY) == bench.ConfigVariant(
        "sm120", "sm120", (), (), True
    )


@pytest.mark.parametrize(
    "text", ["noequals", "bad label=row:sm90", "x=block_n:big", "x=colour:3", "x=block_n"]
)
def test_parse_config_rejects(text):
    with pytest.raises(bench.HarnessError) as err:
        bench.parse_config(text)
    assert err.value.exit_code == bench.EXIT_USAGE


def test_config_variant_uses_the_kernel_files_rule():
    pytest.importorskip("triton")
    fl = _load("_kd_test_bench_kernel", "flash_mla_sm120_triton.py")
    shape = bench.make_shape(64, topk=2048)
    proxy = bench.parse_config(bench.SM120_PROXY).config(fl, _fake_torch(9, 0, 132), shape)
    assert proxy == fl.mma_config((9, 0), 132, 64, 64, 2048, 0, row=fl.MMA_ROWS["sm120"])
    assert (proxy.block_h, proxy.block_n, proxy.num_warps, proxy.s_by_group) == (32, 32, 4, True)
    own = bench.parse_config("x=pv_split_below:0").config(fl, _fake_torch(9, 0, 132), shape)
    assert own == fl.mma_config((9, 0), 132, 64, 64, 2048, 0)._replace(pv_split_below=0)
    tuned = bench.parse_config("x=row:sm120,block_n:16").config(fl, _fake_torch(9, 0, 132), shape)
    assert tuned.block_n == 16
    with pytest.raises(bench.HarnessError):
        bench.parse_config("x=row:sm90").config(
            types.SimpleNamespace(), _fake_torch(9, 0, 132), shape
        )


def test_shape_sets():
    assert bench.parse_shapes(["issue4"]) == bench.parse_shapes(["decode"])
    assert len(bench.SHAPE_SETS["decode"]) == 7
    flashmla = bench.SHAPE_SETS["flashmla"]
    assert len(flashmla) == 13
    assert [s.batch for s in flashmla[:5]] == [1, 32, 64, 128, 256]
    assert all(s.lengths == "none" for s in flashmla[:11])
    assert all(s.lengths == "partial" and s.sink and s.invalid == 0.1 for s in flashmla[11:])


def test_config_needs_a_gpu(capsys):
    code = bench.main(["--cpu-mode", "--shapes", "smoke", "--sm120-proxy"])
    assert code == bench.EXIT_USAGE
    assert "need a CUDA device" in capsys.readouterr().err
