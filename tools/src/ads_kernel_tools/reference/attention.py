"""Reference softmax attention (FlashAttention conventions) and jagged flash attention.

Covers bottom-right causal / local windows, top-left symmetric windows (jagged FA), GQA/MQA, softcap,
a learnable sink logit and the natural-log LSE. Plain PyTorch; differentiable through autograd.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ads_kernel_tools.reference._jagged import sequence_ranges, with_graph

__all__ = [
    "attention_mask",
    "jagged_attention_ref",
    "softmax_attention_ref",
    "softmax_attention_varlen_ref",
]

Window = tuple[int | None, int | None]


def attention_mask(
    lq: int,
    lk: int,
    *,
    causal: bool = False,
    window: Window = (None, None),
    symmetric_window: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean (lq, lk) mask of the keys each query may attend to.

    ``window=(left, right)`` is bottom-right aligned (FlashAttention): query i sees key j iff
    ``i + (lk - lq) - left <= j <= i + (lk - lq) + right``; None is unbounded on that side, and a window
    with ``left + right < 0`` (e.g. (-1, -1)) means no window. ``causal`` forces ``right = 0``.
    ``symmetric_window=w`` is the jagged-FA top-left band |i - j| <= w; it is intersected with the rest.
    """
    left, right = window
    if left is not None and right is not None and left + right < 0:
        left, right = None, None
    if causal:
        right = 0
    i = torch.arange(lq, device=device).unsqueeze(1)
    j = torch.arange(lk, device=device).unsqueeze(0)
    diag = i + (lk - lq)
    allowed = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if left is not None:
        allowed &= j >= diag - left
    if right is not None:
        allowed &= j <= diag + right
    if symmetric_window is not None:
        allowed &= (i - j).abs() <= symmetric_window
    return allowed


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    *,
    scale: float,
    softcap: float,
    sink: torch.Tensor | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q (H, Lq, D), k (H, Lk, D), v (H, Lk, Dv), mask (Lq, Lk) -> out (H, Lq, Dv), lse (H, Lq).

    Inputs are already in the compute dtype (fp32 for low-precision ``dtype``).
    """
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask, -math.inf)
    if s.shape[-1] == 0:  # an empty kv sequence: amax over an empty dim would raise
        row_max = s.new_full(s.shape[:-1], -math.inf)
    else:
        row_max = s.amax(dim=-1)
    if sink is not None:
        row_max = torch.maximum(row_max, sink[:, None])
    # A fully masked row has max -inf; shift by 0 instead so exp() gives clean zeros, not NaN.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)).detach()
    p = torch.exp(s - row_max[..., None])
    denom = p.sum(dim=-1)
    if sink is not None:
        denom = denom + torch.exp(sink[:, None] - row_max)
    has_mass = denom > 0
    safe = torch.where(has_mass, denom, torch.ones_like(denom))
    if dtype in (torch.bfloat16, torch.float16):
        # Kernel-like baseline: unnormalised P rounded to the input dtype for PV, fp32 normalisation.
        p = p.to(dtype).to(p.dtype)
    out = (p @ v) / safe[..., None]
    lse = torch.where(has_mass, row_max + torch.log(safe), torch.full_like(safe, -math.inf))
    return out, lse


def _prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, int, torch.dtype]:
    heads, kv_heads = q.shape[-2], k.shape[-2]
    if heads % kv_heads != 0 or v.shape[-2] != kv_heads:
        raise ValueError(f"bad head counts: q {heads}, k {kv_heads}, v {v.shape[-2]}")
    low = dtype in (torch.bfloat16, torch.float16)
    compute = torch.float32 if low else dtype
    q, k, v = ((t.to(dtype).to(compute) if low else t.to(compute)) for t in (q, k, v))
    if sink is not None:
        if sink.shape != (heads,):
            raise ValueError(f"sink must have shape ({heads},), got {tuple(sink.shape)}")
        sink = sink.to(compute)
    return q, k, v, sink, heads // kv_heads, compute


def softmax_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    window: Window = (None, None),
    scale: float | None = None,
    softcap: float = 0.0,
    sink: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense softmax attention: q (B, Sq, H, D), k (B, Sk, H_kv, D), v (B, Sk, H_kv, Dv).

    Returns ``out`` (B, Sq, H, Dv) in ``dtype`` and natural-log ``lse`` (B, H, Sq) in the compute dtype
    (fp32 for bf16/fp16). Scores are ``q·k * scale`` (default 1/sqrt(D)), then ``softcap*tanh(s/softcap)``
    when softcap > 0, then masked (see :func:`attention_mask`). ``sink`` (H,) is a per-head logit, not
    scaled, that only enters the denominator (and the LSE). Rows with no valid key: out 0, lse -inf.
    GQA: head h uses kv head h // (H // H_kv). bf16/fp16 ``dtype`` gives a same-precision baseline:
    inputs rounded, fp32 scores, unnormalised P rounded before PV, output rounded.
    """
    sq, d = q.shape[1], q.shape[3]
    sk = k.shape[1]
    qc, kc, vc, sink_c, group, _ = _prepare(q, k, v, sink, dtype)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    mask = attention_mask(sq, sk, causal=causal, window=window, device=q.device)
    qh = qc.permute(0, 2, 1, 3)  # (B, H, Sq, D)
    kh = kc.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
    vh = vc.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
    out, lse = _attend(qh, kh, vh, mask, scale=scale, softcap=softcap, sink=sink_c, dtype=dtype)
    return out.permute(0, 2, 1, 3).to(dtype), lse


