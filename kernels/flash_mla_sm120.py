"""SGLang's sm_120 FlashMLA sparse-decode wrapper, backed by the bundled Triton kernels.

Drop-in for SGLang's `flash_mla_sm120.py` (in `python/sglang/srt/layers/attention/` or, in newer
trees, `python/sglang/kernels/ops/attention/`). SGLang's DeepSeek-V4 backend calls
`flash_mla_with_kvcache_sm120(q=, k_cache=, head_dim_v=, softmax_scale=, indices=, topk_length=,
attn_sink=, extra_k_cache=, extra_indices_in_kvcache=, extra_topk_length=)` and keeps element
[0] of the returned (out, lse); other keywords are accepted and ignored.

Backend, chosen once at import like SGLang's wrapper:
  SGLANG_SM120_FLASHMLA_BACKEND = triton | torch | auto (default) | flashinfer
  auto: the legacy SGLANG_SM120_TRITON_FLASHMLA=0 selects torch, anything else triton.
  flashinfer: this wrapper carries no FlashInfer path; it logs a warning and uses triton
  (keep SGLang's own wrapper on hosts that use FlashInfer: `kerneldev kernels install`
  replaces only the kernel file unless asked).
With triton, SGLANG_SM120_MMA_FLASHMLA=1 (read when the kernel module is imported) selects the
tensor-core kernel, anything else the SIMT baseline. torch is a plain PyTorch reference path.

The kernel module is the sibling `flash_mla_sm120_triton.py` (relative import inside a package;
plain import of the sibling file when this module is loaded by path).
"""

from __future__ import annotations

import logging
import os

import torch

try:
    from .flash_mla_sm120_triton import (
        MMAConfig,
        flash_mla_sparse_decode_triton,
    )
except ImportError:  # loaded as a top-level module (by file path, or from a bare folder)
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from flash_mla_sm120_triton import (  # noqa: E402
        MMAConfig,
        flash_mla_sparse_decode_triton,
    )

logger = logging.getLogger(__name__)

__all__ = [
    "flash_mla_with_kvcache_sm120",
    "flash_mla_sparse_decode_triton",
    "flash_mla_sparse_decode",
    "MMAConfig",
]

# Page layout of the DSv4 FP8 cache (names as SGLang's wrapper and its tests use them).
_NOPE_DIM = 448  # fp8 dims per token
_ROPE_DIM = 64  # bf16 dims per token
_NOPE_ROPE_STRIDE = _NOPE_DIM + _ROPE_DIM * 2  # 576 data bytes per token slot
_TILE_SIZE = 64  # nope dims per UE8M0 scale
_NUM_TILES = _NOPE_DIM // _TILE_SIZE  # 7 scales per token
_SCALE_STRIDE = _NUM_TILES + 1  # 8 scale bytes per token slot (7 + 1 pad)
_D = _NOPE_DIM + _ROPE_DIM  # 512

BACKENDS = ("triton", "torch")


def flash_mla_sparse_decode(*args, **kwargs):
    """Alias of `flash_mla_sparse_decode_triton` (same arguments, same return)."""
    return flash_mla_sparse_decode_triton(*args, **kwargs)


def _detect_sm120_backend(environ=None) -> str:
    """The backend this wrapper uses under `environ` (default: os.environ)."""
    env = os.environ if environ is None else environ
    choice = env.get("SGLANG_SM120_FLASHMLA_BACKEND", "auto").strip().lower()
    if choice in BACKENDS:
        return choice
    if choice == "flashinfer":
        logger.warning(
            "SGLANG_SM120_FLASHMLA_BACKEND=flashinfer: this wrapper (kerneldev's) has no "
            "FlashInfer path; using the Triton kernel"
        )
        return "triton"
    if choice != "auto":
        logger.warning("unknown SGLANG_SM120_FLASHMLA_BACKEND=%r; using triton", choice)
    return "torch" if env.get("SGLANG_SM120_TRITON_FLASHMLA") == "0" else "triton"


_sm120_default_backend = _detect_sm120_backend()


def flash_mla_with_kvcache_sm120(**kwargs):
    """DSv4 sparse decode with SGLang's keywords; returns (out [B, 1, H, head_dim_v] bf16, lse).

    Required: q, k_cache, indices, head_dim_v. Optional: topk_length, attn_sink, softmax_scale
    (None: q.shape[-1] ** -0.5), extra_k_cache, extra_indices_in_kvcache, extra_topk_length.
    Any other keyword (FlashMLA's block_table, cache_seqlens, tile_scheduler_metadata, ...) is
    ignored, as SGLang's wrapper ignores it."""
    q = kwargs["q"]
    softmax_scale = kwargs.get("softmax_scale")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    args = (
        q,
        kwargs["k_cache"],
        kwargs["indices"],
        kwargs.get("topk_length"),
        kwargs.get("attn_sink"),
        kwargs["head_dim_v"],
        softmax_scale,
        kwargs.get("extra_k_cache"),
        kwargs.get("extra_indices_in_kvcache"),
        kwargs.get("extra_topk_length"),
    )
    if _sm120_default_backend == "torch":
        return _sm120_sparse_decode_fwd(*args)
    out, lse = flash_mla_sparse_decode_triton(*args)
    return (out, lse)


