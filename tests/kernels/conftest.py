"""Kernel tests: without a CUDA GPU, Triton kernels run in Triton's CPU interpreter.

Triton reads TRITON_INTERPRET when it is imported (its standard-library functions are decorated
then) and again while a kernel runs, so it has to be set before the first `import triton` of the
process. This conftest sets it, for the whole pytest process, only when no GPU is present and
triton has not been imported yet (on a CPU-only machine no compiled Triton kernel could run
anyway). If triton was already imported without it, `test_flash_mla_sm120_triton.py` re-runs
itself in a child pytest process instead (see `test_kernel_suite_in_own_process`).
"""

from __future__ import annotations

import os
import sys

TRITON_PREIMPORTED = "triton" in sys.modules

import torch  # noqa: E402  (does not import triton)

ON_GPU = torch.cuda.is_available()
if not ON_GPU and not TRITON_PREIMPORTED:
    os.environ["TRITON_INTERPRET"] = "1"

# True when the kernels can run in this process: compiled on a GPU, or interpreted on CPU.
KERNELS_RUNNABLE = ON_GPU or os.environ.get("TRITON_INTERPRET") == "1"

if not ON_GPU and os.environ.get("TRITON_INTERPRET") == "1":
    # The interpreter's repeated language patching, its assert-free overflow sanitizer and
    # per-call type rebuilds: over half the CPU of an interpreted case, none of what it
    # computes (see the module, shipped with the kernels: the sandbox service and the
    # harness's --cpu-mode apply it too).
    from kerneldev.kernels.interpreter_overhead import trim_interpreter_overhead  # noqa: E402

    trim_interpreter_overhead()
