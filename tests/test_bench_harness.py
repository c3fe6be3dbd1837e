"""The benchmark harness (`kernels/dsv4_bench.py`) as the lead runs it on a GPU host, here on the
CPU under the Triton interpreter: correctness first, the JSON of docs/bench-json.md, failures
recorded and never timed, clear one-line errors with documented exit codes.

Exit codes (docs/bench-json.md): 0 every entry passed, 1 some entry failed accuracy or raised,
2 bad command line / shape spec, 3 environment (no CUDA, torch/triton, kernel import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kerneldev.kernels import dsv4_bench as harness

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "kernels" / "dsv4_bench.py"
TINY = "B=1,H=16,topk=16,page=16"

# A correct kernel made of the float64 reference (the harness puts its own folder, which holds
# dsv4_reference.py, on sys.path before importing kernel files), with a deliberately wrong
# `mma` (outputs 5% too large) and a `boom` variant that raises.
FAKE_KERNEL = """
import torch
import dsv4_reference as R

def flash_mla_sparse_decode_triton(q, k_cache, indices, topk_length, attn_sink, head_dim_v,
                                   softmax_scale, extra_k_cache=None, extra_indices=None,
                                   extra_topk_length=None, *, variant=None):
    if variant == "boom":
        raise RuntimeError("kaboom")
    out, lse = R.reference_sparse_decode(q, k_cache, indices, topk_length, attn_sink,
                                         softmax_scale, extra_k_cache, extra_indices,
                                         extra_topk_length)
    if variant == "mma":
        out = out * 1.05
    return out.to(torch.bfloat16), lse.float()
"""

# An SGLang file from before the `variant=` keyword: only `dispatch` can call it.
OLD_KERNEL = """
import torch
import dsv4_reference as R

def flash_mla_sparse_decode_triton(q, k_cache, indices, topk_length, attn_sink, head_dim_v,
                                   softmax_scale, extra_k_cache=None, extra_indices=None,
                                   extra_topk_length=None):
    out, lse = R.reference_sparse_decode(q, k_cache, indices, topk_length, attn_sink,
                                         softmax_scale, extra_k_cache, extra_indices,
                                         extra_topk_length)
    return out.to(torch.bfloat16), lse.float()
