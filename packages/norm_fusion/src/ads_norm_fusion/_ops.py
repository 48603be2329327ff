"""torch.library custom ops (fake impls, autograd, FLOP formulas) around the Triton launchers.

Plain eager calls (``ads_kernel_tools.dispatch.plain_eager``) take ``eager_function`` autograd
Functions instead: the same impls, setup and backward without the op's dispatch (``linear_layernorm``,
``linear_rmsnorm``, ``rmsnorm_linear``, ``norm_input_grad`` at the end choose the route).

``custom_op`` (not ``triton_op``) is deliberate: it also passes opcheck and torch.compile on CPU under
TRITON_INTERPRET, where ``triton_op`` would read data pointers of fake tensors.

Ops (all 2-D; the public API flattens leading dims):
- ``linear_layernorm_fwd(x, w, bias, weight, norm_bias, eps, save_xhat, xhat_raw)
  -> (y, mean, rstd, xhat, xoff)``
- ``linear_rmsnorm_fwd(x, w, bias, weight, eps, save_xhat, xhat_raw) -> (y, rrms, xhat)``
  xhat is what the backward needs of the normalised pre-affine value, (0,) when not asked for (no
  affine parameters: y is x̂ then, and is saved instead): x̂ itself, or with ``xhat_raw``
  (``config.save_prenorm``) the forward's staged pre-norm tile, x̂ = (xhat - xoff)·rstd (RMSNorm:
  xhat·rrms); xoff (M,) fp32 only then, (0,) otherwise.
- ``norm_bwd(dy, xhat, rstat, xoff, weight, rms, xhat_raw, weight_grads, bias_grad, want_xg)
  -> (dz, dweight, dnorm_bias, dbias, xg)`` the row-wise norm backward (xhat as saved by the forward,
  xoff None for RMSNorm or x̂ itself); dweight/dnorm_bias/dbias are (0,) unless asked for, and so is
  xg = x̂·γ unless ``want_xg`` (``rmsnorm_linear``'s weight-gradient operand, its norm over K).
- ``rmsnorm_linear_fwd(x, norm_weight, w, bias, eps) -> (y, rrms)``: a GEMM with W·γ and the per-row
  scale in its epilogue (rrms from Σx² over the A tiles in shared memory in the Gluon sm_90 kernel,
  ``gluon.dispatch.rms_linear_forward``; on the Triton path from Σx² in its K loop, or from one row
  pass first: ``config.rms_forward_rowpass``).
- ``rmsnorm_linear_dx(dy, w, x, y, rrms, norm_weight, bias, weight_grad) -> (dx, dnorm_weight)``:
  its input gradient from the saved output (a row pass for the coefficient, then a GEMM epilogue;
  at K <= ``ROW_COEF_MAX_N`` the GEMM's whole-row tile forms the coefficient and y may be None).
- ``gemm_norm_input_grad(dy, w_next_t, aux, rstat, weight, rms, aux_raw, weight_grads)
  -> (dz, dweight, dnorm_bias)``: ``dy @ w_next_t`` with the norm backward in its epilogue.
Statistics outputs are fp32 and carry no gradient. Weight and bias gradients come from per-row-block
partial sums added in a fixed order, so they are bitwise reproducible.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ads_kernel_tools.dispatch import eager_function, plain_eager
from ads_kernel_tools.kernels.grid import cdiv

from .config import (
    NORM_BWD_MAX_N,
    ROW_COEF_MAX_N,
    rms_backward_mode,
    rms_gemm_config,
    rms_weight_grad,
    save_prenorm,
)
from .costs import gemm_flops
from .triton.launch import (
    launch_norm_bwd,
    launch_rms_dw,
    launch_rms_gemm,
    launch_row_col_scale,
    launch_row_stat,
    launch_rownorm,
    launch_scaled_gemm,
    num_row_blocks,
    rms_dw_splits,
)

_EMPTY = (0,)


def _aligned(t: Tensor | None) -> Tensor | None:
    """TMA descriptors need a 16-byte aligned base (strides are checked by the API)."""
    if t is None:
        return None
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _stat(x: Tensor) -> Tensor:
    return torch.empty((x.shape[0],), dtype=torch.float32, device=x.device)


# ---------------------------------------------------------------- forward: GEMM + norm over N
def _ln_fwd(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    weight: Tensor | None,
    norm_bias: Tensor | None,
    eps: float,
    save_xhat: bool,
    xhat_raw: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    x, w = _aligned(x), _aligned(w)
    m, n = x.shape[0], w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    xhat = torch.empty((m, n) if save_xhat else _EMPTY, dtype=x.dtype, device=x.device)
    raw = save_xhat and xhat_raw
    xoff = torch.empty((m,) if raw else _EMPTY, dtype=torch.float32, device=x.device)
    mean, rstd = _stat(x), _stat(x)
    launch_rownorm(
        "ln_fwd", x, y, rstd, b=w, bias=bias, gamma=weight, beta=norm_bias, stat1=mean,
        xhat=xhat if save_xhat else None, eps=eps, aux_raw=raw, xoff=xoff if raw else None,
    )  # fmt: skip
    return y, mean, rstd, xhat, xoff


linear_layernorm_fwd = torch.library.custom_op(
    "ads_norm_fusion::linear_layernorm_fwd", _ln_fwd, mutates_args=()
)


@linear_layernorm_fwd.register_fake
def _(x, w, bias, weight, norm_bias, eps, save_xhat, xhat_raw):
    m, n = x.shape[0], w.shape[0]
    stat = x.new_empty((m,), dtype=torch.float32)
    return (
        x.new_empty((m, n)),
        stat,
        stat.new_empty((m,)),
        x.new_empty((m, n) if save_xhat else _EMPTY),
        stat.new_empty((m,) if save_xhat and xhat_raw else _EMPTY),
    )


def _rms_fwd(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    weight: Tensor | None,
    eps: float,
    save_xhat: bool,
    xhat_raw: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    x, w = _aligned(x), _aligned(w)
    m, n = x.shape[0], w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    xhat = torch.empty((m, n) if save_xhat else _EMPTY, dtype=x.dtype, device=x.device)
    rrms = _stat(x)
    launch_rownorm(
        "rms_fwd", x, y, rrms, b=w, bias=bias, gamma=weight, xhat=xhat if save_xhat else None, eps=eps,
        aux_raw=save_xhat and xhat_raw,
    )  # fmt: skip
    return y, rrms, xhat


linear_rmsnorm_fwd = torch.library.custom_op("ads_norm_fusion::linear_rmsnorm_fwd", _rms_fwd, mutates_args=())


@linear_rmsnorm_fwd.register_fake
def _(x, w, bias, weight, eps, save_xhat, xhat_raw):
    m, n = x.shape[0], w.shape[0]
    return (
        x.new_empty((m, n)),
        x.new_empty((m,), dtype=torch.float32),
        x.new_empty((m, n) if save_xhat else _EMPTY),
    )


# ---------------------------------------------------------------- row-wise norm backward
def _sums(part: Tensor, plane: int, dtype: torch.dtype) -> Tensor:
    return part[plane].sum(dim=0).to(dtype)


def _norm_bwd(
    dy: Tensor,
    xhat: Tensor,
    rstat: Tensor,
    xoff: Tensor | None,
    weight: Tensor | None,
    rms: bool,
    xhat_raw: bool,
    weight_grads: bool,
    bias_grad: bool,
    want_xg: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    dy, xhat = dy.contiguous(), xhat.contiguous()  # the kernel takes unit column strides
    n = dy.shape[1]
    dz = torch.empty_like(dy)
    pdtype = weight.dtype if weight is not None else dy.dtype
    dweight = dy.new_empty((n,) if weight_grads else _EMPTY, dtype=pdtype)
    dnorm_bias = dy.new_empty((n,) if weight_grads and not rms else _EMPTY, dtype=pdtype)
    dbias = dy.new_empty((n,) if bias_grad else _EMPTY)
    xg = torch.empty_like(xhat) if want_xg else xhat.new_empty(_EMPTY)
    launch_norm_bwd(
        dy, xhat, rstat, dz, gamma=weight, rms=rms, dweight=dweight if weight_grads else None,
        dnorm_bias=dnorm_bias if weight_grads and not rms else None, dbias=dbias if bias_grad else None,
        xhat_raw=xhat_raw, xoff=xoff, xg=xg if want_xg else None,
    )  # fmt: skip
    return dz, dweight, dnorm_bias, dbias, xg


norm_bwd = torch.library.custom_op("ads_norm_fusion::norm_bwd", _norm_bwd, mutates_args=())


@norm_bwd.register_fake
def _(dy, xhat, rstat, xoff, weight, rms, xhat_raw, weight_grads, bias_grad, want_xg=False):
    n = dy.shape[1]
    pdtype = weight.dtype if weight is not None else dy.dtype
    return (
        dy.new_empty(dy.shape),
        dy.new_empty((n,) if weight_grads else _EMPTY, dtype=pdtype),
        dy.new_empty((n,) if weight_grads and not rms else _EMPTY, dtype=pdtype),
        dy.new_empty((n,) if bias_grad else _EMPTY),
        xhat.new_empty(xhat.shape if want_xg else _EMPTY),
    )


def _linear_norm_backward(ctx, dy: Tensor, rms: bool, eager: bool = False):
    """Gradients of linear_layernorm_fwd / linear_rmsnorm_fwd; ``eager`` calls the kernels directly
    instead of through the ``norm_bwd`` op (the eager path below)."""
    x, w, weight, xhat, rstat, xoff = ctx.saved_tensors
    needs = ctx.needs_input_grad
    want_bias = ctx.has_bias and needs[2]
    want_affine = (ctx.has_weight and needs[3]) or (ctx.has_norm_bias and not rms and needs[4])
    bwd = _norm_bwd if eager else norm_bwd
    raw = ctx.xhat_raw
    dz, dweight, dnorm_bias, dbias, _ = bwd(
        dy, xhat, rstat, xoff if raw and not rms else None, weight, rms, raw, want_affine, want_bias
    )
    dx = dz @ w if needs[0] else None
    dw = dz.t() @ x if needs[1] else None
    grads = [dx, dw, dbias if want_bias else None, dweight if ctx.has_weight and want_affine else None]
    if not rms:
        grads.append(dnorm_bias if ctx.has_norm_bias and want_affine else None)
    return (*grads, None, None, None)


def _save_linear_norm(ctx, x, w, bias, weight, norm_bias, y, rstat, xhat, xoff, raw: bool) -> None:
    ctx.has_bias, ctx.has_weight = bias is not None, weight is not None
    ctx.has_norm_bias = norm_bias is not None
    affine = ctx.has_weight or ctx.has_norm_bias
    if affine and xhat.numel() == 0 and y.numel() != 0:
        ctx.missing_xhat = True
    ctx.xhat_raw = affine and raw  # without affine parameters y is x̂ itself
    ctx.save_for_backward(x, w, weight, xhat if affine else y, rstat, xoff)


def _ln_setup(ctx, inputs, output) -> None:
    x, w, bias, weight, norm_bias, _eps, save, raw = inputs
    y, mean, rstd, xhat, xoff = output
    ctx.mark_non_differentiable(mean, rstd, xhat, xoff)
    _save_linear_norm(ctx, x, w, bias, weight, norm_bias, y, rstd, xhat, xoff, save and raw)


def _rms_setup(ctx, inputs, output) -> None:
    x, w, bias, weight, _eps, save, raw = inputs
    y, rrms, xhat = output
    ctx.mark_non_differentiable(rrms, xhat)
    _save_linear_norm(ctx, x, w, bias, weight, None, y, rrms, xhat, None, save and raw)


def _check_saved(ctx) -> None:
    if getattr(ctx, "missing_xhat", False):
        raise RuntimeError(
            "the forward ran with save_xhat=False; the public API sets it whenever grad is enabled"
        )


def _ln_backward(ctx, dy, _dmean, _drstd, _dxhat, _dxoff):
    _check_saved(ctx)
    return _linear_norm_backward(ctx, dy, rms=False)


def _rms_backward(ctx, dy, _drrms, _dxhat):
    _check_saved(ctx)
    return _linear_norm_backward(ctx, dy, rms=True)


linear_layernorm_fwd.register_autograd(_ln_backward, setup_context=_ln_setup)
linear_rmsnorm_fwd.register_autograd(_rms_backward, setup_context=_rms_setup)


# ---------------------------------------------------------------- GEMM with the norm backward in its epilogue
def _gemm_norm_input_grad(
    dy: Tensor,
    w_next_t: Tensor,
    aux: Tensor,
    rstat: Tensor,
    weight: Tensor | None,
    rms: bool,
    aux_raw: bool,
    weight_grads: bool,
    want_xg: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """dz = the norm backward of g = dy @ w_next_t in the GEMM's epilogue (and dγ, dβ); with
    ``want_xg`` (RMSNorm of a raw input) also x̂·γ, which the epilogue has in registers."""
    dy, w_next_t, aux = _aligned(dy), _aligned(w_next_t), _aligned(aux)
    m, n = dy.shape[0], w_next_t.shape[1]
    dz = torch.empty((m, n), dtype=dy.dtype, device=dy.device)
    xg = torch.empty_like(dz) if want_xg else dz.new_empty(_EMPTY)
    part = None
    if weight_grads:
        part = torch.empty(  # every program stores its rows of the planes asked for
            (3, num_row_blocks(m, n, dy.shape[1], dy.device), n), dtype=torch.float32, device=dy.device
        )
    launch_rownorm(
        "rms_bwd" if rms else "ln_bwd", dy, dz, rstat, b=w_next_t, b_trans=False, gamma=weight, aux=aux,
        part=part, aux_raw=aux_raw, weight_grads=weight_grads, xhat=xg if want_xg else None,
    )  # fmt: skip
    pdtype = weight.dtype if weight is not None else dy.dtype
    dweight = _sums(part, 0, pdtype) if weight_grads else dy.new_empty(_EMPTY, dtype=pdtype)
    dnorm_bias = _sums(part, 1, pdtype) if weight_grads and not rms else dy.new_empty(_EMPTY, dtype=pdtype)
    return dz, dweight, dnorm_bias, xg


gemm_norm_input_grad = torch.library.custom_op(
    "ads_norm_fusion::gemm_norm_input_grad", _gemm_norm_input_grad, mutates_args=()
)


@gemm_norm_input_grad.register_fake
def _(dy, w_next_t, aux, rstat, weight, rms, aux_raw, weight_grads, want_xg=False):
    m, n = dy.shape[0], w_next_t.shape[1]
    pdtype = weight.dtype if weight is not None else dy.dtype
    return (
        dy.new_empty((m, n)),
        dy.new_empty((n,) if weight_grads else _EMPTY, dtype=pdtype),
        dy.new_empty((n,) if weight_grads and not rms else _EMPTY, dtype=pdtype),
        dy.new_empty((m, n) if want_xg else _EMPTY),
    )


# ---------------------------------------------------------------- forward: RMSNorm over K, then GEMM
def _folded(w: Tensor, norm_weight: Tensor | None) -> Tensor:
    # γ scales the K columns of W; folding it costs one N×K pass instead of an M×K one on x. One
    # multiply in w's dtype: the product of two bf16 / fp16 values is exact in fp32, PyTorch's opmath,
    # so this rounds once, to the same bits as (w.float() * γ.float()).to(w.dtype), in 1 kernel not 4
    return w if norm_weight is None else w * norm_weight[None, :]


def _rmsnorm_linear_fwd(
    x: Tensor, norm_weight: Tensor | None, w: Tensor, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    x, wf = _aligned(x), _aligned(_folded(w, norm_weight))
    y = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    rrms = _stat(x)
    launch_rms_gemm(x, wf, y, rrms, bias=bias, eps=eps)
    return y, rrms


rmsnorm_linear_fwd = torch.library.custom_op(
    "ads_norm_fusion::rmsnorm_linear_fwd", _rmsnorm_linear_fwd, mutates_args=()
)


@rmsnorm_linear_fwd.register_fake
def _(x, norm_weight, w, bias, eps):
    return x.new_empty((x.shape[0], w.shape[0])), x.new_empty((x.shape[0],), dtype=torch.float32)


def _rmsnorm_linear_setup(ctx, inputs, output) -> None:
    x, norm_weight, w, bias, _eps = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.has_weight, ctx.has_bias = norm_weight is not None, bias is not None
    mode = rms_backward_mode()
    if mode == "auto":
        mode = "output" if x.shape[1] <= ROW_COEF_MAX_N else "cublas"
    ctx.bwd_mode = "output" if mode == "cublas" and x.shape[1] > NORM_BWD_MAX_N else mode
    # the output path saves y itself: Σ_n dy·(y − b) is its mean_K(ĝ·x̂) (see rmsnorm_linear_dx), except
    # where one tile spans the row and the dx GEMM forms that sum from its own tile
    y = output[0] if ctx.bwd_mode == "output" and x.shape[1] > ROW_COEF_MAX_N else None
    ctx.save_for_backward(x, norm_weight, w, bias, y, output[1])


def _rmsnorm_linear_backward(ctx, dy: Tensor, _drrms, eager: bool = False):
    x, norm_weight, w, bias, y, rrms = ctx.saved_tensors
    needs = ctx.needs_input_grad
    want_gamma = ctx.has_weight and needs[1]
    dw_choice = rms_weight_grad()
    dw_kernel = needs[2] and (dw_choice == "kernel" or (dw_choice == "auto" and ctx.bwd_mode == "output"))
    want_xg = needs[2] and not dw_kernel  # cuBLAS's dW reads x̂·γ, written by the dx kernel
    dx = dgamma = dw = dbias = xg = None
    if needs[0] or want_gamma:
        if ctx.bwd_mode == "cublas":  # g = dy @ w, then the RMSNorm backward over K row by row
            bwd = _norm_bwd if eager else norm_bwd
            dx, dgamma, _, _, xg = bwd(
                dy @ w, x, rrms, None, norm_weight, True, True, want_gamma, False, want_xg
            )
        elif ctx.bwd_mode == "output":
            dx_op = _rmsnorm_linear_dx if eager else rmsnorm_linear_dx
            dx, dgamma = dx_op(dy, w, x, y, rrms, norm_weight, bias, want_gamma)
        else:  # du = dy @ w, then the RMSNorm backward over K in the same kernel's epilogue
            input_grad_op = _gemm_norm_input_grad if eager else gemm_norm_input_grad
            dx, dgamma, _, xg = input_grad_op(dy, w, x, rrms, norm_weight, True, True, want_gamma, want_xg)
        dx = dx if needs[0] else None
        dgamma = dgamma if want_gamma else None
    if dw_kernel:
        dw = (_rms_dw if eager else rms_dw)(dy, x, rrms, norm_weight)
    elif needs[2]:
        if xg is None:
            xg = (_row_col_scale if eager else row_col_scale)(x, rrms, norm_weight)
        dw = dy.t() @ xg
    if ctx.has_bias and needs[3]:
        dbias = dy.sum(dim=0)
    return dx, dgamma, dw, dbias, None


def _rmsnorm_linear_dx(
    dy: Tensor,
    w: Tensor,
    x: Tensor,
    y: Tensor | None,
    rrms: Tensor,
    norm_weight: Tensor | None,
    bias: Tensor | None,
    weight_grad: bool,
) -> tuple[Tensor, Tensor]:
    """dx (and dγ) of y = RMSNorm(x)·wᵀ + b: with ĝ = γ·(dy·w) and x̂ = x·rrms,
    dx = rrms·(ĝ − x̂·mean_K(ĝ·x̂)) and mean_K(ĝ·x̂) = Σ_n dy·(y − b) / K, so one row pass over dy and
    y gives the per-row coefficient and dx is an output-tiled GEMM with a per-row epilogue. Where K <=
    ``ROW_COEF_MAX_N`` one tile spans the row and forms that sum itself: y is not read (None allowed).
    dγ = Σ_rows (dy·w)·x̂ from per-row-block partials added in a fixed order."""
    dy, w, x = _aligned(dy), _aligned(w), x.contiguous()
    m, k = x.shape
    row_coef = k <= ROW_COEF_MAX_N  # one tile spans the row: the kernel forms coef, no pass over dy, y
    coef = None
    if not row_coef:
        if y is None:
            raise ValueError(f"rmsnorm_linear_dx: K={k} > {ROW_COEF_MAX_N} needs the saved output y")
        coef = _stat(x)
        launch_row_stat(dy, coef, b=y.contiguous(), bias=bias, r=rrms, divisor=k)
    dx = torch.empty_like(x)
    part = None
    cfg = rms_gemm_config(m, k, dy.shape[1], backward=True, row_coef=row_coef)
    if weight_grad:
        part = torch.empty((cdiv(m, cfg.block_m), k), dtype=torch.float32, device=x.device)
    launch_scaled_gemm(
        dy, w, dx, rrms, b_trans=False, gamma=norm_weight, aux=x, coef=coef, part=part, row_coef=row_coef,
        cfg=cfg,
    )  # fmt: skip
    pdtype = norm_weight.dtype if norm_weight is not None else x.dtype
    dgamma = part.sum(dim=0).to(pdtype) if weight_grad else x.new_empty(_EMPTY, dtype=pdtype)
    return dx, dgamma


rmsnorm_linear_dx = torch.library.custom_op(
    "ads_norm_fusion::rmsnorm_linear_dx", _rmsnorm_linear_dx, mutates_args=()
)


@rmsnorm_linear_dx.register_fake
def _(dy, w, x, y, rrms, norm_weight, bias, weight_grad):
    pdtype = norm_weight.dtype if norm_weight is not None else x.dtype
    return x.new_empty(x.shape), x.new_empty((x.shape[1],) if weight_grad else _EMPTY, dtype=pdtype)


def _row_col_scale(x: Tensor, r: Tensor, g: Tensor | None) -> Tensor:
    """x · r[:, None] · g[None, :] in x's dtype (the RMSNorm output rmsnorm_linear's dW needs)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    launch_row_col_scale(x, r, g, out)
    return out


