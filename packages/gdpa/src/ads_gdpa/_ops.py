"""torch.library registration: ``ads_gdpa::fwd`` / ``ads_gdpa::bwd`` custom ops, fakes, autograd, FLOPs.

custom_op (not triton_op): it runs under the Triton interpreter too, so opcheck and
torch.compile(fullgraph=True) are testable on CPU. The op schemas are flat (tensors, ints, floats,
lists); inside Python the arguments travel as the named tuples ``FwdArgs`` / ``BwdArgs``, whose field
order is the schema's. Host offsets (``host_q``/``host_k``) are optional CPU int64 tensors: real data
inside the op even under torch.compile (where they stay graph inputs instead of constants that would
recompile), read there for value checks, the tile scheduler and the FLOP formula without a device
sync.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.autograd.function import once_differentiable
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode
from torch.utils.flop_counter import register_flop_formula

from ads_kernel_tools.bench.flops import valid_pairs

from . import dispatch
from .problem import (
    BIG,
    MaskMode,
    Problem,
    check_descales,
    check_offsets,
    grad_buffers,
    out_rows,
    safe_offsets,
    spans,
)
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
    act_per_head: list[int] | None
    scale: float
    mask_mode: int
    win_left: int
    win_right: int
    broadcast_q: bool
    q_descale: Tensor | None
    k_descale: Tensor | None
    v_descale: Tensor | None
    host_q: Tensor | None
    host_k: Tensor | None
    deterministic: bool


class BwdArgs(NamedTuple):
    """The backward op's arguments, in schema order."""

    do: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    cu_q: Tensor
    cu_k: Tensor
    max_q: int
    max_k: int
    act: int
    act_per_head: list[int] | None
    scale: float
    mask_mode: int
    win_left: int
    win_right: int
    broadcast_q: bool
    deterministic: bool
    host_q: Tensor | None
    host_k: Tensor | None


_FWD_TENSORS = ("q", "k", "v", "cu_q", "cu_k", "q_descale", "k_descale", "v_descale", "host_q", "host_k")


@functools.lru_cache(maxsize=64)
def _act_table(acts: tuple[int, ...], device: str) -> Tensor:
    return torch.tensor(acts, dtype=torch.int32, device=device)


def _host_list(host: Tensor | None) -> tuple[int, ...] | None:
    return tuple(host.tolist()) if host is not None else None  # a CPU tensor: no device sync


def _problem(a: FwdArgs | BwdArgs) -> Problem:
    return Problem(
        max_q=a.max_q, max_k=a.max_k, act=a.act, scale=a.scale, mask=MaskMode(a.mask_mode),
        win_left=a.win_left, win_right=a.win_right, broadcast_q=a.broadcast_q,
        host_q=_host_list(a.host_q), host_k=_host_list(a.host_k),
    )  # fmt: skip


def _call(a: FwdArgs | BwdArgs, dtype: torch.dtype) -> dispatch.Call:
    return dispatch.Call(
        act=a.act, d_qk=a.q.shape[2], d_v=a.v.shape[2], dtype=dtype, mask=MaskMode(a.mask_mode),
        broadcast_q=a.broadcast_q, per_head=a.act_per_head is not None, deterministic=a.deterministic,
    )  # fmt: skip


def _safe(a: FwdArgs | BwdArgs) -> tuple[Tensor, Tensor, int | None]:
    """Offsets the kernels may trust (``problem.safe_offsets``) and the longest host query sequence."""
    longest_q, _ = check_offsets(a.q, a.k, a.cu_q, a.cu_k, a.host_q, a.host_k, a.max_k, a.broadcast_q)
    checked = a.host_q is not None and a.host_k is not None
    cu_q, cu_k = safe_offsets(a.q, a.k, a.cu_q, a.cu_k, checked)
    return cu_q, cu_k, longest_q


