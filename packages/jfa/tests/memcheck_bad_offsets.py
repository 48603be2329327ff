"""Run every ads_jfa path on bad device offsets; meant to run under ``compute-sanitizer --tool
memcheck`` (``test_gpu.py::test_bad_offsets_are_memcheck_clean``), which must report 0 errors.

The offsets decrease, pass the end of their tensors or start below 0; they live on the GPU and no
host copies are given, so nothing validates them and only the engine's clamping keeps every access
inside the tensors.
"""

from __future__ import annotations

import torch

from ads_jfa import PoolingByMultiheadAttention, jagged_flash_attention
from ads_jfa.fbgemm import jagged_flash_attention_basic, multi_head_jagged_flash_attention

ROWS = 1000
CASES = [[0, 600, 300, 5000], [-300, 200, 700, 1000], [0, 1 << 30, 5, -(1 << 30)]]


def tensors(heads: int, kv_heads: int, d: int = 128):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(ROWS, heads, d, device="cuda", generator=g).bfloat16().requires_grad_()
    k = torch.randn(ROWS, kv_heads, d, device="cuda", generator=g).bfloat16().requires_grad_()
    v = torch.randn(ROWS, kv_heads, d, device="cuda", generator=g).bfloat16().requires_grad_()
    return q, k, v


def main() -> None:
    for cu in CASES:
        offs = torch.tensor(cu, dtype=torch.int32, device="cuda")
        for window, det, heads, kv_heads in ((None, False, 4, 4), (64, False, 4, 2), (None, True, 4, 1)):
            q, k, v = tensors(heads, kv_heads)
            out = jagged_flash_attention(q, k, v, offs, offs.flip(0), 1024, 1024, window_size=window,
                                         deterministic=det)  # fmt: skip
            torch.autograd.grad(out.float().sum(), (q, k, v))
        q, k, v = tensors(4, 2)
        bq = torch.tensor([cu[1], cu[3]], dtype=torch.int32, device="cuda")
        out = jagged_flash_attention(q[:128], k, v, bq, offs, 128, 1024, broadcast_q=True)
        torch.autograd.grad(out.float().sum(), (q, k, v))
        pma = PoolingByMultiheadAttention(32, 4, 128, 2).cuda()
        torch.autograd.grad(pma(k, v, offs, 1024).float().sum(), (pma.query, k, v))
        x = q[:, 0].detach().clone().requires_grad_()
        for use_mask in (False, True):
            out = jagged_flash_attention_basic(x, x, x, offs.long(), 512, use_mask=use_mask)
            torch.autograd.grad(out.float().sum(), x)
        xh = q.detach().transpose(0, 1).contiguous().requires_grad_()
        torch.autograd.grad(multi_head_jagged_flash_attention(xh, xh, xh, offs, 512).float().sum(), xh)
        torch.cuda.synchronize()
    print("memcheck_bad_offsets: all paths ran")


if __name__ == "__main__":
    main()
