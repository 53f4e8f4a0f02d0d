"""Constructs real programs hit that thunder_rs refused, now run as eager runs them.

``p.data = value`` of other sizes or another dtype (``p.data = p.data.half()``, a pruned weight
``w.data = w.data[keep]``, a cache buffer given a new size) was refused. The call now gives the
caller's tensor the value's memory as eager does: same tensor object (an optimizer's reference
stays), its new dtype, sizes and strides, its version, a view taken before keeping the old
memory; the next call, seeing the new metadata, recompiles. An op after the assignment that
records a gradient into such a tensor (which the compiled call's autograd input, the tensor as it
was, cannot receive) is refused naming both lines; under ``no_grad`` it runs.

Attributes a jitted function sets on a module it captured (``model.count += 1``, ``model.last =
y.detach()``) were refused, or (set without a read) kept what tracing left; every call now sets
them as eager does."""

import inspect

import pytest
import torch
from torch import nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

from test_data_rebinding import COMPILERS, _eager, _line_of

pytestmark = pytest.mark.usefixtures("one_thread")


def _state(t: torch.Tensor) -> list:
    """What eager leaves of a tensor: values, dtype, sizes, strides, version, requires_grad."""
    return [t.detach().clone(), t.dtype, t.shape, t.stride(), t._version, t.requires_grad]


def _same(got, expected) -> None:
    assert type(got) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert (got.dtype, got.shape, got.stride()) == (expected.dtype, expected.shape, expected.stride())
        assert torch.equal(got, expected)
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            _same(a, b)
    else:
        assert got == expected


def toggle(p, x):
    """A parameter's dtype flipped by ``.data``, read after: each call sees what the last one left."""
    p.data = p.data.to(torch.float16 if p.dtype == torch.float32 else torch.float32)
    return x * 2, p.data.float().sum(), p.dtype == torch.float16, p.shape


def _toggled_dtype(compile_it, captured: bool) -> list:
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(3, 2))
    optimizer = torch.optim.SGD([p], lr=0.1)
    old = p.detach()
    run, seen = compile_it((lambda x: toggle(p, x)) if captured else toggle), []
    for i in range(4):
        seen += [list(run(torch.ones(2) * i) if captured else run(p, torch.ones(2) * i)), _state(p)]
    assert optimizer.param_groups[0]["params"][0] is p
    return seen + [_state(old)]


@COMPILERS
@pytest.mark.parametrize("captured", [False, True], ids=["argument", "captured"])
def test_data_of_another_dtype_rebinds_the_parameter_as_eager(compile_it, captured):
    # Refused: "the tensor's size, dtype or device would change".
    _same(_toggled_dtype(compile_it, captured), _toggled_dtype(_eager, captured))


class _Pruned(nn.Module):
    """A linear layer whose weight rows are pruned by ``.data`` in forward, used under no_grad."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)
        self.register_buffer("cache", torch.zeros(0, 4))

    def forward(self, x, keep):
        self.lin.weight.data = self.lin.weight.data[keep]
        self.lin.bias.data = self.lin.bias.data[keep]
        self.cache.data = torch.cat([self.cache.data, x])
        with torch.no_grad():
            pruned = self.lin(x)
        return pruned, self.cache.shape[0] * 1.0


def _pruning(compile_it) -> list:
    torch.manual_seed(0)
    model = _Pruned()
    weight, run, seen = model.lin.weight, compile_it(model), []
    for n in (5, 4, 4, 2):
        out = run(torch.randn(2, 4), torch.arange(n))
        seen += [list(out), _state(model.lin.weight), _state(model.lin.bias), _state(model.cache)]
    assert model.lin.weight is weight
    return seen


def test_data_of_other_sizes_prunes_a_jitted_module_as_eager():
    # Refused: "the tensor's size, dtype or device would change". (Under torch.compile Dynamo breaks
    # the graph at the assignment and reads the buffer's old size after it, with its eager backend too.)
    _same(_pruning(thunder_rs.jit), _pruning(_eager))


def _halved_then_trained(compile_it) -> list:
    """A half-precision copy set by ``.data`` on one parameter, another trained: grads as eager's."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    frozen = nn.Parameter(torch.randn(2))

    def step(model, frozen, x):
        frozen.data = frozen.data.half()
        with torch.no_grad():
            scale = frozen.float()
        return (model(x) * scale * frozen.detach().float()).sum()

    run, seen = compile_it(step), []
    for i in range(2):
        loss = run(model, frozen, torch.randn(4, 3))
        loss.backward()
        seen += [loss.detach(), model.weight.grad.clone(), model.bias.grad.clone(), _state(frozen)]
    assert frozen.grad is None
    return seen


@COMPILERS
def test_grads_of_a_program_that_changes_a_dtype_by_data_are_eagers(compile_it):
    _same(_halved_then_trained(compile_it), _halved_then_trained(_eager))


