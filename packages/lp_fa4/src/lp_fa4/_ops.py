"""torch.library registration: ``lp_fa4::fwd`` / ``lp_fa4::bwd`` custom ops, fakes, autograd, FLOPs.

custom_op (not triton_op) so that opcheck and torch.compile(fullgraph=True) run under the Triton
interpreter too. Every call is in varlen form: q (TQ, H, D), k/v (TK, Hkv, ·) or paged
(pages, page_size, Hkv, ·); the dense API reshapes (B, S, H, D) to (B·S, H, D) with offsets b·S.
Options travel as plain ints/floats/bools; window sides are resolved (launch.BIG = unbounded).
"""

from __future__ import annotations

import inspect

import torch
from torch.utils.flop_counter import register_flop_formula

from ads_kernel_tools.dispatch import eager_function
from ads_kernel_tools.dispatch import plain_eager as _plain_eager

from .gluon import bwd_dispatch
from .gluon import dispatch as fwd_dispatch
from .triton import launch

Tensor = torch.Tensor
_EMPTY = (0,)


def _batches(cu_q: Tensor, cu_k: Tensor | None, broadcast_q: bool) -> int:
    return (cu_k.shape[0] if broadcast_q else cu_q.shape[0]) - 1


def _out_shapes(q, v, cu_q, cu_k, broadcast_q, lse_dense):
    h = q.shape[1]
    n_b = _batches(cu_q, cu_k, broadcast_q)
    rows = n_b * q.shape[0] if broadcast_q else q.shape[0]
    out = (rows, h, v.shape[-1])
    if lse_dense:
        s = q.shape[0] // n_b if n_b > 0 else 0
        return out, (n_b, h, s)
    return out, (h, rows)


def _out_dtype(q: Tensor) -> torch.dtype:
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype


def _problem(max_q, max_k, scale, softcap, win_left, win_right, top_left, broadcast_q, rows_cap):
    return launch.Problem(
        max_q=max_q,
        max_k=max_k,
        scale=scale,
        softcap=softcap,
        win_left=win_left,
        win_right=win_right,
        top_left=top_left,
        broadcast_q=broadcast_q,
        rows_cap=rows_cap,
    )


