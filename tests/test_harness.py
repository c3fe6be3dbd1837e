"""kerneldev's side of the benchmark harness (`kerneldev.bench.harness`) held against the harness
itself (`kernels/dsv4_bench.py`): the command line kerneldev builds is the one the harness reads,
the files it uploads are the bundled ones, and bad requests fail the harness's own checks."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from kerneldev.bench import harness
from kerneldev.kernels import dsv4_bench


def harness_reads(args: list[str]):
    """What the harness's own parser makes of a shell-quoted argument list."""
    return dsv4_bench.build_parser().parse_args(shlex.split(" ".join(args)))


def test_the_command_line_kerneldev_builds_is_the_one_the_harness_reads():
    args = harness.arguments(
        "live=/srv/my repo/flash_mla_sm120_triton.py",
        ["simt", "mma"],
        ["smoke", "B=1,H=16,topk=16"],
        "/tmp/it's here/result.json",
        rotate=2,
        cpu_mode=True,
    )
    read = harness_reads(args)
    assert read.kernel == ["live=/srv/my repo/flash_mla_sm120_triton.py"]
    assert read.variants == "simt,mma"
    assert read.shapes == ["smoke", "B=1,H=16,topk=16"]
    assert Path(read.out) == Path("/tmp/it's here/result.json")
    assert (read.rotate, read.cpu_mode, read.no_table) == (2, True, True)

    plain = harness_reads(harness.arguments("bundled=k.py", ["simt"], ["smoke"], "r.json"))
    assert (plain.rotate, plain.cpu_mode) == (3, False)  # the harness's own defaults


def test_the_uploaded_files_are_the_bundled_harness_and_its_imports():
    assert harness.SCRIPT in harness.SUPPORT_FILES
    for name in harness.SUPPORT_FILES:
        assert harness.bundled_file(name).is_file()
    assert harness.bundled_file(harness.SCRIPT).resolve() == Path(dsv4_bench.__file__).resolve()
    assert harness.SCHEMA == dsv4_bench.SCHEMA


def test_bad_variants_and_shapes_fail_the_harness_checks():
    assert harness.parse_variants(["simt", "mma", "simt"]) == ["simt", "mma"]
    with pytest.raises(harness.HarnessError, match="bad variant name"):
        harness.parse_variants(["no good"])
    assert harness.parse_shapes(["smoke"]) == dsv4_bench.SHAPE_SETS["smoke"]
    with pytest.raises(harness.HarnessError, match="unknown shape set"):
        harness.parse_shapes(["no-such-set"])
