"""Bad device offsets through every kernel of the chain, forward and backward; meant to run under
``compute-sanitizer --tool memcheck python3 memcheck_case.py`` (``test_gpu.py``), which must report
0 errors. No host copies, so nothing is validated: only the kernels' own bounds keep them inside the
tensors. Prints one line at the end."""

from __future__ import annotations

import torch

from ads_gdpa_megakernel import gdpa_megakernel

ROWS = 1000
CASES = [[0, 600, 300, 5000], [-300, 200, 700, 1000], [900, 100, 50, 20]]


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    for cu in CASES:
        for h, d in ((4, 128), (3, 128)):  # H·D = 384: masked columns of a 512-wide chunk
            n = h * d
            q = torch.randn(ROWS, h, d, device="cuda", generator=g).to(dt).requires_grad_()
            k = (0.3 * torch.randn(ROWS, 1, d, device="cuda", generator=g)).to(dt).requires_grad_()
            v = torch.randn(ROWS, 1, d, device="cuda", generator=g).to(dt).requires_grad_()
            r = torch.randn(ROWS, h, d, device="cuda", generator=g).to(dt).requires_grad_()
            ws = [torch.ones(n, device="cuda", requires_grad=True) for _ in range(3)]
            offs = torch.tensor(cu, dtype=torch.int32, device="cuda")
            out = gdpa_megakernel(
                q, k, v, offs, offs, 1024, 1024, activation="fast_gelu", q_layernorm=(ws[0], ws[1]),
                q_residual=True, rms_norm_weight=ws[2], residual=r,
            )  # fmt: skip
            torch.autograd.grad(out.float().sum(), [q, k, v, r, *ws])
    torch.cuda.synchronize()
    print("all paths ran")


if __name__ == "__main__":
    main()
