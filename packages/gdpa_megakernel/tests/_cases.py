"""Shared test helpers: inputs, the composed fp32 reference, the same-precision PyTorch baseline and
the comparison under the baseline rule (tools/README.md), forward and every gradient."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ads_gdpa_megakernel import gdpa_megakernel
from ads_kernel_tools.reference.gdpa import gdpa_ref
from ads_kernel_tools.reference.norm import layer_norm_ref, rms_norm_ref
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline

# lengths around the interpreter's 32-row GDPA tiles: empty, one, tile - 1, tile + 1, a short one
EDGE = [0, 1, 31, 33, 5]


@dataclass
class Case:
    lengths: list[int] = field(default_factory=lambda: list(EDGE))
    heads: int = 2
    heads_kv: int = 1
    dim: int = 16
    dtype: torch.dtype = torch.bfloat16
    activation: str = "fast_gelu"
    scale: float = 0.25
    ln: str = "affine"  # off | affine | weight | plain
    q_residual: bool = True
    rms: str = "weight"  # off | weight | plain
    residual: bool = True
    eps: float = 1e-5
    max_q: int | None = None  # default: the longest sequence
    weight_dtype: torch.dtype = torch.float32
    # offsets that need not cover the tensor (rows owned by no sequence); default: from lengths
    offsets: list[int] | None = None
    total: int | None = None
    lengths_k: list[int] | None = None  # cross attention (e.g. short KV); default: self attention

    def seq_lengths(self) -> list[int]:
        if self.offsets is None:
            return self.lengths
        return [b - a for a, b in zip(self.offsets, self.offsets[1:])]


def make_inputs(c: Case, device: str, seed: int = 0) -> dict:
    t, n = (c.total if c.total is not None else sum(c.lengths)), c.heads * c.dim
    tk = t if c.lengths_k is None else sum(c.lengths_k)
    dt = c.dtype
    g = dict(device=device)
    ins = {
        "q": randn((t, c.heads, c.dim), dtype=dt, seed=seed, **g),
        "k": randn((tk, c.heads_kv, c.dim), dtype=dt, seed=seed + 1, scale=0.5, **g),
        "v": randn((tk, c.heads_kv, c.dim), dtype=dt, seed=seed + 2, **g),
    }
    wd = c.weight_dtype
    if c.ln != "off":
        ins["ln_w"] = (
            (1 + 0.2 * randn((n,), seed=seed + 3, **g)).to(wd) if c.ln in ("affine", "weight") else None
        )
        ins["ln_b"] = (0.2 * randn((n,), seed=seed + 4, **g)).to(wd) if c.ln == "affine" else None
    if c.rms == "weight":
        ins["rms_w"] = (1 + 0.2 * randn((n,), seed=seed + 5, **g)).to(wd)
    if c.residual:
        ins["residual"] = randn((t, c.heads, c.dim), dtype=dt, seed=seed + 6, **g)
    ins["dout"] = randn((t, c.heads, c.dim), dtype=dt, seed=seed + 7, **g)
    if c.offsets is not None:
        ins["cu"] = torch.tensor(c.offsets, dtype=torch.int32, device=device)
    else:
        ins["cu"] = lengths_to_offsets(c.lengths, device=device)
    ins["cu_k"] = ins["cu"] if c.lengths_k is None else lengths_to_offsets(c.lengths_k, device=device)
    return ins


def leaves(ins: dict) -> list[str]:
    return [k for k in ("q", "k", "v", "ln_w", "ln_b", "rms_w", "residual") if ins.get(k) is not None]


def max_q(c: Case) -> int:
    return c.max_q if c.max_q is not None else max(max(c.seq_lengths()), 1)


def max_k(c: Case) -> int:
    return max(max(c.seq_lengths() if c.lengths_k is None else c.lengths_k), 1)


def run_ours(c: Case, ins: dict, **kw) -> torch.Tensor:
    cu, m = ins["cu"], max_q(c)
    return gdpa_megakernel(
        ins["q"], ins["k"], ins["v"], cu, ins["cu_k"], m, max_k(c), activation=c.activation,
        scale=c.scale, q_layernorm=(ins.get("ln_w"), ins.get("ln_b")) if c.ln != "off" else None,
        q_residual=c.q_residual, rms_norm_weight=ins.get("rms_w"), rms_norm=c.rms != "off",
        residual=ins.get("residual"), eps=c.eps, **kw,
    )  # fmt: skip


def run_ref(c: Case, ins: dict, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The user's chain composed from the tools references; fp32 = the truth, bf16/fp16 = the baseline
    (every step rounded to the input precision, as an unfused PyTorch stack computes it)."""
    q = ins["q"]
    t, h, d = q.shape
    n = h * d
    cu = ins["cu"]
    x = q.reshape(t, n)
    if c.ln != "off":
        x = layer_norm_ref(x, ins.get("ln_w"), ins.get("ln_b"), c.eps, dtype=dtype)
    else:
        x = x.to(dtype)
    a = gdpa_ref(x.view(t, h, d), ins["k"], ins["v"], cu, ins["cu_k"], max_q(c), max_k(c),
                 activation=c.activation, scale=c.scale, dtype=dtype).reshape(t, n)  # fmt: skip
    y = (a + x) if c.q_residual else a
    if c.rms != "off":
        y = rms_norm_ref(y, ins.get("rms_w"), c.eps, dtype=dtype)
    if c.residual:
        y = y + ins["residual"].reshape(t, n).to(dtype)
    return y.view(t, h, d)


def _grads(fn, ins: dict, names: list[str], cast) -> tuple[torch.Tensor, list[torch.Tensor]]:
    local = dict(ins)
    for k in names:
        local[k] = cast(ins[k]).detach().requires_grad_()
    out = fn(local)
    grads = torch.autograd.grad(out, [local[k] for k in names], ins["dout"].to(out.dtype), allow_unused=True)
    return out.detach(), [torch.zeros_like(local[k]) if g is None else g for k, g in zip(names, grads)]


def check(c: Case, device: str, seed: int = 0, backward: bool = True, **kw) -> None:
    """Forward (and every gradient) of ours against the fp32 reference under the baseline rule."""
    ins = make_inputs(c, device, seed)
    names = leaves(ins) if backward else []
    ours, g_ours = _grads(lambda i: run_ours(c, i, **kw), ins, names, lambda t: t)
    ref, g_ref = _grads(lambda i: run_ref(c, i), ins, names, lambda t: t.float())
    base, g_base = _grads(lambda i: run_ref(c, i, c.dtype), ins, names, lambda t: t)
    assert ours.dtype == c.dtype and ours.shape == ins["q"].shape
    assert_close_vs_baseline(ours, ref, base, name="out")
    for k, go, gr, gb in zip(names, g_ours, g_ref, g_base):
        assert go.dtype == ins[k].dtype, f"d{k} dtype {go.dtype}, input {ins[k].dtype}"
        assert_close_vs_baseline(go.float(), gr, gb.float(), name=f"d{k}", floor=_floor(gr, c.dtype))


def _floor(ref: torch.Tensor, dtype: torch.dtype) -> float:
    # gradients summed over many tokens (weights) carry the input precision's rounding at their magnitude
    from ads_kernel_tools.tolerance import rounding_floor

    return rounding_floor(ref, dtype)
