"""The upstream Triton interface (issue 20): ad_to_request_offset, start/end offsets, fused QKV/KV,
the five learned encodings, the exact signature, bad inputs, opcheck / torch.compile / FLOPs.

Each feature is checked against a reference composed here from the plain GDPA reference: the shared
KV gathered per sequence, overlapping spans expanded into separate sequences, the encodings added to
q, then ``ads_kernel_tools.reference.gdpa.gdpa_ref`` in fp64 (and the bf16 baseline of the tolerance
rule), with gradients by autograd through the gathers (so overlaps and sharing sum).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ads_gdpa import gdpa_varlen, generalized_dot_product_attention
from ads_gdpa.problem import spans_table
from ads_gdpa.triton import launch
from ads_kernel_tools.capability import interpreter_active
from ads_kernel_tools.reference.gdpa import gdpa_ref
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline

D = 32
BF16 = torch.bfloat16
# The small cases build CPU tensors (host data, so the value checks run too): they need the Triton
# interpreter; on a GPU machine the ``gpu`` cases below cover the same features at real sizes.
cpu_kernels = pytest.mark.skipif(
    not interpreter_active(), reason="CPU-tensor case: runs under TRITON_INTERPRET=1"
)


def _rand(shape, seed, scale=1.0, dtype=BF16):
    return randn(shape, dtype=dtype, seed=seed, scale=scale)


def compose_ref(q, k, v, spans, out_rows, *, encodings=(), dtype, max_q, max_k, **kw):
    """GDPA of explicit spans: spans = [(q_start, q_end, k_start, k_end, o_start)], q/k/v leaves in
    the reference precision (fp64) or the baseline's (bf16), encodings [(table, buckets)]."""
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    dev = q.device
    if encodings:
        qe = q.to(compute)
        for table, bkt in encodings:
            rows = table.to(compute)[bkt.long()]
            qe = qe + (rows if table.dim() == 3 else rows[:, None, :])
        q = qe.to(dtype) if dtype != torch.float64 else qe
    none = [torch.zeros(0, dtype=torch.long, device=dev)]
    qi = torch.cat([torch.arange(a, b, device=dev) for a, b, *_ in spans] + none)
    ki = torch.cat([torch.arange(c, d, device=dev) for _, _, c, d, _ in spans] + none)
    cu_q = lengths_to_offsets([b - a for a, b, *_ in spans], device=dev)
    cu_k = lengths_to_offsets([d - c for _, _, c, d, _ in spans], device=dev)
    om = gdpa_ref(q[qi], k[ki], v[ki], cu_q, cu_k, max_q, max_k, dtype=dtype, **kw)
    oi = torch.cat([torch.arange(o, o + b - a, device=dev) for a, b, _, _, o in spans] + none)
    out = torch.zeros(out_rows, q.shape[1], v.shape[2], dtype=dtype, device=dev)
    return out.index_copy(0, oi, om)


def check(ours, ref_fn, leaves: dict, name: str, seed: int = 9) -> None:
    """ours(**bf16 leaves) vs ref_fn(dtype, **leaves) in fp64 and in bf16 (the baseline), forward and
    the gradient of every leaf."""
    mine = {n: t.detach().clone().requires_grad_() for n, t in leaves.items()}
    ref_l = {n: t.detach().double().requires_grad_() for n, t in leaves.items()}
    base_l = {n: t.detach().clone().requires_grad_() for n, t in leaves.items()}
    out = ours(**mine)
    ref = ref_fn(dtype=torch.float64, **ref_l)
    base = ref_fn(dtype=BF16, **base_l)
    assert out.shape == ref.shape and out.dtype == BF16
    assert_close_vs_baseline(out, ref, base, name=f"out[{name}]")
    do = randn(out.shape, dtype=BF16, seed=seed, device=out.device)
    out.backward(do)
    ref.backward(do.double())
    base.backward(do)
    for n in leaves:
        g = mine[n].grad
        assert g is not None and g.dtype == leaves[n].dtype and g.shape == leaves[n].shape, n
        assert_close_vs_baseline(g, ref_l[n].grad, base_l[n].grad, name=f"d{n}[{name}]")


