"""`kerneldev bench` as a user runs it: the harness uploaded into a temporary folder on the host,
run there under the Triton interpreter (--cpu), its JSON saved next to hosts.yaml, the table
or --json printed; on the local transport and over a real sshd on 127.0.0.1.

Timings on the CPU are the interpreter's and meaningless, so the --compare verdicts are tested
against baseline files crafted with fake timings; that is the only place fake timings appear
(section "fake timings" below).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from kerneldev.bench import kernel_bench as bench
from kerneldev.errors import UsageError
from kerneldev.sandbox.host import find_sshd
from tests.clirun import run_kerneldev
from tests.sshutil import ssh_entry
from tests.test_bench_harness import FAKE_KERNEL, TINY, assert_valid_result

REPO = Path(__file__).resolve().parent.parent
# The quickest real bench: the smoke shapes, once each, under the Triton interpreter.
SMOKE_ON_CPU = ("bench", "--cpu", "--shapes", "smoke", "--rotate", "1")
KERNEL = "python/sglang/srt/layers/attention/flash_mla_sm120_triton.py"


def write_config(tmp_path: Path, transport: str = "local", server=None, **host) -> Path:
    """hosts.yaml with one host `gpu1`; `python` is this interpreter (it has torch/triton)."""
    root = tmp_path / "live"
    (root / KERNEL).parent.mkdir(parents=True, exist_ok=True)
    entry: dict = {"transport": transport}
    if transport == "ssh":
        entry.update(ssh_entry(server, tmp_path))
    entry.update(root=str(root), files=[KERNEL], workspace="ws", python=sys.executable)
    entry.update(host)
    config = tmp_path / "cfg" / "hosts.yaml"
    config.parent.mkdir(exist_ok=True)
    config.write_text(yaml.safe_dump({"default": "gpu1", "hosts": {"gpu1": entry}}))
    return config


def kerneldev(config: Path, *args: str, env: dict | None = None, timeout: float = 180):
    """`python -m kerneldev --config CONFIG ARGS`, from another folder than the config's."""
    return run_kerneldev("--config", str(config), *args, env=env, timeout=timeout)


def saved_path(stderr: str) -> Path:
    lines = [line for line in stderr.splitlines() if line.startswith("saved: ")]
    assert lines, stderr
    return Path(lines[-1].removeprefix("saved: ").strip())


