"""Shared test helpers: one Case per jagged problem and one runner that checks the output, the LSE
and the gradients of ``jagged_flash_attention`` against the fp64 tools reference (the truth), under
the baseline-relative rule with the same computation in the input precision as the baseline."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ads_jfa import jagged_flash_attention
from ads_kernel_tools.reference.attention import jagged_attention_ref
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline

# LSE comes from fp32 scores: the truth's LSE is the baseline's to fp32 accumulation, so its allowance
# is absolute (relative to the LSE's size), not a bf16 unit
LSE_TOL = 2e-4


@dataclass(frozen=True)
class Case:
    """A jagged problem. ``lk=None``: self attention (one offsets tensor for queries and keys);
    ``max_q=None``: max(lq), else rows past it must be zero."""

    lq: tuple[int, ...]
    lk: tuple[int, ...] | None = None
    max_q: int | None = None
    window: int | None = None
    broadcast_q: bool = False
    heads: int = 2
    kv_heads: int = 1
    d: int = 32
    dtype: torch.dtype = torch.bfloat16
    scale: float | None = None
    grad: bool = True
    dlse: bool = True
    int64: bool = False
    host: bool = False  # pass the *_cpu copies
    deterministic: bool = False
    seed: int = 0

    @property
    def id(self) -> str:
        lk = "self" if self.lk is None else list(self.lk)
        return (f"lq{list(self.lq)}-lk{lk}-maxq{self.max_q}-w{self.window}-bq{int(self.broadcast_q)}-"
                f"h{self.heads}/{self.kv_heads}-d{self.d}-{str(self.dtype)[6:]}")  # fmt: skip


def inputs(case: Case, device: str):
    lk = case.lq if case.lk is None else case.lk
    odt = torch.int64 if case.int64 else torch.int32
    cu_q = lengths_to_offsets(list(case.lq), device=device, dtype=odt)
    cu_k = cu_q if case.lk is None else lengths_to_offsets(list(lk), device=device, dtype=odt)
    q = randn((sum(case.lq), case.heads, case.d), dtype=case.dtype, device=device, seed=case.seed)
    k = randn((sum(lk), case.kv_heads, case.d), dtype=case.dtype, device=device, seed=case.seed + 1)
    v = randn((sum(lk), case.kv_heads, case.d), dtype=case.dtype, device=device, seed=case.seed + 2)
    return q, k, v, cu_q, cu_k, lk


def compare_lse(lse: torch.Tensor, ref: torch.Tensor, name: str) -> None:
    """-inf exactly where the reference has -inf; finite rows within the fp32 allowance."""
    assert lse.dtype == torch.float32, f"{name}: lse dtype {lse.dtype}"
    assert lse.shape == ref.shape, f"{name}: lse shape {tuple(lse.shape)} vs {tuple(ref.shape)}"
    inf_ref, inf_out = torch.isneginf(ref), torch.isneginf(lse)
    assert torch.equal(inf_ref, inf_out), f"{name}: -inf rows differ ({int((inf_ref ^ inf_out).sum())})"
    live = ~inf_ref
    if live.any():
        err = (lse[live].double() - ref[live].double()).abs().max().item()
        assert err <= LSE_TOL * max(1.0, ref[live].abs().max().item()), f"{name}: lse error {err:.3g}"


def finite_sum(lse: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (torch.where(torch.isfinite(lse), lse, 0.0) * weights).sum()


def _grads(loss: torch.Tensor, leaves) -> tuple[torch.Tensor, ...]:
    """d loss / d leaves; zeros where the loss does not depend on them (the reference builds no
    graph when every row is empty or past max_seq_len_q)."""
    if not loss.requires_grad:
        return tuple(torch.zeros_like(x) for x in leaves)
    return torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)


def run_case(case: Case, device: str) -> tuple[torch.Tensor, ...]:
    """Ours vs the fp64 reference (truth) and the input-precision reference (baseline), forward, LSE
    and gradients of q, k, v. Returns (out, lse, *grads) for further checks."""
    q, k, v, cu_q, cu_k, lk = inputs(case, device)
    max_q = max(case.lq, default=0) if case.max_q is None else case.max_q
    max_k = max(lk, default=0)
    host = dict(query_offset_cpu=cu_q.cpu(), key_offset_cpu=cu_k.cpu()) if case.host else {}
    leaves = [t.detach().clone().requires_grad_(case.grad) for t in (q, k, v)]
    out, lse = jagged_flash_attention(
        *leaves, cu_q, cu_k, max_q, max_k, sm_scale=case.scale, window_size=case.window,
        broadcast_q=case.broadcast_q, return_lse=True, deterministic=case.deterministic, **host,
    )  # fmt: skip
    kw = dict(window_size=case.window, scale=case.scale, broadcast_q=case.broadcast_q)
    truth = [t.detach().double().requires_grad_(case.grad) for t in (q, k, v)]
    base = [t.detach().clone().requires_grad_(case.grad) for t in (q, k, v)]
    r_out, r_lse = jagged_attention_ref(*truth, cu_q, cu_k, max_q, dtype=torch.float64, **kw)
    b_out, b_lse = jagged_attention_ref(*base, cu_q, cu_k, max_q, dtype=case.dtype, **kw)
    assert out.dtype == case.dtype and out.shape == r_out.shape, (out.dtype, out.shape, r_out.shape)
    assert_close_vs_baseline(out, r_out, b_out, name=f"out[{case.id}]")
    compare_lse(lse, r_lse, f"lse[{case.id}]")
    if not case.grad:
        return out, lse
    do = randn(out.shape, dtype=case.dtype, device=device, seed=case.seed + 3)
    dl = randn(lse.shape, dtype=torch.float32, device=device, seed=case.seed + 4) if case.dlse else None

    def loss(o, l_):
        total = (o.double() * do.double()).sum()
        return total + finite_sum(l_.double(), dl.double()) if dl is not None else total

    grads = _grads(loss(out, lse), leaves)
    r_grads = _grads(loss(r_out, r_lse), truth)
    b_grads = _grads(loss(b_out, b_lse), base)
    for name, g, x, r, b in zip(("dq", "dk", "dv"), grads, leaves, r_grads, b_grads):
        assert g.dtype == x.dtype and g.shape == x.shape, name
        assert_close_vs_baseline(g, r, b, name=f"{name}[{case.id}]")
    return (out, lse, *grads)
