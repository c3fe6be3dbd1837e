"""Deploying the bundled kernels into real SGLang releases (0.5.14 and 0.5.23, laid out from their
wheels by tests/sglang_releases.py: each release's own wrapper, DSv4 backend and package chain),
through the CLI, over the real sshd and the local transport: `kernels install` + `push
--restart` leaves a tree whose wrapper runs the bundled kernel; the import check leaves no
`__pycache__`; a wrapper without `flash_mla_with_kvcache_sm120` is refused before upload; a
file that does not import is rolled back without a restart; `kernels status` reports the
backend the live dispatch reaches for decode and prefill under every switch setting."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kerneldev.bundled import install as kernel_deploy
from kerneldev.cli.environment import Environment
from kerneldev.cli.main import main
from kerneldev.config import load_config
from kerneldev.hosts.transport import open_transport
from kerneldev.hostside import importscan as _importscan
from kerneldev.sandbox.host import find_sshd
from kerneldev.service.envfile import parse_env_file
from tests.faults import process_gone
from tests.sglang_releases import BACKEND_PATH, Release
from tests.sshutil import ssh_entry

REPO = Path(__file__).resolve().parents[1]
BUNDLED_KERNEL = (REPO / "kernels" / "flash_mla_sm120_triton.py").read_bytes()


@dataclass
class Tree:
    config: Path
    root: Path
    workspace: Path
    kernel: str
    wrapper: str
    restarts: Path
    env_file: Path
    release: Release

    def kd(self, *args: str, **terminal):
        """`kerneldev --config <this> ARGS` through the real entry, in a pipe (unless `terminal`
        says e.g. stdout_isatty=True, width=80)."""
        out, err = io.StringIO(), io.StringIO()
        env = Environment(stdout=out, stderr=err, stdin=io.StringIO(), **terminal)
        code = main(["--config", str(self.config), *args], env=env)
        return int(code), out.getvalue(), err.getvalue()

    def live(self, path: str) -> bytes:
        return (self.root / path).read_bytes()

    def set_env(self, text: str) -> None:
        """The service's env file: the release's host environment plus `text`."""
        self.env_file.write_text("# read by the service\n" + self.release.env_lines() + text)


def make_tree(
    tmp_path: Path, monkeypatch, release: Release, transport: str, server=None, env: str = ""
) -> Tree:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("KERNELDEV_SSH_CONFIG", "none")
    root = release.copy_to(tmp_path / "sglang")
    restarts = tmp_path / "restarts"
    entry: dict = {"transport": transport}
    if transport == "ssh":
        entry.update(ssh_entry(server, tmp_path))
    env_file = tmp_path / "sglang.env"
    entry.update(
        root=str(root),
        files=[release.kernel, release.wrapper],
        workspace="ws",
        python=sys.executable,
        service={"restart": f"echo restarted >> '{restarts}'", "env_file": str(env_file)},
    )
    config = tmp_path / "hosts.yaml"
    config.write_text(yaml.safe_dump({"hosts": {"h": entry}}))
    tree = Tree(
        config, root, tmp_path / "ws", release.kernel, release.wrapper, restarts, env_file, release
    )
    tree.set_env(env)
    return tree


def run_wrapper_call(tree: Tree) -> float:
    """The live tree's own wrapper (SGLang's, with the Triton backend selected) decodes tiny
    inputs on CPU (Triton interpreter); returns the largest error against kerneldev's float64
    reference."""
    code = (
        "import importlib, sys\n"
        "from kerneldev.kernels.dsv4_reference import make_inputs, reference_sparse_decode\n"
        "w = importlib.import_module(sys.argv[1])\n"
        "x = make_inputs(2, 4, 16, 16, extra_topk=8, extra_page_size=4, with_sink=True,\n"
        "                topk_length='partial', indices_3d=True, seed=7)\n"
        "out = w.flash_mla_with_kvcache_sm120(q=x['q'], k_cache=x['k_cache'], head_dim_v=512,\n"
        "    softmax_scale=x['softmax_scale'], indices=x['indices'],\n"
        "    topk_length=x['topk_length'], attn_sink=x['attn_sink'],\n"
        "    extra_k_cache=x['extra_k_cache'], extra_indices_in_kvcache=x['extra_indices'],\n"
        "    extra_topk_length=x['extra_topk_length'])[0]\n"
        "ref, _ = reference_sparse_decode(**x)\n"
        "print((out.float() - ref.float()).abs().max().item())\n"
    )
    env = parse_env_file(tree.env_file.read_text())
    env = dict(os.environ, **env, TRITON_INTERPRET="1", SGLANG_SM120_FLASHMLA_BACKEND="triton")
    env["PYTHONPATH"] = os.pathsep.join([str(tree.root / "python"), env["PYTHONPATH"]])
    proc = subprocess.run(
        [sys.executable, "-B", "-c", code, f"{tree.release.package}.flash_mla_sm120"],
        cwd=tree.root / "python",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return float(proc.stdout.strip().splitlines()[-1])


# The backend each release's wrapper runs when unset: 0.5.14 reads SGLANG_SM120_TRITON_FLASHMLA
# (default 1: Triton), 0.5.23 SGLANG_SM120_FLASHMLA_BACKEND (default flashinfer).
DEFAULT_BACKEND = {"0.5.14": "triton", "0.5.23": "flashinfer"}


@pytest.mark.slow
def test_install_then_push_restart_leaves_a_working_wrapper(tmp_path, monkeypatch, sglang_release):
    pytest.importorskip("triton")
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    default = DEFAULT_BACKEND[sglang_release.version]

    code, out, err = tree.kd("kernels", "status", "--json")
    assert code == 0, err
    site = json.loads(out)["sites"][0]
    assert site["kernel"]["kind"] == "other"
    assert site["backend"]["backend"] == default
    assert site["backend"]["environment"].endswith("sglang.env")

    code, out, err = tree.kd("kernels", "install", "--json")
    assert code == 0, err
    installed = {f["path"]: f for f in json.loads(out)["files"]}
    assert installed[tree.kernel]["action"] == "installed"
    assert (tree.workspace / tree.kernel).read_bytes() == BUNDLED_KERNEL
    assert tree.wrapper not in installed
    assert "+++ bundled/" in installed[tree.kernel]["patch"]

    code, out, err = tree.kd("push", "--restart", "--json")
    assert code == 0, err
    pushed = json.loads(out)
    check = pushed["import_check"]
    assert tree.wrapper in check["scan"]["importers"]  # the release's wrapper imports it
    assert check["scan"]["missing"] == []
    assert check["after_upload"]["ok"] is True
    assert tree.live(tree.kernel) == BUNDLED_KERNEL
    assert tree.restarts.read_text().count("restarted") == 1
    assert list(tree.root.rglob("__pycache__")) == []  # the import wrote no bytecode

    code, out, err = tree.kd("kernels", "status", "--json")
    site = json.loads(out)["sites"][0]
    assert site["kernel"]["kind"] == "bundled"
    if default == "triton":
        assert (site["backend"]["backend"], site["backend"]["kernel_variant"]) == ("triton", "simt")
    else:  # the bundled kernel file is live, but 0.5.23 still runs FlashInfer: status says so
        assert site["backend"]["backend"] == "flashinfer"
    assert list(tree.root.rglob("__pycache__")) == []

    assert run_wrapper_call(tree) < 2e-2  # bf16 output of a 24-token softmax

    # and back: the release's own kernel file, import-checked, nothing left behind
    original = (sglang_release.tree / tree.kernel).read_bytes()
    code, out, err = tree.kd("rollback", "--json")
    assert code == 0, err
    assert json.loads(out)["import_check"]["after_upload"]["ok"] is True
    assert tree.live(tree.kernel) == original
    assert list(tree.root.rglob("__pycache__")) == []


# (variables in the env file) -> (decode, prefill) backend per release, as each release's
# wrapper dispatches: 0.5.14 reads only SGLANG_SM120_TRITON_FLASHMLA; 0.5.23 only
# SGLANG_SM120_FLASHMLA_BACKEND: triton -> the kernel file, flashinfer (the default) ->
# FlashInfer (prefill-sized calls to its prefill path), anything else, auto included -> torch.
SWITCH_CASES = {
    "unset": ("", {"0.5.14": "triton", "0.5.23": "flashinfer"}),
    "triton": ("SGLANG_SM120_FLASHMLA_BACKEND=triton\n", {"0.5.14": "triton", "0.5.23": "triton"}),
    "torch": ("SGLANG_SM120_FLASHMLA_BACKEND=torch\n", {"0.5.14": "triton", "0.5.23": "torch"}),
    "flashinfer": (
        "SGLANG_SM120_FLASHMLA_BACKEND=flashinfer\n",
        {"0.5.14": "triton", "0.5.23": "flashinfer"},
    ),
    "auto": ("SGLANG_SM120_FLASHMLA_BACKEND=auto\n", {"0.5.14": "triton", "0.5.23": "torch"}),
    "legacy": ("SGLANG_SM120_TRITON_FLASHMLA=0\n", {"0.5.14": "torch", "0.5.23": "flashinfer"}),
}


@pytest.mark.slow
def test_status_matches_the_live_dispatch_for_every_switch(tmp_path, monkeypatch, sglang_release):
    """`kernels status` against what each case really runs (SWITCH_CASES, read from each
    release's wrapper and environ.py), for a decode call and a prefill-sized call."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    version = sglang_release.version
    one_at_a_time, envs = [], []
    for case, (lines, expected) in SWITCH_CASES.items():
        tree.set_env(lines)
        envs.append(parse_env_file(tree.env_file.read_text()))
        code, out, err = tree.kd("kernels", "status", "--json", "--heads", "8")
        assert code == 0, err
        backend = json.loads(out)["sites"][0]["backend"]
        one_at_a_time.append(backend)
        got = {c["call"]: (c["backend"], c["tokens"] > 64, c["heads"]) for c in backend["calls"]}
        want = expected[version]
        assert got == {"decode": (want, False, 8), "prefill": (want, True, 8)}, (case, backend)
        assert backend["backend"] == want
        if want == "flashinfer" and version == "0.5.23":
            functions = [c["function"] for c in backend["calls"]]
            assert "_flash_mla_flashinfer" in functions[0], functions
            assert "_flash_mla_sm120_prefill" in functions[1], functions
            assert "not installed" in backend["reason"]  # no FlashInfer on this CPU host
    assert list(tree.root.rglob("__pycache__")) == []

    # Every case in one probe (as an A/B's preflight sends its variants): one process, torch
    # imported once, a forked child per case; the answers equal the one-at-a-time ones.
    host = load_config(tree.config).host("h")
    with open_transport(host) as transport:
        batched = kernel_deploy.dispatches_under(transport, host, envs, heads=8)
    for case, choice, alone in zip(SWITCH_CASES, batched, one_at_a_time, strict=True):
        got = json.loads(json.dumps(dataclasses.asdict(choice)))
        assert {**got, "environment": alone["environment"]} == alone, case
    assert list(tree.root.rglob("__pycache__")) == []


# A wrapper that dies with the job's process, and one that never finishes importing.
CRASHING_WRAPPER = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
HANGING_WRAPPER = "import time\ntime.sleep(300)\n"


@pytest.mark.parametrize("sglang_release", ["0.5.23"], indirect=True)
def test_each_job_of_a_probe_batch_is_answered_on_its_own(tmp_path, monkeypatch, sglang_release):
    """One probe process, six jobs: a wrapper that does not import, one that crashes, one that
    hangs (past its timeout) hide none of the others; a job whose variables differ in one torch
    reads (OMP_NUM_THREADS) runs in a fresh interpreter and answers as the forked one does;
    answers come back in job order."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    python = tree.root / "python"
    (python / "kd_broken_wrapper.py").write_text("raise ImportError('kerneldev test: no')\n")
    (python / "kd_crashing_wrapper.py").write_text(CRASHING_WRAPPER)
    (python / "kd_hanging_wrapper.py").write_text(HANGING_WRAPPER)
    env = parse_env_file(tree.env_file.read_text())
    triton = {**env, "SGLANG_SM120_FLASHMLA_BACKEND": "triton"}
    torch = {**env, "SGLANG_SM120_FLASHMLA_BACKEND": "torch"}

    def job(wrapper: str, job_env: dict, timeout: float = kernel_deploy.PROBE_TIMEOUT):
        return kernel_deploy.ProbeJob(tree.kernel, wrapper, job_env, 8, timeout)

    jobs = [
        job(tree.wrapper, triton),
        job("python/kd_broken_wrapper.py", triton),
        job("python/kd_crashing_wrapper.py", triton),
        job("python/kd_hanging_wrapper.py", triton, timeout=3),
        job(tree.wrapper, {**triton, "OMP_NUM_THREADS": "1"}),
        job(tree.wrapper, torch),
    ]
    host = load_config(tree.config).host("h")
    with open_transport(host) as transport:
        answers = kernel_deploy.probe_answers(transport, host, jobs)
    assert isinstance(answers, list), answers
    how = [a.get("interpreter") for a in answers]
    assert how == ["forked", "forked", None, None, "fresh", "forked"], how
    choices = [kernel_deploy.backend_choice(host, a) for a in answers]
    assert [c.backend for c in choices] == ["triton", None, None, None, "triton", "torch"]
    assert "cannot be imported: ImportError: kerneldev test: no" in choices[1].reason
    assert "killed by SIGSEGV" in choices[2].reason, choices[2].reason
    assert "no answer within 3s, killed" in choices[3].reason, choices[3].reason
    assert choices[4] == choices[0]  # the fresh interpreter's answer is the forked one's
    assert choices[5].switch == {"SGLANG_SM120_FLASHMLA_BACKEND": "torch"}
    assert list(tree.root.rglob("__pycache__")) == []


def test_status_is_unknown_with_the_reason_when_the_wrapper_cannot_import(
    tmp_path, monkeypatch, sglang_release
):
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    tree.env_file.write_text("PYTHONPATH=/nonexistent\n")  # none of SGLang's imports
    code, out, err = tree.kd("kernels", "status", "--json")
    assert code == 0, err
    backend = json.loads(out)["sites"][0]["backend"]
    assert backend["backend"] is None and backend["calls"] == []
    assert "cannot be imported" in backend["reason"] and "ModuleNotFoundError" in backend["reason"]
    code, out, err = tree.kd("kernels", "status")
    assert "unknown" in out and "cannot be imported" in " ".join(err.split())


@pytest.mark.parametrize("sglang_release", ["0.5.23"], indirect=True)
def test_ctrl_c_during_the_probe_ends_its_forked_child(tmp_path, monkeypatch, sglang_release):
    """Ctrl-C while the probe's child imports the wrapper (here one that hangs, after sending
    the Ctrl-C itself): exit 130, and the child forked on the host is gone with its parent
    (the transport ends the command's process group)."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    pid_file = tmp_path / "child.pid"
    (tree.root / tree.wrapper).write_text(
        "import os, signal, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        f"os.kill({os.getpid()}, signal.SIGINT)\n"
        "time.sleep(300)\n"
    )
    code, _, err = tree.kd("kernels", "status")
    assert code == 130, err
    child = int(pid_file.read_text())
    assert child != os.getpid() and process_gone(child), f"probe child {child} still runs"


def test_status_says_when_the_server_runs_other_values_than_the_env_file(
    tmp_path, monkeypatch, sglang_release
):
    """The wrapper reads its switch at import, so status warns when the env file changed after
    the last restart by kerneldev, and when the running server's own environment (its process,
    found from the port of service.url, read from /proc) differs from the file: here a
    stand-in server that started with torch."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    assert tree.kd("restart")[0] == 0
    code, _, err = tree.kd("kernels", "status")
    assert code == 0 and "changed after" not in err
    tree.set_env("SGLANG_SM120_FLASHMLA_BACKEND=triton\n")
    listen = (
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); time.sleep(120)\n"
    )
    env = dict(os.environ, SGLANG_SM120_FLASHMLA_BACKEND="torch")
    server = subprocess.Popen(
        [sys.executable, "-c", listen], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(server.stdout.readline())
        data = yaml.safe_load(tree.config.read_text())
        data["hosts"]["h"]["service"]["url"] = f"http://127.0.0.1:{port}"
        tree.config.write_text(yaml.safe_dump(data))
        code, out, err = tree.kd("kernels", "status", "--json")
    finally:
        server.kill()
        server.wait()
    assert code == 0, err
    notes = " ".join(json.loads(out)["notes"])
    assert "changed after the service's last restart" in notes and str(tree.env_file) in notes
    if not Path("/proc/self/environ").exists() or shutil.which("ss") is None:
        return  # the server's process cannot be found here
    assert f"pid {server.pid}" in notes, notes
    assert "SGLANG_SM120_FLASHMLA_BACKEND=torch (env file: triton)" in notes


def test_install_force_keeps_the_overwritten_edits(tmp_path, monkeypatch, request, sglang_release):
    """Over the real sshd where there is one, else the local transport."""
    server = request.getfixturevalue("sshd_server") if find_sshd() is not None else None
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "ssh" if server else "local", server)
    assert tree.kd("pull")[0] == 0
    mine = (tree.workspace / tree.kernel).read_bytes() + b"# my unpushed edit\n"
    (tree.workspace / tree.kernel).write_bytes(mine)
    code, _, err = tree.kd("kernels", "install")
    assert code == 1 and "unpushed edits" in err
    code, out, err = tree.kd("kernels", "install", "--force", "--json")
    assert code == 0, err
    assert (tree.workspace / tree.kernel).read_bytes() == BUNDLED_KERNEL
    kept = list((tree.workspace / ".kerneldev" / "discarded").rglob(Path(tree.kernel).name))
    assert [p.read_bytes() for p in kept] == [mine]  # as `pull --force` keeps them
    assert any(str(kept[0]) in note for note in json.loads(out)["notes"])


def test_wrapper_without_entry_point_is_refused_before_upload(
    tmp_path, monkeypatch, sglang_release
):
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    assert tree.kd("pull")[0] == 0
    before = tree.live(tree.wrapper)
    # A re-export-only wrapper, as kerneldev once bundled: SGLang's backend cannot import it.
    (tree.workspace / tree.wrapper).write_text(
        "from .flash_mla_sm120_triton import flash_mla_sparse_decode_triton  # noqa: F401\n"
    )
    code, out, err = tree.kd("push", "--restart", "--json")
    assert code == 1
    message = " ".join(err.split())
    assert BACKEND_PATH in message and "flash_mla_with_kvcache_sm120" in message
    assert f"{sglang_release.package}.flash_mla_sm120" in message
    assert tree.live(tree.wrapper) == before
    assert not tree.restarts.exists()
    missing = json.loads(out)["import_check"]["scan"]["missing"]
    assert (BACKEND_PATH, "flash_mla_with_kvcache_sm120") in {
        (m["importer"], m["name"]) for m in missing
    }


def test_file_that_fails_to_import_is_rolled_back_without_restart(
    tmp_path, monkeypatch, sglang_release
):
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    assert tree.kd("pull")[0] == 0
    before = tree.live(tree.kernel)
    broken = before + b"\nimport a_module_kerneldev_never_installs  # noqa: F401\n"
    (tree.workspace / tree.kernel).write_bytes(broken)
    code, out, err = tree.kd("push", "--restart", "--json")
    assert code == 1
    assert "do not import" in err and "rolled back" in err
    assert tree.live(tree.kernel) == before
    assert not tree.restarts.exists()
    check = json.loads(out)["import_check"]
    assert check["after_upload"]["ok"] is False
    assert "a_module_kerneldev_never_installs" in check["after_upload"]["output"]
    assert check["rolled_back_by"]
    state = json.loads((tree.workspace / ".kerneldev" / "state.json").read_text())
    assert [d["kind"] for d in state["deploys"]] == ["push", "rollback"]
    # The edit stays in the workspace, unpushed; --no-import-check deploys it anyway.
    assert tree.kd("push", "--no-import-check")[0] == 0
    assert tree.live(tree.kernel) == broken


def test_with_wrapper_refused_when_the_bundled_one_lacks_public_names(
    tmp_path, monkeypatch, sglang_release
):
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    (tree.root / tree.wrapper).write_text(
        (tree.root / tree.wrapper).read_text() + "\n\ndef sm120_page_split(x):\n    return x\n"
    )
    code, _, err = tree.kd("kernels", "install", "--with-wrapper")
    assert code == 1 and "sm120_page_split" in err
    assert not (tree.workspace / tree.kernel).exists() or (
        (tree.workspace / tree.kernel).read_bytes() != BUNDLED_KERNEL
    )


def test_scanner_reads_every_import_form():
    targets = {"pkg.mod"}
    source = (
        "import pkg.mod\n"
        "import pkg.mod as m\n"
        "from pkg import mod as other\n"
        "from . import mod\n"
        "from .mod import a, b as c\n"
        "def f():\n"
        "    from pkg.mod import d\n"
        "    return m.e, pkg.mod.g, other.h, mod.i\n"
    )
    needs = _importscan.imports_of(source, "pkg.user", False, targets)
    assert {n for _, n, _ in needs} == {None, "a", "b", "d", "e", "g", "h", "i"}
    names, is_open = _importscan.provided_names(
        "import os\nfrom x import y as z\nA, (B, C) = 1, (2, 3)\n"
        "try:\n    import torch\nexcept ImportError:\n    torch = None\n"
        "if True:\n    def f(): pass\nclass K: pass\n"
    )
    assert names >= {"os", "z", "A", "B", "C", "torch", "f", "K"} and not is_open
    assert _importscan.provided_names("from x import *\n")[1] is True


def test_env_file_parsing():
    assert parse_env_file("# c\nexport A='1'\nB=\"x y\"\n\nC=3=4\n") == {
        "A": "1",
        "B": "x y",
        "C": "3=4",
    }


def test_service_check_replaces_the_default_import(tmp_path, monkeypatch, sglang_release):
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    tree.set_env("SGLANG_SM120_FLASHMLA_BACKEND=auto\n")
    data = yaml.safe_load(tree.config.read_text())
    seen = tmp_path / "checked"
    check = f"echo \"$KERNELDEV_MODULES $SGLANG_SM120_FLASHMLA_BACKEND\" > '{seen}'; exit 3"
    data["hosts"]["h"]["service"]["check"] = check  # runs with service.env_file's variables
    tree.config.write_text(yaml.safe_dump(data))
    assert tree.kd("pull")[0] == 0
    before = tree.live(tree.kernel)
    (tree.workspace / tree.kernel).write_bytes(before + b"\nTUNED = True\n")
    code, out, err = tree.kd("push", "--json")
    assert code == 1 and "exit 3" in err
    assert seen.read_text().split() == [f"{sglang_release.package}.flash_mla_sm120_triton", "auto"]
    assert tree.live(tree.kernel) == before  # rolled back


def test_ctrl_c_during_the_import_check_says_what_is_live_and_unchecked(
    tmp_path, monkeypatch, sglang_release
):
    """Ctrl-C while the pushed module is being imported on the host: the push has landed, so
    exit 130 with the Deployed summary and the import marked as not checked (not a bare
    "interrupted"), and --json still carries the push."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    data = yaml.safe_load(tree.config.read_text())
    data["hosts"]["h"]["service"]["check"] = f"kill -INT {os.getpid()}; sleep 30"
    tree.config.write_text(yaml.safe_dump(data))
    assert tree.kd("pull")[0] == 0
    new = tree.live(tree.kernel) + b"\nTUNED = True\n"
    (tree.workspace / tree.kernel).write_bytes(new)
    code, out, err = tree.kd("push", "--restart", "--json")
    assert code == 130
    assert f"Deployed: {tree.kernel}" in err and "not checked" in err, err
    assert json.loads(out)["deployed"] == [tree.kernel]
    assert tree.live(tree.kernel) == new and not tree.restarts.exists()


def test_import_check_uses_only_the_configured_python(tmp_path, monkeypatch, sglang_release):
    """The import after the upload runs with the host's configured `python` (the server's):
    when that is missing it says so and the push is undone, rather than importing with another
    interpreter and reporting it as the configured one."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    missing = str(tmp_path / "no-such-venv" / "bin" / "python3")
    data = yaml.safe_load(tree.config.read_text())
    data["hosts"]["h"]["python"] = missing
    tree.config.write_text(yaml.safe_dump(data))
    assert tree.kd("pull")[0] == 0
    before = tree.live(tree.kernel)
    (tree.workspace / tree.kernel).write_bytes(before + b"\nTUNED = True\n")
    code, out, err = tree.kd("push", "--json")
    assert code == 1 and missing in err, err
    check = json.loads(out)["import_check"]["after_upload"]
    assert check["ok"] is False and missing in check["output"]
    assert tree.live(tree.kernel) == before  # rolled back


def test_install_without_a_configured_kernel_file_is_a_usage_error(
    tmp_path, monkeypatch, sglang_release
):
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    data = yaml.safe_load(tree.config.read_text())
    data["hosts"]["h"]["files"] = [tree.wrapper]
    tree.config.write_text(yaml.safe_dump(data))
    code, _, err = tree.kd("kernels", "install")
    assert code == 2 and "flash_mla_sm120_triton.py" in err and "known layout" in err
    assert not tree.workspace.exists() or not any(tree.workspace.rglob("*.py"))


def test_kernel_sites_at_every_known_layout():
    paths = [
        "python/sglang/srt/layers/attention/flash_mla_sm120_triton.py",
        "python/sglang/srt/layers/attention/flash_mla_sm120.py",
        "python/sglang/kernels/ops/attention/flash_mla_sm120_triton.py",
        "vllm/models/deepseek_v4/nvidia/flash_mla_sm120_triton.py",  # no real tree: not a site
        "elsewhere/flash_mla_sm120_triton.py",
    ]
    sites = kernel_deploy.find_sites(paths)
    assert [(s.layout, s.wrapper is not None) for s in sites] == [
        ("sglang", True),
        ("sglang (kernels/ops)", False),
    ]
    assert kernel_deploy.classify_file("flash_mla_sm120_triton.py", "f" * 64)[0] == "other"
    assert (
        kernel_deploy.classify_file(
            "flash_mla_sm120_triton.py",
            next(iter(kernel_deploy.RELEASED["flash_mla_sm120_triton.py"])),
        )[0]
        == "bundled-older"
    )


@pytest.mark.slow
def test_an_ab_whose_variants_run_the_same_kernel_is_refused(tmp_path, monkeypatch, sglang_release):
    """SGLang 0.5.23 runs FlashInfer unless told `triton`, so an A/B that toggles only
    SGLANG_SM120_MMA_FLASHMLA compares FlashInfer with itself: `profile` and `bench --service`
    refuse it (exit 1) naming the variants and the variable, before measuring anything; with
    the backend pinned to triton the variants differ (simt, mma) and nothing is refused.
    On 0.5.14 (Triton by default) the variants differ either way."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    data = yaml.safe_load(tree.config.read_text())
    data["hosts"]["h"]["service"]["variants"] = {
        "simt": {"SGLANG_SM120_MMA_FLASHMLA": "0"},
        "mma": {"SGLANG_SM120_MMA_FLASHMLA": "1"},
    }
    data["hosts"]["h"]["service"]["url"] = "http://127.0.0.1:9"  # never reached when refused
    tree.config.write_text(yaml.safe_dump(data))
    # the bundled kernel is live (as `kernels install` + `push` leave it, tested above), so
    # Triton's variant shows (mma/simt)
    (tree.root / tree.kernel).write_bytes(BUNDLED_KERNEL)
    before = tree.env_file.read_text()
    if sglang_release.version == "0.5.23":
        code, out, err = tree.kd("profile", "--variants", "simt,mma", "--json")
        assert code == 1, err
        message = " ".join(err.split())
        assert "simt, mma" in message and "flashinfer" in message, message
        assert "SGLANG_SM120_MMA_FLASHMLA did not take effect" in message
        assert "--allow-same-kernel" in message
        assert tree.env_file.read_text() == before  # put back
        code, _, err = tree.kd("bench", "--service", "--variants", "simt,mma", "--rounds", "1")
        assert code == 1 and "same attention kernel" in err
        # A group's A/B is refused alike, and --allow-same-kernel reaches every host's run
        # (which then gets as far as the service, unreachable here).
        data["hosts"]["h2"] = {**data["hosts"]["h"], "workspace": str(tmp_path / "ws2")}
        data["groups"] = {"pair": ["h", "h2"]}
        tree.config.write_text(yaml.safe_dump(data))
        args = ("bench", "--service", "--variants", "simt,mma", "--rounds", "1", "--host", "pair")
        code, out, err = tree.kd(*args, "--json")
        assert code == 1 and "same attention kernel" in out + err
        code, out, err = tree.kd(*args, "--json", "--allow-same-kernel")
        assert code != 0 and "same attention kernel" not in out + err
        tree.env_file.write_text(before)  # both hosts share this one env file here
    from kerneldev.bench import ab_kernels
    from kerneldev.config import load_config
    from kerneldev.hosts.transport import open_transport

    host = load_config(tree.config).host("h")
    if sglang_release.version == "0.5.23":  # pinned: the variable takes effect
        tree.set_env("SGLANG_SM120_FLASHMLA_BACKEND=triton\n")
    with open_transport(host) as transport:
        check = ab_kernels.preflight(transport, host, ["simt", "mma"])
    assert check.kernels == {"simt": "triton (simt)", "mma": "triton (mma)"}


def test_status_names_a_kernel_file_missing_on_the_host_not_the_config(
    tmp_path, monkeypatch, sglang_release
):
    """The configured kernel file is at a known layout, but the root holds no such tree (a
    wrong root): the error says so (exit 1), in JSON too, instead of asking to configure it."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    data = yaml.safe_load(tree.config.read_text())
    data["hosts"]["h"]["root"] = str(tmp_path / "not-the-tree")
    tree.config.write_text(yaml.safe_dump(data))
    code, out, err = tree.kd("kernels", "status", "--json")
    assert code == 1, (out, err)
    error = json.loads(out)["error"]
    assert tree.kernel in error["message"] and "not on host" in error["message"]
    assert "root" in error["hint"]


def test_status_refuses_a_head_count_no_server_has(tmp_path, monkeypatch, sglang_release):
    """The probe allocates its inputs on the live host next to the server: `--heads` is
    bounded (usage error, JSON too) instead of trying to allocate gigabytes there."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    code, out, _ = tree.kd("kernels", "status", "--json", "--heads", "100000")
    assert code == 2 and "--heads" in json.loads(out)["error"]["message"]
    with pytest.raises(kernel_deploy.UsageError, match="between 1 and"):
        kernel_deploy.status(None, None, heads=kernel_deploy.MAX_HEADS + 1)


def test_two_of_three_variants_on_one_kernel_are_refused():
    """simt, mma, flashinfer on SGLang 0.5.23 where mma toggles only SGLANG_SM120_MMA_FLASHMLA:
    mma runs FlashInfer, so its row would be read as the MMA kernel's; refused naming mma and
    flashinfer. Three different kernels, or a variant whose kernel is unknown, pass."""
    from kerneldev.bench import ab_kernels

    check = ab_kernels.KernelCheck(
        kernels={"simt": "triton (simt)", "mma": "flashinfer", "flashinfer": "flashinfer"},
        envs={
            "simt": {"SGLANG_SM120_FLASHMLA_BACKEND": "triton"},
            "mma": {"SGLANG_SM120_MMA_FLASHMLA": "1"},
            "flashinfer": {"SGLANG_SM120_FLASHMLA_BACKEND": "flashinfer"},
        },
    )
    with pytest.raises(ab_kernels.SameKernelError) as caught:
        check.check()
    message = caught.value.message
    assert "variants mma, flashinfer run the same attention kernel (flashinfer)" in message
    assert "SGLANG_SM120_FLASHMLA_BACKEND, SGLANG_SM120_MMA_FLASHMLA did not take effect" in (
        message
    )
    check.kernels["mma"] = "triton (mma)"
    check.check()
    check.kernels["mma"] = None
    check.check()


def test_the_probe_runs_a_job_in_a_fresh_interpreter_where_fork_fails(tmp_path, monkeypatch):
    """The host-side probe itself (here in this process, fork failing): the job still gets its
    answer, from a fresh interpreter with the job's variables."""
    from kerneldev.hostside import kernelprobe

    def no_fork():
        raise OSError(11, "Resource temporarily unavailable")

    (tmp_path / "kd_env_wrapper.py").write_text(
        "import os\nSM120_DECODE_MAX_TOKENS = len(os.environ['SGLANG_SM120_FLASHMLA_BACKEND'])\n"
    )
    monkeypatch.chdir(tmp_path)  # the probe's import root
    monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.delenv("SGLANG_SM120_FLASHMLA_BACKEND", raising=False)
    job = {"wrapper": "kd_env_wrapper", "kernel": "kd_no_kernel", "calls": [], "timeout": 300}
    job["env"] = {"SGLANG_SM120_FLASHMLA_BACKEND": "torch"}
    source = Path(kernelprobe.__file__).read_text(encoding="utf-8")
    (answer,) = kernelprobe.probe_all({"jobs": [job], "source": source})["answers"]
    assert answer["interpreter"] == "fresh", answer
    assert answer["switch"] == {"SGLANG_SM120_FLASHMLA_BACKEND": "torch"}
    assert answer["SM120_DECODE_MAX_TOKENS"] == len("torch")  # read at the wrapper's import
    assert "defines no flash_mla_with_kvcache_sm120" in answer["error"]
    assert list(tmp_path.rglob("__pycache__")) == []


def _main_versions(path: str) -> dict[str, str] | None:
    """sha256 -> commit of every version of `path` that main has had (first parent: what a
    checkout of main held), or None where this checkout has no git history to read."""
    import hashlib

    repo = Path(__file__).resolve().parent.parent
    log = subprocess.run(
        ["git", "-C", str(repo), "log", "--first-parent", "--format=%h", "HEAD", "--", path],
        capture_output=True,
        text=True,
    )
    if log.returncode != 0 or not log.stdout.strip():
        return None
    shallow = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--is-shallow-repository"],
        capture_output=True,
        text=True,
    )
    if shallow.stdout.strip() != "false":
        return None
    versions = {}
    for commit in log.stdout.split():
        shown = subprocess.run(
            ["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True
        )
        if shown.returncode == 0:
            versions.setdefault(hashlib.sha256(shown.stdout).hexdigest(), commit)
    return versions


@pytest.mark.parametrize("name", ["flash_mla_sm120_triton.py", "flash_mla_sm120.py"])
def test_every_earlier_version_of_a_bundled_file_is_a_known_release(name):
    """`kernels status` names a live file's release from `bundled/releases.py`: a version main
    once shipped that is missing there is reported as someone else's file. Each commit that
    changes a bundled file must add the version it replaces (the failure says which)."""
    versions = _main_versions(f"kernels/{name}")
    if versions is None:
        pytest.skip("no full git history here (an sdist, a shallow clone)")
    import hashlib

    from kerneldev.bundled.releases import RELEASED

    now = hashlib.sha256(kernel_deploy.bundled_bytes(name)).hexdigest()
    missing = {sha: c for sha, c in versions.items() if sha != now and sha not in RELEASED[name]}
    assert not missing, f"add to RELEASED[{name!r}] in kerneldev/bundled/releases.py: {missing}"


# Per release: a switch a login environment might set, and what the service runs without it.
LOGIN_SWITCH = {
    "0.5.14": ("SGLANG_SM120_TRITON_FLASHMLA", "0", "triton"),
    "0.5.23": ("SGLANG_SM120_FLASHMLA_BACKEND", "triton", "flashinfer"),
}


def test_status_and_the_ab_preflight_ignore_the_callers_sglang_switches(
    tmp_path, monkeypatch, sglang_release
):
    """The probe answers for the service's environment as the env file defines it: a switch set
    in the login (here the caller's, local transport) environment and not in the env file is
    unset in the probe (SGLang's default applies), not reported as the service's; so is the
    MMA switch that an A/B variant drops. Variables the file sets still count."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    name, value, default = LOGIN_SWITCH[sglang_release.version]
    monkeypatch.setenv(name, value)
    monkeypatch.setenv("SGLANG_SM120_MMA_FLASHMLA", "1")
    code, out, err = tree.kd("kernels", "status", "--json", "--heads", "8")
    assert code == 0, err
    backend = json.loads(out)["sites"][0]["backend"]
    assert [c["backend"] for c in backend["calls"]] == [default, default], backend
    assert backend["switch"] == {}, backend["switch"]

    (tree.root / tree.kernel).write_bytes(BUNDLED_KERNEL)  # shows Triton's variant
    base = parse_env_file(tree.env_file.read_text())
    triton = {**base, "SGLANG_SM120_FLASHMLA_BACKEND": "triton"}  # 0.5.14: not read, triton
    host = load_config(tree.config).host("h")
    with open_transport(host) as transport:
        simt, mma = kernel_deploy.dispatches_under(
            transport, host, [triton, {**triton, "SGLANG_SM120_MMA_FLASHMLA": "1"}], heads=8
        )
    assert (simt.backend, simt.kernel_variant) == ("triton", "simt"), simt
    assert (mma.backend, mma.kernel_variant) == ("triton", "mma"), mma
    assert "SGLANG_SM120_MMA_FLASHMLA" not in simt.switch
    # which tile loops the MMA variant runs with this host's Triton (not 3.6 here, or the
    # interpreter): its Triton loops, and why; said for the MMA variant only
    assert mma.gluon is not None and mma.gluon["available"] is False, mma.gluon
    assert mma.gluon["why_not"] and mma.gluon["why_not"] in mma.reason
    assert "MMA tile loops: Triton's, not Gluon" in mma.reason
    assert "MMA tile loops" not in simt.reason


def test_a_leftover_site_of_another_layout_is_marked_not_imported_and_not_probed(
    tmp_path, monkeypatch, sglang_release
):
    """A tree that still holds the other release's pair at its layout (a leftover: 0.5.23 next
    to an old srt/layers/attention/ pair, or the reverse): status names the site SGLang's
    backend imports (from its imports: 0.5.23 -> kernels/ops/attention, 0.5.14 ->
    srt/layers/attention), marks the other as not imported, and only the imported one is
    probed, by status and by the A/B's preflight (`dispatches_under`)."""
    from tests.sglang_releases import FOLDERS, fetch

    other = next(v for v in FOLDERS if v != sglang_release.version)
    stale = FOLDERS[other]
    source = fetch.release_root(other) / stale  # before make_tree moves HOME (the cache's)
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    (tree.root / stale).mkdir(parents=True, exist_ok=True)
    names = ("flash_mla_sm120_triton.py", "flash_mla_sm120.py")
    for name in names:
        shutil.copy(source / name, tree.root / stale / name)
    data = yaml.safe_load(tree.config.read_text())
    data["hosts"]["h"]["files"] += [f"{stale}/{name}" for name in names]
    tree.config.write_text(yaml.safe_dump(data))
    default = DEFAULT_BACKEND[sglang_release.version]
    host = load_config(tree.config).host("h")
    with open_transport(host) as transport:
        env = parse_env_file(tree.env_file.read_text())
        (choice,) = kernel_deploy.dispatches_under(transport, host, [env], heads=8)
    assert choice.backend == default, choice

    code, out, err = tree.kd("kernels", "status", "--json", "--heads", "8")
    assert code == 0, err
    sites = json.loads(out)["sites"]
    assert [(s["kernel"]["path"], s["imported"]) for s in sites] == [
        (tree.kernel, True),
        (f"{stale}/flash_mla_sm120_triton.py", False),
    ]
    assert sites[0]["backend"]["backend"] == default
    assert sites[1]["backend"]["backend"] is None and sites[1]["backend"]["calls"] == []
    assert "not imported" in sites[1]["backend"]["reason"]
    assert "deepseek_v4_backend.py imports" in sites[1]["backend"]["reason"]
    code, out, err = tree.kd("kernels", "status", "--heads", "8")
    assert code == 0 and "not imported" in out, out


