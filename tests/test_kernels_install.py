"""Deploying the bundled kernels into a live tree shaped like SGLang's (kerneldev/fake_sglang.py:
a wrapper, a DSv4 backend and a test module that import the kernel file), through the CLI, over
the real sshd and the local transport: `kernels install` + `push --restart` leaves a tree whose
backend call runs; a wrapper without `flash_mla_with_kvcache_sm120` is refused before upload; a
file that does not import is rolled back without a restart."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kerneldev import fake_sglang, kernel_deploy
from kerneldev.cli.environment import Environment
from kerneldev.cli.main import main
from kerneldev.envfile import parse_env_file
from kerneldev.kernel_deploy import BackendChoice, FileStatus, wrapper_backend
from kerneldev.sandbox import find_sshd
from kerneldev.transport import _importscan
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

    def kd(self, *args: str):
        """`kerneldev --config <this> ARGS` through the real entry, in a pipe."""
        out, err = io.StringIO(), io.StringIO()
        env = Environment(stdout=out, stderr=err, stdin=io.StringIO())
        code = main(["--config", str(self.config), *args], env=env)
        return int(code), out.getvalue(), err.getvalue()

    def live(self, path: str) -> bytes:
        return (self.root / path).read_bytes()


def make_tree(tmp_path: Path, monkeypatch, layout: str, transport: str, server=None) -> Tree:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("KERNELDEV_SSH_CONFIG", "none")
    root = tmp_path / "sglang"
    fake_sglang.write_tree(root, layout)
    kernel, wrapper = fake_sglang.kernel_paths(layout)
    env_file = tmp_path / "sglang.env"
    env_file.write_text("# read by the service\nexport SGLANG_SM120_FLASHMLA_BACKEND=auto\n")
    restarts = tmp_path / "restarts"
    entry: dict = {"transport": transport}
    if transport == "ssh":
        entry.update(ssh_entry(server, tmp_path))
    entry.update(
        root=str(root),
        files=[kernel, wrapper],
        workspace="ws",
        python=sys.executable,
        service={"restart": f"echo restarted >> '{restarts}'", "env_file": str(env_file)},
    )
    config = tmp_path / "hosts.yaml"
    config.write_text(yaml.safe_dump({"hosts": {"h": entry}}))
    return Tree(config, root, tmp_path / "ws", kernel, wrapper, restarts)


def run_backend_call(root: Path) -> float:
    """The live tree's DSv4 backend decodes tiny inputs on CPU (Triton interpreter); returns the
    largest error against kerneldev's float64 reference."""
    code = (
        "import torch\n"
        "from kerneldev.kernels.dsv4_reference import make_inputs, reference_sparse_decode\n"
        "from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend\n"
        "x = make_inputs(2, 4, 16, 16, extra_topk=8, extra_page_size=4, with_sink=True,\n"
        "                topk_length='partial', indices_3d=True, seed=7)\n"
        "backend = DeepseekV4AttnBackend(512, x['softmax_scale'])\n"
        "out = backend.forward_decode(x['q'], x['k_cache'], x['indices'], x['topk_length'],\n"
        "    x['attn_sink'], (x['extra_k_cache'], x['extra_indices'], x['extra_topk_length']))\n"
        "ref, _ = reference_sparse_decode(**x)\n"
        "print((out.float() - ref.float()).abs().max().item())\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root / "python",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return float(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "layout,transport,with_wrapper",
    [("srt", "ssh", False), ("kernels", "local", True)],
)
def test_install_then_push_restart_leaves_a_working_backend(
    tmp_path, monkeypatch, request, layout, transport, with_wrapper
):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    server = None
    if transport == "ssh":
        if find_sshd() is None:
            pytest.skip("sshd is not installed")
        server = request.getfixturevalue("sshd_server")
    tree = make_tree(tmp_path, monkeypatch, layout, transport, server)

    code, out, err = tree.kd("kernels", "status", "--json")
    assert code == 0, err
    site = json.loads(out)["sites"][0]
    assert site["kernel"]["kind"] == "other"
    assert site["backend"]["backend"] == "triton"  # auto, FlashInfer not installed here
    assert site["backend"]["environment"].endswith("sglang.env")

    args = ["kernels", "install", "--json"] + (["--with-wrapper"] if with_wrapper else [])
    code, out, err = tree.kd(*args)
    assert code == 0, err
    installed = {f["path"]: f for f in json.loads(out)["files"]}
    assert installed[tree.kernel]["action"] == "installed"
    assert (tree.workspace / tree.kernel).read_bytes() == BUNDLED_KERNEL
    assert (tree.wrapper in installed) == with_wrapper
    assert "+++ bundled/" in installed[tree.kernel]["patch"]

    code, out, err = tree.kd("push", "--restart", "--json")
    assert code == 0, err
    pushed = json.loads(out)
    check = pushed["import_check"]
    assert fake_sglang.TEST_PATH in check["scan"]["importers"]
    assert check["scan"]["missing"] == []
    assert check["after_upload"]["ok"] is True
    assert tree.live(tree.kernel) == BUNDLED_KERNEL
    assert tree.restarts.read_text().count("restarted") == 1

    code, out, err = tree.kd("kernels", "status", "--json")
    site = json.loads(out)["sites"][0]
    assert site["kernel"]["kind"] == "bundled"
    assert site["backend"]["backend"] == "triton" and site["backend"]["kernel_variant"] == "simt"

    assert run_backend_call(tree.root) < 2e-2  # bf16 output of a 24-token softmax


