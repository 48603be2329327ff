"""torch.library registration: ``ads_gdpa_megakernel::fwd`` / ``::bwd`` custom ops, fakes, autograd, FLOPs.

One op per direction for the whole chain, so the backward is fused across it: the epilogue's
backward kernel gives dy (ads-gdpa's dO and the q-residual branch's gradient at once), ads-gdpa's
backward gives dq/dk/dv, and the LayerNorm backward kernel adds dy to dq while it runs, so the sum
of the two q-gradients is never written. custom_op (not triton_op), as ads-gdpa: it runs under the
Triton interpreter, so opcheck and torch.compile(fullgraph=True) are testable on a CPU.

The forward returns what the backward needs as extra outputs (custom ops save nothing else):
``(out, a, q_ln, ln_mean, ln_rstd, rrms)``; a part that an option does not need is an empty (0,)
tensor (outputs may not alias inputs or each other, so ``a`` is empty when ``out`` is ``a``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils.flop_counter import register_flop_formula

from ads_kernel_tools.dispatch import bind_op_args, readable_host

from . import costs
from ._gdpa import gdpa_bwd, gdpa_fwd
from .triton import launch

Tensor = torch.Tensor


class FwdArgs(NamedTuple):
    """The forward op's arguments, in schema order."""

    q: Tensor
    k: Tensor
    v: Tensor
    cu_q: Tensor
    cu_k: Tensor
    max_q: int
    max_k: int
    act: int
    scale: float
    ln_weight: Tensor | None
    ln_bias: Tensor | None
    rms_weight: Tensor | None
    residual: Tensor | None
    layer_norm: bool
    q_residual: bool
    rms_norm: bool
    eps: float
    host_q: Tensor | None
    host_k: Tensor | None
    deterministic: bool


class BwdArgs(NamedTuple):
    """The backward op's arguments, in schema order."""

    dout: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    cu_q: Tensor
    cu_k: Tensor
    max_q: int
    max_k: int
    act: int
    scale: float
    ln_weight: Tensor | None
    ln_bias: Tensor | None
    rms_weight: Tensor | None
    a: Tensor
    q_ln: Tensor
    ln_mean: Tensor
    ln_rstd: Tensor
    rrms: Tensor
    layer_norm: bool
    q_residual: bool
    rms_norm: bool
    eps: float
    host_q: Tensor | None
    host_k: Tensor | None
    deterministic: bool


def _rows(t: Tensor) -> Tensor:
    """(T, H, D) -> the contiguous (T, H·D) view the row kernels take."""
    return t.contiguous().view(t.shape[0], t.shape[1] * t.shape[2])


def _has_epilogue(q_residual: bool, rms_norm: bool, has_residual: bool) -> bool:
    """Whether anything follows the attention (else ``out`` is ads-gdpa's output itself)."""
    return q_residual or rms_norm or has_residual


