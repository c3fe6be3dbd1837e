"""SGLang's sm_120 FlashMLA sparse-decode entry point, backed by the bundled Triton kernels.

Drop-in for `python/sglang/srt/layers/attention/flash_mla_sm120.py`: it only re-exports
`flash_mla_sparse_decode_triton` from the sibling `flash_mla_sm120_triton.py` (relative import
inside a package such as SGLang's attention package or `kerneldev.kernels`; plain import of the
sibling file when this module is loaded by path as a top-level module).

`variant=None` follows SGLANG_SM120_MMA_FLASHMLA, read once when the Triton module is
imported: `1` selects the tensor-core split-K kernel ("mma"), anything else the SIMT baseline.
"""

from __future__ import annotations

try:
    from .flash_mla_sm120_triton import (
        MMAConfig,
        flash_mla_sparse_decode_triton,
    )
except ImportError:  # loaded as a top-level module (by file path, or from a bare folder)
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from flash_mla_sm120_triton import (  # noqa: E402
        MMAConfig,
        flash_mla_sparse_decode_triton,
    )

__all__ = ["flash_mla_sparse_decode_triton", "flash_mla_sparse_decode", "MMAConfig"]


def flash_mla_sparse_decode(*args, **kwargs):
    """Alias of `flash_mla_sparse_decode_triton` (same arguments, same return)."""
    return flash_mla_sparse_decode_triton(*args, **kwargs)
