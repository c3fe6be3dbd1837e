"""The harness's MMA-config variants (`--config`, `--sm120-proxy`) and shape sets, without a
GPU: parsing, the config each variant resolves to, and the usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from typing import NamedTuple

import pytest

from tests.kernels.kernel_files import KERNELS
from tests.kernels.kernel_files import load_kernel_file as _load

from . import conftest as kconf

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


def test_every_row_switch_of_the_kernel_is_a_config_key():
    """A row field added to the kernel file can be set from --config (the packed plan's tile
    is tuned through its own shapes, not per variant; `pack_rows:0` turns the plan off)."""
    pytest.importorskip("triton")
    fl = _load("_kd_test_bench_kernel", "flash_mla_sm120_triton.py")
    packed = {"pack_block_n", "pack_num_warps"}
    assert set(fl.MMARow._fields) - packed == set(bench._ROW_KEYS)
    conf = bench.parse_config("tm=ws_few_tm_heads:8,ws_few_tm_min_b:0")
    assert dict(conf.row_over) == {"ws_few_tm_heads": 8, "ws_few_tm_min_b": 0}


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
    # B64 topk2048: 993 selected tokens per SM, the Gluon loop's wide tile (64 x 16)
    assert (proxy.block_h, proxy.block_n, proxy.num_warps, proxy.s_by_group) == (64, 16, 4, True)
    narrow = bench.parse_config("x=row:sm120,mma_v2:1,ws_wide_tokens_per_sm:0")
    assert (narrow.config(fl, _fake_torch(9, 0, 132), shape).block_h,
            narrow.config(fl, _fake_torch(9, 0, 132), shape).block_n) == (32, 32)  # fmt: skip
    own = bench.parse_config("x=pv_split_below:0").config(fl, _fake_torch(9, 0, 132), shape)
    assert own == fl.mma_config((9, 0), 132, 64, 64, 2048, 0)._replace(pv_split_below=0)
    # the length-aware plan set after the rule, where the rule gives none (the few-head tile)
    t256 = bench.make_shape(256, heads=8, own=True, lengths="causal", **bench._PF)
    rule = fl.mma_config((9, 0), 132, 256, 8, 128, 512)
    planned = bench.parse_config("p=plan_splits:2,plan_round:264").config(
        fl, _fake_torch(9, 0, 132), t256
    )
    assert rule.plan_splits == 0 and planned == rule._replace(plan_splits=2, plan_round=264)
    tuned = bench.parse_config("x=row:sm120,block_n:16").config(fl, _fake_torch(9, 0, 132), shape)
    assert tuned.block_n == 16
    # the sm_90 row's Gluon loop on and off: the A/B of the two bf16-P loops in one run
    assert bench.parse_config("x=block_h:64").config(fl, _fake_torch(9, 0, 132), shape).ws
    b1 = bench.make_shape(1, topk=2048)
    off = bench.parse_config("nows=ws:0").config(fl, _fake_torch(9, 0, 132), b1)
    assert (off.ws, off.block_n, off.num_splits) == (False, 32, 64)  # the Triton loop's tile
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


def test_smem_per_sm_needs_a_gpu(capsys):
    code = bench.main(["--cpu-mode", "--shapes", "smoke", "--smem-per-sm", "100"])
    assert code == bench.EXIT_USAGE
    assert "--smem-per-sm needs a CUDA device" in capsys.readouterr().err


def test_graph_each_needs_a_gpu(capsys):
    code = bench.main(["--cpu-mode", "--shapes", "smoke", "--graph-each"])
    assert code == bench.EXIT_USAGE
    assert "--graph-each needs a CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(not kconf.ON_GPU, reason="needs a CUDA GPU")
def test_graph_each_times_every_call_in_a_graph_of_its_own(tmp_path, monkeypatch):
    """--graph-each: one graph per input set, replayed in turn (one call after each L2
    flush), the replays' outputs checked like the single graph's, the mode recorded."""
    seen = []
    real = bench.time_cuda_graph

    def recording(torch, triton, calls, warmup_ms, rep_ms, **kw):
        result = real(torch, triton, calls, warmup_ms, rep_ms, **kw)
        seen.append((len(calls), kw.get("each", False), len(result[2])))
        return result

    monkeypatch.setattr(bench, "time_cuda_graph", recording)
    out = tmp_path / "r.json"
    code = bench.main(["--variants", "mma", "--shapes", "B=1,H=64,topk=128", "--rotate", "2",
                       "--warmup", "1", "--rep", "2", "--graph-each", "--out", str(out),
                       "--no-table"])  # fmt: skip
    assert code == bench.EXIT_OK
    data = json.loads(out.read_text())
    assert data["settings"]["graph_each"] is True
    (entry,) = data["results"]
    assert entry["timing_method"] == "cuda-graph-each" and entry["status"] == "ok"
    assert entry["median_us"] > 0
    assert seen[-1] == (2, True, 2)  # the entry's two sets, a graph each


def test_carveout_percent_lands_on_the_configuration_asked_for():
    """Rounded down: the driver rounds the hint up to its next configuration (H200: 228 KB per
    SM, configurations 0, 8, 16, 32, 64, 100, 132, 164, 196, 228 KB)."""
    h200 = 233_472
    assert bench.carveout_percent(100, h200) == 43  # 98 KB -> the 100 KB configuration
    assert bench.carveout_percent(64, h200) == 28  # 63.8 KB -> 64 KB
    assert bench.carveout_percent(1, h200) == 1
    assert bench.carveout_percent(228, h200) == 100


@pytest.mark.skipif(not kconf.ON_GPU, reason="needs a CUDA GPU")
def test_smem_per_sm_keeps_sm120s_residency_on_the_proxy(tmp_path):
    """On a GPU with more shared memory per SM than 100 KB (the H200: 228), --smem-per-sm 100
    leaves one program of the sm_120 row (98 KB with triton 3.6, 82-84 KB with 3.9) per SM,
    where two fit without it; the JSON records what the driver reports. A subprocess: the load
    hook stays for the life of the process."""
    import torch

    if torch.cuda.get_device_properties(0).shared_memory_per_multiprocessor <= 200 * 1024:
        pytest.skip("needs a GPU with more than 200 KB of shared memory per SM")
    out = tmp_path / "r.json"
    res = subprocess.run(
        [sys.executable, str(KERNELS / "dsv4_bench.py"), "--variants", "mma", "--sm120-proxy",
         "--smem-per-sm", "100", "--shapes", "B=8,H=64,topk=512", "--rotate", "1",
         "--warmup", "0", "--rep", "1", "--out", str(out), "--no-table"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["settings"]["smem_per_sm_kb"] == 100
    # the split launch: the Triton loop's, or the Gluon loop's where triton has its API
    split = [
        r for r in data["residency"] if r["kernel"] in ("_mma_split_kernel", "_ws_split_kernel")
    ]
    assert split and all(r["carveout_percent"] == 43 for r in split)
    # every split build over 50 KB (both rows' are) keeps one program per SM
    assert all(r["blocks_per_sm"] == 1 for r in split if r["shared"] > 50 * 1024)


@pytest.mark.skipif(not kconf.ON_GPU, reason="needs a CUDA GPU")
def test_a_throwaway_graph_is_timed_before_the_first_entry(tmp_path, monkeypatch):
    """A process's first CUDA graph replays ~0.9 us a call faster than its later ones (H200,
    session 31): the harness captures and times one graph of its own before any entry's, so
    no kernel's first entry gets that graph. Every graph the run times is recorded here."""
    timed = []
    real = bench.time_cuda_graph

    def recording(torch, triton, calls, warmup_ms, rep_ms, **kw):
        result = real(torch, triton, calls, warmup_ms, rep_ms, **kw)
        timed.append(len(calls))
        return result

    monkeypatch.setattr(bench, "time_cuda_graph", recording)
    out = tmp_path / "r.json"
    code = bench.main(["--variants", "mma", "--shapes", "B=1,H=64,topk=128", "--rotate", "2",
                       "--warmup", "1", "--rep", "2", "--out", str(out), "--no-table"])  # fmt: skip
    assert code == bench.EXIT_OK
    # the throwaway graph (one call) first, the launch floor (a fill kernel per input set),
    # then the shape's warm-up (a second import of the file, `--warm-entry`'s default with
    # CUDA) and the entry (one call per input set each)
    assert timed == [1, 2, 2, 2]
    assert [w["of"] for w in json.loads(out.read_text())["warm_entries"]] == ["mma"]


