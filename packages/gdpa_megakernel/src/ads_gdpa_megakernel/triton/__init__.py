"""Triton kernels of the fused prologue (Q LayerNorm) and epilogue (+ q, RMSNorm, + residual)."""
