#!/usr/bin/env python3
"""Fetch the pinned SGLang releases that the tests use as live trees, into a cache they reuse.

`scripts/bootstrap test` runs this before pytest (the tests themselves send no traffic beyond
loopback; they skip, saying why, when the cache is missing). Standard library only: it runs with
the Python that runs the tests, whose pip does the downloads.

What it lays out under the cache (`$KERNELDEV_SGLANG_CACHE`, default
`~/.cache/kerneldev/sglang`), each part written to a temporary folder and renamed into place
only when complete, so an interrupted run leaves nothing half-made and a second run downloads
nothing:

    wheels/sglang-<v>-<tag>.whl          the release's wheel (`pip download --no-deps`),
                                         checked against the sha256 pinned below
    releases/<v>/python/sglang/...       the wheel's Python package, as SGLang's repo has it
                                         under python/ (the live tree the fixtures copy)
    releases/<v>/release.json            what was laid out (written last)
    packages/<python>/<set>/             a `pip install --target` folder per package set below,
    packages/<python>/<set>.json         built for this Python (the sets hold compiled wheels),
                                         with its bytecode, as pip leaves a host's packages

The wheels are CPython 3.11 manylinux builds; only their Python files are used, so they are
fetched for that platform whatever this machine runs. Nothing of SGLang is ever committed:
the cache lives outside the repository.

Usage: sglang_releases.py [fetch|check|path] [--cache DIR] [--quiet]
  fetch (default)  download and lay out what is missing; exit 1 with the reason on failure
  check            exit 0 when everything is laid out, else 1 naming what is missing (no network)
  path             print the cache folder
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# The releases the tests run against: version -> (wheel file name, its sha256). 0.5.14 has the
# sm_120 wrapper under srt/layers/attention/ (switch SGLANG_SM120_TRITON_FLASHMLA); 0.5.23 moved
# it to kernels/ops/attention/ (switch SGLANG_SM120_FLASHMLA_BACKEND, default flashinfer).
RELEASES = {
    "0.5.14": (
        "sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl",
        "4fe16056b45c8aca00f5f90ceb174dc3a62a3f5dccf159c791370795cd00fc99",
    ),
    "0.5.23": (
        "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
        "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
    ),
}
WHEEL_PLATFORM = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
WHEEL_PLATFORM += ["--platform", "manylinux_2_34_x86_64"]

# Package sets, each installed (`--no-deps`, exact pins, wheels only) into its own folder for the
# test host's Python, to be put on its PYTHONPATH; torch, triton and numpy come from the venv.
# Every set lists its whole closure, so pip resolves nothing and a run is reproducible. Adding a
# set: one entry here (a name, why, the pins); `package_dir(name)` is where the tests find it.
PACKAGE_SETS: dict[str, tuple[str, list[str]]] = {
    # Importing either release's sm_120 wrapper runs `sglang/__init__.py` and
    # `sglang.srt.utils`, which import these at module level (found by importing both wrappers
    # and their kernel files on CPU with only torch, triton and numpy installed). torchvision is
    # not here: PyPI's Linux wheel needs CUDA's libraries, so the tests stub it (tests/
    # sglang_stubs/), in the test host's environment only.
    "wrapper-imports": (
        "what importing the releases' sm_120 wrappers needs besides torch, triton, numpy",
        [
            "aiohappyeyeballs==2.7.1",
            "aiohttp==3.14.5",
            "aiosignal==1.4.0",
            "annotated-types==0.7.0",
            "anyio==4.16.0",
            "attrs==26.1.0",
            "certifi==2026.10.19.post1",
            "charset-normalizer==3.5.3",
            "frozenlist==1.8.0",
            "idna==3.20",
            "ipython==9.18.1",
            "msgspec==0.23.0",
            "multidict==7.2.1",
            "orjson==3.13.0",
            "packaging==26.4",
            "pillow==13.0.0",
            "propcache==0.5.4",
            "psutil==7.2.2",
            "pybase64==1.5.1",
            "pydantic==2.14.4",
            "pydantic-core==2.50.5",
            "pygments==2.21.0",
            "pyzmq==27.3.0",
            "requests==2.34.2",
            "starlette==1.10.0",
            "tqdm==4.70.1",
            "traitlets==5.16.1",
            "typing-extensions==4.16.0",
            "typing-inspection==0.4.5",
            "urllib3==2.8.0",
            "yarl==1.25.1",
        ],
    ),
    # SGLang's own benchmark client (`sglang.benchmark.serving` of 0.5.23, run by
    # tests/sglang_client.py with the heavy package __init__s bypassed) imports these on top of
    # 'wrapper-imports' (which it also needs: aiohttp, msgspec, orjson, requests, tqdm, psutil,
    # pyzmq, pybase64, pillow) and the venv's numpy, pyyaml and typer (with click, rich,
    # shellingham); `tokenizers` also builds the offline tokenizer the client loads.
    "benchmark-client": (
        "what SGLang's benchmark client needs besides 'wrapper-imports' and the venv",
        [
            "annotated-doc==0.0.7",
            "filelock==4.3.1",
            "fsspec==2026.9.0",
            "h11==0.16.0",
            "hf-xet==1.8.0",
            "httpcore2==2.16.2",
            "httpx2==2.16.2",
            "huggingface-hub==2.4.0",
            "regex==2026.11.19",
            "safetensors==0.8.0",
            "tokenizers==0.23.3",
            "transformers==5.24.0",
            "truststore==0.10.5",
        ],
    ),
}


class FetchError(Exception):
    """A step failed; the message says which and why."""


def cache_dir() -> Path:
    override = os.environ.get("KERNELDEV_SGLANG_CACHE")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "kerneldev" / "sglang"


def python_tag() -> str:
    """The folder name of this Python's package sets (compiled wheels differ per Python)."""
    return f"{sys.implementation.cache_tag}-{platform.machine().lower()}"


