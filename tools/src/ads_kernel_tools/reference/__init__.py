"""Plain-PyTorch reference implementations that kernels are tested against."""

from . import gdpa

__all__ = ["gdpa"]
