"""GPU tests at real sizes (marker ``gpu``): the production H·D = 512, ragged jagged batches, GQA,
every option, the backward's determinism, and bad offsets under compute-sanitizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _cases import Case, check, make_inputs, run_ours

from ads_kernel_tools.testing import assert_memcheck_clean, jagged_lengths

pytestmark = pytest.mark.gpu

LENS = jagged_lengths(6, 700, 0.5, seed=3) + [0, 1, 127, 128, 129]


@pytest.mark.parametrize("act", ["fast_gelu", "silu"])
def test_all_options_real_size(act):
    check(Case(lengths=LENS, heads=4, heads_kv=2, dim=128, activation=act, scale=1.0 / 256), "cuda")


@pytest.mark.parametrize(
    "opts", [dict(ln="off"), dict(rms="plain", residual=False), dict(ln="plain", q_residual=False)]
)
def test_options_real_size(opts):
    check(Case(lengths=LENS, heads=4, heads_kv=4, dim=128, scale=1.0 / 256, **opts), "cuda")


def test_short_kv_real_size():
    """Jagged queries against 256 keys per sequence: ads-gdpa's short-KV path inside the chain."""
    check(
        Case(lengths=LENS, lengths_k=[256] * len(LENS), heads=4, heads_kv=2, dim=128, scale=1.0 / 64), "cuda"
    )


def test_fp16_wide_token_chunks():
    """H·D = 16·128 = 2048 in one chunk, and 4096 (32 heads) in two."""
    check(Case(lengths=LENS[:4], heads=16, heads_kv=4, dim=128, dtype=torch.float16, scale=1.0 / 256), "cuda")
    check(Case(lengths=LENS[:3], heads=32, heads_kv=8, dim=128, scale=1.0 / 256), "cuda")


def test_deterministic_real_size():
    c = Case(lengths=LENS, heads=4, heads_kv=1, dim=128, scale=1.0 / 256)
    ins = make_inputs(c, "cuda")
    ws = [ins[k].requires_grad_() for k in ("q", "ln_w", "ln_b", "rms_w")]
    runs = []
    for _ in range(2):
        out = run_ours(c, ins, deterministic=True)
        runs.append(torch.autograd.grad(out, ws, ins["dout"]))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_bad_offsets_are_memcheck_clean():
    """Offsets that decrease, pass the end or start below 0 through every kernel, forward and
    backward: compute-sanitizer's memcheck must find 0 errors."""
    script = Path(__file__).with_name("memcheck_case.py")
    assert_memcheck_clean(script, done_marker="all paths ran", env=dict(ADS_GDPA_DISABLE_AUTOTUNE="1"))