def grad_after(model, x):
    model.weight.data = model.weight.data[:2].clone()  # assigned
    return (x @ model.weight.t()).sum()  # used


def test_a_gradient_into_a_tensor_given_other_sizes_is_refused_naming_both_lines():
    # Silently dropped the gradient eager gives the pruned weight.
    model = nn.Linear(3, 3)
    weight = model.weight.detach().clone()
    assigned, used = _line_of(grad_after, "# assigned"), _line_of(grad_after, "# used")
    with pytest.raises(ThunderNotImplementedError, match=rf"at {used}: .*Tensor.data = value at {assigned} gave"):
        thunder_rs.jit(grad_after)(model, torch.randn(2, 3))
    assert torch.equal(model.weight.detach(), weight)


def test_a_write_to_a_module_only_a_helper_captured_says_what_to_do_instead():
    # Said "keep such state in a module attribute or a buffer", which it was.
    model = nn.Linear(4, 4)
    model.count = 0

    def bump():
        model.count += 1

    def step(x):
        bump()
        return x * 2

    line = f"{__file__}:{inspect.getsourcelines(bump)[1] + 1}"
    with pytest.raises(
        ThunderNotImplementedError, match=rf"Linear.count changed .*at {line}\).*jit the module itself.*as an argument"
    ):
        thunder_rs.jit(step)(torch.randn(2, 4))


def convert(model, x):
    """A module passed as an argument converted to half precision by ``.data``, used under no_grad."""
    for p in model.parameters():
        p.data = p.data.half()
    with torch.no_grad():
        return model(x.half()), model.weight.dtype


def _converted(compile_it) -> list:
    torch.manual_seed(0)
    model, seen = nn.Linear(3, 2), []
    params = list(model.parameters())
    run = compile_it(convert)
    for i in range(2):
        seen += [list(run(model, torch.randn(4, 3))), _state(model.weight), _state(model.bias)]
    assert list(model.parameters()) == params
    return seen


def test_data_of_another_dtype_converts_a_module_argument_as_eager():
    # Refused: "the tensor's size, dtype or device would change".
    _same(_converted(thunder_rs.jit), _converted(_eager))


def truncate(model, x):
    model.weight.data = model.weight.data[:2]  # assigned
    return x


def test_a_view_as_the_new_memory_is_refused_saying_to_clone_it():
    # Said "write the values in instead (tensor.copy_(value))", which cannot change the sizes.
    model = nn.Linear(3, 3)
    line = _line_of(truncate, "# assigned")
    with pytest.raises(ThunderNotImplementedError, match=rf"Tensor.data = value at {line}: .*view.*value.clone\(\)\)$"):
        thunder_rs.jit(truncate)(model, torch.randn(2, 3))


def give_and_return(p, q, x):
    p.data = p.data.half()
    q.data = x
    return p, q.shape


def _given(compile_it) -> list:
    torch.manual_seed(0)
    p, q, x = nn.Parameter(torch.randn(3)), torch.zeros(2), torch.randn(5)
    out, shape = compile_it(give_and_return)(p, q, x)
    shares = q.data_ptr() == x.data_ptr()
    x.add_(1)  # (reaches q, which holds x's memory)
    return [out is p, shape, shares, _state(p), _state(q)]


def test_a_tensor_given_another_inputs_memory_of_other_sizes_shares_it_as_eager():
    # Refused: "the tensor's size, dtype or device would change".
    _same(_given(thunder_rs.jit), _given(_eager))


def _captured_counter(compile_it) -> list:
    """A training step over a module it captured (not jitted, not an argument) that counts its
    calls, keeps the last output and the batch size on the module, and returns the loss."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    model.count = 0

    def step(x):
        y = model(x)
        model.count += 1
        model.last = y.detach()
        model.seen = x.shape[0]
        return y.pow(2).sum()

    run, seen = compile_it(step), []
    for n in (2, 3, 3, 5):
        loss = run(torch.randn(n, 4))
        loss.backward()
        seen += [loss.detach(), model.count, model.last, model.seen, model.weight.grad.clone()]
    return seen


@COMPILERS
def test_attributes_set_on_a_captured_module_are_set_by_every_call_as_eager(compile_it):
    # Refused ("changed Python state it read: Linear.count"), the stored tensor refused as an escape,
    # and model.seen, set without a read, held the trace's size stand-in after the second call.
    _same(_captured_counter(compile_it), _captured_counter(_eager))


def test_a_refused_call_leaves_no_stand_in_on_a_captured_module():
    # Left the trace's TensorProxy in model.last after the refusal.
    model = nn.Linear(4, 4)

    def step(x):
        y = model(x)
        model.last = y.detach()
        return y, model.weight.grad  # (refused: a compiled call cannot read gradients)

    with pytest.raises(ThunderNotImplementedError, match="Tensor.grad"):
        thunder_rs.jit(step)(torch.randn(2, 4))
    assert not hasattr(model, "last")
