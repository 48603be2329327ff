"""ads_gdpa: generalized dot-product attention (activation instead of softmax) for ranking models.

>>> from ads_gdpa import gdpa_varlen
>>> out = gdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, activation="fast_gelu")  # doctest: +SKIP
"""

from .__about__ import __version__
from .activations import Activation
from .interface import gdpa, gdpa_varlen, generalized_dot_product_attention

__all__ = ["Activation", "gdpa", "gdpa_varlen", "generalized_dot_product_attention", "__version__"]
