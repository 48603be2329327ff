"""FLOP and byte counts of the fused ops (what the benchmark divides by, and the FLOP formulas).

FLOPs count the GEMMs only (2·M·N·K each); the norms add O(M·N). Bytes are the minimal HBM traffic
at 2-byte activations: each input read once, each output written once.
"""

from __future__ import annotations

_ELEM = 2  # bf16 / fp16
_STAT = 4  # fp32 per-row statistic


def gemm_flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def linear_norm_fwd_bytes(m: int, n: int, k: int, *, save_xhat: bool = False) -> int:
    """x, w read; y (and x̂ when training with an affine norm) written; two fp32 statistics per row."""
    return (m * k + n * k + m * n * (2 if save_xhat else 1)) * _ELEM + 2 * m * _STAT


def linear_norm_bwd_bytes(m: int, n: int, k: int) -> int:
    """Norm backward (dy, x̂ read; dz written), then dx = dz·W (dz, W read; dx written) and
    dW = dzᵀ·x (dz, x read; dW written)."""
    return (3 * m * n + (m * n + n * k + m * k) + (m * n + m * k + n * k)) * _ELEM + m * _STAT


def rmsnorm_linear_fwd_bytes(m: int, n: int, k: int) -> int:
    return (m * k + n * k + m * n) * _ELEM + m * _STAT


def input_grad_bytes(m: int, n: int, k: int) -> int:
    """dy (M, K), w_next_t (K, N), x̂ (M, N) read; dz (M, N) written."""
    return (m * k + k * n + 2 * m * n) * _ELEM + m * _STAT