def test_install_force_keeps_the_overwritten_edits(tmp_path, monkeypatch, sshd_server):
    tree = make_tree(tmp_path, monkeypatch, "srt", "ssh", sshd_server)
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


def test_wrapper_without_entry_point_is_refused_before_upload(tmp_path, monkeypatch):
    tree = make_tree(tmp_path, monkeypatch, "srt", "local")
    assert tree.kd("pull")[0] == 0
    before = tree.live(tree.wrapper)
    # A re-export-only wrapper, as kerneldev once bundled: SGLang's backend cannot import it.
    (tree.workspace / tree.wrapper).write_text(
        "from .flash_mla_sm120_triton import flash_mla_sparse_decode_triton  # noqa: F401\n"
    )
    code, out, err = tree.kd("push", "--restart", "--json")
    assert code == 1
    message = " ".join(err.split())
    assert fake_sglang.BACKEND_PATH in message and "flash_mla_with_kvcache_sm120" in message
    assert "sglang.srt.layers.attention.flash_mla_sm120" in message
    assert tree.live(tree.wrapper) == before
    assert not tree.restarts.exists()
    missing = json.loads(out)["import_check"]["scan"]["missing"]
    assert {(m["importer"], m["name"]) for m in missing} >= {
        (fake_sglang.BACKEND_PATH, "flash_mla_with_kvcache_sm120"),
        (fake_sglang.TEST_PATH, "_D"),
    }


def test_file_that_fails_to_import_is_rolled_back_without_restart(tmp_path, monkeypatch):
    tree = make_tree(tmp_path, monkeypatch, "srt", "local")
    assert tree.kd("pull")[0] == 0
    before = tree.live(tree.kernel)
    broken = (
        fake_sglang.OLD_KERNEL + "\nimport a_module_kerneldev_never_installs  # noqa: F401\n"
    ).encode()
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


def test_with_wrapper_refused_when_the_bundled_one_lacks_public_names(tmp_path, monkeypatch):
    tree = make_tree(tmp_path, monkeypatch, "srt", "local")
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


def test_backend_rules_of_the_known_wrappers():
    other = FileStatus("k.py", "0" * 64, kernel_deploy.OTHER, None)
    bundled = FileStatus("k.py", "0" * 64, kernel_deploy.BUNDLED, "this kerneldev")
    newer = b"os.environ.get('SGLANG_SM120_FLASHMLA_BACKEND'); import flashinfer"
    older = b"os.environ.get('SGLANG_SM120_TRITON_FLASHMLA', '1')"

    def pick(source, env, fi=False, kernel=other) -> BackendChoice:
        return wrapper_backend(source, None, kernel, env, fi)

    assert pick(newer, {}, fi=True).backend == "flashinfer"
    assert pick(newer, {}, fi=False).backend == "triton"
    assert pick(newer, {"SGLANG_SM120_FLASHMLA_BACKEND": "torch"}, fi=True).backend == "torch"
    assert pick(older, {"SGLANG_SM120_TRITON_FLASHMLA": "0"}).backend == "torch"
    mma = pick(older, {"SGLANG_SM120_MMA_FLASHMLA": "1"}, kernel=bundled)
    assert (mma.backend, mma.kernel_variant) == ("triton", "mma")
    assert pick(b"def f(): pass", {}).backend is None
    assert parse_env_file("# c\nexport A='1'\nB=\"x y\"\n\nC=3=4\n") == {
        "A": "1",
        "B": "x y",
        "C": "3=4",
    }


def test_service_check_replaces_the_default_import(tmp_path, monkeypatch):
    tree = make_tree(tmp_path, monkeypatch, "srt", "local")
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
    assert seen.read_text().split() == [
        "sglang.srt.layers.attention.flash_mla_sm120_triton",
        "auto",
    ]
    assert tree.live(tree.kernel) == before  # rolled back


def test_ctrl_c_during_the_import_check_says_what_is_live_and_unchecked(tmp_path, monkeypatch):
    """Ctrl-C while the pushed module is being imported on the host: the push has landed, so
    exit 130 with the Deployed summary and the import marked as not checked (not a bare
    "interrupted"), and --json still carries the push."""
    tree = make_tree(tmp_path, monkeypatch, "srt", "local")
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


def test_import_check_uses_only_the_configured_python(tmp_path, monkeypatch):
    """The import after the upload runs with the host's configured `python` (the server's):
    when that is missing it says so and the push is undone, rather than importing with another
    interpreter and reporting it as the configured one."""
    tree = make_tree(tmp_path, monkeypatch, "srt", "local")
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


def test_install_without_a_configured_kernel_file_is_a_usage_error(tmp_path, monkeypatch):
    tree = make_tree(tmp_path, monkeypatch, "srt", "local")
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
        "vllm/models/deepseek_v4/nvidia/flash_mla_sm120_triton.py",
        "elsewhere/flash_mla_sm120_triton.py",
    ]
    sites = kernel_deploy.find_sites(paths)
    assert [(s.layout, s.wrapper is not None) for s in sites] == [
        ("sglang", True),
        ("sglang (kernels/ops)", False),
        ("vllm", False),
    ]
    assert kernel_deploy.classify_file("flash_mla_sm120_triton.py", "f" * 64)[0] == "other"
    assert (
        kernel_deploy.classify_file(
            "flash_mla_sm120_triton.py",
            next(iter(kernel_deploy.RELEASED["flash_mla_sm120_triton.py"])),
        )[0]
        == "bundled-older"
    )
