"""Extension points for packages that build on ads-gdpa (ads-gdpa-megakernel is the first).

A package that fuses work around the attention needs the two directions separately: the forward
alone, and the backward alone for an output gradient it computed itself (a fused norm backward
produces dO). These functions are that interface. They call the registered custom ops
``ads_gdpa::fwd`` / ``ads_gdpa::bwd``, so they compose with torch.compile(fullgraph=True) and pick
the same kernels (Gluon on sm_90, Triton elsewhere) as :func:`ads_gdpa.gdpa_varlen`. They are not
autograd functions: the caller owns the autograd graph.

Their names, arguments and results follow the package's semantic version: a 0.x minor release may
extend them with keyword arguments that have defaults, never rename or reorder what is here.
Masks, per-head activations, FP8 and the upstream extras (encodings, fused QKV, start/end
offsets) are not part of this interface yet; ask for them through :func:`ads_gdpa.gdpa_varlen`.
"""

from __future__ import annotations

import torch

from ._ops import BwdArgs, FwdArgs
from .activations import Activation, activation_id
from .problem import BIG, MaskMode

__all__ = ["Activation", "activation_id", "forward", "backward"]

Tensor = torch.Tensor
_NO_MASK = dict(mask_mode=int(MaskMode.NONE), win_left=BIG, win_right=BIG, broadcast_q=False)


def _common(cu_q, cu_k, max_q, max_k, activation, scale, host_q, host_k, deterministic) -> dict:
    """The op arguments both directions share: offsets, bounds, activation, scale, no mask."""
    return dict(
        cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k, act=activation_id(activation), act_per_head=None,
        scale=float(scale), host_q=host_q, host_k=host_k, deterministic=deterministic, **_NO_MASK,
    )  # fmt: skip


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    activation: str | int | Activation,
    scale: float = 1.0,
    cu_seqlens_q_cpu: Tensor | None = None,
    cu_seqlens_k_cpu: Tensor | None = None,
    deterministic: bool = False,
) -> Tensor:
    """O = scale · act(Q Kᵀ) V per sequence, without autograd.

    Args:
        q: (Tq, H, D) bf16/fp16 jagged queries.
        k, v: (Tk, Hkv, D), H a multiple of Hkv.
        cu_seqlens_q, cu_seqlens_k: (B + 1,) int32/int64 device offsets.
        max_seqlen_q, max_seqlen_k: host ints bounding the sequence lengths.
        activation: a name, id or :class:`Activation`.
        scale: applied to the output.
        cu_seqlens_q_cpu, cu_seqlens_k_cpu: optional host copies of the offsets (the
            workload-sorted schedule and host-side validation; no sync without them).
        deterministic: the forward is deterministic either way; kept for symmetry with backward.

    Returns:
        (Tq, H, D) like q.
    """
    common = _common(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, activation, scale,
                     cu_seqlens_q_cpu, cu_seqlens_k_cpu, deterministic)  # fmt: skip
    args = FwdArgs(q=q, k=k, v=v, q_descale=None, k_descale=None, v_descale=None, **common)
    return torch.ops.ads_gdpa.fwd(*args)


def backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    activation: str | int | Activation,
    scale: float = 1.0,
    cu_seqlens_q_cpu: Tensor | None = None,
    cu_seqlens_k_cpu: Tensor | None = None,
    deterministic: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of :func:`forward` for the output gradient ``dout`` (Tq, H, D).

    Same arguments as :func:`forward`; ``deterministic=True`` makes the gradients bitwise
    repeatable. dk/dv of a GQA group are summed over its query heads. Returns tensors shaped and
    typed like q, k, v.
    """
    common = _common(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, activation, scale,
                     cu_seqlens_q_cpu, cu_seqlens_k_cpu, deterministic)  # fmt: skip
    args = BwdArgs(do=dout, q=q, k=k, v=v, **common)
    grads = torch.ops.ads_gdpa.bwd(*args)
    return grads[0], grads[1], grads[2]
