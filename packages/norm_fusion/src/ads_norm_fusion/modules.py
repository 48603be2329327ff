"""nn.Module wrappers: a Linear and a norm kept as ordinary submodules, run by one fused op.

The parameters live in ``linear`` and ``norm`` (an ``nn.Linear`` and an ``nn.LayerNorm`` /
``nn.RMSNorm``), so the state dict has the keys ``linear.weight``, ``linear.bias``, ``norm.weight``
(``norm.bias``), the same as ``nn.Sequential(OrderedDict(linear=..., norm=...))``, and checkpoints move
between the fused and the unfused model unchanged. ``from_modules`` wraps existing modules (it shares
their parameters, it does not copy them).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .interface import linear_layernorm, linear_rmsnorm, rmsnorm_linear


def _single_dim(norm: nn.Module) -> int:
    shape = tuple(norm.normalized_shape)
    if len(shape) != 1:
        raise ValueError(f"only a norm over the last dimension is fused; got normalized_shape={shape}")
    return shape[0]


def _rms_eps(norm: nn.RMSNorm, dtype: torch.dtype) -> float:
    # nn.RMSNorm's eps=None means the input dtype's machine epsilon
    return norm.eps if norm.eps is not None else torch.finfo(dtype).eps


def _adopt(cls, norm_type: type, first: nn.Module, second: nn.Module, *, norm_first: bool):
    """A ``cls`` module holding the given (linear, norm) pair, registered in the order they run (the
    state dict's key order), after checking their types and that the norm's size is the linear's
    output (norm after the linear) or input (norm before it) width."""
    linear, norm = (second, first) if norm_first else (first, second)
    if not isinstance(linear, nn.Linear) or not isinstance(norm, norm_type):
        names = ["an nn.Linear", f"an nn.{norm_type.__name__}"]
        if norm_first:
            names.reverse()
        raise ValueError(f"from_modules takes {names[0]} and {names[1]}")
    side = "in_features" if norm_first else "out_features"
    if _single_dim(norm) != getattr(linear, side):
        raise ValueError(f"norm size {_single_dim(norm)} != linear.{side} {getattr(linear, side)}")
    mod = cls.__new__(cls)
    nn.Module.__init__(mod)
    if norm_first:
        mod.norm, mod.linear = norm, linear
    else:
        mod.linear, mod.norm = linear, norm
    return mod


class FusedLinearLayerNorm(nn.Module):
    """``LayerNorm(Linear(x))`` over the output features. Args as nn.Linear plus ``eps`` and
    ``elementwise_affine`` / ``norm_bias`` of nn.LayerNorm."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        norm_bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.linear = nn.Linear(in_features, out_features, bias=bias, **kw)
        self.norm = nn.LayerNorm(
            out_features, eps=eps, elementwise_affine=elementwise_affine, bias=norm_bias, **kw
        )

    @classmethod
    def from_modules(cls, linear: nn.Linear, norm: nn.LayerNorm) -> FusedLinearLayerNorm:
        """Wraps an existing pair (sharing its parameters): the same outputs, gradients and state
        dict as ``norm(linear(x))``."""
        return _adopt(cls, nn.LayerNorm, linear, norm, norm_first=False)

    def forward(self, x: Tensor) -> Tensor:
        return linear_layernorm(
            x, self.linear.weight, self.linear.bias, self.norm.weight, self.norm.bias, self.norm.eps
        )


class FusedLinearRMSNorm(nn.Module):
    """``RMSNorm(Linear(x))`` over the output features. Args as nn.Linear plus nn.RMSNorm's."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.linear = nn.Linear(in_features, out_features, bias=bias, **kw)
        self.norm = nn.RMSNorm(out_features, eps=eps, elementwise_affine=elementwise_affine, **kw)

    @classmethod
    def from_modules(cls, linear: nn.Linear, norm: nn.RMSNorm) -> FusedLinearRMSNorm:
        """Wraps an existing pair (sharing its parameters): the same outputs, gradients and state
        dict as ``norm(linear(x))``."""
        return _adopt(cls, nn.RMSNorm, linear, norm, norm_first=False)

    def forward(self, x: Tensor) -> Tensor:
        eps = _rms_eps(self.norm, x.dtype)
        return linear_rmsnorm(x, self.linear.weight, self.linear.bias, self.norm.weight, eps)


class RMSNormLinear(nn.Module):
    """``Linear(RMSNorm(x))``: the norm over the input features, applied as a per-row GEMM scale."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.norm = nn.RMSNorm(in_features, eps=eps, elementwise_affine=elementwise_affine, **kw)
        self.linear = nn.Linear(in_features, out_features, bias=bias, **kw)

    @classmethod
    def from_modules(cls, norm: nn.RMSNorm, linear: nn.Linear) -> RMSNormLinear:
        """Wraps an existing pair, given in the order they run: the norm first, then the linear
        (sharing their parameters; the same outputs, gradients and state dict as
        ``linear(norm(x))``)."""
        return _adopt(cls, nn.RMSNorm, norm, linear, norm_first=True)

    def forward(self, x: Tensor) -> Tensor:
        eps = _rms_eps(self.norm, x.dtype)
        return rmsnorm_linear(x, self.norm.weight, self.linear.weight, self.linear.bias, eps)
