"""Shared test helpers: one Case per problem, one runner that checks forward, LSE and gradients
against the fp32 tools reference under the baseline-relative rule (tools/README.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ads_kernel_tools.reference.attention import (
    jagged_attention_ref,
    softmax_attention_ref,
    softmax_attention_varlen_ref,
)
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline
from lp_fa4 import flash_attn_func, flash_attn_varlen_func, jagged_attention

# LSE is fp32 from fp32 scores: the bf16 baseline's LSE equals the truth to fp32 rounding, so its floor
# is an absolute fp32-accumulation allowance instead of a bf16 unit
LSE_FLOOR = 2e-4


@dataclass(frozen=True)
class Case:
    """A varlen (or, with ``dense``, a (B, S) batch of equal) problem. lk=None: Lk = Lq."""

    lq: tuple[int, ...]
    lk: tuple[int, ...] | None = None
    heads: int = 2
    kv_heads: int = 1
    d: int = 32
    dv: int | None = None
    dtype: torch.dtype = torch.bfloat16
    causal: bool = False
    window: tuple[int | None, int | None] = (None, None)
    softcap: float = 0.0
    sink: bool = False
    scale: float | None = None
    dense: bool = False
    grad: bool = True
    dlse: bool = True
    deterministic: bool = False
    seed: int = 0
    # q, k and v as row-strided slices of one (..., T, H + 2·Hkv, D) projection (self attention)
    packed: bool = False

    @property
    def id(self) -> str:
        lk = list(self.lk or self.lq)
        flags = (("causal", self.causal), ("sink", self.sink), ("dense", self.dense), ("packed", self.packed))
        opts = [n for n, on in flags if on]
        if self.window != (None, None):
            opts.append(f"w{self.window}")
        if self.softcap:
            opts.append(f"cap{self.softcap}")
        return f"lq{list(self.lq)}-lk{lk}-h{self.heads}/{self.kv_heads}-d{self.d}-{'-'.join(opts)}"


def qkv(tq: int, tk: int, case: Case, device: str, lead: tuple[int, ...] = ()):
    dv = case.dv or case.d
    q = randn((*lead, tq, case.heads, case.d), dtype=case.dtype, device=device, seed=case.seed)
    k = randn((*lead, tk, case.kv_heads, case.d), dtype=case.dtype, device=device, seed=case.seed + 1)
    v = randn((*lead, tk, case.kv_heads, dv), dtype=case.dtype, device=device, seed=case.seed + 2)
    return q, k, v


def compare_lse(lse: torch.Tensor, ref: torch.Tensor, name: str) -> None:
    """-inf exactly where the reference has -inf; finite rows within the fp32 allowance."""
    assert lse.dtype == torch.float32, f"{name}: lse dtype {lse.dtype}"
    inf_ref, inf_out = torch.isneginf(ref), torch.isneginf(lse)
    assert torch.equal(inf_ref, inf_out), f"{name}: -inf rows differ ({int((inf_ref ^ inf_out).sum())})"
    live = ~inf_ref
    if live.any():
        err = (lse[live] - ref[live]).abs().max().item()
        assert err <= LSE_FLOOR * max(1.0, ref[live].abs().max().item()), f"{name}: lse error {err:.3g}"


def _packed_leaves(leaves, case: Case):
    """One leaf holding q, k and v side by side on the heads dim, as a fused QKV projection's output
    viewed (..., T, H + 2·Hkv, D), and the function that slices q, k, v (or their gradients) out of
    it: row-strided views, not copies."""
    q, k, v = leaves[:3]
    assert q.shape[:-2] == k.shape[:-2], "packed: self attention"
    assert q.shape[-1] == k.shape[-1] == v.shape[-1], "packed: one head dim"
    qkv = torch.cat([q, k, v], dim=-2).detach().requires_grad_(case.grad)
    h, hk = case.heads, case.kv_heads

    def split(t):
        parts = t[..., :h, :], t[..., h : h + hk, :], t[..., h + hk :, :]
        assert all(not p.is_contiguous() for p in parts), "packed: the slices must be strided views"
        return parts

    return [qkv, *leaves[3:]], split


def run_case(case: Case, device: str) -> None:
    """Ours vs the fp32 reference (truth) and the same-precision reference (baseline), fwd + bwd."""
    lk = case.lk if case.lk is not None else case.lq
    if case.dense:
        assert len(set(case.lq)) == 1 and len(set(lk)) == 1
        lead, tq, tk = (len(case.lq),), case.lq[0], lk[0]
    else:
        lead, tq, tk = (), sum(case.lq), sum(lk)
    q, k, v = qkv(tq, tk, case, device, lead)
    sink = randn((case.heads,), dtype=case.dtype, device=device, seed=case.seed + 5) if case.sink else None
    cu_q, cu_k = lengths_to_offsets(list(case.lq), device=device), lengths_to_offsets(list(lk), device=device)
    opts = dict(causal=case.causal, softcap=case.softcap)
    ins = [t for t in (q, k, v, sink) if t is not None]

    def ours(*leaves):
        s = leaves[3] if case.sink else None
        kw = dict(
            softmax_scale=case.scale,
            window_size=case.window,
            learnable_sink=s,
            return_lse=True,
            deterministic=case.deterministic,
            **opts,
        )
        if case.dense:
            return flash_attn_func(*leaves[:3], **kw)
        return flash_attn_varlen_func(
            *leaves[:3], cu_q, cu_k, max(case.lq, default=0), max(lk, default=0), **kw
        )

    def ref(*leaves, dtype):
        s = leaves[3] if case.sink else None
        kw = dict(scale=case.scale, window=case.window, sink=s, dtype=dtype, **opts)
        if case.dense:
            return softmax_attention_ref(*leaves[:3], **kw)
        return softmax_attention_varlen_ref(*leaves[:3], cu_q, cu_k, **kw)

    leaves = [t.detach().clone().requires_grad_(case.grad) for t in ins]
    truth_leaves = [t.detach().float().requires_grad_(case.grad) for t in ins]
    base_leaves = [t.detach().clone().requires_grad_(case.grad) for t in ins]
    if case.packed:
        leaves, split = _packed_leaves(leaves, case)
        out, lse = ours(*split(leaves[0]), *leaves[1:])
    else:
        out, lse = ours(*leaves)
    r_out, r_lse = ref(*truth_leaves, dtype=torch.float32)
    b_out, b_lse = ref(*base_leaves, dtype=case.dtype)
    assert out.shape == r_out.shape and out.dtype == q.dtype, (out.shape, r_out.shape)
    assert lse.shape == r_lse.shape, (lse.shape, r_lse.shape)
    assert_close_vs_baseline(out, r_out, b_out, name=f"out[{case.id}]")
    compare_lse(lse, r_lse, f"lse[{case.id}]")
    if not case.grad:
        return
    do = randn(out.shape, dtype=case.dtype, device=device, seed=case.seed + 3)
    dl = randn(lse.shape, dtype=torch.float32, device=device, seed=case.seed + 4) if case.dlse else None

    def loss(o, l_):
        total = (o.float() * do.float()).sum()
        return total + (torch.where(torch.isfinite(l_), l_, 0.0) * dl).sum() if dl is not None else total

    grads = torch.autograd.grad(loss(out, lse), leaves)
    if case.packed:
        grads = (*split(grads[0]), *grads[1:])
        leaves = [*split(leaves[0]), *leaves[1:]]
    r_grads = torch.autograd.grad(loss(r_out, r_lse), truth_leaves)
    b_grads = torch.autograd.grad(loss(b_out, b_lse), base_leaves)
    for name, a, x, r, b in zip(("dq", "dk", "dv", "dsink"), grads, leaves, r_grads, b_grads):
        assert a.dtype == x.dtype and a.shape == x.shape, name
        assert_close_vs_baseline(a, r, b.to(a.dtype), name=f"{name}[{case.id}]")


def jagged_case(
    lq,
    lk,
    *,
    max_q,
    window=None,
    broadcast_q=False,
    heads=2,
    kv_heads=1,
    d=32,
    dtype=torch.bfloat16,
    seed=0,
    device="cpu",
    grad=True,
) -> None:
    """jagged_attention vs jagged_attention_ref, forward and gradients."""
    case = Case(tuple(lq), tuple(lk), heads=heads, kv_heads=kv_heads, d=d, dtype=dtype, seed=seed)
    q, k, v = qkv(sum(lq), sum(lk), case, device)
    cu_q = lengths_to_offsets(list(lq), device=device)
    cu_k = lengths_to_offsets(list(lk), device=device)
    ins = (q, k, v)
    leaves = [t.detach().clone().requires_grad_(grad) for t in ins]
    truth = [t.detach().float().requires_grad_(grad) for t in ins]
    base = [t.detach().clone().requires_grad_(grad) for t in ins]
    out, lse = jagged_attention(
        *leaves, cu_q, cu_k, max_q, max(lk, default=0), window_size=window, broadcast_q=broadcast_q
    )
    kw = dict(window_size=window, broadcast_q=broadcast_q)
    r_out, r_lse = jagged_attention_ref(*truth, cu_q, cu_k, max_q, **kw)
    b_out, b_lse = jagged_attention_ref(*base, cu_q, cu_k, max_q, dtype=dtype, **kw)
    name = f"jagged lq{lq} lk{lk} max_q{max_q} w{window} bq{broadcast_q}"
    assert out.shape == r_out.shape and lse.shape == r_lse.shape
    assert_close_vs_baseline(out, r_out, b_out, name=f"out[{name}]")
    compare_lse(lse, r_lse, f"lse[{name}]")
    if not grad:
        return
    do = randn(out.shape, dtype=dtype, device=device, seed=seed + 3)
    g = torch.autograd.grad(out, leaves, do)
    rg = torch.autograd.grad(r_out, truth, do.float())
    bg = torch.autograd.grad(b_out, base, do)
    for n, a, r, b in zip(("dq", "dk", "dv"), g, rg, bg):
        assert_close_vs_baseline(a, r, b, name=f"{n}[{name}]")


def paged_cache(k, v, cu_k, page_size, extra_pages=3, seed=0):
    """K/V scattered into shuffled pages of a cache, and the page table that finds them again."""
    lens = (cu_k[1:] - cu_k[:-1]).tolist()
    per_seq = [-(-n // page_size) for n in lens]
    width = max(max(per_seq), 1)
    n_pages = sum(per_seq) + extra_pages
    perm = torch.randperm(n_pages, generator=torch.Generator().manual_seed(seed))
    kc = randn((n_pages, page_size, *k.shape[1:]), dtype=k.dtype, device=k.device, seed=seed + 11)
    vc = randn((n_pages, page_size, *v.shape[1:]), dtype=v.dtype, device=v.device, seed=seed + 12)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    nxt = 0
    starts = cu_k.tolist()
    for b, n in enumerate(lens):
        for p in range(per_seq[b]):
            page = int(perm[nxt])
            nxt += 1
            table[b, p] = page
            rows = slice(starts[b] + p * page_size, starts[b] + min((p + 1) * page_size, n))
            m = rows.stop - rows.start
            kc[page, :m], vc[page, :m] = k[rows], v[rows]
    return kc, vc, table.to(k.device)


def count_calls(monkeypatch, module, name: str) -> list[int]:
    """A list that gains an entry each time ``module.name`` is called (the function still runs), so
    a test can assert which kernel family took a call."""
    calls: list[int] = []
    real = getattr(module, name)

    def spy(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(module, name, spy)
    return calls


TILE = 128  # the Gluon kernels' query / key tile
# local windows (bottom-right, FA4's window_size) for both Gluon kernels' GPU tests: band edges
# inside and across tiles, one-sided, empty bands for some rows (Lq > Lk with a right side of 0),
# every row's band outside its sequence
WINDOWED = [
    Case(lq=(1000, TILE + 1, 1, 0), lk=(1000, TILE - 1, 300, 7), heads=4, kv_heads=2, d=128, window=(64, 32)),
    Case(lq=(700, 2 * TILE + 1), lk=(300, 2 * TILE + 1), heads=4, kv_heads=4, d=128, window=(200, 0)),
    Case(
        lq=(TILE + 1, 900), lk=(2049, 900), heads=4, kv_heads=1, d=64, window=(None, 100), dtype=torch.float16
    ),  # fmt: skip
    Case(lq=(600,), lk=(600,), heads=2, kv_heads=2, d=128, window=(0, 0)),
    Case(lq=(1024,) * 2, lk=(1024,) * 2, heads=4, kv_heads=2, d=128, dense=True, window=(256, 256)),
]