def release_root(version: str, cache: Path | None = None) -> Path:
    """The folder holding `python/sglang/` of `version` (the repository root of a live tree)."""
    return (cache or cache_dir()) / "releases" / version


def package_dir(name: str, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "packages" / python_tag() / name


def missing(cache: Path | None = None) -> list[str]:
    """What is not laid out yet (empty: all there). Reads the cache only."""
    cache = cache or cache_dir()
    gaps = []
    for version, (wheel, sha) in RELEASES.items():
        if _read_json(release_root(version, cache) / "release.json").get("sha256") != sha:
            gaps.append(f"SGLang {version} ({wheel})")
    for name, (_, pins) in PACKAGE_SETS.items():
        stamp = _read_json(package_dir(name, cache).with_suffix(".json"))
        if stamp.get("pins") != pins:
            gaps.append(f"package set '{name}' for {python_tag()}")
        elif stamp.get("bytecode") != sys.implementation.cache_tag:
            gaps.append(f"the bytecode of package set '{name}' for {python_tag()}")
    return gaps


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(f"sglang_releases: {text}", file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip(args: list[str]) -> None:
    command = [sys.executable, "-m", "pip", *args]
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        lines = [line for line in lines if not line.startswith("WARNING: Location")]
        tail = "\n  ".join(lines[-6:]) or "no output"
        raise FetchError(f"pip {args[0]} failed (exit {proc.returncode}):\n  {tail}")


def fetch_wheel(version: str, cache: Path, quiet: bool) -> Path:
    wheel, sha = RELEASES[version]
    path = cache / "wheels" / wheel
    if path.is_file() and _sha256(path) == sha:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    _say(quiet, f"downloading SGLang {version} (pip download --no-deps {wheel})")
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".download-") as tmp:
        _pip(
            ["download", "--quiet", "--no-deps", "--only-binary=:all:", *WHEEL_PLATFORM]
            + ["--dest", tmp, f"sglang=={version}"]
        )
        got = Path(tmp) / wheel
        if not got.is_file():
            names = ", ".join(p.name for p in Path(tmp).iterdir()) or "nothing"
            raise FetchError(f"pip download of SGLang {version} gave {names}, not {wheel}")
        if _sha256(got) != sha:
            raise FetchError(
                f"{wheel}: sha256 {_sha256(got)} is not the pinned {sha} (a changed upload or "
                "a mirror serving other bytes); nothing was laid out"
            )
        os.replace(got, path)
    return path


def lay_out_release(version: str, cache: Path, quiet: bool) -> Path:
    """Unpack the wheel's `sglang/` package as `releases/<v>/python/sglang/`."""
    wheel, sha = RELEASES[version]
    root = release_root(version, cache)
    if _read_json(root / "release.json").get("sha256") == sha:
        return root
    path = fetch_wheel(version, cache, quiet)
    _say(quiet, f"laying out SGLang {version} in {root}")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{version}-"))
    try:
        count = 0
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                parts = member.filename.split("/")
                if parts[0] != "sglang" or member.is_dir():
                    continue  # the dist-info and any other top-level folder are not the tree
                if ".." in parts or member.filename.startswith("/"):
                    raise FetchError(f"{wheel}: unsafe member path {member.filename!r}")
                target = tmp / "python" / member.filename
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                count += 1
        info = {"version": version, "wheel": wheel, "sha256": sha, "files": count}
        (tmp / "release.json").write_text(json.dumps(info, indent=1) + "\n")
        if root.exists():
            shutil.rmtree(root)
        os.replace(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def install_package_set(name: str, cache: Path, quiet: bool) -> Path:
    why, pins = PACKAGE_SETS[name]
    folder = package_dir(name, cache)
    stamp = folder.with_suffix(".json")
    done = {"set": name, "python": python_tag(), "pins": pins}
    done["bytecode"] = sys.implementation.cache_tag
    if _read_json(stamp) == done and folder.is_dir():
        return folder
    if _read_json(stamp).get("pins") == pins and folder.is_dir():
        # Laid out by an earlier version of this script, without bytecode: compile it in place
        # (each .pyc is written atomically; a second run finds them and compiles nothing).
        _say(quiet, f"compiling the package set '{name}' in {folder}")
        _compile(folder)
        stamp.write_text(json.dumps(done) + "\n")
        return folder
    _say(quiet, f"installing the package set '{name}' ({why}): {len(pins)} wheels into {folder}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{name}-"))
    try:
        _pip(
            ["install", "--quiet", "--no-deps", "--only-binary=:all:", "--no-compile"]
            + ["--target", str(tmp), *pins]
        )
        stamp.unlink(missing_ok=True)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
        _compile(folder)
        stamp.write_text(json.dumps(done) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _compile(folder: Path) -> None:
    """Bytecode for every module of a package set, as pip leaves a host's site-packages. The
    test hosts import these with `-B` (the probe, the import check: nothing is written on a
    host), so without it each of those processes compiled IPython, pydantic, aiohttp and the
    rest from source again: ~1 CPU-s per wrapper import, measured."""
    # compileall in place, after the rename: .pyc files hold their source's path for
    # tracebacks, which must be the folder the tests put on PYTHONPATH, not the temporary one.
    proc = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", str(folder)],
        capture_output=True,
        text=True,
    )
    # Some packages ship Python files of other versions' syntax (test data, py2 leftovers):
    # compileall reports them and goes on; only a missing interpreter or module is an error.
    if proc.returncode not in (0, 1):
        raise FetchError(f"compileall of {folder} failed (exit {proc.returncode}): {proc.stderr}")


def fetch(cache: Path, quiet: bool = False) -> None:
    for version in RELEASES:
        lay_out_release(version, cache, quiet)
    for name in PACKAGE_SETS:
        install_package_set(name, cache, quiet)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", default="fetch", choices=["fetch", "check", "path"])
    parser.add_argument("--cache", type=Path, help="the cache folder (default: %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="say nothing when all is there")
    args = parser.parse_args(argv)
    cache = args.cache or cache_dir()
    if args.action == "path":
        print(cache)
        return 0
    if args.action == "check":
        gaps = missing(cache)
        for gap in gaps:
            print(f"sglang_releases: missing in {cache}: {gap}", file=sys.stderr)
        return 1 if gaps else 0
    if not missing(cache):
        _say(args.quiet, f"SGLang {', '.join(RELEASES)} already laid out in {cache}")
        return 0
    try:
        fetch(cache, args.quiet)
    except (FetchError, OSError, zipfile.BadZipFile) as err:
        print(f"sglang_releases: {err}", file=sys.stderr)
        return 1
    _say(args.quiet, f"SGLang {', '.join(RELEASES)} laid out in {cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
