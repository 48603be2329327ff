"""The forward's host path: what a call launches and builds per call, and that the shortcuts give the
same results as the general path. Dense offsets are cached and trusted (no clamp launch), dense
non-causal batches take no tile list, FP8 dense batches copy V in one launch, and a call that
autograd does not record takes no autograd.Function."""

from __future__ import annotations

import pytest
import torch

from ads_kernel_tools.kernels.transpose import kv_cols, v_kmajor_relabel
from ads_kernel_tools.testing import lengths_to_offsets, randn
from lp_fa4 import _ops, flash_attn_func, offsets

E4M3 = torch.float8_e4m3fn


def test_dense_offsets_are_cached_and_trusted_only_as_built(device):
    """dense_offsets returns one tensor per (B, L, device) holding b·L; dense_length trusts exactly
    that tensor, unmodified, and only for a tensor of B·L rows."""
    cu = offsets.dense_offsets(3, 40, device)
    assert cu is offsets.dense_offsets(3, 40, device)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 40, 80, 120]
    assert offsets.dense_length(cu, 120) == 40
    assert offsets.dense_length(cu, 119) is None  # other rows: clamped like any offsets
    assert offsets.dense_length(cu.clone(), 120) is None  # equal values, not the built tensor
    assert offsets.dense_length(lengths_to_offsets([40] * 3, device=device), 120) is None
    assert offsets.dense_length(None, 0) is None
    other = offsets.dense_offsets(2, 7, device)
    other.add_(0)  # an in-place write (even a no-op) bumps the version: no longer trusted
    assert offsets.dense_length(other, 14) is None


def test_dense_offsets_cache_is_bounded(device, monkeypatch):
    monkeypatch.setattr(offsets, "_DENSE_MAX", 4)
    monkeypatch.setattr(offsets, "_DENSE", {})
    monkeypatch.setattr(offsets, "_DENSE_IDS", {})
    first = offsets.dense_offsets(1, 1, device)
    for s in range(2, 10):
        offsets.dense_offsets(1, s, device)
    assert len(offsets._DENSE) == 4 and len(offsets._DENSE_IDS) == 4
    assert offsets.dense_length(first, 1) is None  # evicted: clamped from then on


def test_dense_schedule_is_built_once_per_argument_set(device, monkeypatch):
    """The backward's tile list of dense offsets is the general list, built once per (cu_q, cu_k,
    arguments), bounded like the offsets; other offsets or arguments get their own."""
    from ads_kernel_tools.kernels.tile_list import schedule

    monkeypatch.setattr(offsets, "_SCHEDULES", {})
    cu_q, cu_k = offsets.dense_offsets(3, 200, device), offsets.dense_offsets(3, 130, device)
    kw = dict(tile_q=False, block=128, slots=2, heads=2)
    tiles, count = offsets.dense_schedule(cu_q, cu_k, 200, **kw)
    ref_tiles, ref_count = schedule(cu_q, cu_k, 200, **kw)
    assert (
        count.tolist() == ref_count.tolist()
        and tiles[: int(count)].tolist() == ref_tiles[: int(ref_count)].tolist()
    )
    assert offsets.dense_schedule(cu_q, cu_k, 200, **kw)[0] is tiles  # built once
    assert offsets.dense_schedule(cu_q, cu_k, 100, **kw)[0] is not tiles  # another row cap
    assert offsets.dense_schedule(cu_q, cu_k, 200, **{**kw, "heads": 4})[0] is not tiles
    assert offsets.dense_schedule(cu_k, cu_k, 200, **kw)[0] is not tiles  # other offsets
    monkeypatch.setattr(offsets, "_DENSE_MAX", 2)
    for cap in range(1, 6):
        offsets.dense_schedule(cu_q, cu_k, cap, **kw)
    assert len(offsets._SCHEDULES) == 2


@pytest.mark.parametrize("length", [64, 40, 1])
@pytest.mark.parametrize("relabel", [False, True])
def test_v_copy_with_given_starts_matches_the_general_copy(length, relabel, device):
    """v_kmajor_relabel(starts=, width=) of a dense batch (starts b·ceil(L/32)·32, no zero fill)
    holds the general copy's columns, gaps zero, and returns the starts it was given."""
    n_b, hkv, d = 3, 2, 32
    x = randn((n_b * length, hkv, d), dtype=torch.bfloat16, device=device, seed=3).to(E4M3)
    cu = lengths_to_offsets([length] * n_b, device=device)
    starts = kv_cols(cu)
    width = int(starts[-1])
    ref, ref_starts = v_kmajor_relabel(x, cu, relabel=relabel, max_len=length)
    got, got_starts = v_kmajor_relabel(x, cu, relabel=relabel, max_len=length, starts=starts, width=width)
    assert got_starts is starts and torch.equal(ref_starts, starts)
    assert got.shape == (hkv * d, width)
    assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8)[:, :width])


