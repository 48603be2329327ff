"""Interleaved ("rotate every two") rotary helpers for 2-D register tiles, shared by fwd and bwd."""

import triton
import triton.language as tl


@triton.jit
def load_sin_cos(SINU, rows, mask_m, stride_st, D: tl.constexpr):
    """Load sin (cols [0, D/2)) and cos (cols [D/2, D)) of the table for ``rows``: two (BLOCK, D/2) fp32."""
    half = tl.arange(0, D // 2)
    base = SINU + rows[:, None] * stride_st + half[None, :]
    s = tl.load(base, mask=mask_m[:, None], other=0.0).to(tl.float32)
    c = tl.load(base + D // 2, mask=mask_m[:, None], other=0.0).to(tl.float32)
    return s, c


@triton.jit
def rotate(x, s, c, BLOCK: tl.constexpr, D: tl.constexpr, INVERSE: tl.constexpr):
    """Rotate pairs (x[2i], x[2i+1]) of a (BLOCK, D) fp32 tile by angle i; INVERSE applies the transpose.

    Forward: y[2i] = x[2i]c - x[2i+1]s, y[2i+1] = x[2i+1]c + x[2i]s.
    Transpose (gradient): y[2i] = g[2i]c + g[2i+1]s, y[2i+1] = g[2i+1]c - g[2i]s.
    """
    xe, xo = tl.split(tl.reshape(x, (BLOCK, D // 2, 2)))
    if INVERSE:
        ye = xe * c + xo * s
        yo = xo * c - xe * s
    else:
        ye = xe * c - xo * s
        yo = xo * c + xe * s
    return tl.reshape(tl.join(ye, yo), (BLOCK, D))