@pytest.fixture(autouse=True)
def _isolated(isolated_home, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


# --- end to end: the bundled kernel under the interpreter -----------------------------------


def test_bench_cpu_smoke_on_the_local_transport(tmp_path):
    config = write_config(tmp_path)
    host_tmp = tmp_path / "host-tmp"  # the "host's" $TMPDIR: the harness's folder goes here
    host_tmp.mkdir()
    proc = kerneldev(config, *SMOKE_ON_CPU, env={"TMPDIR": str(host_tmp)})
    assert proc.returncode == 0, proc.stdout + proc.stderr

    saved = saved_path(proc.stderr)
    assert saved.parent == config.parent / ".kerneldev" / "results"  # next to hosts.yaml
    assert saved.name.endswith("-gpu1.json")
    data = json.loads(saved.read_text())
    assert_valid_result(data)
    assert data["ok"] and data["timing"] == "cpu-wallclock"
    assert data["settings"]["interpreter_trims"] is True  # shipped with the harness, applied
    assert data["kerneldev"]["source"] == "bundled"
    assert data["kerneldev"]["kernel_file"].endswith("kernels/flash_mla_sm120_triton.py")
    bundled = (REPO / "kernels" / "flash_mla_sm120_triton.py").read_bytes()
    assert data["kernels"][0]["sha256"] == hashlib.sha256(bundled).hexdigest()

    # the table: every shape and variant, accuracy, the A/B ratio and its geometric mean
    for shape in data["shapes"]:
        assert shape["name"] in proc.stdout
    assert "vs simt" in proc.stdout and "geomean mma vs simt" in proc.stdout
    assert "FAILED" not in proc.stdout
    assert list(host_tmp.iterdir()) == []  # the temporary folder is gone


@pytest.mark.ssh
def test_bench_cpu_smoke_over_ssh_with_json(tmp_path, sshd_server):
    if find_sshd() is None:
        pytest.skip("sshd is not installed")
    config = write_config(tmp_path, "ssh", sshd_server)
    proc = kerneldev(config, *SMOKE_ON_CPU, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    report = json.loads(proc.stdout)  # stdout is the JSON and nothing else
    assert set(report) == {"result", "saved_to", "ab", "comparison"}
    data = report["result"]
    assert_valid_result(data)
    assert data["kerneldev"]["host"] == "gpu1"
    assert data["settings"]["interpreter_trims"] is True  # the trims travelled over ssh too
    assert json.loads(Path(report["saved_to"]).read_text()) == data
    assert report["ab"]["baseline_label"] == "simt"
    assert len(report["ab"]["ratios"]) == len(data["shapes"])
    assert report["comparison"] is None
    # the harness ran from a temporary folder on the host, removed afterwards
    remote_dir = Path(data["kernels"][0]["path"]).parent
    assert remote_dir.name.startswith("kerneldev-bench.") and not remote_dir.exists()


def test_only_a_skipped_variant_is_a_failure_not_an_empty_table(tmp_path):
    """`--variants flashinfer` where FlashInfer is not installed times nothing: exit 1 with the
    skip's reason (JSON too), and no result saved that a later --compare would read."""
    pytest.importorskip("torch")
    if importlib.util.find_spec("flashinfer") is not None:
        pytest.skip("FlashInfer is installed here")
    config = write_config(tmp_path)
    proc = kerneldev(config, *SMOKE_ON_CPU, "--variants", "flashinfer", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert "every variant asked for was skipped" in error["message"]
    assert "flashinfer: FlashInfer is not installed" in error["message"]
    assert not (config.parent / ".kerneldev" / "results").exists()


# --- sources, failures and errors, with a fast fake kernel ----------------------------------


def test_live_and_workspace_sources_and_a_failing_variant(tmp_path):
    config = write_config(tmp_path)
    live = tmp_path / "live" / KERNEL
    live.write_text(FAKE_KERNEL)  # its `mma` is deliberately wrong
    proc = kerneldev(config, "bench", "--cpu", "--source", "live", "--shapes", TINY, "--json")
    assert proc.returncode == 1, proc.stderr  # a variant failed accuracy
    data = json.loads(proc.stdout)["result"]
    assert data["kernels"][0]["path"] == str(live)  # imported where it lies, not uploaded
    status = {r["label"]: r["status"] for r in data["results"]}
    assert status == {"simt": "ok", "mma": "failed"}
    assert json.loads(proc.stdout)["ab"]["geomean"] == {"mma": None}  # no ratio for a failure
    assert "failed accuracy or did not run: B1 H16 topk16/p16 mma" in proc.stderr

    # workspace: not pulled yet -> a clear error; then the workspace copy is uploaded
    proc = kerneldev(config, "bench", "--cpu", "--source", "workspace", "--shapes", TINY)
    assert proc.returncode == 1
    assert "no flash_mla_sm120_triton.py in the workspace" in proc.stderr
    assert "kerneldev pull" in proc.stderr
    ws = config.parent / "ws" / KERNEL
    ws.parent.mkdir(parents=True)
    ws.write_text(FAKE_KERNEL)
    proc = kerneldev(
        config,
        "bench",
        "--cpu",
        "--source",
        "workspace",
        "--variants",
        "dispatch",
        "--shapes",
        TINY,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(saved_path(proc.stderr).read_text())
    assert data["kerneldev"]["kernel_file"] == str(ws)
    assert data["kernels"][0]["path"] != str(ws)  # a copy in the host's temporary folder


# A kernel file whose call without `variant=` picks by the service's switch, as the real one
# does at import: its MMA is wrong, so `dispatch` fails accuracy exactly when it ran MMA.
SWITCHED_KERNEL = FAKE_KERNEL.replace(
    '    if variant == "boom":',
    "    import os\n"
    "    if variant is None and os.environ.get('SGLANG_SM120_MMA_FLASHMLA') == '1':\n"
    "        variant = 'mma'\n"
    '    if variant == "boom":',
)


def test_dispatch_runs_under_the_service_env_files_kernel_switches(tmp_path):
    env_file = tmp_path / "svc.env"
    env_file.write_text("SGLANG_SM120_MMA_FLASHMLA=1 # mma\nOTHER=x\n")
    service = {"restart": "true", "health": "true", "env_file": str(env_file)}
    config = write_config(tmp_path, service=service)
    (tmp_path / "live" / KERNEL).write_text(SWITCHED_KERNEL)
    args = ("bench", "--cpu", "--source", "live", "--variants", "dispatch", "--shapes", TINY)
    proc = kerneldev(config, *args)
    assert proc.returncode == 1, proc.stderr  # dispatch ran MMA (wrong in this file)
    data = json.loads(saved_path(proc.stderr).read_text())
    assert data["settings"]["env"]["SGLANG_SM120_MMA_FLASHMLA"] == "1"
    assert data["kerneldev"]["service_env"]["variables"] == {"SGLANG_SM120_MMA_FLASHMLA": "1"}
    assert "line 1" in data["kerneldev"]["service_env"]["warnings"][0]
    assert f"{env_file}: line 1" in proc.stderr  # the reading was ambiguous: shown

    env_file.write_text("SGLANG_SM120_MMA_FLASHMLA=0\n")
    proc = kerneldev(config, *args)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(saved_path(proc.stderr).read_text())
    assert data["settings"]["env"]["SGLANG_SM120_MMA_FLASHMLA"] == "0"
    assert "SGLANG_SM120_MMA_FLASHMLA=0 " in data["kerneldev"]["command"]

    # A switch the env file does not set is not taken from the caller's (the login's)
    # environment: the service does not run with it.
    env_file.write_text("OTHER=x\n")
    proc = kerneldev(config, *args, env={"SGLANG_SM120_MMA_FLASHMLA": "1"})
    assert proc.returncode == 0, proc.stderr  # SIMT, the kernel's default: right
    data = json.loads(saved_path(proc.stderr).read_text())
    assert data["settings"]["env"]["SGLANG_SM120_MMA_FLASHMLA"] is None


def test_dispatch_with_an_env_file_not_created_yet_runs_as_kernels_status_reads_it(tmp_path):
    """A configured env file that does not exist (its folder does: `bench --service` creates
    it) is read as `kernels status` and the import check read it: the login environment's
    switches, with a warning. A path whose folder does not exist either (a typo) stops the
    run with the file named, as an unreadable file does."""
    env_file = tmp_path / "svc.env"
    service = {"restart": "true", "health": "true", "env_file": str(env_file)}
    config = write_config(tmp_path, service=service)
    (tmp_path / "live" / KERNEL).write_text(SWITCHED_KERNEL)
    args = ("bench", "--cpu", "--source", "live", "--variants", "dispatch", "--shapes", TINY)
    proc = kerneldev(config, *args, env={"SGLANG_SM120_MMA_FLASHMLA": "1"})
    assert proc.returncode == 1, proc.stderr  # the login's switch: MMA ran (wrong here)
    assert "Traceback" not in proc.stderr
    assert f"{env_file}: does not exist on gpu1: dispatch ran under the login" in proc.stderr
    data = json.loads(saved_path(proc.stderr).read_text())
    assert data["settings"]["env"]["SGLANG_SM120_MMA_FLASHMLA"] == "1"
    assert data["kerneldev"]["service_env"]["variables"] is None
    assert not env_file.exists()  # nothing created

    proc = kerneldev(config, *args)  # the login environment without the switch: SIMT
    assert proc.returncode == 0, proc.stderr

    typo = tmp_path / "no-such-folder" / "svc.env"
    data = yaml.safe_load(config.read_text())
    data["hosts"]["gpu1"]["service"]["env_file"] = str(typo)
    config.write_text(yaml.safe_dump(data))
    proc = kerneldev(config, *args, "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["message"].startswith("cannot read service.env_file: ")
    assert error["message"].count(str(typo)) == 1 and "gpu1" in error["message"]  # once each
    assert "kerneldev doctor" in error["hint"]


@pytest.mark.parametrize("blocker", [".kerneldev", ".kerneldev/results"])
def test_a_result_that_cannot_be_saved_is_still_shown_then_an_error(tmp_path, blocker):
    """A file where the results folder should be: the finished run is not lost. The table (or
    the JSON, with an `error` object) comes first, then one error line naming the folder."""
    config = write_config(tmp_path)
    (tmp_path / "live" / KERNEL).write_text(FAKE_KERNEL)
    in_the_way = config.parent / blocker
    in_the_way.parent.mkdir(parents=True, exist_ok=True)
    in_the_way.touch()
    args = ("bench", "--cpu", "--source", "live", "--variants", "simt", "--shapes", TINY)
    proc = kerneldev(config, *args, "--rotate", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "B1 H16 topk16/p16" in proc.stdout  # the table
    results = config.parent / ".kerneldev" / "results"
    assert f"kerneldev: error: cannot save the result to {results}: " in proc.stderr
    assert "hint: the result is printed but not saved" in proc.stderr
    assert "saved: " not in proc.stderr

    proc = kerneldev(config, *args, "--rotate", "1", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)  # one document: the result and the error
    assert report["result"]["results"][0]["status"] == "ok" and report["saved_to"] is None
    assert report["error"]["message"].startswith(f"cannot save the result to {results}: ")
    assert in_the_way.is_file()


def test_a_kernel_file_that_does_not_import_is_named_as_the_user_knows_it(tmp_path):
    """A syntax error or a missing entry point names the workspace / live file (not the
    deleted temporary copy) with a hint to fix it, not the one about torch and triton."""
    config = write_config(tmp_path)
    ws = config.parent / "ws" / KERNEL
    ws.parent.mkdir(parents=True)
    ws.write_text("def flash_mla_sparse_decode_triton(:\n")
    proc = kerneldev(config, "bench", "--cpu", "--source", "workspace", "--shapes", TINY)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot import kernel file {ws}: SyntaxError" in proc.stderr
    assert "kerneldev-bench." not in proc.stderr  # the temporary copy is gone: not named
    assert f"hint: fix {ws} (your workspace copy)" in proc.stderr
    assert "torch and triton" not in proc.stderr and "Traceback" not in proc.stderr

    ws.write_text("def something_else():\n    pass\n")
    proc = kerneldev(config, "bench", "--cpu", "--source", "workspace", "--shapes", TINY)
    assert proc.returncode == 1, proc.stderr
    assert f"{ws} has no function flash_mla_sparse_decode_triton()" in proc.stderr
    assert "define flash_mla_sparse_decode_triton()" in proc.stderr
    assert "torch and triton" not in proc.stderr

    live = tmp_path / "live" / KERNEL
    live.write_text("import no_such_module_here\n")
    proc = kerneldev(config, "bench", "--cpu", "--source", "live", "--shapes", TINY)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot import kernel file {live}: ModuleNotFoundError" in proc.stderr
    assert "kerneldev push --host gpu1" in proc.stderr
    assert "install the module it imports" in proc.stderr


def test_a_group_bench_prints_each_hosts_table_under_its_name(tmp_path):
    """Two hosts of a group: each table on stdout is headed by its host's name (the `saved:`
    lines are on stderr), so output saved to a file still says which host measured what."""
    config = write_config(tmp_path)
    data = yaml.safe_load(config.read_text())
    for name in ("gpu1", "gpu2"):
        root = tmp_path / f"live-{name}"
        (root / KERNEL).parent.mkdir(parents=True)
        (root / KERNEL).write_text(FAKE_KERNEL)  # its simt is right and fast
        data["hosts"][name] = dict(data["hosts"]["gpu1"], root=str(root), workspace=f"ws-{name}")
    data["groups"] = {"pair": ["gpu1", "gpu2"]}
    config.write_text(yaml.safe_dump(data))
    args = ("bench", "--host", "pair", "--cpu", "--source", "live", "--variants", "simt")
    proc = kerneldev(config, *args, "--shapes", TINY, "--rotate", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    first, second = lines.index("gpu1:"), lines.index("gpu2:")
    assert first < second
    assert any("B1 H16 topk16/p16" in line for line in lines[first:second])
    assert any("B1 H16 topk16/p16" in line for line in lines[second:])
    assert "gpu1: saved: " in proc.stderr and "gpu2: saved: " in proc.stderr


def test_bad_request_is_refused_before_connecting(tmp_path):
    # Nothing listens on port 1: a connection attempt would fail differently.
    config = write_config(tmp_path, "ssh", _NoServer(), port=1)
    proc = kerneldev(config, "bench", "--shapes", "B=1,H=64")
    assert proc.returncode == 2
    assert "topk= is required" in proc.stderr and "Traceback" not in proc.stderr
    proc = kerneldev(config, "bench", "--variants", "mma;rm -rf /")
    assert proc.returncode == 2 and "bad variant name" in proc.stderr
    proc = kerneldev(config, "bench", "--source", "elsewhere")
    assert proc.returncode == 2 and "unknown --source" in proc.stderr


def test_host_python_without_torch_or_missing(tmp_path):
    # -S: no site-packages, so no torch - what a host's bare system python looks like
    config = write_config(tmp_path, python=f"{sys.executable} -S")
    proc = kerneldev(config, "bench", "--cpu", "--shapes", TINY)
    assert proc.returncode == 1
    assert "cannot import torch/triton" in proc.stderr
    assert "`python:`" in proc.stderr and "Traceback" not in proc.stderr

    config = write_config(tmp_path, python="/nonexistent/python3")
    proc = kerneldev(config, "bench", "--cpu", "--shapes", TINY)
    assert proc.returncode == 1
    assert "cannot run the host's python" in proc.stderr and "`python:`" in proc.stderr


class _NoServer:
    host_key_line = "[127.0.0.1]:1 ssh-ed25519 " + "A" * 68 + "\n"  # never used: no connect
    port = 1
    user = "nobody"
    client_key = Path("/nonexistent/key")


# --- fake timings: crafted baselines for --compare (only here) ------------------------------


def _entry(shape: str, label: str, median: float, p20: float, p80: float, status: str = "ok"):
    return {
        "shape": shape,
        "kernel": "bundled",
        "variant": label,
        "label": label,
        "status": status,
        "error": None,
        "accuracy": {"ok": status == "ok", "sets": [{"ok": status == "ok"}]},
        "timing_method": "cuda-graph",
        "timing_note": None,
        "median_us": median if status == "ok" else None,
        "p20_us": p20 if status == "ok" else None,
        "p80_us": p80 if status == "ok" else None,
        "gbs": None,
        "pct_copy_bw": None,
        "tflops": None,
        "x_floor": None,
    }


def _fake_result(entries: list[dict], device: str = "NVIDIA H200") -> dict:
    return {
        "schema": bench.SCHEMA,
        "timestamp": "2026-11-29T19:00:00Z",
        "timing": "cuda-graph",
        "ok": all(e["status"] == "ok" for e in entries),
        "device": {"name": device},
        "results": entries,
    }


def _set_label_list(data):
    data["results"][0]["label"] = ["simt"]


def _set_device_string(data):
    data["device"] = "H200"


def _set_median_infinity(data):
    data["results"][0]["median_us"] = float("inf")


def _set_p80_nan(data):
    data["results"][0]["p80_us"] = float("nan")


@pytest.mark.parametrize(
    ("spoil", "named"),
    [
        (_set_label_list, "results[0].label must be a string, not a list"),
        (_set_device_string, "'device' must be an object, not a string"),
        (_set_median_infinity, "results[0].median_us must be a finite number or null"),
        (_set_p80_nan, "results[0].p80_us must be a finite number or null"),
    ],
)
def test_a_baseline_with_odd_types_exits_2_naming_the_field_before_connecting(
    tmp_path, spoil, named
):
    """Such a baseline once crashed after the run (unhashable label, `.get` on a string) or
    made --json print Infinity; it is refused like any bad --compare file."""
    baseline = _fake_result([_entry("S1", "simt", 100, 95, 105)])
    spoil(baseline)
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(baseline))  # Python writes Infinity/NaN, as a hand edit may
    with pytest.raises(UsageError, match=re.escape(named)):
        bench.load_result(path)
    # Nothing listens on port 1: a connection attempt would fail differently (exit 3).
    config = write_config(tmp_path, "ssh", _NoServer(), port=1)
    proc = kerneldev(config, "bench", "--compare", str(path), "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"kerneldev: error: {path}: {named}" in proc.stderr
    assert json.loads(proc.stdout)["error"]["code"] == 2


def test_compare_verdicts_from_the_spread():
    baseline = _fake_result(
        [
            _entry("S1", "mma", 100, 95, 105),
            _entry("S2", "mma", 100, 95, 105),
            _entry("S3", "mma", 100, 95, 105),
            _entry("S4", "mma", 100, 95, 105),
            _entry("S5", "mma", 100, 95, 105),
            _entry("S6", "mma", 100, 95, 105, status="failed"),
        ]
    )
    current = _fake_result(
        [
            _entry("S1", "mma", 50, 48, 52),  # well below the baseline's spread: faster
            _entry("S2", "mma", 200, 190, 210),  # slower
            _entry("S3", "mma", 97, 90, 95),  # touches p20 = 95: inside the spread
            _entry("S4", "mma", 101, 99, 104),  # overlaps: no change
            _entry("S5", "mma", 1, 1, 1, status="failed"),  # "1 µs" but wrong: never faster
            _entry("S6", "mma", 100, 95, 105),
            _entry("S7", "mma", 100, 95, 105),  # not in the baseline
        ]
    )
    result = bench.compare(current, baseline, "base.json")
    verdicts = {c.shape: c.verdict for c in result.changes}
    assert verdicts == {
        "S1": "faster",
        "S2": "slower",
        "S3": "no change",
        "S4": "no change",
        "S5": "failed",
        "S6": "baseline failed",
        "S7": "new",
    }
    s1 = next(c for c in result.changes if c.shape == "S1")
    assert s1.speedup == pytest.approx(2.0)
    assert next(c for c in result.changes if c.shape == "S5").speedup is None
    # geometric mean over shapes with a time on both sides: S1 2x, S2 0.5x, S3, S4
    assert result.geomean["mma"] == pytest.approx((2.0 * 0.5 * 100 / 97 * 100 / 101) ** 0.25)
    assert result.warnings == []
    other = bench.compare(current, _fake_result(baseline["results"], device="NVIDIA H100"))
    assert any("different devices" in w for w in other.warnings)


def test_ab_ratios_and_geometric_mean():
    data = _fake_result(
        [
            _entry("S1", "simt", 1000, 990, 1010),
            _entry("S1", "mma", 10, 9, 11),
            _entry("S2", "simt", 400, 390, 410),
            _entry("S2", "mma", 40, 39, 41),
            _entry("S3", "simt", 400, 390, 410),
            _entry("S3", "mma", 1, 1, 1, status="failed"),
        ]
    )
    ab = bench.ab_summary(data)
    assert ab.baseline_label == "simt"
    assert {(r.shape, r.speedup) for r in ab.ratios} == {("S1", 100.0), ("S2", 10.0), ("S3", None)}
    assert ab.geomean["mma"] == pytest.approx((100.0 * 10.0) ** 0.5)


def test_cli_compare_marks_each_shape(tmp_path):
    config = write_config(tmp_path)
    (tmp_path / "live" / KERNEL).write_text(FAKE_KERNEL)
    shapes = "B=1,H=16,topk=16,page=16;B=2,H=16,topk=16,page=16;B=1,H=16,topk=32,page=16"
    base_args = ("bench", "--cpu", "--source", "live", "--shapes", shapes, "--rotate", "1")
    first = kerneldev(config, *base_args)
    assert first.returncode == 1  # mma is wrong
    measured = json.loads(saved_path(first.stderr).read_text())
    names = [s["name"] for s in measured["shapes"]]

    # Fake timings: a baseline 1000x slower on the first shape, 1000x faster on the second,
    # with a spread covering any time on the third; mma's baseline is fast and passing, so
    # only the failure rule keeps the failing mma from being called faster.
    baseline = copy.deepcopy(measured)
    for r in baseline["results"]:
        if r["label"] == "mma":
            r.update(status="ok", median_us=1e9, p20_us=1e9, p80_us=1e9)
            r["accuracy"]["ok"] = True
        elif r["shape"] == names[0]:
            r.update(median_us=r["median_us"] * 1000, p20_us=r["p20_us"] * 1000)
            r.update(p80_us=r["p80_us"] * 1000)
        elif r["shape"] == names[1]:
            r.update(median_us=r["median_us"] / 1000, p20_us=r["p20_us"] / 1000)
            r.update(p80_us=r["p80_us"] / 1000)
        else:
            r.update(p20_us=1e-6, p80_us=1e12)
    baseline_file = tmp_path / "baseline.json"
    baseline_file.write_text(json.dumps({"result": baseline}))  # a --json output works too

    proc = kerneldev(config, *base_args, "--compare", str(baseline_file), "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    verdicts = {(c["shape"], c["label"]): c["verdict"] for c in report["comparison"]["changes"]}
    assert verdicts == {
        (names[0], "simt"): "faster",
        (names[1], "simt"): "slower",
        (names[2], "simt"): "no change",
        (names[0], "mma"): "failed",
        (names[1], "mma"): "failed",
        (names[2], "mma"): "failed",
    }
    assert "interpreter" in proc.stderr  # cpu-wallclock verdicts carry a warning

    table = kerneldev(config, *base_args, "--compare", str(baseline_file))
    assert table.returncode == 1
    rows = {line.split("  ")[0]: line for line in table.stdout.splitlines() if "simt" in line}
    assert "faster" in rows[names[0]] and "slower" in rows[names[1]]
    assert "no change" in rows[names[2]]
    assert "geomean simt vs baseline" in table.stdout

    bad = tmp_path / "not-a-result.json"
    bad.write_text('{"hello": 1}')
    proc = kerneldev(config, *base_args, "--compare", str(bad))
    assert proc.returncode == 2 and "not a kerneldev benchmark result" in proc.stderr


def test_progress_lines_are_cut_to_the_terminal_width():
    """The harness's progress lines (written for a wide log) stream to an 80-column terminal
    one line each, cut with an ellipsis, in whatever chunks the transport delivers them."""
    import io

    from kerneldev.cli import environment
    from kerneldev.cli.commands import bench as bench_cmd

    err = io.StringIO()
    with environment.use(environment.Environment(stderr=err, stderr_isatty=True, width=80)):
        write = bench_cmd._stream()
        long = "[50/52] B64 main128/p256+extra512/p64 sink len-partial invalid0.1 main:sm120: " + (
            "ok  102.1 us [101.3-103.3]  318 GB/s"
        )
        write("[1/52] short\n" + long[:30])
        write(long[30:] + "\n")
    lines = err.getvalue().splitlines()
    assert lines[0] == "[1/52] short"
    assert len(lines) == 2 and len(lines[1]) == 79 and lines[1].endswith("…")
    assert lines[1].startswith(long[:78])