def _csr_spans(lq, lk_of_seq, k_starts):
    cq = lengths_to_offsets(lq).tolist()
    return [(cq[b], cq[b + 1], k_starts[b], k_starts[b] + lk_of_seq[b], cq[b]) for b in range(len(lq))]


# ---- ad_to_request_offset -------------------------------------------------------------------------


@cpu_kernels
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic_dq", "det_dq"])
def test_ad_to_request_shares_kv(deterministic):
    lq = [5, 33, 1, 0, 20]  # five ads
    lk_req = [40, 0, 17]  # over three requests
    a2r = [0, 2, 0, 1, 2]
    ck = lengths_to_offsets(lk_req).tolist()
    spans = _csr_spans(lq, [lk_req[r] for r in a2r], [ck[r] for r in a2r])
    cu_q, cu_k, idx = lengths_to_offsets(lq), lengths_to_offsets(lk_req), torch.tensor(a2r)
    leaves = dict(
        q=_rand((sum(lq), 2, D), 0, 0.5),
        k=_rand((sum(lk_req), 1, D), 1, 0.5),
        v=_rand((sum(lk_req), 1, D), 2),
    )

    def ours(q, k, v):
        return gdpa_varlen(q, k, v, cu_q, cu_k, 33, 40, activation="fast_gelu", kv_index=idx,
                           deterministic=deterministic)  # fmt: skip

    def ref(q, k, v, dtype):
        return compose_ref(q, k, v, spans, sum(lq), dtype=dtype, max_q=33, max_k=40, activation="fast_gelu")

    check(ours, ref, leaves, "a2r")


# ---- start/end offsets ----------------------------------------------------------------------------

Q_SPANS = [(0, 20), (10, 45), (30, 30), (5, 38)]  # overlapping query spans in 50 rows
K_SPANS = [(0, 33), (20, 60), (7, 9), (0, 60)]  # overlapping key spans in 60 rows
O_STARTS = [0, 20, 55, 55]  # each sequence its own output rows; 2 trailing rows nobody writes


@cpu_kernels
@pytest.mark.parametrize("max_q", [64, 17], ids=["full", "clamped"])
def test_start_end_offsets_overlap(max_q):
    flat = lambda pairs: torch.tensor([x for p in pairs for x in p], dtype=torch.int32)
    cu_q, cu_k = flat(Q_SPANS), flat(K_SPANS)
    cu_o = flat([(o, o + e - s) for o, (s, e) in zip(O_STARTS, Q_SPANS)])
    total = 90
    spans = [(s, e, ks, ke, o) for (s, e), (ks, ke), o in zip(Q_SPANS, K_SPANS, O_STARTS)]
    leaves = dict(q=_rand((50, 2, D), 3, 0.5), k=_rand((60, 2, D), 4, 0.5), v=_rand((60, 2, D), 5))

    def ours(q, k, v):
        return generalized_dot_product_attention(
            q, k, v, cu_q, cu_k, max_q, 60, output_offset=cu_o, use_start_end_offsets=True,
            total_num_objects=total, activation="gelu",
        )  # fmt: skip

    def ref(q, k, v, dtype):
        return compose_ref(q, k, v, spans, total, dtype=dtype, max_q=max_q, max_k=60, activation="gelu")

    check(ours, ref, leaves, f"start_end_maxq{max_q}")


# ---- fused layouts --------------------------------------------------------------------------------


def _no_copy_spy(monkeypatch, fused_base: dict):
    """Record that the kernels get views into the fused tensor (same storage), never a copy."""
    seen = {}
    orig = launch.fwd

    def spy(q, k, v, *args, **kwargs):
        base = fused_base["t"]
        seen["views"] = all(
            t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
            for t in fused_base["of"](q, k, v)
        )
        return orig(q, k, v, *args, **kwargs)

    monkeypatch.setattr(launch, "fwd", spy)
    return seen


