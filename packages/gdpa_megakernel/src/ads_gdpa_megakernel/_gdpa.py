"""The one place that calls ads-gdpa: its ``ads_gdpa::fwd`` / ``ads_gdpa::bwd`` custom ops.

The fused backward needs ads-gdpa's backward on its own (dO in, dq/dk/dv out), which its public
``gdpa_varlen`` does not expose, so both directions go through the registered ops, their arguments
named through ads-gdpa's ``FwdArgs`` / ``BwdArgs`` (a renamed or reordered field fails here, at
import or on the first call, not as a wrong answer; fields added with defaults keep them).
``ads-gdpa>=0.2,<0.3`` pins that schema. Only the unmasked, per-call-activation, non-FP8 GDPA
without ads-gdpa's upstream extras (encodings, fused QKV, start/end offsets) is used here.
"""

from __future__ import annotations

import torch

import ads_gdpa  # noqa: F401  (registers torch.ops.ads_gdpa.*)
from ads_gdpa._ops import BwdArgs, FwdArgs
from ads_gdpa.activations import Activation, activation_id
from ads_gdpa.problem import BIG, MaskMode

__all__ = ["Activation", "activation_id", "gdpa_bwd", "gdpa_fwd"]

Tensor = torch.Tensor
_NO_MASK = dict(mask_mode=int(MaskMode.NONE), win_left=BIG, win_right=BIG, broadcast_q=False)


def gdpa_fwd(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, act: int,
    scale: float, host_q: Tensor | None, host_k: Tensor | None, deterministic: bool,
) -> Tensor:  # fmt: skip
    """O = scale · act(Q Kᵀ) V per sequence (ads-gdpa), (T, H, D) like q."""
    args = FwdArgs(
        q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k, act=act, act_per_head=None,
        scale=scale, q_descale=None, k_descale=None, v_descale=None, host_q=host_q, host_k=host_k,
        deterministic=deterministic, **_NO_MASK,
    )  # fmt: skip
    return torch.ops.ads_gdpa.fwd(*args)


def gdpa_bwd(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
    act: int, scale: float, host_q: Tensor | None, host_k: Tensor | None, deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dv) of ads-gdpa for the output gradient ``do`` (its op may return more: the
    gradients of features not used here, e.g. encoding tables)."""
    args = BwdArgs(
        do=do, q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k, act=act,
        act_per_head=None, scale=scale, deterministic=deterministic, host_q=host_q, host_k=host_k,
        **_NO_MASK,
    )  # fmt: skip
    grads = torch.ops.ads_gdpa.bwd(*args)
    return grads[0], grads[1], grads[2]
