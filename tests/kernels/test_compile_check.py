"""The per-architecture table fits each architecture's shared memory, checked by compiling the
MMA kernel for GPUs this machine does not have (`scripts/compile_check.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "compile_check.py"


# The start of a snippet run by `_run`: the compile checker and the kernel file imported.
_IMPORTS = (
    "import sys; sys.path.insert(0, 'scripts'); sys.path.insert(0, 'kernels')\n"
    "import compile_check as cc, flash_mla_sm120_triton as fl\n"
)


def _run(args: list[str], code: str | None = None) -> subprocess.CompletedProcess:
    # Its own process: the kernel tests set TRITON_INTERPRET, which replaces compiled kernels.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-c", code] if code else [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)


def test_sm120_and_sm89_rows_fit_99_kb(tmp_path):
    res = _run(["--cc", "120", "--cc", "89", "--no-ptxas", "--json", "--save-ptx", str(tmp_path)])
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = json.loads(res.stdout)
    # --save-ptx: one file per build, its code without what moves with source lines (a
    # refactor meant to change no code is checked by diffing two such directories)
    saved = sorted(tmp_path.iterdir())
    assert len(saved) == len(rows) and all("_ptx" not in r for r in rows)
    for path in saved:
        ptx = path.read_text()
        assert ".entry" in ptx and "mma" in ptx, path.name
        assert ".loc" not in ptx and ".debug" not in ptx and "$L__tmp" not in ptx, path.name
    built = {(r["cc"], r["pass"], r["extra_cache"]) for r in rows}
    # the sm_120 row's Gluon loop (computing its few-token requests itself), without and with
    # the length-aware plan, its wide tile (planned) and its few-head tile (plain, planned,
    # beside the packed plan; 16 heads, and 8 token-major), where the installed Triton has the
    # Gluon API it is written for (3.6); sm_89 never takes it (no setmaxnreg)
    few16 = ("bf16-P-ws-few", "bf16-P-ws-few-plan", "bf16-P-ws-few-packed")
    few8 = tuple(p.replace("few", "few-tm") for p in few16)
    few = few16 + few8
    gluon = {
        (120, p, e)
        for p in ("bf16-P-ws-sync", "bf16-P-ws-sync-plan", "bf16-P-ws-sync-wide", *few)
        for e in (0, 1)
    }
    assert built - gluon == {
        (cc, p, e) for cc in (120, 89) for p in ("bf16-P+exact", "exact-all") for e in (0, 1)
    }
    assert built & gluon in (set(), gluon)
    for r in rows:
        tiles = {"bf16-P-ws-sync-wide": (64, 16), **dict.fromkeys(few16, (16, 32))}
        tile = {**tiles, **dict.fromkeys(few8, (8, 32))}.get(r["pass"], (32, 32))
        assert (r["BLOCK_H"], r["BLOCK_N"], r["EXACT_BLOCK_H"]) == (*tile, 16)
        assert 0 < r["shared_bytes"] <= 101_376, r


def test_checker_catches_a_row_that_does_not_fit():
    """64 heads per program in sm_120's exact pass overflows 99 KB: the checker must say so,
    or it proves nothing."""
    code = _IMPORTS + (
        "row = dict(cc.table_row(fl, 120), BLOCK_H=64, EXACT_BLOCK_H=64)\n"
        "ck = cc.compile_kernel(fl, 120, row, True, True, True)\n"
        "print(ck.metadata.shared)\n"
    )
    res = _run([], code)
    assert res.returncode == 0, res.stderr[-2000:]
    assert int(res.stdout.split()[-1]) > 101_376


def test_refuses_to_run_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--cc", "120"], capture_output=True, text=True, env=env
    )
    assert res.returncode == 2 and "TRITON_INTERPRET" in res.stdout


def test_l2_prefetch_only_where_the_row_asks_for_it():
    """The sm_90 row's tile loop asks L2 for the next tile's rows (`prefetch.global.L2` in
    its PTX); the sm_120 row, where the prefetch addresses spilled, has none."""
    code = _IMPORTS + (
        "for arch in (90, 120):\n"
        "    row = cc.table_row(fl, arch)\n"
        "    ptx = cc.compile_kernel(fl, arch, row, True, False, False).asm['ptx']\n"
        "    print(arch, row['prefetch_next'], ptx.count('prefetch.global.L2'))\n"
    )
    res = _run([], code)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in res.stdout.strip().splitlines())
    on90, n90 = lines["90"].split()
    on120, n120 = lines["120"].split()
    assert on90 == "True" and int(n90) > 0
    assert on120 == "False" and int(n120) == 0