row_col_scale = torch.library.custom_op("ads_norm_fusion::row_col_scale", _row_col_scale, mutates_args=())


@row_col_scale.register_fake
def _(x, r, g):
    return x.new_empty(x.shape)


def _rms_dw(dy: Tensor, x: Tensor, rrms: Tensor, norm_weight: Tensor | None) -> Tensor:
    """dW (N, K) = dyᵀ·diag(rrms)·x·diag(γ) in dy's dtype, from per-split fp32 partials added in a
    fixed order (``triton._rms_dw``)."""
    dy, x = _aligned(dy), _aligned(x)
    plan = rms_dw_splits(x.shape[0], dy.shape[1], x.shape[1], x.device)
    part = torch.empty((plan.splits, dy.shape[1], x.shape[1]), dtype=torch.float32, device=x.device)
    launch_rms_dw(dy, x, rrms, norm_weight, part, plan)
    return part.sum(dim=0).to(dy.dtype)


rms_dw = torch.library.custom_op("ads_norm_fusion::rms_dw", _rms_dw, mutates_args=())


@rms_dw.register_fake
def _(dy, x, rrms, norm_weight):
    return dy.new_empty((dy.shape[1], x.shape[1]))


rmsnorm_linear_fwd.register_autograd(_rmsnorm_linear_backward, setup_context=_rmsnorm_linear_setup)


