"""Shared test helpers for ads_gdpa: a Case dataclass and one runner that checks fwd (+ bwd)
against the fp32 tools reference with the baseline-relative tolerance rule."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ads_gdpa import gdpa_varlen
from ads_kernel_tools.reference.gdpa import gdpa_ref
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline


@dataclass(frozen=True)
class Case:
    """One GDPA problem. ``lk=None`` means Lk = Lq per sequence; ``max_q=None`` means max(lq)."""

    lq: tuple[int, ...]
    lk: tuple[int, ...] | None = None
    heads: int = 2
    kv_heads: int = 1
    d: int = 32
    dv: int | None = None
    act: str | int = "fast_gelu"
    dtype: torch.dtype = torch.bfloat16
    max_q: int | None = None
    window: int | None = None
    causal: bool = False
    local: tuple[int | None, int | None] | None = None
    broadcast_q: bool = False
    per_head: tuple | None = None
    scale: float = 1.0
    host: bool = True
    grad: bool = True
    deterministic: bool = False
    seed: int = 0
    extra: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def id(self) -> str:
        lk = list(self.lk or self.lq)
        return f"lq{list(self.lq)}-lk{lk}-h{self.heads}/{self.kv_heads}-d{self.d}-{self.act}"


def make_inputs(case: Case, device: str):
    lk = case.lk if case.lk is not None else case.lq
    dv = case.dv or case.d
    tq, tk = sum(case.lq), sum(lk)
    # 0.5 keeps S = q·k around O(1) at d=32 so every activation sees both signs and its curved part
    q = randn((tq, case.heads, case.d), dtype=case.dtype, device=device, seed=case.seed, scale=0.5)
    k = randn((tk, case.kv_heads, case.d), dtype=case.dtype, device=device, seed=case.seed + 1, scale=0.5)
    v = randn((tk, case.kv_heads, dv), dtype=case.dtype, device=device, seed=case.seed + 2)
    cu_q = lengths_to_offsets(list(case.lq), device=device)
    cu_k = lengths_to_offsets(list(lk), device=device)
    max_q = case.max_q if case.max_q is not None else max(case.lq, default=0)
    max_k = max(lk, default=0)
    return q, k, v, cu_q, cu_k, max_q, max_k


def mask_kwargs(case: Case) -> dict:
    return dict(window_size=case.window, causal=case.causal, local_window=case.local)


def run_case(case: Case, device: str) -> None:
    """Kernel vs fp32 reference, tolerance = 2 x (bf16/fp16 baseline error) + rounding floor."""
    q, k, v, cu_q, cu_k, max_q, max_k = make_inputs(case, device)
    common = dict(activation=case.act, scale=case.scale, broadcast_q=case.broadcast_q,
                  activation_per_head=case.per_head, **mask_kwargs(case))  # fmt: skip
    host = dict(cu_seqlens_q_cpu=cu_q.cpu(), cu_seqlens_k_cpu=cu_k.cpu()) if case.host else {}
    leaves = [t.detach().clone().requires_grad_(case.grad) for t in (q, k, v)]
    out = gdpa_varlen(*leaves, cu_q, cu_k, max_q, max_k, deterministic=case.deterministic, **host, **common)
    ref_leaves = [t.detach().float().requires_grad_(case.grad) for t in (q, k, v)]
    ref = gdpa_ref(*ref_leaves, cu_q, cu_k, max_q, max_k, **common)
    base_leaves = [t.detach().clone().requires_grad_(case.grad) for t in (q, k, v)]
    base = gdpa_ref(*base_leaves, cu_q, cu_k, max_q, max_k, dtype=case.dtype, **common)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert_close_vs_baseline(out, ref, base, name=f"out[{case.id}]")
    if not case.grad:
        return
    do = randn(out.shape, dtype=case.dtype, device=device, seed=case.seed + 3)
    out.backward(do)
    ref.backward(do.float())
    base.backward(do)
    for name, a, r, b in zip("qkv", leaves, ref_leaves, base_leaves):
        assert a.grad.dtype == a.dtype
        assert_close_vs_baseline(a.grad, r.grad, b.grad, name=f"d{name}[{case.id}]")
