"""scripts/sglang_releases.py, the fetch step of `scripts/bootstrap test`, without the network:
a wheel laid out as a live tree (its `sglang/` package under python/, nothing else), reused on
the next run, refused when its bytes are not the pinned ones or a member would land outside the
tree; `check` names what is missing."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from tests.sglang_releases import fetch


def _wheel(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


@pytest.fixture
def one_release(tmp_path, monkeypatch):
    """A cache with one stand-in release '9.9' whose wheel is already downloaded."""
    data = _wheel(
        {
            "sglang/__init__.py": b"",
            "sglang/srt/layers/attention/flash_mla_sm120.py": b"X = 1\n",
            "sglang-9.9.dist-info/METADATA": b"Name: sglang\n",
        }
    )
    name = "sglang-9.9-cp311-cp311-manylinux_2_34_x86_64.whl"
    monkeypatch.setattr(fetch, "RELEASES", {"9.9": (name, hashlib.sha256(data).hexdigest())})
    monkeypatch.setattr(fetch, "PACKAGE_SETS", {})
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / name).write_bytes(data)
    return tmp_path


def test_a_wheel_is_laid_out_as_a_live_tree_once(one_release):
    assert fetch.main(["check", "--cache", str(one_release)]) == 1
    assert fetch.main(["fetch", "--cache", str(one_release), "--quiet"]) == 0
    root = fetch.release_root("9.9", one_release)
    wrapper = root / "python/sglang/srt/layers/attention/flash_mla_sm120.py"
    assert wrapper.read_bytes() == b"X = 1\n"
    assert sorted(p.name for p in (root / "python").iterdir()) == ["sglang"]  # no dist-info
    assert fetch.main(["check", "--cache", str(one_release)]) == 0
    stamp = (root / "release.json").stat().st_mtime_ns
    (one_release / "wheels").rename(one_release / "gone")  # a second run needs no wheel
    assert fetch.main(["fetch", "--cache", str(one_release)]) == 0
    assert (root / "release.json").stat().st_mtime_ns == stamp


def test_a_wheel_with_other_bytes_is_refused_and_nothing_laid_out(one_release, monkeypatch, capsys):
    name, _ = fetch.RELEASES["9.9"]
    (one_release / "wheels" / name).unlink()

    def pip(args):  # a mirror serving other bytes under the pinned name
        dest = Path(args[args.index("--dest") + 1])
        (dest / name).write_bytes(_wheel({"sglang/__init__.py": b"evil = 1\n"}))

    monkeypatch.setattr(fetch, "_pip", pip)
    assert fetch.main(["fetch", "--cache", str(one_release)]) == 1
    err = capsys.readouterr().err
    assert "is not the pinned" in err and fetch.RELEASES["9.9"][1] in err
    assert not (one_release / "wheels" / name).exists()
    assert not fetch.release_root("9.9", one_release).exists()


def test_a_member_outside_the_tree_is_refused(one_release, monkeypatch, capsys):
    data = _wheel({"sglang/../../escape.py": b"x\n"})
    name, _ = fetch.RELEASES["9.9"]
    (one_release / "wheels" / name).write_bytes(data)
    monkeypatch.setattr(fetch, "RELEASES", {"9.9": (name, hashlib.sha256(data).hexdigest())})
    assert fetch.main(["fetch", "--cache", str(one_release)]) == 1
    assert "unsafe member path" in capsys.readouterr().err
    assert (
        not (one_release / "escape.py").exists() and not (one_release.parent / "escape.py").exists()
    )
    assert not fetch.release_root("9.9", one_release).exists()


def test_check_names_every_missing_part(tmp_path, capsys):
    assert fetch.main(["check", "--cache", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    for version in fetch.RELEASES:
        assert f"SGLang {version}" in err
    for name in fetch.PACKAGE_SETS:
        assert f"package set '{name}'" in err


def test_a_package_set_without_bytecode_is_compiled_in_place(tmp_path, monkeypatch, capsys):
    """A set laid out by an earlier version of the script (no bytecode; the test hosts import
    it with -B, so every probe compiled it again) is compiled where it lies, without pip."""
    monkeypatch.setattr(fetch, "RELEASES", {})
    monkeypatch.setattr(fetch, "PACKAGE_SETS", {"tiny": ("a stand-in", ["tiny==1.0"])})

    def no_pip(args):
        raise AssertionError(f"pip was called: {args}")

    monkeypatch.setattr(fetch, "_pip", no_pip)
    folder = fetch.package_dir("tiny", tmp_path)
    (folder / "tiny").mkdir(parents=True)
    (folder / "tiny" / "__init__.py").write_text("VALUE = 1\n")
    stamp = {"set": "tiny", "python": fetch.python_tag(), "pins": ["tiny==1.0"]}
    folder.with_suffix(".json").write_text(json.dumps(stamp))

    assert fetch.main(["check", "--cache", str(tmp_path)]) == 1
    assert "the bytecode of package set 'tiny'" in capsys.readouterr().err
    assert fetch.main(["fetch", "--cache", str(tmp_path)]) == 0
    assert list((folder / "tiny" / "__pycache__").glob("__init__.*.pyc"))
    assert fetch.main(["check", "--cache", str(tmp_path)]) == 0
    written = folder.with_suffix(".json").stat().st_mtime_ns
    assert fetch.main(["fetch", "--cache", str(tmp_path)]) == 0  # nothing left to do
    assert folder.with_suffix(".json").stat().st_mtime_ns == written
