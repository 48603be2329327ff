"""Host launcher of the Triton forward: tiles, grid and strides. No host sync here."""

from __future__ import annotations

import torch

from ads_kernel_tools.kernels.grid import cdiv
from ads_kernel_tools.kernels.transpose import v_kmajor

from .. import config as cfg
from ._fwd import fwd_kernel
from .launch import Problem, _allocator, _pad


def _fwd_tma_ok(k: torch.Tensor, v: torch.Tensor, paged: bool) -> bool:
    """K/V through per-sequence TMA descriptors (``config.fwd_tma``, default on): not paged, sm90+
    (or the interpreter), rows and head offsets 16-byte aligned. Only with them does Triton
    pipeline the forward's K/V loads (3 stages at 128 x 128); pointer loads stay single-buffered."""
    if not cfg.fwd_tma() or paged:
        return False
    if not cfg.interpreter_active():
        if k.device.type != "cuda" or torch.cuda.get_device_capability(k.device)[0] < 9:
            return False
    for t in (k, v):
        e = t.element_size()
        if t.data_ptr() % 16 or (t.stride(0) * e) % 16 or (t.stride(1) * e) % 16 or (t.shape[-1] * e) % 16:
            return False
    return True


def fwd(q, k, v, cu_q, cu_k, used_q, used_k, page_table, sink, pb: Problem, out, lse, lse_dense: bool,
        descale=None):  # fmt: skip
    """Fill out (TO, H, Dv) and lse ((B, H, S) when ``lse_dense``, else (H, TO)).

    q (TQ, H, D); k/v (TK, Hkv, ·) or paged (pages, page_size, Hkv, ·) with page_table (B, max_pages).
    ``descale``: (q, k, v) contiguous fp32 (B, Hkv) for float8_e4m3fn q, k, v (not paged); V is then
    read through a K-major copy made here.
    """
    n_b = (cu_k if pb.broadcast_q else cu_q).shape[0] - 1
    h, d, dv = q.shape[1], q.shape[2], v.shape[-1]
    paged = page_table is not None
    hkv = k.shape[-2]
    if n_b <= 0 or h == 0 or pb.max_q <= 0 or out.numel() == 0:
        return
    d_pad = max(_pad(d), _pad(dv))
    rows = min(q.shape[0], pb.caps()[0])
    small_bq = pb.broadcast_q and descale is None and rows <= cfg.bq_small_fwd_rows()
    tile = cfg.bq_fwd_tile(d_pad) if small_bq else cfg.fwd_tile(d_pad)
    if paged:
        sk, sv = (k.stride(0), k.stride(1), k.stride(2)), (v.stride(0), v.stride(1), v.stride(2))
        page_size, max_pages, n_pages = k.shape[1], page_table.shape[1], k.shape[0]
        spt_b = page_table.stride(0)
    else:
        sk, sv = (0, k.stride(0), k.stride(1)), (0, v.stride(0), v.stride(1))
        page_size, max_pages, n_pages, spt_b = 1, 1, 1, 0
    if lse_dense:
        stride_lb, stride_lh = lse.stride(0), lse.stride(1)
    else:
        stride_lb, stride_lh = 0, lse.stride(0)
    dummy = cu_q
    fp8 = descale is not None
    qd, kd, vd = descale if fp8 else (dummy, dummy, dummy)
    if fp8:
        # (Hkv·Dv, Tk_pad): keys contiguous, the B operand of P·V as fp8 wgmma reads it
        v = v_kmajor(v)
        sv = (0, v.stride(0), 0)
    use_tma = not fp8 and _fwd_tma_ok(k, v, paged)
    _allocator(use_tma)
    k_cap = min(pb.max_k, max_pages * page_size) if paged else pb.max_k
    grid = (n_b * h, cdiv(pb.max_q, tile.block_m))
    fwd_kernel[grid](
        q, k, v, out, lse, cu_q, cu_k if cu_k is not None else dummy,
        used_q if used_q is not None else dummy, used_k if used_k is not None else dummy,
        page_table if paged else dummy, sink if sink is not None else dummy,
        q.stride(0), q.stride(1), *sk, *sv, out.stride(0), out.stride(1), stride_lb, stride_lh, spt_b,
        q.shape[0], 0 if paged else k.shape[0], out.shape[0], n_pages, max_pages,
        k_cap, pb.caps()[0], h, h // hkv, *pb.score_args(), qd, kd, vd,
        D_QK=d, D_V=dv, BLOCK_D=_pad(d), BLOCK_DV=_pad(dv), PAGE_SIZE=page_size,
        HAS_USED_Q=used_q is not None, HAS_USED_K=used_k is not None, PAGED=paged,
        HAS_SINK=sink is not None, SOFTCAP=pb.softcap > 0, TOP_LEFT=pb.top_left,
        BROADCAST_Q=pb.broadcast_q, LSE_PER_SEQ=lse_dense, USE_TMA=use_tma, **tile.launch(),
    )  # fmt: skip