def test_v_copy_rejects_half_or_bad_starts(device):
    x = torch.zeros(64, 1, 32, dtype=E4M3, device=device)
    cu = lengths_to_offsets([32, 32], device=device)
    with pytest.raises(ValueError, match="together"):
        v_kmajor_relabel(x, cu, starts=cu)
    with pytest.raises(ValueError, match="multiple of 16"):
        v_kmajor_relabel(x, cu, starts=cu, width=40)
    with pytest.raises(ValueError, match="int32"):
        v_kmajor_relabel(x, cu, starts=cu.long(), width=64)


@pytest.mark.parametrize("grad", [False, True])
def test_calls_autograd_does_not_record_skip_the_function(grad, device, monkeypatch):
    """Without a gradient to record (no_grad, or no input requiring grad) a plain eager call runs
    the op's implementation itself; with one it takes _EagerAttention and gets a graph."""
    applied = []
    real = _ops._EagerAttention

    class Spy:
        @staticmethod
        def apply(*a):
            applied.append(1)
            return real.apply(*a)

    monkeypatch.setattr(_ops, "_EagerAttention", Spy)
    q, k, v = (randn((2, 33, 2, 32), dtype=torch.bfloat16, device=device, seed=i) for i in range(3))
    out0, _ = flash_attn_func(q, k, v, causal=True)
    with torch.no_grad():
        out1, _ = flash_attn_func(q.requires_grad_(grad), k, v, causal=True)
    assert not applied and out0.grad_fn is None and out1.grad_fn is None
    out2, _ = flash_attn_func(q.requires_grad_(grad), k, v, causal=True)
    assert bool(applied) == grad and (out2.grad_fn is not None) == grad
    assert torch.equal(out0, out1) and torch.equal(out0, out2.detach())


def _launch_args(monkeypatch, device, *, b, s, h, hkv, causal, trusted, fp8=False):
    """fwd_sm90.fwd's host work with the attention launch recorded instead of run (any machine):
    (positional args, keyword args, calls of clamp_offsets, calls of schedule, inputs)."""
    from lp_fa4.gluon import fwd_sm90

    rec, calls = {}, {"clamp": 0, "schedule": 0}

    class Launch:  # the kernel's launch cache
        def launch(self, grid, a, kw, cached=None):
            rec.update(grid=grid, a=a, kw=kw)

    def spy(name, fn):
        def run(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)

        return run

    monkeypatch.setattr(fwd_sm90, "_FWD", Launch())
    monkeypatch.setattr(offsets, "clamp_offsets", spy("clamp", offsets.clamp_offsets))
    monkeypatch.setattr(fwd_sm90, "schedule", spy("schedule", fwd_sm90.schedule))
    d = 128
    dt = E4M3 if fp8 else torch.bfloat16
    q = randn((b * s, h, d), dtype=torch.bfloat16, device=device, seed=1).to(dt)
    k = randn((b * s, hkv, d), dtype=torch.bfloat16, device=device, seed=2).to(dt)
    v = randn((b * s, hkv, d), dtype=torch.bfloat16, device=device, seed=3).to(dt)
    cu = offsets.dense_offsets(b, s, device)
    cu = cu if trusted else cu.clone()
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=device)
    lse = torch.empty(b, h, s, device=device)
    descale = tuple(torch.ones(b, hkv, device=device) for _ in range(3)) if fp8 else None
    fwd_sm90.fwd(q, k, v, cu, cu, None, None, s, s, d**-0.5, causal, out, lse, True, descale=descale)
    return rec["a"], rec["kw"], calls, (q, k, v, cu)


