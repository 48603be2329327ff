"""The Gluon query-resident broadcast_q backward (``lp_fa4.gluon.bwd_resident_sm90``): which resident
calls it takes (``bwd_dispatch.resident_gluon_why_not``, CPU-testable), and on an sm_90 GPU its
gradients against the fp32 tools reference (``test_bwd_broadcast._check``) at PMA's query blocks
(128 rows, and 65-127 with the second warpgroup's rows partly past the block), kv lengths 0, 1 and
around the 64-key tile, rows past max_seqlen_q, fp16, poisoned buffers, a user's 1/√D scale, and the
auto plan that sends Lq = 128 to it. Its sm_90 build is checked in test_compile_sm90.py."""

from __future__ import annotations

import pytest
import test_bwd_broadcast
import torch
from fa4_testlib import count_calls
from test_bwd_broadcast import _check
from test_bwd_resident import poisoned_case

from ads_kernel_tools.testing import jagged_lengths
from lp_fa4 import broadcast
from lp_fa4.gluon import bwd_dispatch, bwd_resident_sm90
from lp_fa4.gluon.dispatch import device_reason
from lp_fa4.triton.launch import BIG, Problem
from lp_fa4.triton.launch_bwd import bwd_resident

# around the 64-key tile, empty and one-key sequences, one long
LK = (64, 0, 1, 63, 65, 129, 7, 300)


def _pb(rows_cap: int = BIG) -> Problem:
    return Problem(max_q=128, max_k=300, scale=0.1, softcap=0.0, win_left=BIG, win_right=BIG, top_left=True,
                   broadcast_q=True, rows_cap=rows_cap)  # fmt: skip


def _tensors(device, lq=128, d=128, heads=2):
    q = torch.zeros(lq, heads, d, dtype=torch.bfloat16, device=device)
    k = torch.zeros(40, heads, d, dtype=torch.bfloat16, device=device)
    do = torch.zeros(3 * lq, heads, d, dtype=torch.bfloat16, device=device)
    return q, k, k, do


@pytest.mark.parametrize(
    "env, change, reason",
    [
        ({"LP_FA4_RESIDENT_KERNEL": "triton"}, None, "LP_FA4_RESIDENT_KERNEL=triton"),
        ({"LP_FA4_BACKEND": "triton"}, None, "LP_FA4_BACKEND=triton"),
        ({}, "rows64", "64 query rows (auto takes it from 65)"),
        ({}, "cap", "50 query rows (auto takes it from 65)"),
        ({}, "d64", "head dim 64 (built for 128)"),
        ({"LP_FA4_RESIDENT_KERNEL": "gluon"}, "lq129", "query block over 128 rows"),
        ({}, "strided", "strided or unaligned tensors"),
    ],
)
def test_predicate(env, change, reason, monkeypatch):
    """The first reason a resident call stays on the Triton kernel, options before tensors before the
    device (so every reason is reachable on a CPU)."""
    monkeypatch.setenv("LP_FA4_RESIDENT_KERNEL", "auto")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    q, k, v, do = _tensors("cpu")
    pb = _pb()
    if change == "rows64":
        q = q[:64]
    elif change == "cap":
        pb = _pb(rows_cap=50)
    elif change == "d64":
        q, k, v, do = _tensors("cpu", d=64)
    elif change == "lq129":
        q = torch.zeros(129, 2, 128, dtype=torch.bfloat16)
    elif change == "strided":
        do = torch.zeros(384, 2, 256, dtype=torch.bfloat16)[..., :128]
    assert bwd_dispatch.resident_gluon_why_not(do, q, k, v, pb) == reason


def test_predicate_ends_at_the_device(monkeypatch):
    """A call the kernel takes is kept off a CPU only by the device (and forced by ``gluon`` below 65
    rows)."""
    monkeypatch.setenv("LP_FA4_RESIDENT_KERNEL", "auto")
    q, k, v, do = _tensors("cpu")
    assert bwd_dispatch.resident_gluon_why_not(do, q, k, v, _pb()) == device_reason(q) is not None
    monkeypatch.setenv("LP_FA4_RESIDENT_KERNEL", "gluon")
    assert bwd_dispatch.resident_gluon_why_not(do, q[:32], k, v, _pb()) == device_reason(q)
    monkeypatch.setenv("LP_FA4_RESIDENT_KERNEL", "fast")
    with pytest.raises(ValueError, match="LP_FA4_RESIDENT_KERNEL"):
        bwd_dispatch.resident_gluon_why_not(do, q, k, v, _pb())


