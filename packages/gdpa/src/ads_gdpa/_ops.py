"""torch.library registration: ``ads_gdpa::fwd`` / ``ads_gdpa::bwd`` custom ops, fakes, autograd, FLOPs.

custom_op (not triton_op): it runs under the Triton interpreter too, so opcheck and
torch.compile(fullgraph=True) are testable on CPU. Non-tensor options travel as ints/floats/lists;
host offsets (``host_q``/``host_k``) are optional CPU int64 tensors: real data inside the op even
under torch.compile (where they stay graph inputs instead of constants that would recompile), read
there for value checks, the tile scheduler and the FLOP formula without a device sync.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch.autograd.function import once_differentiable
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode
from torch.utils.flop_counter import register_flop_formula

from . import config as cfg
from .triton import launch

Tensor = torch.Tensor


@functools.lru_cache(maxsize=64)
def _act_table(acts: tuple[int, ...], device: str) -> Tensor:
    return torch.tensor(acts, dtype=torch.int32, device=device)


def _host_list(host: Tensor | None) -> tuple[int, ...] | None:
    return tuple(host.tolist()) if host is not None else None  # a CPU tensor: no device sync


def check_host_offsets(
    q: Tensor, k: Tensor, host_q: Tensor | None, host_k: Tensor | None, max_k: int, broadcast_q: bool
) -> tuple[int | None, int | None]:
    """Value checks that need the offsets themselves; raised from inside the op so that they also
    hold under torch.compile, where the Python wrapper only sees fake tensors. Vectorised in numpy
    over the CPU tensors: a Python loop over B = 1152 offsets cost 0.5 ms per call, torch ops on
    them ~60 us, more than the GPU work of short batches. Returns the longest query and key
    sequences (None without host offsets)."""
    longest = []
    for name, host, rows in (("cu_seqlens_q", host_q, q.shape[0]), ("cu_seqlens_k", host_k, k.shape[0])):
        if host is None:
            longest.append(None)
            continue
        h = host.numpy()
        lengths = np.diff(h)
        if lengths.size and lengths.min() < 0:
            raise ValueError(f"ads_gdpa: {name} must be non-decreasing, got {h[:8].tolist()}")
        first, last = int(h[0]), int(h[-1])
        if first < 0 or last > rows:
            raise ValueError(f"ads_gdpa: {name} spans [{first}, {last}] but the tensor has {rows} rows")
        longest.append(int(lengths.max()) if lengths.size else None)
    if broadcast_q and host_q is not None and (int(host_q[0]) != 0 or int(host_q[1]) != q.shape[0]):
        raise ValueError(
            f"ads_gdpa: broadcast_q needs cu_seqlens_q == [0, {q.shape[0]}], got {host_q.tolist()}"
        )
    longest_q, longest_k = longest
    if longest_k is not None and longest_k > max_k:
        raise ValueError(f"ads_gdpa: a key sequence has {longest_k} rows > max_seqlen_k={max_k}")
    return longest_q, longest_k


def _problem(max_q, max_k, act, scale, mask_mode, win_left, win_right, broadcast_q, hq, hk):
    return launch.Problem(
        max_q=max_q, max_k=max_k, act=act, scale=scale, has_window=mask_mode != 0,
        bottom_right=mask_mode == 2, win_left=win_left, win_right=win_right, broadcast_q=broadcast_q,
        host_q=hq, host_k=hk,
    )  # fmt: skip


def _out_rows(q: Tensor, cu_k: Tensor, broadcast_q: bool) -> int:
    # broadcast_q: q holds the one shared sequence, the output repeats it per kv sequence
    return (cu_k.shape[0] - 1) * q.shape[0] if broadcast_q else q.shape[0]


def _gluon(backend: str, q: Tensor):
    """The ``ads_gdpa.gluon`` package when the Hopper kernels may run for this call (the backend
    switch allows them, a CUDA tensor, no interpreter, Gluon importable, an sm90 device), else None."""
    if backend == "triton" or q.device.type != "cuda" or cfg.interpreter_active():
        return None
    try:
        from . import gluon
    except Exception:
        return None
    return gluon if gluon.available() else None


def _try_gluon_fwd(q, k, v, cu_q, cu_k, max_q, max_k, act, scale, out, opts, longest_q) -> bool:
    """Forward through the Gluon Hopper kernel when allowed by ADS_GDPA_BACKEND and supported."""
    gluon = _gluon(cfg.backend(), q)
    try:
        if gluon is None or not gluon.supports(q, k, v, **opts):
            return False
    except Exception:
        return False
    from .gluon import fwd_sm90

    fwd_sm90.gdpa_fwd_gluon(q, k, v, cu_q, cu_k, max_q, max_k, act, scale, out, longest_q=longest_q)
    return True


def _try_gluon_bwd(do, q, k, v, cu_q, cu_k, max_q, max_k, act, scale, host_q, host_k):
    """(dq, dk, dv) from the Gluon Hopper kernel when allowed by ADS_GDPA_BWD_BACKEND and supported
    (the caller rules out masks, broadcast_q, per-head activations and the deterministic mode), else
    None."""
    gluon = _gluon(cfg.bwd_backend(), q)
    if gluon is None or not gluon.supports_backward(do, q, k, v, activation_id=act):
        return None  # before allocating: the Triton path allocates its own buffers
    covered = (launch.spans(host_q, q.shape[0]), launch.spans(host_k, k.shape[0]))
    dq_acc, dk, dv = launch.grad_buffers(q, k, v, covered, deterministic=False)
    if not gluon.try_backward(do, q, k, v, cu_q, cu_k, max_q, max_k, act, scale, dq_acc, dk, dv):
        return None
    return dq_acc.to(q.dtype), dk, dv


def fwd_impl(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, act: int,
    act_per_head: list[int] | None, scale: float, mask_mode: int, win_left: int, win_right: int,
    broadcast_q: bool, q_descale: Tensor | None, k_descale: Tensor | None, v_descale: Tensor | None,
    host_q: Tensor | None, host_k: Tensor | None, deterministic: bool,
) -> Tensor:  # fmt: skip
    """Forward. q (Tq, H, Dqk), k (Tk, Hkv, Dqk), v (Tk, Hkv, Dv) -> out (To, H, Dv).

    mask_mode: 0 none, 1 top-left symmetric window, 2 bottom-right band (causal/local).
    ``deterministic`` only affects the backward (dQ by a second pass instead of atomics).
    """
    longest_q, _ = check_host_offsets(q, k, host_q, host_k, max_k, broadcast_q)
    fp8 = q_descale is not None
    out_dtype = torch.bfloat16 if fp8 else q.dtype
    rows = _out_rows(q, cu_k, broadcast_q)
    out = torch.empty((rows, q.shape[1], v.shape[2]), dtype=out_dtype, device=q.device)
    opts = dict(activation_id=act, window=mask_mode != 0, broadcast_q=broadcast_q, fp8=fp8)
    gluon_args = (q, k, v, cu_q, cu_k, max_q, max_k, act, scale, out, opts, longest_q)
    if act_per_head is None and _try_gluon_fwd(*gluon_args):
        return out
    hq, hk = _host_list(host_q), _host_list(host_k)
    pb = _problem(max_q, max_k, act, scale, mask_mode, win_left, win_right, broadcast_q, hq, hk)
    tbl = _act_table(tuple(act_per_head), str(q.device)) if act_per_head is not None else None
    descale = (q_descale, k_descale, v_descale) if fp8 else None
    return launch.fwd(q, k, v, cu_q, cu_k, pb, out, act_tbl=tbl, descale=descale)


gdpa_fwd_op = torch.library.custom_op("ads_gdpa::fwd", fwd_impl, mutates_args=())


@gdpa_fwd_op.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, act, act_per_head, scale, mask_mode, win_left, win_right,
      broadcast_q, q_descale, k_descale, v_descale, host_q, host_k, deterministic):  # fmt: skip
    out_dtype = torch.bfloat16 if q_descale is not None else q.dtype
    return q.new_empty((_out_rows(q, cu_k, broadcast_q), q.shape[1], v.shape[2]), dtype=out_dtype)


def bwd_impl(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
    act: int, act_per_head: list[int] | None, scale: float, mask_mode: int, win_left: int, win_right: int,
    broadcast_q: bool, deterministic: bool, host_q: Tensor | None, host_k: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Backward: (dq, dk, dv) shaped like (q, k, v); do (To, H, Dv)."""
    if act_per_head is None and mask_mode == 0 and not (broadcast_q or deterministic):
        grads = _try_gluon_bwd(do, q, k, v, cu_q, cu_k, max_q, max_k, act, scale, host_q, host_k)
        if grads is not None:
            return grads
    hq, hk = _host_list(host_q), _host_list(host_k)  # only the Triton path reads them all
    pb = _problem(max_q, max_k, act, scale, mask_mode, win_left, win_right, broadcast_q, hq, hk)
    tbl = _act_table(tuple(act_per_head), str(q.device)) if act_per_head is not None else None
    return launch.bwd(do, q, k, v, cu_q, cu_k, pb, act_tbl=tbl, deterministic=deterministic)