def fwd_impl(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, act: int,
    act_per_head: list[int] | None, scale: float, mask_mode: int, win_left: int, win_right: int,
    broadcast_q: bool, q_descale: Tensor | None, k_descale: Tensor | None, v_descale: Tensor | None,
    host_q: Tensor | None, host_k: Tensor | None, deterministic: bool,
) -> Tensor:  # fmt: skip
    """Forward. q (Tq, H, Dqk), k (Tk, Hkv, Dqk), v (Tk, Hkv, Dv) -> out (To, H, Dv).

    mask_mode: ``MaskMode``. ``deterministic`` only affects the backward (dQ by a second pass
    instead of atomics). FP8 inputs (descales given) give a bf16 output.
    """
    a = FwdArgs(
        q, k, v, cu_q, cu_k, max_q, max_k, act, act_per_head, scale, mask_mode, win_left, win_right,
        broadcast_q, q_descale, k_descale, v_descale, host_q, host_k, deterministic,
    )  # fmt: skip
    cu_q, cu_k, longest_q = _safe(a)
    fp8 = q_descale is not None
    out_dtype = torch.bfloat16 if fp8 else q.dtype
    out = torch.empty(
        (out_rows(q, cu_k, broadcast_q), q.shape[1], v.shape[2]), dtype=out_dtype, device=q.device
    )
    descale = (q_descale, k_descale, v_descale) if fp8 else None
    if fp8:
        check_descales(descale)
    if dispatch.backend_for("fwd", q.device, _call(a, q.dtype)) == "gluon":
        kernel = dispatch.kernel("gluon", q.device, "fwd")
        extra = {"descale": descale} if fp8 else {}
        kernel(q, k, v, cu_q, cu_k, max_q, max_k, act, scale, out, longest_q=longest_q, **extra)
        return out
    tbl = _act_table(tuple(act_per_head), str(q.device)) if act_per_head is not None else None
    return launch.fwd(q, k, v, cu_q, cu_k, _problem(a), out, act_tbl=tbl, descale=descale)


gdpa_fwd_op = torch.library.custom_op("ads_gdpa::fwd", fwd_impl, mutates_args=())


@gdpa_fwd_op.register_fake
def _(*args):
    a = FwdArgs(*args)
    out_dtype = torch.bfloat16 if a.q_descale is not None else a.q.dtype
    return a.q.new_empty((out_rows(a.q, a.cu_k, a.broadcast_q), a.q.shape[1], a.v.shape[2]), dtype=out_dtype)


