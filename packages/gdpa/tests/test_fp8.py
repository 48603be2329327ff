"""FP8 e4m3 forward against an emulation of the same precision, on every device.

The reference is the fp32 GDPA of the dequantised inputs; the baseline is PyTorch doing what the
kernel does in fp8 (S from the fp8 operands times the descales, P = scale·act(S) rounded to e4m3
with saturation, P·V from the fp8 values, times V's descale, bf16 output). The kernel must stay within
twice the baseline's error. On a CPU this relies on the tools' interpreter fix for fp8 casts.
"""

from __future__ import annotations

import pytest
import torch

from ads_gdpa import gdpa_varlen
from ads_kernel_tools.reference.gdpa import activation_ref, gdpa_ref
from ads_kernel_tools.testing import lengths_to_offsets, make_generator
from ads_kernel_tools.tolerance import assert_close_vs_baseline

LENS_Q, LENS_K = [5, 33, 0, 17], [9, 33, 4, 0]


def _emulate(q8, k8, v8, sq, sk, sv, cu_q, cu_k, act, scale):
    """The kernel's arithmetic in PyTorch, sequence by sequence (GQA by repeating kv heads)."""
    g = q8.shape[1] // k8.shape[1]
    out = torch.zeros(q8.shape[0], q8.shape[1], v8.shape[2], dtype=torch.bfloat16)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        qf = q8[q0:q1].float().transpose(0, 1)
        kf = k8[k0:k1].float().repeat_interleave(g, dim=1).transpose(0, 1)
        vf = v8[k0:k1].float().repeat_interleave(g, dim=1).transpose(0, 1)
        s = (qf @ kf.transpose(1, 2)) * (sq[:, None, None] * sk.repeat_interleave(g)[:, None, None])
        p = (scale * activation_ref(act, s)).clamp(-448, 448).to(torch.float8_e4m3fn).float()
        o = (p @ vf) * sv.repeat_interleave(g)[:, None, None]
        out[q0:q1] = o.transpose(0, 1).to(torch.bfloat16)
    return out


@pytest.mark.parametrize("act", ["fast_gelu", "relu", "silu"])
@pytest.mark.parametrize("descale", [False, True], ids=["unit_scales", "per_head_scales"])
def test_fp8_forward_vs_same_precision_emulation(device, act, descale):
    gen = make_generator(11)
    heads, heads_kv, dim = 4, 2, 32
    q = 0.3 * torch.randn(sum(LENS_Q), heads, dim, generator=gen)
    k = 0.3 * torch.randn(sum(LENS_K), heads_kv, dim, generator=gen)
    v = torch.rand(sum(LENS_K), heads_kv, dim, generator=gen) - 0.5
    if descale:  # per-head scales that fill the e4m3 range, undone by the kernel's descales
        sq, sk, sv = (x.abs().amax(dim=(0, 2)) / 448.0 for x in (q, k, v))
    else:
        sq, sk, sv = torch.ones(heads), torch.ones(heads_kv), torch.ones(heads_kv)
    q8, k8, v8 = ((x / s[None, :, None]).to(torch.float8_e4m3fn) for x, s in ((q, sq), (k, sk), (v, sv)))
    cu_q, cu_k = lengths_to_offsets(LENS_Q), lengths_to_offsets(LENS_K)
    out = gdpa_varlen(
        q8.to(device), k8.to(device), v8.to(device), cu_q.to(device), cu_k.to(device), max(LENS_Q),
        max(LENS_K), activation=act, scale=0.5, q_descale=sq.to(device), k_descale=sk.to(device),
        v_descale=sv.to(device),
    )  # fmt: skip
    assert out.dtype == torch.bfloat16
    deq = [x.float() * s[None, :, None] for x, s in ((q8, sq), (k8, sk), (v8, sv))]
    ref = gdpa_ref(*deq, cu_q, cu_k, max(LENS_Q), max(LENS_K), activation=act, scale=0.5)
    baseline = _emulate(q8, k8, v8, sq, sk, sv, cu_q, cu_k, act, 0.5)
    assert_close_vs_baseline(out.cpu(), ref, baseline, name=f"fp8 {act}")
