"""ads_norm_fusion: GEMMs fused with LayerNorm / RMSNorm (forward and backward), Triton, Hopper-first."""

from .__about__ import __version__
from .interface import (
    linear_layernorm,
    linear_layernorm_input_grad,
    linear_rmsnorm,
    linear_rmsnorm_input_grad,
    rmsnorm_linear,
)
from .modules import FusedLinearLayerNorm, FusedLinearRMSNorm, RMSNormLinear

__all__ = [
    "FusedLinearLayerNorm",
    "FusedLinearRMSNorm",
    "RMSNormLinear",
    "__version__",
    "linear_layernorm",
    "linear_layernorm_input_grad",
    "linear_rmsnorm",
    "linear_rmsnorm_input_grad",
    "rmsnorm_linear",
]