@cpu_kernels
def test_fused_qkv(monkeypatch):
    lens = [17, 33, 0, 1]
    cu = lengths_to_offsets(lens)
    fused = _rand((sum(lens), 2, 3 * D), 6, 0.5)
    spans = _csr_spans(lens, lens, lengths_to_offsets(lens).tolist())
    holder = {"of": lambda q, k, v: (q, k, v)}

    def ours(qkv):
        holder["t"] = qkv
        return generalized_dot_product_attention(qkv, None, None, cu, cu, 33, 33, activation="silu")

    def ref(qkv, dtype):
        q, k, v = qkv[..., :D], qkv[..., D : 2 * D], qkv[..., 2 * D :]
        return compose_ref(q, k, v, spans, sum(lens), dtype=dtype, max_q=33, max_k=33, activation="silu")

    seen = _no_copy_spy(monkeypatch, holder)
    check(ours, ref, dict(qkv=fused), "fused_qkv")
    assert seen["views"], "the fused QKV tensor was copied"


@cpu_kernels
def test_fused_kv(monkeypatch):
    lq, lk = [9, 40], [33, 5]
    cu_q, cu_k = lengths_to_offsets(lq), lengths_to_offsets(lk)
    spans = _csr_spans(lq, lk, lengths_to_offsets(lk).tolist())
    holder = {"of": lambda q, k, v: (k, v)}

    def ours(q, kv):
        holder["t"] = kv
        return generalized_dot_product_attention(
            q, kv, None, cu_q, cu_k, 40, 33, qk_scale=0.5, activation="relu"
        )

    def ref(q, kv, dtype):
        k, v = kv[..., :D], kv[..., D:]
        return compose_ref(
            q, k, v, spans, sum(lq), dtype=dtype, max_q=40, max_k=33, activation="relu", scale=0.5
        )

    seen = _no_copy_spy(monkeypatch, holder)
    leaves = dict(q=_rand((sum(lq), 2, D), 7, 0.5), kv=_rand((sum(lk), 1, 2 * D), 8, 0.5))
    check(ours, ref, leaves, "fused_kv")
    assert seen["views"], "the fused KV tensor was copied"


# ---- encodings ------------------------------------------------------------------------------------

ENC_NAMES = (
    "ts_encoding",
    "ts_event_request_even",
    "ts_event_request_log",
    "ts_adjacent_event_log",
    "pos_emb",
)


def _encoding_inputs(tq, heads, seed, d=D):
    """Five tables: per-head fp32, shared fp32, per-head bf16, shared bf16, per-head fp32."""
    shapes = [(7, heads, d), (5, d), (3, heads, d), (11, d), (40, heads, d)]
    dtypes = [torch.float32, torch.float32, BF16, BF16, torch.float32]
    tables = [_rand(s, seed + i, 0.3, dtype=dt) for i, (s, dt) in enumerate(zip(shapes, dtypes))]
    g = torch.Generator().manual_seed(seed)
    buckets = [torch.randint(0, s[0], (tq,), generator=g) for s in shapes]
    return tables, buckets


@cpu_kernels
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic_dq", "det_dq"])
def test_encodings_fwd_bwd(deterministic):
    """q + Σ table[bucket] enters S in the forward, dK, and dQ (upstream's dQ pass leaves it out);
    the tables' gradients are the scatter-add of dQ (summed over heads for shared tables)."""
    lq, lk = [30, 0, 17, 1], [12, 9, 40, 33]
    cu_q, cu_k = lengths_to_offsets(lq), lengths_to_offsets(lk)
    tables, buckets = _encoding_inputs(sum(lq), 2, 20)
    spans = _csr_spans(lq, lk, lengths_to_offsets(lk).tolist())
    leaves = dict(
        q=_rand((sum(lq), 2, D), 10, 0.5), k=_rand((sum(lk), 1, D), 11, 0.5), v=_rand((sum(lk), 1, D), 12)
    )
    leaves.update({f"t{i}": t for i, t in enumerate(tables)})

    def ours(q, k, v, **tbl):
        enc = [(tbl[f"t{i}"], buckets[i]) for i in range(5)]
        return gdpa_varlen(q, k, v, cu_q, cu_k, 25, 40, activation="gelu_approx", encodings=enc,
                           deterministic=deterministic)  # fmt: skip

    def ref(q, k, v, dtype, **tbl):
        enc = [(tbl[f"t{i}"], buckets[i]) for i in range(5)]
        return compose_ref(q, k, v, spans, sum(lq), encodings=enc, dtype=dtype, max_q=25, max_k=40,
                           activation="gelu_approx")  # fmt: skip

    check(ours, ref, leaves, "encodings")


