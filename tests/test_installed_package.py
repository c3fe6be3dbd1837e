"""The package as a user installs it: a non-editable wheel built from this tree ships every
package of the source tree (a moved or new package must not silently drop out of the wheel's
explicit package list), the host-side scripts and `kerneldev.kernels`, and it runs.

The wheel is built with the venv's own setuptools (`--no-build-isolation`, nothing downloaded)
and installed with `--no-deps --target` into a fresh folder; its dependencies (typer, paramiko,
...) come from the running venv, but `kerneldev` itself is imported only from that folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Ignored folders a checkout may hold (venvs, caches, device-run copies): not the source.
_NOT_SOURCE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*cache", ".kdev*")
_NOT_SOURCE += (".peers", ".whl", ".gl", ".device", "dsv4-live")
# Hypothesis's example database: other test workers write into it while this copy runs
_NOT_SOURCE += (".hypothesis",)


def _source_packages() -> set[str]:
    """Every package of the source tree as the wheel names it (kernels/ is kerneldev.kernels)."""
    found = {"kerneldev.kernels"}
    for init in (REPO / "kerneldev").rglob("__init__.py"):
        if "__pycache__" in init.parts:
            continue
        found.add(".".join(init.parent.relative_to(REPO).parts))
    return found


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed into)."""
    # From a copy of the tree: setuptools reuses a build/ folder in place, which would still hold
    # a package that the package list no longer names.
    source = tmp_path_factory.mktemp("source") / "kerneldev"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    out = tmp_path_factory.mktemp("wheel")
    build = _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source))
    if build.returncode != 0 and "No module named" in build.stderr and "setuptools" in build.stderr:
        pytest.skip("this venv has no setuptools to build the wheel with")
    assert build.returncode == 0, build.stderr
    (wheel,) = out.glob("kerneldev-*.whl")
    target = tmp_path_factory.mktemp("site")
    install = _pip(
        "install", "--no-deps", "--no-compile", "-q", "--target", str(target), str(wheel)
    )
    assert install.returncode == 0, install.stderr
    return wheel, target


def _run_installed(target: Path, *args: str) -> subprocess.CompletedProcess:
    # Run from the install folder, not the repo (whose kerneldev/ would shadow it); PYTHONPATH
    # puts the installed copy before the venv's editable finder.
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONNOUSERSITE": "1"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300,
        cwd=target,
    )  # fmt: skip


def test_the_wheel_ships_every_package_and_the_kernel_files(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {".".join(Path(n).parent.parts) for n in names if n.endswith("/__init__.py")} | {
        "kerneldev.kernels"
    }
    missing = _source_packages() - shipped
    assert not missing, f"packages of the source tree missing from the wheel: {sorted(missing)}"
    for kernel_file in (REPO / "kernels").glob("*.py"):
        assert f"kerneldev/kernels/{kernel_file.name}" in names
    for helper in (REPO / "kerneldev" / "hostside").glob("*.py"):
        assert f"kerneldev/hostside/{helper.name}" in names


def test_the_installed_copy_runs_help_and_imports_every_package(installed):
    _, target = installed
    helped = _run_installed(target, "-m", "kerneldev", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "pull" in helped.stdout and "push" in helped.stdout
    # Every package imports, from the installed copy and not from the source tree.
    packages = sorted(_source_packages())
    code = (
        "import importlib, os, sys\n"
        f"target = {str(target)!r}\n"
        f"for name in {packages!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    assert os.path.realpath(module.__file__).startswith(target), module.__file__\n"
        "print('ok')\n"
    )
    imported = _run_installed(target, "-c", code)
    assert imported.returncode == 0 and imported.stdout.strip() == "ok", imported.stderr


def _editable_install_of_this_tree() -> bool:
    """Whether the running venv has kerneldev installed in editable mode from this tree (the
    README's install: scripts/bootstrap, or `pip install -e .`)."""
    import json
    from importlib import metadata

    # Every kerneldev distribution on the path: a build leaves a kerneldev.egg-info in the tree,
    # which pytest's `pythonpath = ["."]` puts first.
    for dist in metadata.distributions(name="kerneldev"):
        info = json.loads(dist.read_text("direct_url.json") or "{}")
        if info.get("dir_info", {}).get("editable") and info.get("url") == REPO.resolve().as_uri():
            return True
    return False


def test_the_editable_install_starts_without_an_import_hook():
    """Every command pays the interpreter's start-up, `site` and its `.pth` files included. For a
    layout it cannot put on `sys.path` as one folder, setuptools' editable install adds an import
    hook instead (`__editable___kerneldev_*_finder`, which imports pathlib, re and urllib.parse:
    ~30 ms of every command on a slow 2-core machine, a kept no-op's largest single part). The
    tree is laid out so that it can: `package-dir` maps "" to ".", and `kerneldev/kernels` is a
    link to `kernels/`. A new `package-dir` entry brings the hook back; this test fails then."""
    if not _editable_install_of_this_tree():
        pytest.skip("kerneldev is not installed in editable mode from this tree")
    code = "import sys; print(sorted(m for m in sys.modules if m.startswith('__editable__')))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    started = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
        cwd="/",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "[]", f"an import hook runs at start-up: {started.stdout}"
    assert (REPO / "kerneldev" / "kernels").resolve() == (REPO / "kernels").resolve()
