"""Q LayerNorm over a token's H·D features: the forward (prologue) and the q-gradient kernel.

Rows are tokens of the (T, H·D) view, ``BLOCK_T`` per program, in ``CHUNKS`` column chunks of
``BLOCK_N``. Statistics are fp32. The forward merges per-chunk (mean, M2) pairs with Chan's formula,
so a wide token is as stable as a two-pass variance (no E[x²] − E[x]² cancellation); with one chunk
the token stays in registers between the statistics and the normalisation.

The backward kernel also adds the q-residual branch's gradient (``DR``) to ads-gdpa's dQ before the
LayerNorm backward, so the sum is never written; without a LayerNorm it is just that sum. Its
programs stride over row blocks and each keeps its own row of fp32 weight/bias partial sums
(reduced afterwards in a fixed order: deterministic, no atomics). All row offsets are int64.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def ln_fwd_kernel(
    X, W, B, Y, MEAN, RSTD, T, N, stride_x, stride_y, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    cols = tl.arange(0, BLOCK_N)
    count = tl.zeros([BLOCK_T], dtype=tl.float32)
    mean = tl.zeros([BLOCK_T], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_T], dtype=tl.float32)
    for c in tl.static_range(CHUNKS):
        cc = c * BLOCK_N + cols
        ok = row_ok[:, None] & (cc < N)[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cc[None, :], mask=ok, other=0.0).to(tl.float32)
        n_b = tl.minimum(N - c * BLOCK_N, BLOCK_N).to(tl.float32)
        mean_b = tl.sum(x, 1) / n_b
        d = tl.where(ok, x - mean_b[:, None], 0.0)
        m2_b = tl.sum(d * d, 1)
        n_ab = count + n_b
        delta = mean_b - mean
        mean = mean + delta * (n_b / n_ab)
        m2 = m2 + m2_b + delta * delta * (count * n_b / n_ab)
        count = n_ab
    rstd = 1.0 / tl.sqrt(m2 / N + eps)
    tl.store(MEAN + rows, mean, mask=row_ok)
    tl.store(RSTD + rows, rstd, mask=row_ok)
    for c in tl.static_range(CHUNKS):
        cc = c * BLOCK_N + cols
        col_ok = cc < N
        ok = row_ok[:, None] & col_ok[None, :]
        if CHUNKS > 1:
            x = tl.load(X + rows[:, None] * stride_x + cc[None, :], mask=ok, other=0.0).to(tl.float32)
        y = (x - mean[:, None]) * rstd[:, None]
        if HAS_W:
            y = y * tl.load(W + cc, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_B:
            y = y + tl.load(B + cc, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + rows[:, None] * stride_y + cc[None, :], y.to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _grad_in(DQ, DR, rows, cc, ok, stride_dq, stride_dr, HAS_DR: tl.constexpr):
    g = tl.load(DQ + rows[:, None] * stride_dq + cc[None, :], mask=ok, other=0.0).to(tl.float32)
    if HAS_DR:
        g += tl.load(DR + rows[:, None] * stride_dr + cc[None, :], mask=ok, other=0.0).to(tl.float32)
    return g


@triton.jit
def q_bwd_kernel(
    DQ, DR, X, W, MEAN, RSTD, DX, PART_W, PART_B, T, N, n_blocks,
    stride_dq, stride_dr, stride_x, stride_dx,
    HAS_DR: tl.constexpr, HAS_LN: tl.constexpr, HAS_W: tl.constexpr, WANT_W: tl.constexpr,
    WANT_B: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr,
):  # fmt: skip
    """g = DQ (+ DR); with the LayerNorm dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)), ĝ = g·w, and the
    partials Σ g·x̂ (weight) and Σ g (bias); without it dx = g."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    # whole-tile accumulators, reduced over rows once at the end: a per-block column sum would be
    # a cross-warp shared-memory reduction (and barrier) on every iteration of this loop
    acc_w = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    part = pid.to(tl.int64) * N
    for blk in range(pid, n_blocks, nprog):
        rows = (blk * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)  # T < 2^31: int32 is exact
        row_ok = rows < T
        if HAS_LN:
            mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
            rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
            c1 = tl.zeros([BLOCK_T], dtype=tl.float32)
            c2 = tl.zeros([BLOCK_T], dtype=tl.float32)
            for c in tl.static_range(CHUNKS):
                cc = c * BLOCK_N + cols
                col_ok = cc < N
                ok = row_ok[:, None] & col_ok[None, :]
                g = _grad_in(DQ, DR, rows, cc, ok, stride_dq, stride_dr, HAS_DR)
                x = tl.load(X + rows[:, None] * stride_x + cc[None, :], mask=ok, other=0.0).to(tl.float32)
                xh = tl.where(ok, (x - mean[:, None]) * rstd[:, None], 0.0)
                gw = g
                if HAS_W:
                    gw = g * tl.load(W + cc, mask=col_ok, other=0.0).to(tl.float32)[None, :]
                c1 += tl.sum(gw * xh, 1)
                c2 += tl.sum(gw, 1)
            c1 = c1 / N
            c2 = c2 / N
        for c in tl.static_range(CHUNKS):
            cc = c * BLOCK_N + cols
            col_ok = cc < N
            ok = row_ok[:, None] & col_ok[None, :]
            if CHUNKS > 1 or not HAS_LN:
                g = _grad_in(DQ, DR, rows, cc, ok, stride_dq, stride_dr, HAS_DR)
            if HAS_LN:
                if CHUNKS > 1:
                    x = tl.load(X + rows[:, None] * stride_x + cc[None, :], mask=ok, other=0.0).to(tl.float32)
                    xh = tl.where(ok, (x - mean[:, None]) * rstd[:, None], 0.0)
                    gw = g
                    if HAS_W:
                        gw = g * tl.load(W + cc, mask=col_ok, other=0.0).to(tl.float32)[None, :]
                dx = rstd[:, None] * (gw - c2[:, None] - xh * c1[:, None])
                if CHUNKS == 1:
                    if WANT_W:
                        acc_w += g * xh  # zero outside the tensor: g and xh are masked to 0
                    if WANT_B:
                        acc_b += g
                else:
                    if WANT_W:
                        pw = PART_W + part + cc
                        tl.store(pw, tl.load(pw, mask=col_ok, other=0.0) + tl.sum(g * xh, 0), mask=col_ok)
                    if WANT_B:
                        pb = PART_B + part + cc
                        tl.store(pb, tl.load(pb, mask=col_ok, other=0.0) + tl.sum(g, 0), mask=col_ok)
            else:
                dx = g
            tl.store(DX + rows[:, None] * stride_dx + cc[None, :], dx.to(DX.dtype.element_ty), mask=ok)
    if CHUNKS == 1:
        if WANT_W:
            tl.store(PART_W + part + cols, tl.sum(acc_w, 0), mask=cols < N)
        if WANT_B:
            tl.store(PART_B + part + cols, tl.sum(acc_b, 0), mask=cols < N)