def test_plan_takes_resident_at_128_rows_only_with_the_gluon_kernel(monkeypatch):
    """``broadcast._gluon_resident``: the auto plan's view of the kernel by shape and knobs."""
    q = torch.zeros(128, 2, 128, dtype=torch.bfloat16)
    monkeypatch.setenv("LP_FA4_RESIDENT_KERNEL", "auto")
    assert broadcast._gluon_resident(q)
    assert not broadcast._gluon_resident(q[:64])
    assert not broadcast._gluon_resident(torch.zeros(128, 2, 64, dtype=torch.bfloat16))
    assert not broadcast._gluon_resident(torch.zeros(129, 2, 128, dtype=torch.bfloat16))
    monkeypatch.setenv("LP_FA4_RESIDENT_KERNEL", "gluon")
    assert broadcast._gluon_resident(q[:64])
    monkeypatch.setenv("LP_FA4_RESIDENT_KERNEL", "triton")
    assert not broadcast._gluon_resident(q)


@pytest.fixture
def gluon_resident(monkeypatch):
    """Forces the resident plan and its Gluon kernel; the list counts the launches."""
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", "resident")
    monkeypatch.setenv("LP_FA4_RESIDENT_KERNEL", "gluon")
    return count_calls(monkeypatch, bwd_resident_sm90, "launch")


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("lq,max_q", [(128, 128), (100, 100), (65, 65), (128, 90), (40, 40)])
def test_matches_reference(lq, max_q, gluon_resident, device):
    """Both warpgroups' rows, a block shorter than 128 rows (rows past it arrive as TMA zeros and
    the next sequence's dO), rows past max_seqlen_q (zero dQ), and a block inside one warpgroup."""
    grads = _check(lq, LK, max_q=max_q, heads=2, kv_heads=2, d=128, deterministic=False, device=device)[-1]
    assert (grads[0][max_q:] == 0).all()
    assert gluon_resident


@pytest.mark.gpu
@pytest.mark.sm90
def test_fp16_many_sequences_real_scale(gluon_resident, device):
    """fp16, 300 sequences by the upstream length rule (more items than SMs: programs walk several),
    the default scale 1/√D."""
    lk = tuple(jagged_lengths(300, 700, 0.5, seed=3))
    _check(128, lk, max_q=128, heads=4, kv_heads=4, d=128, deterministic=False, device=device, seed=5,
           dtype=torch.float16)  # fmt: skip
    assert gluon_resident


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("programs", [1, 2, 3])
@pytest.mark.parametrize("lq", [128, 100])
def test_few_programs_walk_many_items(programs, lq, gluon_resident, monkeypatch, device):
    """One, two or three programs walk every item, so the K/V ring's slots and phases, and the Q/dO
    buffer's, carry over between items of 0, 1, 2, 63-65, 127-129 and up to 700 keys (items without
    keys in between); on a full GPU each program of the reference cases meets one item. With two
    heads, two programs keep one head each (dQ summed in registers over all their items, empty ones
    included, one flush at the end); one or three change head every item (a flush after each item with
    keys, none after the empty ones)."""
    monkeypatch.setattr(bwd_resident_sm90, "num_sms", lambda _device: programs)
    lk = (0, 1, 2, 63, 64, 65, 127, 128, 129, 191, 0, 5, 700, 0)
    _check(lq, lk, max_q=lq, heads=2, kv_heads=2, d=128, deterministic=False, device=device)
    assert gluon_resident


@pytest.mark.gpu
@pytest.mark.sm90
def test_poisoned_buffers_and_rows_outside(gluon_resident, device):
    """``test_bwd_resident.poisoned_case`` at a 120-row block, kv lengths 0, 70, 5 and 64."""
    poisoned_case(120, 8, (0, 70, 5, 64), 128, device)
    assert gluon_resident


@pytest.mark.gpu
@pytest.mark.sm90
def test_auto_plan_runs_it_at_pma_128(monkeypatch, device):
    """Under the auto plan and kernel choice, a PMA call of 128 learned queries (D = 128) runs its
    backward here."""
    monkeypatch.delenv("LP_FA4_BROADCAST_Q", raising=False)
    monkeypatch.setenv("LP_FA4_RESIDENT_KERNEL", "auto")
    calls = count_calls(monkeypatch, bwd_resident_sm90, "launch")
    _check(128, LK[:4], max_q=128, heads=2, kv_heads=2, d=128, deterministic=False, device=device)
    assert calls


