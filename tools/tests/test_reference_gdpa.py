"""Tests of the GDPA reference against independent PyTorch computations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ads_kernel_tools.reference import gdpa
from ads_kernel_tools.reference.gdpa import (
    ACTIVATIONS,
    activation_grad_ref,
    activation_id,
    activation_name,
    activation_ref,
    gdpa_dense_ref,
    gdpa_mask,
    gdpa_ref,
)

F64 = torch.float64


def _taylor(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x + 0.3989422804 * x**2 - 0.0664903801 * x**4 + 0.0099735570 * x**6


# Independent of activation_ref: torch's own activations (the upstream PyTorch reference mapping).
TORCH_ACT = {
    "raw": lambda x: x,
    "gelu": F.gelu,
    "gelu_approx": lambda x: F.gelu(x, approximate="tanh"),
    "fast_gelu": lambda x: F.gelu(x, approximate="tanh"),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.01),
    "relu": F.relu,
    "fast_gelu_bf16": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "fast_silu": F.silu,
    "hardswish": F.hardswish,
    "relu_square": lambda x: F.relu(x) ** 2,
    "fast_gelu_taylor_approx": _taylor,
}

KINKS = (-3.0, 0.0, 3.0)


def _grid() -> torch.Tensor:
    dense = torch.linspace(-6.0, 6.0, 241, dtype=F64)  # step 0.05: contains 0, +-3, +-6 exactly
    extra = torch.tensor([-50.0, -3.0, -1e-7, 0.0, 1e-7, 3.0, 50.0], dtype=F64)
    return torch.cat([dense, extra])


# ---------------------------------------------------------------------------------------------------
# activation table
# ---------------------------------------------------------------------------------------------------


def test_enum_order_matches_upstream():
    assert ACTIVATIONS == (
        "raw", "gelu", "gelu_approx", "fast_gelu", "leaky_relu", "relu", "fast_gelu_bf16", "silu",
        "fast_silu", "hardswish", "relu_square", "fast_gelu_taylor_approx",
    )  # fmt: skip
    for i, name in enumerate(ACTIVATIONS):
        assert activation_id(name) == i
        assert activation_id(i) == i
        assert activation_name(i) == name
        assert activation_name(name) == name


@pytest.mark.parametrize("bad", ["softmax", "GELU", 12, -1, True, 1.0, None])
def test_unknown_activation_raises(bad):
    with pytest.raises(ValueError):
        activation_id(bad)
    with pytest.raises(ValueError):
        activation_ref(bad, torch.zeros(2))


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_matches_torch(name):
    x = _grid()
    if name == "fast_gelu_taylor_approx":
        x = x[x.abs() <= 6]  # the polynomial overflows nothing here, but keep the grid modest
    got = activation_ref(name, x)
    assert got.dtype == F64
    torch.testing.assert_close(got, TORCH_ACT[name](x), rtol=1e-12, atol=1e-12)
    # by id too, and in fp32
    torch.testing.assert_close(activation_ref(activation_id(name), x.float()), TORCH_ACT[name](x.float()))


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_zero_at_zero(name):
    # GDPA relies on act(0) == 0 (masking S before the activation equals masking P)
    assert activation_ref(name, torch.zeros(1, dtype=F64)).item() == 0.0


def test_taylor_is_close_to_erf_gelu_only_near_zero():
    x = torch.linspace(-1.0, 1.0, 101, dtype=F64)
    assert (activation_ref("fast_gelu_taylor_approx", x) - F.gelu(x)).abs().max() < 2e-3
    x = torch.linspace(-1.5, 1.5, 101, dtype=F64)
    assert (activation_ref("fast_gelu_taylor_approx", x) - F.gelu(x)).abs().max() < 3e-2
    far = torch.tensor([4.0], dtype=F64)
    assert (activation_ref("fast_gelu_taylor_approx", far) - F.gelu(far)).abs().item() > 1.0
    # and its derivative polynomial is the derivative of the erf-GELU series
    assert activation_grad_ref("fast_gelu_taylor_approx", torch.zeros(1, dtype=F64)).item() == 0.5


def test_gelu_tanh_derivative_constant():
    # the table's 0.1070322243 is 3 * 0.044715 * sqrt(2/pi)
    assert abs(3 * 0.044715 * math.sqrt(2 / math.pi) - 0.1070322243) < 1e-9
    assert abs(1 / math.sqrt(2 * math.pi) - 0.3989422804) < 1e-10


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_grad_matches_autograd_of_ref(name):
    """The closed form equals autograd of activation_ref everywhere, kinks included."""
    x = _grid().requires_grad_(True)
    (auto,) = torch.autograd.grad(activation_ref(name, x).sum(), x)
    torch.testing.assert_close(activation_grad_ref(name, x.detach()), auto, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_grad_matches_torch_autograd_off_kinks(name):
    """Against autograd of torch's own function, where the derivative is unambiguous."""
    x = _grid()
    x = x[~torch.isin(x, torch.tensor(KINKS, dtype=F64))].clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(TORCH_ACT[name](x).sum(), x)
    torch.testing.assert_close(activation_grad_ref(name, x.detach()), auto, rtol=1e-10, atol=1e-12)


