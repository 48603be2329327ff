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
from torch.utils.flop_counter import register_flop_formula

from ads_kernel_tools.bench.flops import valid_pairs
from ads_kernel_tools.dispatch import bind_op_args, eager_function, plain_eager, readable_host
from ads_kernel_tools.offsets import check_inputs_enabled

from . import dispatch
from .problem import (
    BIG,
    MAX_ENCODINGS,
    Fused,
    MaskMode,
    Problem,
    check_buckets,
    check_descales,
    check_offsets,
    check_spans,
    encoding_grads,
    encodings,
    grad_buffers,
    num_sequences,
    out_rows,
    safe_offsets,
    spans,
    spans_table,
    split_fused,
)  # fmt: skip
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
    # upstream extras (all default off): see ``problem.spans_table``, ``problem.Fused``, ``problem.Encodings``
    kv_index: Tensor | None = None
    host_kv_index: Tensor | None = None
    start_end: bool = False
    cu_o: Tensor | None = None
    host_o: Tensor | None = None
    total_out: int = -1
    fused: int = 0
    enc_0: Tensor | None = None
    enc_1: Tensor | None = None
    enc_2: Tensor | None = None
    enc_3: Tensor | None = None
    enc_4: Tensor | None = None
    bkt_0: Tensor | None = None
    bkt_1: Tensor | None = None
    bkt_2: Tensor | None = None
    bkt_3: Tensor | None = None
    bkt_4: Tensor | None = None


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
    # upstream extras (all default off): see ``problem.spans_table``, ``problem.Fused``, ``problem.Encodings``
    kv_index: Tensor | None = None
    host_kv_index: Tensor | None = None
    start_end: bool = False
    cu_o: Tensor | None = None
    host_o: Tensor | None = None
    total_out: int = -1
    fused: int = 0
    enc_0: Tensor | None = None
    enc_1: Tensor | None = None
    enc_2: Tensor | None = None
    enc_3: Tensor | None = None
    enc_4: Tensor | None = None
    bkt_0: Tensor | None = None
    bkt_1: Tensor | None = None
    bkt_2: Tensor | None = None
    bkt_3: Tensor | None = None
    bkt_4: Tensor | None = None


_EXTRA = tuple(FwdArgs._fields[FwdArgs._fields.index("kv_index") :])  # same names and order in BwdArgs
_ENC = tuple(f"enc_{i}" for i in range(MAX_ENCODINGS))
_BKT = tuple(f"bkt_{i}" for i in range(MAX_ENCODINGS))
_FWD_TENSORS = (
    "q", "k", "v", "cu_q", "cu_k", "q_descale", "k_descale", "v_descale", "host_q", "host_k", "kv_index",
    "host_kv_index", "cu_o", "host_o", *_ENC, *_BKT,
)  # fmt: skip


def _tables(a) -> tuple[list[Tensor], list[Tensor]]:
    tables = [getattr(a, n) for n in _ENC if getattr(a, n) is not None]
    buckets = [getattr(a, n) for n in _BKT if getattr(a, n) is not None]
    return tables, buckets


def _has_spans(a) -> bool:
    return a.kv_index is not None or a.start_end or a.cu_o is not None


def _views(a) -> tuple[Tensor, Tensor, Tensor]:
    return split_fused(a.q, a.k, a.v, a.fused)


def _out_rows(a) -> int:
    if a.start_end:
        return a.total_out
    return out_rows(a.q, a.cu_k, a.broadcast_q)


def _span_setup(a) -> tuple[Tensor, tuple[list[int], list[int]] | None]:
    """The spans table of an upstream-extras call, after the value checks of its host data (CPU
    offsets are host data; device ones only under ADS_CHECK_INPUTS, with one sync)."""
    q, k, _ = _views(a)
    dev = check_inputs_enabled()

    def host(h, t):
        if h is not None:
            return h
        if t is not None and (t.device.type == "cpu" or dev):
            return t
        return None

    lengths = check_spans(
        host(a.host_q, a.cu_q), host(a.host_k, a.cu_k), host(a.host_kv_index, a.kv_index),
        host(a.host_o, a.cu_o), a.kv_index is not None, a.start_end, q.shape[0], k.shape[0], _out_rows(a),
        a.max_k,
    )  # fmt: skip
    tbl = spans_table(a.cu_q, a.cu_k, a.kv_index, a.cu_o, a.start_end, q.shape[0], k.shape[0], _out_rows(a))
    return tbl, lengths


