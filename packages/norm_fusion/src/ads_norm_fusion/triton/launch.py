"""Host-side launchers: tile choice, grids and the scratch allocator for device-side TMA descriptors.

Launchers write into buffers the caller allocates (the custom ops, or tests with poisoned buffers)
and never synchronise with the device.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton

from ads_kernel_tools.capability import interpreter_active, num_sms
from ads_kernel_tools.kernels.grid import cdiv
from ads_kernel_tools.kernels.launch_cache import LaunchCache

from ..config import (
    ROW_COEF_MAX_N,
    ROWNORM_MODES,
    TileConfig,
    flatten_loops,
    norm_bwd_config,
    norm_bwd_sums,
    persistent_config,
    rms_aux_desc,
    rms_dw_config,
    rms_flatten,
    rms_forward_rowpass,
    rms_gemm_config,
    rms_tma_store,
    rownorm_config,
    rownorm_persistent,
)
from ..gluon import dispatch as gluon_dispatch
from ._norm_bwd import norm_bwd_kernel, part_sums_kernel
from ._rms_dw import rms_dw_kernel
from ._rms_gemm import rms_gemm_kernel, row_stat_kernel, scaled_gemm_kernel
from ._rownorm import rownorm_kernel, rownorm_persistent_kernel
from ._scale import row_col_scale_kernel

_GROUP_M = 8

# Every launch relaunches its compiled kernel without Triton's per-call argument binding (the
# tools' ``kernels.launch_cache``): the training steps are bound by host time on the GPU machines'
# hosts (BENCHMARKS.md), and each launch here is one of up to five per step. Runtime arguments go
# by position (the cache keys them by type); constexprs and launch options by keyword (by value).
# ``ADS_LAUNCH_CACHE=0`` (the tools' switch) sends them through Triton's path.
_ROWNORM = LaunchCache(rownorm_kernel)
_ROWNORM_PERSISTENT = LaunchCache(rownorm_persistent_kernel)
_ROW_STAT = LaunchCache(row_stat_kernel)
_SCALED_GEMM = LaunchCache(scaled_gemm_kernel)
_RMS_GEMM = LaunchCache(rms_gemm_kernel)
_NORM_BWD = LaunchCache(norm_bwd_kernel)
_PART_SUMS = LaunchCache(part_sums_kernel)
_ROW_COL_SCALE = LaunchCache(row_col_scale_kernel)
_RMS_DW = LaunchCache(rms_dw_kernel)


def _scratch(size: int, align: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator(t: torch.Tensor) -> None:
    """Device-side TMA descriptors need scratch memory from a Triton allocator. Triton keeps it in a
    ContextVar, so it is set on every launch: autograd runs the backward on another thread."""
    if t.device.type == "cuda":
        triton.set_allocator(_scratch)


def num_row_blocks(m: int, n: int, k: int, device: torch.device) -> int:
    """Programs of the row-norm kernel's backward for an (m, n) output: the row of the partial-sum
    buffers."""
    sms = num_sms(device) if device.type == "cuda" else 1
    cfg = rownorm_config(m, n, k, sms, backward=True)
    return cdiv(m, cfg.block_m)


def launch_rownorm(
    mode: str,
    a: torch.Tensor,
    out: torch.Tensor,
    stat2: torch.Tensor,
    *,
    b: torch.Tensor | None = None,
    b_trans: bool = True,
    bias: torch.Tensor | None = None,
    gamma: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    aux: torch.Tensor | None = None,
    xhat: torch.Tensor | None = None,
    stat1: torch.Tensor | None = None,
    part: torch.Tensor | None = None,
    eps: float = 0.0,
    aux_raw: bool = False,
    weight_grads: bool = False,
    bias_grad: bool = False,
    xoff: torch.Tensor | None = None,
) -> None:
    """One row-norm kernel launch (modes in ``config.ROWNORM_MODES``; math in ``_rownorm``).

    a (M, K) with b (N, K) if ``b_trans`` else (K, N), or a (M, N) itself when b is None (backward
    without a GEMM). out (M, N). stat1/stat2 (M,) fp32: written by forward modes, stat2 read by backward
    modes. part (3, row blocks, N) fp32 for the partial sums (see ``num_row_blocks``).
    Forward with xhat and ``aux_raw``: xhat gets the staged pre-norm value instead of x̂ (and xoff
    (M,) fp32 the LayerNorm row offset: x̂ = (xhat - xoff)·rstd); backward with ``aux_raw``: aux is
    such a value (LayerNorm: with its xoff) or, RMSNorm, the raw input; backward with xhat: xhat
    (M, N) gets x̂·γ. xhat shares out's row stride.
    """
    m, n = out.shape
    if m == 0:
        return
    if xhat is not None and (tuple(xhat.shape) != (m, n) or xhat.stride() != out.stride()):
        raise ValueError(f"xhat {tuple(xhat.shape)} must match out {(m, n)} and its strides")
    forward = mode in ("ln_fwd", "rms_fwd")
    if aux_raw and mode in ("ln_fwd", "ln_bwd") and (xhat if forward else aux) is not None and xoff is None:
        raise ValueError("a LayerNorm pre-norm value needs its row offsets (xoff)")
    stage_xhat = forward and aux_raw and xhat is not None
    k = a.shape[1] if b is not None else n
    sms = num_sms(a.device) if a.device.type == "cuda" else 1
    if forward and b is not None and b_trans:
        took = gluon_dispatch.forward(
            mode, a, b, out, stat2, stat1=stat1, bias=bias, gamma=gamma, beta=beta, xhat=xhat, eps=eps,
            raw=stage_xhat, xoff=xoff,
        )  # fmt: skip
        if took:
            return
    if mode in ("ln_fwd", "rms_fwd", "gemm") and b is not None and b_trans:
        pcfg = persistent_config(m, n, k, sms)
        if rownorm_persistent(n, pcfg.tiles.block_n):
            _launch_persistent(
                mode, a, b, out, stat1, stat2, bias, gamma, beta, xhat, eps, pcfg, stage_xhat, xoff
            )
            return
    cfg = rownorm_config(m, n, k, sms, backward=mode in ("ln_bwd", "rms_bwd"))
    blocks = cdiv(m, cfg.block_m)
    if part is not None and tuple(part.shape) != (3, blocks, n):
        raise ValueError(f"partial-sum buffer is {tuple(part.shape)}, need {(3, blocks, n)}")
    _ensure_allocator(a)
    dummy = out
    _ROWNORM.launch(
        (blocks,),
        (
            a,
            b if b is not None else dummy,
            bias if bias is not None else dummy,
            gamma if gamma is not None else dummy,
            beta if beta is not None else dummy,
            aux if aux is not None else dummy,
            out,
            xhat if xhat is not None else dummy,
            stat1 if stat1 is not None else stat2,
            stat2,
            part if part is not None else stat2,
            xoff if xoff is not None else stat2,
            m,
            n,
            k,
            float(eps),
            blocks * n,
            a.stride(0),
            b.stride(0) if b is not None else 0,
            aux.stride(0) if aux is not None else 0,
            out.stride(0),
        ),
        dict(
            MODE=ROWNORM_MODES[mode],
            HAS_GEMM=b is not None,
            B_TRANS=b_trans,
            HAS_BIAS=bias is not None,
            HAS_GAMMA=gamma is not None,
            HAS_BETA=beta is not None,
            SAVE_XHAT=xhat is not None and not stage_xhat,
            AUX_RAW=aux_raw and not forward,
            WEIGHT_GRADS=weight_grads,
            BIAS_GRAD=bias_grad,
            SINGLE=cfg.single_tile(n),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            NUM_STAGES=cfg.num_stages,
            FLATTEN=flatten_loops(),
            STAGE_XHAT=stage_xhat,
            num_warps=cfg.num_warps,
        ),
    )


def _launch_persistent(mode, a, b, out, stat1, stat2, bias, gamma, beta, xhat, eps, pcfg, stage_xhat, xoff):
    m, n = out.shape
    cfg = pcfg.tiles
    _ensure_allocator(a)
    dummy = out
    _ROWNORM_PERSISTENT.launch((pcfg.programs,), (
        a, b, bias if bias is not None else dummy, gamma if gamma is not None else dummy,
        beta if beta is not None else dummy, out, xhat if xhat is not None else dummy,
        stat1 if stat1 is not None else stat2, stat2, xoff if xoff is not None else stat2, m, n, a.shape[1],
        float(eps), a.stride(0), b.stride(0), out.stride(0),
    ), dict(
        MODE=ROWNORM_MODES[mode], HAS_BIAS=bias is not None, HAS_GAMMA=gamma is not None,
        HAS_BETA=beta is not None, SAVE_XHAT=xhat is not None and not stage_xhat,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, NUM_PROGS=pcfg.programs,
        FLATTEN=flatten_loops(default=True), SYNC_ASM=not interpreter_active(), STAGE_XHAT=stage_xhat,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    ))  # fmt: skip


def launch_row_stat(
    a: torch.Tensor,
    out: torch.Tensor,
    *,
    eps: float = 0.0,
    b: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    r: torch.Tensor | None = None,
    divisor: int | None = None,
) -> None:
    """One pass over the rows of a (M, N): out (M,) fp32 = rsqrt(mean(a²) + eps) when b is None,
    else r²·Σ a·(b − bias) / divisor (``rmsnorm_linear``'s backward coefficient)."""
    m, n = a.shape
    if m == 0:
        return
    block_n = min(_pow2(n), 1024)
    block_m = max(1, 8192 // block_n)
    if a.device.type != "cuda":
        block_m = min(block_m, 16)
    grid = (cdiv(m, block_m),)
    _ROW_STAT.launch(grid, (
        a, b if b is not None else a, bias if bias is not None else a, r if r is not None else out, out,
        m, n, a.stride(0), b.stride(0) if b is not None else 0, 1.0 / float(divisor or n), float(eps),
    ), dict(
        MODE=0 if b is None else 1, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=4 if block_m * block_n <= 4096 else 8,
    ))  # fmt: skip


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


def launch_scaled_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    alpha: torch.Tensor,
    *,
    b_trans: bool,
    gamma: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    aux: torch.Tensor | None = None,
    coef: torch.Tensor | None = None,
    part: torch.Tensor | None = None,
    row_coef: bool = False,
    cfg: TileConfig | None = None,
) -> None:
    """out (M, N) = alpha[m]·(a·b)·gamma[n] (+ bias) (− aux·coef[m]); a (M, K), b (N, K) if b_trans
    else (K, N). part (cdiv(M, block_m), N) fp32 (see ``rms_gemm_blocks``) gets Σ_rows (a·b)·aux·alpha.
    ``row_coef`` (aux given, n <= ``config.ROW_COEF_MAX_N``): coef is formed in the kernel from the
    whole-row tile (``scaled_gemm_kernel``'s ``ROW_COEF``) and the coef argument is not read.
    ``cfg``: the tiles, when the caller already built them (``config.rms_gemm_config`` with
    ``backward=aux is not None``) to size ``part``."""
    m, n = out.shape
    k = a.shape[1]
    if m == 0:
        return
    if row_coef and (aux is None or n > ROW_COEF_MAX_N):
        raise ValueError(f"launch_scaled_gemm: row_coef needs aux and n <= {ROW_COEF_MAX_N}, got n={n}")
    if cfg is None:
        cfg = rms_gemm_config(m, n, k, backward=aux is not None, row_coef=row_coef)
    if part is not None and tuple(part.shape) != (cdiv(m, cfg.block_m), n):
        raise ValueError(
            f"launch_scaled_gemm: part must be ({cdiv(m, cfg.block_m)}, {n}) for these tiles, "
            f"got {tuple(part.shape)}"
        )
    tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
    sms = num_sms(a.device) if a.device.type == "cuda" else 4
    progs = max(1, min(tiles, sms))
    aux_desc = (
        row_coef and rms_aux_desc() and gluon_dispatch.tma_matrix(aux) and gluon_dispatch.tma_matrix(out)
    )
    tma_store = aux is None and part is None and gluon_dispatch.tma_matrix(out) and rms_tma_store()
    _ensure_allocator(a)
    dummy = alpha
    _SCALED_GEMM.launch((progs,), (
        a, b, alpha, gamma if gamma is not None else dummy, bias if bias is not None else dummy,
        aux if aux is not None else out, coef if coef is not None else dummy, out,
        part if part is not None else dummy, m, n, k, a.stride(0), b.stride(0),
        aux.stride(0) if aux is not None else 0, out.stride(0),
    ), dict(
        B_TRANS=b_trans, HAS_GAMMA=gamma is not None, HAS_BIAS=bias is not None, HAS_AUX=aux is not None,
        PART_GRADS=part is not None, TMA_STORE=tma_store, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_M=_GROUP_M, NUM_PROGS=progs, FLATTEN=rms_flatten(), ROW_COEF=row_coef,
        AUX_DESC=aux_desc,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    ))  # fmt: skip


def rms_gemm_blocks(m: int, n: int, k: int, *, backward: bool, row_coef: bool = False) -> int:
    """Row blocks of ``launch_scaled_gemm``: the rows of its partial-sum buffer."""
    return cdiv(m, rms_gemm_config(m, n, k, backward=backward, row_coef=row_coef).block_m)


def launch_rms_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    rrms: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    eps: float,
) -> None:
    """out (M, N) = diag(rrms(x)) · (x @ wᵀ) (+ bias); x (M, K), w (N, K) with the norm weight folded in.
    rrms (M,) fp32 is written too: by the Gluon kernel that sums x² from its shared-memory A tiles
    (``gluon.dispatch.rms_linear_forward``; sm_90), else by one row pass over x before the persistent
    scaled GEMM (K >= 1024) or by the single kernel that sums x² in its K loop
    (``config.rms_forward_rowpass``)."""
    m, k = x.shape
    n = w.shape[0]
    if m == 0 or gluon_dispatch.rms_linear_forward(x, w, out, rrms, bias=bias, eps=eps):
        return
    if rms_forward_rowpass(k):
        launch_row_stat(x, rrms, eps=eps)
        launch_scaled_gemm(x, w, out, rrms, b_trans=True, bias=bias)
        return
    cfg = rms_gemm_config(m, n, k)
    grid = (cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n),)
    _ensure_allocator(x)
    _RMS_GEMM.launch(grid, (
        x, w, bias if bias is not None else out, out, rrms, m, n, k, float(eps), x.stride(0), w.stride(0),
        out.stride(0),
    ), dict(
        HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=_GROUP_M, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps,
    ))  # fmt: skip