# ---------------------------------------------------------------- the eager path
# Plain eager calls (``ads_kernel_tools.dispatch.plain_eager``) skip the ops: their dispatch and
# generated autograd wrapper are host time only there (BENCHMARKS.md, Experiments). Same impls, same
# kernels, same bits.
def _eager_backward(bwd):
    """An op backward for ``eager_function``: the statistics' gradients are never read; ``eager``
    (call impls, not ops) while the gradient is still a plain tensor."""

    def backward(ctx, dy, *_stat_grads):
        if dy is None:
            return (None,) * len(ctx.needs_input_grad)
        return bwd(ctx, dy, plain_eager((dy,)))

    return backward


def _ln_eager_bwd(ctx, dy, eager):
    _check_saved(ctx)
    return _linear_norm_backward(ctx, dy, rms=False, eager=eager)


def _rms_eager_bwd(ctx, dy, eager):
    _check_saved(ctx)
    return _linear_norm_backward(ctx, dy, rms=True, eager=eager)


def _rmsnorm_linear_eager_bwd(ctx, dy, eager):
    return _rmsnorm_linear_backward(ctx, dy, None, eager)


_LN_EAGER = eager_function("_EagerLinearLayerNorm", _ln_fwd, _ln_setup, _eager_backward(_ln_eager_bwd))
_RMS_EAGER = eager_function("_EagerLinearRMSNorm", _rms_fwd, _rms_setup, _eager_backward(_rms_eager_bwd))
_RMS_LINEAR_EAGER = eager_function(
    "_EagerRMSNormLinear",
    _rmsnorm_linear_fwd,
    _rmsnorm_linear_setup,
    _eager_backward(_rmsnorm_linear_eager_bwd),
)


