import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from ads_kernel_tools.compile_check import compile_for, ptx_counts, signature  # noqa: E402


@triton.jit
def _matmul_tile(A, B, C, n, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    mask = r[:, None] < n
    a = tl.load(A + r[:, None] * BLOCK + r[None, :], mask=mask, other=0.0)
    b = tl.load(B + r[:, None] * BLOCK + r[None, :])
    tl.store(C + r[:, None] * BLOCK + r[None, :], tl.dot(a, b), mask=mask)


def test_signature_fills_defaults_and_rejects_unknown_names():
    sig = signature(_matmul_tile, {"A": "*bf16", "B": "*bf16", "C": "*fp32"}, {"BLOCK": 64})
    assert sig == {"A": "*bf16", "B": "*bf16", "C": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    with pytest.raises(ValueError, match="no arguments named"):
        signature(_matmul_tile, {"X": "*bf16"}, {})


def test_hopper_build_uses_wgmma_and_ampere_does_not():
    types = {"A": "*bf16", "B": "*bf16", "C": "*fp32"}
    hopper = ptx_counts(compile_for(_matmul_tile, types=types, constexprs={"BLOCK": 64}, arch=90))
    ampere = ptx_counts(compile_for(_matmul_tile, types=types, constexprs={"BLOCK": 64}, arch=80))
    assert hopper["wgmma"] > 0 and hopper["mma"] == 0
    assert ampere["wgmma"] == 0 and ampere["mma"] > 0
    assert hopper["local_memory"] == 0


def test_compile_errors_surface():
    from triton.compiler.errors import CompilationError

    with pytest.raises(CompilationError):  # a non-power-of-two tile cannot lower
        compile_for(_matmul_tile, types={"A": "*bf16", "B": "*bf16", "C": "*fp32"}, constexprs={"BLOCK": 48})


def test_batch_runs_in_a_clean_child_under_the_interpreter(monkeypatch):
    from ads_kernel_tools.compile_check import ptx_counts_batch

    job = {
        "module": __name__,
        "kernel": "_matmul_tile",
        "types": {"A": "*bf16", "B": "*bf16", "C": "*fp32"},
        "constexprs": {"BLOCK": 64},
    }
    bad = dict(job, constexprs={"BLOCK": 48})
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # forces the child process path
    ok, failed = ptx_counts_batch([job, bad])
    assert ok["wgmma"] > 0
    assert "CompilationError" in failed["error"]