def fwd_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_q: Tensor,
    cu_k: Tensor | None,
    used_q: Tensor | None,
    used_k: Tensor | None,
    page_table: Tensor | None,
    sink: Tensor | None,
    max_q: int,
    max_k: int,
    scale: float,
    softcap: float,
    win_left: int,
    win_right: int,
    top_left: bool,
    broadcast_q: bool,
    rows_cap: int,
    lse_dense: bool,
    zero_fill: bool,
    deterministic: bool,
    host_q: Tensor | None = None,
    host_k: Tensor | None = None,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    resident_bwd: bool = False,
    out32: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, out32): out like the query rows (broadcast_q: B·Lq rows), lse fp32 natural log, (B, H, S)
    when ``lse_dense`` else (H, rows). ``zero_fill`` pre-fills out 0 / lse -inf for rows no kernel
    program reaches (jagged rows past max_seqlen_q; the sink gradient reads every LSE row).
    ``deterministic`` is the backward's (the forward is always deterministic). ``host_q/k``: optional
    CPU copies of the offsets, read only by the FLOP formula (exact per-sequence counts).
    FP8 (float8_e4m3fn q, k, v): ``q/k/v_descale`` contiguous fp32 (B, Hkv), all three; out bf16.
    ``resident_bwd``: the backward's, like ``deterministic``: a broadcast_q call's backward runs the
    query-resident kernel (``lp_fa4.broadcast.plan``'s ``resident``, planned once by the interface);
    the backward raises if that kernel cannot take the call. ``out32``: the third output is out
    again in fp32, unrounded, which the backward's row term takes when a sink needs its gradient
    (``bwd_impl``); else it is empty."""
    out_shape, lse_shape = _out_shapes(q, v, cu_q, cu_k, broadcast_q, lse_dense)
    # the dispatcher fills them (0 / -inf) where zero_fill asks and its kernel leaves rows unwritten
    out = torch.empty(out_shape, dtype=_out_dtype(q), device=q.device)
    o32 = torch.empty(out_shape if out32 else _EMPTY, dtype=torch.float32, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    pb = _problem(max_q, max_k, scale, softcap, win_left, win_right, top_left, broadcast_q, rows_cap)
    descale = None if q_descale is None else (q_descale, k_descale, v_descale)
    fwd_dispatch.fwd(q, k, v, cu_q, cu_k, used_q, used_k, page_table, sink, pb, out, lse, lse_dense,
                     descale=descale, out32=o32 if out32 else None, prefill=zero_fill)  # fmt: skip
    return out, lse, o32


fwd_op = torch.library.custom_op("lp_fa4::fwd", fwd_impl, mutates_args=())


@fwd_op.register_fake
def _(
    q,
    k,
    v,
    cu_q,
    cu_k,
    used_q,
    used_k,
    page_table,
    sink,
    max_q,
    max_k,
    scale,
    softcap,
    win_left,
    win_right,
    top_left,
    broadcast_q,
    rows_cap,
    lse_dense,
    zero_fill,
    deterministic,
    host_q=None,
    host_k=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    resident_bwd=False,
    out32=False,
):
    out_shape, lse_shape = _out_shapes(q, v, cu_q, cu_k, broadcast_q, lse_dense)
    o32 = q.new_empty(out_shape if out32 else _EMPTY, dtype=torch.float32)
    return q.new_empty(out_shape, dtype=_out_dtype(q)), q.new_empty(lse_shape, dtype=torch.float32), o32


def _flat(lse: Tensor, lse_dense: bool) -> Tensor:
    """(B, H, S) -> (H, B·S); (H, rows) unchanged."""
    return lse.permute(1, 0, 2).reshape(lse.shape[1], -1) if lse_dense else lse


def bwd_impl(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dlse: Tensor | None,
    cu_q: Tensor,
    cu_k: Tensor,
    used_q: Tensor | None,
    used_k: Tensor | None,
    sink: Tensor | None,
    max_q: int,
    max_k: int,
    scale: float,
    softcap: float,
    win_left: int,
    win_right: int,
    top_left: bool,
    broadcast_q: bool,
    rows_cap: int,
    lse_dense: bool,
    deterministic: bool,
    host_q: Tensor | None = None,
    host_k: Tensor | None = None,
    resident_bwd: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dsink); dsink is empty when there is no sink. Options as ``fwd_impl``'s."""
    pb = _problem(max_q, max_k, scale, softcap, win_left, win_right, top_left, broadcast_q, rows_cap)
    lse_f = _flat(lse, lse_dense).contiguous()
    dlse_f = _flat(dlse, lse_dense).float().contiguous() if dlse is not None else None
    do = do if do.stride(-1) == 1 else do.contiguous()
    if sink is not None and out.dtype != torch.float32:
        # d sink_h = Σ_i p_i (dLSE_i - dO_i·O_i), p_i = exp(sink_h - LSE_i). With O rounded to the
        # input dtype (as FA4 takes it), dO_i·O_i carried that rounding into the gradient where the
        # sum over the rows cancels (2.9 % off in bf16 on a case random testing found, PyTorch's
        # bf16 math 0.02 %), and into dQ where one key dominates a row: the row term takes O in
        # fp32. The interface's forward keeps it (``fwd_impl``'s out32, which the autograd context
        # hands over as ``out``) when the sink needs a gradient; a caller of the op that did not
        # ask for it gets the forward run again here.
        o32 = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
        fwd_dispatch.fwd(q, k, v, cu_q, cu_k, used_q, used_k, None, sink, pb, torch.empty_like(out),
                         torch.empty_like(lse), lse_dense, out32=o32)  # fmt: skip
        out = o32
    dq, dk, dv, delta = bwd_dispatch.bwd(
        do, q, k, v, out, lse_f, dlse_f, cu_q, cu_k, used_q, used_k, pb, deterministic, resident=resident_bwd
    )
    if sink is None:
        return dq, dk, dv, q.new_empty(_EMPTY)
    # rows with LSE -inf (not computed, no sequence) carry no probability; delta = dO·O - dLSE
    live = torch.isfinite(lse_f)
    p = torch.where(live, torch.exp(sink.float()[:, None] - lse_f.masked_fill(~live, 0.0)), 0.0)
    dsink = -(p * delta.masked_fill(~live, 0.0)).sum(1)
    return dq, dk, dv, dsink.to(sink.dtype)


bwd_op = torch.library.custom_op("lp_fa4::bwd", bwd_impl, mutates_args=())


@bwd_op.register_fake
def _(
    do,
    q,
    k,
    v,
    out,
    lse,
    dlse,
    cu_q,
    cu_k,
    used_q,
    used_k,
    sink,
    max_q,
    max_k,
    scale,
    softcap,
    win_left,
    win_right,
    top_left,
    broadcast_q,
    rows_cap,
    lse_dense,
    deterministic,
    host_q=None,
    host_k=None,
    resident_bwd=False,
):
    dsink = torch.empty_like(sink) if sink is not None else q.new_empty(_EMPTY)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsink


# lp_fa4::fwd's inputs by name: positions and defaults from fwd_impl's signature (plain eager calls
# may leave out the trailing defaulted ones)
_FWD_PARAMS = tuple(inspect.signature(fwd_impl).parameters.values())
_FWD_AT = {p.name: i for i, p in enumerate(_FWD_PARAMS)}


def _span(*names: str) -> slice:
    """The slice of lp_fa4::fwd's inputs that holds ``names``, consecutive in its signature: computed
    once, so the per-call paths below slice instead of looking names up."""
    at = [_FWD_AT[n] for n in names]
    assert at == list(range(at[0], at[0] + len(at))), names
    return slice(at[0], at[-1] + 1)


_OPTS = _span("max_q", "max_k", "scale", "softcap", "win_left", "win_right", "top_left", "broadcast_q",
              "rows_cap", "lse_dense")  # fmt: skip
_DESCALES = _span("q_descale", "k_descale", "v_descale")


def fwd_input(inputs, name: str):
    """lp_fa4::fwd's input ``name`` from a call's positional ``inputs``."""
    i = _FWD_AT[name]
    return inputs[i] if i < len(inputs) else _FWD_PARAMS[i].default


def fwd_input_index(name: str) -> int:
    """The position of lp_fa4::fwd's input ``name`` (in its inputs, and in the gradients its backward
    returns)."""
    return _FWD_AT[name]


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_q, cu_k, used_q, used_k, page_table, sink = inputs[:9]
    out, lse, out32 = output
    # the unrounded copy, when the forward kept one, is what the backward's row term reads
    out = out32 if fwd_input(inputs, "out32") else out
    ctx.paged = page_table is not None
    descale = tuple(inputs[_DESCALES]) + (None,) * (3 - len(inputs[_DESCALES]))  # FP8 only
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, used_q, used_k, sink, *descale)
    ctx.opts = tuple(inputs[_OPTS])
    ctx.deterministic = fwd_input(inputs, "deterministic")
    ctx.host = (fwd_input(inputs, "host_q"), fwd_input(inputs, "host_k"))
    ctx.resident_bwd = bool(fwd_input(inputs, "resident_bwd"))
    ctx.n_inputs = len(inputs)


