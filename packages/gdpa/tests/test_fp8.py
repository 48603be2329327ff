"""FP8 e4m3 forward against the GDPA the user meant, at the scales users pass.

The truth is the fp64 GDPA of the dequantised fp8 inputs (``gdpa_ref``): what a user who quantised
Q, K, V with per-head amax descales expects back. Each (sequence, head) block of the output must be
within ``MAX_REL`` (relative 2-norm error) of it, at scale 1 and at the upstream 1/max_seq_len
convention (1/256, 1/2048), with score magnitudes that put act(S) anywhere from ~1e-3 to ~1e3: e4m3
rounding of P alone costs ~0.027, so anything that flushes small P or saturates large P fails.
An emulation of the kernel's own rounding (P scaled by its row maximum to 448, rounded to e4m3) is a
second check only. On a CPU this relies on the tools' interpreter fix for fp8 casts.
"""

from __future__ import annotations

import pytest
import torch

from ads_gdpa import gdpa_varlen
from ads_kernel_tools.reference.gdpa import activation_ref, gdpa_ref
from ads_kernel_tools.testing import lengths_to_offsets, make_generator
from ads_kernel_tools.tolerance import assert_close_vs_baseline, rel_norm_error

MAX_REL = 0.04
FLOOR = 1e-4  # see ``check``
E4M3_MAX = 448.0
TILE = 32  # the interpreter's pinned forward tile (config.FWD_PINNED_INTERP)
# ragged: 0, 1, tile-1, tile, tile+1, and a key-less sequence with queries (its output must be 0)
LENS_Q = [TILE + 1, 1, 0, TILE - 1, 5, TILE, 3]
LENS_K = [TILE + 1, 1, 4, TILE, TILE - 1, 2 * TILE + 1, 0]
HEADS, HEADS_KV, DIM = 4, 2, 32  # GQA: two query heads per kv head
ACTS = ["fast_gelu", "silu", "relu", "raw", "relu_square"]
SCALES = [1.0, 1 / 256, 1 / 2048]
# log10 of the typical |S| per query head and per kv head (added): heads see |S| ~ 1e-3 .. 1e3
Q_EXP = [-1.5, -0.5, 0.5, 1.5]
K_EXP = [-1.5, 1.5]


def _quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head amax quantisation as users do it: x ≈ x8 · descale, descale = amax / 448."""
    descale = (x.abs().amax(dim=(0, 2)) / E4M3_MAX).clamp_min(1e-12).float()
    return (x / descale[None, :, None]).to(torch.float8_e4m3fn), descale


def make_case(lens_q, lens_k, act, heads=HEADS, heads_kv=HEADS_KV, dim=DIM, seed=0, device="cpu"):
    """fp8 q, k, v with their descales, offsets, and the dequantised fp64 copies.

    |S| per head spans 1e-3..1e3 (for relu_square |S| is the square root of that, so act(S) spans
    the same); each sequence also gets its own q magnitude within a factor of ~3 of its head's."""
    gen = make_generator(seed)
    pw = 0.5 if act == "relu_square" else 1.0
    tq, tk = sum(lens_q), sum(lens_k)
    q_exp = torch.tensor(Q_EXP[:heads] + [0.0] * max(heads - len(Q_EXP), 0)) * pw
    k_exp = torch.tensor(K_EXP[:heads_kv] + [0.0] * max(heads_kv - len(K_EXP), 0)) * pw
    seq_exp = torch.repeat_interleave(torch.rand(len(lens_q), generator=gen) - 0.5, torch.tensor(lens_q))
    q = torch.randn(tq, heads, dim, generator=gen) * dim**-0.25
    q = q * 10.0 ** (q_exp[None, :, None] + seq_exp[:, None, None])
    k = torch.randn(tk, heads_kv, dim, generator=gen) * dim**-0.25 * 10.0 ** k_exp[None, :, None]
    v = torch.rand(tk, heads_kv, dim, generator=gen) - 0.3  # a nonzero mean, as real values have
    (q8, sq), (k8, sk), (v8, sv) = _quantise(q), _quantise(k), _quantise(v)
    deq = [x.double() * s.double()[None, :, None] for x, s in ((q8, sq), (k8, sk), (v8, sv))]
    cu_q, cu_k = lengths_to_offsets(lens_q), lengths_to_offsets(lens_k)
    to = dict(device=device)
    return dict(
        fp8=[t.to(**to) for t in (q8, k8, v8)], descale=[t.to(**to) for t in (sq, sk, sv)],
        cu=(cu_q.to(**to), cu_k.to(**to)), deq=deq, cu_host=(cu_q, cu_k),
    )  # fmt: skip


def emulate(q8, k8, v8, sq, sk, sv, cu_q, cu_k, act, scale):
    """The kernel's rounding in PyTorch: S from the fp8 operands times the descales, P = act(S)
    scaled so its row maximum is 448 and rounded to e4m3, P·V from the fp8 values, then times
    m/448 · scale · v_descale, bf16 output. (The kernel takes the running maximum of the tiles seen
    so far, this the final one, so the two round earlier tiles differently.)"""
    g = q8.shape[1] // k8.shape[1]
    out = torch.zeros(q8.shape[0], q8.shape[1], v8.shape[2], dtype=torch.bfloat16)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        qf = q8[q0:q1].double().transpose(0, 1)
        kf = k8[k0:k1].double().repeat_interleave(g, dim=1).transpose(0, 1)
        vf = v8[k0:k1].double().repeat_interleave(g, dim=1).transpose(0, 1)
        s_descale = sq.double() * sk.double().repeat_interleave(g)
        s = (qf @ kf.transpose(1, 2)) * s_descale[:, None, None]
        a = activation_ref(act, s)
        m = a.abs().amax(dim=2, keepdim=True)
        m_safe = torch.where(m > 0, m, torch.ones_like(m))
        p = (a * (E4M3_MAX / m_safe)).float().to(torch.float8_e4m3fn).double()
        o = (p @ vf) * (m / E4M3_MAX) * scale * sv.double().repeat_interleave(g)[:, None, None]
        out[q0:q1] = o.transpose(0, 1).to(torch.bfloat16)
    return out