# --- --phases: ablated copies of the kernel file ----------------------------------------------

KERNEL_FILE = KERNELS / "flash_mla_sm120_triton.py"


def test_every_phase_applies_to_the_bundled_kernel():
    source = KERNEL_FILE.read_text()
    assert bench.GLUON_LOOP_MARK in source  # the Gluon loops' lines are ablated too
    for phase, substitutions in bench.PHASES.items():
        ablated = bench.ablate(source, phase, str(KERNEL_FILE))
        for line, replacement in substitutions + bench.GLUON_PHASES[phase]:
            # each line of the real loop is there once and replaced by its stand-in
            assert sum(x.strip() == line for x in source.splitlines()) == 1, line
            assert not any(x.strip() == line for x in ablated.splitlines()), line
            assert f"{replacement}  # phase:{phase}" in ablated
        # on the same line: the compiler's line numbers are the real file's
        assert len(ablated.splitlines()) == len(source.splitlines())
    assert bench.parse_phases(None) == []
    assert bench.parse_phases("nomma,l2tile,nomma") == ["nomma", "l2tile"]
    for bad in ("", "l2", "nomma,mma"):
        with pytest.raises(bench.HarnessError) as err:
            bench.parse_phases(bad)
        assert err.value.exit_code == bench.EXIT_USAGE


