"""FLOP and memory-traffic formulas: the op's FLOP counter and the estimates in BENCHMARKS.md.

Traffic is counted per token outside the attention (ads-gdpa's own Q/K/V/O traffic is the same
for every provider and left out), in bytes, for N = H·D features of ``elem`` bytes and fp32
per-token statistics, assuming each separate op reads its inputs and writes its output once.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["flops", "pair_count", "traffic_per_token"]

# elementwise FLOPs per feature: LayerNorm fwd (sum, centre, square-sum, scale, affine) / bwd;
# residual add; RMSNorm fwd (square-sum, scale, weight) / bwd
_LN_FWD, _LN_BWD, _ADD, _RMS_FWD, _RMS_BWD = 7, 10, 1, 4, 8


def pair_count(
    host_q: Sequence[int] | None, host_k: Sequence[int] | None, max_q: int, max_k: int, n_b: int
) -> int:
    """Σ_b min(Lq_b, max_q) · Lk_b with host offsets, else the bound n_b · max_q · max_k."""
    if host_q is None or host_k is None:
        return n_b * max_q * max_k
    lq = [host_q[i + 1] - host_q[i] for i in range(len(host_q) - 1)]
    lk = [host_k[i + 1] - host_k[i] for i in range(len(host_k) - 1)]
    return sum(max(min(a, max_q), 0) * max(c, 0) for a, c in zip(lq, lk))


def flops(t: int, h: int, d: int, pairs: int, *, layer_norm: bool, q_residual: bool, rms_norm: bool,
          backward: bool) -> int:  # fmt: skip
    """GDPA (4·H·D per (query, key) pair forward, 2.5x that backward) plus the norms' elementwise work."""
    attn = 4 * h * d * pairs
    n = t * h * d
    if backward:
        extra = n * (_LN_BWD * layer_norm + _ADD * q_residual + _RMS_BWD * rms_norm)
        return int(2.5 * attn) + extra
    return attn + n * (_LN_FWD * layer_norm + _ADD * q_residual + _RMS_FWD * rms_norm + _ADD)


def traffic_per_token(n: int, *, elem: int = 2, fused: bool, backward: bool) -> int:
    """Bytes per token moved outside the attention by the full chain (LayerNorm, + q, RMSNorm with
    weight, + residual) in training, counted in passes over a (T, N) tensor of ``elem``-byte values
    plus 12 B of fp32 statistics (LayerNorm mean/rstd, rrms; saved by both). ``fused`` = this
    package's kernels, else the unfused stack with one kernel per op (the lower bound for eager
    PyTorch, whose composite norms launch more).

    Forward, unfused (10 passes): LN (read q, write q_ln) + add (read a, q_ln, write y) + RMSNorm
    (read y, write z) + add (read z, r, write out). Fused (6): LN prologue (read q, write q_ln) +
    epilogue (read a, q_ln, r, write out); y and z are never written.
    Backward, unfused (9): RMSNorm bwd (read dz, y, write dy) + autograd's sum dq_gdpa + dy (read
    two, write one) + LN bwd (read dq_ln, q, write dq); the residual adds pass dout on. Fused (8):
    epilogue bwd (read dout, a, q_ln, write dy) + q bwd (read dq_gdpa, dy, q, write dq).
    """
    passes = (8 if fused else 9) if backward else (6 if fused else 10)
    return passes * n * elem + 12
