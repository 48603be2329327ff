import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from ads_kernel_tools.compile_check import (  # noqa: E402
    compile_for,
    counts_between,
    ptx_counts,
    ptx_counts_batch,
    signature,
)


@triton.jit
def _matmul_tile(A, B, C, n, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    mask = r[:, None] < n
    a = tl.load(A + r[:, None] * BLOCK + r[None, :], mask=mask, other=0.0)
    b = tl.load(B + r[:, None] * BLOCK + r[None, :])
    tl.store(C + r[:, None] * BLOCK + r[None, :], tl.dot(a, b), mask=mask)


@triton.jit
def _copy(X, Y, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tl.store(Y + r, tl.load(X + r))


def test_divisible_arguments_are_specialised_like_the_runtime_does():
    """Only pointers known to be 16-byte aligned get vector loads: the launcher's specialisation."""
    job = {
        "module": __name__,
        "kernel": "_copy",
        "types": {"X": "*fp32", "Y": "*fp32"},
        "constexprs": {"BLOCK": 256},
    }
    plain, aligned = ptx_counts_batch([job, dict(job, divisible=["X", "Y"])])
    assert plain["vector_load"] == 0 and aligned["vector_load"] > 0
    with pytest.raises(ValueError, match="no arguments named"):
        compile_for(_copy, types={}, constexprs={"BLOCK": 256}, divisible=["Z"])


def test_signature_fills_defaults_and_rejects_unknown_names():
    sig = signature(_matmul_tile, {"A": "*bf16", "B": "*bf16", "C": "*fp32"}, {"BLOCK": 64})
    assert sig == {"A": "*bf16", "B": "*bf16", "C": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    with pytest.raises(ValueError, match="no arguments named"):
        signature(_matmul_tile, {"X": "*bf16"}, {})


JOB = {
    "module": __name__,
    "kernel": "_matmul_tile",
    "types": {"A": "*bf16", "B": "*bf16", "C": "*fp32"},
    "constexprs": {"BLOCK": 64},
}


def test_hopper_build_uses_wgmma_and_ampere_does_not():
    hopper, ampere = ptx_counts_batch([dict(JOB, arch=90), dict(JOB, arch=80)])
    assert hopper["wgmma"] > 0 and hopper["mma"] == 0
    assert ampere["wgmma"] == 0 and ampere["mma"] > 0
    assert hopper["local_memory"] == 0


def test_compile_for_in_process():
    """Direct compilation (the batch runs the same function in its child)."""
    from triton.compiler.errors import CompilationError

    from ads_kernel_tools.capability import interpreter_active

    if interpreter_active():
        pytest.skip("kernels defined under the interpreter cannot be lowered in this process")

    @triton.jit
    def add_one(X, BLOCK: tl.constexpr):
        r = tl.arange(0, BLOCK)
        tl.store(X + r, tl.load(X + r) + 1)

    compiled = compile_for(add_one, types={"X": "*fp32"}, constexprs={"BLOCK": 64}, arch=90)
    assert ptx_counts(compiled)["wgmma"] == 0 and "ld.global" in compiled.asm["ptx"]
    with pytest.raises(CompilationError):  # a non-power-of-two range cannot lower
        compile_for(add_one, types={"X": "*fp32"}, constexprs={"BLOCK": 48})


def test_batch_runs_in_a_clean_child_under_the_interpreter(monkeypatch):
    job = JOB
    bad = dict(job, constexprs={"BLOCK": 48})
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # forces the child process path
    ok, failed = ptx_counts_batch([job, bad])
    assert ok["wgmma"] > 0
    assert "CompilationError" in failed["error"]


def test_counts_between_counts_per_start_until_the_stop():
    text = "wait1\nmufu\nadd\nmufu\nwait0\nmufu\nwait1\nwait0\nwait1\nmufu"
    assert counts_between(text, r"^wait1$", r"^wait0$", r"mufu") == [2, 0, 1]
    assert counts_between(text, r"absent", r"wait0", r"mufu") == []


def test_sass_between_reports_what_runs_under_the_wgmma():
    """The SASS of a Hopper GEMM tile: stores follow the wgmma wait, none run while it is in flight."""
    spec = {"stores_after_wait": [r"WARPGROUP\.DEPBAR", r"EXIT", r"\bSTG"],
            "stores_under_wgmma": [r"HGMMA.*gsb0", r"WARPGROUP\.DEPBAR", r"\bSTG"]}  # fmt: skip
    (counts,) = ptx_counts_batch([dict(JOB, arch=90, sass_between=spec)])
    assert counts["stores_after_wait"] and max(counts["stores_after_wait"]) > 0
    assert counts["stores_under_wgmma"] and max(counts["stores_under_wgmma"]) == 0
