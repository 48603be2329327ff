"""GPU A/B of the CuTe DSL forward's builds against the Gluon forward, for one device run (not a
pytest module).

``python tests/cute_fwd_probe.py [BUILD ...]`` (default: every build): each build of
``test_cute_fwd.BUILDS`` plus ``default`` in its own process (a device fault poisons the CUDA
context): the first compile's latency, two quick cases against the fp32 reference, then the CuTe and
the Gluon forward timed in the same process (B=1152, H=4, D=128, bf16 fast_gelu, scale 1; max 2048 at
sparsity 1.0 and 0.5, max 1024, max 512 at 0.5, 2048 queries x 256 keys; medians of
``ads_kernel_tools.bench.time_fn``) with the largest difference between their outputs. Output lines
start with the build's name. ``python tests/cute_fwd_probe.py profile [BUILD]`` launches the Gluon and
the CuTe forward once each at max 2048, sparsity 1.0 (after compiling), for a profiler:
``ncu --set full -k regex:"gdpa_fwd_ws|GdpaFwdSm90" -c 2 -o fwd python tests/cute_fwd_probe.py profile``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (max query length, sparsity, key length or None for the query lengths)
SHAPES = [(2048, 1.0, None), (2048, 0.5, None), (1024, 1.0, None), (512, 0.5, None), (2048, 1.0, 256)]


def _run(name: str) -> int:
    from cute_probe import _ab_inputs
    from test_cute_fwd import BUILDS
    from test_gluon_fwd import _cases, _check

    from ads_gdpa.cute import fwd_sm90
    from ads_gdpa.gluon.fwd_sm90 import gdpa_fwd_gluon
    from ads_kernel_tools.bench.timing import time_fn

    for key, value in BUILDS.get(name, {}).items():
        setattr(fwd_sm90.GdpaFwdSm90, key, value)
    t0 = time.time()
    fwd_sm90.compiled(torch.bfloat16, 128, 3, True)
    print(f"[{name}] first compile {time.time() - t0:.2f} s", flush=True)
    for i, case in enumerate(_cases(True)[:2]):
        try:
            _check(None, **case, kernel=fwd_sm90.gdpa_fwd_cute)
        except AssertionError as e:
            print(f"[{name}] WRONG case {i}: {str(e)[:300]}", flush=True)
            return 1
    print(f"[{name}] smoke cases pass", flush=True)
    for max_len, sparsity, key_len in SHAPES:
        pairs, inputs = _ab_inputs(1152, sparsity, max_len, key_len)
        q, k, v, cu_q, cu_k, max_q, max_k = inputs[1:]
        flop = 4 * q.shape[1] * q.shape[2] * pairs
        shape = f"max{max_len} s={sparsity}" + (f" kv{key_len}" if key_len else "")
        ms, outs = {}, {}
        for kname, fn in (("gluon", gdpa_fwd_gluon), ("cute", fwd_sm90.gdpa_fwd_cute)):
            out = torch.empty_like(q)
            call = functools.partial(fn, q, k, v, cu_q, cu_k, max_q, max_k, 3, 1.0, out, longest_q=max_len)
            call()
            torch.cuda.synchronize()
            outs[kname] = out.clone()
            r = time_fn(call, warmup_ms=300, rep_ms=2000)
            ms[kname] = r["ms"]
            print(f"[{name}] {shape} {kname}: {r['ms']:.3f} ms (p20 {r['p20']:.3f}, p80 {r['p80']:.3f}, "
                  f"n={r['n']}) {flop / r['ms'] / 1e9:.1f} TFLOP/s", flush=True)  # fmt: skip
        diff = (outs["cute"].float() - outs["gluon"].float()).abs().max().item()
        peak = outs["gluon"].float().abs().max().item()
        print(f"[{name}] {shape} cute/gluon speed {ms['gluon'] / ms['cute']:.3f}, max |cute - gluon| "
              f"{diff:.3g} (max |gluon| {peak:.3g})", flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    return 0


def _profile(name: str) -> int:
    from cute_probe import _ab_inputs
    from test_cute_fwd import BUILDS

    from ads_gdpa.cute import fwd_sm90
    from ads_gdpa.gluon.fwd_sm90 import gdpa_fwd_gluon

    for key, value in BUILDS.get(name, {}).items():
        setattr(fwd_sm90.GdpaFwdSm90, key, value)
    _, inputs = _ab_inputs(264, 1.0, 2048)
    q, k, v, cu_q, cu_k, max_q, max_k = inputs[1:]
    fwd_sm90.compiled(torch.bfloat16, 128, 3, True)
    for fn in (gdpa_fwd_gluon, fwd_sm90.gdpa_fwd_cute):
        fn(q, k, v, cu_q, cu_k, max_q, max_k, 3, 1.0, torch.empty_like(q), longest_q=max_q)
        torch.cuda.synchronize()
    print(f"[{name}] profile: one launch of each forward done", flush=True)
    return 0


def _all(names: list[str]) -> int:
    from test_cute_fwd import BUILDS

    here = os.path.abspath(__file__)
    for name in names or ["default", *sorted(BUILDS)]:
        try:
            run = subprocess.run([sys.executable, here, "run", name], capture_output=True, text=True,
                                 timeout=240)  # fmt: skip
            rc, text = run.returncode, run.stdout + run.stderr
        except subprocess.TimeoutExpired as e:
            out = e.stdout or ""
            rc, text = "timeout", out.decode(errors="replace") if isinstance(out, bytes) else out
        lines = [ln for ln in text.splitlines() if ln.startswith("[") or "Error" in ln]
        print(f"== {name}: rc={rc}", *lines[-40:], sep="\n  ", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "run":
        sys.exit(_run(sys.argv[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "profile":
        sys.exit(_profile(sys.argv[2] if len(sys.argv) > 2 else "default"))
    sys.exit(_all(sys.argv[1:]))
