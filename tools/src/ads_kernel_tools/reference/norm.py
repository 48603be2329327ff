"""Reference LayerNorm / RMSNorm and the GEMM + norm fusions (spec: block_attention_and_norm_fusion.md B).

All norms act on the last dimension, with fp32 (or fp64) statistics and a biased variance, like torch.
"""

from __future__ import annotations

import torch

__all__ = [
    "gemm_layer_norm_input_grad_ref",
    "gemm_layer_norm_ref",
    "gemm_rms_norm_input_grad_ref",
    "gemm_rms_norm_ref",
    "layer_norm_ref",
    "rms_norm_gemm_ref",
    "rms_norm_ref",
]


def _compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Round to ``dtype`` (the kernel's input precision), then widen to its compute dtype."""
    return None if t is None else t.to(dtype).to(_compute(dtype))


def layer_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    return_stats: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x - mean) * rstd * weight + bias`` over the last dim; returns y in ``dtype``.

    With ``return_stats``: ``(y, mean, rstd)`` with mean/rstd of shape x.shape[:-1] in the compute dtype
    (fp32, or fp64). bf16/fp16 ``dtype``: inputs rounded, fp32 statistics and math, y rounded.
    """
    xc = _cast(x, dtype)
    mean = xc.mean(dim=-1)
    var = (xc - mean[..., None]).square().mean(dim=-1)
    rstd = torch.rsqrt(var + eps)
    y = (xc - mean[..., None]) * rstd[..., None]
    if weight is not None:
        y = y * _cast(weight, dtype)
    if bias is not None:
        y = y + _cast(bias, dtype)
    y = y.to(dtype)
    return (y, mean, rstd) if return_stats else y


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    return_stats: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim; returns y in ``dtype``.

    With ``return_stats``: ``(y, rrms)``, rrms of shape x.shape[:-1] in the compute dtype.
    """
    xc = _cast(x, dtype)
    rrms = torch.rsqrt(xc.square().mean(dim=-1) + eps)
    y = xc * rrms[..., None]
    if weight is not None:
        y = y * _cast(weight, dtype)
    y = y.to(dtype)
    return (y, rrms) if return_stats else y


def gemm_layer_norm_ref(
    x: torch.Tensor,
    w: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    return_stats: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``LayerNorm(x @ w)`` over N, x (M, K), w (K, N); z stays in the compute dtype (fp32 accumulator).

    With ``return_stats``: ``(y, mean, rstd)`` with (M,) statistics, as the fused kernel returns.
    """
    z = _cast(x, dtype) @ _cast(w, dtype)
    return _norm_of_accumulator(layer_norm_ref, z, dtype, weight, bias, eps=eps, return_stats=return_stats)


def gemm_rms_norm_ref(
    x: torch.Tensor,
    w: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    return_stats: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``RMSNorm(x @ w)`` over N, x (M, K), w (K, N), statistics from the un-rounded accumulator.

    (The upstream Blackwell kernel squares the bf16-rounded accumulator; our rewrite keeps fp32.)
    """
    z = _cast(x, dtype) @ _cast(w, dtype)
    return _norm_of_accumulator(rms_norm_ref, z, dtype, weight, eps=eps, return_stats=return_stats)


def _norm_of_accumulator(norm, z: torch.Tensor, dtype: torch.dtype, *params, eps: float, return_stats: bool):
    # z is already the wide accumulator: run the norm in the compute dtype, round only the output.
    compute = _compute(dtype)
    params = tuple(None if p is None else _cast(p, dtype) for p in params)
    res = norm(z, *params, eps, return_stats=return_stats, dtype=compute)
    if return_stats:
        return (res[0].to(dtype), *res[1:])
    return res.to(dtype)


def rms_norm_gemm_ref(
    x: torch.Tensor,
    w: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``RMSNorm(x) @ w`` with the norm over K (spec B5), computed as ``diag(rrms) (x @ (weight ⊙ w))``."""
    xc, wc = _cast(x, dtype), _cast(w, dtype)
    rrms = torch.rsqrt(xc.square().mean(dim=-1) + eps)
    if weight is not None:
        wc = _cast(weight, dtype)[:, None] * wc
    return ((xc @ wc) * rrms[:, None]).to(dtype)


def gemm_layer_norm_input_grad_ref(
    dy: torch.Tensor,
    w2_t: torch.Tensor,
    x_hat: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    weight_grads: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm backward fused with the next layer's input-grad GEMM (spec B2).

    ``g = dy @ w2_t`` (dy (M, K), w2_t (K, N)); ``ĝ = g * weight`` if given; x_hat = saved normalised
    input (M, N); ``dz = rstd * (ĝ - mean_N(ĝ) - x_hat * mean_N(ĝ * x_hat))``. With ``weight_grads``:
    ``(dz, dweight = Σ_m g * x_hat, dbias = Σ_m g)``.
    """
    compute = _compute(dtype)
    g = _cast(dy, dtype) @ _cast(w2_t, dtype)
    xh = _cast(x_hat, dtype)
    gh = g * _cast(weight, dtype) if weight is not None else g
    dz = rstd.to(compute)[:, None] * (
        gh - gh.mean(dim=-1, keepdim=True) - xh * (gh * xh).mean(dim=-1, keepdim=True)
    )
    if weight_grads:
        return dz.to(dtype), (g * xh).sum(dim=0).to(dtype), g.sum(dim=0).to(dtype)
    return dz.to(dtype)


def gemm_rms_norm_input_grad_ref(
    dy: torch.Tensor,
    w2_t: torch.Tensor,
    x_hat: torch.Tensor,
    rrms: torch.Tensor,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """RMSNorm backward fused with the input-grad GEMM (spec B4), no weight:
    ``g = dy @ w2_t``, ``dh = (g - x_hat * mean_N(g * x_hat)) * rrms``."""
    compute = _compute(dtype)
    g = _cast(dy, dtype) @ _cast(w2_t, dtype)
    xh = _cast(x_hat, dtype)
    dh = (g - xh * (g * xh).mean(dim=-1, keepdim=True)) * rrms.to(compute)[:, None]
    return dh.to(dtype)
