"""Portable Triton kernels (sm80+, and the CPU interpreter): forward, backward, launchers."""
