"""Portable Triton kernels (sm80+, and the Triton interpreter on CPU)."""
