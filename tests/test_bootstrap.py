"""scripts/bootstrap's decisions, with a stand-in Python, pip and apt-get (nothing is installed
or downloaded): a project venv instead of the system Python (PEP 668), python3-venv via apt
when venv cannot work, the torch build chosen, and a second run that installs nothing.

The stand-in is a small Python program: `-c` and `-` code runs in the real interpreter with
`sys.prefix` and the importable `torch`/`kerneldev` faked; `-m venv`, `-m pip`, `-m kerneldev`
and `-m pytest` only record what they were asked to do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

FAKE_PYTHON = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys, types
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    in_venv = os.path.exists(os.path.join(here, "pyvenv.cfg"))
    log = os.environ["FAKE_LOG"]
    installed_file = os.path.join(here, "installed.json")
    installed = json.load(open(installed_file)) if os.path.exists(installed_file) else []
    args = sys.argv[1:]
    with open(log, "a") as f:
        f.write(json.dumps({{"python": here, "venv": in_venv, "args": args}}) + "\\n")

    def module(name):
        if args[:2] == ["-m", "venv"]:
            if os.environ.get("FAKE_NO_VENV") and not os.path.exists(os.environ["FAKE_APT_DONE"]):
                sys.exit("The virtual environment was not created: ensurepip is not available")
            target = os.path.abspath(args[2])
            os.makedirs(os.path.join(target, "bin"), exist_ok=True)  # over a folder: kept
            open(os.path.join(target, "pyvenv.cfg"), "a").close()
            if os.path.exists(os.path.join(target, "no-pip")):
                os.remove(os.path.join(target, "no-pip"))  # ensurepip adds it
            me = os.path.join(target, "bin", "python")
            with open(os.path.abspath(__file__)) as src, open(me, "w") as dst:
                dst.write(src.read())
            os.chmod(me, 0o755)
        elif name == "pip":
            if not in_venv:
                sys.exit("error: externally-managed-environment")
            if os.path.exists(os.path.join(here, "no-pip")):  # a creation cut short
                sys.exit("No module named pip")
            if "--dry-run" in args:
                report = args[args.index("--report") + 1]
                version = os.environ.get("FAKE_TORCH", "2.13.0+cpu")
                extra = [{{"metadata": {{"name": "nvidia-cublas-cu12", "version": "1"}}}}] * int(
                    os.environ.get("FAKE_NVIDIA", "0")
                )
                install = [{{"metadata": {{"name": "torch", "version": version}}}}] + extra
                json.dump({{"install": install}}, open(report, "w"))
            else:
                wanted = [a for a in args if a.startswith(("torch", "-e"))]
                names = ["torch" if w.startswith("torch") else "kerneldev" for w in wanted]
                json.dump(installed + names, open(installed_file, "w"))
                print("Successfully installed " + " ".join(names))

    if args and args[0] == "-m":
        module(args[1])
        sys.exit(0)
    sys.prefix = here
    sys.base_prefix = "/base" if in_venv else here
    for name in ("torch", "kerneldev"):
        if name in installed:
            fake = types.ModuleType(name)
            fake.__version__ = "2.13.0+cpu"
            fake.__file__ = os.path.join(os.environ["FAKE_REPO"], name, "__init__.py")
            sys.modules[name] = fake
        elif name + "-partial" in installed:  # an interrupted install: a folder, no version
            sys.modules[name] = types.ModuleType(name)
        else:
            sys.modules[name] = None  # import fails
    if args[0] == "-c":
        sys.argv = ["-c"] + args[2:]
        exec(compile(args[1], "<string>", "exec"), {{"__name__": "__main__"}})
    elif args[0] == "-":
        sys.argv = args
        exec(compile(sys.stdin.read(), "<stdin>", "exec"), {{"__name__": "__main__"}})
    """
)

FAKE_APT = """#!/bin/sh
echo "$0 $*" >> "$FAKE_LOG.apt"
touch "$FAKE_APT_DONE"
"""


