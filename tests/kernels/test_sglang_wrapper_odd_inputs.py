"""Odd inputs through each real SGLang release's own sm_120 wrapper (0.5.14 and 0.5.23, laid
out by tests/sglang_releases.py; the `sglang_release` fixture skips when the release cache is
empty) with the bundled kernel file in place of the release's, both variants: head counts that
are not powers of two, topk not a multiple of the tile, page sizes 1 and 256, an empty batch,
no valid index, zero / past-topk / negative lengths, the cache's last slot and ids past its
end, strided q, infinite sinks, a prefill-sized call; each against the float64 reference
(`sglang_wrapper_cases.py`, run in a child process: both releases are the package `sglang`).
Bad input (q fp16 / fp32 / 3-D, head_dim_v 448, a bf16 / 576-byte / meta cache, int64 indices
or lengths, a bf16 sink) must be a ValueError naming the argument, through the wrapper too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sglang_releases import Release

from .kernel_files import KERNELS

CASES = Path(__file__).with_name("sglang_wrapper_cases.py")
REPO = KERNELS.parent


@pytest.mark.parametrize("variant", ["simt", "mma"])
def test_odd_inputs_through_the_release_wrapper(tmp_path, sglang_release: Release, variant):
    root = sglang_release.copy_to(tmp_path / "sglang")
    shutil.copyfile(KERNELS / "flash_mla_sm120_triton.py", root / sglang_release.kernel)
    env = dict(
        os.environ,
        SGLANG_SM120_FLASHMLA_BACKEND="triton",  # 0.5.23 (its default is FlashInfer)
        SGLANG_SM120_TRITON_FLASHMLA="1",  # 0.5.14
        SGLANG_SM120_MMA_FLASHMLA="1" if variant == "mma" else "0",
        PYTHONPATH=os.pathsep.join(
            [str(root / "python"), str(REPO), sglang_release.env["PYTHONPATH"]]
        ),
    )
    import torch

    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, "-B", str(CASES), sglang_release.package],
        cwd=root / "python", env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines[0] == {"variant": variant}
    results = {line["case"]: line for line in lines[1:]}
    wrong = {k: v["result"] for k, v in results.items() if "arg" not in v and v["result"] != "ok"}
    assert not wrong, json.dumps(wrong, indent=1)
    unclear = {
        k: v["result"]
        for k, v in results.items()
        if "arg" in v and not v["result"].startswith("ValueError: ")
    }
    assert not unclear, json.dumps(unclear, indent=1)
    assert len(results) > 30
