import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from ads_kernel_tools.dispatch import bind_op_args, plain_eager, readable_host


def test_plain_tensors_parameters_and_none():
    assert plain_eager([torch.ones(2), None, torch.zeros(3, requires_grad=True)])
    assert plain_eager([torch.nn.Parameter(torch.ones(2)), torch.nn.Linear(2, 2).weight])
    assert plain_eager([])


class _Sub(torch.Tensor):
    pass


def test_meta_and_subclass_tensors_are_not_plain():
    assert not plain_eager([torch.ones(2), torch.empty(2, device="meta")])
    assert not plain_eager([torch.nn.Parameter(torch.empty(2, device="meta"))])
    assert not plain_eager([torch.ones(2).as_subclass(_Sub)])


def test_dispatch_modes_are_not_plain():
    x = torch.ones(2)
    with FlopCounterMode(display=False):
        assert not plain_eager([x])
    with FakeTensorMode():
        assert not plain_eager([x])
    assert plain_eager([x])


def test_functorch_transforms_are_not_plain():
    seen = []

    def f(t):
        seen.append(plain_eager([t]))
        return t * 2

    torch.vmap(f)(torch.ones(3, 2))
    torch.func.grad(lambda t: f(t).sum())(torch.ones(2))
    assert seen == [False, False]


def test_torch_compile_is_not_plain():
    seen = []

    def f(t):
        seen.append(plain_eager([t]))
        return t + 1

    torch._dynamo.reset()
    torch.compile(f, backend="eager", fullgraph=False)(torch.ones(2))
    assert seen and not any(seen)


def test_eager_function_runs_impl_setup_and_backward():
    from ads_kernel_tools.dispatch import eager_function

    def impl(x, scale):
        return x * scale, x.sum()

    def setup(ctx, inputs, output):
        ctx.scale = inputs[1]

    def backward(ctx, dy, dsum):
        assert ctx.eager and dsum is None  # the unused output's gradient is not materialised
        return dy * ctx.scale, None

    fn = eager_function("_Scale", impl, setup, backward)
    x = torch.randn(3, requires_grad=True)
    y, _ = fn.apply(x, 2.0)
    (g,) = torch.autograd.grad(y, x, torch.ones(3))
    assert fn.__name__ == "_Scale" and torch.equal(g, torch.full((3,), 2.0))


def test_bind_op_args_names_positional_then_keywords_with_defaults():
    fields = ("q", "k", "max_q", "host_q")
    bound = bind_op_args(fields, (1, 2), {"host_q": 5, "out_val": 9})
    assert bound == {"q": 1, "k": 2, "max_q": None, "host_q": 5}
    assert bind_op_args(fields, (1,), {}, {"max_q": 7})["max_q"] == 7


def test_readable_host_reads_only_real_cpu_tensors():
    assert readable_host(torch.tensor([0, 3, 5])) == (0, 3, 5)
    assert readable_host(None) is None
    assert readable_host([0, 3]) is None
    assert readable_host(torch.empty(2, device="meta")) is None
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.tensor([0, 3]))
    assert readable_host(fake) is None
