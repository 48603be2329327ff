"""Public API: validate and canonicalise inputs, then call the ``ads_gdpa_megakernel::fwd`` custom op.

Per token t of q (T, H, D), with x = q[t] viewed as H·D features::

    q_ln = LayerNorm(x) · w_ln + b_ln        if q_layernorm (else q_ln = x)
    a    = GDPA(q_ln, K, V)                  ads-gdpa: scale · act(Q Kᵀ) V per sequence
    y    = a + q_ln                          if q_residual (q_ln is raw q when the LayerNorm is off)
    z    = y · rsqrt(mean(y²) + eps) · w     if rms_norm
    out  = z + residual                      if residual is not None

Validation never reads device memory (no host sync on the hot path).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ads_kernel_tools import checks
from ads_kernel_tools.offsets import host_copy

from . import _ops  # registers torch.ops.ads_gdpa_megakernel.*
from ._gdpa import Activation, activation_id

__all__ = ["gdpa_megakernel"]

_HALF = (torch.bfloat16, torch.float16)
_WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# ads-gdpa 0.2's head dims with D_qk == D_v (the q residual adds q to the attention output)
HEAD_DIMS = (16, 32, 64, 96, 128)
_P = "ads_gdpa_megakernel: "


def _err(msg: str) -> ValueError:
    return ValueError(_P + msg)


def _check_eps_scale(eps, scale) -> tuple[float, float]:
    """(eps, scale) as floats: eps finite and > 0, scale finite (bools and strings refused)."""
    return checks.real("eps", eps, prefix=_P, exclusive_minimum=0), checks.real("scale", scale, prefix=_P)


def _check_qkv(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise _err(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise _err(f"{name} must be (tokens, heads, head_dim), got shape {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise _err(f"{name} must be contiguous in its last (head) dim, got stride {t.stride()}")
    if q.dtype not in _HALF:
        raise _err(f"q must be bfloat16 or float16, got {q.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise _err(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise _err(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    h, hk = q.shape[1], k.shape[1]
    if v.shape[:2] != k.shape[:2]:
        raise _err(f"k and v must agree in tokens and heads, got {tuple(k.shape)} and {tuple(v.shape)}")
    if hk == 0 or h % hk != 0:
        raise _err(f"query heads ({h}) must be a multiple of kv heads ({hk})")
    d = q.shape[2]
    if k.shape[2] != d or v.shape[2] != d:
        raise _err(f"q, k, v head dims must be equal (the q residual adds q to the output), got "
                   f"{d}, {k.shape[2]}, {v.shape[2]}")  # fmt: skip
    if d not in HEAD_DIMS:
        raise _err(f"head dim {d} not supported; supported: {', '.join(map(str, HEAD_DIMS))}")


def _check_weight(name: str, w, n: int, heads: int, dim: int, device) -> torch.Tensor | None:
    if w is None:
        return None
    if not isinstance(w, torch.Tensor):
        raise _err(f"{name} must be a torch.Tensor or None, got {type(w).__name__}")
    if w.dim() != 1 or w.shape[0] != n:
        raise _err(f"{name} must have shape ({n},) = H·D = {heads}·{dim} (one value per feature of a token), "
                   f"got {tuple(w.shape)}")  # fmt: skip
    if w.dtype not in _WEIGHT_DTYPES:
        raise _err(f"{name} must be float32, bfloat16 or float16, got {w.dtype}")
    if w.device != device:
        raise _err(f"{name} is on {w.device}, q on {device}")
    return w.contiguous()


def _host_offsets(name: str, t, cpu_copy) -> torch.Tensor | None:
    return host_copy(name, t, cpu_copy, prefix=_P)


def _layernorm_params(q_layernorm, n, h, d, device):
    if q_layernorm is None:
        return False, None, None
    if not isinstance(q_layernorm, (tuple, list)) or len(q_layernorm) != 2:
        raise _err("q_layernorm must be None or a pair (weight, bias); either may be None (no affine part)")
    w = _check_weight("q_layernorm weight", q_layernorm[0], n, h, d, device)
    b = _check_weight("q_layernorm bias", q_layernorm[1], n, h, d, device)
    return True, w, b


def gdpa_megakernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    activation: str | int | Activation,
    scale: float = 1.0,
    q_layernorm: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
    q_residual: bool = False,
    rms_norm_weight: torch.Tensor | None = None,
    rms_norm: bool | None = None,
    residual: torch.Tensor | None = None,
    eps: float = 1e-5,
    deterministic: bool = False,
    cu_seqlens_q_cpu: torch.Tensor | Sequence[int] | None = None,
    cu_seqlens_k_cpu: torch.Tensor | Sequence[int] | None = None,
) -> torch.Tensor:
    """GDPA with a Q LayerNorm, a q residual, an RMSNorm over all heads and a residual, fused.

    Differentiable in q, k, v, both norms' weights and biases and ``residual``.

    Args:
        q: (T, H, D) bf16/fp16; k, v: (T_k, H_kv, D), H % H_kv == 0; D in ``HEAD_DIMS``.
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, activation, scale, deterministic,
            cu_seqlens_q_cpu, cu_seqlens_k_cpu: as ``ads_gdpa.gdpa_varlen``.
        q_layernorm: None (off) or (weight, bias), each (H·D,) or None: LayerNorm of each token's
            H·D features before the attention.
        q_residual: add the attention's query input (the LayerNorm output when it is on, else q).
        rms_norm_weight: (H·D,) weight of an RMSNorm over each token's H·D features; turns it on.
        rms_norm: force the RMSNorm on without a weight (True) or off (False); None = on iff
            ``rms_norm_weight`` is given.
        residual: (T, H, D) in q's dtype, added last; None adds nothing (upstream's "raw q as
            residual" is ``residual=q``).
        eps: of both norms.

    Returns:
        (T, H, D) in q's dtype. Every row is written: rows owned by no sequence (outside
        ``[cu_seqlens_q[0], cu_seqlens_q[-1])``) take the attention output as 0, like rows past
        ``max_seqlen_q``.
    """
    _check_qkv(q, k, v)
    t, h, d = q.shape
    n = h * d
    act = activation_id(activation)
    host_q = _host_offsets("cu_seqlens_q", cu_seqlens_q, cu_seqlens_q_cpu)
    if cu_seqlens_k is cu_seqlens_q and cu_seqlens_k_cpu is cu_seqlens_q_cpu:
        host_k = host_q
    else:
        host_k = _host_offsets("cu_seqlens_k", cu_seqlens_k, cu_seqlens_k_cpu)
    for name, off in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if off.device != q.device:
            raise _err(f"{name} is on {off.device}, q on {q.device}")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise _err(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries, cu_seqlens_k {cu_seqlens_k.shape[0]}")
    # the kernels read offsets by position: a strided view (a column of a matrix, ``t[::2]``) would be
    # read as the wrong entries; self attention keeps one object for both
    self_offsets = cu_seqlens_k is cu_seqlens_q
    cu_seqlens_q = cu_seqlens_q.contiguous()
    cu_seqlens_k = cu_seqlens_q if self_offsets else cu_seqlens_k.contiguous()
    max_seqlen_q = checks.integer("max_seqlen_q", max_seqlen_q, prefix=_P)
    max_seqlen_k = checks.integer("max_seqlen_k", max_seqlen_k, prefix=_P)
    if max_seqlen_q < 0 or max_seqlen_k < 0:
        raise _err("max_seqlen_q and max_seqlen_k must be >= 0")
    if not isinstance(q_residual, bool):
        raise _err(f"q_residual must be a bool, got {type(q_residual).__name__}")
    layer_norm, ln_w, ln_b = _layernorm_params(q_layernorm, n, h, d, q.device)
    rms_w = _check_weight("rms_norm_weight", rms_norm_weight, n, h, d, q.device)
    if rms_norm is None:
        rms_norm = rms_w is not None
    elif not isinstance(rms_norm, bool):
        raise _err(f"rms_norm must be a bool or None, got {type(rms_norm).__name__}")
    elif not rms_norm and rms_w is not None:
        raise _err("rms_norm=False contradicts a given rms_norm_weight")
    if residual is not None:
        if not isinstance(residual, torch.Tensor):
            raise _err(f"residual must be a torch.Tensor or None, got {type(residual).__name__}")
        if residual.shape != q.shape:
            raise _err(f"residual must have q's shape {tuple(q.shape)}, got {tuple(residual.shape)}")
        if residual.dtype != q.dtype:
            raise _err(f"residual must have q's dtype {q.dtype}, got {residual.dtype}")
        if residual.device != q.device:
            raise _err(f"residual is on {residual.device}, q on {q.device}")
        residual = residual.contiguous()
    eps, scale = _check_eps_scale(eps, scale)
    out = _ops.fwd_op(
        q.contiguous(), k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, act, scale, ln_w, ln_b,
        rms_w, residual, layer_norm, q_residual, rms_norm, eps, host_q, host_k, bool(deterministic),
    )  # fmt: skip
    return out[0]
