"""The query-resident broadcast_q backward (``triton._bwd_resident``): one program per (kv sequence,
head) holding the query block. Against the fp32 tools reference (``test_bwd_broadcast._check``) with
ragged kv lengths including 0 and 1 and tile edges, rows past max_seqlen_q, one query row, head dims
that pad, fp16, poisoned buffers, its plan (``lp_fa4.broadcast.plan``), and on an sm_90 GPU the PMA
shapes through the default (auto) plan: Gluon forward on repeated queries, this backward."""

from __future__ import annotations

import pytest
import torch
from fa4_testlib import count_calls
from test_bwd_broadcast import LK, _check, _grads, _inputs

from ads_kernel_tools.kernels import span_fill
from ads_kernel_tools.testing import jagged_lengths, randn
from lp_fa4 import broadcast, jagged_attention, offsets
from lp_fa4 import config as cfg
from lp_fa4.triton import launch_bwd
from lp_fa4.triton.launch import BIG

# the interpreter's key tile is 16: 15, 16, 17, 33 cross its edges
LK_EDGES = LK + (15, 48, 1)


@pytest.fixture
def resident(monkeypatch):
    """Forces the resident plan; the list counts the backward calls that took the kernel."""
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", "resident")
    return count_calls(monkeypatch, launch_bwd, "bwd_resident")


@pytest.mark.parametrize("lq,d", [(17, 32), (1, 64), (9, 48)])
def test_resident_matches_reference(lq, d, resident, device):
    _check(lq, LK_EDGES, max_q=lq, heads=2, kv_heads=2, d=d, deterministic=False, device=device)
    assert resident


def test_resident_with_small_query_forward(resident, monkeypatch, device):
    """``LP_FA4_BQ_SMALL_FWD=1``: the forward of a short query block on the Triton kernel at
    ``config.bq_fwd_tile`` (the interpreter's tile on a CPU), the backward resident."""
    monkeypatch.setenv("LP_FA4_BQ_SMALL_FWD", "1")
    tiles = []
    real_tile = cfg.bq_fwd_tile
    monkeypatch.setattr(cfg, "bq_fwd_tile", lambda d: tiles.append(d) or real_tile(d))
    _check(17, LK_EDGES, max_q=17, heads=2, kv_heads=2, d=32, deterministic=False, device=device)
    assert resident and tiles


def test_resident_rows_past_max_q(resident, device):
    """Query rows past max_seqlen_q are not computed: zero output and zero dQ there."""
    _, _, _, _, _, _, grads = _check(20, LK, max_q=13, heads=2, kv_heads=2, d=32, deterministic=False,
                                     device=device)  # fmt: skip
    assert (grads[0][13:] == 0).all()
    assert resident


def test_resident_fp16_and_single_sequence(resident, device):
    q, k, v, cu_q, cu_k = _inputs(12, (40,), 3, 3, 32, device, seed=3, dtype=torch.float16)
    do = randn((12, 3, 32), dtype=torch.float16, device=device, seed=5)
    out, grads = _grads(q, k, v, cu_q, cu_k, 12, 40, do, deterministic=False)
    assert all(torch.isfinite(g).all() and g.dtype == torch.float16 for g in grads)
    _check(12, (40,), max_q=12, heads=3, kv_heads=3, d=32, deterministic=False, device=device, seed=3)
    assert resident


def poisoned_case(lq: int, extra: int, lk: tuple[int, ...], d: int, device) -> None:
    """Uninitialised buffers NaN-filled: every gradient finite, keys outside every sequence and q rows
    outside [cu_q[0], cu_q[1]) get zeros; empty kv sequences contribute nothing. Shared with the
    Gluon resident kernel's test."""
    q, k, v, _, cu_k = _inputs(lq + extra, lk, 2, 2, d, device, seed=4)
    k = torch.cat([k, randn((5, 2, d), dtype=k.dtype, device=device, seed=9)])  # rows in no sequence
    v = torch.cat([v, randn((5, 2, d), dtype=v.dtype, device=device, seed=10)])
    cu_q = torch.tensor([0, lq], dtype=torch.int32, device=device)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out, _ = jagged_attention(*leaves, cu_q, cu_k, lq, max(lk), broadcast_q=True)
        live = torch.arange(out.shape[0], device=device) < len(lk) * lq
        do = torch.zeros_like(out)
        do[live] = 1.0
        dq, dk, dv = torch.autograd.grad(out, leaves, do)
        assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
        assert (dq[lq:] == 0).all()
        assert (dk[-5:] == 0).all() and (dv[-5:] == 0).all()
    finally:
        torch.use_deterministic_algorithms(False)


