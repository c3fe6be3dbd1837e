"""Float64 PyTorch reference of DSv4 sparse-MLA decode, its accuracy check, and input maker.

Not deployed into SGLang: shared by the kernel tests and the benchmark harness. Depends on
torch and the sibling `dsv4_cache.py` (imported relatively inside the package, or by path
when these files are copied into a bare folder on a GPU host).

Math per request b and head h (`docs/kernel-contract.md`), valid set S_b =
{ j < topk_length[b] : 0 <= indices[b, j] < num_pages * page_size }:

    K_j = concat(dequant(nope_j), rope_j)          s_j = softmax_scale * <q[b, h], K_j>
    lse = log sum_j exp(s_j)   (-inf if S_b empty)  out = sum_j exp(s_j - lse) K_j  (0 if empty)

Main and extra cache merge by LSE; the sink adds exp(sink[h]) to the denominator and the
returned lse includes it (the sm_120 path's semantics).
"""

from __future__ import annotations

import math
import os
import sys

import torch

try:  # inside the package (kerneldev.kernels) or SGLang-style relative layout
    from .dsv4_cache import (
        D_QK,
        pack_paged_cache,
        padded_page_stride,
        unpack_paged_cache,
    )
except ImportError:  # loaded as a top-level module / from a bare folder of copied files
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dsv4_cache import (  # noqa: E402
        D_QK,
        pack_paged_cache,
        padded_page_stride,
        unpack_paged_cache,  # noqa: E402
    )

__all__ = ["reference_sparse_decode", "check_accuracy", "make_inputs", "TOLERANCES"]

# FlashMLA's bounds for `out` (abs, rel, cosine difference) and the spec's for `lse`.
TOLERANCES = {
    "out_abs": 1e-3,
    "out_rel": 2.0 / 128.0,
    "out_cos_diff": 5e-6,
    "lse_abs": 1e-6,
    "lse_rel": 1e-5,
}


