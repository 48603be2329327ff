"""Host launchers for the Triton kernels: config choice (autotune or pinned), TMA, tile maps, grids."""

from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton

from ads_kernel_tools.capability import num_sms
from ads_kernel_tools.kernels.grid import cdiv

from .. import config as cfg
from ..problem import Encodings, Problem, grad_buffers, spans
from ..scheduler import tile_map
from ._bwd import gdpa_bwd_dkdv_kernel, gdpa_bwd_dq_kernel
from ._fwd import gdpa_fwd_kernel


@functools.cache
def _tuned(kind: str, space: tuple[cfg.TileConfig, ...]):
    kernel = {"fwd": gdpa_fwd_kernel, "dkdv": gdpa_bwd_dkdv_kernel, "dq": gdpa_bwd_dq_kernel}[kind]
    key = ["TUNE_KEY", "H" if kind != "dkdv" else "H_KV", "G", "D_QK", "D_V", "ACT"]
    reset = ["DQ"] if kind == "dkdv" else None
    return triton.autotune([c.triton() for c in space], key=key, reset_to_zero=reset)(kernel)


def _launch(kind: str, pinned: cfg.TileConfig, space: list[cfg.TileConfig], grid, args, kwargs) -> None:
    """Run the kernel with the pinned config (interpreter / env) or through its autotuner."""
    if cfg.autotune_disabled() or len(space) == 1:
        c = pinned if cfg.autotune_disabled() else space[0]
        kernel = {"fwd": gdpa_fwd_kernel, "dkdv": gdpa_bwd_dkdv_kernel, "dq": gdpa_bwd_dq_kernel}[kind]
        kernel[grid(c.kwargs())](*args, **kwargs, **c.kwargs())
    else:
        _tuned(kind, tuple(space))[grid](*args, **kwargs)


def _fast_math(device: torch.device) -> bool:
    # PTX tanh.approx: CUDA only, never in the interpreter (it cannot execute inline asm)
    return device.type == "cuda" and not cfg.interpreter_active()


def _ensure_allocator() -> None:
    """Device-side TMA descriptors need scratch memory from a Triton allocator. Triton keeps it in a
    ContextVar, so it is set on every launch: autograd runs the backward on another thread, which
    does not see an allocator set by the forward's thread."""
    triton.set_allocator(_scratch)