"""

RESULT_KEYS = {
    "shape": str,
    "kernel": str,
    "variant": str,
    "label": str,
    "phase": (str, type(None)),
    "phase_of": (str, type(None)),
    "status": str,
    "error": (str, type(None)),
    "accuracy": (dict, type(None)),
    "timing_method": (str, type(None)),
    "timing_note": (str, type(None)),
    "median_us": (float, type(None)),
    "p20_us": (float, type(None)),
    "p80_us": (float, type(None)),
    "gbs": (float, type(None)),
    "pct_copy_bw": (float, type(None)),
    "tflops": (float, type(None)),
    "x_floor": (float, type(None)),
}
SHAPE_KEYS = {
    "name": str,
    "batch": int,
    "heads": int,
    "topk": int,
    "page_size": int,
    "extra_topk": int,
    "extra_page_size": int,
    "sink": (bool, str),
    "lengths": str,
    "invalid": float,
    "pad": bool,
    "head_dim": int,
    "bytes": int,
    "flops": int,
    "floor_us": (float, type(None)),
}


def _types(obj: dict, spec: dict, where: str) -> None:
    assert set(spec) <= set(obj), f"{where}: missing {sorted(set(spec) - set(obj))}"
    for key, kind in spec.items():
        assert isinstance(obj[key], kind), f"{where}.{key}: {obj[key]!r} is not {kind}"


def assert_valid_result(data: dict) -> None:
    """Every field docs/bench-json.md promises, with its type, and the invariants between them
    (a failed entry is never presented as a time; an ok entry always has one)."""
    top = {
        "schema": str,
        "timestamp": str,
        "timing": str,
        "ok": bool,
        "exit_code": int,
        "device": dict,
        "copy_bandwidth": (dict, type(None)),
        "launch_floor": (dict, type(None)),
        "versions": dict,
        "host": str,
        "settings": dict,
        "kernels": list,
        "shapes": list,
        "results": list,
        "residency": (list, type(None)),
        "warm_entries": list,
    }
    _types(data, top, "result")
    assert data["schema"] == "kerneldev.bench/1"
    assert data["timing"] in ("cuda-graph", "cpu-wallclock")
    assert data["timestamp"].endswith("Z")
    _types(
        data["device"],
        {
            "type": str,
            "name": str,
            "capability": (str, type(None)),
            "sm_count": (int, type(None)),
            "memory_bytes": (int, type(None)),
            "driver": (str, type(None)),
            "cuda_visible_devices": (str, type(None)),
        },
        "device",
    )
    _types(
        data["versions"],
        {"python": str, "torch": str, "triton": str, "cuda": (str, type(None))},
        "versions",
    )
    _types(
        data["settings"],
        {
            "variants": list,
            "rotate": int,
            "warmup_ms": int,
            "rep_ms": int,
            "quantiles": list,
            "l2_flush": bool,
            "seed": int,
            "time_failed": bool,
            "phases": list,
            "env": dict,
            "interpreter_trims": bool,
            "argv": list,
            "smem_per_sm_kb": (int, type(None)),
            "warm_entry": bool,
        },
        "settings",
    )
    assert data["settings"]["warm_entry"] or not data["warm_entries"]
    for w in data["warm_entries"]:  # reported apart: never a result, never in `ok`
        _types(w, {"shape": str, "of": str, "status": str, "median_us": (float, type(None))},
               "warm_entries[]")  # fmt: skip
    for i, k in enumerate(data["kernels"]):
        _types(
            k,
            {
                "name": str,
                "path": str,
                "sha256": str,
                "size": int,
                "git_commit": (str, type(None)),
                "git_dirty": (bool, type(None)),
                "phase": (str, type(None)),
                "ablated_from": (str, type(None)),
            },
            f"kernels[{i}]",
        )
        assert len(k["sha256"]) == 64
    names = set()
    for i, s in enumerate(data["shapes"]):
        _types(s, SHAPE_KEYS, f"shapes[{i}]")
        names.add(s["name"])
    assert data["results"], "no results"
    for i, r in enumerate(data["results"]):
        _types(r, RESULT_KEYS, f"results[{i}]")
        assert r["shape"] in names
        assert r["status"] in ("ok", "failed", "error", "ablated")
        assert (r["status"] == "ablated") <= (r["phase"] is not None)  # only copies are ablated
        if r["status"] in ("ok", "ablated"):
            assert r["accuracy"]["ok"] is True or r["status"] == "ablated"
            assert r["median_us"] > 0 and r["p20_us"] <= r["p80_us"]
            assert r["timing_method"] in ("cuda-graph", "eager", "cpu-wallclock")
        if r["status"] == "error":
            assert r["error"] and r["median_us"] is None
        if r["accuracy"] is not None:
            assert isinstance(r["accuracy"]["sets"], list) and r["accuracy"]["sets"]
            assert all(isinstance(s["ok"], bool) for s in r["accuracy"]["sets"])
    assert data["ok"] == all(r["status"] in ("ok", "ablated") for r in data["results"])
    assert data["exit_code"] == (0 if data["ok"] else 1)


def run_harness(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    # 900 s: a hang guard only; the smoke run took 150 s at load 18 on 2 cores
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, str(HARNESS), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


# --- the real bundled kernel under the interpreter ------------------------------------------


def test_smoke_shapes_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "result.json"
    proc = run_harness(
        "--cpu-mode", "--shapes", "smoke", "--variants", "simt,mma", "--out", str(out)
    )
    data = json.loads(out.read_text())
    assert_valid_result(data)
    assert proc.returncode == data["exit_code"]
    assert data["timing"] == "cpu-wallclock"
    assert data["settings"]["env"]["TRITON_INTERPRET"] == "1"
    # the harness process applied kernels/interpreter_overhead.py (the installed triton has the
    # internals it expects; where a new triton does not, this names the trims to re-check)
    assert data["settings"]["interpreter_trims"] is True
    assert [s["name"] for s in data["shapes"]] == [s.name for s in harness.SHAPE_SETS["smoke"]]
    assert [(r["shape"], r["label"]) for r in data["results"]] == [
        (s.name, v) for s in harness.SHAPE_SETS["smoke"] for v in ("simt", "mma")
    ]
    assert all(len(r["accuracy"]["sets"]) == 3 for r in data["results"])  # --rotate default 3
    assert data["kernels"][0]["name"] == "bundled"
    assert data["kernels"][0]["git_commit"]  # the checkout's HEAD: the file lives in git
    # the interpreter runs no Gluon loop: said in the JSON, not as a note (times are moot)
    gluon = data["kernels"][0]["gluon"]
    assert gluon == {"available": False, "why_not": "the Triton interpreter runs no Gluon kernel"}
    assert data["notes"] == []
    bad = {(r["shape"], r["label"]): r["accuracy"] for r in data["results"] if r["status"] != "ok"}
    assert not bad, f"bundled kernel fails accuracy on CPU: {bad}"
    assert proc.returncode == 0
    # progress on stderr, the table on stdout
    assert "[4/4]" in proc.stderr
    assert "simt" in proc.stdout and "cpu-wallclock" in proc.stdout


def test_a_gpu_run_without_the_gluon_loops_says_so_under_the_table():
    """On a GPU whose Triton is not the one the Gluon loops are written for, the MMA variant
    runs its Triton loops: docs/benchmarks.md's numbers are not what ran, and the table says
    so (the interpreter's runs and files without the flag say nothing)."""
    off = {"available": False, "why_not": "Gluon kernel written for triton 3.6, not 3.8.0"}
    report = {
        "timing": "cuda-graph",
        "device": {"capability": "9.0"},
        "settings": {"variants": ["simt", "mma"], "configs": {}},
        "kernels": [
            {"name": "bundled", "phase": None, "gluon": off},
            {"name": "bundled@loop", "phase": "loop", "gluon": off},  # an ablated copy
            {"name": "other", "phase": None, "gluon": None},
            {"name": "on", "phase": None, "gluon": {"available": True, "why_not": None}},
        ],
    }
    assert harness.gluon_notes(report) == [
        "note: bundled: the MMA tile loops here are Triton's, not Gluon (Gluon kernel written "
        "for triton 3.6, not 3.8.0)"
    ]
    assert harness.gluon_notes({**report, "timing": "cpu-wallclock"}) == []
    simt_only = {**report, "settings": {"variants": ["simt"], "configs": {}}}
    assert harness.gluon_notes(simt_only) == []  # no MMA variant ran
    # with triton 3.6 on a GPU that is neither 9.x nor 12.x, the Triton loops run too
    b200 = {**report, "device": {"capability": "10.0"}}
    assert harness.gluon_notes(b200)[-1] == (
        "note: on: the MMA tile loops here are Triton's, not Gluon (compute capability 10.0: "
        "the Gluon loops run on 9.x and 12.x)"
    )
    report = {**report, "results": [], "notes": harness.gluon_notes(report)}
    assert harness.table(report).endswith(report["notes"][0])


def test_phases_time_ablated_copies_on_cpu(tmp_path):
    """--phases: the bundled file's ablated copies import and run under the interpreter, next
    to the real file on the same inputs, timed although wrong, marked ablated."""
    out = tmp_path / "result.json"
    proc = run_harness(
        "--cpu-mode", "--shapes", "smoke", "--variants", "simt,mma", "--rotate", "1",
        "--phases", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert_valid_result(data)
    phases = ["l2tile", "nomma", "nogather"]
    assert data["settings"]["phases"] == phases
    assert [(k["name"], k["phase"], k["ablated_from"]) for k in data["kernels"]] == [
        ("bundled", None, None),
        *((f"bundled@{p}", p, "bundled") for p in phases),
    ]
    smoke = [s.name for s in harness.SHAPE_SETS["smoke"]]
    # simt's loop is not ablated: only mma gets copies
    labels = ["simt", "mma", *(f"phase:{p}:mma" for p in phases)]
    assert [(r["shape"], r["label"]) for r in data["results"]] == [
        (s, label) for s in smoke for label in labels
    ]
    for r in data["results"]:
        if r["phase"] is None:
            assert r["status"] == "ok" and r["phase_of"] is None
        else:
            assert r["status"] == "ablated" and r["phase_of"] == "mma"
            assert r["kernel"] == f"bundled@{r['phase']}"
            assert r["median_us"] > 0
            assert r["accuracy"]["ok"] is False  # the substitution took effect
    assert [(row["shape"], row["label"]) for row in data["phases"]] == [(s, "mma") for s in smoke]
    assert all(row[f"{p}_us"] > 0 for row in data["phases"] for p in ["full", *phases])
    # the phase table is printed last
    last = proc.stdout.strip().splitlines()
    assert last[-2].startswith("l2tile: every tile gathers the same slots")
    assert last[-1].startswith("full-X: the time removing X saved")
    assert "full-l2tile" in last[-5] and "full-nomma" in last[-5]


# --- failure paths, with fast fake kernels --------------------------------------------------


def test_wrong_kernel_is_recorded_failed_and_not_timed(tmp_path):
    fake, old = tmp_path / "fake.py", tmp_path / "old.py"
    fake.write_text(FAKE_KERNEL)
    old.write_text(OLD_KERNEL)
    out = tmp_path / "r.json"
    proc = run_harness(
        "--cpu-mode",
        "--shapes",
        TINY,
        "--rotate",
        "2",
        "--kernel",
        f"fake={fake}",
        "--kernel",
        f"old={old}",
        "--variants",
        "simt,mma,boom,dispatch",
        "--out",
        str(out),
    )
    assert proc.returncode == 1, proc.stderr
    data = json.loads(out.read_text())
    assert_valid_result(data)
    by = {r["label"]: r for r in data["results"]}
    assert by["fake:simt"]["status"] == "ok" and by["fake:dispatch"]["status"] == "ok"
    wrong = by["fake:mma"]
    assert wrong["status"] == "failed"
    assert wrong["median_us"] is None and wrong["gbs"] is None  # never timed, never a speed-up
    assert not wrong["accuracy"]["ok"]
    assert all(not s["out_allclose_ok"] for s in wrong["accuracy"]["sets"])
    assert by["fake:boom"]["status"] == "error" and "kaboom" in by["fake:boom"]["error"]
    # a file without variant= runs as dispatch; simt on it says what to do
    assert by["old:dispatch"]["status"] == "ok"
    assert by["old:simt"]["status"] == "error" and "--variants dispatch" in by["old:simt"]["error"]
    assert "FAILED accuracy" in proc.stderr and "FAIL" in proc.stdout
    assert data["ok"] is False


# Logs each call's module and variant to the file named by $CALL_LOG, then answers correctly.
LOGGING_KERNEL = """
import os
import torch
import dsv4_reference as R

def flash_mla_sparse_decode_triton(q, k_cache, indices, topk_length, attn_sink, head_dim_v,
                                   softmax_scale, extra_k_cache=None, extra_indices=None,
                                   extra_topk_length=None, *, variant=None):
    with open(os.environ["CALL_LOG"], "a") as log:
        log.write(f"{__name__} {variant}\\n")
    if variant == "boom":
        raise RuntimeError("kaboom")
    out, lse = R.reference_sparse_decode(q, k_cache, indices, topk_length, attn_sink,
                                         softmax_scale, extra_k_cache, extra_indices,
                                         extra_topk_length)
    return out.to(torch.bfloat16), lse.float()
"""


def test_warm_entry_runs_a_second_import_of_the_first_entry_and_reports_it_apart(tmp_path):
    """--warm-entry (on by default with CUDA): on every shape, before the entries, the first
    entry's kernel file imported once more and run with its variant; its time goes into
    `warm_entries`, never into the results, the table or the exit status."""
    kernel, log = tmp_path / "k.py", tmp_path / "calls.log"
    kernel.write_text(LOGGING_KERNEL)
    out = tmp_path / "r.json"
    two = f"{TINY};B=2,H=16,topk=16,page=16"
    res = subprocess.run(
        [sys.executable, str(HARNESS), "--cpu-mode", "--warm-entry", "--shapes", two,
         "--rotate", "1", "--kernel", f"a={kernel}", "--kernel", f"b={kernel}",
         "--variants", "simt,mma", "--out", str(out)],
        capture_output=True, text=True, timeout=900, cwd=REPO,
        env={**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
             "CALL_LOG": str(log)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(out.read_text())
    assert_valid_result(data)
    assert data["settings"]["warm_entry"] is True
    assert len(data["results"]) == 2 * 2 * 2  # shapes x files x variants: no warm-up among them
    assert [(w["shape"], w["of"], w["status"]) for w in data["warm_entries"]] == [
        (s["name"], "a:simt", "ok") for s in data["shapes"]
    ]
    # per shape: the warm-up (its own module) first, then a and b as always
    calls = log.read_text().split("\n")[:-1]
    modules = [line.split()[0] for line in calls]
    warm = [m for m in modules if "_warm_" in m]
    assert len(set(warm)) == 1 and warm[0] not in {m for m in modules if "_warm_" not in m}
    assert [line.split()[1] for line in calls] == ["simt", "simt", "mma", "simt", "mma"] * 2
    assert modules[0] == modules[5] == warm[0]
    assert "[warm-up]" in res.stderr and "warm-up" not in res.stdout  # progress, not the table


def test_warm_up_goes_on_to_the_next_entry_while_one_is_not_timed(tmp_path):
    """The slow mode is the first timed entry's: where the first entry raises (or fails
    accuracy, so is never timed), the next one is warmed up too, and so on until one is."""
    kernel, log = tmp_path / "k.py", tmp_path / "calls.log"
    kernel.write_text(LOGGING_KERNEL)
    out = tmp_path / "r.json"
    res = subprocess.run(
        [sys.executable, str(HARNESS), "--cpu-mode", "--warm-entry", "--shapes", TINY,
         "--rotate", "1", "--kernel", f"a={kernel}", "--variants", "boom,simt,mma",
         "--out", str(out)],
        capture_output=True, text=True, timeout=900, cwd=REPO,
        env={**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
             "CALL_LOG": str(log)},
    )  # fmt: skip
    assert res.returncode == 1, res.stderr[-2000:]  # boom is an error entry: the run fails
    data = json.loads(out.read_text())
    assert_valid_result(data)
    assert [(w["of"], w["status"]) for w in data["warm_entries"]] == [
        ("boom", "error"),
        ("simt", "ok"),
    ]
    calls = [line.split()[1] for line in log.read_text().split("\n")[:-1]]
    assert calls == ["boom", "simt", "boom", "simt", "mma"]


def test_no_warm_entry_on_the_interpreter_unless_asked(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE_KERNEL)
    out = tmp_path / "r.json"
    proc = run_harness("--cpu-mode", "--shapes", TINY, "--rotate", "1", "--kernel",
                       f"fake={fake}", "--variants", "simt", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["settings"]["warm_entry"] is False and data["warm_entries"] == []


def test_time_failed_still_reports_failed(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE_KERNEL)
    out = tmp_path / "r.json"
    proc = run_harness(
        "--cpu-mode",
        "--shapes",
        TINY,
        "--rotate",
        "1",
        "--kernel",
        f"fake={fake}",
        "--variants",
        "mma",
        "--time-failed",
        "--out",
        str(out),
    )
    assert proc.returncode == 1
    (entry,) = json.loads(out.read_text())["results"]
    assert entry["status"] == "failed" and entry["median_us"] is not None


@pytest.mark.parametrize(
    "spec, message",
    [
        ("B=1,topk=x", "topk must be a positive integer"),
        ("B=0,topk=16", "B must be a positive integer"),
        ("H=64,topk=16", "B= is required"),
        ("B=1,topk=16,pages=4", "unknown field 'pages=4'"),
        ("B=1,topk=16,lengths=some", "lengths must be one of"),
        ("issue5", "unknown shape set 'issue5'"),
    ],
)
def test_bad_shape_spec_is_one_clear_line(spec, message, tmp_path):
    proc = run_harness("--cpu-mode", "--shapes", spec, "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsv4_bench.py: error: "), proc.stderr
    assert message in lines[0]
    assert not (tmp_path / "r.json").exists()


def test_a_bad_out_path_is_one_clear_line_before_anything_runs(tmp_path):
    """--out a folder, '' or a file that cannot be replaced once ran the whole benchmark, then
    died with a traceback and left `DIR.tmp` beside the target."""
    folder = tmp_path / "results"
    folder.mkdir()
    cases = [
        (str(folder), "is a folder"),
        ("", "--out is empty"),
        (str(tmp_path / "missing" / "r.json"), "its folder does not exist"),
    ]
    if os.access("/proc", os.F_OK):
        cases.append(("/proc/version", "cannot write in /proc"))
    for out, message in cases:
        proc = run_harness("--cpu-mode", "--shapes", TINY, "--out", out)
        assert proc.returncode == 2, (out, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dsv4_bench.py: error: "), proc.stderr
        assert message in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]  # no results.tmp
    assert list(folder.iterdir()) == []
    # A target that turns into a folder during the run: an error, and no temporary file left.
    with pytest.raises(harness.HarnessError, match="cannot write --out"):
        harness.write_json(folder, {"ok": True})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]


def test_kernel_file_that_does_not_import(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def flash_mla_sparse_decode_triton(:\n")
    proc = run_harness("--cpu-mode", "--shapes", TINY, "--kernel", f"live={broken}")
    assert proc.returncode == 3
    assert f"cannot import kernel file {broken}: SyntaxError" in proc.stderr
    proc = run_harness("--cpu-mode", "--shapes", TINY, "--kernel", f"live={tmp_path}/nope.py")
    assert proc.returncode == 3 and "kernel file not found" in proc.stderr
    proc = run_harness("--cpu-mode", "--shapes", TINY, "--kernel", "no-equals-sign")
    assert proc.returncode == 2 and "expected NAME=PATH" in proc.stderr


def test_no_cuda_is_an_environment_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    proc = run_harness("--device", "cuda", "--shapes", TINY)
    assert proc.returncode == 3
    assert "no CUDA device visible" in proc.stderr and "--cpu-mode" in proc.stderr


# --- shapes and roofline (no subprocess) ----------------------------------------------------


def test_issue4_shapes_and_their_floor():
    shapes = harness.parse_shapes(["issue4"])
    assert [s.name for s in shapes] == [
        "B1 topk2048",
        "B64 topk2048",
        "B128 topk2048",
        "B1 main128/p256+extra512/p64",
        "B64 main128/p256+extra512/p64",
        "B128 main128/p256+extra512/p64",
        "B64 H128 topk512",
    ]
    # issue 4's floor column at its measured 3016 GB/s copy bandwidth
    floors = [s.min_bytes() / (3016 * 1e3) for s in shapes]
    assert [round(f, 1) for f in floors] == [0.4, 28.3, 56.7, 0.2, 10.8, 21.5, 12.0]
    assert shapes[1].flops() == 64 * 4 * 64 * 2048 * 512


def test_shape_specs_parse_and_deduplicate():
    shapes = harness.parse_shapes(
        [
            "B=2,H=128,topk=64,page=32,extra_topk=16,extra_page=16,sink=1;smoke",
            "B=2,H=128,topk=64,page=32,extra_topk=16,extra_page=16,sink=1",
        ]
    )
    assert len(shapes) == 1 + len(harness.SHAPE_SETS["smoke"])
    first = shapes[0]
    assert (first.batch, first.heads, first.topk, first.page_size) == (2, 128, 64, 32)
    assert (first.extra_topk, first.extra_page_size, first.sink) == (16, 16, True)
    assert first.name == "B2 H128 main64/p32+extra16/p16 sink"


def test_the_cli_help_names_every_shape_set_and_key_the_harness_takes():
    """`bench --help` / `watch --help` spell the sets and keys out (no harness import for
    --help): they must be what the harness parses, aliases (issue4, batch, ...) aside."""
    from kerneldev.cli.common import SHAPE_KEYS, SHAPE_SET_NAMES

    assert set(SHAPE_SET_NAMES) == set(harness.SHAPE_SETS) - {"issue4"}
    fields = {harness._SPEC_KEYS[key.lower()] for key in SHAPE_KEYS}
    assert fields == set(harness._SPEC_KEYS.values())


# --- on a GPU (skipped in CI): the CUDA-graph timing path -----------------------------------


@pytest.mark.gpu
def test_cuda_graph_timing_on_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "r.json"
    proc = run_harness(
        "--shapes",
        "B=2,H=64,topk=256;B=2,H=64,topk=64,page=256,extra_topk=128,sink=1,lengths=partial",
        "--variants",
        "simt,mma,dispatch",
        "--rotate",
        "2",
        "--rep",
        "20",
        "--out",
        str(out),
        timeout=600,
    )
    data = json.loads(out.read_text())
    assert_valid_result(data)
    assert proc.returncode == 0, proc.stderr
    assert data["timing"] == "cuda-graph" and data["settings"]["l2_flush"] is True
    assert data["device"]["type"] == "cuda" and data["device"]["sm_count"] > 0
    assert data["copy_bandwidth"]["gbs"] > 100
    floor = data["launch_floor"]  # a 4-byte fill timed as the entries: under every entry
    assert floor["error"] is None and 0 < floor["median_us"] < min(
        r["median_us"] for r in data["results"] if r["median_us"]
    )
    for shape in data["shapes"]:
        assert shape["floor_us"] > 0
    for r in data["results"]:
        assert r["timing_method"] == "cuda-graph", r["timing_note"]
        assert r["median_us"] > 0 and r["p20_us"] <= r["median_us"] <= r["p80_us"]
        assert r["gbs"] > 0 and r["pct_copy_bw"] > 0 and r["x_floor"] > 0 and r["tflops"] > 0