@functools.lru_cache(maxsize=64)
def _act_table(acts: tuple[int, ...], device: str) -> Tensor:
    return torch.tensor(acts, dtype=torch.int32, device=device)


def _host_list(host: Tensor | None) -> tuple[int, ...] | None:
    return tuple(host.tolist()) if host is not None else None  # a CPU tensor: no device sync


def _problem(a: FwdArgs | BwdArgs) -> Problem:
    spans = _has_spans(a)
    return Problem(
        max_q=a.max_q, max_k=a.max_k, act=a.act, scale=a.scale, mask=MaskMode(a.mask_mode),
        win_left=a.win_left, win_right=a.win_right, broadcast_q=a.broadcast_q,
        host_q=None if spans else _host_list(a.host_q), host_k=None if spans else _host_list(a.host_k),
        spans=spans, dkv_atomic=a.kv_index is not None or a.start_end, n_enc=len(_tables(a)[0]),
    )  # fmt: skip


def _call(a: FwdArgs | BwdArgs, dtype: torch.dtype) -> dispatch.Call:
    _, k, v = _views(a)
    extras = _has_spans(a) or a.fused != Fused.NONE or a.enc_0 is not None
    return dispatch.Call(
        act=a.act, d_qk=k.shape[2], d_v=v.shape[2], dtype=dtype, mask=MaskMode(a.mask_mode),
        broadcast_q=a.broadcast_q, per_head=a.act_per_head is not None, deterministic=a.deterministic,
        upstream_extras=extras, max_k=a.max_k,
    )  # fmt: skip


def _safe(a: FwdArgs | BwdArgs, out: Tensor | None = None) -> tuple[Tensor, Tensor, int | None]:
    """Offsets the kernels may trust (``problem.safe_offsets``, which zeroes the rows of a forward's
    ``out`` that no sequence owns) and the longest host query sequence."""
    q, k, _ = _views(a)
    longest_q, _ = check_offsets(q, k, a.cu_q, a.cu_k, a.host_q, a.host_k, a.max_k, a.broadcast_q)
    checked = a.host_q is not None and a.host_k is not None
    cu_q, cu_k = safe_offsets(q, k, a.cu_q, a.cu_k, checked, zero_outside=out, host_q=a.host_q)
    return cu_q, cu_k, longest_q


