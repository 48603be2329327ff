"""When a custom op can be skipped: the "plain eager" test of the packages' fast paths.

A ``torch.library`` custom op costs tens of microseconds of host time per call (dispatcher, schema
check, generated autograd wrapper), more than the GPU work of a small call. Plain eager calls can take
a ``torch.autograd.Function`` over the same kernels instead; everything else (torch.compile, export,
tracing, fake / meta tensors, dispatch modes such as FlopCounterMode or opcheck's, functorch
transforms, tensor subclasses) must keep going through the op, whose fake impl and registrations they
rely on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.nn import Parameter
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ["plain_eager", "eager_function"]

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
