"""First-call latency and host time of the CuTe DSL kernels, for one device run (not a pytest module).

``python tests/cute_cache_probe.py`` twice (``ADS_GDPA_CUTE_CACHE=1``, the default outside the test
suite): the first process compiles and fills the disk cache, the second loads from it. Each prints
the first forward and backward call's time (bf16, D=128, fast_gelu), checks the CuTe forward against
the Gluon forward, then the per-call host time of both forwards on a short problem (3 sequences of
at most 300 rows, H=4), where the host, not the GPU, sets the pace.
"""

from __future__ import annotations

import time

import torch

from ads_gdpa.cute import bwd_sm90, fwd_sm90
from ads_gdpa.gluon.fwd_sm90 import gdpa_fwd_gluon

LENS, H, D, ACT = [200, 77, 300], 4, 128, 3


def main() -> None:
    cu = torch.tensor([0, *torch.tensor(LENS).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    total, longest, scale = sum(LENS), max(LENS), 1.0 / max(LENS)
    q, k, v, do = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, ref = torch.empty_like(q), torch.empty_like(q)
    args = (q, k, v, cu, cu, longest, longest, ACT, scale)
    start = time.perf_counter()
    fwd_sm90.gdpa_fwd_cute(*args, out)
    torch.cuda.synchronize()
    mid = time.perf_counter()
    dq = torch.zeros(total, H, D, device="cuda", dtype=torch.float32)
    bwd_sm90.gdpa_bwd_cute(do, *args, dq, torch.empty_like(k), torch.empty_like(v))
    torch.cuda.synchronize()
    print(f"first call: forward {mid - start:.2f} s, backward {time.perf_counter() - mid:.2f} s")
    gdpa_fwd_gluon(*args, ref)
    torch.cuda.synchronize()
    print(f"forward max |cute - gluon| {(out.float() - ref.float()).abs().max().item():.3g}")
    for name, call in (
        ("cute", lambda: fwd_sm90.gdpa_fwd_cute(*args, out)),
        ("gluon", lambda: gdpa_fwd_gluon(*args, ref)),
    ):
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        n, start = 300, time.perf_counter()
        for _ in range(n):
            call()
        host = (time.perf_counter() - start) / n
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / n
        print(f"{name} forward: host {host * 1e6:.0f} us per call, wall {wall * 1e6:.0f} us per call")


if __name__ == "__main__":
    main()