def fwd_impl(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, act: int,
    act_per_head: list[int] | None, scale: float, mask_mode: int, win_left: int, win_right: int,
    broadcast_q: bool, q_descale: Tensor | None, k_descale: Tensor | None, v_descale: Tensor | None,
    host_q: Tensor | None, host_k: Tensor | None, deterministic: bool,
    kv_index: Tensor | None = None, host_kv_index: Tensor | None = None, start_end: bool = False,
    cu_o: Tensor | None = None, host_o: Tensor | None = None, total_out: int = -1, fused: int = 0,
    enc_0: Tensor | None = None, enc_1: Tensor | None = None, enc_2: Tensor | None = None,
    enc_3: Tensor | None = None, enc_4: Tensor | None = None, bkt_0: Tensor | None = None,
    bkt_1: Tensor | None = None, bkt_2: Tensor | None = None, bkt_3: Tensor | None = None,
    bkt_4: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """Forward. q (Tq, H, Dqk), k (Tk, Hkv, Dqk), v (Tk, Hkv, Dv) -> out (To, H, Dv).

    mask_mode: ``MaskMode``. ``deterministic`` only affects the backward (dQ by a second pass
    instead of atomics). FP8 inputs (descales given) give a bf16 output. Upstream extras (Triton
    kernels only): ``kv_index`` / ``start_end`` / ``cu_o`` (+ host copies) give the sequences'
    spans (``problem.spans_table``), ``total_out`` the output rows with ``start_end``; ``fused``
    (``problem.Fused``): q or k is the fused tensor and the others are passed as that same tensor;
    ``enc_i`` / ``bkt_i``: encoding tables and their per-query-row buckets.
    """
    a = FwdArgs(
        q, k, v, cu_q, cu_k, max_q, max_k, act, act_per_head, scale, mask_mode, win_left, win_right,
        broadcast_q, q_descale, k_descale, v_descale, host_q, host_k, deterministic, kv_index,
        host_kv_index, start_end, cu_o, host_o, total_out, fused, enc_0, enc_1, enc_2, enc_3, enc_4,
        bkt_0, bkt_1, bkt_2, bkt_3, bkt_4,
    )  # fmt: skip
    qv, kv, vv = _views(a)
    fp8 = q_descale is not None
    out_dtype = torch.bfloat16 if fp8 else q.dtype
    # start/end outputs: rows no sequence writes are zeros (total_num_objects need not be covered)
    alloc = torch.zeros if start_end else torch.empty
    out = alloc((_out_rows(a), q.shape[1], vv.shape[2]), dtype=out_dtype, device=q.device)
    span_tbl = None
    if _has_spans(a):
        span_tbl, _ = _span_setup(a)
    else:
        # rows outside [cu_q[0], cu_q[-1]) belong to no sequence: zeroed with the offsets' clamp
        # (a broadcast output has a row block per kv sequence instead, all of them written)
        cu_q, cu_k, longest_q = _safe(a, None if broadcast_q else out)
    descale = (q_descale, k_descale, v_descale) if fp8 else None
    if fp8:
        check_descales(descale)
    backend = dispatch.backend_for("fwd", q.device, _call(a, q.dtype))
    if backend in ("gluon", "cute"):
        kernel = dispatch.kernel(backend, q.device, "fwd")
        extra = {"descale": descale} if fp8 else {}  # FP8 calls reach Gluon only (``SUPPORT``)
        kernel(q, k, v, cu_q, cu_k, max_q, max_k, act, scale, out, longest_q=longest_q, **extra)
        return out
    tbl = _act_table(tuple(act_per_head), str(q.device)) if act_per_head is not None else None
    enc = encodings(*_tables(a))
    if enc is not None:
        check_buckets(enc.tables, enc.buckets, check_inputs_enabled())
    return launch.fwd(
        qv, kv, vv, cu_q, cu_k, _problem(a), out, act_tbl=tbl, descale=descale, span_tbl=span_tbl, enc=enc
    )


gdpa_fwd_op = torch.library.custom_op("ads_gdpa::fwd", fwd_impl, mutates_args=())


@gdpa_fwd_op.register_fake
def _(*args, **kwargs):
    a = FwdArgs(**bind_op_args(FwdArgs._fields, args, kwargs, FwdArgs._field_defaults))
    out_dtype = torch.bfloat16 if a.q_descale is not None else a.q.dtype
    return a.q.new_empty((_out_rows(a), a.q.shape[1], _views(a)[2].shape[2]), dtype=out_dtype)


def bwd_impl(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
    act: int, act_per_head: list[int] | None, scale: float, mask_mode: int, win_left: int, win_right: int,
    broadcast_q: bool, deterministic: bool, host_q: Tensor | None, host_k: Tensor | None,
    kv_index: Tensor | None = None, host_kv_index: Tensor | None = None, start_end: bool = False,
    cu_o: Tensor | None = None, host_o: Tensor | None = None, total_out: int = -1, fused: int = 0,
    enc_0: Tensor | None = None, enc_1: Tensor | None = None, enc_2: Tensor | None = None,
    enc_3: Tensor | None = None, enc_4: Tensor | None = None, bkt_0: Tensor | None = None,
    bkt_1: Tensor | None = None, bkt_2: Tensor | None = None, bkt_3: Tensor | None = None,
    bkt_4: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:  # fmt: skip
    """Backward: (dq, dk, dv) shaped like (q, k, v) and the encoding tables' gradients (one per
    ``enc_i`` given); do (To, H, Dv). Fused layouts: the fused tensor's gradient in its slot (q's
    for QKV, k's for KV), the other slots empty."""
    a = BwdArgs(
        do, q, k, v, cu_q, cu_k, max_q, max_k, act, act_per_head, scale, mask_mode, win_left, win_right,
        broadcast_q, deterministic, host_q, host_k, kv_index, host_kv_index, start_end, cu_o, host_o,
        total_out, fused, enc_0, enc_1, enc_2, enc_3, enc_4, bkt_0, bkt_1, bkt_2, bkt_3, bkt_4,
    )  # fmt: skip
    do = do.contiguous() if do.stride(-1) != 1 else do
    backend = dispatch.backend_for("bwd", q.device, _call(a, q.dtype))
    if backend in ("gluon", "cute") and do.dtype == q.dtype:
        cu_q, cu_k, _ = _safe(a)
        covered = (spans(host_q, q.shape[0]), spans(host_k, k.shape[0]))
        dq_acc, dk, dv = grad_buffers(q, k, v, covered, deterministic=False)
        kernel = dispatch.kernel(backend, q.device, "bwd")
        kernel(do, q, k, v, cu_q, cu_k, max_q, max_k, act, scale, dq_acc, dk, dv)
        return dq_acc.to(q.dtype), dk, dv, []
    span_tbl = None
    if _has_spans(a):
        span_tbl, _ = _span_setup(a)
    else:
        cu_q, cu_k, _ = _safe(a)
    tbl = _act_table(tuple(act_per_head), str(q.device)) if act_per_head is not None else None
    tables, buckets = _tables(a)
    enc = encodings(tables, buckets)
    qv, kv, vv = _views(a)
    dst = None
    if fused == Fused.QKV:
        g = torch.zeros_like(q)
        dst = split_fused(g, g, g, fused)
    elif fused == Fused.KV:
        g = torch.zeros_like(k)
        dst = (torch.zeros_like(q), *split_fused(q, g, g, fused)[1:])
    dq, dk, dv, dq32 = launch.bwd(
        do, qv, kv, vv, cu_q, cu_k, _problem(a), act_tbl=tbl, deterministic=deterministic,
        span_tbl=span_tbl, enc=enc, dst=dst,
    )  # fmt: skip
    table_grads = encoding_grads(tables, buckets, dq32, deterministic) if enc is not None else []
    if fused == Fused.QKV:  # two distinct empties: outputs of a custom op must not alias
        return g, q.new_empty(0), q.new_empty(0), table_grads
    if fused == Fused.KV:
        return dq, g, q.new_empty(0), table_grads
    return dq, dk, dv, table_grads


gdpa_bwd_op = torch.library.custom_op("ads_gdpa::bwd", bwd_impl, mutates_args=())


@gdpa_bwd_op.register_fake
def _(*args, **kwargs):
    a = BwdArgs(**bind_op_args(BwdArgs._fields, args, kwargs, BwdArgs._field_defaults))
    grads = [torch.empty_like(t) for t in _tables(a)[0]]
    if a.fused == Fused.QKV:
        return torch.empty_like(a.q), a.q.new_empty(0), a.q.new_empty(0), grads
    if a.fused == Fused.KV:
        return torch.empty_like(a.q), torch.empty_like(a.k), a.q.new_empty(0), grads
    return torch.empty_like(a.q), torch.empty_like(a.k), torch.empty_like(a.v), grads


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
        host_k=a.host_k, **{name: getattr(a, name) for name in _EXTRA},
    )  # fmt: skip


def _input_grads(a: BwdArgs, grads) -> tuple:
    """The forward op's gradients, one per FwdArgs field: dq, dk, dv (None for the slots a fused
    tensor fills: its gradient is in one slot), the tables' in their ``enc_i`` slots."""
    dq, dk, dv, table_grads = grads
    if a.fused == Fused.QKV:
        dk = dv = None
    elif a.fused == Fused.KV:
        dv = None
    out = [None] * len(FwdArgs._fields)
    out[0], out[1], out[2] = dq, dk, dv
    it = iter(table_grads)
    for name in _ENC:
        if getattr(a, name) is not None:
            out[FwdArgs._fields.index(name)] = next(it)
    return tuple(out)


def _backward(ctx, do):
    args = _backward_args(ctx, do)
    return _input_grads(args, torch.ops.ads_gdpa.bwd(*args))


torch.library.register_autograd("ads_gdpa::fwd", _backward, setup_context=_setup_context)


def _eager_backward(ctx, do):
    args = _backward_args(ctx, do)
    # a dispatch mode may have been entered since the forward (FlopCounterMode around backward)
    plain = plain_eager((args.do, args.q, args.k, args.v, args.cu_q, args.cu_k))
    grads = bwd_impl(*args) if plain else torch.ops.ads_gdpa.bwd(*args)
    return _input_grads(args, grads)


# plain eager calls: the custom op's dispatch and generated autograd wrapper cost ~115 us of host time
# per forward (measured on a CPU build), more than the GPU work of small batches
_EagerGDPA = eager_function(
    "_EagerGDPA", lambda *inputs: fwd_impl(*inputs), _setup_context, _eager_backward
)  # fwd_impl looked up per call (tests count its calls)


def gdpa_fwd(*inputs) -> Tensor:
    """``ads_gdpa::fwd`` with autograd; arguments as the op's (``FwdArgs``). Plain eager calls take
    ``_EagerGDPA``, the rest the registered custom op (same kernels, same results)."""
    a = FwdArgs(*inputs)  # every field, defaults filled: the eager backward returns one gradient each
    if plain_eager([getattr(a, name) for name in _FWD_TENSORS]):
        return _EagerGDPA.apply(*a)
    return torch.ops.ads_gdpa.fwd(*a)


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
    return pairs_of_lengths(lq, lk, max_q, mask_mode, win_left, win_right)


def pairs_of_lengths(lq, lk, max_q: int, mask_mode: int, win_left: int, win_right: int) -> int:
    """Σ_b the pairs the mask allows for sequences of lengths (lq[b], lk[b]), queries i < max_q."""
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


def _span_lengths(a: FwdArgs | BwdArgs) -> tuple[list[int], list[int]] | None:
    """Per-sequence (Lq, Lk) of an upstream-extras call from readable host data (the host copies,
    or the offsets themselves when they live on the CPU), else None."""

    def read(host, dev):
        return readable_host(host) if host is not None else readable_host(dev)

    hq, hk = read(a.host_q, a.cu_q), read(a.host_k, a.cu_k)
    if hq is None or hk is None:
        return None
    if a.start_end:
        return [e - s for s, e in zip(hq[0::2], hq[1::2])], [e - s for s, e in zip(hk[0::2], hk[1::2])]
    lq = [hq[i + 1] - hq[i] for i in range(len(hq) - 1)]
    lk = [hk[i + 1] - hk[i] for i in range(len(hk) - 1)]
    if a.kv_index is not None:
        idx = read(a.host_kv_index, a.kv_index)
        if idx is None:
            return None
        lk = [lk[min(max(i, 0), len(lk) - 1)] for i in idx] if lk else [0] * len(idx)
    return lq, lk


def _fwd_flops(a: FwdArgs | BwdArgs) -> int:
    _, k, v = _views(a)
    heads, width = a.q.shape[1], k.shape[2] + v.shape[2]
    if _has_spans(a):
        lengths = _span_lengths(a)
        if lengths is None:
            n_b = (
                a.kv_index.shape[0]
                if a.kv_index is not None
                else num_sequences(a.cu_q, a.cu_k, None, a.start_end, a.broadcast_q)
            )
            lengths = ([a.max_q] * n_b, [a.max_k] * n_b)
        pairs = pairs_of_lengths(*lengths, a.max_q, a.mask_mode, a.win_left, a.win_right)
        return 2 * heads * width * pairs
    n_b = a.cu_k.shape[0] - 1
    hq, hk = readable_host(a.host_q), readable_host(a.host_k)
    pairs = pair_count(hq, hk, a.max_q, a.max_k, n_b, a.broadcast_q, a.mask_mode, a.win_left, a.win_right)
    return 2 * heads * width * pairs


@register_flop_formula(torch.ops.ads_gdpa.fwd, get_raw=True)
def _flops_fwd(*args, out_val=None, **kwargs) -> int:
    return _fwd_flops(FwdArgs(**bind_op_args(FwdArgs._fields, args, kwargs, FwdArgs._field_defaults)))


@register_flop_formula(torch.ops.ads_gdpa.bwd, get_raw=True)
def _flops_bwd(*args, out_val=None, **kwargs) -> int:
    return int(
        2.5 * _fwd_flops(BwdArgs(**bind_op_args(BwdArgs._fields, args, kwargs, BwdArgs._field_defaults)))
    )