def test_resident_poisoned_buffers_and_rows_outside_cu_q(resident, device):
    poisoned_case(11, 3, (0,) + LK, 32, device)
    assert resident


def test_resident_plan(monkeypatch):
    q = torch.zeros(8, 2, 128, dtype=torch.bfloat16)
    k = torch.zeros(8, 2, 128, dtype=torch.bfloat16)
    no_window = (BIG, BIG)
    monkeypatch.delenv("LP_FA4_BROADCAST_Q", raising=False)
    # a CPU tensor (or the interpreter) never has the Gluon kernels: auto keeps the in-place kernels
    assert broadcast.plan(q, k, k, 4, no_window, False) == "kernel"
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", "resident")
    assert broadcast.plan(q, k, k, 4, no_window, False) == "resident"
    assert broadcast.plan(q, k, k, 4, no_window, True) == "kernel"  # deterministic
    assert broadcast.plan(q, k, k, 4, (3, 3), False) == "kernel"  # window
    assert broadcast.plan(q, k[:, :1], k[:, :1], 4, no_window, False) == "kernel"  # GQA
    long_q = torch.zeros(129, 2, 128, dtype=torch.bfloat16)
    assert broadcast.plan(long_q, k, k, 4, no_window, False) == "kernel"
    assert broadcast.resident_reason(long_q, k, k, no_window, False) == "Lq 129 > 128"
    fp32 = broadcast.resident_reason(q.float(), k.float(), k.float(), no_window, False)
    assert fp32 == "dtype torch.float32"
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", "repeat")
    assert broadcast.plan(q, k, k, 4, no_window, False) == "repeat"
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", "kernel")
    assert broadcast.plan(q, k, k, 4, no_window, False) == "kernel"


@pytest.mark.parametrize("fwd_mode,bwd_mode", [("resident", "kernel"), ("kernel", "resident")])
def test_backward_takes_the_forwards_plan(fwd_mode, bwd_mode, monkeypatch, device):
    """The interface plans once per call and the op carries the plan to its backward
    (``resident_bwd``): the backward plans nothing and ignores an environment changed since."""
    resident_calls = count_calls(monkeypatch, launch_bwd, "bwd_resident")
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", fwd_mode)
    q, k, v, cu_q, cu_k = _inputs(9, LK, 2, 2, 32, device)
    do = randn((len(LK) * 9, 2, 32), dtype=torch.bfloat16, device=device, seed=3)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, _ = jagged_attention(*leaves, cu_q, cu_k, 9, max(LK), broadcast_q=True)
    plans = count_calls(monkeypatch, broadcast, "plan")
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", bwd_mode)
    grads = torch.autograd.grad(out, leaves, do)
    assert not plans and bool(resident_calls) == (fwd_mode == "resident")
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", fwd_mode)  # the same call planned one way throughout
    want = _grads(q, k, v, cu_q, cu_k, 9, max(LK), do, deterministic=False)[1]
    for a, b in zip(grads, want):  # dQ by atomics on a GPU: equal up to the order of its sums
        torch.testing.assert_close(a, b)


def _resident_op_args(q, k, v, cu_q, cu_k, lq, resident_bwd=True):
    """lp_fa4::fwd's inputs for a broadcast_q call whose backward is the query-resident kernel."""
    opts = (lq, int(cu_k.diff().max()), 0.2, 0.0, BIG, BIG, False, True, BIG, False, True, False)
    return (q, k, v, cu_q, cu_k, None, None, None, None, *opts, None, None, None, None, None, resident_bwd)


def test_op_carries_resident_plan(monkeypatch, device):
    """The op's ``resident_bwd`` picks the backward whatever the environment says (default: auto,
    which on a CPU plans ``kernel``); opcheck (fake, autograd, torch.compile) passes with it."""
    monkeypatch.delenv("LP_FA4_BROADCAST_Q", raising=False)
    resident_calls = count_calls(monkeypatch, launch_bwd, "bwd_resident")
    q, k, v, cu_q, cu_k = (t.requires_grad_(t.is_floating_point()) for t in _inputs(9, LK, 2, 2, 32, device))
    args = _resident_op_args(q, k, v, cu_q, cu_k, 9)
    out, _, _ = torch.ops.lp_fa4.fwd(*args)
    torch.autograd.grad(out.float().sum(), (q, k, v))
    assert resident_calls
    torch.library.opcheck(torch.ops.lp_fa4.fwd.default, args)


