"""GPU tests at real sizes (marked gpu: skipped without CUDA): the upstream TLX test shapes, jagged
batches of the benchmark's distribution, head dims 64/128/256, GQA, windows, determinism, FBGEMM
compatibility, and bad offsets under compute-sanitizer memcheck."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from jfa_testlib import Case, inputs, run_case

from ads_jfa import jagged_flash_attention
from ads_kernel_tools.testing import assert_memcheck_clean, jagged_lengths, randn

pytestmark = pytest.mark.gpu

UPSTREAM = (128, 37, 200)  # the TLX tests' kv lengths


def test_upstream_pma_shape():
    """PMA: kv [128, 37, 200], Lq = 128 broadcast queries, H = 2, D = 128."""
    run_case(Case((128,), UPSTREAM, broadcast_q=True, d=128), "cuda")


def test_upstream_window_32():
    run_case(Case(UPSTREAM, window=32, d=128), "cuda")


def test_upstream_dense():
    run_case(Case((128, 128, 128), d=128), "cuda")


LENS = tuple(jagged_lengths(24, 1024, 0.5, seed=1))
LENS_K = tuple(jagged_lengths(24, 768, 0.5, seed=2))


@pytest.mark.parametrize("window", [None, 32, 256], ids=lambda w: f"w{w}")
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_jagged_real_sizes(window, cross):
    run_case(Case(LENS, LENS_K if cross else None, window=window, heads=4, kv_heads=4, d=128), "cuda")


@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (256, torch.bfloat16)], ids=["d64fp16", "d256bf16"])
def test_head_dims(d, dtype):
    run_case(Case(LENS[:8], LENS_K[:8], window=100, heads=4, kv_heads=2, d=d, dtype=dtype), "cuda")


def test_gqa_broadcast_q_pma_lq32():
    run_case(Case((32,), LENS, broadcast_q=True, heads=8, kv_heads=2, d=128), "cuda")


def test_rows_past_max_seq_len_q():
    run_case(Case(LENS, LENS_K, max_q=300, window=64, heads=4, kv_heads=1, d=128, int64=True), "cuda")


@pytest.mark.parametrize("broadcast_q", [False, True], ids=["jagged", "broadcast_q"])
def test_deterministic_bitwise(broadcast_q):
    lq = (128,) if broadcast_q else LENS
    case = Case(lq, LENS_K, heads=4, kv_heads=2, d=128, broadcast_q=broadcast_q)
    q, k, v, cu_q, cu_k, lk = inputs(case, "cuda")
    out0 = jagged_flash_attention(q, k, v, cu_q, cu_k, max(lq), max(lk), broadcast_q=broadcast_q)
    do = randn(out0.shape, dtype=q.dtype, device="cuda", seed=7)
    runs = []
    for _ in range(3):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = jagged_flash_attention(*leaves, cu_q, cu_k, max(lq), max(lk), broadcast_q=broadcast_q,
                                     deterministic=True)  # fmt: skip
        runs.append((out, *torch.autograd.grad(out, leaves, do)))
    for a, b in zip(runs[0], runs[1]):
        assert torch.equal(a, b)
    for a, b in zip(runs[0], runs[2]):
        assert torch.equal(a, b)


def test_fbgemm_real_size():
    from test_fbgemm import fbgemm_math

    from ads_jfa.fbgemm import jagged_flash_attention_basic
    from ads_kernel_tools.testing import lengths_to_offsets
    from ads_kernel_tools.tolerance import assert_close_vs_baseline

    lens = jagged_lengths(16, 512, 0.5, seed=3)
    m = 384
    offsets = lengths_to_offsets(lens, device="cuda", dtype=torch.int64)
    q, k, v = (randn((sum(lens), 128), dtype=torch.bfloat16, device="cuda", seed=i) for i in range(3))
    for use_mask in (False, True):
        out = jagged_flash_attention_basic(q, k, v, offsets, m, use_mask=use_mask)
        ref = fbgemm_math(*(t.double()[None] for t in (q, k, v)), offsets.cpu(), m, use_mask)[0]
        base = fbgemm_math(*(t[None] for t in (q, k, v)), offsets.cpu(), m, use_mask)[0]
        assert_close_vs_baseline(out, ref, base, name=f"fbgemm use_mask={use_mask}")


@pytest.mark.parametrize(
    "cu_q,cu_k",
    [
        ([0, 5, 999, 22], [0, 16, 19, 28]),
        ([0, -7, 22, 22], [0, 40, 2, 28]),
        ([30, 2, 22, -1], [0, 16, 19, 1 << 30]),
    ],
    ids=["past-end", "negative-decreasing", "garbage"],
)
def test_bad_device_offsets_finish_finite(cu_q, cu_k):
    """Device offsets that lie are not read by the host (no sync): the engine clamps every span, so
    forward and backward finish with finite values (memcheck below proves no stray access)."""
    q = randn((22, 4, 64), dtype=torch.bfloat16, device="cuda").requires_grad_()
    k = randn((28, 2, 64), dtype=torch.bfloat16, device="cuda", seed=1).requires_grad_()
    cq, ck = (torch.tensor(x, dtype=torch.int32, device="cuda") for x in (cu_q, cu_k))
    out = jagged_flash_attention(q, k, k, cq, ck, 40, 40, window_size=8)
    grads = torch.autograd.grad(out.float().sum(), (q, k))
    for t in (out, *grads):
        assert torch.isfinite(t).all()


def test_bad_offsets_are_memcheck_clean():
    """Every path (jagged, windowed, broadcast_q, GQA, deterministic, FBGEMM) on offsets that decrease,
    pass the end or start below 0: compute-sanitizer memcheck must report 0 errors."""
    script = Path(__file__).with_name("memcheck_bad_offsets.py")
    assert_memcheck_clean(script, done_marker="memcheck_bad_offsets: all paths ran")


def test_int64_index_math_past_2_31_elements():
    """q/k/v of 2^21 rows x 8 heads x 128 = 2^31 elements: the last sequences sit past int32 element
    offsets; they must match the reference computed on their slices alone, forward and backward."""
    from ads_kernel_tools.reference.attention import jagged_attention_ref
    from ads_kernel_tools.testing import lengths_to_offsets
    from ads_kernel_tools.tolerance import assert_close_vs_baseline

    n_seq, length, h, d = 8192, 256, 8, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(n_seq * length, h, d, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(3))  # fmt: skip
    assert q.numel() >= 2**31
    leaves = [t.requires_grad_() for t in (q, k, v)]
    cu = lengths_to_offsets([length] * n_seq, device="cuda")
    out = jagged_flash_attention(*leaves, cu, cu, length, length, window_size=64)
    do = torch.randn(out.shape, device="cuda", generator=g, dtype=torch.bfloat16)
    grads = torch.autograd.grad(out, leaves, do)
    last = slice((n_seq - 2) * length, n_seq * length)  # the last two sequences
    cu2 = lengths_to_offsets([length, length], device="cuda")
    truth = [t.detach()[last].double().requires_grad_() for t in (q, k, v)]
    base = [t.detach()[last].clone().requires_grad_() for t in (q, k, v)]
    r_out, _ = jagged_attention_ref(*truth, cu2, cu2, length, window_size=64, dtype=torch.float64)
    b_out, _ = jagged_attention_ref(*base, cu2, cu2, length, window_size=64, dtype=torch.bfloat16)
    assert_close_vs_baseline(out[last], r_out, b_out, name="out (past 2^31)")
    r_g = torch.autograd.grad(r_out, truth, do[last].double())
    b_g = torch.autograd.grad(b_out, base, do[last])
    for name, a, r, b in zip(("dq", "dk", "dv"), grads, r_g, b_g):
        assert_close_vs_baseline(a[last], r, b, name=f"{name} (past 2^31)")
