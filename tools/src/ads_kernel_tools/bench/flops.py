"""FLOP and byte counts per family, as the specs define them.

Attention counts are per sequence and count only the (query, key) pairs a mask lets through, so a
jagged batch is credited with useful work only (padding never counts). A matmul of m×k by k×n is
2·m·k·n FLOPs; attention forward is two of them per head (QKᵀ and PV), backward 2.5× forward
(five matmuls, the convention of FlashAttention and the upstream benchmarks).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BWD_FACTOR = 2.5


def _as_list(x: Sequence[int] | torch.Tensor | int, n: int | None = None) -> list[int]:
    if isinstance(x, int):
        return [x] * (n if n is not None else 1)
    if isinstance(x, torch.Tensor):
        return [int(v) for v in x.flatten().tolist()]
    return [int(v) for v in x]


def valid_pairs(
    lq: int,
    lk: int,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    symmetric_window: int | None = None,
    q_rows: int | None = None,
) -> int:
    """Number of (i, j) pairs a mask allows for one sequence.

    ``causal`` and ``window=(left, right)`` follow FlashAttention's bottom-right alignment
    (query i sits at key i + lk − lq); ``symmetric_window=w`` is the upstream GDPA band |i−j| ≤ w.
    ``q_rows``: count only queries i < q_rows (rows past a max_seqlen_q), the alignment still set by
    the full ``lq``.
    """
    rows = lq if q_rows is None else min(q_rows, lq)
    if rows <= 0 or lk <= 0:
        return 0
    i = torch.arange(rows, dtype=torch.int64)
    lo = torch.zeros(rows, dtype=torch.int64)
    hi = torch.full((rows,), lk - 1, dtype=torch.int64)
    if symmetric_window is not None:
        lo = torch.maximum(lo, i - symmetric_window)
        hi = torch.minimum(hi, i + symmetric_window)
    diag = i + (lk - lq)
    if causal:
        hi = torch.minimum(hi, diag)
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            lo = torch.maximum(lo, diag - left)
        if right is not None and right >= 0:
            hi = torch.minimum(hi, diag + right)
    return int((hi - lo + 1).clamp_min(0).sum())


def attention_fwd(
    lq: Sequence[int] | torch.Tensor | int,
    lk: Sequence[int] | torch.Tensor | int,
    heads: int,
    d_qk: int,
    d_v: int | None = None,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    symmetric_window: int | None = None,
) -> float:
    """Forward FLOPs: Σ_b pairs_b · 2·H·(d_qk + d_v) — 4·H·D·Σ Lq·Lk when unmasked and d_qk = d_v."""
    d_v = d_qk if d_v is None else d_v
    lqs = _as_list(lq)
    lks = _as_list(lk, len(lqs))
    if len(lqs) == 1 and len(lks) > 1:
        lqs = lqs * len(lks)
    if len(lqs) != len(lks):
        raise ValueError(f"{len(lqs)} query lengths but {len(lks)} key lengths")
    masked = causal or window is not None or symmetric_window is not None
    if masked:
        pairs = sum(
            valid_pairs(a, b, causal=causal, window=window, symmetric_window=symmetric_window)
            for a, b in zip(lqs, lks)
        )
    else:
        pairs = sum(a * b for a, b in zip(lqs, lks))
    return 2.0 * heads * (d_qk + d_v) * pairs


def attention_bwd(*args, **kwargs) -> float:
    """Backward FLOPs: 2.5 × forward."""
    return BWD_FACTOR * attention_fwd(*args, **kwargs)


def block_attention_fwd(lengths: Sequence[int] | torch.Tensor, heads: int, d: int, block: int = 64) -> float:
    """Block-diagonal attention as torch's counter credits it (spec A6): key length = block."""
    return 4.0 * heads * d * block * sum(_as_list(lengths))


def gemm(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def tensor_bytes(*tensors: torch.Tensor) -> int:
    """Bytes held by the tensors: what a kernel must at least read or write once."""
    return sum(t.numel() * t.element_size() for t in tensors)


def tflops(flop: float, ms: float) -> float:
    return flop / (ms * 1e-3) / 1e12


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9