def test_resident_flag_on_a_call_it_does_not_take_raises(device):
    """``resident_bwd`` set by hand on a GQA call: the backward refuses instead of sending the MHA
    kernel past K/V's heads."""
    q, k, v, cu_q, cu_k = (t.requires_grad_(t.is_floating_point()) for t in _inputs(9, LK, 2, 1, 32, device))
    out, _, _ = torch.ops.lp_fa4.fwd(*_resident_op_args(q, k, v, cu_q, cu_k, 9))
    with pytest.raises(ValueError, match="GQA/MQA"):
        torch.autograd.grad(out.float().sum(), (q, k, v))


def test_resident_plan_through_compile(resident, device):
    """The carried plan reaches the backward of a torch.compile(fullgraph=True) graph too."""
    q, k, v, cu_q, cu_k = _inputs(9, LK, 2, 2, 32, device)
    q.requires_grad_()

    def f(q):
        out, _ = jagged_attention(q, k, v, cu_q, cu_k, 9, max(LK), broadcast_q=True)
        return out.float().square().sum()

    eager = torch.autograd.grad(f(q), q)[0]
    n_eager = len(resident)
    got = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(q), q)[0]
    assert n_eager == 1 and len(resident) > n_eager
    torch.testing.assert_close(got, eager)


def test_dense_keys_skip_the_clamp(resident, monkeypatch, device):
    """Dense key offsets as built (``offsets.batch_offsets``, trusted) reach the resident
    kernel without a clamp launch; the same values in a tensor of the caller's, and lying offsets,
    are clamped (one launch each); the first two give the same gradients."""
    clamps = count_calls(monkeypatch, offsets, "clamp_offsets")
    n_b, s = 4, 12
    q, k, v, cu_q, _ = _inputs(9, (s,) * n_b, 2, 2, 32, device)
    do = randn((n_b * 9, 2, 32), dtype=torch.bfloat16, device=device, seed=3)
    dense = offsets.batch_offsets(n_b, s, device)
    trusted = _grads(q, k, v, cu_q, dense, 9, s, do, deterministic=False)[1]
    assert len(resident) == 1 and not clamps
    own = torch.tensor(dense.tolist(), dtype=torch.int32, device=device)
    clamped = _grads(q, k, v, cu_q, own, 9, s, do, deterministic=False)[1]
    assert len(resident) == 2 and len(clamps) == 1
    for a, b in zip(trusted, clamped):  # dQ by atomics on a GPU: equal up to the order of its sums
        torch.testing.assert_close(a, b)
    lying = torch.tensor([0, 40, 2, 1 << 30, -5], dtype=torch.int32, device=device)
    grads = _grads(q, k, v, cu_q, lying, 9, s, do, deterministic=False)[1]
    assert len(resident) == 3 and len(clamps) == 2
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("block", [(9, 9), (30, 40), (6, 2)])
def test_empty_query_block_gives_zero_key_gradients(block, resident, monkeypatch, device):
    """Query offsets that clamp to no rows (at or past the end of q, or decreasing): the kernel skips
    every item, and dK/dV, taken from ``torch.empty`` (poisoned here), are zero, not left as found.
    The span fill is forced: below its size threshold a whole-buffer fill would hide the case."""
    monkeypatch.setattr(span_fill, "SPAN_FILL_MIN_BYTES", 0)
    real_empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    n_b, s = 3, 12
    q, k, v, _, cu_k = _inputs(9, (s,) * n_b, 2, 2, 32, device)
    do = randn((n_b * 9, 2, 32), dtype=torch.bfloat16, device=device, seed=3)
    cu_q = torch.tensor(block, dtype=torch.int32, device=device)
    monkeypatch.setattr(torch, "empty", poisoned_empty)
    grads = _grads(q, k, v, cu_q, cu_k, 9, s, do, deterministic=False)[1]
    assert len(resident) == 1
    for g in grads:
        assert (g == 0).all()