def check(out, case, act, scale, max_q, max_k, name, rel=MAX_REL, emulation=True):
    """Every (sequence, head) block within ``rel`` of the fp64 truth; optionally the emulation rule.

    A block's error may also stay under ``FLOOR`` times its head's RMS output per element: a block
    whose true output is ~1e-20 of its head's (gelu of a large negative score, say) is 0 with the
    hardware tanh, and no user tells those apart."""
    cu_q, cu_k = case["cu_host"]
    out = out.cpu()
    assert out.dtype == torch.bfloat16
    ref = gdpa_ref(*case["deq"], cu_q, cu_k, max_q, max_k, activation=act, scale=scale, dtype=torch.float64)
    if emulation:
        fp8, descale = [t.cpu() for t in case["fp8"]], [t.cpu() for t in case["descale"]]
        base = emulate(*fp8, *descale, cu_q, cu_k, act, scale)
    worst = 0.0
    rows = torch.cat(
        [
            torch.arange(int(cu_q[b]), min(int(cu_q[b + 1]), int(cu_q[b]) + max_q))
            for b in range(len(cu_q) - 1)
        ]
    )
    head_rms = ref[rows].pow(2).mean(dim=(0, 2)).sqrt()
    for b in range(len(cu_q) - 1):
        q0, q1 = int(cu_q[b]), min(int(cu_q[b + 1]), int(cu_q[b]) + max_q)
        if q1 == q0:
            continue
        for h in range(out.shape[1]):
            o, r = out[q0:q1, h], ref[q0:q1, h]
            err = rel_norm_error(o, r)
            floor = FLOOR * head_rms[h] * r.numel() ** 0.5
            if (o.double() - r).norm() > floor:
                worst = max(worst, err)
                assert err <= rel, f"{name}: sequence {b} head {h}: relative error {err:.4f} > {rel}"
            if emulation:
                assert_close_vs_baseline(o, r, base[q0:q1, h], name=f"{name} seq {b} head {h} vs emulation")
    return worst


@pytest.mark.parametrize("scale", SCALES, ids=["scale1", "scale1_256", "scale1_2048"])
@pytest.mark.parametrize("act", ACTS)
def test_fp8_forward_vs_dequantised_reference(device, act, scale):
    case = make_case(LENS_Q, LENS_K, act, seed=ACTS.index(act), device=device)
    (q8, k8, v8), (sq, sk, sv), (cu_q, cu_k) = case["fp8"], case["descale"], case["cu"]
    mq, mk = max(LENS_Q), max(LENS_K)
    out = gdpa_varlen(q8, k8, v8, cu_q, cu_k, mq, mk, activation=act, scale=scale,
                      q_descale=sq, k_descale=sk, v_descale=sv)  # fmt: skip
    check(out, case, act, scale, mq, mk, name=f"fp8 {act} scale={scale:g}")


def test_fp8_rows_past_max_seqlen_q_are_zero(device):
    """max_seqlen_q below some lengths: rows past it are zeros, the rest still right."""
    case = make_case(LENS_Q, LENS_K, "fast_gelu", seed=7, device=device)
    (q8, k8, v8), (sq, sk, sv), (cu_q, cu_k) = case["fp8"], case["descale"], case["cu"]
    mq = TILE - 3
    out = gdpa_varlen(q8, k8, v8, cu_q, cu_k, mq, max(LENS_K), activation="fast_gelu", scale=1 / 2048,
                      q_descale=sq, k_descale=sk, v_descale=sv).cpu()  # fmt: skip
    check(out, case, "fast_gelu", 1 / 2048, mq, max(LENS_K), name="fp8 max_seqlen_q clamp")
    for b, lq in enumerate(LENS_Q):
        if lq > mq:
            q0 = int(case["cu_host"][0][b])
            assert (out[q0 + mq : q0 + lq] == 0).all(), f"sequence {b}: rows past max_seqlen_q not zero"


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["fast_gelu", "relu_square"])
def test_fp8_forward_real_sizes(device, act):
    """Production lengths (max 2048) at the upstream scale 1/max_seq_len, through the default dispatch."""
    lens = [2048, 1, 1000, 127, 129, 2047]
    case = make_case(lens, lens, act, heads=4, heads_kv=4, dim=128, seed=3, device=device)
    (q8, k8, v8), (sq, sk, sv), (cu_q, cu_k) = case["fp8"], case["descale"], case["cu"]
    out = gdpa_varlen(q8, k8, v8, cu_q, cu_k, 2048, 2048, activation=act, scale=1 / 2048,
                      q_descale=sq, k_descale=sk, v_descale=sv)  # fmt: skip
    check(out, case, act, 1 / 2048, 2048, 2048, name=f"fp8 {act} real sizes", emulation=False)
