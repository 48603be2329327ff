import math

import pytest
import torch

from ads_kernel_tools import testing as tt


def test_jagged_lengths_full_and_half():
    assert tt.jagged_lengths(50, 128, 1.0, seed=1) == [128] * 50
    half = tt.jagged_lengths(4000, 100, 0.5, seed=2)
    assert min(half) >= 1 and max(half) <= 100
    assert sum(half) / len(half) == pytest.approx(50.5, rel=0.05)  # uniform on [1, 100]


def test_jagged_lengths_bounds_by_rule():
    s07 = tt.jagged_lengths(3000, 1000, 0.7, seed=3)
    assert min(s07) >= 400 and max(s07) <= 1000  # [(2s-1)·max, max]
    assert sum(s07) / len(s07) == pytest.approx(700, rel=0.03)
    s02 = tt.jagged_lengths(3000, 1000, 0.2, seed=4)
    assert min(s02) >= 1 and max(s02) <= 400  # [1, 2s·max]
    assert tt.jagged_lengths(5, 10, 0.7, seed=9) == tt.jagged_lengths(5, 10, 0.7, seed=9)
    with pytest.raises(ValueError):
        tt.jagged_lengths(2, 10, 0.0)


def test_offsets_and_edges():
    off = tt.lengths_to_offsets([3, 0, 2])
    assert off.dtype == torch.int32 and off.tolist() == [0, 3, 3, 5]
    assert tt.lengths_to_offsets([], dtype=torch.int64).tolist() == [0]
    with pytest.raises(ValueError):
        tt.lengths_to_offsets([1, -1])
    assert tt.edge_lengths(64, long=300) == [0, 1, 63, 64, 65, 300]


def test_randn_is_seeded_and_device_independent():
    a = tt.randn((3, 4), seed=7, dtype=torch.bfloat16)
    b = tt.randn((3, 4), seed=7, dtype=torch.bfloat16)
    assert a.dtype == torch.bfloat16 and torch.equal(a, b)
    assert not torch.equal(a, tt.randn((3, 4), seed=8, dtype=torch.bfloat16))


def test_poison_and_rows_written():
    out = tt.poisoned_empty((4, 2, 3), dtype=torch.float16, device="cpu")
    assert torch.isnan(out).all()
    valid = torch.tensor([True, False, True, False])
    out[0] = 1.0
    with pytest.raises(AssertionError, match=r"valid rows not .*\[2\]"):
        tt.assert_rows_written(out, valid)
    out[2] = 2.0
    tt.assert_rows_written(out, valid)
    out[3, 1, 1] = 0.0
    with pytest.raises(AssertionError, match=r"should not be, first \[3\]"):
        tt.assert_rows_written(out, valid)
    out[3] = math.nan
    out[0, 0, 0] = math.inf  # a written-but-infinite row is not "written correctly"
    with pytest.raises(AssertionError, match=r"\[0\]"):
        tt.assert_rows_written(out, valid)


def _interpreted_dot_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
        r = tl.arange(0, N)
        a = tl.load(a_ptr + r[:, None] * N + r[None, :])
        b = tl.load(b_ptr + r[:, None] * N + r[None, :])
        tl.store(c_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))

    return dot_kernel


