"""A small live tree with the import structure of SGLang's sm_120 attention code, for the
sandbox (`kerneldev demo`, `kerneldev sandbox up`) only. Written from public facts about
SGLang, not copied from it.

What it still serves, and why no real release can: the demo runs on a fresh machine offline,
right after `scripts/bootstrap demo`, which fetches no SGLang wheel (the tests' releases come
from `scripts/bootstrap test`, scripts/sglang_releases.py); a real release's wrapper imports
`sglang/__init__.py` and `sglang.srt.utils`, which need some thirty more packages and a
torchvision built for the local torch; and the sandbox's decode service (kerneldev.sandbox.service)
calls the wrapper's Triton path on every request, which this tree's wrapper always takes.
Everything the tests check about the drop-in (install, the import check, status, rollback)
runs against SGLang 0.5.14 and 0.5.23 themselves (tests/sglang_releases.py), not this tree.

- the wrapper `flash_mla_sm120.py` picks its backend once at import (this tree's own rule:
  SGLANG_SM120_FLASHMLA_BACKEND, auto = Triton unless FlashInfer is installed; the real
  releases differ, see docs/usage.md) and defines `flash_mla_with_kvcache_sm120(**kwargs)`,
  whose Triton path imports `flash_mla_sparse_decode_triton` from the kernel file inside the
  call;
- the DeepSeek-V4 backend imports `flash_mla_with_kvcache_sm120` inside its decode method and
  calls it with the DSv4 keywords, keeping element [0];
- a test module imports the kernel file's compatibility names.

Two layouts: SGLang 0.5.14's `python/sglang/srt/layers/attention/` ("srt") and 0.5.23's
`python/sglang/kernels/ops/attention/` ("kernels", the backend stays under srt/).
"""

from __future__ import annotations

from pathlib import Path

LAYOUT_DIRS = {
    "srt": "python/sglang/srt/layers/attention",
    "kernels": "python/sglang/kernels/ops/attention",
}
BACKEND_PATH = "python/sglang/srt/layers/attention/deepseek_v4_backend.py"
TEST_PATH = "python/sglang/test/attention/test_flash_mla_sm120.py"

WRAPPER = '''"""sm_120 FlashMLA sparse decode entry point (kerneldev's fake SGLang tree)."""

import os

_NOPE_DIM = 448
_ROPE_DIM = 64
_NOPE_ROPE_STRIDE = _NOPE_DIM + 2 * _ROPE_DIM
_SCALE_STRIDE = 8
_D = _NOPE_DIM + _ROPE_DIM


def _flashinfer_available():
    try:
        from flashinfer.sparse_mla_sm120 import BatchSparseMLAPagedAttentionWrapper  # noqa: F401
    except ImportError:
        return False
    return True


def _pick_backend():
    choice = os.environ.get("SGLANG_SM120_FLASHMLA_BACKEND", "auto")
    if choice != "auto":
        return choice
    return "flashinfer" if _flashinfer_available() else "triton"


_sm120_default_backend = _pick_backend()


def flash_mla_with_kvcache_sm120(**kwargs):
    q = kwargs["q"]
    softmax_scale = kwargs.get("softmax_scale")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    if _sm120_default_backend != "triton":
        raise NotImplementedError("the fake tree only has the triton backend")
    from {package}.flash_mla_sm120_triton import flash_mla_sparse_decode_triton

    out, lse = flash_mla_sparse_decode_triton(
        q=q,
        k_cache=kwargs["k_cache"],
        indices=kwargs["indices"],
        topk_length=kwargs.get("topk_length"),
        attn_sink=kwargs.get("attn_sink"),
        head_dim_v=kwargs["head_dim_v"],
        softmax_scale=softmax_scale,
        extra_k_cache=kwargs.get("extra_k_cache"),
        extra_indices=kwargs.get("extra_indices_in_kvcache"),
        extra_topk_length=kwargs.get("extra_topk_length"),
    )
    return (out, lse)
'''

BACKEND = '''"""DeepSeek-V4 attention backend, decode step only (kerneldev's fake SGLang tree)."""


class DeepseekV4AttnBackend:
    def __init__(self, head_dim_v=512, softmax_scale=None):
        self.head_dim_v = head_dim_v
        self.softmax_scale = softmax_scale

    def forward_decode(self, q, k_cache, indices, topk_length, attn_sink, extra=None):
        from {package}.flash_mla_sm120 import flash_mla_with_kvcache_sm120

        extra_k_cache, extra_indices, extra_topk_length = extra or (None, None, None)
        return flash_mla_with_kvcache_sm120(
            q=q,
            k_cache=k_cache,
            head_dim_v=self.head_dim_v,
            softmax_scale=self.softmax_scale,
            indices=indices,
            topk_length=topk_length,
            attn_sink=attn_sink,
            extra_k_cache=extra_k_cache,
            extra_indices_in_kvcache=extra_indices,
            extra_topk_length=extra_topk_length,
        )[0]
'''

TEST_MODULE = '''"""sm_120 decode tests (kerneldev's fake SGLang tree: the imports only)."""

from {package}.flash_mla_sm120 import _D, _NOPE_DIM, flash_mla_with_kvcache_sm120  # noqa: F401
from {package}.flash_mla_sm120_triton import (  # noqa: F401
    _apply_attn_sink,
    _merge_partial_attn,
    _run_triton_sparse_decode,
    flash_mla_sparse_decode_triton,
)
'''

OLD_KERNEL = '''"""An older sm_120 decode kernel file (kerneldev's fake SGLang tree: a stand-in)."""

_NOPE_DIM = 448
_D = 512


def _run_triton_sparse_decode(q, k_cache, indices, topk_length, softmax_scale):
    raise NotImplementedError("stand-in kernel")


def _merge_partial_attn(out1, lse1, out2, lse2):
    raise NotImplementedError("stand-in kernel")


def _apply_attn_sink(out, lse, attn_sink):
    raise NotImplementedError("stand-in kernel")


def flash_mla_sparse_decode_triton(
    q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale,
    extra_k_cache=None, extra_indices=None, extra_topk_length=None,
):
    raise NotImplementedError("stand-in kernel")
'''


def kernel_paths(layout: str = "srt") -> tuple[str, str]:
    """(kernel file, wrapper) paths of `layout`, relative to the tree's root."""
    folder = LAYOUT_DIRS[layout]
    return f"{folder}/flash_mla_sm120_triton.py", f"{folder}/flash_mla_sm120.py"


def write_tree(root: Path, layout: str = "srt", kernel: bytes | None = None) -> list[str]:
    """Write the tree under `root` (the repo root: `python/` is below it); `kernel` is the kernel
    file's bytes (default: a stand-in). Returns the paths written, relative to root."""
    folder = LAYOUT_DIRS[layout]
    package = folder[len("python/") :].replace("/", ".")
    kernel_path, wrapper_path = kernel_paths(layout)
    files = {
        kernel_path: kernel if kernel is not None else OLD_KERNEL.encode(),
        wrapper_path: WRAPPER.replace("{package}", package).encode(),
        BACKEND_PATH: BACKEND.replace("{package}", package).encode(),
        TEST_PATH: TEST_MODULE.replace("{package}", package).encode(),
    }
    packages = set()
    for path in files:
        parts = path.split("/")[1:-1]  # below python/
        for i in range(1, len(parts) + 1):
            packages.add("python/" + "/".join(parts[:i]) + "/__init__.py")
    for init in packages:
        files.setdefault(init, b"")
    for path, data in files.items():
        target = Path(root) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return sorted(files)