@cpu_kernels
def test_encodings_with_shared_kv_via_upstream_names():
    """Two of the upstream keyword pairs with ad_to_request_offset: the encodings follow the query
    rows, the shared KV the request index."""
    lq, lk_req, a2r = [20, 7, 33], [24, 40], [1, 0, 1]
    ck = lengths_to_offsets(lk_req).tolist()
    spans = _csr_spans(lq, [lk_req[r] for r in a2r], [ck[r] for r in a2r])
    cu_q, cu_k, idx = lengths_to_offsets(lq), lengths_to_offsets(lk_req), torch.tensor(a2r, dtype=torch.int32)
    tables, buckets = _encoding_inputs(sum(lq), 4, 30)
    leaves = dict(q=_rand((sum(lq), 4, D), 13, 0.5), k=_rand((64, 2, D), 14, 0.5), v=_rand((64, 2, D), 15),
                  ts=tables[0], pos=tables[1])  # fmt: skip

    def ours(q, k, v, ts, pos):
        return generalized_dot_product_attention(
            q, k, v, cu_q, cu_k, 33, 40, idx, activation="fast_gelu", ts_encoding_params=ts,
            ts_encoding_bucket_values=buckets[0], pos_emb_params=pos, pos_emb_bucket_values=buckets[1],
        )  # fmt: skip

    def ref(q, k, v, ts, pos, dtype):
        enc = [(ts, buckets[0]), (pos, buckets[1])]
        return compose_ref(q, k, v, spans, sum(lq), encodings=enc, dtype=dtype, max_q=33, max_k=40,
                           activation="fast_gelu")  # fmt: skip

    check(ours, ref, leaves, "a2r_encodings")


# ---- the signature --------------------------------------------------------------------------------

UPSTREAM = [
    ("query", inspect.Parameter.empty), ("key", inspect.Parameter.empty), ("value", inspect.Parameter.empty),
    ("query_offset", inspect.Parameter.empty), ("key_offset", inspect.Parameter.empty),
    ("max_seq_len_q", inspect.Parameter.empty), ("max_seq_len_kv", inspect.Parameter.empty),
    ("ad_to_request_offset", None), ("attn_mask", None), ("attn_offset", None), ("is_causal", False),
    ("qk_scale", None), ("seq_index", None), ("allow_tf32", True), ("output_offset", None),
    ("use_start_end_offsets", False), ("window_size", None), ("broadcast_q", False), ("activation", "raw"),
    ("enable_persistent", False), ("enable_tma", False), ("enable_ws", False), ("use_dq_atomic_add", False),
    ("total_num_objects", None), ("ts_encoding_params", None), ("ts_event_request_even_params", None),
    ("ts_event_request_log_params", None), ("ts_adjacent_event_log_params", None),
    ("ts_encoding_bucket_values", None), ("ts_event_request_even_bucket_values", None),
    ("ts_event_request_log_bucket_values", None), ("ts_adjacent_event_log_bucket_values", None),
    ("pos_emb_params", None), ("pos_emb_bucket_values", None), ("bwd_opt_tech", "base"),
    ("ensemble_activation_list", None),
]  # fmt: skip