def bwd_call(ctx, dout, dlse, q, k, v, out, lse, cu_q, cu_k, used_q, used_k, sink):
    """The backward kernels for one forward (its options in ``ctx``): (dq, dk, dv, dsink)."""
    if dout is None:
        dout = torch.zeros(out.shape, dtype=_out_dtype(q), device=out.device)
    max_q, max_k, scale, softcap, wl, wr, top_left, bq, rows_cap, lse_dense = ctx.opts
    # a dispatch mode entered after the forward (FlopCounterMode around backward) sees the op
    bwd = bwd_impl if getattr(ctx, "eager", False) and _plain_eager((dout, dlse)) else torch.ops.lp_fa4.bwd
    return bwd(
        dout,
        q,
        k,
        v,
        out,
        lse,
        dlse,
        cu_q,
        cu_k,
        used_q,
        used_k,
        sink,
        max_q,
        max_k,
        scale,
        softcap,
        wl,
        wr,
        top_left,
        bq,
        rows_cap,
        lse_dense,
        ctx.deterministic,
        *ctx.host,
        ctx.resident_bwd,
    )


def _backward(ctx, dout, dlse, _dout32=None):
    if ctx.paged:
        raise NotImplementedError("lp_fa4: the backward of paged KV (page_table) is not implemented")
    saved = ctx.saved_tensors
    if saved[0].dtype == torch.float8_e4m3fn:  # gradients of the dequantised inputs (fp8_bwd)
        from . import fp8_bwd

        return fp8_bwd.op_backward(ctx, dout, dlse)
    q, k, v, out, lse, cu_q, cu_k, used_q, used_k, sink = saved[:10]
    # the backward kernels read the sink through the LSE; the op gets it only for its gradient
    needs = getattr(ctx, "needs_input_grad", None)
    sink_grad = sink if sink is not None and (needs is None or needs[fwd_input_index("sink")]) else None
    dq, dk, dv, dsink = bwd_call(ctx, dout, dlse, q, k, v, out, lse, cu_q, cu_k, used_q, used_k, sink_grad)
    grads = (dq, dk, dv) + (None,) * 5 + (dsink if sink_grad is not None else None,)
    return grads + (None,) * (ctx.n_inputs - len(grads))


