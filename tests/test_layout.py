"""The layout as a newcomer reads it (docs/architecture.md): the host-side scripts stand alone,
nothing sent to a host is kept in a string, every `.kerneldev` path and every error class has
one home, and few modules are left directly under kerneldev/."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import kerneldev
from kerneldev.errors import KerneldevError

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kerneldev"
HOSTSIDE = PACKAGE / "hostside"
HOST_SCRIPTS = sorted(p for p in HOSTSIDE.glob("*.py") if p.name != "__init__.py")

# Imports each file as the host does: a standalone module, no site-packages, no kerneldev.
IMPORT_ALONE = """
import importlib.util, json, sys
sys.path[:] = [p for p in sys.path if "site-packages" not in p and "dist-packages" not in p]
spec = importlib.util.spec_from_file_location("hostside_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(sorted(n for n in sys.modules if n.split(".")[0] == "kerneldev")))
"""


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(kerneldev.__path__, "kerneldev."):
        if info.name.startswith("kerneldev.kernels") or info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return names


def _source_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _strings(tree: ast.AST):
    """Every string constant that is not a docstring."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node


@pytest.mark.parametrize("script", HOST_SCRIPTS, ids=lambda p: p.name)
def test_each_host_side_script_imports_with_the_standard_library_alone(script, tmp_path):
    # -I: no PYTHONPATH, no user site, not the current folder; -S: no site-packages
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", IMPORT_ALONE, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []  # nothing of kerneldev


def test_the_host_side_scripts_are_linted_like_every_other_file():
    # they are real files under kerneldev/, which `ruff check kerneldev` covers; no exclusion
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "exclude" not in pyproject.split("[tool.ruff.lint]")[1].split("\n[tool.")[0]
    for script in HOST_SCRIPTS:
        ast.parse(script.read_text(encoding="utf-8"))


def test_no_module_keeps_python_source_in_a_string():
    """Code sent to a host lives in hostside/ as a file (read at run time), never in a string
    literal that ruff cannot see."""
    # The fake SGLang checkout's files are the sandbox's data (an SGLang tree to edit and diff),
    # not scripts kerneldev runs.
    allowed = {PACKAGE / "sandbox" / "fake_sglang.py"}
    found = []
    for path in _source_files():
        if path in allowed:
            continue
        for node in _strings(ast.parse(path.read_text(encoding="utf-8"))):
            text = node.value
            if text.count("\n") < 2:
                continue
            try:
                code = ast.parse(text)
            except SyntaxError:
                continue
            if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(code)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"Python source kept in strings: {found}"


def test_every_kerneldev_path_literal_is_in_the_paths_module():
    found = []
    for path in _source_files():
        if path == PACKAGE / "paths.py":
            continue
        for node in _strings(ast.parse(path.read_text(encoding="utf-8"))):
            if ".kerneldev" in node.value:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}")
    assert not found, found


def test_the_errors_module_imports_nothing_else_of_kerneldev():
    tree = ast.parse((PACKAGE / "errors.py").read_text(encoding="utf-8"))
    imported = [
        getattr(node, "module", None) or ",".join(a.name for a in node.names)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]
    assert not [name for name in imported if name and name.startswith("kerneldev")], imported


def test_every_error_class_lives_in_the_errors_module():
    for name in _modules():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:  # an optional extra (torch, fastapi) not installed
            if (err.name or "").startswith("kerneldev"):
                raise
    pending, classes = [KerneldevError], []
    while pending:
        cls = pending.pop()
        classes.append(cls)
        pending.extend(cls.__subclasses__())
    elsewhere = [
        f"{c.__module__}.{c.__qualname__}" for c in classes if c.__module__ != "kerneldev.errors"
    ]
    assert not elsewhere, elsewhere


def test_at_most_twelve_modules_directly_under_kerneldev():
    flat = sorted(
        p.stem for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    assert len(flat) <= 12, flat


def test_the_import_contracts_hold():
    """pyproject's [tool.importlinter] contracts (CI runs `lint-imports` too): the layers, the
    core without typer or rich, hostside and errors importing nothing of kerneldev, no cycles."""
    pytest.importorskip("importlinter")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command as lint\n"
            "sys.argv[0] = 'lint-imports'; sys.exit(lint())",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_every_module_is_named_in_the_architecture_doc():
    """docs/architecture.md is the map a newcomer reads: a module it does not name is one they
    cannot find (`__init__` and `__main__` aside; `kernels/` is docs/kernels.md's)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    unnamed = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name not in ("__init__.py", "__main__.py")
        and "kernels" not in path.relative_to(PACKAGE).parts
        and f"`{path.name}`" not in text
    ]
    assert unnamed == []