@pytest.mark.parametrize("balance", ["1", "0"])
@pytest.mark.parametrize("trusted", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_host_work(trusted, causal, balance, device, monkeypatch):
    """Trusted dense offsets: no clamp and no tile list; non-causal walks one (b, h) pair per group
    (the list's order), causal groups of at most the L2 budget's pairs, sized for even work per
    program (``lpt_group``) unless LP_FA4_FWD_LPT_BALANCE=0. Untrusted copies of the same offsets:
    clamped, and non-causal builds the list."""
    from lp_fa4.gluon import fwd_sm90

    monkeypatch.setenv("LP_FA4_FWD_LPT_BALANCE", balance)
    b, s, h, hkv = 3, 300, 4, 2
    a, kw, calls, (_, _, _, cu) = _launch_args(
        monkeypatch, device, b=b, s=s, h=h, hkv=hkv, causal=causal, trusted=trusted
    )
    assert calls["clamp"] == (0 if trusted else 1)
    assert (a[10] is cu) == trusted  # cu_q reaches the kernel unclamped only when trusted
    lpt = causal or trusted
    assert kw["LPT"] == lpt and calls["schedule"] == (0 if lpt else 1)
    if lpt and not causal:
        assert a[20] == 1
    if causal:  # b·h pairs' K/V fit in L2 together: the cap
        programs = min(b * h * 3, fwd_sm90.num_sms(device))
        want = fwd_sm90.lpt_group(b * h, 3, programs, b * h, s, s) if balance == "1" else b * h
        assert a[20] == want
    assert a[22] == b * h * 3  # N_ITEMS: ceil(300 / 128) tiles per (b, h)


def _program_loads(pairs, m_tiles, programs, hg):
    """Work per persistent program of the LPT walk (kv tiles + 1 per causal tile, Lq = Lk)."""
    loads = [0] * programs
    t = 0
    for g0 in range(0, pairs, hg):
        gh = min(hg, pairs - g0)
        for idx in range(m_tiles):
            for _ in range(gh):
                loads[t % programs] += (m_tiles - idx) + 1
                t += 1
    return loads


@pytest.mark.parametrize("b,s,cap", [(8, 2048, 24), (4, 4096, 12), (2, 8192, 6), (32, 512, 96)])
def test_lpt_group_evens_the_programs_work(b, s, cap):
    """H=16 batches of 16k tokens on 132 programs: the chosen group never leaves the busiest program
    more work than the L2-sized group does, and at most 6 % over the mean (the L2-sized group alone
    leaves up to ~18 %)."""
    from lp_fa4.gluon import fwd_sm90

    pairs, m_tiles = b * 16, s // 128
    hg = fwd_sm90.lpt_group(pairs, m_tiles, 132, cap, s, s)
    assert 1 <= hg <= cap
    chosen, l2 = _program_loads(pairs, m_tiles, 132, hg), _program_loads(pairs, m_tiles, 132, cap)
    mean = sum(chosen) / 132
    assert max(chosen) <= max(l2) and max(chosen) <= 1.06 * mean, (hg, max(chosen) / mean, max(l2) / mean)


@pytest.mark.parametrize("s", [256, 300])
def test_fp8_dense_v_copy_columns(s, device, monkeypatch):
    """FP8 dense: V's K-major copy starts sequence b at column b·ceil(L/32)·32 (the trusted offsets
    themselves when L is a multiple of 32), no column past the last sequence, the general copy's
    content."""
    import ads_kernel_tools.kernels.transpose as tr

    def no_scan(cu):
        raise AssertionError("kv_cols ran for a dense FP8 call")

    b, h, hkv = 3, 4, 2
    with monkeypatch.context() as mp:
        mp.setattr(tr, "kv_cols", no_scan)
        a, kw, calls, (_, _, v, cu) = _launch_args(
            monkeypatch, device, b=b, s=s, h=h, hkv=hkv, causal=False, trusted=True, fp8=True
        )
    l32 = -(-s // 32) * 32
    vcol, v_desc = a[26], a[2]
    assert vcol.tolist() == [i * l32 for i in range(b + 1)] and (vcol is cu) == (s == l32)
    assert v_desc.shape == [hkv * 128, b * l32]
    ref, _ = v_kmajor_relabel(v, lengths_to_offsets([s] * b, device=device), relabel=False, max_len=s)
    assert torch.equal(v_desc.base.view(torch.uint8), ref.view(torch.uint8)[:, : b * l32])
    assert calls["clamp"] == 0 and calls["schedule"] == 0 and kw["LPT"]


# ---------------------------------------------------------------------------------------------
# GPU: the dense shortcuts launch less and compute the same bits as the general path
# ---------------------------------------------------------------------------------------------


def _forbid(monkeypatch, module, name):
    def boom(*a, **k):
        raise AssertionError(f"{name} ran for a dense call")

    monkeypatch.setattr(module, name, boom)


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,s", [(torch.bfloat16, 700), (E4M3, 300), (E4M3, 512)])
def test_dense_call_launches_less_and_matches_the_general_path(dtype, s, causal, device, monkeypatch):
    """flash_attn_func on a dense batch runs no clamp and no tile list (and, FP8, no column scan),
    and gives bit for bit what fwd_sm90.fwd gives on untrusted copies of the same offsets with the
    sorted tile list (non-causal) and the general V copy."""
    from lp_fa4.bench import quantise_fp8
    from lp_fa4.gluon import fwd_sm90

    b, h, hkv, d = 3, 4, 2, 128
    src = [
        randn((b, s, n, d), dtype=torch.bfloat16, device=device, seed=60 + i)
        for i, n in enumerate((h, hkv, hkv))
    ]
    kw = {}
    if dtype == E4M3:
        (q, qd), (k, kd), (v, vd) = (quantise_fp8(t, hkv) for t in src)
        kw = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    else:
        q, k, v = src
    with monkeypatch.context() as mp:
        _forbid(mp, offsets, "clamp_offsets")
        _forbid(mp, fwd_sm90, "schedule")
        import ads_kernel_tools.kernels.transpose as tr

        _forbid(mp, tr, "kv_cols")
        out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True, **kw)
    cu = lengths_to_offsets([s] * b, device=device)
    q3, k3, v3 = (t.reshape(b * s, *t.shape[2:]) for t in (q, k, v))
    ref = torch.full(q3.shape, float("nan"), dtype=out.dtype, device=device)
    ref_lse = torch.full((b, h, s), float("nan"), device=device)
    descale = None if dtype != E4M3 else (kw["q_descale"], kw["k_descale"], kw["v_descale"])
    fwd_sm90.fwd(q3, k3, v3, cu, cu.clone(), None, None, s, s, d**-0.5, causal, ref, ref_lse, True,
                 lpt=None if causal else False, descale=descale)  # fmt: skip
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(out.reshape(ref.shape), ref) and torch.equal(lse, ref_lse)


def test_broadcast_q_forward_reads_the_one_query_block(device, monkeypatch):
    """By default (``LP_FA4_BQ_FWD_BLOCK=1``) a broadcast_q forward on the Gluon kernel (the resident plan)
    passes the one query block and ``batch_offsets`` for the output rows (``q_block``): no repeated
    copy of the queries. The launch gets a Q view of Lq rows, an output view of B·Lq rows and
    q_from_cu = 0; an ordinary call 1."""
    from lp_fa4.gluon import dispatch, fwd_sm90
    from lp_fa4.triton.launch import BIG, Problem

    seen = {}
    monkeypatch.delenv("LP_FA4_BQ_FWD_BLOCK", raising=False)
    monkeypatch.setattr(dispatch, "why_not", lambda *a, **kw: None)
    monkeypatch.setattr(fwd_sm90, "fwd", lambda q, k, v, cu_q, *a, **kw: seen.update(q=q, cu_q=cu_q, kw=kw))
    monkeypatch.setattr(dispatch, "repeat_queries", lambda *a: pytest.fail("queries repeated"))
    n_b, lq, h, d = 3, 100, 2, 128
    q = randn((lq, h, d), dtype=torch.bfloat16, device=device, seed=1)
    k = randn((50, h, d), dtype=torch.bfloat16, device=device, seed=2)
    cu_k = lengths_to_offsets([10, 0, 40], device=device)
    out = torch.empty(n_b * lq, h, d, dtype=torch.bfloat16, device=device)
    lse = torch.empty(h, n_b * lq, device=device)
    pb = Problem(max_q=lq, max_k=40, scale=0.1, softcap=0.0, win_left=BIG, win_right=BIG, top_left=True,
                 broadcast_q=True, rows_cap=BIG)  # fmt: skip
    cu_q = torch.tensor([0, lq], dtype=torch.int32, device=device)
    dispatch.fwd(q, k, k, cu_q, cu_k, None, None, None, None, pb, out, lse, False)
    assert seen["q"] is q and seen["kw"]["q_block"] is True
    assert seen["cu_q"].tolist() == [0, lq, 2 * lq, 3 * lq]
    monkeypatch.setenv("LP_FA4_BQ_FWD_BLOCK", "0")  # opted out: a repeated copy of the queries
    monkeypatch.setattr(dispatch, "repeat_queries", lambda q, n: (q.repeat(n, 1, 1), cu_out))
    cu_out = offsets.batch_offsets(n_b, lq, device)
    dispatch.fwd(q, k, k, cu_q, cu_k, None, None, None, None, pb, out, lse, False)
    assert seen["q"].shape[0] == n_b * lq and seen["kw"]["q_block"] is False

    rec = {}

    class Launch:  # the kernel's launch cache
        def launch(self, grid, a, kw, cached=None):
            rec.update(a=a, kw=kw)

    monkeypatch.undo()
    monkeypatch.setattr(fwd_sm90, "_FWD", Launch())
    for q_block, q_rows in ((True, lq), (False, n_b * lq)):
        q_in = q if q_block else q.repeat(n_b, 1, 1)
        fwd_sm90.fwd(
            q_in, k, k, cu_out, cu_k, None, None, lq, 40, 0.1, False, out, lse, False, q_block=q_block
        )
        assert list(rec["a"][0].shape) == [q_rows, h * d]  # Q view
        assert list(rec["a"][3].shape) == [n_b * lq, h * d]  # output view
        assert rec["a"][-1] == (0 if q_block else 1)  # q_from_cu