torch.library.register_autograd("lp_fa4::fwd", _backward, setup_context=_setup_context)


# plain eager calls: the op's dispatch and generated autograd wrapper cost ~330 us of host time per
# differentiable call on a CPU build (430 against 100 us without grad, kernels stubbed), more than the
# GPU work of small batches. Same kernels, same bits.
_EagerAttention = eager_function("_EagerAttention", fwd_impl, _setup_context, _backward)


def _needs_grad(inputs) -> bool:
    """Whether autograd would record the call: grad mode on and a differentiable input (q, k, v,
    the sink, the FP8 descales) that requires grad."""
    if not torch.is_grad_enabled():
        return False
    for t in inputs[:3] + (inputs[8],) + tuple(inputs[_DESCALES]):  # a loop, not any(<genexpr>)
        if t is not None and t.requires_grad:
            return True
    return False


def attention(*inputs) -> tuple[Tensor, Tensor, Tensor]:
    """``lp_fa4::fwd`` with autograd, arguments and outputs as the op's: plain eager calls take
    ``_EagerAttention`` (or, when autograd records nothing, ``fwd_impl`` itself: the Function's
    apply costs host time and adds nothing then), everything else (compile, fake tensors,
    dispatch modes) the custom op."""
    if _plain_eager(inputs[:9]):
        if not _needs_grad(inputs):
            return fwd_impl(*inputs)
        return _EagerAttention.apply(*inputs)
    return torch.ops.lp_fa4.fwd(*inputs)


