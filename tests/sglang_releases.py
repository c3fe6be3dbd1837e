"""Real SGLang releases as live trees for the tests (the drop-in, install, import check, status,
rollback), from the cache `scripts/sglang_releases.py` fills (`scripts/bootstrap test` runs it;
pytest itself downloads nothing).

Per test run and release, `session_release()` lays out once a trimmed tree (one for all the
run's pytest-xdist workers, `tests/per_run.py`; `laid_out_release()` reads it back): every
file of the release's `python/` that importing its sm_120 wrapper and kernel file loads (found
by importing them), plus the files that import those two modules (what the import check
scans). A test then copies that tree (`Release.copy_to`, well under a second) and gets the
release's real wrapper, kernel file, DSv4 backend and `sglang/__init__.py` chain, at the
release's own layout.

The test host's environment is `Release.env`: PYTHONPATH holds the package set 'wrapper-imports'
(the small packages the wrappers import) and tests/sglang_stubs/ (torchvision, which has no CPU
wheel on PyPI), so nothing but the release's bytes is in the live tree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUBS = Path(__file__).resolve().parent / "sglang_stubs"


def _fetch_module():
    spec = importlib.util.spec_from_file_location(
        "kerneldev_sglang_fetch", REPO / "scripts" / "sglang_releases.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fetch = _fetch_module()
VERSIONS = list(fetch.RELEASES)

# Where each release keeps its sm_120 files (relative to the repository root).
FOLDERS = {
    "0.5.14": "python/sglang/srt/layers/attention",
    "0.5.23": "python/sglang/kernels/ops/attention",
}
BACKEND_PATH = "python/sglang/srt/layers/attention/deepseek_v4_backend.py"


@dataclass
class Release:
    version: str
    tree: Path  # the session's trimmed tree (do not change it: copy it)
    folder: str
    files: list[str]  # relative to tree
    importers: list[str]  # files that import the wrapper or the kernel file
    env: dict[str, str]  # the test host's environment additions (PYTHONPATH)

    @property
    def kernel(self) -> str:
        return f"{self.folder}/flash_mla_sm120_triton.py"

    @property
    def wrapper(self) -> str:
        return f"{self.folder}/flash_mla_sm120.py"

    @property
    def package(self) -> str:
        return self.folder[len("python/") :].replace("/", ".")

    def copy_to(self, root: Path) -> Path:
        shutil.copytree(self.tree, root)
        return root

    def env_lines(self) -> str:
        """The env-file lines that give the service this environment."""
        return "".join(f"export {k}={v}\n" for k, v in self.env.items())


def missing_reason(version: str) -> str | None:
    """Why `version` cannot be used here, or None."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (the SGLang wrappers import it; KERNELDEV_TORCH=skip)"
    gaps = fetch.missing()
    if gaps:
        return (
            f"not in the SGLang release cache {fetch.cache_dir()}: {'; '.join(gaps)} "
            "(scripts/bootstrap test fills it: python scripts/sglang_releases.py fetch)"
        )
    return None


def host_env() -> dict[str, str]:
    path = [str(STUBS), str(fetch.package_dir("wrapper-imports"))]
    return {"PYTHONPATH": os.pathsep.join(path)}


_LOADED = """
import importlib, json, sys
for name in sys.argv[2:]:
    importlib.import_module(name)
root = sys.argv[1]
print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values())
                         if (getattr(m, "__file__", None) or "").startswith(root)})))
"""


def session_release(version: str, dest: Path) -> Release:
    """Lay out the trimmed tree of `version` under `dest` (see the module's docstring)."""
    source = fetch.release_root(version) / "python"
    folder = FOLDERS[version]
    package = folder[len("python/") :].replace("/", ".")
    modules = [f"{package}.flash_mla_sm120", f"{package}.flash_mla_sm120_triton"]
    env = host_env()
    proc = subprocess.run(
        [sys.executable, "-B", "-c", _LOADED, str(source) + os.sep, *modules],
        cwd=source,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(source), env["PYTHONPATH"]])),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"SGLang {version}'s wrapper does not import here:\n{proc.stderr}")
    loaded = [Path(f).relative_to(source.parent).as_posix() for f in json.loads(proc.stdout)]
    importers = []
    needles = [m.encode() for m in modules] + [b"flash_mla_sm120"]
    for path in source.rglob("*.py"):
        rel = path.relative_to(source.parent).as_posix()
        if rel not in loaded and any(n in path.read_bytes() for n in needles):
            importers.append(rel)
    files = sorted(set(loaded) | set(importers))
    for rel in files:  # every package on the way keeps its __init__.py
        parts = rel.split("/")
        for i in range(2, len(parts)):
            init = "/".join(parts[:i]) + "/__init__.py"
            if (source.parent / init).exists() and init not in files:
                files.append(init)
    tree = dest / version
    for rel in files:
        target = tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source.parent / rel, target)
    manifest = {"files": sorted(files), "importers": sorted(importers)}
    (dest / f"{version}.json").write_text(json.dumps(manifest))
    return Release(version, tree, folder, manifest["files"], manifest["importers"], env)


def laid_out_release(version: str, dest: Path) -> Release:
    """The release `session_release(version, dest)` laid out earlier (maybe in another test
    process of the run: tests/per_run.py)."""
    manifest = json.loads((dest / f"{version}.json").read_text())
    files, importers = manifest["files"], manifest["importers"]
    return Release(version, dest / version, FOLDERS[version], files, importers, host_env())