def test_signature_is_upstreams():
    params = list(inspect.signature(generalized_dot_product_attention).parameters.values())
    assert [(p.name, p.default) for p in params] == UPSTREAM
    assert all(p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


@cpu_kernels
def test_upstream_arguments_by_position():
    """Every upstream argument passed by position (qk_scale is the 12th), against keyword calls of
    gdpa_varlen; the knobs upstream ignores change nothing."""
    lq, lk_req, a2r = [9, 20], [33, 17], [1, 1]
    cu_q, cu_k, idx = lengths_to_offsets(lq), lengths_to_offsets(lk_req), torch.tensor(a2r)
    q, k, v = _rand((29, 2, D), 16, 0.5), _rand((50, 1, D), 17, 0.5), _rand((50, 1, D), 18)
    tables, buckets = _encoding_inputs(29, 2, 40)
    seq_index = torch.tensor([1, 0])
    out = generalized_dot_product_attention(
        q, k, v, cu_q, cu_k, 20, 33, idx, None, None, False, 0.25, seq_index, False, None, False, 6,
        False, "silu", True, True, True, True, None, *tables[:4], *buckets[:4], tables[4], buckets[4],
        "base", [7, 0],
    )  # fmt: skip
    want = gdpa_varlen(
        q, k, v, cu_q, cu_k, 20, 33, activation="silu", scale=0.25, window_size=6, kv_index=idx,
        activation_per_head=[7, 0], encodings=list(zip(tables, buckets)),
    )  # fmt: skip
    assert torch.equal(out, want)
    plain = generalized_dot_product_attention(q, k, v, cu_q, cu_k, 20, 33, idx, None, None, False, 0.25)
    torch.testing.assert_close(plain, gdpa_varlen(q, k, v, cu_q, cu_k, 20, 33, activation="raw", scale=0.25,
                                                 kv_index=idx), rtol=0, atol=0)  # fmt: skip


# ---- bad inputs -----------------------------------------------------------------------------------


def _small():
    q, k, v = _rand((10, 2, D), 0), _rand((12, 1, D), 1), _rand((12, 1, D), 2)
    return q, k, v, torch.tensor([0, 4, 10]), torch.tensor([0, 6, 12])


def _call(**kw):
    q, k, v, cu_q, cu_k = _small()
    args = dict(
        query=q, key=k, value=v, query_offset=cu_q, key_offset=cu_k, max_seq_len_q=6, max_seq_len_kv=6
    )
    args.update(kw)
    return generalized_dot_product_attention(**args)


T = torch.tensor
SE = dict(use_start_end_offsets=True)  # start/end pairs below: 2 spans over 10 query / 12 key rows
SE_K = T([0, 6, 6, 12])
ZB = torch.zeros(10, dtype=torch.long)


def _enc(name, table, buckets):
    return {f"{name}_params": table, f"{name}_bucket_values": buckets}


BAD = {
    "a2r_out_of_range": (dict(ad_to_request_offset=T([0, 2])), "ad_to_request_offset\\[1\\] = 2"),
    "a2r_negative": (dict(ad_to_request_offset=T([-1, 0])), "ad_to_request_offset\\[0\\] = -1"),
    "a2r_length": (dict(ad_to_request_offset=T([0])), "ad_to_request_offset must have 2 entries, got 1"),
    "overlap_without_start_end": (dict(query_offset=T([0, 8, 4])), "use_start_end_offsets"),
    "start_end_without_total": (SE, "total_num_objects"),
    "start_end_odd": (dict(SE, total_num_objects=4), "pairs"),
    "start_end_span_outside": (
        dict(SE, total_num_objects=30, query_offset=T([0, 4, 6, 11]), key_offset=SE_K), "span 1 = \\[6, 11\\)"
    ),
    "start_end_outputs_overlap": (
        dict(SE, total_num_objects=30, query_offset=T([0, 6, 3, 10]), key_offset=SE_K),
        "overlapping output rows",
    ),
    "output_rows_outside": (
        dict(SE, total_num_objects=8, query_offset=T([0, 6, 3, 10]), key_offset=SE_K,
             output_offset=T([0, 6, 6, 13])),
        "outside the 8 output rows",
    ),
    "bucket_outside_table": (
        _enc("ts_encoding", torch.zeros(4, 2, D), T([0] * 9 + [4])),
        "bucket value 4 is outside its table of 4",
    ),
    "bucket_negative": (_enc("pos_emb", torch.zeros(4, D), T([-1] + [0] * 9)), "bucket value -1"),
    "bucket_length": (_enc("pos_emb", torch.zeros(4, D), ZB[:9]), "buckets must have 10 entries, got 9"),
    "table_shape_upstream_flat": (_enc("ts_encoding", torch.zeros(4, 2 * D), ZB), "num_buckets, H, D"),
    "params_without_buckets": (dict(ts_encoding_params=torch.zeros(4, D)), "given together"),
    "attn_mask": (dict(attn_mask=torch.zeros(1)), "attn_mask"),
    "is_causal": (dict(is_causal=True), "is_causal"),
    "fused_kv_odd": (dict(key=_rand((12, 1, D + 1), 1), value=None), "fused KV"),
    "fused_qkv_bad": (dict(key=None, value=None), "fused QKV"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(BAD))
def test_bad_inputs_raise(name):
    kw, msg = BAD[name]
    with pytest.raises(ValueError, match=msg):
        _call(**kw)


def test_spans_table_clamps_device_data():
    """Offsets the kernels never check (device data) are clamped into the tensors: indices into
    [0, R), spans into their tensors, output spans into the output."""
    cu_q = torch.tensor([0, 5, 3, 400])  # decreasing, past the end
    cu_k = torch.tensor([0, 7, 9])
    tbl = spans_table(cu_q, cu_k, torch.tensor([5, -3, 1]), None, False, 20, 9, 20)
    qs, qe, ks, ke, os_ = tbl.tolist()
    assert all(0 <= a <= b <= 20 for a, b in zip(qs, qe)) and all(0 <= a <= b <= 9 for a, b in zip(ks, ke))
    assert (ks, ke) == ([7, 0, 7], [9, 7, 9])  # index 5 -> 1 (the last request), -3 -> 0
    assert all(o + (b - a) <= 20 for o, a, b in zip(os_, qs, qe))


def test_bad_bucket_values_on_device_data_are_clamped(device):
    """Bucket values the op cannot read without a sync are clamped into the table inside the kernel:
    the result equals the one with clamped buckets (and nothing reads outside the table)."""
    from ads_gdpa.problem import BIG, MaskMode, Problem, encodings

    q, k, v, cu_q, cu_k = (t.to(device) for t in _small())
    table = _rand((4, 2, D), 3, 0.3, dtype=torch.float32).to(device)
    bad = torch.tensor([-5, 0, 1, 2, 3, 4, 99, 2, 1, -1], device=device)
    pb = Problem(max_q=6, max_k=6, act=0, scale=1.0, mask=MaskMode.NONE, win_left=BIG, win_right=BIG,
                 broadcast_q=False, n_enc=1)  # fmt: skip
    outs = []
    for bkt in (bad, bad.clamp(0, 3)):
        out = torch.empty(q.shape, dtype=q.dtype, device=device)
        outs.append(launch.fwd(q, k, v, cu_q.int(), cu_k.int(), pb, out, enc=encodings([table], [bkt])))
    assert torch.equal(outs[0], outs[1])


# ---- torch.library integration --------------------------------------------------------------------


def _a2r_enc_args():
    lq, lk_req = [9, 20], [33, 17]
    q, k, v = _rand((29, 2, D), 16, 0.5), _rand((50, 1, D), 17, 0.5), _rand((50, 1, D), 18)
    tables, buckets = _encoding_inputs(29, 2, 50)
    return (
        q,
        k,
        v,
        lengths_to_offsets(lq),
        lengths_to_offsets(lk_req),
        torch.tensor([1, 0]),
        tables[:2],
        buckets[:2],
    )


@cpu_kernels
def test_opcheck_upstream_extras():
    from ads_gdpa import _ops

    q, k, v, cu_q, cu_k, idx, tables, buckets = _a2r_enc_args()
    for t in (q, k, v, *tables):
        t.requires_grad_()
    no_mask = (0, 1 << 30, 1 << 30, False, None, None, None, None, None, False)
    base = (q, k, v, cu_q, cu_k, 20, 33, 3, None, 1.0, *no_mask)
    extra = dict(kv_index=idx, enc_0=tables[0], enc_1=tables[1], bkt_0=buckets[0], bkt_1=buckets[1])
    args = _ops.FwdArgs(*base, **extra)
    torch.library.opcheck(torch.ops.ads_gdpa.fwd.default, tuple(args))
    fused = _rand((29, 2, 3 * D), 19, 0.5).requires_grad_()
    qkv = _ops.FwdArgs(fused, fused, fused, cu_q, cu_q, 20, 20, 3, None, 1.0, *no_mask, fused=2)
    torch.library.opcheck(torch.ops.ads_gdpa.fwd.default, tuple(qkv))


@cpu_kernels
def test_compile_fullgraph_upstream_extras():
    q, k, v, cu_q, cu_k, idx, tables, buckets = _a2r_enc_args()

    def f(q, k, v, t0, t1):
        o = generalized_dot_product_attention(
            q, k, v, cu_q, cu_k, 20, 33, idx, qk_scale=0.5, activation="silu", ts_encoding_params=t0,
            ts_encoding_bucket_values=buckets[0], pos_emb_params=t1, pos_emb_bucket_values=buckets[1],
        )  # fmt: skip
        return (o.float() * 2).sum()

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, *tables)]
    torch._dynamo.reset()
    loss = torch.compile(f, fullgraph=True, backend="aot_eager")(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    eager = [t.detach().clone().requires_grad_() for t in (q, k, v, *tables)]
    loss_e = f(*eager)
    grads_e = torch.autograd.grad(loss_e, eager)
    torch.testing.assert_close(loss, loss_e)
    for a, b in zip(grads, grads_e):
        torch.testing.assert_close(a, b)


@cpu_kernels
def test_flops_count_each_sequence_of_the_new_modes():
    q, k, v, cu_q, cu_k, idx, *_ = _a2r_enc_args()  # lq [9, 20], requests [33, 17], ads -> [1, 0]
    with FlopCounterMode(display=False) as fc:
        generalized_dot_product_attention(q, k, v, cu_q, cu_k, 20, 33, idx)
    assert fc.get_total_flops() == 4 * 2 * D * (9 * 17 + 20 * 33)
    cu_q2, cu_k2 = torch.tensor([0, 20, 5, 29]), torch.tensor([0, 50, 40, 50])  # overlapping spans
    with FlopCounterMode(display=False) as fc:
        generalized_dot_product_attention(
            q, k, v, cu_q2, cu_k2, 24, 50, output_offset=torch.tensor([0, 20, 20, 44]),
            use_start_end_offsets=True, total_num_objects=44,
        )  # fmt: skip
    assert fc.get_total_flops() == 4 * 2 * D * (20 * 50 + 24 * 10)


# ---- GPU, real sizes (marker gpu) -----------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("bwd_det", [False, True], ids=["atomic_dq", "det_dq"])
def test_gpu_serving_shape_shared_kv(bwd_det):
    """96 ads over 8 requests, history 700, queries 64..256, H=4, D=128 (a slice of the serving
    benchmark's shape) against the materialised-KV reference, forward and backward."""
    from ads_gdpa.bench_serving import serving_case

    q, k, v, cu_q, cu_k, a2r, lq = serving_case(96, 8, 700, (64, 256), 4, 128, "cuda", seed=5)
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()  # GQA: 2 kv heads
    cq = cu_q.tolist()
    spans = [(cq[b], cq[b + 1], int(r) * 700, int(r) * 700 + 700, cq[b]) for b, r in enumerate(a2r.tolist())]

    def ours(q, k, v):
        return gdpa_varlen(q, k, v, cu_q, cu_k, 256, 700, activation="fast_gelu", kv_index=a2r,
                           deterministic=bwd_det)  # fmt: skip

    def ref(q, k, v, dtype):
        return compose_ref(q, k, v, spans, sum(lq), dtype=dtype, max_q=256, max_k=700, activation="fast_gelu")

    check(ours, ref, dict(q=q, k=k, v=v), "gpu_serving")


@pytest.mark.gpu
def test_gpu_start_end_and_fused_kv_with_encodings():
    """Start/end spans with GQA and all five encodings, then fused KV with two encodings, D=128."""
    dev = "cuda"
    g = torch.Generator().manual_seed(7)
    full, o = [], 0
    for _ in range(12):
        s = int(torch.randint(0, 900, (1,), generator=g))
        e = min(s + int(torch.randint(0, 300, (1,), generator=g)), 1000)
        ks = int(torch.randint(0, 500, (1,), generator=g))
        full.append((s, e, ks, ks + int(torch.randint(1, 500, (1,), generator=g)), o))
        o += e - s
    cu_q = torch.tensor([x for sp in full for x in sp[0:2]], device=dev)
    cu_k = torch.tensor([x for sp in full for x in sp[2:4]], device=dev)
    cu_o = torch.tensor([x for sp in full for x in (sp[4], sp[4] + sp[1] - sp[0])], device=dev)
    tables, buckets = _encoding_inputs(1000, 4, 60, d=128)
    tables, buckets = [t.to(dev) for t in tables], [b.to(dev) for b in buckets]
    leaves = {f"t{i}": t for i, t in enumerate(tables)}
    leaves.update(q=_rand((1000, 4, 128), 1, 0.3).to(dev), k=_rand((1000, 2, 128), 2, 0.3).to(dev),
                  v=_rand((1000, 2, 128), 3).to(dev))  # fmt: skip

    def ours(q, k, v, **tbl):
        enc = [(tbl[f"t{i}"], buckets[i]) for i in range(5)]
        return gdpa_varlen(q, k, v, cu_q, cu_k, 256, 500, activation="silu", start_end_offsets=True,
                           cu_seqlens_o=cu_o, total_out=o + 3, encodings=enc)  # fmt: skip

    def ref(q, k, v, dtype, **tbl):
        enc = [(tbl[f"t{i}"], buckets[i]) for i in range(5)]
        return compose_ref(q, k, v, full, o + 3, encodings=enc, dtype=dtype, max_q=256, max_k=500,
                           activation="silu")  # fmt: skip

    check(ours, ref, leaves, "gpu_start_end_enc")
    lq = [300, 0, 129, 511]
    cu = lengths_to_offsets(lq, device=dev)
    csr = _csr_spans(lq, lq, lengths_to_offsets(lq).tolist())
    bk = [b[: sum(lq)] for b in buckets[:2]]

    def ours_kv(q, kv, t0, t1):
        return generalized_dot_product_attention(q, kv, None, cu, cu, 511, 511, activation="gelu",
                                                 ts_encoding_params=t0, ts_encoding_bucket_values=bk[0],
                                                 pos_emb_params=t1, pos_emb_bucket_values=bk[1])  # fmt: skip

    def ref_kv(q, kv, t0, t1, dtype):
        enc = [(t0, bk[0]), (t1, bk[1])]
        return compose_ref(q, kv[..., :128], kv[..., 128:], csr, sum(lq), encodings=enc, dtype=dtype,
                           max_q=511, max_k=511, activation="gelu")  # fmt: skip

    leaves = dict(q=_rand((sum(lq), 4, 128), 5, 0.3).to(dev), kv=_rand((sum(lq), 2, 256), 4, 0.3).to(dev),
                  t0=tables[0], t1=tables[1])  # fmt: skip
    check(ours_kv, ref_kv, leaves, "gpu_fused_kv_enc")
