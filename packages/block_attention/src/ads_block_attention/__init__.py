"""ads_block_attention: 64-token block-diagonal attention (jagged, GQA); fused projection+rotary path."""

from .__about__ import __version__
from .interface import block_attention, qkv_proj_rotary_block_attention

__all__ = ["__version__", "block_attention", "qkv_proj_rotary_block_attention"]