@pytest.mark.parametrize("duplicate", [False, True])
def test_a_missing_phase_line_is_one_line_and_exit_2(tmp_path, capsys, duplicate):
    line = "s = tl.dot(q, tl.trans(k))"
    source = KERNEL_FILE.read_text()
    indent = " " * 12  # the line's indentation in the loop
    twice = line + "\n" + indent + line  # a second copy of the whole line
    edited = source.replace(line, twice if duplicate else "s = tl.dot(q, k.T)", 1)
    kernel = tmp_path / "edited.py"
    kernel.write_text(edited)
    code = bench.main(["--cpu-mode", "--kernel", f"e={kernel}", "--phases", "--shapes", "smoke"])
    err = capsys.readouterr().err
    assert code == bench.EXIT_USAGE
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"line `{line}`" in err and str(kernel) in err
    assert ("found 2 times" if duplicate else "not found") in err


def test_phases_need_an_mma_variant(capsys):
    code = bench.main(["--cpu-mode", "--variants", "simt", "--phases", "--shapes", "smoke"])
    assert code == bench.EXIT_USAGE and "--phases" in capsys.readouterr().err


def test_phase_table_reads_off_each_phase():
    report = {
        "settings": {"phases": ["l2tile", "nomma"]},
        "results": [
            {"shape": "B64", "label": "mma", "status": "ok", "median_us": 100.0, "phase": None},
            {
                "shape": "B64",
                "label": "phase:l2tile:mma",
                "status": "ablated",
                "median_us": 60.0,
                "phase": "l2tile",
                "phase_of": "mma",
            },  # fmt: skip
            {
                "shape": "B64",
                "label": "phase:nomma:mma",
                "status": "ablated",
                "median_us": 70.0,
                "phase": "nomma",
                "phase_of": "mma",
            },  # fmt: skip
            {"shape": "B64", "label": "simt", "status": "ok", "median_us": 900.0, "phase": None},
        ],
    }
    (row,) = bench.phase_rows(report)
    assert row == {"shape": "B64", "label": "mma", "status": "ok", "full_us": 100.0,
                   "l2tile_us": 60.0, "nomma_us": 70.0, "unreached": []}  # fmt: skip
    text = bench.phase_table([row], ["l2tile", "nomma"])
    header, values = text.splitlines()[1:3]
    assert header.split() == ["shape", "variant", "full", "us", "l2tile", "us", "nomma", "us",
                              "full-l2tile", "full-nomma"]  # fmt: skip
    assert values.split() == ["B64", "mma", "100.0", "60.0", "70.0", "40.0", "30.0"]