def _route(fn, impl, op, tensors, grad: bool, *inputs):
    """Plain eager calls run the impl (no grad wanted) or the eager autograd.Function; the rest the op."""
    if not plain_eager(tensors):
        return op(*inputs)
    return fn.apply(*inputs) if grad else impl(*inputs)


def linear_layernorm(x, w, bias, weight, norm_bias, eps: float, save_xhat: bool, grad: bool):
    """``linear_layernorm_fwd`` with autograd; ``grad``: some input needs a gradient. What is saved
    for the backward: ``config.save_prenorm``."""
    tensors = (x, w, bias, weight, norm_bias)
    raw = save_xhat and save_prenorm()
    return _route(_LN_EAGER, _ln_fwd, linear_layernorm_fwd, tensors, grad, *tensors, eps, save_xhat, raw)


def linear_rmsnorm(x, w, bias, weight, eps: float, save_xhat: bool, grad: bool):
    """``linear_rmsnorm_fwd`` with autograd; ``grad`` as :func:`linear_layernorm`."""
    tensors = (x, w, bias, weight)
    raw = save_xhat and save_prenorm()
    return _route(_RMS_EAGER, _rms_fwd, linear_rmsnorm_fwd, tensors, grad, *tensors, eps, save_xhat, raw)


def norm_input_grad(dy, w_next_t, aux, rstat, weight, rms: bool, aux_raw: bool, weight_grads: bool):
    """``gemm_norm_input_grad`` (no autograd of its own): plain eager calls on tensors that need no
    gradient run the impl, the rest the op."""
    tensors = (dy, w_next_t, aux, rstat, weight)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    fn = _gemm_norm_input_grad if not grad and plain_eager(tensors) else gemm_norm_input_grad
    return fn(*tensors, rms, aux_raw, weight_grads)[:3]


