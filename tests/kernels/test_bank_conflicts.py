"""`scripts/bank_conflicts.py`: the shared-memory accesses of a TTGIR module, read as Triton's
own bank model sees them. The model itself is read through triton 3.6 (the Gluon loop's
release); where another Triton is installed its cases are skipped and the parsing is still
checked."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.experimental.gluon")

from triton.experimental.gluon import language as gl  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# the script as a module under its own name (scripts/ stays off sys.path: other tests import
# the kernel file by name)
_SPEC = importlib.util.spec_from_file_location(
    "_bank_conflicts", ROOT / "scripts" / "bank_conflicts.py"
)
bc = sys.modules["_bank_conflicts"] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bc)

# A V4.1 raw tile read twice by the dequantization's layout (4 rows x 32 bytes of a group per
# warp): token-major (`#tm`: the same 8 banks, 3 excess wavefronts) and with the group's low
# two bits xor the token's (`#xor`: none); written as Triton 3.6 prints a module.
TTGIR = """\
#blocked = #ttg.blocked<{sizePerThread = [1, 16, 4], threadsPerWarp = [4, 1, 8], \
warpsPerCTA = [4, 1, 1], order = [2, 1, 0]}>
#tm = #ttg.swizzled_shared<{vec = 1, perPhase = 1, maxPhase = 1, order = [2, 1, 0]}>
#xor = #ttg.shared_linear<{offset = [[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 0, 16], \
[0, 1, 0], [0, 2, 0], [0, 4, 0], [0, 8, 0], [1, 1, 0], [2, 2, 0], [4, 0, 0], [8, 0, 0], \
[16, 0, 0]]}, alignment = 16>
module {
    %a = ttg.local_load %t : !ttg.memdesc<16x16x32xf8E4M3FN, #tm, #smem, mutable, 2x16x16x32> \
-> tensor<16x16x32xf8E4M3FN, #blocked> loc(#loc3)
    %b = ttg.local_load %x : !ttg.memdesc<16x16x32xf8E4M3FN, #xor, #smem, mutable, 32x16x32> \
-> tensor<16x16x32xf8E4M3FN, #blocked> loc(#loc4)
    %c = ttg.local_load %x : !ttg.memdesc<16x16x32xf8E4M3FN, #xor, #smem, mutable, 32x16x32> \
-> tensor<16x16x32xf8E4M3FN, #blocked> loc(#loc4)
    %d = ttg.local_load %q : !ttg.memdesc<16x64xf16, #tm, #smem> \
-> tensor<16x64xf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>> loc(#loc5)
}
#loc1 = loc("/somewhere/kernels/flash_mla_sm120_triton.py":1562:21)
#loc2 = loc("x8"(#loc1))
#loc3 = loc(callsite(#loc2 at #loc5))
#loc4 = loc("/somewhere/kernels/flash_mla_sm120_triton.py":1600:3)
#loc5 = loc("/somewhere/kernels/flash_mla_sm120_triton.py":1999:0)
"""

ON_36 = triton.__version__.split(".")[:2] == ["3", "6"]
needs_36 = pytest.mark.skipif(not ON_36, reason="the bank model is read through triton 3.6")


def test_layouts_and_sources_read_from_the_module():
    module = bc._Ttgir(TTGIR)
    assert module.source("#loc3") == "flash_mla_sm120_triton.py:1562"  # the callee's line
    assert module.source("#loc4") == "flash_mla_sm120_triton.py:1600"
    regs = module.register_layout(gl, "#blocked", [16, 16, 32])
    assert regs == gl.BlockedLayout([1, 16, 4], [4, 1, 8], [4, 1, 1], [2, 1, 0])
    assert module.register_layout(gl, "#ttg.dot_op<{opIdx = 0}>", [16, 64]) is None
    # a 16-row slice of the 32-token buffer: the bases within it (the token's bit 4 dropped)
    xor = module.shared_layout(gl, "#xor", [16, 16, 32])
    assert len(xor.offset_bases) == 13 and [16, 0, 0] not in xor.offset_bases
    assert module.shared_layout(gl, "#tm", [16, 16, 32]) == gl.SwizzledSharedLayout(
        1, 1, 1, [2, 1, 0]
    )


@needs_36
def test_token_major_raw_tile_conflicts_and_the_xor_layout_does_not():
    accesses = bc.audit(TTGIR)
    by_line = {a.source: a for a in accesses}
    assert by_line["flash_mla_sm120_triton.py:1562"].conflicts == 3
    xor = by_line["flash_mla_sm120_triton.py:1600"]
    assert (xor.conflicts, xor.count, xor.shape, xor.dtype) == (0, 2, "16x16x32", "f8E4M3FN")
    assert by_line["flash_mla_sm120_triton.py:1562"].op == "local_load"
    assert by_line["flash_mla_sm120_triton.py:1999"].conflicts is None  # an ldmatrix operand


def test_other_triton_releases_and_bad_input_are_clear_errors(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = [sys.executable, str(ROOT / "scripts" / "bank_conflicts.py")]
    res = subprocess.run([*script, "--ttgir", str(tmp_path / "missing.ttgir")],
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert res.returncode == 2 and "missing.ttgir" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([*script, "--json", "--ttgir", str(tmp_path / "missing.ttgir")],
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert res.returncode == 2 and "missing.ttgir" in json.loads(res.stdout)["error"]
    res = subprocess.run([*script, "--ttgir", "x"], capture_output=True, text=True,
                         env={**env, "TRITON_INTERPRET": "1"}, timeout=120)  # fmt: skip
    assert res.returncode == 2 and "TRITON_INTERPRET" in res.stderr
    if not ON_36:
        path = tmp_path / "m.ttgir"
        path.write_text(TTGIR)
        res = subprocess.run([*script, "--ttgir", str(path)], capture_output=True, text=True,
                             env=env, timeout=120)  # fmt: skip
        assert res.returncode == 2 and "triton 3.6" in res.stderr
        assert "Traceback" not in res.stderr