def test_activation_grad_kink_conventions():
    x = torch.tensor([-3.0, 0.0, 3.0], dtype=F64)
    g = {n: activation_grad_ref(n, x).tolist() for n in ACTIVATIONS}
    assert g["relu"] == [0.0, 1.0, 1.0]  # relu'(0) = 1
    assert g["leaky_relu"] == [0.01, 1.0, 1.0]  # leaky'(0) = 1
    assert g["hardswish"] == [0.0, 0.5, 1.0]  # 0 if x <= -3, 1 if x >= 3
    assert g["relu_square"] == [0.0, 0.0, 6.0]
    assert g["raw"] == [1.0, 1.0, 1.0]
    for n in ("gelu", "gelu_approx", "fast_gelu", "fast_gelu_bf16", "silu", "fast_silu"):
        assert g[n][1] == pytest.approx(0.5)  # act'(0) != 0: why kernels must re-mask dS


def test_activation_keeps_input_dtype():
    for dt in (torch.float32, F64):
        x = torch.randn(5, dtype=dt)
        for name in ACTIVATIONS:
            assert activation_ref(name, x).dtype == dt
            assert activation_grad_ref(name, x).dtype == dt


# ---------------------------------------------------------------------------------------------------
# masks
# ---------------------------------------------------------------------------------------------------


