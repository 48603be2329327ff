"""ads_jfa: jagged softmax flash attention (self, cross, windowed, PMA) on lp-fa4's engine.

>>> from ads_jfa import jagged_flash_attention
>>> out = jagged_flash_attention(q, k, v, q_off, k_off, max_q, max_kv)  # doctest: +SKIP
"""

from .__about__ import __version__
from .interface import jagged_flash_attention
from .pma import PoolingByMultiheadAttention

__all__ = ["PoolingByMultiheadAttention", "__version__", "jagged_flash_attention"]