def test_resident_knobs(monkeypatch):
    monkeypatch.delenv("LP_FA4_RESIDENT_MAX_LQ", raising=False)
    monkeypatch.delenv("LP_FA4_BQ_SMALL_FWD", raising=False)
    assert cfg.resident_max_lq() == cfg.RESIDENT_AUTO_LQ
    assert cfg.bq_small_fwd_rows() == cfg.BQ_SMALL_AUTO_Q
    for raw, rows in (("1", cfg.BQ_SMALL_Q), ("0", 0), ("auto", cfg.BQ_SMALL_AUTO_Q)):
        monkeypatch.setenv("LP_FA4_BQ_SMALL_FWD", raw)
        assert cfg.bq_small_fwd_rows() == rows
    monkeypatch.setenv("LP_FA4_BQ_SMALL_FWD", "sometimes")
    with pytest.raises(ValueError, match="LP_FA4_BQ_SMALL_FWD"):
        cfg.bq_small_fwd_rows()
    monkeypatch.setenv("LP_FA4_RESIDENT_MAX_LQ", "32")
    assert cfg.resident_max_lq() == 32
    for bad in ("129", "-1", "x"):
        monkeypatch.setenv("LP_FA4_RESIDENT_MAX_LQ", bad)
        with pytest.raises(ValueError, match="LP_FA4_RESIDENT_MAX_LQ"):
            cfg.resident_max_lq()
    monkeypatch.setattr(cfg, "interpreter_active", lambda: False)
    monkeypatch.delenv("LP_FA4_RESIDENT_TILE", raising=False)
    assert cfg.resident_tile(64) == (32, 4, 3) and cfg.resident_tile(128) == (128, 8, 2)
    monkeypatch.setenv("LP_FA4_RESIDENT_TILE", "64,4,3")
    assert cfg.resident_tile(32) == (64, 4, 3)
    for bad in ("64,4", "48,4,2", "64,3,2", "64,4,9", "a,b,c"):
        monkeypatch.setenv("LP_FA4_RESIDENT_TILE", bad)
        with pytest.raises(ValueError, match="LP_FA4_RESIDENT_TILE"):
            cfg.resident_tile(32)


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("small_fwd", ["0", "1", "auto"])
@pytest.mark.parametrize("lq", [32, 64, 128])
def test_pma_auto_plan_on_sm90(lq, small_fwd, monkeypatch, device):
    """PMA shapes on the H200 through the default plan: the resident backward up to
    ``RESIDENT_AUTO_LQ`` rows and where the Gluon resident kernel takes the block (65-128 rows at
    D = 128), the Gluon backward on repeated queries otherwise; the Gluon forward on
    repeated queries, or on the resident plan the Triton forward at its 64-row tile for the blocks
    ``LP_FA4_BQ_SMALL_FWD`` names; the answers against the reference."""
    from lp_fa4.gluon import bwd_sm90, fwd_sm90

    monkeypatch.delenv("LP_FA4_BROADCAST_Q", raising=False)
    monkeypatch.delenv("LP_FA4_RESIDENT_MAX_LQ", raising=False)
    monkeypatch.setenv("LP_FA4_BQ_SMALL_FWD", small_fwd)
    fwd_calls = count_calls(monkeypatch, fwd_sm90, "fwd")
    tiles = []
    real_tile = cfg.bq_fwd_tile
    monkeypatch.setattr(cfg, "bq_fwd_tile", lambda d: tiles.append(d) or real_tile(d))
    res_calls = count_calls(monkeypatch, launch_bwd, "bwd_resident")
    gluon_bwd_calls = count_calls(monkeypatch, bwd_sm90, "bwd")
    lk = (0, 1, 127, 128, 129, 2048) + tuple(jagged_lengths(300, 2048, 0.5, seed=lq))
    _check(lq, lk, max_q=lq, heads=4, kv_heads=4, d=128, deterministic=False, device=device, seed=lq)
    want_resident = lq <= cfg.RESIDENT_AUTO_LQ or broadcast._gluon_resident(torch.empty(lq, 4, 128))
    assert bool(res_calls) == want_resident and bool(gluon_bwd_calls) != want_resident
    small = want_resident and lq <= cfg.bq_small_fwd_rows()
    assert bool(tiles) == small and bool(fwd_calls) != small


@pytest.mark.gpu
@pytest.mark.parametrize("small_fwd", ["0", "1"])
@pytest.mark.parametrize("lq,d", [(1, 64), (48, 128), (64, 128), (100, 64)])
def test_resident_real_sizes(lq, d, small_fwd, resident, monkeypatch, device):
    monkeypatch.setenv("LP_FA4_BQ_SMALL_FWD", small_fwd)
    lk = (0, 1, 63, 64, 65) + tuple(jagged_lengths(200, 1024, 0.5, seed=lq))
    _check(lq, lk, max_q=lq, heads=4, kv_heads=4, d=d, deterministic=False, device=device, seed=lq)
    assert resident