class RmsDwSplits(NamedTuple):
    """How ``launch_rms_dw`` divides its work: ``splits`` row ranges of ``per_split`` rows, each over
    ``tiles`` output tiles (one program per split and tile)."""

    splits: int
    per_split: int
    tiles: int


def rms_dw_splits(m: int, n: int, k: int, device: torch.device) -> RmsDwSplits:
    """The division of ``launch_rms_dw``: about two programs per SM over the output tiles, each split a
    whole number of row steps."""
    cfg = rms_dw_config()
    tiles = cdiv(n, cfg.block_n) * cdiv(k, cfg.block_k)
    steps = max(cdiv(m, cfg.block_m), 1)
    sms = num_sms(device) if device.type == "cuda" else 4  # the interpreter: several splits too
    splits = max(1, min(steps, (2 * sms) // tiles))
    per_split = cdiv(steps, splits) * cfg.block_m
    return RmsDwSplits(cdiv(m, per_split) if m else 1, per_split, tiles)


def launch_rms_dw(
    dy: torch.Tensor,
    x: torch.Tensor,
    rrms: torch.Tensor,
    gamma: torch.Tensor | None,
    part: torch.Tensor,
    plan: RmsDwSplits | None = None,
) -> None:
    """part (splits, N, K) fp32 = per-split sums of dyᵀ·diag(rrms)·x·diag(γ) (``_rms_dw``); dy (M, N),
    x (M, K), rrms (M,) fp32; ``plan`` from ``rms_dw_splits`` (made here when not given). dW is part
    summed over its first dim."""
    m, n = dy.shape
    k = x.shape[1]
    plan = plan or rms_dw_splits(m, n, k, dy.device)
    if tuple(part.shape) != (plan.splits, n, k) or not part.is_contiguous():
        raise ValueError(f"partial dW buffer is {tuple(part.shape)}, need contiguous {(plan.splits, n, k)}")
    if m == 0:
        part.zero_()
        return
    cfg = rms_dw_config()
    _ensure_allocator(dy)
    _RMS_DW.launch((plan.splits * plan.tiles,), (
        dy, x, rrms, gamma if gamma is not None else rrms, part, m, n, k, plan.per_split, dy.stride(0),
        x.stride(0),
    ), dict(
        HAS_GAMMA=gamma is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps,
    ))  # fmt: skip


def launch_norm_bwd(
    dy: torch.Tensor,
    xhat: torch.Tensor,
    rstat: torch.Tensor,
    dz: torch.Tensor,
    *,
    gamma: torch.Tensor | None,
    rms: bool,
    dweight: torch.Tensor | None = None,
    dnorm_bias: torch.Tensor | None = None,
    dbias: torch.Tensor | None = None,
    xhat_raw: bool = False,
    xoff: torch.Tensor | None = None,
    xg: torch.Tensor | None = None,
) -> None:
    """Row-wise norm backward (``_norm_bwd``) for N <= ``config.NORM_BWD_MAX_N``; wider rows take the
    row-norm kernel without a GEMM. ``xhat_raw``: xhat is the forward's staged pre-norm value (with
    its LayerNorm row offsets xoff, see ``launch_rownorm``). The (N,) outputs given are written:
    dweight = Σ dy·x̂, dnorm_bias = Σ dy (LayerNorm), dbias = Σ dz, each rounded once to its dtype
    from fp32 sums in a fixed order (where: ``config.norm_bwd_sums``); xg (M, N) = x̂·γ."""
    if xhat_raw and not rms and xoff is None:
        raise ValueError("a LayerNorm pre-norm value needs its row offsets (xoff)")
    m, n = dy.shape
    if dnorm_bias is not None and rms:
        raise ValueError("RMSNorm has no norm bias")
    outs = (dweight, dnorm_bias, dbias)
    weight_grads = dweight is not None or dnorm_bias is not None
    bias_grad = dbias is not None
    cfg = norm_bwd_config(m, n, num_sms(dy.device) if dy.device.type == "cuda" else 1)
    if m == 0:
        for t in (*outs, xg):
            if t is not None:
                t.zero_()
        return
    if cfg is None:
        part = None
        if weight_grads or bias_grad:
            part = torch.empty(
                (3, num_row_blocks(m, n, n, dy.device), n), dtype=torch.float32, device=dy.device
            )
        launch_rownorm(
            "rms_bwd" if rms else "ln_bwd", dy, dz, rstat, gamma=gamma, aux=xhat, part=part,
            weight_grads=weight_grads, bias_grad=bias_grad, aux_raw=xhat_raw, xoff=xoff, xhat=xg,
        )  # fmt: skip
        if part is not None:
            _add_partials(part, outs)
        return
    programs = max(cdiv(m, cfg.rows_per_prog), 1)
    part = counters = None
    in_kernel = norm_bwd_sums() == "fused"
    if weight_grads or bias_grad:
        part = torch.empty((3, programs, n), dtype=torch.float32, device=dy.device)
        if in_kernel:
            counters = _counters(dy.device, 1 + cdiv(programs, NORM_BWD_GROUP))
    dummy = rstat
    # every parameter by position: tensors follow constexprs in this signature
    _NORM_BWD.launch((programs,), (
        dy, xhat, rstat, gamma if gamma is not None else dy, dz, part if part is not None else dummy,
        m, n, dy.stride(0), xhat.stride(0), dz.stride(0), programs * n,
        rms, gamma is not None, weight_grads, bias_grad, cfg.block_m, cfg.block_n, cfg.rows_per_prog,
        cfg.acc_2d, xoff if xoff is not None else dummy, xhat_raw, dweight if dweight is not None else dummy,
        dnorm_bias if dnorm_bias is not None else dummy, dbias if dbias is not None else dummy,
        counters if counters is not None else dummy, counters is not None, NORM_BWD_GROUP,
        max(1, min(NORM_BWD_GROUP, 8192 // cfg.block_n)), not interpreter_active(),
        xg if xg is not None else dz, xg.stride(0) if xg is not None else 0, xg is not None,
    ), dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))  # fmt: skip
    if part is not None and counters is None:
        _add_partials(part, outs)


NORM_BWD_GROUP = 32  # programs whose partial rows one of them adds up (see _norm_bwd)

# (device, stream) -> int32 zeros that the norm backward counts its programs in and leaves at zero.
# Per stream, so that kernels running at once on two streams never share one.
_COUNTERS: dict[tuple, torch.Tensor] = {}


def _counters(device: torch.device, size: int) -> torch.Tensor:
    if device.type != "cuda":
        return torch.zeros(size, dtype=torch.int32, device=device)
    if torch.cuda.is_current_stream_capturing():  # a graph's own memory: not kept past the capture
        return torch.zeros(size, dtype=torch.int32, device=device)
    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < size:
        buf = torch.zeros(max(size, 1024), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def _add_partials(part: torch.Tensor, outs) -> None:
    """outs[i] = part[i].sum(0) for each output given: torch reductions, or one launch
    (``config.norm_bwd_sums``)."""
    if norm_bwd_sums() == "kernel":
        launch_part_sums(part, *outs)
        return
    for plane, out in enumerate(outs):
        if out is not None:
            out.copy_(part[plane].sum(dim=0))


def launch_row_col_scale(x: torch.Tensor, r: torch.Tensor, g: torch.Tensor | None, out: torch.Tensor) -> None:
    """out (M, K) = x · r[:, None] · g[None, :] (g optional), fp32 math, rounded once."""
    m, k = x.shape
    if m == 0:
        return
    block_m, block_k = 32, 128
    grid = (cdiv(m, block_m), cdiv(k, block_k))
    _ROW_COL_SCALE.launch(grid, (
        x, r, g if g is not None else x, out, m, k, x.stride(0), out.stride(0),
    ), dict(HAS_G=g is not None, BLOCK_M=block_m, BLOCK_K=block_k, num_warps=4))  # fmt: skip


def launch_part_sums(
    part: torch.Tensor, out0: torch.Tensor | None, out1: torch.Tensor | None, out2: torch.Tensor | None
) -> None:
    """outi (N,) = part[i].sum(0) for each outi given, in one launch (``part_sums_kernel``); part is the
    (3, P, N) fp32 partial-sum buffer of ``launch_norm_bwd``."""
    _, p, n = part.shape
    if n == 0:
        return
    block_n = 64 if part.device.type == "cuda" else 32
    dummy = part
    _PART_SUMS.launch((cdiv(n, block_n),), (
        part, out0 if out0 is not None else dummy, out1 if out1 is not None else dummy,
        out2 if out2 is not None else dummy, p, n, p * n,
    ), dict(
        DO0=out0 is not None, DO1=out1 is not None, DO2=out2 is not None,
        BLOCK_P=32 if part.device.type == "cuda" else 8, BLOCK_N=block_n, num_warps=4,
    ))  # fmt: skip