def _m(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_mask_causal_bottom_right_3x4():
    # Lk - Lq = 1: query i sees keys j <= i + 1
    expected = _m([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    assert torch.equal(gdpa_mask(3, 4, causal=True), expected)
    assert torch.equal(gdpa_mask(3, 4, local_window=(None, 0)), expected)


def test_mask_causal_more_queries_than_keys():
    # Lk - Lq = -2: the first two queries see nothing
    expected = _m([[0, 0], [0, 0], [1, 0], [1, 1]])
    assert torch.equal(gdpa_mask(4, 2, causal=True), expected)


def test_mask_symmetric_window_top_left_3x4():
    expected = _m([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1]])
    assert torch.equal(gdpa_mask(3, 4, window_size=1), expected)
    assert torch.equal(gdpa_mask(3, 4, window_size=0), _m([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]))


def test_mask_window_zeroes_rows_past_lk_plus_w():
    m = gdpa_mask(6, 2, window_size=1)
    assert m[:3].any(dim=1).all()
    assert not m[3:].any()  # i >= Lk + w


def test_mask_local_windows_3x4():
    assert torch.equal(gdpa_mask(3, 4, local_window=(1, 0)), _m([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]))
    assert torch.equal(
        gdpa_mask(3, 4, local_window=(None, 1)), _m([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    )
    assert torch.equal(gdpa_mask(3, 4, local_window=(0, 1)), _m([[0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 1]]))
    assert gdpa_mask(3, 4, local_window=(None, None)).all()


def test_mask_combination_is_intersection():
    both = gdpa_mask(5, 7, causal=True, window_size=2)
    assert torch.equal(both, gdpa_mask(5, 7, causal=True) & gdpa_mask(5, 7, window_size=2))


# ---------------------------------------------------------------------------------------------------
# gdpa_ref against an independent dense padded computation
# ---------------------------------------------------------------------------------------------------


def _allowed(i, j, lq, lk, window_size, causal, local_window):
    ok = True
    if window_size is not None:
        ok = ok and abs(i - j) <= window_size
    if causal:
        ok = ok and j <= i + lk - lq
    if local_window is not None:
        left, right = local_window
        if left is not None:
            ok = ok and j >= i + lk - lq - left
        if right is not None:
            ok = ok and j <= i + lk - lq + right
    return ok


def _dense_padded(q, k, v, lq, lk, max_q, act, scale, window_size, causal, local_window, per_head=None):
    """Pad to (B, L, H, D), compute every score, mask with a loop-built 0/1 tensor, einsum."""
    batch, heads, hkv = len(lq), q.shape[1], k.shape[1]
    lmq, lmk = max(lq), max(lk)
    qp = torch.zeros(batch, lmq, heads, q.shape[2], dtype=F64)
    kp = torch.zeros(batch, lmk, hkv, k.shape[2], dtype=F64)
    vp = torch.zeros(batch, lmk, hkv, v.shape[2], dtype=F64)
    oq = ok = 0
    for b in range(batch):
        qp[b, : lq[b]] = q[oq : oq + lq[b]]
        kp[b, : lk[b]] = k[ok : ok + lk[b]]
        vp[b, : lk[b]] = v[ok : ok + lk[b]]
        oq, ok = oq + lq[b], ok + lk[b]
    kp = kp.repeat_interleave(heads // hkv, dim=2)
    vp = vp.repeat_interleave(heads // hkv, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", qp, kp)
    acts = [act] * heads
    for h, a in enumerate(per_head or []):
        acts[h] = ACTIVATIONS[a] if isinstance(a, int) else a
    p = torch.stack([TORCH_ACT[acts[h]](s[:, h]) for h in range(heads)], dim=1)
    mask = torch.zeros(batch, 1, lmq, lmk, dtype=F64)
    for b in range(batch):
        for i in range(min(lq[b], max_q)):
            for j in range(lk[b]):
                mask[b, 0, i, j] = float(_allowed(i, j, lq[b], lk[b], window_size, causal, local_window))
    o = torch.einsum("bhij,bjhd->bihd", scale * p * mask, vp)
    return torch.cat([o[b, : lq[b]] for b in range(batch)])


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _inputs(lq, lk, heads, hkv, d, dv, seed, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq), heads, d, generator=g, dtype=F64) * scale
    k = torch.randn(sum(lk), hkv, d, generator=g, dtype=F64) * scale
    v = torch.randn(sum(lk), hkv, dv, generator=g, dtype=F64)
    return q, k, v


MASK_CASES = [
    {},
    {"window_size": 2},
    {"causal": True},
    {"local_window": (3, 1)},
    {"local_window": (None, 2)},
    {"causal": True, "window_size": 3},
]


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_gdpa_ref_matches_dense_all_activations(act):
    lq, lk = [5, 1, 0, 9], [7, 3, 4, 9]
    q, k, v = _inputs(lq, lk, heads=4, hkv=2, d=8, dv=6, seed=1)
    out = gdpa_ref(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), activation=act, scale=0.7, dtype=F64)
    expected = _dense_padded(q, k, v, lq, lk, max(lq), act, 0.7, None, False, None)
    assert out.shape == (sum(lq), 4, 6) and out.dtype == F64
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "masks", MASK_CASES, ids=lambda m: ",".join(f"{a}={b}" for a, b in m.items()) or "none"
)
@pytest.mark.parametrize("heads,hkv", [(4, 4), (4, 2), (3, 1)])
def test_gdpa_ref_matches_dense_masks_gqa(masks, heads, hkv):
    lq, lk = [6, 2, 8, 4], [6, 5, 3, 9]  # Lq > Lk and Lq < Lk both present
    q, k, v = _inputs(lq, lk, heads=heads, hkv=hkv, d=8, dv=8, seed=2)
    out = gdpa_ref(q, k, v, _cu(lq), _cu(lk), 8, 9, activation="gelu", dtype=F64, **masks)
    expected = _dense_padded(
        q, k, v, lq, lk, 8, "gelu", 1.0,
        masks.get("window_size"), masks.get("causal", False), masks.get("local_window"),
    )  # fmt: skip
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_gdpa_ref_rows_beyond_max_seqlen_q_are_zero():
    lq, lk = [7, 3], [5, 6]
    q, k, v = _inputs(lq, lk, heads=2, hkv=2, d=4, dv=4, seed=3)
    out = gdpa_ref(q, k, v, _cu(lq), _cu(lk), 4, 6, activation="silu", dtype=F64)
    expected = _dense_padded(q, k, v, lq, lk, 4, "silu", 1.0, None, False, None)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    assert (out[4:7] == 0).all() and (out[:4] != 0).any(dim=-1).all()
    full = gdpa_ref(q, k, v, _cu(lq), _cu(lk), 7, 6, activation="silu", dtype=F64)
    torch.testing.assert_close(out[:4], full[:4])
    torch.testing.assert_close(out[7:], full[7:])


def test_gdpa_ref_hand_example():
    # one sequence, one head, D=1: S = q k^T = outer product, relu, scale 2
    q = torch.tensor([[1.0], [-1.0]], dtype=F64).view(2, 1, 1)
    k = torch.tensor([[2.0], [3.0]], dtype=F64).view(2, 1, 1)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64).view(2, 1, 2)
    out = gdpa_ref(q, k, v, [0, 2], [0, 2], 2, 2, activation="relu", scale=2.0, dtype=F64)
    # S = [[2, 3], [-2, -3]] -> relu -> [[2, 3], [0, 0]] -> *2 -> P; O = P @ I
    torch.testing.assert_close(out.view(2, 2), torch.tensor([[4.0, 6.0], [0.0, 0.0]], dtype=F64))
    causal = gdpa_ref(q, k, v, [0, 2], [0, 2], 2, 2, activation="raw", causal=True, dtype=F64)
    # raw: S itself; row 0 sees key 0 only, row 1 sees both
    torch.testing.assert_close(causal.view(2, 2), torch.tensor([[2.0, 0.0], [-2.0, -3.0]], dtype=F64))


def test_gdpa_ref_dv_differs_from_d():
    lq, lk = [3, 4], [4, 2]
    q, k, v = _inputs(lq, lk, heads=2, hkv=1, d=12, dv=8, seed=4)
    out = gdpa_ref(q, k, v, _cu(lq), _cu(lk), 4, 4, activation="gelu_approx", dtype=F64)
    assert out.shape == (7, 2, 8)
    torch.testing.assert_close(out, _dense_padded(q, k, v, lq, lk, 4, "gelu_approx", 1.0, None, False, None))


def test_gdpa_ref_activation_per_head():
    lq, lk = [4, 3], [5, 2]
    q, k, v = _inputs(lq, lk, heads=4, hkv=2, d=4, dv=4, seed=5)
    per_head = [5, "silu"]  # heads 2, 3 fall back to `activation`
    out = gdpa_ref(
        q, k, v, _cu(lq), _cu(lk), 4, 5, activation="gelu", activation_per_head=per_head, dtype=F64
    )
    expected = _dense_padded(q, k, v, lq, lk, 4, "gelu", 1.0, None, False, None, per_head=per_head)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    relu_all = gdpa_ref(q, k, v, _cu(lq), _cu(lk), 4, 5, activation="relu", dtype=F64)
    torch.testing.assert_close(out[:, 0], relu_all[:, 0])


def test_gdpa_ref_broadcast_q_equals_repeated_q():
    lq, lk = 5, [4, 6, 1]
    g = torch.Generator().manual_seed(6)
    q = torch.randn(lq, 2, 8, generator=g, dtype=F64)
    k = torch.randn(sum(lk), 1, 8, generator=g, dtype=F64)
    v = torch.randn(sum(lk), 1, 8, generator=g, dtype=F64)
    out = gdpa_ref(q, k, v, [0, lq], _cu(lk), lq, 6, activation="fast_gelu", broadcast_q=True, dtype=F64)
    assert out.shape == (3 * lq, 2, 8)
    rep = gdpa_ref(q.repeat(3, 1, 1), k, v, _cu([lq] * 3), _cu(lk), lq, 6, activation="fast_gelu", dtype=F64)
    torch.testing.assert_close(out, rep)


def test_gdpa_dense_ref_matches_jagged():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 5, 4, 8, generator=g)
    k = torch.randn(2, 7, 2, 8, generator=g)
    v = torch.randn(2, 7, 2, 6, generator=g)
    out = gdpa_dense_ref(q, k, v, activation="hardswish", causal=True, scale=0.5)
    assert out.shape == (2, 5, 4, 6) and out.dtype == torch.float32
    jag = gdpa_ref(
        q.reshape(10, 4, 8), k.reshape(14, 2, 8), v.reshape(14, 2, 6), [0, 5, 10], [0, 7, 14], 5, 7,
        activation="hardswish", causal=True, scale=0.5,
    )  # fmt: skip
    torch.testing.assert_close(out.reshape(10, 4, 6), jag)
    bq = gdpa_dense_ref(q[:1], k, v, activation="relu", broadcast_q=True)
    assert bq.shape == (2, 5, 4, 6)
    torch.testing.assert_close(bq[0], gdpa_dense_ref(q[:1], k[:1], v[:1], activation="relu")[0])


# ---------------------------------------------------------------------------------------------------
# gradients: autograd through the reference equals the spec §1.3 backward formulas
# ---------------------------------------------------------------------------------------------------


def _manual_backward(q, k, v, do, lq, lk, act, scale, mask_kw):
    """Spec §1.3 on one sequence at a time, GQA by summing over the head group."""
    heads, hkv = q.shape[1], k.shape[1]
    grp = heads // hkv
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    oq = ok = 0
    for b in range(len(lq)):
        m = gdpa_mask(lq[b], lk[b], **mask_kw).to(F64)
        for h in range(heads):
            qs, ks, vs = q[oq : oq + lq[b], h], k[ok : ok + lk[b], h // grp], v[ok : ok + lk[b], h // grp]
            s = qs @ ks.T
            p = scale * activation_ref(act, s) * m
            dp = do[oq : oq + lq[b], h] @ vs.T
            ds = scale * activation_grad_ref(act, s) * dp * m
            dv[ok : ok + lk[b], h // grp] += p.T @ do[oq : oq + lq[b], h]
            dk[ok : ok + lk[b], h // grp] += ds.T @ qs
            dq[oq : oq + lq[b], h] += ds @ ks
        oq, ok = oq + lq[b], ok + lk[b]
    return dq, dk, dv


@pytest.mark.parametrize(
    "act,mask_kw",
    [
        ("gelu", {}),
        ("relu", {"causal": True}),
        ("silu", {"window_size": 1}),
        ("raw", {"local_window": (2, 0)}),
    ],
)
def test_gdpa_ref_autograd_matches_spec_backward(act, mask_kw):
    lq, lk = [4, 3, 6], [5, 3, 2]
    q, k, v = _inputs(lq, lk, heads=4, hkv=2, d=6, dv=5, seed=8)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = gdpa_ref(q, k, v, _cu(lq), _cu(lk), 6, 5, activation=act, scale=0.3, dtype=F64, **mask_kw)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    expected = _manual_backward(q.detach(), k.detach(), v.detach(), do, lq, lk, act, 0.3, mask_kw)
    for name, got, exp in zip("qkv", grads, expected):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-10, msg=f"d{name}")


def test_gdpa_ref_gradcheck_small():
    lq, lk = [2, 3], [3, 1]
    q, k, v = _inputs(lq, lk, heads=2, hkv=1, d=3, dv=2, seed=9)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))

    def fn(q, k, v):
        return gdpa_ref(q, k, v, _cu(lq), _cu(lk), 3, 3, activation="gelu_approx", dtype=F64)

    assert torch.autograd.gradcheck(fn, (q, k, v))


# ---------------------------------------------------------------------------------------------------
# same-precision baseline
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_low_precision_baseline_emulates_kernel_rounding(dt):
    lq, lk = [9, 4], [9, 7]
    q, k, v = _inputs(lq, lk, heads=2, hkv=2, d=16, dv=16, seed=10)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    base = gdpa_ref(q, k, v, _cu(lq), _cu(lk), 9, 9, activation="gelu", dtype=dt)
    assert base.dtype == dt
    exact = gdpa_ref(q, k, v, _cu(lq), _cu(lk), 9, 9, activation="gelu", dtype=F64)
    err = (base.double() - exact).abs().max().item()
    eps = torch.finfo(dt).eps
    assert 0 < err < 20 * eps * exact.abs().max().item()
    # emulate: fp32 S, fp32 act, P rounded to dt, fp32 PV, output rounded to dt
    s = torch.einsum("ihd,jhd->hij", q[:9].float(), k[:9].float())
    p = activation_ref("gelu", s).to(dt).float()
    o = torch.einsum("hij,jhd->ihd", p, v[:9].float()).to(dt)
    torch.testing.assert_close(base[:9], o, rtol=0, atol=0)


def test_low_precision_baseline_is_differentiable():
    q, k, v = _inputs([3], [4], heads=1, hkv=1, d=4, dv=4, seed=11)
    q, k, v = (t.to(torch.bfloat16).requires_grad_(True) for t in (q, k, v))
    out = gdpa_ref(q, k, v, [0, 3], [0, 4], 3, 4, activation="silu", dtype=torch.bfloat16)
    dq, dk, _ = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert dq.dtype == torch.bfloat16 and torch.isfinite(dq).all() and dk.abs().sum() > 0


def test_gdpa_ref_batch_without_query_rows_keeps_the_graph():
    """No query rows: the output still depends on q, k, v (zero gradients), so gradient checks of an
    empty batch run."""
    q = torch.randn(0, 2, 8, dtype=F64, requires_grad=True)
    k = torch.randn(5, 1, 8, dtype=F64, requires_grad=True)
    v = torch.randn(5, 1, 8, dtype=F64, requires_grad=True)
    out = gdpa_ref(q, k, v, [0, 0], [0, 5], 4, 5, activation="gelu")
    assert out.shape == (0, 2, 8) and out.requires_grad
    gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
    assert gq.shape == q.shape and (gk == 0).all() and (gv == 0).all()


def test_module_exports():
    for name in gdpa.__all__:
        assert hasattr(gdpa, name)