def test_a_copy_that_passed_the_accuracy_check_is_not_read_as_a_phase():
    """An ablated copy computes wrong results by design: one whose results matched the
    reference ran none of its phase's lines (a loop the phase does not ablate), so no saving
    is read off its time and the table marks it."""
    report = {
        "settings": {"phases": ["l2tile", "nomma"]},
        "results": [
            {"shape": "T256", "label": "mma", "status": "ok", "median_us": 22.0, "phase": None},
            *(
                {
                    "shape": "T256",
                    "label": f"phase:{p}:mma",
                    "status": "ablated",
                    "median_us": us,
                    "phase": p,
                    "phase_of": "mma",
                    "accuracy": {"ok": ok},
                }
                for p, us, ok in (("l2tile", 21.9, True), ("nomma", 15.0, False))
            ),  # fmt: skip
        ],
    }
    (row,) = bench.phase_rows(report)
    assert row["unreached"] == ["l2tile"]
    lines = bench.phase_table([row], ["l2tile", "nomma"]).splitlines()
    assert lines[2].split() == ["T256", "mma", "22.0", "21.9*", "15.0", "-", "7.0"]
    assert lines[-1].startswith("*: matched the reference")
    assert max(map(len, lines[:2] + lines[-1:])) <= 80


def test_nogather_compiles_for_sm120_and_sm90_without_tensor_core_products(tmp_path):
    """The interpreter row runs neither S_BY_GROUP nor PV_SPLIT: compile those branches of the
    ablated copy for sm_120 (scores by group) and sm_90 (PV_SPLIT), no GPU needed."""
    pytest.importorskip("triton")
    ablated = tmp_path / "flash_mla_sm120_triton.py"
    ablated.write_text(bench.ablate(KERNEL_FILE.read_text(), "nogather", "bundled"))
    code = (
        "import sys; sys.path.insert(0, 'scripts')\n"
        "import importlib.util, compile_check as cc\n"
        f"spec = importlib.util.spec_from_file_location('ablated', {str(ablated)!r})\n"
        "fl = importlib.util.module_from_spec(spec); spec.loader.exec_module(fl)\n"
        "for cap in (120, 90):\n"
        "    row = cc.table_row(fl, cap)\n"
        "    ptx = cc.compile_kernel(fl, cap, row, True, True, False).asm['ptx']\n"
        "    print(cap, row['S_BY_GROUP'], ptx.count('mma.sync'), ptx.count('wgmma'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = KERNELS.parent
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
        timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[:2] == ["120 True 0 0", "90 False 0 0"]


# --- --config on a field an older kernel file lacks --------------------------------------------


class _OldRow(NamedTuple):  # a kernel file from before prefetch_next
    block_n: int
    s_by_group: bool


class _NewRow(NamedTuple):
    block_n: int
    s_by_group: bool
    prefetch_next: bool = False


class _Config(NamedTuple):
    block_n: int
    s_by_group: bool = False
    prefetch_next: bool = False


def _fake_kernel_module(row):
    return types.SimpleNamespace(
        MMA_ROWS={"sm90": row},
        mma_row_name=lambda cc: "sm90",
        mma_config=lambda cc, sms, b, h, topk, extra, row: _Config(
            row.block_n, row.s_by_group, getattr(row, "prefetch_next", False)
        ),
    )


def test_prefetch_next_is_a_row_key():
    conf = bench.parse_config("c=prefetch_next:1,s_by_group:1")
    assert dict(conf.row_over) == {"prefetch_next": 1, "s_by_group": 1}
    shape = bench.make_shape(64, topk=2048)
    cfg = conf.config(_fake_kernel_module(_NewRow(32, False)), _fake_torch(9, 0, 132), shape)
    assert cfg.prefetch_next is True and cfg.s_by_group is True  # bool fields take 0/1
    # a kernel file without the field: one clear line, not a traceback
    with pytest.raises(bench.HarnessError, match="no field prefetch_next"):
        conf.config(_fake_kernel_module(_OldRow(32, False)), _fake_torch(9, 0, 132), shape)
    assert "prefetch_next" in bench.build_parser().format_help()


def test_exact_concurrent_is_a_row_key():
    """The side-by-side exact launch can be switched per variant (A/B against the serial pair)."""
    conf = bench.parse_config("serial=exact_concurrent:0")
    assert dict(conf.row_over) == {"exact_concurrent": 0}
    assert "exact_concurrent" in bench.build_parser().format_help()


# --- prefill-sized shapes and the DSv4.1 formats (issue 20) ----------------------------------


def test_prefill_and_v41_shape_sets():
    prefill = bench.SHAPE_SETS["prefill"]
    assert {s.batch for s in prefill} == {256, 1024, 4096, 8192}
    assert {s.heads for s in prefill} == {8, 16, 64}
    assert all(s.prefill and s.name.startswith("T") for s in prefill)
    assert any(s.share for s in prefill) and any(s.lengths == "partial" for s in prefill)
    assert any(s.own for s in prefill) and not any(s.own and s.share for s in prefill)
    causal = [s for s in prefill if s.own and s.lengths == "causal"]
    # SGLang's prefill lengths at the shortest T and at every head count item 5 names
    assert {s.heads for s in causal} == {8, 16, 64} and min(s.batch for s in causal) == 256
    assert any(s.extra_topk == 0 for s in prefill) and any(s.sink for s in prefill)
    v41 = bench.SHAPE_SETS["v41"]
    assert {s.layout for s in v41} == {"v41", "v41_fp4"}
    # the floor counts each cache's own token size: 128 x 528 + 512 x 288 (+ ids, q, out)
    s = v41[0]
    assert s.min_bytes() == 64 * (128 * 532 + 512 * 292 + 2 * 64 * 512 * 2)
    spec = bench.parse_shapes(["B=4,H=8,topk=64,layout=v41_fp4,share=2,prefill=1,extra_topk=64"])
    assert spec[0].layout == "v41_fp4" and spec[0].share == 2 and spec[0].name.startswith("T4 ")
    with pytest.raises(bench.HarnessError, match="layout must be one of"):
        bench.parse_shapes(["B=4,topk=64,layout=v5"])


def test_owned_indices_never_repeat_and_their_distinct_floor_is_the_whole_floor():
    torch = pytest.importorskip("torch")
    ref = _load("_kd_test_bench_reference", "dsv4_reference.py")
    shape = bench.parse_shapes(["B=32,H=8,topk=64,extra_topk=128,extra_page=64,own=1"])[0]
    assert shape.own and shape.name.endswith(" own")
    random = ref.make_inputs(32, 8, 64, 64, extra_topk=128, extra_page_size=64, seed=1)
    owned = ref.make_inputs(32, 8, 64, 64, extra_topk=128, extra_page_size=64, seed=1)
    bench._own_indices(owned, seed=1)
    for key, cache in (("indices", "k_cache"), ("extra_indices", "extra_k_cache")):
        idx = owned[key]
        per_row = owned[cache].shape[0] * owned[cache].shape[1] // 32
        assert torch.unique(idx).numel() == idx.numel()  # no row selected twice
        rows = torch.arange(32)[:, None]
        assert bool(((idx // per_row) == rows).all())  # each row of q in its own range
    # random rows repeat across tokens: their distinct floor is below the nominal one
    assert bench.distinct_bytes(owned, shape) == shape.min_bytes()
    assert bench.distinct_bytes(random, shape) < 0.9 * shape.min_bytes()
    # invalid entries stay invalid
    bad = ref.make_inputs(32, 8, 64, 64, seed=2, invalid_fraction=0.5)
    num_tokens = bad["k_cache"].shape[0] * bad["k_cache"].shape[1]
    before = (bad["indices"] < 0) | (bad["indices"] >= num_tokens)
    bench._own_indices(bad, seed=2)
    after = (bad["indices"] < 0) | (bad["indices"] >= num_tokens)
    assert torch.equal(before, after) and int(before.sum()) > 0
    with pytest.raises(bench.HarnessError, match="exclude each other"):
        bench.parse_shapes(["B=4,topk=64,share=2,own=1"])


@pytest.mark.parametrize("share", [0, 8])
def test_causal_lengths_grow_with_the_tokens_position(share):
    """lengths=causal: token p of a request sees min(p + 1, topk) main rows and max((p + 1) //
    4, 1) extra rows, at most the extra topk (SGLang's DSv4 prefill); requests of `share`
    tokens start again at position 0; the distinct floor counts only rows within the
    lengths; the entry gets both length vectors; nothing else in the inputs changes."""
    torch = pytest.importorskip("torch")
    ref = _load("_kd_test_bench_reference", "dsv4_reference.py")
    spec = "B=40,H=8,topk=16,extra_topk=8,extra_page=16,prefill=1,lengths=causal,"
    shape = bench.parse_shapes([spec + (f"share={share}" if share else "own=1")])[0]
    assert shape.lengths == "causal" and "len-causal" in shape.name
    args = type("A", (), {"rotate": 1, "seed": 0})()
    (inputs,), _ = bench.build_inputs(ref, shape, args, "cpu", 0)
    pos = torch.arange(40) % share if share else torch.arange(40)
    assert inputs["topk_length"].tolist() == torch.clamp(pos + 1, max=16).tolist()
    assert inputs["extra_topk_length"].tolist() == ((pos + 1) // 4).clamp(1, 8).tolist()
    assert inputs["topk_length"].dtype == torch.int32
    full = bench.make_shape(40, heads=8, topk=16, extra_topk=8, extra_page_size=16, own=True,
                            prefill=True)  # fmt: skip
    if not share:  # own rows: every row within the lengths counted once
        rows = int(inputs["topk_length"].sum()) * 584 + int(inputs["extra_topk_length"].sum()) * 584
        assert bench.distinct_bytes(inputs, shape) == full.min_bytes() - 40 * 24 * 584 + rows
    with pytest.raises(bench.HarnessError, match="lengths must be one of"):
        bench.parse_shapes(["B=4,topk=64,lengths=ramp"])
    assert "causal" in bench.SPEC_HELP


def test_shared_indices_coincide_and_the_distinct_floor_counts_them_once():
    torch = pytest.importorskip("torch")
    ref = _load("_kd_test_bench_reference", "dsv4_reference.py")
    own = ref.make_inputs(32, 8, 64, 64, extra_topk=128, extra_page_size=64, seed=1)
    shape = bench.make_shape(32, heads=8, topk=64, extra_topk=128, prefill=True)
    shared = ref.make_inputs(32, 8, 64, 64, extra_topk=128, extra_page_size=64, seed=1)
    bench._share_indices(shared, 16, seed=1)
    main, extra = shared["indices"], shared["extra_indices"]
    # main cache: token i + 1's window is token i's shifted by one position, within a request
    assert torch.equal(main[1, :-1], main[0, 1:]) and not torch.equal(main[16, :-1], main[15, 1:])
    # extra cache: consecutive tokens of a request share most of their selection (1/16 redrawn)
    same = (extra[1] == extra[0]).float().mean()
    assert 0.75 < float(same) < 1.0
    own_bytes, shared_bytes = bench.distinct_bytes(own, shape), bench.distinct_bytes(shared, shape)
    q_out = 2 * 32 * 8 * 512 * 2
    ids = 32 * (64 + 128) * 4
    assert own_bytes <= shape.min_bytes()
    assert shared_bytes - q_out - ids < (own_bytes - q_out - ids) / 4
    # 2 requests: main windows of 16 + 63 tokens, extra at most 2 x 128 distinct each
    assert shared_bytes <= q_out + ids + 2 * (16 + 63) * 584 + 2 * 256 * 584


def test_table_puts_long_shape_names_on_their_own_lines_at_80_columns():
    """A row wider than the terminal: each shape's name once on a line of its own, its
    variants' rows under it, every line within 80 columns; a wide terminal keeps one line a
    result."""
    shape = bench.make_shape(1024, heads=8, lengths="partial", invalid=0.1, own=True,
                             prefill=True, sink=True, **bench._DUAL)  # fmt: skip
    assert len(shape.name) > 60

    def result(label, us):
        return {"shape": shape.name, "label": label, "status": "ok", "median_us": us,
                "p20_us": us - 1, "p80_us": us + 1, "gbs": 3069.0, "pct_copy_bw": 72.3,
                "tflops": 82.0, "x_floor": 1.4}  # fmt: skip

    report = {"timing": "cuda-graph", "results": [result("mma", 131.0), result("nx", 125.9)]}
    narrow = bench.table(report, width=80).splitlines()
    assert max(map(len, narrow)) <= 80
    assert narrow.count(shape.name) == 1 and narrow.index(shape.name) == 1
    assert narrow[2].split()[:2] == ["mma", "131.0"] and narrow[3].split()[-1] == "1.04x"
    wide = bench.table(report, width=200).splitlines()
    assert wide[1].startswith(shape.name) and wide[2].startswith(shape.name)
    assert wide[1].split()[-3:] == ["1.4", "ok", "-"] and len(wide) == 4  # + the "vs" note


def test_table_names_the_launch_floor_when_it_was_measured():
    """The launch floor (a CUDA run's `launch_floor`) is the table's last note, within 80
    columns; a failed or absent one adds no line."""
    shape = bench.make_shape(64, heads=64, topk=2048)
    row = {"shape": shape.name, "label": "mma", "status": "ok", "median_us": 74.6,
           "p20_us": 74.4, "p80_us": 74.8, "gbs": 1145.0, "pct_copy_bw": 37.9, "tflops": 230.2,
           "x_floor": 2.6}  # fmt: skip
    report = {"timing": "cuda-graph", "results": [row]}
    measured = dict(report, launch_floor={"median_us": 4.576, "p20_us": 4.3, "p80_us": 4.7})
    lines = bench.table(measured, width=80).splitlines()
    assert lines[-1] == "launch floor = 4.6 us (a 4-byte fill timed as these calls are)"
    assert max(map(len, lines)) <= 80
    failed = dict(report, launch_floor={"median_us": None, "error": "no graphs"})
    for other in (report, failed):
        assert not any("launch floor" in x for x in bench.table(other, width=80).splitlines())


def test_progress_lines_wrap_at_80_columns(capsys):
    """A result's progress line (a long shape name, its timing) within 80 columns: the outcome
    on its own indented line (the time beside its unit), no word lost or cut; a short one
    left as it is; other messages (a skipped variant's reason) stay one line."""
    shape = bench.make_shape(1024, heads=8, lengths="partial", invalid=0.1, own=True,
                             prefill=True, sink=True, **bench._DUAL)  # fmt: skip
    what, outcome = (
        f"[37/39] {shape.name} mma",
        ("ok  185.0 us [184.5-185.8]  1975 GB/s  65.8% BW  x1.5 floor  58.0 TFLOP/s"),
    )
    assert len(what + ": " + outcome) > 80
    bench.progress_result(what, outcome, width=80)
    bench.progress_result("[1/2] T64 H8 mma", "ok  24.6 us", width=80)
    skip = "flashinfer: skipped (not installed: No module named 'flashinfer'; pip install ...)"
    bench.progress(skip)
    lines = capsys.readouterr().err.splitlines()
    assert max(map(len, lines[:-1])) <= 80 and len(lines) == 4
    assert lines[0] == what + ":" and lines[1].startswith("    ok  185.0 us ")
    head = [x for x in lines if not x.startswith("[1/2]")][:-1]
    assert " ".join(x.strip() for x in head).split() == f"{what}: {outcome}".split()
    assert lines[-2] == "[1/2] T64 H8 mma: ok  24.6 us" and lines[-1] == skip


# --- the launch floor: a near-empty call timed as the entries -------------------------------


class _FakeCudaTorch:
    """Just the torch calls `measure_launch_floor` makes (no CUDA device here)."""

    def __init__(self, fail: bool = False):
        self.fail, self.synced = fail, 0
        self.cuda = types.SimpleNamespace(synchronize=self._sync)
        self.int32 = "int32"

    def _sync(self):
        self.synced += 1

    def zeros(self, *shape, dtype=None, device=None):
        if self.fail:
            raise RuntimeError("CUDA error: out of memory\nsecond line")
        return types.SimpleNamespace(fill_=lambda value: value)


@pytest.mark.parametrize("each", [False, True])
def test_launch_floor_times_rotate_fills_as_the_entries(monkeypatch, each):
    seen = {}

    def fake_time(torch, triton, calls, warmup_ms, rep_ms, each=False):
        seen.update(calls=len(calls), each=each, warmup=warmup_ms, rep=rep_ms)
        assert [call() for call in calls] == [0] * len(calls)  # each call is the fill
        return [4.5, 4.4, 4.6], [], []

    monkeypatch.setattr(bench, "time_cuda_graph", fake_time)
    floor = bench.measure_launch_floor(_FakeCudaTorch(), None, 3, each, 10, 40)
    assert floor == {"median_us": 4.5, "p20_us": 4.4, "p80_us": 4.6, "error": None}
    assert seen == {"calls": 3, "each": each, "warmup": 10, "rep": 40}


def test_launch_floor_failure_is_recorded_not_raised():
    torch = _FakeCudaTorch(fail=True)
    floor = bench.measure_launch_floor(torch, None, 3, False, 10, 40)
    assert floor["median_us"] is None and torch.synced == 1
    assert floor["error"] == "RuntimeError: CUDA error: out of memory"