# ----------------------------------------------------------------------------- torch path


def _gather_and_dequant(k_cache: torch.Tensor, indices: torch.Tensor, page_size: int):
    """The 512-value K rows (bf16) of the cache slots `indices` (any shape; entries outside
    the cache read slot 0, mask them yourself): nope = fp8 * 2^(e - 127), then the bf16 rope."""
    shape = indices.shape
    if k_cache.shape[0] == 0:  # a cache of no pages: no row to read (every index is masked)
        return torch.zeros(*shape, _D, dtype=torch.bfloat16, device=indices.device)
    flat = indices.reshape(-1).long()
    flat = torch.where((flat >= 0) & (flat < k_cache.shape[0] * page_size), flat, 0)
    page_bytes = k_cache.stride(0)
    pages = k_cache.as_strided((k_cache.shape[0], page_bytes), (page_bytes, 1)).view(torch.uint8)
    page, slot = flat // page_size, flat % page_size
    data = slot[:, None] * _NOPE_ROPE_STRIDE + torch.arange(_NOPE_ROPE_STRIDE, device=flat.device)
    raw = pages[page[:, None], data]  # [N, 576]
    scales = page_size * _NOPE_ROPE_STRIDE + slot[:, None] * _SCALE_STRIDE
    exps = pages[page[:, None], scales + torch.arange(_NUM_TILES, device=flat.device)]
    nope = raw[:, :_NOPE_DIM].view(torch.float8_e4m3fn).float().view(-1, _NUM_TILES, _TILE_SIZE)
    nope = nope * torch.exp2(exps.float() - 127.0)[:, :, None]
    rope = raw[:, _NOPE_DIM:].contiguous().view(torch.bfloat16).float()
    rows = torch.cat([nope.reshape(-1, _NOPE_DIM), rope], dim=1).to(torch.bfloat16)
    return rows.reshape(*shape, _D)


def _valid_mask(indices, topk_length, num_tokens):
    rows = indices.reshape(indices.shape[0], indices.shape[-1])  # (-1 is ambiguous at B 0)
    valid = (rows >= 0) & (rows < num_tokens)
    if topk_length is not None:
        pos = torch.arange(rows.shape[1], device=rows.device)
        valid &= pos[None, :] < topk_length.reshape(-1, 1)
    return rows, valid


def _sm120_sparse_decode_fwd(
    q,
    k_cache,
    indices,
    topk_length,
    attn_sink,
    head_dim_v,
    softmax_scale,
    extra_k_cache=None,
    extra_indices=None,
    extra_topk_length=None,
):
    """Plain PyTorch sparse decode: (out [B, 1, H, head_dim_v] bf16, lse [B, H, 1] float32).
    The LSE excludes the sink (SGLang's torch path); out includes it."""
    B, _, H, _ = q.shape
    parts = [(k_cache, indices, topk_length)]
    if extra_k_cache is not None and extra_indices is not None:
        parts.append((extra_k_cache, extra_indices, extra_topk_length))
    for name, (cache, _, _) in zip(("k_cache", "extra_k_cache"), parts, strict=False):
        if cache.shape[-1] != _NOPE_ROPE_STRIDE + _SCALE_STRIDE:  # 584: the V4 format only
            raise ValueError(
                f"{name}: the torch path reads the V4 cache (584 bytes per token), this one has "
                f"{cache.shape[-1]} (528 / 288: DSv4.1, which the triton backend reads)"
            )
    keys, masks = [], []
    for cache, idx, length in parts:
        rows, valid = _valid_mask(idx, length, cache.shape[0] * cache.shape[1])
        keys.append(_gather_and_dequant(cache, rows, cache.shape[1]).float())
        masks.append(valid)
    kv = torch.cat(keys, dim=1)  # [B, T, 512]
    valid = torch.cat(masks, dim=1)  # [B, T]
    scores = torch.einsum("bhd,btd->bht", q[:, 0].float(), kv) * softmax_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, H]
    denom = lse if attn_sink is None else torch.logaddexp(lse, attn_sink.float()[None, :])
    empty = torch.isinf(lse) & (lse < 0)
    weights = torch.exp(scores - torch.where(empty, 0.0, denom)[..., None])
    weights = weights.masked_fill(empty[..., None], 0.0)
    out = torch.einsum("bht,btv->bhv", weights, kv[..., :head_dim_v])
    return out[:, None].to(torch.bfloat16), lse[..., None]
