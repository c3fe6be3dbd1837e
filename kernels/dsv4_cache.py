"""Pack and unpack the DSv4 ("MODEL1") paged FP8 KV cache used by the sparse-decode kernels.

Not deployed into SGLang: shared by the kernel tests and the benchmark harness. Depends on
torch only. The byte layout is the one in `docs/kernel-contract.md`:

    page p starts at byte p * page_stride            (page_stride >= P * 584, may be padded)
      [0,        P*576)  token slot t at t*576:  448 x float8_e4m3fn "nope" | 64 x bf16 "rope"
      [P*576,    P*584)  token slot t at P*576 + t*8: 7 x uint8 UE8M0 exponents | 1 pad byte

    nope[d] = float(fp8[d]) * 2 ** (scale[d // 64] - 127)

The returned cache is a view `[num_pages, P, 1, 584]` of a flat byte buffer whose `stride(0)`
is `page_stride` bytes (the inner `[P, 1, 584]` only names the page's bytes; token slots are
addressed through the layout above, never through `stride(1)`).
"""

from __future__ import annotations

import math

import torch

D_NOPE = 448
D_ROPE = 64
D_QK = D_NOPE + D_ROPE  # 512: the K row (and the V row) of one token
GROUP = 64  # nope dims sharing one UE8M0 scale
NUM_GROUPS = D_NOPE // GROUP  # 7
DATA_BYTES = D_NOPE + 2 * D_ROPE  # 576 bytes of data per token slot
SCALE_BYTES = 8  # 7 exponents + 1 pad byte per token slot
TOKEN_BYTES = DATA_BYTES + SCALE_BYTES  # 584
FP8_MAX = 448.0  # largest finite float8_e4m3fn value

__all__ = [
    "D_NOPE",
    "D_ROPE",
    "D_QK",
    "TOKEN_BYTES",
    "padded_page_stride",
    "pack_paged_cache",
    "unpack_paged_cache",
    "cache_page_stride",
]


def padded_page_stride(page_size: int, multiple: int = 576) -> int:
    """FlashMLA's padded page stride: P * 584 rounded up to a multiple of `multiple` bytes."""
    return -(-page_size * TOKEN_BYTES // multiple) * multiple


def cache_page_stride(k_cache: torch.Tensor) -> int:
    """Page stride of a packed cache view, in bytes (the spec's `stride(0)`)."""
    return k_cache.stride(0) * k_cache.element_size()


def _quantize_nope(nope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 448] float -> ([N, 448] float8_e4m3fn, [N, 7] uint8 biased exponents)."""
    groups = nope.float().reshape(-1, NUM_GROUPS, GROUP)
    amax = groups.abs().amax(dim=-1)
    # e = ceil(log2(amax / 448)), clamped so that e + 127 lies in [0, 254]; amax == 0 -> -127.
    e = torch.ceil(torch.log2(amax / FP8_MAX)).clamp(-127, 127)
    e = torch.nan_to_num(e, nan=-127.0, neginf=-127.0, posinf=127.0)
    scaled = groups / torch.exp2(e)[..., None]
    fp8 = scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(-1, D_NOPE)
    return fp8, (e + 127).to(torch.uint8)


def pack_paged_cache(
    kv: torch.Tensor,
    page_size: int,
    page_stride: int | None = None,
    *,
    num_pages: int | None = None,
    dtype: torch.dtype = torch.uint8,
) -> torch.Tensor:
    """Quantize `kv` ([num_tokens, 512] float: nope 448 + rope 64) into the paged FP8 layout.

    Token `n` lands in page `n // page_size`, slot `n % page_size`. `page_stride` is the byte
    distance between pages (default `page_size * 584`; e.g. `padded_page_stride(P)` for
    FlashMLA's padding). `num_pages` defaults to the fewest pages holding all tokens; unused
    slots are zero. `dtype` is the element type of the returned view: uint8 or float8_e4m3fn.
    """
    if kv.dim() != 2 or kv.shape[1] != D_QK:
        raise ValueError(f"kv must be [num_tokens, {D_QK}], got {tuple(kv.shape)}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    stride = page_size * TOKEN_BYTES if page_stride is None else int(page_stride)
    if stride < page_size * TOKEN_BYTES:
        raise ValueError(
            f"page_stride must be >= page_size * {TOKEN_BYTES} = {page_size * TOKEN_BYTES}, "
            f"got {stride}"
        )
    if dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise ValueError(f"dtype must be torch.uint8 or torch.float8_e4m3fn, got {dtype}")
    n_tok = kv.shape[0]
    min_pages = max(1, math.ceil(n_tok / page_size))
    pages = min_pages if num_pages is None else int(num_pages)
    if pages < min_pages:
        raise ValueError(f"num_pages={pages} cannot hold {n_tok} tokens of page_size {page_size}")

    full = torch.zeros(pages * page_size, D_QK, dtype=torch.float32, device=kv.device)
    full[:n_tok] = kv.float()
    fp8, exps = _quantize_nope(full[:, :D_NOPE])
    rope = full[:, D_NOPE:].to(torch.bfloat16).contiguous()

    buf = torch.zeros(pages, stride, dtype=torch.uint8, device=kv.device)
    data = buf[:, : page_size * DATA_BYTES].view(pages, page_size, DATA_BYTES)
    scales = buf[:, page_size * DATA_BYTES : page_size * TOKEN_BYTES].view(
        pages, page_size, SCALE_BYTES
    )
    data[..., :D_NOPE] = fp8.view(torch.uint8).view(pages, page_size, D_NOPE)
    data[..., D_NOPE:] = rope.view(torch.uint8).view(pages, page_size, 2 * D_ROPE)
    scales[..., :NUM_GROUPS] = exps.view(pages, page_size, NUM_GROUPS)

    flat = buf.view(-1)
    if dtype != torch.uint8:
        flat = flat.view(dtype)
    return flat.as_strided(
        (pages, page_size, 1, TOKEN_BYTES), (stride, TOKEN_BYTES, TOKEN_BYTES, 1)
    )


def unpack_paged_cache(k_cache: torch.Tensor) -> torch.Tensor:
    """Dequantize a packed cache into `[num_pages * page_size, 512]` float32 (token order)."""
    if k_cache.dim() != 4 or k_cache.shape[2] != 1 or k_cache.shape[3] != TOKEN_BYTES:
        raise ValueError(f"k_cache must be [num_pages, P, 1, {TOKEN_BYTES}], got {k_cache.shape}")
    pages, page_size = k_cache.shape[0], k_cache.shape[1]
    stride = cache_page_stride(k_cache)
    raw = k_cache.view(torch.uint8) if k_cache.dtype != torch.uint8 else k_cache
    pages_bytes = raw.as_strided(
        (pages, page_size * TOKEN_BYTES), (stride, 1), raw.storage_offset()
    )
    data = pages_bytes[:, : page_size * DATA_BYTES].reshape(pages * page_size, DATA_BYTES)
    scales = pages_bytes[:, page_size * DATA_BYTES :].reshape(pages * page_size, SCALE_BYTES)
    nope = data[:, :D_NOPE].contiguous().view(torch.float8_e4m3fn).float()
    exps = scales[:, :NUM_GROUPS].float() - 127.0
    nope = (nope.view(-1, NUM_GROUPS, GROUP) * torch.exp2(exps)[..., None]).view(-1, D_NOPE)
    rope = data[:, D_NOPE:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=1)