def _varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor | Sequence[int],
    cu_k: torch.Tensor | Sequence[int],
    *,
    mask_fn,
    max_seqlen_q: int | None,
    broadcast_q: bool,
    scale: float | None,
    softcap: float,
    sink: torch.Tensor | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    qc, kc, vc, sink_c, group, compute = _prepare(q, k, v, sink, dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    ranges = sequence_ranges(cu_q, cu_k, q.shape[0], broadcast_q)
    total = ranges.total_out
    heads = q.shape[1]
    out = torch.zeros(total, heads, v.shape[-1], dtype=dtype, device=q.device)
    lse = torch.full((heads, total), -math.inf, dtype=compute, device=q.device)
    for (q0, q1), (k0, k1), start in zip(ranges.q, ranges.k, ranges.out_starts):
        lq, lk = q1 - q0, k1 - k0
        rows = lq if max_seqlen_q is None else min(lq, max_seqlen_q)
        if rows <= 0:
            continue
        qb = qc[q0 : q0 + rows].transpose(0, 1)
        kb = kc[k0:k1].repeat_interleave(group, dim=1).transpose(0, 1)
        vb = vc[k0:k1].repeat_interleave(group, dim=1).transpose(0, 1)
        mask = mask_fn(lq, lk)[:rows]
        ob, lb = _attend(qb, kb, vb, mask, scale=scale, softcap=softcap, sink=sink_c, dtype=dtype)
        out[start : start + rows] = ob.transpose(0, 1).to(dtype)
        lse[:, start : start + rows] = lb
    return with_graph(out, q, k, v, sink), with_graph(lse, q, k, sink)


def softmax_attention_varlen_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor | Sequence[int],
    cu_k: torch.Tensor | Sequence[int],
    *,
    causal: bool = False,
    window: Window = (None, None),
    scale: float | None = None,
    softcap: float = 0.0,
    sink: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen softmax attention: q (Tq, H, D), k/v (Tk, H_kv, ·), int (B+1,) offsets ``cu_q``/``cu_k``.

    Returns ``out`` (Tq, H, Dv) and ``lse`` (H, Tq); per-sequence semantics of
    :func:`softmax_attention_ref` (masks use each sequence's own Lq, Lk). Empty sequences are fine;
    rows outside every sequence get out 0, lse -inf.
    """

    def mask_fn(lq: int, lk: int) -> torch.Tensor:
        return attention_mask(lq, lk, causal=causal, window=window, device=q.device)

    return _varlen(
        q, k, v, cu_q, cu_k, mask_fn=mask_fn, max_seqlen_q=None, broadcast_q=False,
        scale=scale, softcap=softcap, sink=sink, dtype=dtype,
    )  # fmt: skip


def jagged_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor | Sequence[int],
    cu_k: torch.Tensor | Sequence[int],
    max_seqlen_q: int,
    *,
    window_size: int | None = None,
    scale: float | None = None,
    broadcast_q: bool = False,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Jagged flash attention (TLX JFA semantics): softmax(scale * q kᵀ) v per sequence.

    ``window_size=w``: top-left symmetric band |i - j| <= w (positions relative to each sequence start).
    Query rows i >= max_seqlen_q are zero here (kernels leave them unwritten); keys are not clamped; an
    empty K/V sequence gives 0 / -inf. ``broadcast_q``: q is one sequence (cu_q has 2 entries) attending
    to each of the B kv sequences, out (B * Lq, H, Dv). Returns (out, natural-log lse (H, rows)); the
    upstream kernel stores base-2 LSE, i.e. ``lse / ln 2``.
    """

    def mask_fn(lq: int, lk: int) -> torch.Tensor:
        return attention_mask(lq, lk, symmetric_window=window_size, device=q.device)

    return _varlen(
        q, k, v, cu_q, cu_k, mask_fn=mask_fn, max_seqlen_q=max_seqlen_q, broadcast_q=broadcast_q,
        scale=scale, softcap=0.0, sink=None, dtype=dtype,
    )  # fmt: skip
