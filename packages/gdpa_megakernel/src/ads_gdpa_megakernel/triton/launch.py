"""Launchers of the row kernels: allocation, grids and the deterministic partial-sum reductions.

Every tensor handed in is a contiguous (T, N) view of a (T, H, D) tensor (N = H·D) or an (N,)
weight; outputs are allocated here through ``_empty`` (tests poison it). T = 0 launches nothing.
"""

from __future__ import annotations

import torch

from ads_kernel_tools.kernels.grid import cdiv

from .. import config
from ._epilogue import epilogue_bwd_kernel, epilogue_fwd_kernel
from ._layernorm import ln_fwd_kernel, q_bwd_kernel

Tensor = torch.Tensor


def _empty(shape, dtype, device) -> Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def _blocks(t: int, tile: config.RowTile) -> int:
    return cdiv(t, tile.block_t)


def _reduce_grid(t: int, tile: config.RowTile, device) -> int:
    return max(1, min(_blocks(t, tile), config.reduce_programs(device)))


def _dummy(like: Tensor) -> Tensor:
    return like  # an unused pointer argument (its constexpr flag is off)


def ln_fwd(x: Tensor, w: Tensor | None, b: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm of x (T, N) over N -> (y in x's dtype, mean fp32 (T,), rstd fp32 (T,))."""
    t, n = x.shape
    y = _empty((t, n), x.dtype, x.device)
    mean = _empty((t,), torch.float32, x.device)
    rstd = _empty((t,), torch.float32, x.device)
    if t:
        tile = config.row_tile(n)
        ln_fwd_kernel[(_blocks(t, tile),)](
            x, _dummy(x) if w is None else w, _dummy(x) if b is None else b, y, mean, rstd, t, n,
            x.stride(0), y.stride(0), eps, HAS_W=w is not None, HAS_B=b is not None, **tile.kwargs(),
        )  # fmt: skip
    return y, mean, rstd


def q_bwd(
    dq: Tensor,
    dr: Tensor | None,
    x: Tensor | None,
    w: Tensor | None,
    mean: Tensor | None,
    rstd: Tensor | None,
    *,
    want_w: bool,
    want_b: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """dq (T, N) (+ dr) through the LayerNorm backward when ``x`` is given -> (dx, dw fp32, db fp32)."""
    t, n = dq.shape
    has_ln = x is not None
    want_w, want_b = want_w and has_ln, want_b and has_ln
    dx = _empty((t, n), dq.dtype, dq.device)
    tile = config.row_tile(n)
    progs = _reduce_grid(t, tile, dq.device)
    part_w = torch.zeros((progs, n), dtype=torch.float32, device=dq.device) if want_w else None
    part_b = torch.zeros((progs, n), dtype=torch.float32, device=dq.device) if want_b else None
    if t:
        q_bwd_kernel[(progs,)](
            dq, _dummy(dq) if dr is None else dr, _dummy(dq) if x is None else x,
            _dummy(dq) if w is None else w, _dummy(dq) if mean is None else mean,
            _dummy(dq) if rstd is None else rstd, dx,
            _dummy(dq) if part_w is None else part_w, _dummy(dq) if part_b is None else part_b,
            t, n, _blocks(t, tile), dq.stride(0), 0 if dr is None else dr.stride(0),
            0 if x is None else x.stride(0), dx.stride(0),
            HAS_DR=dr is not None, HAS_LN=has_ln, HAS_W=w is not None, WANT_W=want_w, WANT_B=want_b,
            **tile.kwargs(),
        )  # fmt: skip
    dw = part_w.sum(0) if want_w else None  # fixed-order reduction of the per-program partials
    db = part_b.sum(0) if want_b else None
    return dx, dw, db


def epilogue_fwd(
    a: Tensor,
    qres: Tensor | None,
    w: Tensor | None,
    r: Tensor | None,
    cu_q: Tensor,
    eps: float,
    *,
    rms: bool,
) -> tuple[Tensor, Tensor]:
    """out = [RMSNorm](a (+ qres)) (+ r), all (T, N) -> (out in a's dtype, rrms fp32 (T,) or empty)."""
    t, n = a.shape
    out = _empty((t, n), a.dtype, a.device)
    rrms = _empty((t,) if rms else (0,), torch.float32, a.device)
    if t:
        tile = config.row_tile(n)
        epilogue_fwd_kernel[(_blocks(t, tile),)](
            a, _dummy(a) if qres is None else qres, _dummy(a) if w is None else w,
            _dummy(a) if r is None else r, out, rrms if rms else _dummy(a), cu_q, cu_q.shape[0], t, n,
            a.stride(0), 0 if qres is None else qres.stride(0), 0 if r is None else r.stride(0),
            out.stride(0), eps, HAS_QRES=qres is not None, HAS_RMS=rms, HAS_W=w is not None,
            HAS_RES=r is not None, **tile.kwargs(),
        )  # fmt: skip
    return out, rrms


def epilogue_bwd(
    dout: Tensor,
    a: Tensor,
    qres: Tensor | None,
    w: Tensor | None,
    rrms: Tensor,
    cu_q: Tensor,
    *,
    want_w: bool,
) -> tuple[Tensor, Tensor | None]:
    """RMSNorm backward of the epilogue -> (dy in dout's dtype (T, N), d rms weight fp32 or None)."""
    t, n = dout.shape
    want_w = want_w and w is not None
    dy = _empty((t, n), dout.dtype, dout.device)
    tile = config.row_tile(n)
    progs = _reduce_grid(t, tile, dout.device)
    part_w = torch.zeros((progs, n), dtype=torch.float32, device=dout.device) if want_w else None
    if t:
        epilogue_bwd_kernel[(progs,)](
            dout, a, _dummy(a) if qres is None else qres, _dummy(a) if w is None else w, rrms, cu_q, dy,
            _dummy(rrms) if part_w is None else part_w, cu_q.shape[0], t, n, _blocks(t, tile),
            dout.stride(0), a.stride(0), 0 if qres is None else qres.stride(0), dy.stride(0),
            HAS_QRES=qres is not None, HAS_W=w is not None, WANT_W=want_w, **tile.kwargs(),
        )  # fmt: skip
    return dy, (part_w.sum(0) if want_w else None)