def _pairs(max_q, max_k, n_b, win_left, win_right, top_left) -> int:
    """Query-key pairs computed for B sequences of max_q x max_k (the bound when lengths vary)."""
    if max_q <= 0 or max_k <= 0:
        return 0
    left = None if win_left >= launch.BIG else win_left
    right = None if win_right >= launch.BIG else win_right
    if left is None and right is None:
        return n_b * max_q * max_k
    from ads_kernel_tools.bench.flops import valid_pairs

    if top_left:  # the jagged symmetric band |i - j| <= W
        if left != right or left is None:
            return n_b * max_q * max_k
        return n_b * valid_pairs(max_q, max_k, symmetric_window=left)
    return n_b * valid_pairs(max_q, max_k, window=(left, right))


def _readable(host) -> list[int] | None:
    """Host offsets as ints, or None where they are not real CPU data (fake or meta tensors)."""
    if host is None or not isinstance(host, Tensor) or host.device.type != "cpu":
        return None
    try:
        return [int(x) for x in host.tolist()]
    except Exception:  # fake tensors raise on data access: the caller falls back to the bound
        return None


def _exact_pairs(hq, hk, max_q, max_k, win_left, win_right, top_left, broadcast_q) -> int:
    """Σ_b pairs the kernels compute, per sequence (rows capped at max_q, keys at max_k)."""
    from ads_kernel_tools.bench.flops import valid_pairs

    lk = [min(b - a, max_k) for a, b in zip(hk[:-1], hk[1:])]
    lq = [hq[1] - hq[0]] * len(lk) if broadcast_q else [b - a for a, b in zip(hq[:-1], hq[1:])]
    left = None if win_left >= launch.BIG else win_left
    right = None if win_right >= launch.BIG else win_right
    total = 0
    for a, c in zip(lq, lk):
        if a <= 0 or c <= 0:
            continue
        if left is None and right is None:
            total += min(a, max_q) * c
        elif top_left and left == right:
            total += valid_pairs(a, c, symmetric_window=left, q_rows=max_q)
        else:
            total += valid_pairs(a, c, window=(left, right), q_rows=max_q)
    return total


def fwd_flops(q, v, cu_q, cu_k, max_q, max_k, win_left, win_right, top_left, broadcast_q, host_q=None,
              host_k=None) -> int:  # fmt: skip
    """2·H·(D + Dv)·pairs: exact per sequence with host offsets, else the B x max_q x max_k bound."""
    hq, hk = _readable(host_q), _readable(host_k)
    if hq is not None and hk is not None:
        pairs = _exact_pairs(hq, hk, max_q, max_k, win_left, win_right, top_left, broadcast_q)
    else:
        pairs = _pairs(max_q, max_k, _batches(cu_q, cu_k, broadcast_q), win_left, win_right, top_left)
    return 2 * q.shape[1] * (q.shape[-1] + v.shape[-1]) * pairs


@register_flop_formula(torch.ops.lp_fa4.fwd, get_raw=True)
def _flops_fwd(q, k, v, cu_q, cu_k, used_q, used_k, page_table, sink, max_q, max_k, scale, softcap,
               win_left, win_right, top_left, broadcast_q, *rest, out_val=None, **kw) -> int:  # fmt: skip
    host_q, host_k = (rest[4], rest[5]) if len(rest) > 5 else (kw.get("host_q"), kw.get("host_k"))
    return fwd_flops(
        q, v, cu_q, cu_k, max_q, max_k, win_left, win_right, top_left, broadcast_q, host_q, host_k
    )


@register_flop_formula(torch.ops.lp_fa4.bwd, get_raw=True)
def _flops_bwd(do, q, k, v, out, lse, dlse, cu_q, cu_k, used_q, used_k, sink, max_q, max_k, scale, softcap,
               win_left, win_right, top_left, broadcast_q, *rest, out_val=None, **kw) -> int:  # fmt: skip
    host_q, host_k = (rest[3], rest[4]) if len(rest) > 4 else (kw.get("host_q"), kw.get("host_k"))
    args = (q, v, cu_q, cu_k, max_q, max_k, win_left, win_right, top_left, broadcast_q, host_q, host_k)
    return int(2.5 * fwd_flops(*args))