def test_status_shows_a_configured_wrapper_missing_on_the_host(
    tmp_path, monkeypatch, sglang_release
):
    """The wrapper is among the configured files but not on the host: its row says `missing`
    (it used to vanish from the table) and the backend is unknown, saying why."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    (tree.root / tree.wrapper).unlink()
    code, out, err = tree.kd("kernels", "status", "--json", "--heads", "8")
    assert code == 0, err
    (site,) = json.loads(out)["sites"]
    assert site["wrapper"] == {
        "path": tree.wrapper,
        "sha256": None,
        "kind": "missing",
        "release": None,
    }
    assert site["backend"]["backend"] is None
    assert f"the wrapper {tree.wrapper} is missing on the host" in site["backend"]["reason"]
    code, out, err = tree.kd("kernels", "status", "--heads", "8")
    assert code == 0, err
    rows = [line.split() for line in out.splitlines()]
    assert ["missing", "-", "-", tree.wrapper] in rows, out


def test_the_modules_a_backend_imports_are_read_from_every_import_form():
    source = (
        b"import os\n"
        b"from .flash_mla_sm120 import a\n"
        b"def f():\n"
        b"    from sglang.kernels.ops.attention.flash_mla_sm120 import (b, c)\n"
        b"    from ..models import deepseek_v4\n"
    )
    names = kernel_deploy.imported_modules(source, "sglang.srt.layers.attention")
    assert {
        "os",
        "sglang.srt.layers.attention.flash_mla_sm120",
        "sglang.kernels.ops.attention.flash_mla_sm120",
        "sglang.srt.layers.models.deepseek_v4",
    } <= names
    assert "sglang.srt.layers.attention.flash_mla_sm120_triton" not in names


LISTEN = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "print(s.getsockname()[1], flush=True); time.sleep(120)\n"
)


class StandInServer:
    """A process listening on service.url's port, started with `env` on top of this one's
    (minus this one's SGLANG_*): the server `kernels status` finds with `ss` and reads in /proc.
    Skips the test where that cannot be done here."""

    def __init__(self, tree: Tree, env: dict[str, str] | None = None) -> None:
        if not Path("/proc/self/environ").exists() or shutil.which("ss") is None:
            pytest.skip("the server's process cannot be found here (no /proc or no ss)")
        base = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LISTEN],
            env={**base, **(env or {})},
            stdout=subprocess.PIPE,
            text=True,
        )
        port = int(self.proc.stdout.readline())
        data = yaml.safe_load(tree.config.read_text())
        data["hosts"]["h"]["service"]["url"] = f"http://127.0.0.1:{port}"
        tree.config.write_text(yaml.safe_dump(data))

    def __enter__(self) -> StandInServer:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


def test_status_warns_when_the_server_started_before_the_live_kernel_changed(
    tmp_path, monkeypatch, sglang_release
):
    """`kernels install` + `push` without --restart: the running server imported the old
    kernel file once at its start and runs it until it restarts, while the table shows the
    live (bundled) file: status says so, naming the file and both times (--json: server)."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    with StandInServer(tree) as server:
        code, out, err = tree.kd("kernels", "status", "--json", "--heads", "8")
        assert code == 0, err
        data = json.loads(out)
        assert data["server"]["pid"] == server.proc.pid and data["server"]["stale_files"] == []
        assert not any("before the live files last changed" in n for n in data["notes"])

        time.sleep(1.1)  # ctime has whole seconds
        assert tree.kd("kernels", "install")[0] == 0
        assert tree.kd("push")[0] == 0  # no --restart
        code, out, err = tree.kd("kernels", "status", "--json", "--heads", "8")
        assert code == 0, err
        data = json.loads(out)
        assert data["sites"][0]["kernel"]["kind"] == "bundled"
        assert [f["path"] for f in data["server"]["stale_files"]] == [tree.kernel]
        notes = " ".join(data["notes"])
        assert f"the running server (pid {server.proc.pid}) started at" in notes, notes
        assert f"before the live files last changed: {tree.kernel}" in notes
        assert "runs their earlier bytes until it restarts" in notes
        code, out, err = tree.kd("kernels", "status", "--heads", "8")
        assert code == 0 and "runs their earlier bytes" in " ".join(err.split()), err

    with StandInServer(tree):  # restarted: it imported the bytes that are live now
        code, out, err = tree.kd("kernels", "status", "--json", "--heads", "8")
        assert json.loads(out)["server"]["stale_files"] == [], out


# Per release: what the server runs with LOGIN_SWITCH's value set.
SWITCHED = {"0.5.14": "torch", "0.5.23": "triton"}


def test_status_says_when_the_servers_values_come_from_elsewhere_and_what_runs_now(
    tmp_path, monkeypatch, sglang_release
):
    """The restart command sets the switch (`SGLANG_SM120_FLASHMLA_BACKEND=triton exec ...`),
    the env file does not, and has not changed since kerneldev restarted the server: the note
    says the server's values come from elsewhere, so every restart sets them again (not that
    it runs them "until it restarts"); decode/prefill shows what the server's own values
    select (what runs now), and the env file's answer stays as what the file alone selects
    (--json: `running` beside `backend`, `server.values_from`); readable at 80 columns."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    name, value, default = LOGIN_SWITCH[sglang_release.version]
    switched = SWITCHED[sglang_release.version]
    assert tree.kd("restart")[0] == 0  # records the env file kerneldev's restart read
    with StandInServer(tree, {name: value}) as server:
        code, out, err = tree.kd("kernels", "status", "--json", "--heads", "8")
        assert code == 0, err
        data = json.loads(out)
        width = tree.kd(
            "kernels", "status", "--heads", "8", stdout_isatty=True, stderr_isatty=True, width=80
        )
    notes = " ".join(data["notes"])
    assert f"the running server (pid {server.proc.pid}) has other values" in notes, notes
    assert f"{name}={value} (env file: (unset))" in notes
    assert "come from elsewhere" in notes and "every restart sets them again" in notes
    assert "until it restarts" not in notes
    assert data["server"]["values_from"] == "elsewhere"
    assert data["server"]["differs"] == [name]
    (site,) = data["sites"]
    assert site["backend"]["backend"] == default  # what the env file alone selects
    assert site["backend"]["environment"] == str(tree.env_file)
    assert site["running"]["backend"] == switched, site["running"]  # what runs now
    assert site["running"]["switch"] == {name: value}
    assert f"pid {server.proc.pid}" in site["running"]["environment"]

    code, out, err = width
    assert code == 0, err
    out, err = (re.sub(r"\x1b\[[0-9;]*m", "", text) for text in (out, err))  # colours
    # only what has no space to wrap at (a module path) may overflow
    assert all(len(line) <= 80 or " " not in line.strip() for line in (out + err).splitlines()), (
        out + err
    )
    row = next(
        line for line in out.splitlines() if tree.kernel.split("/")[-1] in line or "other" in line
    )
    assert switched in row, out
    said = " ".join(err.split())
    assert f"runs now (environment: the running server's, pid {server.proc.pid})" in said, said
    assert f"with {tree.env_file} alone: {default}" in said, said

    # Without kerneldev's record, the file's change time tells: written before the server
    # started, the values came from elsewhere; rewritten after it started, from the file.
    from kerneldev.service import restart_record

    restart_record.record_file().unlink()
    tree.set_env("")
    time.sleep(1.1)  # ctime has whole seconds
    with StandInServer(tree, {name: value}):
        data = json.loads(tree.kd("kernels", "status", "--json", "--heads", "8")[1])
        assert data["server"]["values_from"] == "elsewhere", data["notes"]
        assert "has not changed since it started" in " ".join(data["notes"])
        time.sleep(1.1)
        tree.set_env("SGLANG_SM120_MMA_FLASHMLA=1\n")
        data = json.loads(tree.kd("kernels", "status", "--json", "--heads", "8")[1])
        assert data["server"]["values_from"] == "earlier env file", data["notes"]
        assert "it runs what those select until it restarts" in " ".join(data["notes"])
        assert data["sites"][0]["running"]["backend"] == switched


@pytest.mark.parametrize("sglang_release", ["0.5.23"], indirect=True)
def test_status_names_an_env_file_line_the_readers_take_differently(
    tmp_path, monkeypatch, sglang_release
):
    """`KEY=triton # ours`: a shell that sources the file sets triton, systemd and docker read
    `triton # ours` (the torch fallback). The answer takes the shell's reading and says so."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    tree.set_env("SGLANG_SM120_FLASHMLA_BACKEND=triton # ours\n")
    code, out, err = tree.kd("kernels", "status", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["sites"][0]["backend"]["backend"] == "triton"
    notes = [n for n in data["notes"] if "read differently" in n]
    assert len(notes) == 1 and "systemd" in notes[0], data["notes"]


@pytest.mark.parametrize("sglang_release", ["0.5.14"], indirect=True)
def test_status_knows_0_5_14_sends_prefill_to_its_sparse_kernel_when_switched(
    tmp_path, monkeypatch, sglang_release
):
    """0.5.14's backend (deepseek_v4_backend.py) sends extend calls to sgl_kernel's
    flash_mla_sparse_fwd before its sm_120 branch when SGLANG_OPT_FLASHMLA_SPARSE_PREFILL is
    true: the prefill row says so, the decode row is still the wrapper's answer."""
    tree = make_tree(tmp_path, monkeypatch, sglang_release, "local")
    tree.set_env("SGLANG_SM120_TRITON_FLASHMLA=1\nSGLANG_OPT_FLASHMLA_SPARSE_PREFILL=true\n")
    code, out, err = tree.kd("kernels", "status", "--json")
    assert code == 0, err
    data = json.loads(out)
    calls = {c["call"]: c for c in data["sites"][0]["backend"]["calls"]}
    assert calls["decode"]["backend"] == "triton"
    assert calls["prefill"]["backend"] == "sparse_prefill"
    assert calls["prefill"]["function"] == "sgl_kernel.flash_mla.flash_mla_sparse_fwd"
    reason = data["sites"][0]["backend"]["reason"]  # the line under the table says the same
    assert "tokens, 64 heads): sgl_kernel.flash_mla.flash_mla_sparse_fwd (SGLANG_OPT" in reason
    assert reason.count("flash_mla_sparse_decode_triton") == 1, reason  # the decode call's only
    assert any("more than 11,673 query tokens" in n for n in data["notes"]), data["notes"]

    tree.set_env("SGLANG_SM120_TRITON_FLASHMLA=1\n")  # off: the prefill is the wrapper's
    data = json.loads(tree.kd("kernels", "status", "--json")[1])
    calls = {c["call"]: c for c in data["sites"][0]["backend"]["calls"]}
    assert calls["prefill"]["backend"] == "triton"