gdpa_bwd_op = torch.library.custom_op("ads_gdpa::bwd", bwd_impl, mutates_args=())


@gdpa_bwd_op.register_fake
def _(do, q, k, v, cu_q, cu_k, max_q, max_k, act, act_per_head, scale, mask_mode, win_left, win_right,
      broadcast_q, deterministic, host_q, host_k):  # fmt: skip
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_q, cu_k = inputs[:5]
    ctx.save_for_backward(q, k, v, cu_q, cu_k)
    ctx.opts = inputs[5:14]
    ctx.fp8 = inputs[14] is not None
    ctx.host = inputs[17:19]
    ctx.deterministic = inputs[19]


def _backward_args(ctx, do) -> tuple:
    if ctx.fp8:
        raise NotImplementedError("ads_gdpa: the FP8 path is forward-only")
    q, k, v, cu_q, cu_k = ctx.saved_tensors
    return (do, q, k, v, cu_q, cu_k, *ctx.opts, ctx.deterministic, *ctx.host)


def _backward(ctx, do):
    dq, dk, dv = torch.ops.ads_gdpa.bwd(*_backward_args(ctx, do))
    return (dq, dk, dv) + (None,) * 17


torch.library.register_autograd("ads_gdpa::fwd", _backward, setup_context=_setup_context)


