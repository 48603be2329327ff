"""torch.library integration: opcheck, torch.compile(fullgraph=True), poisoned outputs, FLOP formula."""

from __future__ import annotations

import math

import pytest
import torch
from _cases import Case, make_inputs, run_ours
from torch.utils.flop_counter import FlopCounterMode

import ads_gdpa_megakernel  # noqa: F401  (registers the ops)
from ads_gdpa.activations import Activation
from ads_gdpa_megakernel import costs
from ads_gdpa_megakernel.triton import launch

C = Case(lengths=[5, 0, 9])


def _fwd_args(c: Case, ins: dict, host: bool):
    hq = torch.tensor([0, *torch.tensor(c.lengths).cumsum(0).tolist()], dtype=torch.int64) if host else None
    m = max(c.lengths)
    return (
        ins["q"], ins["k"], ins["v"], ins["cu"], ins["cu"], m, m, int(Activation.SILU), 0.5,
        ins.get("ln_w"), ins.get("ln_b"), ins.get("rms_w"), ins.get("residual"), c.ln != "off",
        c.q_residual, c.rms != "off", c.eps, hq, hq, False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "opts,host",
    [(dict(), False), (dict(ln="off", rms="off", residual=False, q_residual=False), True)],
    ids=["all", "none-host"],
)
def test_opcheck_fwd(opts, host, device):
    c = Case(lengths=C.lengths, **opts)
    ins = make_inputs(c, device)
    for k in ("q", "k", "v", "ln_w", "ln_b", "rms_w", "residual"):
        if ins.get(k) is not None:
            ins[k].requires_grad_()
    torch.library.opcheck(torch.ops.ads_gdpa_megakernel.fwd.default, _fwd_args(c, ins, host))


def test_opcheck_bwd(device):
    c = C
    ins = make_inputs(c, device)
    out = torch.ops.ads_gdpa_megakernel.fwd(*_fwd_args(c, ins, False))
    _, a, q_ln, mean, rstd, rrms = out
    m = max(c.lengths)
    args = (
        ins["dout"], ins["q"], ins["k"], ins["v"], ins["cu"], ins["cu"], m, m, int(Activation.SILU), 0.5,
        ins["ln_w"], ins["ln_b"], ins["rms_w"], a, q_ln, mean, rstd, rrms, True, True, True, c.eps,
        None, None, False,
    )  # fmt: skip
    torch.library.opcheck(torch.ops.ads_gdpa_megakernel.bwd.default, args)


def test_compile_fullgraph_fwd_bwd(device):
    c = C
    ins = make_inputs(c, device)
    names = ["q", "k", "v", "ln_w", "ln_b", "rms_w", "residual"]
    for k in names:
        ins[k].requires_grad_()
    host = [0, *torch.tensor(c.lengths).cumsum(0).tolist()]

    def f(q, k, v, ln_w, ln_b, rms_w, residual):
        local = dict(ins, q=q, k=k, v=v, ln_w=ln_w, ln_b=ln_b, rms_w=rms_w, residual=residual)
        o = run_ours(c, local, cu_seqlens_q_cpu=host, cu_seqlens_k_cpu=host)
        return (o.float() * ins["dout"].float()).sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    leaves = [ins[k] for k in names]
    loss = compiled(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    loss_e = f(*leaves)
    grads_e = torch.autograd.grad(loss_e, leaves)
    torch.testing.assert_close(loss, loss_e)
    for a, b in zip(grads, grads_e):
        torch.testing.assert_close(a, b)


def test_poisoned_outputs(device, monkeypatch):
    """Every buffer the row kernels allocate starts as NaN: outputs and gradients must come out the
    same as from clean buffers (every element they return is written). ``deterministic`` keeps
    ads-gdpa's dQ free of atomics, so the two runs can be compared bit for bit on a GPU too."""
    c = Case(lengths=[5, 1, 0, 9], offsets=[1, 6, 7, 7, 16], total=18)
    ins = make_inputs(c, device)
    names = ["q", "k", "v", "ln_w", "ln_b", "rms_w", "residual"]

    def run():
        local = {k: (v.detach().requires_grad_() if k in names else v) for k, v in ins.items()}
        out = run_ours(c, local, deterministic=True)
        return [out, *torch.autograd.grad(out, [local[k] for k in names], ins["dout"])]

    clean = run()
    monkeypatch.setattr(
        launch, "_empty", lambda shape, dtype, device: torch.full(shape, math.nan, dtype=dtype, device=device)
    )
    poisoned = run()
    for name, a, b in zip(["out", *names], clean, poisoned):
        assert torch.isfinite(b.float()).all(), f"{name}: unwritten (NaN) elements"
        assert torch.equal(a, b), f"{name} differs with poisoned buffers"


def test_flop_formula(device):
    c = C
    ins = make_inputs(c, device)
    q = ins["q"].requires_grad_()
    host = [0, *torch.tensor(c.lengths).cumsum(0).tolist()]
    with FlopCounterMode(display=False) as fc:
        out = run_ours(c, ins, cu_seqlens_q_cpu=host, cu_seqlens_k_cpu=host)
        out.backward(ins["dout"])
    t, h, d = q.shape
    pairs = sum(a * a for a in c.lengths)
    opts = dict(layer_norm=True, q_residual=True, rms_norm=True)
    want = costs.flops(t, h, d, pairs, backward=False, **opts) + costs.flops(
        t, h, d, pairs, backward=True, **opts
    )
    assert fc.get_total_flops() == want
    assert pairs > 0 and want > 4 * h * d * pairs * 3.5


def test_traffic_estimate():
    """The numbers BENCHMARKS.md quotes (N = 512 bf16 features)."""
    assert costs.traffic_per_token(512, fused=False, backward=False) == 10 * 1024 + 12
    assert costs.traffic_per_token(512, fused=True, backward=False) == 6 * 1024 + 12
    assert costs.traffic_per_token(512, fused=False, backward=True) == 9 * 1024 + 12
    assert costs.traffic_per_token(512, fused=True, backward=True) == 8 * 1024 + 12