def bwd_impl(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
    act: int, act_per_head: list[int] | None, scale: float, mask_mode: int, win_left: int, win_right: int,
    broadcast_q: bool, deterministic: bool, host_q: Tensor | None, host_k: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Backward: (dq, dk, dv) shaped like (q, k, v); do (To, H, Dv)."""
    a = BwdArgs(
        do, q, k, v, cu_q, cu_k, max_q, max_k, act, act_per_head, scale, mask_mode, win_left, win_right,
        broadcast_q, deterministic, host_q, host_k,
    )  # fmt: skip
    cu_q, cu_k, _ = _safe(a)
    do = do.contiguous() if do.stride(-1) != 1 else do
    if dispatch.backend_for("bwd", q.device, _call(a, q.dtype)) == "gluon" and do.dtype == q.dtype:
        covered = (spans(host_q, q.shape[0]), spans(host_k, k.shape[0]))
        dq_acc, dk, dv = grad_buffers(q, k, v, covered, deterministic=False)
        kernel = dispatch.kernel("gluon", q.device, "bwd")
        kernel(do, q, k, v, cu_q, cu_k, max_q, max_k, act, scale, dq_acc, dk, dv)
        return dq_acc.to(q.dtype), dk, dv
    tbl = _act_table(tuple(act_per_head), str(q.device)) if act_per_head is not None else None
    return launch.bwd(do, q, k, v, cu_q, cu_k, _problem(a), act_tbl=tbl, deterministic=deterministic)


gdpa_bwd_op = torch.library.custom_op("ads_gdpa::bwd", bwd_impl, mutates_args=())


@gdpa_bwd_op.register_fake
def _(*args):
    a = BwdArgs(*args)
    return torch.empty_like(a.q), torch.empty_like(a.k), torch.empty_like(a.v)


def _setup_context(ctx, inputs, output) -> None:
    a = FwdArgs(*inputs)
    ctx.save_for_backward(a.q, a.k, a.v, a.cu_q, a.cu_k)
    ctx.args = a._replace(q=None, k=None, v=None, cu_q=None, cu_k=None)


def _backward_args(ctx, do) -> BwdArgs:
    a = ctx.args
    if a.q_descale is not None:
        raise NotImplementedError("ads_gdpa: the FP8 path is forward-only")
    q, k, v, cu_q, cu_k = ctx.saved_tensors
    return BwdArgs(
        do=do, q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_q=a.max_q, max_k=a.max_k, act=a.act,
        act_per_head=a.act_per_head, scale=a.scale, mask_mode=a.mask_mode, win_left=a.win_left,
        win_right=a.win_right, broadcast_q=a.broadcast_q, deterministic=a.deterministic, host_q=a.host_q,
        host_k=a.host_k,
    )  # fmt: skip


_NO_GRAD = (None,) * (len(FwdArgs._fields) - 3)


def _backward(ctx, do):
    dq, dk, dv = torch.ops.ads_gdpa.bwd(*_backward_args(ctx, do))
    return (dq, dk, dv) + _NO_GRAD


torch.library.register_autograd("ads_gdpa::fwd", _backward, setup_context=_setup_context)


class _EagerGDPA(torch.autograd.Function):
    """The same forward and backward as the custom op, for plain eager calls: the custom op's
    dispatch and generated autograd wrapper cost ~115 us of host time per forward (measured on a CPU
    build), more than the GPU work of small batches."""

    @staticmethod
    def forward(ctx, *inputs):
        out = fwd_impl(*inputs)
        _setup_context(ctx, inputs, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        args = _backward_args(ctx, do)
        # a dispatch mode may have been entered since the forward (FlopCounterMode around backward)
        plain = _plain_eager((args.do, args.q, args.k, args.v, args.cu_q, args.cu_k))
        grads = bwd_impl(*args) if plain else torch.ops.ads_gdpa.bwd(*args)
        return (*grads, *_NO_GRAD)


def _plain_eager(tensors) -> bool:
    """True outside torch.compile / export / tracing, with no dispatch mode (FlopCounterMode, fake
    tensors) or functorch transform active and only plain tensors: there the custom op adds nothing
    but host time. Everywhere else the op goes through the dispatcher."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or _current_dispatch_mode() is not None:
        return False
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    return all(t is None or type(t) is Tensor for t in tensors)


def gdpa_fwd(*inputs) -> Tensor:
    """``ads_gdpa::fwd`` with autograd; arguments as the op's (``FwdArgs``). Plain eager calls take
    ``_EagerGDPA``, the rest the registered custom op (same kernels, same results)."""
    a = FwdArgs(*inputs)
    if _plain_eager([getattr(a, name) for name in _FWD_TENSORS]):
        return _EagerGDPA.apply(*inputs)
    return torch.ops.ads_gdpa.fwd(*inputs)


def pair_count(
    host_q,
    host_k,
    max_q: int,
    max_k: int,
    n_b: int,
    broadcast_q: bool,
    mask_mode: int,
    win_left: int,
    win_right: int,
) -> int:
    """Σ_b the (query, key) pairs the mask allows among queries i < min(Lq_b, max_q): exact per
    sequence with host offsets (``ads_kernel_tools.bench.flops.valid_pairs``), else the max-length
    bound."""
    if host_q is not None and host_k is not None:
        lk = [host_k[i + 1] - host_k[i] for i in range(len(host_k) - 1)]
        if broadcast_q:
            lq = [host_q[1] - host_q[0]] * len(lk)
        else:
            lq = [host_q[i + 1] - host_q[i] for i in range(len(host_q) - 1)]
    else:
        lq, lk = [max_q] * n_b, [max_k] * n_b
    mode = MaskMode(mask_mode)
    total = 0
    for a, c in zip(lq, lk):
        rows = min(a, max_q)
        if mode == MaskMode.NONE:
            total += max(rows, 0) * max(c, 0)
        elif mode == MaskMode.TOP_LEFT:
            total += valid_pairs(a, c, symmetric_window=win_left, q_rows=rows)
        else:
            window = (
                None if win_left >= BIG else win_left,
                None if win_right >= BIG else win_right,
            )
            total += valid_pairs(a, c, window=window, q_rows=rows)
    return total


def _readable(host) -> tuple[int, ...] | None:
    """Host offsets as ints, or None where they are not real data (fake or meta tensors)."""
    if host is None or not isinstance(host, Tensor) or host.device.type != "cpu":
        return None
    if isinstance(host, FakeTensor):
        return None
    return tuple(host.tolist())


def _fwd_flops(a: FwdArgs | BwdArgs) -> int:
    n_b = a.cu_k.shape[0] - 1
    hq, hk = _readable(a.host_q), _readable(a.host_k)
    pairs = pair_count(hq, hk, a.max_q, a.max_k, n_b, a.broadcast_q, a.mask_mode, a.win_left, a.win_right)
    return 2 * a.q.shape[1] * (a.q.shape[2] + a.v.shape[2]) * pairs


def _bind(fields: tuple[str, ...], args, kwargs) -> dict:
    bound = dict(zip(fields, args))
    bound.update({k: v for k, v in kwargs.items() if k in fields})
    for name in fields:
        bound.setdefault(name, None)
    return bound


@register_flop_formula(torch.ops.ads_gdpa.fwd, get_raw=True)
def _flops_fwd(*args, out_val=None, **kwargs) -> int:
    return _fwd_flops(FwdArgs(**_bind(FwdArgs._fields, args, kwargs)))


@register_flop_formula(torch.ops.ads_gdpa.bwd, get_raw=True)
def _flops_bwd(*args, out_val=None, **kwargs) -> int:
    return int(2.5 * _fwd_flops(BwdArgs(**_bind(BwdArgs._fields, args, kwargs))))
