"""Public API: validate and flatten inputs, call the ops (``_ops``: the custom ops, or for plain eager
calls an autograd.Function over the same kernels).

Validation reads only shapes, dtypes and devices, so it never synchronises with the GPU; it reads each
attribute once, and a device's capability once per process.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ads_kernel_tools import checks
from ads_kernel_tools.capability import interpreter_active

from . import _ops
from .config import SUPPORTED_MULTIPLE

_DTYPES = (torch.bfloat16, torch.float16)


def _check_matrix(name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise ValueError(f"{name} has dtype {t.dtype}; supported: bfloat16, float16 (statistics are fp32)")
    return t


@functools.cache
def _has_tma(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def _check_device(x: Tensor) -> None:
    device = x.device
    if device.type == "cuda":
        if not _has_tma(device.index):
            raise ValueError("the fused kernels use TMA descriptors: they need an sm_90+ GPU")
    elif not interpreter_active():
        raise ValueError(f"{device} tensors need TRITON_INTERPRET=1 (Triton's interpreter runs them)")


def _check_size(name: str, value: int) -> None:
    if value <= 0 or value % SUPPORTED_MULTIPLE != 0:
        raise ValueError(f"{name}={value} must be a positive multiple of {SUPPORTED_MULTIPLE}")


def _check_vectors(like: Tensor, size: int, names: tuple[str, ...], vectors: tuple) -> tuple:
    """Each vector None or a (size,) tensor of like's dtype and device (read once for all of them).
    Returns them contiguous: the kernels index a vector by its position alone, so a strided view
    (a column of a matrix, ``p[::2]``) would otherwise be read as the wrong elements."""
    dtype = device = None
    out = []
    for name, t in zip(names, vectors):
        out.append(t)
        if t is None:
            continue
        if not isinstance(t, Tensor) or t.shape != (size,):
            raise ValueError(
                f"{name} must be a ({size},) tensor, got {getattr(t, 'shape', type(t).__name__)}"
            )
        if dtype is None:
            dtype, device = like.dtype, like.device
        if t.dtype != dtype or t.device != device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}; x is {like.dtype} on {like.device}")
        out[-1] = t.contiguous()
    return tuple(out)


def _check_vector(name: str, t: Tensor | None, size: int, like: Tensor) -> Tensor | None:
    return _check_vectors(like, size, (name,), (t,))[0]


_LN_VECTORS = ("bias", "norm_weight", "norm_bias")
_RMS_VECTORS = ("bias", "norm_weight")


def _check_eps(eps: object) -> float:
    return checks.real("eps", eps, minimum=0)


def _linear_inputs(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor, int, int]:
    """x (..., K), w (N, K) in nn.Linear's layout -> (x2 (M, K) contiguous, w contiguous, N, K)."""
    x, w = _check_matrix("x", x), _check_matrix("w", w)
    xs, ws = x.shape, w.shape
    if not xs or len(ws) != 2:
        raise ValueError(f"x must be (..., K) and w (N, K); got {tuple(xs)} and {tuple(ws)}")
    n, k = ws
    if xs[-1] != k:
        raise ValueError(f"x has {xs[-1]} features, w expects K={k} (w is (N, K) like nn.Linear.weight)")
    if w.dtype != x.dtype or w.device != x.device:
        raise ValueError(f"w is {w.dtype} on {w.device}; x is {x.dtype} on {x.device}")
    if n <= 0 or k <= 0 or (n | k) % SUPPORTED_MULTIPLE:  # a power of two: one test for both
        _check_size("K", k)
        _check_size("N", n)
    _check_device(x)
    x2 = x if len(xs) == 2 else x.reshape(-1, k)  # no reshape (and no autograd view node) for 2-D x
    return x2.contiguous(), w.contiguous(), n, k


