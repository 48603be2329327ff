"""Triton kernels of block attention: jit bodies in ``_*.py``, grids and launch settings in ``launch.py``."""