@pytest.mark.gpu
@pytest.mark.sm90
def test_rows_past_the_block_do_not_reach_dk_dv(device):
    """The kernel's 128-row Q and dO boxes reach past a 100-row block (capped at 90 rows): into the
    next sequence's dO and the q rows past the cap. Non-finite values there must leave the other
    sequences' dK/dV exactly as with finite ones (before the kernel zeroed those rows in shared
    memory, 0·inf in dV = Pᵀ dO made sequence 0's NaN)."""
    torch.manual_seed(0)
    lq, cap, lk, heads, d = 100, 90, (64, 130, 7), 2, 128
    q = torch.randn(lq, heads, d, dtype=torch.bfloat16, device=device)
    cu_k = torch.tensor([0, 64, 194, 201], dtype=torch.int32, device=device)
    k = torch.randn(201, heads, d, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    do = torch.randn(len(lk) * lq, heads, d, dtype=torch.bfloat16, device=device)
    cu_q = torch.tensor([0, lq], dtype=torch.int32, device=device)
    lse = torch.rand(heads, len(lk) * lq, device=device) + 30.0
    delta = torch.randn(heads, len(lk) * lq, device=device)
    pb = _pb(rows_cap=cap)  # 90 rows computed; every key (max_k 300)
    clean = bwd_resident(do, q, k, v, lse, delta, cu_q, cu_k, None, pb, gluon=True)
    do[lq : 2 * lq] = float("inf")
    q[cap:] = float("nan")
    dirty = bwd_resident(do, q, k, v, lse, delta, cu_q, cu_k, None, pb, gluon=True)
    for other in (slice(0, 64), slice(194, 201)):
        for a, b in zip(clean[1:], dirty[1:]):
            assert torch.isfinite(a[other]).all()
            assert torch.equal(a[other], b[other])
    assert (dirty[0][cap:] == 0).all()  # dQ of rows past the cap; sequence 1's inf rightly reaches the rest


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("lq", [128, 100, 48])
def test_forward_reads_the_one_query_block(lq, one_block_forward, device):
    """``LP_FA4_BQ_FWD_BLOCK=1``: the resident plan's Gluon forward loads every sequence's query
    tiles from the one block (``fwd_sm90.fwd``'s ``q_block``; a tile's rows past the block arrive
    as TMA zeros) instead of a repeated copy; output and gradients against the reference."""
    _check(lq, LK[:4], max_q=lq, heads=2, kv_heads=2, d=128, deterministic=False, device=device)
    assert one_block_forward == [True]


@pytest.fixture
def one_block_forward(monkeypatch):
    """The resident plan with its one-block Gluon forward; the list of each forward call's
    ``q_block``."""
    from lp_fa4.gluon import fwd_sm90

    knobs = {"LP_FA4_BROADCAST_Q": "resident", "LP_FA4_RESIDENT_KERNEL": "auto",
             "LP_FA4_BQ_SMALL_FWD": "auto", "LP_FA4_BQ_FWD_BLOCK": "1"}  # fmt: skip
    for name, value in knobs.items():
        monkeypatch.setenv(name, value)
    blocks = []
    real = fwd_sm90.fwd
    monkeypatch.setattr(fwd_sm90, "fwd", lambda *a, **kw: blocks.append(kw.get("q_block")) or real(*a, **kw))
    return blocks


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("lq,max_q", [(128, 128), (100, 100), (100, 60), (48, 200)])
def test_one_block_forward_writes_every_row(lq, max_q, one_block_forward, monkeypatch, device):
    """The one-block forward's output and LSE are not zero-filled first where every row of each
    sequence's Lq is computed (max_seqlen_q >= Lq); with ``torch.empty`` poisoned with NaN, a row
    the kernel skipped would show. max_seqlen_q < Lq keeps the fill (rows past it are zeros)."""
    real_empty, real_grads = torch.empty, test_bwd_broadcast._grads

    def poisoned_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    def grads_from_poisoned_memory(*args, **kwargs):  # the op's allocations only, not the reference's
        with monkeypatch.context() as m:
            m.setattr(torch, "empty", poisoned_empty)
            return real_grads(*args, **kwargs)

    monkeypatch.setattr(test_bwd_broadcast, "_grads", grads_from_poisoned_memory)
    _check(lq, LK, max_q=max_q, heads=2, kv_heads=2, d=128, deterministic=False, device=device)
    assert one_block_forward == [True]
