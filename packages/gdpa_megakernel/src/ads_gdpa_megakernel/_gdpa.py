"""The one place that calls ads-gdpa: its documented extension interface, ``ads_gdpa.extension``.

The fused backward needs ads-gdpa's backward on its own (dO in, dq/dk/dv out), which its public
``gdpa_varlen`` does not expose; ``ads_gdpa.extension.forward`` / ``backward`` are that interface
(they call ads-gdpa's registered custom ops, so torch.compile sees them). ``ads-gdpa>=0.2,<0.3``
pins it. Only the unmasked, per-call-activation, non-FP8 GDPA is used here.
"""

from __future__ import annotations

import torch

from ads_gdpa import extension
from ads_gdpa.extension import Activation, activation_id

__all__ = ["Activation", "activation_id", "gdpa_bwd", "gdpa_fwd"]

Tensor = torch.Tensor


def gdpa_fwd(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, act: int,
    scale: float, host_q: Tensor | None, host_k: Tensor | None, deterministic: bool,
) -> Tensor:  # fmt: skip
    """O = scale · act(Q Kᵀ) V per sequence (ads-gdpa), (T, H, D) like q."""
    return extension.forward(
        q, k, v, cu_q, cu_k, max_q, max_k, activation=act, scale=scale, cu_seqlens_q_cpu=host_q,
        cu_seqlens_k_cpu=host_k, deterministic=deterministic,
    )  # fmt: skip


def gdpa_bwd(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
    act: int, scale: float, host_q: Tensor | None, host_k: Tensor | None, deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dv) of ads-gdpa for the output gradient ``do``."""
    return extension.backward(
        do, q, k, v, cu_q, cu_k, max_q, max_k, activation=act, scale=scale, cu_seqlens_q_cpu=host_q,
        cu_seqlens_k_cpu=host_k, deterministic=deterministic,
    )  # fmt: skip
