"""lp_fa4: FlashAttention-4's interface on kernels of our own (BF16/FP16 forward and backward).

>>> from lp_fa4 import flash_attn_varlen_func
>>> out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)  # doctest: +SKIP
"""

from .__about__ import __version__
from .fp8_bwd import fp8_attn_backward, quantize_fp8
from .interface import flash_attn_func, flash_attn_varlen_func, jagged_attention
from .mxfp8 import (
    Mxfp8VarlenMeta,
    Mxfp8VarlenTensor,
    mxfp8_flash_attn_varlen_backward,
    mxfp8_flash_attn_varlen_forward,
    quantize_mxfp8_varlen,
)

__all__ = ["__version__", "flash_attn_func", "flash_attn_varlen_func", "jagged_attention"]
__all__ += ["quantize_fp8", "fp8_attn_backward"]
__all__ += [
    "Mxfp8VarlenMeta",
    "Mxfp8VarlenTensor",
    "mxfp8_flash_attn_varlen_backward",
    "mxfp8_flash_attn_varlen_forward",
    "quantize_mxfp8_varlen",
]
