"""``GDPABlock``: the fused chain as an nn.Module holding the norms' parameters."""

from __future__ import annotations

import torch
from torch import nn

from ._gdpa import Activation, activation_id
from .interface import _check_eps_scale, _err, gdpa_megakernel

__all__ = ["GDPABlock"]


class GDPABlock(nn.Module):
    """q → [LayerNorm over H·D] → GDPA → [+ q] → [RMSNorm over H·D] → [+ residual], fused.

    Args:
        num_heads, head_dim: H and D of q; the norms act on H·D features.
        activation, scale: of the attention (``ads_gdpa.gdpa_varlen``).
        q_layernorm: a LayerNorm on the queries; ``ln_affine`` / ``ln_bias`` give it a weight / bias.
        q_residual: add the attention's query input (the LayerNorm output when it is on).
        rms_norm: an RMSNorm after the q residual, with a weight when ``rms_affine``.
        eps: of both norms.

    ``forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, residual=None, **kw)``
    takes the arguments of :func:`gdpa_megakernel` (``kw``: deterministic, host offsets).
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        activation: str | int | Activation,
        scale: float = 1.0,
        q_layernorm: bool = True,
        ln_affine: bool = True,
        ln_bias: bool = True,
        q_residual: bool = True,
        rms_norm: bool = True,
        rms_affine: bool = True,
        eps: float = 1e-5,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        n = num_heads * head_dim
        self.num_heads, self.head_dim = num_heads, head_dim
        self.eps, self.scale = _check_eps_scale(eps, scale)  # not float(): "0.5" would pass as 0.5
        self.activation = activation_id(activation)
        self.q_layernorm, self.q_residual, self.rms_norm = q_layernorm, q_residual, rms_norm
        kw = {"device": device, "dtype": dtype}
        self.ln_weight = nn.Parameter(torch.ones(n, **kw)) if q_layernorm and ln_affine else None
        self.ln_bias = nn.Parameter(torch.zeros(n, **kw)) if q_layernorm and ln_affine and ln_bias else None
        self.rms_weight = nn.Parameter(torch.ones(n, **kw)) if rms_norm and rms_affine else None

    @classmethod
    def from_modules(
        cls,
        layer_norm: nn.LayerNorm | None,
        rms_norm: nn.RMSNorm | None,
        *,
        num_heads: int,
        head_dim: int,
        activation: str | int | Activation,
        scale: float = 1.0,
        q_residual: bool = False,
    ) -> GDPABlock:
        """The block equal to an unfused stack ``layer_norm`` → GDPA(activation, scale) → [+ q] →
        ``rms_norm`` → [+ residual], sharing its parameters (the same ``nn.Parameter`` objects, so
        training either updates both). Either norm may be None (absent). GDPA has no parameters:
        the attention is given by ``activation`` and ``scale``.

        Raises:
            ValueError: a norm not over the H·D features, or two eps values (the fused kernels
                take one); an RMSNorm with ``eps=None`` (torch then uses the dtype's machine eps)
                also counts as a different eps.
        """
        n = num_heads * head_dim
        eps_values = []
        if layer_norm is not None:
            if not isinstance(layer_norm, nn.LayerNorm):
                raise _err(f"layer_norm must be an nn.LayerNorm or None, got {type(layer_norm).__name__}")
            if tuple(layer_norm.normalized_shape) != (n,):
                raise _err(
                    f"layer_norm must normalise H·D = {n} features, got {tuple(layer_norm.normalized_shape)}"
                )
            eps_values.append(float(layer_norm.eps))
        if rms_norm is not None:
            if not isinstance(rms_norm, nn.RMSNorm):
                raise _err(f"rms_norm must be an nn.RMSNorm or None, got {type(rms_norm).__name__}")
            if tuple(rms_norm.normalized_shape) != (n,):
                raise _err(
                    f"rms_norm must normalise H·D = {n} features, got {tuple(rms_norm.normalized_shape)}"
                )
            if rms_norm.eps is None:
                raise _err("rms_norm has eps=None (the dtype's machine eps); the fused kernels need one eps")
            eps_values.append(float(rms_norm.eps))
        if len(set(eps_values)) > 1:
            raise _err(
                f"the LayerNorm and the RMSNorm must share one eps, got {eps_values[0]} and {eps_values[1]}"
            )
        block = cls(
            num_heads, head_dim, activation=activation, scale=scale, q_layernorm=layer_norm is not None,
            ln_affine=False, q_residual=q_residual, rms_norm=rms_norm is not None, rms_affine=False,
            eps=eps_values[0] if eps_values else 1e-5,
        )  # fmt: skip
        if layer_norm is not None:
            block.ln_weight, block.ln_bias = layer_norm.weight, layer_norm.bias
        if rms_norm is not None:
            block.rms_weight = rms_norm.weight
        return block

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        residual: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        if q.dim() != 3 or q.shape[1:] != (self.num_heads, self.head_dim):
            raise _err(
                f"q must be (T, {self.num_heads}, {self.head_dim}) for this block, got {tuple(q.shape)}"
            )
        return gdpa_megakernel(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, activation=self.activation,
            scale=self.scale, q_layernorm=(self.ln_weight, self.ln_bias) if self.q_layernorm else None,
            q_residual=self.q_residual, rms_norm_weight=self.rms_weight, rms_norm=self.rms_norm,
            residual=residual, eps=self.eps, **kwargs,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, head_dim={self.head_dim}, activation={self.activation}, "
                f"scale={self.scale}, q_layernorm={self.q_layernorm}, q_residual={self.q_residual}, "
                f"rms_norm={self.rms_norm}, eps={self.eps}")  # fmt: skip
