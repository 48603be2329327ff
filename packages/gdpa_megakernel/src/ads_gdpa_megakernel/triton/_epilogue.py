"""The fused epilogue per token: y = a + q_res → RMSNorm over H·D → + residual, and its backward.

``a`` is ads-gdpa's output. Rows outside ``[cu_q[0], cu_q[-1])`` belong to no sequence; ads-gdpa
zeroes them (as it does rows past max_seqlen_q), and they are read here as a = 0 regardless, so every
output row is defined whatever ``a`` holds there. The offsets only mask rows: every address comes
from the grid and the tensors' own sizes, so no offsets can move an access outside a tensor.

Saved for the backward: rrms (fp32 per token). y is recomputed there from a and q_res (two reads
of tensors that are alive anyway) instead of being stored (a write and a read), which costs the
same traffic, needs no extra buffer and keeps y in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _owned(CU, n_cu, rows, T):
    first = tl.minimum(tl.maximum(tl.load(CU).to(tl.int64), 0), T)
    last = tl.minimum(tl.maximum(tl.load(CU + n_cu - 1).to(tl.int64), 0), T)
    return (rows >= first) & (rows < last)


@triton.jit
def _y(A, QR, rows, cc, ok, owned, stride_a, stride_q, HAS_QRES: tl.constexpr):
    y = tl.load(A + rows[:, None] * stride_a + cc[None, :], mask=ok & owned[:, None], other=0.0).to(
        tl.float32
    )
    if HAS_QRES:
        y += tl.load(QR + rows[:, None] * stride_q + cc[None, :], mask=ok, other=0.0).to(tl.float32)
    return y


@triton.jit
def epilogue_fwd_kernel(
    A, QR, W, R, OUT, RRMS, CU, n_cu, T, N, stride_a, stride_q, stride_r, stride_o, eps,
    HAS_QRES: tl.constexpr, HAS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_RES: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    owned = _owned(CU, n_cu, rows, T)
    cols = tl.arange(0, BLOCK_N)
    if HAS_RMS:
        ss = tl.zeros([BLOCK_T], dtype=tl.float32)
        for c in tl.static_range(CHUNKS):
            cc = c * BLOCK_N + cols
            ok = row_ok[:, None] & (cc < N)[None, :]
            y = _y(A, QR, rows, cc, ok, owned, stride_a, stride_q, HAS_QRES)
            ss += tl.sum(y * y, 1)
        rrms = 1.0 / tl.sqrt(ss / N + eps)
        tl.store(RRMS + rows, rrms, mask=row_ok)
    for c in tl.static_range(CHUNKS):
        cc = c * BLOCK_N + cols
        col_ok = cc < N
        ok = row_ok[:, None] & col_ok[None, :]
        if CHUNKS > 1 or not HAS_RMS:
            y = _y(A, QR, rows, cc, ok, owned, stride_a, stride_q, HAS_QRES)
        if HAS_RMS:
            y = y * rrms[:, None]
            if HAS_W:
                y = y * tl.load(W + cc, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_RES:
            y += tl.load(R + rows[:, None] * stride_r + cc[None, :], mask=ok, other=0.0).to(tl.float32)
        tl.store(OUT + rows[:, None] * stride_o + cc[None, :], y.to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def epilogue_bwd_kernel(
    DOUT, A, QR, W, RRMS, CU, DY, PART_W, n_cu, T, N, n_blocks,
    stride_do, stride_a, stride_q, stride_dy,
    HAS_QRES: tl.constexpr, HAS_W: tl.constexpr, WANT_W: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr,
):  # fmt: skip
    """RMSNorm backward: ŷ = y·rrms, dŷ = dout·w, dy = rrms·(dŷ − ŷ·mean(dŷ·ŷ)); partials Σ dout·ŷ.
    dy is both ads-gdpa's dO and the q-residual branch's gradient; the residual's is dout itself."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    acc_w = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)  # reduced over rows once, at the end
    part = pid.to(tl.int64) * N
    for blk in range(pid, n_blocks, nprog):
        rows = (blk * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)  # T < 2^31: int32 is exact
        row_ok = rows < T
        owned = _owned(CU, n_cu, rows, T)
        rrms = tl.load(RRMS + rows, mask=row_ok, other=0.0)
        dot = tl.zeros([BLOCK_T], dtype=tl.float32)
        for c in tl.static_range(CHUNKS):
            cc = c * BLOCK_N + cols
            col_ok = cc < N
            ok = row_ok[:, None] & col_ok[None, :]
            yh = _y(A, QR, rows, cc, ok, owned, stride_a, stride_q, HAS_QRES) * rrms[:, None]
            dout = tl.load(DOUT + rows[:, None] * stride_do + cc[None, :], mask=ok, other=0.0).to(tl.float32)
            dyh = dout
            if HAS_W:
                dyh = dout * tl.load(W + cc, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            dot += tl.sum(dyh * yh, 1)
        dot = dot / N
        for c in tl.static_range(CHUNKS):
            cc = c * BLOCK_N + cols
            col_ok = cc < N
            ok = row_ok[:, None] & col_ok[None, :]
            if CHUNKS > 1:
                yh = _y(A, QR, rows, cc, ok, owned, stride_a, stride_q, HAS_QRES) * rrms[:, None]
                dout = tl.load(DOUT + rows[:, None] * stride_do + cc[None, :], mask=ok, other=0.0).to(
                    tl.float32
                )
                dyh = dout
                if HAS_W:
                    dyh = dout * tl.load(W + cc, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            dy = rrms[:, None] * (dyh - yh * dot[:, None])
            tl.store(DY + rows[:, None] * stride_dy + cc[None, :], dy.to(DY.dtype.element_ty), mask=ok)
            if WANT_W:
                if CHUNKS == 1:
                    acc_w += dout * yh
                else:
                    pw = PART_W + part + cc
                    tl.store(pw, tl.load(pw, mask=col_ok, other=0.0) + tl.sum(dout * yh, 0), mask=col_ok)
    if CHUNKS == 1:
        if WANT_W:
            tl.store(PART_W + part + cols, tl.sum(acc_w, 0), mask=cols < N)