def rmsnorm_linear(x, norm_weight, w, bias, eps: float, grad: bool):
    """``rmsnorm_linear_fwd`` with autograd; ``grad`` as :func:`linear_layernorm`."""
    tensors = (x, norm_weight, w, bias)
    return _route(_RMS_LINEAR_EAGER, _rmsnorm_linear_fwd, rmsnorm_linear_fwd, tensors, grad, *tensors, eps)


# ---------------------------------------------------------------- FLOP formulas (the GEMMs; norms are O(MN))
@register_flop_formula(torch.ops.ads_norm_fusion.linear_layernorm_fwd)
def _ln_fwd_flops(x_shape, w_shape, *args, **kwargs) -> int:
    return gemm_flops(x_shape[0], w_shape[0], x_shape[1])


@register_flop_formula(torch.ops.ads_norm_fusion.linear_rmsnorm_fwd)
def _rms_fwd_flops(x_shape, w_shape, *args, **kwargs) -> int:
    return gemm_flops(x_shape[0], w_shape[0], x_shape[1])


@register_flop_formula(torch.ops.ads_norm_fusion.rmsnorm_linear_fwd)
def _rmsnorm_linear_flops(x_shape, norm_weight_shape, w_shape, *args, **kwargs) -> int:
    return gemm_flops(x_shape[0], w_shape[0], x_shape[1])


@register_flop_formula(torch.ops.ads_norm_fusion.gemm_norm_input_grad)
def _input_grad_flops(dy_shape, w_shape, *args, **kwargs) -> int:
    return gemm_flops(dy_shape[0], w_shape[1], dy_shape[1])


@register_flop_formula(torch.ops.ads_norm_fusion.rmsnorm_linear_dx)
def _rmsnorm_linear_dx_flops(dy_shape, w_shape, *args, **kwargs) -> int:
    return gemm_flops(dy_shape[0], w_shape[1], dy_shape[1])


@register_flop_formula(torch.ops.ads_norm_fusion.norm_bwd)
def _norm_bwd_flops(*args, **kwargs) -> int:
    return 0  # elementwise and row reductions only


@register_flop_formula(torch.ops.ads_norm_fusion.rms_dw)
def _rms_dw_flops(dy_shape, x_shape, *args, **kwargs) -> int:
    return gemm_flops(dy_shape[1], x_shape[1], dy_shape[0])