def _attend_one_cache(q64, k_cache, indices, topk_length, scale):
    """Per-cache (out [B, H, 512] float64, lse [B, H] float64) over the valid set."""
    kv = unpack_paged_cache(k_cache).to(torch.float64)  # [T, 512]
    num_tokens = kv.shape[0]
    idx = indices.reshape(indices.shape[0], indices.shape[-1]).long()  # [B, topk] (B may be 0)
    B, topk = idx.shape
    H = q64.shape[1]
    pos = torch.arange(topk, device=idx.device)
    lens = (
        torch.full((B,), topk, device=idx.device, dtype=torch.long)
        if topk_length is None
        else topk_length.long()
    )
    valid = (idx >= 0) & (idx < num_tokens) & (pos[None, :] < lens[:, None])
    out = torch.zeros(B, H, D_QK, dtype=torch.float64, device=q64.device)
    lse = torch.full((B, H), -math.inf, dtype=torch.float64, device=q64.device)
    if topk == 0 or num_tokens == 0:  # nothing selectable (an empty cache: no row to gather)
        return out, lse
    # Chunk the batch so the gathered K stays around 256 MB of float64.
    chunk = max(1, (1 << 25) // max(1, topk * D_QK))
    for b0 in range(0, B, chunk):
        b1 = min(B, b0 + chunk)
        k = kv[idx[b0:b1].clamp(0, num_tokens - 1)]  # [b, topk, 512]
        s = torch.einsum("bhd,btd->bht", q64[b0:b1], k) * scale
        s = s.masked_fill(~valid[b0:b1, None, :], -math.inf)
        lse_c = torch.logsumexp(s, dim=-1)  # -inf where nothing is valid
        p = torch.exp(s - torch.where(torch.isinf(lse_c), 0.0, lse_c)[..., None])
        out[b0:b1] = torch.einsum("bht,btd->bhd", p, k)
        lse[b0:b1] = lse_c
    return out, lse


def _merge(out1, lse1, out2, lse2):
    lse = torch.logaddexp(lse1, lse2)
    safe = torch.where(torch.isinf(lse), 0.0, lse)
    w1 = torch.exp(lse1 - safe)
    w2 = torch.exp(lse2 - safe)
    return out1 * w1[..., None] + out2 * w2[..., None], lse


def reference_sparse_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    softmax_scale: float | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    **_ignored,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spec math in float64. Returns (out [B, 1, H, 512] float64, lse [B, H, 1] float64).

    Extra keyword arguments (e.g. `head_dim_v` from `make_inputs`) are accepted and ignored so
    that `reference_sparse_decode(**inputs)` works with the same dict as the kernel entry.
    """
    scale = D_QK**-0.5 if softmax_scale is None else float(softmax_scale)
    B, _, H, _ = q.shape
    q64 = q.reshape(B, H, q.shape[-1]).to(torch.float64)
    out, lse = _attend_one_cache(q64, k_cache, indices, topk_length, scale)
    if extra_k_cache is not None:
        out2, lse2 = _attend_one_cache(q64, extra_k_cache, extra_indices, extra_topk_length, scale)
        out, lse = _merge(out, lse, out2, lse2)
    if attn_sink is not None:
        sink = attn_sink.to(torch.float64)[None, :].expand(B, H)
        lse_s = torch.logaddexp(lse, sink)
        # An empty set's out stays 0 whatever the sink (a -inf sink: exp(-inf - -inf) is NaN).
        weight = torch.where(torch.isneginf(lse), 0.0, torch.exp(lse - lse_s))
        out = out * weight[..., None]
        lse = lse_s
    return out.reshape(B, 1, H, D_QK), lse.reshape(B, H, 1)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def check_accuracy(
    out: torch.Tensor,
    lse: torch.Tensor,
    ref_out: torch.Tensor,
    ref_lse: torch.Tensor,
    tolerances: dict | None = None,
) -> dict:
    """Compare a kernel's (out, lse) with the reference under FlashMLA's bounds.

    out: every element within `abs + rel * |ref|` (allclose semantics) and the cosine
    difference `1 - 2 <x, y> / (|x|^2 + |y|^2)` below its bound; lse: finite entries within
    `abs + rel * |ref|`, and -inf exactly where the reference is -inf. A non-finite reference
    element (NaN input) must be matched exactly; out must be finite wherever the reference is.
    Returns a JSON-able dict; an error figure (`*_err`, `*_cos_diff*`) is None when it is not
    finite, as when the kernel gave NaN or inf where the reference is finite.

    As in FlashMLA's own test (its reference returns `out.to(bfloat16)`), the reference output
    is first rounded to the kernel's output dtype when that is narrower than float32: the bf16
    rounding of the result alone costs a cosine difference of about 2-3e-6, half the bound.
    `out_cos_diff_unrounded` reports the difference to the unrounded reference as well.
    """
    tol = dict(TOLERANCES, **(tolerances or {}))
    x = out.detach().to(torch.float64).reshape(ref_out.shape).cpu()
    y_full = ref_out.detach().to(torch.float64).cpu()
    y = y_full
    if out.dtype in (torch.bfloat16, torch.float16):
        y = y_full.to(out.dtype).to(torch.float64)
    a = lse.detach().to(torch.float64).reshape(ref_lse.shape).cpu()
    r = ref_lse.detach().to(torch.float64).cpu()

    # A non-finite reference element (a NaN in q or the sink: garbage in) must be matched
    # exactly (NaN for NaN, the same inf) and is left out of the bounds and the cosine, which
    # it would otherwise make vacuous (a NaN bound passes any value, a NaN sum skipped the
    # cosine of the whole tensor).
    ref_ok = torch.isfinite(y) & torch.isfinite(y_full)
    same = (x == y) | (torch.isnan(x) & torch.isnan(y))
    out_finite = bool((torch.isfinite(x) | ~ref_ok).all())
    inf = torch.full_like(x, math.inf)
    diff = (x - y).abs()
    diff = torch.where(torch.isfinite(diff), diff, inf)
    diff = torch.where(ref_ok, diff, torch.where(same, torch.zeros_like(x), inf))
    bound = torch.where(ref_ok, tol["out_abs"] + tol["out_rel"] * y.abs(), torch.zeros_like(x))
    out_bad = int((diff > bound).sum())
    max_abs = float(diff.max()) if diff.numel() else 0.0
    rel = diff / torch.where(ref_ok, y.abs(), torch.ones_like(x)).clamp_min(1e-6)
    max_rel = float(rel.max()) if rel.numel() else 0.0
    xs, ys, ys_full = (torch.where(ref_ok, t, torch.zeros_like(t)) for t in (x, y, y_full))
    denom = float((xs * xs + ys * ys).sum())
    cos_diff = 1.0 - 2.0 * float((xs * ys).sum()) / denom if denom != 0 else 0.0
    if not math.isfinite(cos_diff):  # (a non-finite kernel value where the reference is finite)
        cos_diff = math.inf
    denom_u = float((xs * xs + ys_full * ys_full).sum())
    # `!= 0`, as above: a NaN sum (a NaN output) gives a NaN figure, reported as null, not 0.0.
    cos_diff_u = 1.0 - 2.0 * float((xs * ys_full).sum()) / denom_u if denom_u != 0 else 0.0

    # Infinite entries (-inf: nothing valid; +inf: a +inf sink) must match exactly, and NaN
    # (a NaN input) only where the reference is NaN.
    ref_inf = ~torch.isfinite(r)
    same_lse = (a == r) | (torch.isnan(a) & torch.isnan(r))
    inf_match = bool((same_lse | ~ref_inf).all()) and bool((torch.isfinite(a) == ~ref_inf).all())
    inf_match = inf_match and not bool((torch.isnan(a) & ~torch.isnan(r)).any())
    fin = ~ref_inf & torch.isfinite(a)
    lse_diff = (a - r).abs()[fin]
    lse_bad = int((lse_diff > tol["lse_abs"] + tol["lse_rel"] * r.abs()[fin]).sum())
    lse_max_abs = float(lse_diff.max()) if lse_diff.numel() else 0.0
    lse_max_rel = (
        float((lse_diff / r.abs()[fin].clamp_min(1e-12)).max()) if lse_diff.numel() else 0.0
    )
    if bool((~ref_inf & ~torch.isfinite(a)).any()):
        # NaN or inf where the reference is finite: the error there is unbounded, so the max is
        # too (null below), not the max over the other entries (0.0 when every one is NaN).
        lse_max_abs = lse_max_rel = math.inf

    # A figure that is not finite (the kernel's NaN or inf where the reference is finite) is
    # None: valid JSON, and never read as a perfect 0.0.
    result = {
        "out_max_abs_err": _finite_or_none(max_abs),
        "out_max_rel_err": _finite_or_none(max_rel),
        "out_mismatched": out_bad,
        "out_cos_diff": _finite_or_none(cos_diff),
        "out_cos_diff_unrounded": _finite_or_none(cos_diff_u),
        "lse_max_abs_err": _finite_or_none(lse_max_abs),
        "lse_max_rel_err": _finite_or_none(lse_max_rel),
        "lse_mismatched": lse_bad,
        "out_finite": out_finite,
        "out_allclose_ok": out_finite and out_bad == 0,
        "out_cos_ok": math.isfinite(cos_diff) and cos_diff < tol["out_cos_diff"],
        "lse_ok": inf_match and lse_bad == 0,
        "lse_inf_match": inf_match,
        "tolerances": tol,
    }
    result["ok"] = bool(result["out_allclose_ok"] and result["out_cos_ok"] and result["lse_ok"])
    return result


def _make_cache_and_indices(
    B, topk, page_size, num_pages, page_stride, topk_length, invalid_fraction, device, gen, spread,
    layout="v4",
):  # fmt: skip
    """One cache with random content plus its indices and topk_length."""
    if num_pages is None:
        # Enough distinct tokens that requests rarely share, so L2 does not flatter big shapes.
        num_pages = max(1, math.ceil(max(topk, 1) * max(B, 1) * 1.25 / page_size))
    num_tokens = num_pages * page_size
    dev = gen.device
    kv = torch.randn(num_tokens, D_QK, generator=gen, dtype=torch.float32, device=dev)
    if spread:  # vary the 64-dim group magnitudes by 2^[-spread, spread] (UE8M0 scales differ)
        kv[:, :448] *= torch.exp2(
            torch.randint(-spread, spread + 1, (num_tokens, 7), generator=gen, device=dev).float()
        ).repeat_interleave(64, dim=1)
    if page_stride == "pad576":
        page_stride = padded_page_stride(page_size, layout=layout)
    k_cache = pack_paged_cache(kv, page_size, page_stride, num_pages=num_pages, layout=layout)

    idx = torch.randint(0, num_tokens, (B, topk), generator=gen, dtype=torch.int64, device=dev)
    if invalid_fraction > 0 and topk > 0:
        bad = torch.rand(B, topk, generator=gen, device=dev) < invalid_fraction
        kind = torch.rand(B, topk, generator=gen, device=dev) < 0.5
        neg = torch.randint(-1000, 0, (B, topk), generator=gen, device=dev)
        neg[torch.rand(B, topk, generator=gen, device=dev) < 0.5] = -1
        past = num_tokens + torch.randint(
            0, 4 * page_size + 1, (B, topk), generator=gen, device=dev
        )
        idx = torch.where(bad & kind, neg, idx)
        idx = torch.where(bad & ~kind, past, idx)
    if topk_length == "full":
        lens = torch.full((B,), topk, dtype=torch.int32, device=dev)
    elif topk_length == "partial":
        lens = torch.randint(0, topk + 1, (B,), generator=gen, dtype=torch.int32, device=dev)
        if B > 0:
            lens[0] = max(1, topk // 3) if topk > 0 else 0
        # Entries past the length are garbage a kernel must ignore, even huge ones.
        pos = torch.arange(topk, device=dev)[None, :]
        junk = torch.randint(
            -(2**31), 2**31 - 1, (B, topk), generator=gen, dtype=torch.int64, device=dev
        )
        idx = torch.where(pos >= lens[:, None].long(), junk, idx)
    elif topk_length == "zero":
        lens = torch.zeros(B, dtype=torch.int32, device=dev)
    elif topk_length is None or topk_length == "none":
        lens = None
    else:
        raise ValueError(
            f"topk_length must be 'full', 'partial', 'zero' or 'none', got {topk_length!r}"
        )
    idx = idx.to(torch.int32).to(device)
    return k_cache, idx, (None if lens is None else lens.to(device))


def make_inputs(
    B: int,
    H: int,
    topk: int,
    page_size: int,
    *,
    extra_topk: int = 0,
    extra_page_size: int = 64,
    num_pages: int | None = None,
    extra_num_pages: int | None = None,
    page_stride: int | str | None = None,
    with_sink: bool | str = False,
    topk_length: str = "full",
    invalid_fraction: float = 0.0,
    indices_3d: bool = False,
    kv_scale_spread: int = 0,
    device: str | torch.device = "cpu",
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    kv_layout: str = "v4",
    extra_kv_layout: str | None = None,
) -> dict:
    """Random DSv4 decode inputs: exactly the keyword arguments of the kernel entry point.

    Values are FlashMLA's test distribution: q standard normal clamped to [-1, 1], K/V rows
    standard normal before quantization; `kv_scale_spread=s` multiplies each 64-dim nope group
    by 2^k, k uniform in [-s, s] (peakier softmax: a bf16-P kernel can miss the out bounds).
    `with_sink`: False, True (random finite sinks) or "inf" (some +inf / -inf, as FlashMLA's
    test does). `page_stride`: None (P * 584), "pad576" (FlashMLA's padding, applied to both
    caches) or an int (main cache only). `topk_length`: "full", "partial" (random per request,
    entries past the length hold garbage), "zero", or "none" (pass None). `invalid_fraction` of
    the indices are negative or past the cache's end. The extra cache (when `extra_topk > 0`)
    uses the same topk_length mode with its own page size. `kv_layout` / `extra_kv_layout`:
    the caches' token formats ("v4" 584 bytes, "v41" 528, "v41_fp4" 288: `dsv4_cache.py`);
    the extra cache's defaults to the main cache's. "pad576" pads each to its own format's
    unit (576, 512, 256 bytes), as SGLang's pools do.
    """
    device = torch.device(device)
    # Random numbers are drawn on the target device (fast for big shapes); a seed gives the same
    # inputs on the same device type.
    gen = torch.Generator(device=device).manual_seed(int(seed))
    # As FlashMLA's decode test: standard normal queries clamped to [-1, 1].
    q = torch.randn(B, 1, H, D_QK, generator=gen, dtype=torch.float32, device=device)
    q = q.clamp_(-1.0, 1.0).to(dtype)
    k_cache, indices, lens = _make_cache_and_indices(
        B,
        topk,
        page_size,
        num_pages,
        page_stride,
        topk_length,
        invalid_fraction,
        device,
        gen,
        kv_scale_spread,
        kv_layout,
    )
    if indices_3d:
        indices = indices[:, None, :]
    inputs = {
        "q": q,
        "k_cache": k_cache,
        "indices": indices,
        "topk_length": lens,
        "attn_sink": None,
        "head_dim_v": D_QK,
        "softmax_scale": D_QK**-0.5,
        "extra_k_cache": None,
        "extra_indices": None,
        "extra_topk_length": None,
    }
    if with_sink:
        inputs["attn_sink"] = torch.randn(H, generator=gen, device=device) * 2.0
        if with_sink == "inf":  # as FlashMLA's test: some heads +inf (all weight), some -inf
            pick = torch.randn(H, generator=gen, device=device)
            inputs["attn_sink"][pick > 0.5] = math.inf
            inputs["attn_sink"][pick < -0.5] = -math.inf
    if extra_topk > 0:
        e_stride = "pad576" if page_stride == "pad576" else None
        e_cache, e_idx, e_lens = _make_cache_and_indices(
            B,
            extra_topk,
            extra_page_size,
            extra_num_pages,
            e_stride,
            topk_length,
            invalid_fraction,
            device,
            gen,
            kv_scale_spread,
            extra_kv_layout or kv_layout,
        )
        inputs["extra_k_cache"] = e_cache
        inputs["extra_indices"] = e_idx[:, None, :] if indices_3d else e_idx
        inputs["extra_topk_length"] = e_lens
    return inputs


# Bytes and FLOPs a decode step must move/do (the spec's roofline), for harnesses.