def fwd_impl(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, act: int,
    scale: float, ln_weight: Tensor | None, ln_bias: Tensor | None, rms_weight: Tensor | None,
    residual: Tensor | None, layer_norm: bool, q_residual: bool, rms_norm: bool, eps: float,
    host_q: Tensor | None, host_k: Tensor | None, deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Forward. q (T, H, D), k/v (Tk, H_kv, D), residual (T, H, D), weights (H·D,) ->
    (out (T, H, D), a, q_ln, ln_mean, ln_rstd, rrms); see the module docstring."""
    t, h, d = q.shape
    q = q.contiguous()

    def none(dtype=q.dtype) -> Tensor:  # a fresh empty per unused output (outputs may not alias)
        return q.new_empty((0,), dtype=dtype)

    if layer_norm:
        q_ln2, mean, rstd = launch.ln_fwd(_rows(q), ln_weight, ln_bias, eps)
        q_in = q_ln2.view(t, h, d)
    else:
        q_in, mean, rstd = q, none(torch.float32), none(torch.float32)
    a = gdpa_fwd(q_in, k, v, cu_q, cu_k, max_q, max_k, act, scale, host_q, host_k, deterministic)
    q_ln_out = q_in if layer_norm else none()
    if not _has_epilogue(q_residual, rms_norm, residual is not None):
        return a, none(), q_ln_out, mean, rstd, none(torch.float32)
    out, rrms = launch.epilogue_fwd(
        _rows(a), _rows(q_in) if q_residual else None, rms_weight,
        None if residual is None else _rows(residual), cu_q, eps, rms=rms_norm,
    )  # fmt: skip
    return out.view(t, h, d), a, q_ln_out, mean, rstd, rrms


fwd_op = torch.library.custom_op("ads_gdpa_megakernel::fwd", fwd_impl, mutates_args=())


@fwd_op.register_fake
def _(*args):
    a = FwdArgs(*args)
    t = a.q.shape[0]
    epi = _has_epilogue(a.q_residual, a.rms_norm, a.residual is not None)

    def like_q(on: bool) -> Tensor:
        return a.q.new_empty(a.q.shape if on else (0,))

    def stats(on: bool) -> Tensor:
        return a.q.new_empty((t,) if on else (0,), dtype=torch.float32)

    return (
        like_q(True),
        like_q(epi),
        like_q(a.layer_norm),
        stats(a.layer_norm),
        stats(a.layer_norm),
        stats(a.rms_norm),
    )


def bwd_impl(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
    act: int, scale: float, ln_weight: Tensor | None, ln_bias: Tensor | None, rms_weight: Tensor | None,
    a: Tensor, q_ln: Tensor, ln_mean: Tensor, ln_rstd: Tensor, rrms: Tensor, layer_norm: bool,
    q_residual: bool, rms_norm: bool, eps: float, host_q: Tensor | None, host_k: Tensor | None,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Backward: (dq, dk, dv, d ln weight, d ln bias, d rms weight); a weight gradient that does
    not apply is an empty (0,) tensor. The residual's gradient is ``dout`` (autograd passes it)."""
    t, h, d = q.shape
    q = q.contiguous()
    q_in = q_ln if layer_norm else q
    dout2 = _rows(dout)
    d_rms = None
    if rms_norm:
        dy2, d_rms = launch.epilogue_bwd(
            dout2, _rows(a), _rows(q_in) if q_residual else None, rms_weight, rrms, cu_q,
            want_w=rms_weight is not None,
        )  # fmt: skip
    else:
        dy2 = dout2
    dq_g, dk, dv = gdpa_bwd(
        dy2.view(t, h, d), q_in, k, v, cu_q, cu_k, max_q, max_k, act, scale, host_q, host_k, deterministic
    )
    d_lw = d_lb = None
    if layer_norm or q_residual:
        dq2, d_lw, d_lb = launch.q_bwd(
            _rows(dq_g), dy2 if q_residual else None, _rows(q) if layer_norm else None, ln_weight,
            ln_mean if layer_norm else None, ln_rstd if layer_norm else None,
            want_w=ln_weight is not None, want_b=ln_bias is not None,
        )  # fmt: skip
        dq = dq2.view(t, h, d)
    else:
        dq = dq_g

    def cast(g: Tensor | None, w: Tensor | None) -> Tensor:
        return q.new_empty((0,)) if g is None or w is None else g.to(w.dtype)

    return dq, dk, dv, cast(d_lw, ln_weight), cast(d_lb, ln_bias), cast(d_rms, rms_weight)


bwd_op = torch.library.custom_op("ads_gdpa_megakernel::bwd", bwd_impl, mutates_args=())


@bwd_op.register_fake
def _(*args):
    a = BwdArgs(*args)

    def wgrad(w: Tensor | None, on: bool) -> Tensor:
        return torch.empty_like(w) if (w is not None and on) else a.q.new_empty((0,))

    return (
        torch.empty_like(a.q, memory_format=torch.contiguous_format),
        torch.empty_like(a.k),
        torch.empty_like(a.v),
        wgrad(a.ln_weight, a.layer_norm),
        wgrad(a.ln_bias, a.layer_norm),
        wgrad(a.rms_weight, a.rms_norm),
    )


_TENSOR_FIELDS = ("q", "k", "v", "cu_q", "cu_k", "ln_weight", "ln_bias", "rms_weight")


def _setup_context(ctx, inputs, output) -> None:
    a = FwdArgs(*inputs)
    _, saved_a, q_ln, mean, rstd, rrms = output
    ctx.mark_non_differentiable(saved_a, q_ln, mean, rstd, rrms)
    ctx.save_for_backward(*(getattr(a, f) for f in _TENSOR_FIELDS), saved_a, q_ln, mean, rstd, rrms)
    ctx.args = a._replace(**{f: None for f in _TENSOR_FIELDS}, residual=None)
    ctx.has_residual = a.residual is not None


def _backward(ctx, dout, *_):
    a = ctx.args
    saved = ctx.saved_tensors
    tensors = dict(zip(_TENSOR_FIELDS, saved[: len(_TENSOR_FIELDS)]))
    saved_a, q_ln, mean, rstd, rrms = saved[len(_TENSOR_FIELDS) :]
    dout = dout.to(tensors["q"].dtype) if dout.dtype != tensors["q"].dtype else dout
    dq, dk, dv, d_lw, d_lb, d_rms = torch.ops.ads_gdpa_megakernel.bwd(
        dout, tensors["q"], tensors["k"], tensors["v"], tensors["cu_q"], tensors["cu_k"], a.max_q, a.max_k,
        a.act, a.scale, tensors["ln_weight"], tensors["ln_bias"], tensors["rms_weight"], saved_a, q_ln,
        mean, rstd, rrms, a.layer_norm, a.q_residual, a.rms_norm, a.eps, a.host_q, a.host_k,
        a.deterministic,
    )  # fmt: skip

    def opt(g: Tensor, w: Tensor | None) -> Tensor | None:
        return g if w is not None and g.numel() == w.numel() else None

    grads = FwdArgs(
        q=dq, k=dk, v=dv, cu_q=None, cu_k=None, max_q=None, max_k=None, act=None, scale=None,
        ln_weight=opt(d_lw, tensors["ln_weight"]), ln_bias=opt(d_lb, tensors["ln_bias"]),
        rms_weight=opt(d_rms, tensors["rms_weight"]), residual=dout if ctx.has_residual else None,
        layer_norm=None, q_residual=None, rms_norm=None, eps=None, host_q=None, host_k=None,
        deterministic=None,
    )  # fmt: skip
    return tuple(grads)


torch.library.register_autograd("ads_gdpa_megakernel::fwd", _backward, setup_context=_setup_context)


def _flops(a: FwdArgs | BwdArgs, backward: bool) -> int:
    t, h, d = a.q.shape
    pairs = costs.pair_count(
        readable_host(a.host_q), readable_host(a.host_k), a.max_q, a.max_k, a.cu_q.shape[0] - 1
    )
    return costs.flops(t, h, d, pairs, layer_norm=a.layer_norm, q_residual=a.q_residual,
                       rms_norm=a.rms_norm, backward=backward)  # fmt: skip


@register_flop_formula(torch.ops.ads_gdpa_megakernel.fwd, get_raw=True)
def _flops_fwd(*args, out_val=None, **kwargs) -> int:
    return _flops(FwdArgs(**bind_op_args(FwdArgs._fields, args, kwargs)), backward=False)


@register_flop_formula(torch.ops.ads_gdpa_megakernel.bwd, get_raw=True)
def _flops_bwd(*args, out_val=None, **kwargs) -> int:
    return _flops(BwdArgs(**bind_op_args(BwdArgs._fields, args, kwargs)), backward=True)
