"""Plain-PyTorch reference implementations that kernels are tested against."""

from . import attention, block, gdpa, mxfp8, norm

__all__ = ["attention", "block", "gdpa", "mxfp8", "norm"]