@pytest.fixture
def world(tmp_path, monkeypatch):
    if shutil.which("bash") is None or shutil.which("sha256sum") is None:
        pytest.skip("needs bash and coreutils")
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "bootstrap", repo / "scripts" / "bootstrap")
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    system = tmp_path / "system"
    (system / "bin").mkdir(parents=True)
    python = system / "bin" / "python3"
    python.write_text(FAKE_PYTHON.format(python=sys.executable))
    python.chmod(0o755)
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("apt-get", "sudo", "sshd"):
        (tools / name).write_text(FAKE_APT if name != "sudo" else '#!/bin/sh\nexec "$@"\n')
        (tools / name).chmod(0o755)
    log = tmp_path / "log.jsonl"
    env = {
        "PATH": f"{tools}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "PYTHON": str(python),
        "FAKE_LOG": str(log),
        "FAKE_REPO": str(repo.resolve()),
        "FAKE_APT_DONE": str(tmp_path / "apt-done"),
    }

    def bootstrap(*args: str, **extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
        if log.exists():
            log.unlink()
        proc = subprocess.run(
            ["bash", str(repo / "scripts" / "bootstrap"), *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return proc, calls

    bootstrap.repo = repo  # type: ignore[attr-defined]
    bootstrap.apt_log = Path(str(log) + ".apt")  # type: ignore[attr-defined]
    return bootstrap


def _pip_installs(calls: list[dict]) -> list[list[str]]:
    return [
        c["args"]
        for c in calls
        if c["args"][:3] == ["-m", "pip", "install"] and "--dry-run" not in c["args"]
    ]


def test_a_system_python_gets_a_project_venv_and_pip_runs_only_there(world):
    proc, calls = world("demo")
    assert proc.returncode == 0, proc.stderr
    venv = world.repo / ".venv"
    assert (venv / "pyvenv.cfg").exists()
    assert all(c["venv"] for c in calls if c["args"][:2] == ["-m", "pip"])
    installs = _pip_installs(calls)
    # pip's own configuration serves a CPU wheel here: plain pip, no PyTorch index.
    assert installs[0][-1] == "torch==2.13.0" and "--index-url" not in installs[0]
    assert installs[1][-2:] == ["-e", ".[kernels,test,service]"]
    assert calls[-1]["args"] == ["-m", "kerneldev", "demo"] and calls[-1]["venv"]
    assert "creating the virtualenv .venv" in proc.stderr and "CPU build" in proc.stderr

    # The second run installs nothing and runs the job.
    again, calls = world("test")
    assert again.returncode == 0, again.stderr
    assert _pip_installs(calls) == [] and "already installed" in again.stderr
    # pytest on two workers per core (at most 8) unless KERNELDEV_TEST_WORKERS says otherwise
    workers = min(2 * len(os.sched_getaffinity(0)), 8)
    assert calls[-1]["args"] == ["-m", "pytest", "-q", "-n", str(workers), "--dist", "worksteal"]
    # test: the SGLang releases are fetched first (pytest itself downloads nothing)
    assert calls[-2]["args"] == ["scripts/sglang_releases.py", "fetch"] and calls[-2]["venv"]

    offline, calls = world("test", KERNELDEV_SGLANG="skip")
    assert offline.returncode == 0, offline.stderr
    assert all(c["args"][:1] != ["scripts/sglang_releases.py"] for c in calls)
    assert "KERNELDEV_SGLANG=skip" in offline.stderr

    auto, calls = world("test", KERNELDEV_TEST_WORKERS="auto")  # the default, said explicitly
    assert auto.returncode == 0, auto.stderr
    assert calls[-1]["args"] == ["-m", "pytest", "-q", "-n", str(workers), "--dist", "worksteal"]
    three, calls = world("test", KERNELDEV_TEST_WORKERS="3")  # the user picks the count
    assert three.returncode == 0, three.stderr
    assert calls[-1]["args"] == ["-m", "pytest", "-q", "-n", "3", "--dist", "worksteal"]
    serial, calls = world("test", KERNELDEV_TEST_WORKERS="0")  # one process, the escape hatch
    assert serial.returncode == 0, serial.stderr
    assert calls[-1]["args"] == ["-m", "pytest", "-q", "-n", "0"]


def test_python3_venv_is_installed_via_apt_when_venv_cannot_work(world):
    proc, _ = world("demo", FAKE_NO_VENV="1")
    assert proc.returncode == 0, proc.stderr
    apt = world.apt_log.read_text()
    assert "install -y -qq python3." in apt and "-venv" in apt
    assert (world.repo / ".venv" / "pyvenv.cfg").exists()


def test_cpu_is_fetched_from_the_pytorch_cpu_index_when_pip_would_pick_cuda(world):
    proc, calls = world("demo", FAKE_TORCH="2.13.0", FAKE_NVIDIA="12")
    assert proc.returncode == 0, proc.stderr
    torch = _pip_installs(calls)[0]
    assert torch[torch.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert "12 nvidia-* wheels" in proc.stderr


def test_the_user_picks_the_torch_build(world):
    proc, calls = world("demo", KERNELDEV_TORCH_INDEX="https://mirror.example/whl/cu128")
    assert proc.returncode == 0, proc.stderr
    assert "https://mirror.example/whl/cu128" in _pip_installs(calls)[0]

    skip, calls = world("demo", KERNELDEV_TORCH="skip")
    assert skip.returncode == 0, skip.stderr
    assert [i[-1] for i in _pip_installs(calls)] == [".[test,service]"]

    bad, _ = world("demo", KERNELDEV_TORCH="rocm")
    assert bad.returncode == 2 and "KERNELDEV_TORCH must be" in bad.stderr


def test_an_interrupted_torch_install_is_installed_again(world):
    """A torch that imports without a version (the folder a Ctrl-C during pip leaves) is not
    "already installed": bootstrap says so and installs it again over the remains, then the
    rest, and the job runs."""
    first, _ = world("demo", KERNELDEV_TORCH="skip")  # a venv with kerneldev, no torch
    assert first.returncode == 0, first.stderr
    (world.repo / ".venv" / "installed.json").write_text(json.dumps(["torch-partial"]))
    proc, calls = world("demo")
    assert proc.returncode == 0, proc.stderr
    assert "is incomplete (an interrupted install?)" in proc.stderr
    assert "already installed; kept" not in proc.stderr
    torch = _pip_installs(calls)[0]
    assert "--force-reinstall" in torch and torch[-1] == "torch==2.13.0"
    assert calls[-1]["args"] == ["-m", "kerneldev", "demo"]


def test_a_venv_left_without_pip_gets_pip_and_keeps_what_it_has(world):
    """A virtualenv whose creation was cut short (Ctrl-C during ensurepip: a python, no pip)
    is completed in place (venv over the folder), not left to fail at the first pip call."""
    first, _ = world("demo", KERNELDEV_TORCH="skip")
    assert first.returncode == 0, first.stderr
    venv = world.repo / ".venv"
    (venv / "no-pip").touch()
    (venv / "kept").touch()
    proc, calls = world("demo")
    assert proc.returncode == 0, proc.stderr
    assert "has no pip (an interrupted creation?): adding it" in proc.stderr
    assert any(c["args"][:2] == ["-m", "venv"] and not c["venv"] for c in calls)
    assert (venv / "kept").exists() and not (venv / "no-pip").exists()
    assert _pip_installs(calls)[0][-1] == "torch==2.13.0"
    assert calls[-1]["args"] == ["-m", "kerneldev", "demo"]
