"""``gluon.launch_cache``: the key it computes of a launch, and that a hit calls the compiled
kernel's launcher with every parameter in order while a miss, an unknown argument type or
``cached=False`` takes Triton's path (CPU: the kernel and its launcher are recorders)."""

from __future__ import annotations

import pytest
import torch

from ads_norm_fusion.gluon import launch_cache as lc


@pytest.fixture
def on_gpu(monkeypatch):
    """As on a GPU outside the interpreter, with device 0's stream 7."""
    monkeypatch.setattr(lc, "interpreter_active", lambda: False)
    monkeypatch.setattr(lc, "_RELAUNCH", True)
    monkeypatch.setattr(lc, "_current_device", lambda: 0)
    monkeypatch.setattr(lc, "_current_stream", lambda: 7)
    monkeypatch.setattr(lc, "_launch_hooks", lambda: (None, None))


def test_key_follows_triton_specialisation(on_gpu) -> None:
    """What Triton specialises an argument on changes the key; nothing else does."""
    buf = torch.zeros(64, dtype=torch.float32)
    key = lc.spec_key((buf, 32, 1.5, None, True), {"C": 1, "num_warps": 4})
    same = lc.spec_key((torch.zeros(8, dtype=torch.float32), 48, 2.5, None, True), {"num_warps": 4, "C": 1})
    assert key == same  # other data, another multiple of 16, another float; keywords in any order
    for args in [
        (buf[1:], 32, 1.5, None, True),  # a pointer no longer 16-byte aligned
        (buf.to(torch.float16), 32, 1.5, None, True),  # another dtype
        (buf, 33, 1.5, None, True),  # not a multiple of 16
        (buf, 1, 1.5, None, True),  # 1 is a constant to Triton
        (buf, 2**31 + 16, 1.5, None, True),  # i64
        (buf, 32, 1.5, None, False),  # bools by value
        (buf, 32, None, None, True),  # a float given as None
    ]:
        assert lc.spec_key(args, {"C": 1, "num_warps": 4}) != key, args
    assert lc.spec_key((buf, 32, 1.5, None, True), {"C": 2, "num_warps": 4}) != key
    assert lc.spec_key((buf, [1, 2]), {}) is None  # a type it does not know: no caching


def test_descriptor_key(on_gpu) -> None:
    pytest.importorskip("triton.experimental.gluon")
    from ads_norm_fusion.gluon import fwd_sm90 as g

    a, b = torch.zeros(256, 128, dtype=torch.bfloat16), torch.zeros(512, 128, dtype=torch.bfloat16)
    assert lc.spec_key((g._desc(a, 64, 64),), {}) == lc.spec_key((g._desc(b, 64, 64),), {})
    assert lc.spec_key((g._desc(a, 64, 64),), {}) != lc.spec_key((g._desc(a, 128, 64),), {})
    assert lc.spec_key((g._desc(a, 64, 64),), {}) != lc.spec_key((g._desc(a.half(), 64, 64),), {})


class _Kernel:
    function, packed_metadata = "fn", "meta"

    def __init__(self, calls):
        self.calls = calls

    def launch_metadata(self, grid, stream, *bound):
        return None

    def run(self, *args):
        self.calls.append(("direct", args))


class _JitFn:
    """A jit function's surface: ``fn`` (the Python function) and ``fn[grid](...)``."""

    def __init__(self):
        self.calls = []

        def kernel(x_ptr, n, eps, A: int, B: int = 3, C: int = 5):
            pass

        self.fn = kernel

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append(("triton", grid, args, kw))
            return _Kernel(self.calls)

        return launch


def test_hit_launches_directly(on_gpu) -> None:
    fn = _JitFn()
    cache = lc.LaunchCache(fn)
    x = torch.zeros(16)
    cache.launch((4,), (x, 64, 1e-5), {"A": 1, "C": 9, "num_warps": 4})
    cache.launch((6, 2), (x, 128, 1e-6), {"A": 1, "C": 9, "num_warps": 4})
    assert fn.calls[0][0] == "triton"
    kind, args = fn.calls[1]
    # grid, stream, function, metadata, launch metadata, hooks, then every parameter in order with
    # the defaults of those not given (B) and without the launch options (num_warps)
    assert kind == "direct" and args == (6, 2, 1, 7, "fn", "meta", None, None, None, x, 128, 1e-6, 1, 3, 9)
    cache.launch((4,), (x, 65, 1e-5), {"A": 1, "C": 9, "num_warps": 4})  # another specialisation
    cache.launch((4,), (x, 64, 1e-5), {"A": 1, "C": 9, "num_warps": 4}, cached=False)
    assert [c[0] for c in fn.calls] == ["triton", "direct", "triton", "triton"]


def test_interpreter_takes_tritons_path(monkeypatch) -> None:
    monkeypatch.setattr(lc, "interpreter_active", lambda: True)
    fn = _JitFn()
    cache = lc.LaunchCache(fn)
    for _ in range(2):
        cache.launch((1,), (torch.zeros(4), 16, 0.5), {"A": 1})
    assert [c[0] for c in fn.calls] == ["triton", "triton"]


def test_other_triton_versions_take_tritons_path(on_gpu, monkeypatch) -> None:
    monkeypatch.setattr(lc, "_RELAUNCH", False)
    fn = _JitFn()
    cache = lc.LaunchCache(fn)
    for _ in range(2):
        cache.launch((1,), (torch.zeros(4), 16, 0.5), {"A": 1})
    assert [c[0] for c in fn.calls] == ["triton", "triton"]