class _EagerGDPA(torch.autograd.Function):
    """The same forward and backward as the custom op, for plain eager calls: the custom op's
    dispatch and generated autograd wrapper cost ~115 us of host time per forward (measured on a CPU
    build, 153 us against 38 us through this Function), more than the GPU work of small batches."""

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
        grads = bwd_impl(*args) if _plain_eager(args[:6]) else torch.ops.ads_gdpa.bwd(*args)
        return (*grads, *(None,) * 17)


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
    """``ads_gdpa::fwd`` with autograd; arguments as the op's. Plain eager calls take
    ``_EagerGDPA``, the rest the registered custom op (same kernels, same results)."""
    # the op's tensor arguments: q, k, v, cu_q, cu_k, then the three descales and two host offsets
    if _plain_eager(inputs[:5] + inputs[14:19]):
        return _EagerGDPA.apply(*inputs)
    return torch.ops.ads_gdpa.fwd(*inputs)


def _pair_count(host_q, host_k, max_q, max_k, n_b, broadcast_q, mask_mode, win_left, win_right) -> int:
    """Σ_b Lq_eff·Lk_eff (query-key pairs computed), per sequence when host offsets exist."""
    if host_q is not None and host_k is not None:
        lk = [host_k[i + 1] - host_k[i] for i in range(len(host_k) - 1)]
        if broadcast_q:
            lq = [host_q[1] - host_q[0]] * len(lk)
        else:
            lq = [host_q[i + 1] - host_q[i] for i in range(len(host_q) - 1)]
    else:  # no host lengths: the max-length bound
        lq, lk = [max_q] * n_b, [max_k] * n_b
    total = 0
    for a, c in zip(lq, lk):
        a = min(a, max_q)
        keys = c if mask_mode == 0 else min(c, win_left + win_right + 1)
        total += a * keys
    return total


def _readable(host) -> tuple[int, ...] | None:
    """Host offsets as ints, or None where they are not real data (fake or meta tensors)."""
    if host is None or not isinstance(host, Tensor) or host.device.type != "cpu":
        return None
    try:
        return tuple(host.tolist())
    except Exception:  # fake tensors raise on data access: fall back to the max-length bound
        return None


def _fwd_flops(q, k, v, cu_q, cu_k, max_q, max_k, act, act_per_head, scale, mask_mode, win_left, win_right,
               broadcast_q, *rest, host_q=None, host_k=None) -> int:  # fmt: skip
    n_b = cu_k.shape[0] - 1
    hq, hk = _readable(host_q), _readable(host_k)
    pairs = _pair_count(hq, hk, max_q, max_k, n_b, broadcast_q, mask_mode, win_left, win_right)
    return 2 * q.shape[1] * (q.shape[2] + v.shape[2]) * pairs


@register_flop_formula(torch.ops.ads_gdpa.fwd, get_raw=True)
def _flops_fwd(*args, out_val=None, **kwargs) -> int:
    a = list(args)
    host_q, host_k = (a[17], a[18]) if len(a) > 18 else (kwargs.get("host_q"), kwargs.get("host_k"))
    return _fwd_flops(*a[:14], host_q=host_q, host_k=host_k)


@register_flop_formula(torch.ops.ads_gdpa.bwd, get_raw=True)
def _flops_bwd(*args, out_val=None, **kwargs) -> int:
    a = list(args)
    do, q, k, v, cu_q, cu_k = a[:6]
    rest = a[6:15]
    host_q, host_k = (a[16], a[17]) if len(a) > 17 else (kwargs.get("host_q"), kwargs.get("host_k"))
    return int(2.5 * _fwd_flops(q, k, v, cu_q, cu_k, *rest, host_q=host_q, host_k=host_k))
