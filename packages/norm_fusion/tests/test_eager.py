"""The plain-eager path (autograd.Function over the kernels) against the custom ops: the same bits in
the forward and in every gradient, and the op path wherever the call is not plain eager."""

from __future__ import annotations

import pytest
import torch
from _cases import DEVICE, Case, inputs

from ads_norm_fusion import _ops, linear_layernorm, linear_rmsnorm, rmsnorm_linear

CASES = [Case(20, 32, 48), Case(20, 32, 48, bias=False, affine=False, norm_bias=False)]
OPS = [
    "linear_layernorm",
    "linear_rmsnorm",
    "rmsnorm_linear",
    "rmsnorm_linear/input",
    "rmsnorm_linear/output",
]


def _call(op: str, t: dict):
    if op == "linear_layernorm":
        return linear_layernorm(t["x"], t["w"], t["bias"], t["gamma"], t["beta"], return_stats=True)
    if op == "linear_rmsnorm":
        return linear_rmsnorm(t["x"], t["w"], t["bias"], t["gamma"], return_stats=True)
    return (rmsnorm_linear(t["x"], t["gamma"], t["w"], t["bias"]),)


def _run(op: str, case: Case, eager: bool, monkeypatch, grad: bool = True):
    """Outputs, gradients of every leaf and the grad_fn's name, on one of the two paths."""
    monkeypatch.setattr(_ops, "plain_eager", _ops.plain_eager if eager else (lambda tensors: False))
    d = inputs(case, norm_over="k" if op == "rmsnorm_linear" else "n")
    names = ("x", "w", "bias", "gamma") + (("beta",) if op == "linear_layernorm" else ())
    t = {n: (None if d[n] is None else d[n].clone().requires_grad_(grad)) for n in names}
    out = _call(op, t)
    leaves = [n for n in names if t[n] is not None]
    grads = torch.autograd.grad(out[0], [t[n] for n in leaves], d["dy"]) if grad else ()
    return out, dict(zip(leaves, grads)), _node(out[0])


def _node(t: torch.Tensor) -> str:
    """The autograd node that made t, looking through reshapes."""
    fn = t.grad_fn
    while type(fn).__name__.startswith(("View", "Reshape", "Unsafe")):
        fn = fn.next_functions[0][0]
    return type(fn).__name__


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_eager_matches_custom_op(op: str, case: Case, monkeypatch) -> None:
    op, _, rms_bwd = op.partition("/")
    if rms_bwd:  # rmsnorm_linear's other backwards (ADS_NORM_FUSION_RMS_BWD)
        monkeypatch.setenv("ADS_NORM_FUSION_RMS_BWD", rms_bwd)
    out_e, grads_e, fn_e = _run(op, case, True, monkeypatch)
    out_o, grads_o, fn_o = _run(op, case, False, monkeypatch)
    assert fn_e.startswith("_Eager") and not fn_o.startswith("_Eager"), (fn_e, fn_o)
    assert len(out_e) == len(out_o)
    for a, b in zip(out_e, out_o):
        assert torch.equal(a, b)
    assert grads_e.keys() == grads_o.keys() and len(grads_e) >= 2
    for name in grads_e:
        assert torch.equal(grads_e[name], grads_o[name]), f"d{name}"


@pytest.mark.parametrize("op", ["linear_layernorm", "linear_rmsnorm", "rmsnorm_linear"])
def test_eager_without_grad(op: str, monkeypatch) -> None:
    out_e, _, _ = _run(op, CASES[0], True, monkeypatch, grad=False)
    out_o, _, _ = _run(op, CASES[0], False, monkeypatch, grad=False)
    for a, b in zip(out_e, out_o):
        assert torch.equal(a, b) and not a.requires_grad


def test_parameters_take_the_eager_path() -> None:
    from ads_norm_fusion import FusedLinearLayerNorm

    mod = FusedLinearLayerNorm(32, 48).to(device=DEVICE, dtype=torch.bfloat16)
    x = inputs(Case(20, 32, 48))["x"]
    assert _node(mod(x)).startswith("_Eager")


def test_dispatch_modes_take_the_op() -> None:
    """FlopCounterMode is a dispatch mode: the call goes through the op (whose FLOP formula counts)."""
    from torch.utils.flop_counter import FlopCounterMode

    d = inputs(Case(20, 32, 48))
    with FlopCounterMode(display=False) as counter:
        y = linear_rmsnorm(d["x"], d["w"].requires_grad_())
    assert not _node(y).startswith("_Eager")
    assert counter.get_total_flops() == 2 * 20 * 32 * 48


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_folded_weight_rounds_once(dtype: torch.dtype) -> None:
    """rmsnorm_linear's W·γ in w's dtype equals the fp32 product rounded once (every finite pattern)."""
    bits = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)
    bits = bits[torch.isfinite(bits)]
    g = torch.Generator().manual_seed(0)
    w = bits[torch.randint(0, bits.numel(), (256, 256), generator=g)].to(DEVICE)
    gamma = bits[torch.randint(0, bits.numel(), (256,), generator=g)].to(DEVICE)
    ref = (w.float() * gamma.float()[None, :]).to(dtype)
    got = _ops._folded(w, gamma)
    assert torch.equal(got.isnan(), ref.isnan())
    assert torch.equal(got.nan_to_num(), ref.nan_to_num())


@pytest.mark.parametrize("rms", [False, True])
def test_input_grad_eager_matches_custom_op(rms: bool, monkeypatch) -> None:
    from ads_norm_fusion import linear_layernorm_input_grad, linear_rmsnorm_input_grad

    d = inputs(Case(20, 32, 48))
    dy, w_next_t = torch.randn(20, 32, device=DEVICE).to(torch.bfloat16), d["w"].t().contiguous()
    rstat = torch.rand(20, device=DEVICE) + 0.5
    impl, calls = _ops._gemm_norm_input_grad, []

    def counted(*args):  # the custom op keeps the original impl: only the eager path counts
        calls.append(1)
        return impl(*args)

    def run(eager: bool):
        monkeypatch.setattr(_ops, "plain_eager", _ops.plain_eager if eager else (lambda tensors: False))
        if rms:
            return (linear_rmsnorm_input_grad(dy, w_next_t, d["dy"], rstat),)
        return linear_layernorm_input_grad(dy, w_next_t, d["dy"], rstat, d["gamma"], weight_grads=True)

    monkeypatch.setattr(_ops, "_gemm_norm_input_grad", counted)
    eager = run(True)
    assert len(calls) == 1
    op = run(False)
    assert len(calls) == 1
    for a, b in zip(eager, op, strict=True):
        assert torch.equal(a, b)
