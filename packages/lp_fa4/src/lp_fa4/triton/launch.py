"""Host launchers: tiles, grids and strides for the Triton kernels. No host sync here."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from .. import config as cfg
from ._bwd import dkdv_kernel, dq_kernel, preprocess_kernel
from ._fwd import fwd_kernel

BIG = 1 << 30  # an unbounded window side; band arithmetic on it stays inside int32
LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class Problem:
    """Everything a launch needs besides tensors (window sides already resolved, BIG = unbounded)."""

    max_q: int  # the longest query slot: grid bound of the query tiles
    max_k: int  # the longest key sequence: grid bound of the backward's key tiles
    scale: float
    softcap: float
    win_left: int
    win_right: int
    top_left: bool
    broadcast_q: bool
    rows_cap: int  # BIG, or the jagged max_seqlen_q past which query rows are zeros

    def caps(self) -> tuple[int, int]:
        """(rows, keys) of a sequence the kernels compute: at most max_q query rows (and the jagged
        cap) and max_k keys, so that forward and backward agree on a sequence longer than its bound."""
        return min(self.rows_cap, self.max_q), self.max_k

    def score_args(self) -> tuple[float, float, float, int, int]:
        cap = self.softcap
        cap_in = self.scale / cap if cap > 0 else 0.0
        return self.scale * LOG2E, cap_in, cap * LOG2E, self.win_left, self.win_right


def _tma_ok(*tensors: torch.Tensor, paged: bool = False) -> bool:
    """Per-sequence TMA descriptors over rows of ``tensors``: opted in, not paged, on sm90+ (or the
    interpreter, which runs descriptors in software), rows and head offsets 16-byte aligned."""
    if not cfg.use_tma() or paged:
        return False
    if not cfg.interpreter_active():
        if tensors[0].device.type != "cuda" or torch.cuda.get_device_capability(tensors[0].device)[0] < 9:
            return False
    for t in tensors:
        e = t.element_size()
        if t.data_ptr() % 16 or (t.stride(0) * e) % 16 or (t.stride(1) * e) % 16 or (t.shape[-1] * e) % 16:
            return False
    return True


def _scratch(size: int, align: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _allocator(use_tma: bool) -> None:
    """Device-side descriptors need scratch from a Triton allocator. It lives in a ContextVar, so it
    is set per launch (autograd runs the backward on another thread than the forward)."""
    if use_tma and not cfg.interpreter_active():
        triton.set_allocator(_scratch)


def _pad(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def fwd(q, k, v, cu_q, cu_k, used_q, used_k, page_table, sink, pb: Problem, out, lse, lse_dense: bool):
    """Fill out (TO, H, Dv) and lse ((B, H, S) when ``lse_dense``, else (H, TO)).

    q (TQ, H, D); k/v (TK, Hkv, ·) or paged (pages, page_size, Hkv, ·) with page_table (B, max_pages).
    """
    n_b = (cu_k if pb.broadcast_q else cu_q).shape[0] - 1
    h, d, dv = q.shape[1], q.shape[2], v.shape[-1]
    paged = page_table is not None
    hkv = k.shape[-2]
    if n_b <= 0 or h == 0 or pb.max_q <= 0 or out.numel() == 0:
        return
    tile = cfg.fwd_tile(max(_pad(d), _pad(dv)))
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
    use_tma = _tma_ok(k, v, paged=paged)
    _allocator(use_tma)
    k_cap = min(pb.max_k, max_pages * page_size) if paged else pb.max_k
    grid = (n_b * h, triton.cdiv(pb.max_q, tile.block_m))
    fwd_kernel[grid](
        q, k, v, out, lse, cu_q, cu_k if cu_k is not None else dummy,
        used_q if used_q is not None else dummy, used_k if used_k is not None else dummy,
        page_table if paged else dummy, sink if sink is not None else dummy,
        q.stride(0), q.stride(1), *sk, *sv, out.stride(0), out.stride(1), stride_lb, stride_lh, spt_b,
        q.shape[0], 0 if paged else k.shape[0], out.shape[0], n_pages, max_pages,
        k_cap, pb.caps()[0], h, h // hkv, *pb.score_args(),
        D_QK=d, D_V=dv, BLOCK_D=_pad(d), BLOCK_DV=_pad(dv), PAGE_SIZE=page_size,
        HAS_USED_Q=used_q is not None, HAS_USED_K=used_k is not None, PAGED=paged,
        HAS_SINK=sink is not None, SOFTCAP=pb.softcap > 0, TOP_LEFT=pb.top_left,
        BROADCAST_Q=pb.broadcast_q, LSE_PER_SEQ=lse_dense, USE_TMA=use_tma, **tile.launch(),
    )  # fmt: skip


def bwd(do, q, k, v, out, lse, dlse, cu_q, cu_k, used_q, used_k, pb: Problem, deterministic: bool):
    """(dq, dk, dv) like (q, k, v) and delta (H, TO) fp32. lse/dlse are (H, TO) here."""
    n_b = cu_k.shape[0] - 1
    h, hkv, d, dv_dim = q.shape[1], k.shape[1], q.shape[2], v.shape[2]
    g = h // hkv
    to = out.shape[0]
    # rows outside every sequence (offsets need not span the tensors) keep zero gradients
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    mode = cfg.dq_mode(deterministic)
    dq = torch.zeros(q.shape, dtype=torch.float32 if mode == "atomic" else q.dtype, device=q.device)
    delta = torch.empty((h, to), dtype=torch.float32, device=q.device)
    if to == 0 or h == 0:
        return dq.to(q.dtype), dk, dv, delta.zero_()
    pre_m = 16 if cfg.interpreter_active() else 64
    preprocess_kernel[(triton.cdiv(to, pre_m), h)](
        out, do, dlse if dlse is not None else delta, delta, out.stride(0), out.stride(1),
        do.stride(0), do.stride(1), to, h, D_V=dv_dim, BLOCK_DV=_pad(dv_dim), BLOCK_M=pre_m,
        HAS_DLSE=dlse is not None,
    )  # fmt: skip
    if n_b <= 0 or pb.max_q <= 0 or pb.max_k <= 0 or q.shape[0] == 0 or k.shape[0] == 0:
        return dq.to(q.dtype), dk, dv, delta
    dummy = cu_q
    uq = used_q if used_q is not None else dummy
    uk = used_k if used_k is not None else dummy
    sa = pb.score_args()
    flags = dict(
        D_QK=d, D_V=dv_dim, BLOCK_D=_pad(d), BLOCK_DV=_pad(dv_dim), HAS_USED_Q=used_q is not None,
        HAS_USED_K=used_k is not None, SOFTCAP=pb.softcap > 0, TOP_LEFT=pb.top_left,
        BROADCAST_Q=pb.broadcast_q,
    )  # fmt: skip
    dpad = max(_pad(d), _pad(dv_dim))
    use_tma = _tma_ok(q, k, v, do)
    _allocator(use_tma)
    flags["USE_TMA"] = use_tma
    t1 = cfg.dkdv_tile(dpad)
    dkdv_kernel[(n_b * hkv, triton.cdiv(pb.max_k, t1.block_n))](
        q, k, v, do, lse, delta, dq, dk, dv, cu_q, cu_k, uq, uk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1),
        dv.stride(0), dv.stride(1), q.shape[0], k.shape[0], to, pb.max_k, pb.caps()[0], hkv, g, pb.scale, *sa,
        DQ_ATOMIC=mode == "atomic", **flags, **t1.launch(),
    )  # fmt: skip
    if mode == "atomic":
        return dq.to(q.dtype), dk, dv, delta
    t2 = cfg.dq_tile(dpad)
    progs = h if pb.broadcast_q else n_b * h
    dq_kernel[(progs, triton.cdiv(pb.max_q, t2.block_m))](
        q, k, v, do, lse, delta, dq, cu_q, cu_k, uq, uk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), dq.stride(0), dq.stride(1),
        q.shape[0], k.shape[0], to, pb.max_k, pb.caps()[0], n_b, h, g, pb.scale, *sa, **flags, **t2.launch(),
    )  # fmt: skip
    return dq, dk, dv, delta