def _needs_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear_layernorm(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    norm_weight: Tensor | None = None,
    norm_bias: Tensor | None = None,
    eps: float = 1e-5,
    return_stats: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """``LayerNorm(x @ wᵀ + bias)`` over the N output features, in one GEMM with the norm in its epilogue.

    Args:
        x: (..., K) bf16/fp16. w: (N, K), nn.Linear's layout. bias: (N,) or None.
        norm_weight, norm_bias: (N,) LayerNorm affine parameters or None. N and K: multiples of 16.
        eps: added to the (biased) variance. return_stats: also return the fp32 row statistics.
    Returns:
        y (..., N) in x's dtype; with ``return_stats`` ``(y, mean, rstd)``, each statistic (...,) fp32
        and without gradient. Autograd reaches x, w, bias, norm_weight and norm_bias.
    """
    lead = x.shape[:-1] if isinstance(x, Tensor) else ()
    x2, w, n, _k = _linear_inputs(x, w)
    bias, norm_weight, norm_bias = _check_vectors(x2, n, _LN_VECTORS, (bias, norm_weight, norm_bias))
    affine = norm_weight is not None or norm_bias is not None
    grad = _needs_grad(x, w, bias, norm_weight, norm_bias)
    y, mean, rstd, _, _ = _ops.linear_layernorm(
        x2, w, bias, norm_weight, norm_bias, _check_eps(eps), affine and grad, grad
    )
    if len(lead) != 1:
        y, mean, rstd = y.reshape(*lead, n), mean.reshape(lead), rstd.reshape(lead)
    return (y, mean, rstd) if return_stats else y


def linear_rmsnorm(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    norm_weight: Tensor | None = None,
    eps: float = 1e-6,
    return_stats: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """``RMSNorm(x @ wᵀ + bias)`` over the N output features, statistics from the fp32 accumulator.

    Args as :func:`linear_layernorm` (no norm bias). Returns y (..., N), or ``(y, rrms)`` with
    ``rrms = rsqrt(mean(z²) + eps)`` per row, fp32, without gradient.
    """
    lead = x.shape[:-1] if isinstance(x, Tensor) else ()
    x2, w, n, _k = _linear_inputs(x, w)
    bias, norm_weight = _check_vectors(x2, n, _RMS_VECTORS, (bias, norm_weight))
    grad = _needs_grad(x, w, bias, norm_weight)
    y, rrms, _ = _ops.linear_rmsnorm(
        x2, w, bias, norm_weight, _check_eps(eps), norm_weight is not None and grad, grad
    )
    if len(lead) != 1:
        y, rrms = y.reshape(*lead, n), rrms.reshape(lead)
    return (y, rrms) if return_stats else y


def rmsnorm_linear(
    x: Tensor, norm_weight: Tensor | None, w: Tensor, bias: Tensor | None = None, eps: float = 1e-6
) -> Tensor:
    """``RMSNorm(x) @ wᵀ + bias`` with the norm over the K input features as a per-row scale.

    ``rrms = rsqrt(mean(x²) + eps)`` comes from the x tiles the GEMM loads (on Hopper, calls of
    2^25 outputs or more: the Gluon kernel, which reads x once; elsewhere the Triton kernels, K < 1024)
    or from one row pass over x (Triton, K >= 1024); ``norm_weight`` (K,) is folded into w.
    Args: x (..., K), norm_weight (K,) or None, w (N, K), bias (N,) or None.
    Returns y (..., N); autograd reaches x, norm_weight, w and bias.
    """
    lead = x.shape[:-1] if isinstance(x, Tensor) else ()
    x2, w, n, k = _linear_inputs(x, w)
    norm_weight = _check_vector("norm_weight", norm_weight, k, x2)
    bias = _check_vector("bias", bias, n, x2)
    grad = _needs_grad(x, norm_weight, w, bias)
    y, _ = _ops.rmsnorm_linear(x2, norm_weight, w, bias, _check_eps(eps), grad)
    return y if len(lead) == 1 else y.reshape(*lead, n)


def _input_grad_inputs(dy, w_next_t, x_hat, rstat, stat_name):
    dy, w_next_t = _check_matrix("dy", dy), _check_matrix("w_next_t", w_next_t)
    x_hat = _check_matrix("x_hat", x_hat)
    if dy.dim() != 2 or w_next_t.dim() != 2 or x_hat.dim() != 2:
        raise ValueError("dy (M, K), w_next_t (K, N) and x_hat (M, N) must be 2-D")
    m, k = dy.shape
    if w_next_t.shape[0] != k:
        raise ValueError(f"w_next_t has {w_next_t.shape[0]} rows, dy has K={k} columns")
    n = w_next_t.shape[1]
    if tuple(x_hat.shape) != (m, n):
        raise ValueError(f"x_hat must be ({m}, {n}), got {tuple(x_hat.shape)}")
    for name, t in (("w_next_t", w_next_t), ("x_hat", x_hat)):
        if t.dtype != dy.dtype or t.device != dy.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}; dy is {dy.dtype} on {dy.device}")
    if not isinstance(rstat, Tensor) or tuple(rstat.shape) != (m,) or rstat.dtype != torch.float32:
        raise ValueError(f"{stat_name} must be a ({m},) float32 tensor, got {getattr(rstat, 'shape', rstat)}")
    _check_size("K", k)
    _check_size("N", n)
    _check_device(dy)
    return dy.contiguous(), w_next_t.contiguous(), x_hat.contiguous(), rstat.contiguous().to(dy.device), n


def linear_layernorm_input_grad(
    dy: Tensor,
    w_next_t: Tensor,
    x_hat: Tensor,
    rstd: Tensor,
    weight: Tensor | None = None,
    *,
    weight_grads: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """LayerNorm backward fused with the next layer's input-grad GEMM (spec B2).

    Forward chain ``z -> x̂ = LN(z) -> y = x̂·γ + β -> y @ W2ᵀ``. Computes ``g = dy @ w_next_t`` and in
    the same kernel ``dz = rstd·(ĝ - mean_N(ĝ) - x̂·mean_N(ĝ·x̂))`` with ``ĝ = g·γ``.

    Args: dy (M, K) gradient of the next layer's output; w_next_t (K, N) (the next nn.Linear's weight);
    x_hat (M, N) saved normalised value; rstd (M,) fp32; weight γ (N,) or None.
    Returns dz (M, N), or with ``weight_grads`` ``(dz, dweight = Σ_m g·x̂, dbias = Σ_m g)``, summed in a
    fixed order (deterministic).
    """
    dy, w_next_t, x_hat, rstd, n = _input_grad_inputs(dy, w_next_t, x_hat, rstd, "rstd")
    weight = _check_vector("weight", weight, n, dy)
    dz, dweight, dbias = _ops.norm_input_grad(dy, w_next_t, x_hat, rstd, weight, False, False, weight_grads)
    return (dz, dweight, dbias) if weight_grads else dz


def linear_rmsnorm_input_grad(dy: Tensor, w_next_t: Tensor, x_hat: Tensor, rrms: Tensor) -> Tensor:
    """RMSNorm backward fused with the next layer's input-grad GEMM (spec B4):
    ``g = dy @ w_next_t``, ``dz = (g - x̂·mean_N(g·x̂))·rrms``. Shapes as
    :func:`linear_layernorm_input_grad`; returns dz (M, N)."""
    dy, w_next_t, x_hat, rrms, _n = _input_grad_inputs(dy, w_next_t, x_hat, rrms, "rrms")
    dz, _, _ = _ops.norm_input_grad(dy, w_next_t, x_hat, rrms, None, True, False, False)
    return dz
