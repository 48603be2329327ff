"""Kernel-agnostic Triton and Gluon building blocks shared by the kernel packages.

The only part of ads-kernel-tools that imports Triton (install ``ads-kernel-tools[triton]``); nothing
here is imported by the rest of the package, which stays importable without it.

| module | what it holds |
|---|---|
| ``offsets`` | ``clamp_offsets``: jagged offsets clamped into their tensors on the device (memory safety) |
| ``tile_list`` | ``schedule`` / ``tile_list``: workload-sorted lists of real tiles for persistent kernels |
| ``hw_math`` | ``tanh_approx``, ``rcp_approx``, ``ex2_approx``: MUFU approximations as @triton.jit helpers |
| ``gluon_hopper`` | sm_90 Gluon helpers: layouts, tile decoding, row stores, reductions, TMA staging |
| ``launch_cache`` | ``LaunchCache``: relaunch a compiled kernel without Triton's per-call argument binding |
| ``span_fill``, ``transpose`` | zero fills outside sequence spans; K-major copies of V |
| ``grid`` | ``cdiv``: host-side ceiling division for grids and tile counts (``triton.cdiv`` is slow there) |

Extension rule: a helper moves here once a second package needs it, written without knowledge of
the op that uses it (no activation, mask or softmax logic); each has a CPU test (interpreter or the
offline sm_90 compile in ``tests/test_kernels_compile.py``).
"""
