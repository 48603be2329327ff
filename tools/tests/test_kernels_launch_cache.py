"""``kernels.launch_cache``: the key it computes of a launch, and that a hit calls the compiled
kernel's launcher with every parameter in order while a miss, an unknown argument type or
``cached=False`` (or ``ADS_LAUNCH_CACHE=0``) takes Triton's path (CPU: the kernel and its launcher
are recorders)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from ads_kernel_tools.kernels import launch_cache as lc


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
    same = lc.spec_key((torch.zeros(8, dtype=torch.float32), 48, 2.5, None, True), {"C": 1, "num_warps": 4})
    assert key == same  # other data, another multiple of 16, another float
    # keywords are keyed in the order given: reordered, a call site only adds an entry
    assert lc.spec_key((buf, 32, 1.5, None, True), {"num_warps": 4, "C": 1}) is not None
    # the inline keys of the exact types match the general ones (subclasses, other ints)
    assert lc.spec_key((torch.nn.Parameter(buf), 32), {}) == lc.spec_key((buf, 32), {})
    assert [lc.spec_key((a,), {})[1][0] for a in (buf, 48, 1, 2.5, None)] == [
        lc._arg_key(a) for a in (buf, 48, 1, 2.5, None)
    ]
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
    assert lc.spec_key((buf,), {"X": buf}) is None  # a tensor by keyword would be keyed, and kept, by value


def test_descriptor_key(on_gpu) -> None:
    pytest.importorskip("triton.experimental.gluon")
    from triton.experimental.gluon import language as gl

    from ads_kernel_tools.kernels.gluon_hopper import rows_desc

    a, b = torch.zeros(256, 1, 128, dtype=torch.bfloat16), torch.zeros(512, 1, 128, dtype=torch.bfloat16)
    key = lc.spec_key((rows_desc(a, 64, gl.bfloat16),), {})
    assert key is not None and key == lc.spec_key((rows_desc(b, 64, gl.bfloat16),), {})
    assert key != lc.spec_key((rows_desc(a, 128, gl.bfloat16),), {})
    assert key != lc.spec_key((rows_desc(a.half(), 64, gl.float16),), {})


def test_positional_constexpr_keyed_by_value(on_gpu) -> None:
    """A constexpr passed by position is compiled in: each value its own key (an int's runtime
    properties would call 32 and 48 the same)."""
    at = frozenset({1})
    assert lc.spec_key((torch.zeros(4), 32), {}, at) != lc.spec_key((torch.zeros(4), 48), {}, at)
    assert lc.spec_key((torch.zeros(4), 32), {}) == lc.spec_key((torch.zeros(4), 48), {})


def test_constexpr_positions_from_a_jit_function() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, n, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
        pass

    # this module's annotations are strings (``from __future__ import annotations``), as in the kernels
    assert lc.LaunchCache(kernel)._constexpr_at == frozenset({2, 3})


def test_switch(on_gpu, monkeypatch) -> None:
    fn = _JitFn()
    cache = lc.LaunchCache(fn)
    monkeypatch.setenv("ADS_LAUNCH_CACHE", "0")
    for _ in range(2):
        cache.launch((1,), (torch.zeros(4), 16, 0.5), {"A": 1})
    assert [c[0] for c in fn.calls] == ["triton", "triton"]
    monkeypatch.setenv("ADS_LAUNCH_CACHE", "1")
    cache.launch((1,), (torch.zeros(4), 16, 0.5), {"A": 1})
    cache.launch((1,), (torch.zeros(4), 16, 0.5), {"A": 1}, cached=False)  # the caller's say wins
    assert [c[0] for c in fn.calls] == ["triton", "triton", "triton", "triton"]
    cache.launch((1,), (torch.zeros(4), 16, 0.5), {"A": 1})
    assert fn.calls[-1][0] == "direct"
    monkeypatch.setenv("ADS_LAUNCH_CACHE", "yes")
    with pytest.raises(ValueError, match="ADS_LAUNCH_CACHE"):
        cache.launch((1,), (torch.zeros(4), 16, 0.5), {"A": 1})


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