def test_interpreter_bf16_dot_bug_and_fix(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = _interpreted_dot_kernel()  # decorated now, so it is the interpreted variant
    n = 16
    a = tt.randn((n, n), seed=1, dtype=torch.bfloat16)
    b = tt.randn((n, n), seed=2, dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    was = tt.bf16_dot_patched()
    tt.remove_interpreter_patches()
    try:
        c = torch.empty(n, n, dtype=torch.float32)
        kernel[(1,)](a, b, c, N=n)
        assert (c - ref).abs().max() > 1e3, "interpreter bf16 dot no longer broken: patch may be obsolete"
        with tt.interpreter_bf16_dot_patch() as active:
            assert active
            kernel[(1,)](a, b, c, N=n)
            torch.testing.assert_close(c, ref, atol=1e-4, rtol=1e-4)
        # fp16 goes through untouched and was right all along
        c16 = torch.empty(n, n, dtype=torch.float32)
        kernel[(1,)](a.half(), b.half(), c16, N=n)
        torch.testing.assert_close(c16, a.half().float() @ b.half().float(), atol=1e-3, rtol=1e-3)
    finally:
        if was:
            tt.apply_interpreter_patches(force=True)


def test_patch_is_noop_without_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    was = tt.bf16_dot_patched()
    if not was:
        assert tt.apply_interpreter_patches() is False
        assert not tt.bf16_dot_patched()


def test_patch_idempotent():
    pytest.importorskip("triton")
    was = tt.bf16_dot_patched()
    tt.apply_interpreter_patches(force=True)
    from triton.runtime.interpreter import InterpreterBuilder

    once = InterpreterBuilder.create_dot
    tt.apply_interpreter_patches(force=True)
    assert InterpreterBuilder.create_dot is once
    if not was:
        tt.remove_interpreter_patches()
        assert not tt.bf16_dot_patched()


def _interpreted_cast_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def cast_kernel(x_ptr, y_ptr, N: tl.constexpr):
        r = tl.arange(0, N)
        tl.store(y_ptr + r, tl.load(x_ptr + r).to(tl.bfloat16))

    return cast_kernel


def test_interpreter_bf16_cast_rounds_to_nearest_even(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = _interpreted_cast_kernel()
    # 1 + 2^-8 + 2^-9 lies closer to 1 + 2^-7 than to 1; 1 + 2^-8 is a tie that goes to even (1.0);
    # 1 + 3·2^-8 is a tie that goes to even (1 + 2^-6); NaN and inf must survive
    x = torch.tensor(
        [
            1 + 2**-8 + 2**-9,
            1 + 2**-8,
            1 + 3 * 2**-8,
            -(1 + 2**-8 + 2**-9),
            3.0e38,
            math.inf,
            -math.inf,
            math.nan,
            0.0,
            -1e-40,
            1e-3,
            123.456,
            0,
            0,
            0,
            0,
        ],
        dtype=torch.float32,
    )
    expected = x.to(torch.bfloat16)  # torch rounds to nearest even, as the GPU does
    was = tt.bf16_dot_patched()
    tt.remove_interpreter_patches()
    try:
        y = torch.empty(16, dtype=torch.bfloat16)
        kernel[(1,)](x, y, N=16)
        assert y[0].item() == 1.0, "interpreter cast no longer truncates: patch may be obsolete"
        with tt.interpreter_bf16_dot_patch():
            kernel[(1,)](x, y, N=16)
        assert torch.isnan(y[7])
        keep = ~torch.isnan(expected)
        assert torch.equal(y[keep], expected[keep]), (y, expected)
    finally:
        if was:
            tt.apply_interpreter_patches(force=True)


def _interpreted_loop_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def loop_kernel(x_ptr, out_ptr, n, n_ptr):
        acc = 0.0
        for i in range(n):  # bound from a runtime argument
            acc += tl.load(x_ptr + i)
        m = tl.load(n_ptr)
        for i in range(m):  # bound loaded from memory
            acc += 10.0 * tl.load(x_ptr + i)
        tl.store(out_ptr, acc)

    return loop_kernel


def test_interpreter_runtime_loop_bounds(monkeypatch):
    pytest.importorskip("triton")
    from triton.runtime.errors import InterpreterError

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = _interpreted_loop_kernel()
    x = torch.arange(1.0, 6.0)
    out = torch.zeros(1)
    m = torch.tensor([2], dtype=torch.int32)
    was = tt.bf16_dot_patched()
    tt.remove_interpreter_patches()
    try:
        import numpy as np

        if int(np.__version__.split(".")[0]) >= 2:
            with pytest.raises(InterpreterError, match="0-dimensional"):
                kernel[(1,)](x, out, 3, m)
        with tt.interpreter_bf16_dot_patch():
            kernel[(1,)](x, out, 3, m)
        assert out.item() == (1 + 2 + 3) + 10 * (1 + 2)
    finally:
        if was:
            tt.apply_interpreter_patches(force=True)


def _interpreted_fp8_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def fp8_kernel(x_ptr, y_ptr, z_ptr, N: tl.constexpr):
        r = tl.arange(0, N)
        x = tl.load(x_ptr + r)
        tl.store(y_ptr + r, x.to(tl.float8e4nv))
        tl.store(z_ptr + r, x.to(tl.float8e5))

    return fp8_kernel


def test_interpreter_fp8_casts_round_and_saturate(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = _interpreted_fp8_kernel()
    x = torch.tensor([0.49, 0.124, 1.0, 3.1, 500.0, -0.49, 1e-4, 0.0, -7.9, 0.3, 250.0, 1e6, -1e6, 0.06,
                      2.0**-9, 100.0], dtype=torch.float32)  # fmt: skip
    n = x.numel()
    y = torch.empty(n, dtype=torch.float8_e4m3fn)
    z = torch.empty(n, dtype=torch.float8_e5m2)
    was = tt.bf16_dot_patched()
    tt.remove_interpreter_patches()
    try:
        kernel[(1,)](x, y, z, N=n)
        assert y[0].float().item() == 0.25, "interpreter fp8 cast no longer broken: patch may be obsolete"
        with tt.interpreter_bf16_dot_patch():
            kernel[(1,)](x, y, z, N=n)
        # the GPU's e4m3 conversion saturates to ±448; torch rounds to nearest even like the GPU
        expect_e4m3 = x.clamp(-448, 448).to(torch.float8_e4m3fn)
        assert torch.equal(y.view(torch.uint8), expect_e4m3.view(torch.uint8)), (y, expect_e4m3)
        assert torch.equal(z.view(torch.uint8), x.to(torch.float8_e5m2).view(torch.uint8))
        assert y[0].float().item() == 0.5 and y[4].float().item() == 448.0
    finally:
        if was:
            tt.apply_interpreter_patches(force=True)
