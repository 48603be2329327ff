"""Custom-op plumbing the packages share: when a custom op can be skipped (the "plain eager" test of
their fast paths), and the argument helpers of the ops' FLOP formulas.

A ``torch.library`` custom op costs tens of microseconds of host time per call (dispatcher, schema
check, generated autograd wrapper), more than the GPU work of a small call. Plain eager calls can take
a ``torch.autograd.Function`` over the same kernels instead; everything else (torch.compile, export,
tracing, fake / meta tensors, dispatch modes such as FlopCounterMode or opcheck's, functorch
transforms, tensor subclasses) must keep going through the op, whose fake impl and registrations they
rely on.

A FLOP formula registered with ``register_flop_formula(op, get_raw=True)`` receives the op's arguments
as the call passed them (positional, then keywords) and may run on fake tensors under torch.compile:
``bind_op_args`` names them, ``readable_host`` reads host offsets only where they are real CPU data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor
from torch.autograd.function import once_differentiable
from torch.nn import Parameter
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ["plain_eager", "eager_function", "bind_op_args", "readable_host"]

# nn.Parameter only marks a module's leaf tensor (it disables __torch_function__): plain for this test
_PLAIN = (Tensor, Parameter)


def plain_eager(tensors: Iterable[Tensor | None]) -> bool:
    """True outside torch.compile / export / tracing, with no dispatch mode or functorch transform
    active and only plain, non-meta tensors, parameters or None: there the custom op adds host time
    and nothing else, so the same kernels may run without it."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or _get_current_dispatch_mode() is not None:
        return False
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    for t in tensors:  # a loop, not all(<genexpr>): this runs on every call
        if t is not None and (type(t) not in _PLAIN or t.is_meta):
            return False
    return True


def eager_function(
    name: str, impl: Callable, setup_context: Callable, backward: Callable
) -> type[torch.autograd.Function]:
    """The ``torch.autograd.Function`` a package's plain eager calls take instead of its custom op:
    ``impl(*inputs)`` (the op's implementation), then ``setup_context(ctx, inputs, output)`` and
    ``backward(ctx, *grads)`` exactly as registered with the op's ``register_autograd``. The backward
    finds ``ctx.eager = True`` (it may then call implementations instead of ops, while
    ``plain_eager`` still holds for its gradients) and gradients of unused outputs as None (not
    materialised); it runs once-differentiable."""

    def forward(ctx, *inputs):
        out = impl(*inputs)
        setup_context(ctx, inputs, out)
        ctx.eager = True
        ctx.set_materialize_grads(False)
        return out

    def run_backward(ctx, *grads):
        return backward(ctx, *grads)

    body = {"forward": staticmethod(forward), "backward": staticmethod(once_differentiable(run_backward))}
    return type(name, (torch.autograd.Function,), body)


def bind_op_args(
    fields: tuple[str, ...],
    args: tuple,
    kwargs: Mapping[str, object],
    defaults: Mapping[str, object] | None = None,
) -> dict:
    """An op's arguments by field name (``fields`` in schema order, e.g. a NamedTuple's ``_fields``):
    positional ones in order, then the keywords among ``fields`` (a formula's own keywords such as
    ``out_val`` are dropped); a field not passed takes ``defaults[name]``, else None."""
    bound = dict(zip(fields, args))
    bound.update({k: v for k, v in kwargs.items() if k in fields})
    for name in fields:
        bound.setdefault(name, (defaults or {}).get(name))
    return bound


def readable_host(host) -> tuple[int, ...] | None:
    """Host offsets as ints, or None where they are not real data (None, not a tensor, not on the
    CPU, or a fake tensor): what a FLOP formula can count without a device sync."""
    if host is None or not isinstance(host, Tensor) or host.device.type != "cpu":
        return None
    if isinstance(host, FakeTensor):
        return None
    return tuple(host.tolist())