def _scratch(size: int, align: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """TMA on sm90+ when every base/stride is 16-byte aligned (descriptor requirement)."""
    forced = cfg.tma_override()
    if forced is not None:
        return forced
    q = tensors[0]
    if q.device.type != "cuda" or cfg.interpreter_active() or q.dtype not in (torch.bfloat16, torch.float16):
        return False
    if torch.cuda.get_device_capability(q.device)[0] < 9:
        return False
    return all(
        t.stride(-1) == 1
        and (t.stride(0) * t.element_size()) % 16 == 0
        and (t.stride(1) * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
        and (t.shape[-1] * t.element_size()) % 16 == 0
        for t in tensors
    )


def _block_d(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def _lengths(host: tuple[int, ...]) -> list[int]:
    return [host[i + 1] - host[i] for i in range(len(host) - 1)]


def fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    pb: Problem,
    out: torch.Tensor,
    act_tbl: torch.Tensor | None = None,
    descale: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    span_tbl: torch.Tensor | None = None,
    enc: Encodings | None = None,
) -> torch.Tensor:
    """Launch the forward into ``out`` (To, H, D_V). q (Tq, H, D_QK); k, v (Tk, H_KV, D), any
    token/head strides (fused layouts are views).

    FP8 (``descale`` given): q/k/v e4m3, out bf16; V is copied K-major (H_KV, D_V, Tk) because
    Hopper fp8 wgmma wants the B operand contiguous along the reduction dim. ``span_tbl``: the
    (5, B) table of ``problem.spans_table`` (pb.spans); ``enc``: encodings added to Q.
    """
    B = span_tbl.shape[1] if span_tbl is not None else cu_k.shape[0] - 1
    H, H_KV, D_QK, D_V = q.shape[1], k.shape[1], q.shape[2], v.shape[2]
    if B == 0 or out.numel() == 0:
        return out
    fp8 = descale is not None
    if fp8:
        from ads_kernel_tools.kernels.transpose import v_kmajor

        # (H_KV·D_V, Tk_pad) by one tiled transpose (torch's permute-copy of fp8 is ~35x slower)
        v_arg = v_kmajor(v)
        stride_vt, stride_vh, stride_vd = 1, D_V * v_arg.stride(0), v_arg.stride(0)
        use_tma = False
    else:
        v_arg = v
        stride_vt, stride_vh, stride_vd = v.stride(0), v.stride(1), 1
        use_tma = _tma_ok(q, k, v)
    if use_tma and q.device.type == "cuda":
        _ensure_allocator()
    dense_kv = k.shape[0] == B * pb.max_k
    short = pb.max_k <= cfg.SHORT_KV_MAX and dense_kv and not pb.has_window
    if short:
        bn = max(16, triton.next_power_of_2(pb.max_k))
        space = cfg.short_kv_space(bn)
        interp = cfg.TileConfig(cfg.FWD_PINNED_INTERP.block_m, bn, 4, 1)
        pinned = interp if cfg.interpreter_active() else space[0]
    else:
        space = cfg.FWD_SPACE
        pinned = cfg.FWD_PINNED_INTERP if cfg.interpreter_active() else cfg.FWD_PINNED_GPU
    if q.device.type == "cuda" and not cfg.interpreter_active():
        space, pinned = cfg.fit(space, pinned, cfg.fwd_smem, _block_d(D_QK), _block_d(D_V))
    # tile map (workload-sorted) only when host offsets exist: building it needs lengths on the CPU
    tmap = None
    if pb.host_q is not None and pb.host_k is not None and not pb.broadcast_q and span_tbl is None:
        lq, lk = _lengths(pb.host_q), _lengths(pb.host_k)
        bm = pinned.block_m if cfg.autotune_disabled() else space[0].block_m
        space = [c for c in space if c.block_m == bm]
        rows = [max(min(a, pb.max_q), 1 if a > 0 else 0) for a in lq]
        progs = num_sms(q.device) * 2 if cfg.persistent() else None
        tmap = tile_map(rows, lk, H, bm, progs, q.device)
    n_map = tmap.shape[1] if tmap is not None else 0
    dummy = cu_q  # unused pointer slots still need a tensor

    def grid(meta):
        if tmap is not None:
            n = n_map
        else:
            n = B * H * max(cdiv(pb.max_q, meta["BLOCK_M"]), 1)
        if cfg.persistent():
            n = min(n, num_sms(q.device) * 2)
        return (max(n, 1),)

    qd, kd, vd = descale if fp8 else (dummy, dummy, dummy)
    if span_tbl is not None:
        cu_q = cu_k = span_tbl
    args = (
        q, k, v_arg, out, cu_q, cu_k, act_tbl if act_tbl is not None else dummy, qd, kd, vd,
        tmap if tmap is not None else dummy,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), stride_vt, stride_vh, stride_vd,
        out.stride(0), out.stride(1),
        pb.max_q, B, H, H // H_KV, n_map, pb.scale, pb.win_left, pb.win_right,
        cfg.seqlen_bucket(pb.max_q) * 4096 + cfg.seqlen_bucket(pb.max_k),
    )  # fmt: skip
    args += _enc_args(enc, dummy)
    kwargs = dict(
        D_QK=D_QK, D_V=D_V, BLOCK_DQK=_block_d(D_QK), BLOCK_DV=_block_d(D_V), ACT=pb.act,
        PER_HEAD=act_tbl is not None, FAST=_fast_math(q.device), HAS_WINDOW=pb.has_window,
        BOTTOM_RIGHT=pb.bottom_right, BROADCAST_Q=pb.broadcast_q, FP8=fp8, USE_TMA=use_tma,
        HAS_TILE_MAP=tmap is not None,
    )  # fmt: skip
    kwargs.update(_extra_consts(span_tbl, enc))
    _launch("fwd", pinned, space, grid, args, kwargs)
    return out


def _enc_args(enc: Encodings | None, dummy: torch.Tensor) -> tuple:
    return enc.kernel_args(dummy) if enc is not None else (dummy,) * 11


def _extra_consts(span_tbl: torch.Tensor | None, enc: Encodings | None) -> dict:
    """Constexprs of the upstream extras, only when used: the common path's kernels keep their
    specialisation (and cache key) unchanged."""
    extra = {}
    if span_tbl is not None:
        extra["SPANS"] = True
    if enc is not None:
        extra["N_ENC"] = len(enc.tables)
    return extra


def bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    pb: Problem,
    act_tbl: torch.Tensor | None = None,
    deterministic: bool = False,
    span_tbl: torch.Tensor | None = None,
    enc: Encodings | None = None,
    dst: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dq, dk, dv, dq32): gradients shaped like (q, k, v), and with ``enc`` the fp32 dQ the table
    gradients are scattered from (else None). do (To, H, D_V).

    ``dst``: zeroed tensors (views of one fused gradient, any strides) that receive dq, dk, dv
    instead of new buffers. ``span_tbl`` / ``enc`` as in ``fwd``; ``pb.dkv_atomic`` accumulates dK/dV
    in fp32 (sequences sharing key rows).
    """
    B = span_tbl.shape[1] if span_tbl is not None else cu_k.shape[0] - 1
    H, H_KV, D_QK, D_V = q.shape[1], k.shape[1], q.shape[2], v.shape[2]
    G = H // H_KV
    if dst is not None:
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if not deterministic else dst[0]
        dk, dv = dst[1], dst[2]
    else:
        covered = (False, False)
        if span_tbl is None:
            covered = (spans(pb.host_q, q.shape[0]), spans(pb.host_k, k.shape[0]))
        dq_acc, dk, dv = grad_buffers(q, k, v, covered, deterministic)
    if deterministic and enc is not None:  # the table gradients want dQ before its rounding
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    if B == 0 or q.shape[0] == 0:
        dq = dst[0] if dst is not None else torch.zeros_like(q)
        dq32 = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if enc is not None else None
        return dq, dk.zero_(), dv.zero_(), dq32
    dk_out, dv_out = dk, dv
    if pb.dkv_atomic:
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    do = do.contiguous() if do.stride(-1) != 1 else do
    atomic = not deterministic
    dummy = cu_q
    fast = _fast_math(q.device)
    consts = dict(
        D_QK=D_QK, D_V=D_V, BLOCK_DQK=_block_d(D_QK), BLOCK_DV=_block_d(D_V), ACT=pb.act,
        PER_HEAD=act_tbl is not None, FAST=fast, HAS_WINDOW=pb.has_window, BOTTOM_RIGHT=pb.bottom_right,
        BROADCAST_Q=pb.broadcast_q, **_extra_consts(span_tbl, enc),
    )  # fmt: skip
    enc_args = _enc_args(enc, dummy)
    if span_tbl is not None:
        cu_q = cu_k = span_tbl
    tune_key = cfg.seqlen_bucket(pb.max_q) * 4096 + cfg.seqlen_bucket(pb.max_k)
    tbl = act_tbl if act_tbl is not None else dummy

    # dK/dV (+ atomic dQ): tiles over kv rows, sorted by the query work they face when offsets are on host
    pinned = cfg.BWD_PINNED_INTERP if cfg.interpreter_active() else cfg.BWD_PINNED_GPU
    space = cfg.BWD_SPACE
    if q.device.type == "cuda" and not cfg.interpreter_active():
        space, pinned = cfg.fit(space, pinned, cfg.bwd_smem, _block_d(D_QK), _block_d(D_V))
        if enc is not None:
            # the gathered encoding rows are multi-buffered with the Q tiles: at two stages the dK/dV
            # kernel asks for more shared memory than an SM has (262 KB at 64x128, D=128;
            # tests/test_compile_sm90.py), unpipelined it needs 98 KB
            space = list(dict.fromkeys(replace(c, num_stages=1) for c in space))
            pinned = replace(pinned, num_stages=1)
    tmap = None
    if pb.host_q is not None and pb.host_k is not None and not pb.broadcast_q and span_tbl is None:
        lq, lk = _lengths(pb.host_q), _lengths(pb.host_k)
        bn = pinned.block_n if cfg.autotune_disabled() else space[0].block_n
        space = [c for c in space if c.block_n == bn]
        tmap = tile_map(lk, [min(a, pb.max_q) for a in lq], H_KV, bn, None, q.device)
    n_map = tmap.shape[1] if tmap is not None else 0

    def grid_kv(meta):
        n = n_map if tmap is not None else B * H_KV * max(cdiv(pb.max_k, meta["BLOCK_N"]), 1)
        return (max(n, 1),)

    args = (
        q, k, v, do, dk, dv, dq_acc, cu_q, cu_k, tbl, tmap if tmap is not None else dummy,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1),
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), dq_acc.stride(0), dq_acc.stride(1),
        pb.max_q, pb.max_k, B, H_KV, G, n_map, pb.scale, pb.win_left, pb.win_right, tune_key, *enc_args,
    )  # fmt: skip
    # head dims up to 128 only: a 256-wide fp32 dQ box would pass TMA's 256-byte swizzle span
    use_tma = cfg.bwd_tma() and max(D_QK, D_V) <= 128 and _tma_ok(q, k, v) and _tma_ok(do, dq_acc)
    if use_tma:
        _ensure_allocator()
    dq_tma = use_tma and cfg.dq_tma()
    kw = dict(consts, DQ_ATOMIC=atomic, HAS_TILE_MAP=tmap is not None, USE_TMA=use_tma, DQ_TMA=dq_tma)
    if pb.dkv_atomic:
        kw["DKV_ATOMIC"] = True
    _launch("dkdv", pinned, space, grid_kv, args, kw)
    if pb.dkv_atomic:
        dk_out.copy_(dk)
        dv_out.copy_(dv)
    dk, dv = dk_out, dv_out
    if atomic:
        return _dq_out(dq_acc, q, dst), dk, dv, dq_acc if enc is not None else None

    # deterministic dQ: a second pass over query tiles (S and dP recomputed), fixed summation order
    pinned = cfg.FWD_PINNED_INTERP if cfg.interpreter_active() else cfg.DQ_SPACE[0]
    dq_space = cfg.DQ_SPACE
    if q.device.type == "cuda" and not cfg.interpreter_active():
        dq_space, pinned = cfg.fit(dq_space, pinned, cfg.fwd_smem, _block_d(D_QK), _block_d(D_V))
    if act_tbl is not None and q.device.type == "cuda":
        # Triton 3.6's software pipeliner fails on this kernel for sm_90 with per-head activation
        # tables and num_stages > 1 ("PassManager::run failed"; seen on the H200, reproduced offline
        # by tests/test_compile_sm90.py): run those unpipelined.
        dq_space = [replace(c, num_stages=1) for c in dq_space]
        pinned = replace(pinned, num_stages=1)
    n_b = 1 if pb.broadcast_q else B

    def grid_q(meta):
        return (max(n_b * H * max(cdiv(pb.max_q, meta["BLOCK_M"]), 1), 1),)

    args = (
        q, k, v, do, dq_acc, cu_q, cu_k, tbl, dummy,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1),
        dq_acc.stride(0), dq_acc.stride(1),
        pb.max_q, B, H, G, 0, pb.scale, pb.win_left, pb.win_right, tune_key, *enc_args,
    )  # fmt: skip
    _launch("dq", pinned, dq_space, grid_q, args, dict(consts, HAS_TILE_MAP=False, USE_TMA=use_tma))
    if dq_acc.dtype != q.dtype or (dst is not None and dq_acc is not dst[0]):
        return _dq_out(dq_acc, q, dst), dk, dv, dq_acc if enc is not None else None
    return dq_acc, dk, dv, None


def _dq_out(dq32: torch.Tensor, q: torch.Tensor, dst) -> torch.Tensor:
    """dQ in q's dtype: into dst's dq view when given (fused gradient), else a new tensor."""
    if dst is None:
        return dq32.to(q.dtype)
    return dst[0].copy_(dq32)
