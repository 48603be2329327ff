"""MXFP8 (E4M3 payload, E8M0 scale per 32 elements) varlen attention with upstream lp_fa4's names.

Layouts and scale rules: :mod:`lp_fa4.mxfp8.quantize`; the attention entry points and what they do
on Hopper (dequantise, then the BF16 engine): :mod:`lp_fa4.mxfp8.attention`.
"""

from .attention import mxfp8_flash_attn_varlen_backward, mxfp8_flash_attn_varlen_forward
from .quantize import (
    Mxfp8VarlenMeta,
    Mxfp8VarlenTensor,
    dequantize_mxfp8_varlen,
    mxfp8_scales_logical,
    quantize_mxfp8_varlen,
)

__all__ = [
    "Mxfp8VarlenMeta",
    "Mxfp8VarlenTensor",
    "dequantize_mxfp8_varlen",
    "mxfp8_flash_attn_varlen_backward",
    "mxfp8_flash_attn_varlen_forward",
    "mxfp8_scales_logical",
    "quantize_mxfp8_varlen",
]
