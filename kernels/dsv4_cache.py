"""Pack and unpack the DSv4 ("MODEL1") and DSv4.1 paged KV caches read by the sparse-decode kernels.

Not deployed into SGLang: shared by the kernel tests and the benchmark harness. Depends on
torch only. The byte layouts are the ones in `docs/kernel-contract.md`; a cache's format is
its token size, the view's last dimension (as SGLang 0.5.23's DSv4 backend hands it over):

    584  V4       page = [P x 576: 448 e4m3 nope | 64 bf16 rope]  [P x 8: 7 UE8M0 (+1 pad)]
    528  V4.1     page = [P x 512: 512 e4m3]                       [P x 16: 16 UE8M0]
    288  V4.1 FP4 page = [P x 256: 512 e2m1, two a byte]           [P x 32: 32 e4m3 scales]

    page p starts at byte p * page_stride (>= P * token bytes, may be padded)
    V4:   x[d] = e4m3[d] * 2 ** (s[d // 64] - 127)   (d < 448; the rope is bf16)
    V4.1: x[d] = e4m3[d] * 2 ** (s[d // 32] - 127)   (scale byte 255 is NaN)
    FP4:  x[d] = e2m1[d] * e4m3(s[d // 16])          (value 2i in the low nibble of byte i)

The returned cache is a view `[num_pages, P, 1, token_bytes]` of a flat byte buffer whose
`stride(0)` is `page_stride` bytes (the inner `[P, 1, token_bytes]` only names the page's
bytes; token slots are addressed through the layout above, never through `stride(1)`).
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
E2M1_MAX = 6.0  # largest e2m1 magnitude
FP4_MIN_SCALE = 2.0**-9  # smallest e4m3 scale SGLang's FP4 writer stores
# e2m1 code (low 3 bits) -> magnitude; bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


class CacheFormat:
    """One token format: its bytes, how its page splits into data and scale rows."""

    def __init__(self, name, token_bytes, data_bytes, scale_bytes, group, page_align):
        self.name = name
        self.token_bytes = token_bytes  # the view's last dimension
        self.data_bytes = data_bytes  # per token, in the page's first section
        self.scale_bytes = scale_bytes  # per token, in the section at P * data_bytes
        self.group = group  # values sharing one scale
        self.page_align = page_align  # SGLang pads a page to a multiple of this

    def __repr__(self) -> str:
        return f"CacheFormat({self.name!r}, {self.token_bytes})"


V4 = CacheFormat("v4", 584, 576, 8, 64, 576)
V41 = CacheFormat("v41", 528, 512, 16, 32, 512)
V41_FP4 = CacheFormat("v41_fp4", 288, 256, 32, 16, 256)
FORMATS = {f.name: f for f in (V4, V41, V41_FP4)}
FORMAT_BY_TOKEN_BYTES = {f.token_bytes: f for f in FORMATS.values()}

__all__ = [
    "D_NOPE",
    "D_ROPE",
    "D_QK",
    "TOKEN_BYTES",
    "FORMATS",
    "FORMAT_BY_TOKEN_BYTES",
    "cache_format",
    "padded_page_stride",
    "pack_paged_cache",
    "unpack_paged_cache",
    "cache_page_stride",
]


def _format(layout) -> CacheFormat:
    if isinstance(layout, CacheFormat):
        return layout
    if layout not in FORMATS:
        raise ValueError(f"layout must be one of {sorted(FORMATS)}, got {layout!r}")
    return FORMATS[layout]


def cache_format(k_cache: torch.Tensor) -> CacheFormat:
    """The format of a packed cache view, from its last dimension (584, 528 or 288)."""
    fmt = FORMAT_BY_TOKEN_BYTES.get(k_cache.shape[-1]) if k_cache.dim() == 4 else None
    if fmt is None or k_cache.shape[2] != 1:
        raise ValueError(
            "k_cache must be [num_pages, P, 1, token_bytes] with token_bytes 584 (V4), 528 "
            f"(V4.1 FP8) or 288 (V4.1 FP4), got {tuple(k_cache.shape)}"
        )
    return fmt


def padded_page_stride(page_size: int, multiple: int | None = None, layout="v4") -> int:
    """The padded page stride of FlashMLA / SGLang: P * token bytes rounded up to a multiple of
    `multiple` bytes (default: the format's own, 576 for V4, 512 for V4.1, 256 for FP4)."""
    fmt = _format(layout)
    multiple = fmt.page_align if multiple is None else multiple
    return -(-page_size * fmt.token_bytes // multiple) * multiple


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


def _pow2_ceil_exponent(y: torch.Tensor) -> torch.Tensor:
    """ceil(log2(y)) for y > 0, exact at powers of two (frexp, not a float log2)."""
    m, k = torch.frexp(y)
    return torch.where(m == 0.5, k - 1, k).float()


def _quantize_v41(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 512] float -> ([N, 512] e4m3 bytes, [N, 16] UE8M0 bytes), as SGLang's V4.1 writer:
    per group of 32, scale 2^ceil(log2(max(amax / 448, 1e-4)))."""
    groups = x.float().reshape(-1, 16, 32)
    amax = groups.abs().amax(dim=-1)
    e = _pow2_ceil_exponent((amax / FP8_MAX).clamp_min(1e-4)).clamp(-127, 127)
    fp8 = (groups / torch.exp2(e)[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return fp8.view(torch.uint8).reshape(-1, 512), (e + 127).to(torch.uint8)


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 value (ties to the even code, saturating at +-6): 4-bit codes."""
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=x.device)
    a = x.abs().clamp_max(E2M1_MAX)
    dist = (a[..., None] - mags).abs()
    nearest = dist == dist.amin(dim=-1, keepdim=True)
    parity = (torch.arange(8, device=x.device) & 1).expand_as(dist)
    code = torch.where(nearest, parity, 2).argmin(dim=-1).to(torch.uint8)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def _quantize_v41_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 512] float -> ([N, 256] packed e2m1 bytes, [N, 32] e4m3 scale bytes), as SGLang's
    FP4 writer: per group of 16, scale e4m3(clamp(amax / 6, 2^-9, 448))."""
    groups = x.float().reshape(-1, 32, 16)
    amax = groups.abs().amax(dim=-1)
    scale = (amax / E2M1_MAX).clamp(FP4_MIN_SCALE, FP8_MAX).to(torch.float8_e4m3fn)
    codes = _e2m1_codes(groups / scale.float()[..., None]).reshape(-1, 512)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, scale.view(torch.uint8)


def _e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    v = mags[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -v, v)


def pack_paged_cache(
    kv: torch.Tensor,
    page_size: int,
    page_stride: int | None = None,
    *,
    num_pages: int | None = None,
    dtype: torch.dtype = torch.uint8,
    layout: str = "v4",
) -> torch.Tensor:
    """Quantize `kv` ([num_tokens, 512] float) into the paged `layout` ("v4": 448 FP8 nope +
    64 bf16 rope, 584 bytes; "v41": 512 FP8, 528 bytes; "v41_fp4": 512 e2m1, 288 bytes).

    Token `n` lands in page `n // page_size`, slot `n % page_size`. `page_stride` is the byte
    distance between pages (default `page_size * token bytes`; e.g. `padded_page_stride(P,
    layout=...)` for SGLang's padding). `num_pages` defaults to the fewest pages holding all
    tokens; unused slots are zero. `dtype` is the element type of the returned view: uint8 or
    float8_e4m3fn.
    """
    fmt = _format(layout)
    if kv.dim() != 2 or kv.shape[1] != D_QK:
        raise ValueError(f"kv must be [num_tokens, {D_QK}], got {tuple(kv.shape)}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    tb = fmt.token_bytes
    stride = page_size * tb if page_stride is None else int(page_stride)
    if stride < page_size * tb:
        raise ValueError(
            f"page_stride must be >= page_size * {tb} = {page_size * tb}, got {stride}"
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
    if fmt is V4:
        fp8, exps = _quantize_nope(full[:, :D_NOPE])
        rope = full[:, D_NOPE:].to(torch.bfloat16).contiguous()
        data_rows = torch.cat(
            [fp8.view(torch.uint8), rope.view(torch.uint8).view(-1, 2 * D_ROPE)], dim=1
        )
        scale_rows = torch.cat([exps, torch.zeros_like(exps[:, :1])], dim=1)
    elif fmt is V41:
        data_rows, scale_rows = _quantize_v41(full)
    else:
        data_rows, scale_rows = _quantize_v41_fp4(full)

    buf = torch.zeros(pages, stride, dtype=torch.uint8, device=kv.device)
    split = page_size * fmt.data_bytes
    buf[:, :split] = data_rows.reshape(pages, split)
    buf[:, split : page_size * tb] = scale_rows.reshape(pages, page_size * fmt.scale_bytes)

    flat = buf.view(-1)
    if dtype != torch.uint8:
        flat = flat.view(dtype)
    return flat.as_strided((pages, page_size, 1, tb), (stride, tb, tb, 1))


def unpack_paged_cache(k_cache: torch.Tensor) -> torch.Tensor:
    """Dequantize a packed cache (any format, told by its last dimension) into
    `[num_pages * page_size, 512]` float32 (token order)."""
    fmt = cache_format(k_cache)
    pages, page_size = k_cache.shape[0], k_cache.shape[1]
    stride = cache_page_stride(k_cache)
    raw = k_cache.view(torch.uint8) if k_cache.dtype != torch.uint8 else k_cache
    pages_bytes = raw.as_strided(
        (pages, page_size * fmt.token_bytes), (stride, 1), raw.storage_offset()
    )
    split = page_size * fmt.data_bytes
    data = pages_bytes[:, :split].reshape(pages * page_size, fmt.data_bytes)
    scales = pages_bytes[:, split:].reshape(pages * page_size, fmt.scale_bytes)
    if fmt is V4:
        nope = data[:, :D_NOPE].contiguous().view(torch.float8_e4m3fn).float()
        exps = scales[:, :NUM_GROUPS].float() - 127.0
        nope = (nope.view(-1, NUM_GROUPS, GROUP) * torch.exp2(exps)[..., None]).view(-1, D_NOPE)
        rope = data[:, D_NOPE:].contiguous().view(torch.bfloat16).float()
        return torch.cat([nope, rope], dim=1)
    if fmt is V41:
        vals = data.contiguous().view(torch.float8_e4m3fn).float().view(-1, 16, 32)
        mult = torch.exp2(scales.float() - 127.0)
        mult = torch.where(scales == 255, math.nan, mult)  # UE8M0's NaN byte
        return (vals * mult[..., None]).view(-1, D_QK)
    codes = torch.stack([data & 0xF, data >> 4], dim=-1).view(-1, D_QK)
    mult = scales.contiguous().view(torch.float8_e4m3fn).float()
    return (_e2m1_values(codes).view(-1, 32, 16) * mult[..., None]).view(-1, D_QK)
