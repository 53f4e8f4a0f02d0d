"""Output strides as eager's: an in-place write keeps the layout of the tensor it writes
(channels_last, transposed), ``fill`` keeps its input's, and the ``*_copy`` ops return new
contiguous tensors. Values and gradients are compared too. ``tests/layout_sweep.py`` is the sweep
these cases came from."""

import copy

import pytest
import torch

import thunder_rs
from thunder_rs.executors.torch_ex import decomposing


def channels_last() -> torch.Tensor:
    return torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)


def transposed() -> torch.Tensor:
    return torch.randn(5, 4).t()


def permuted() -> torch.Tensor:
    return torch.randn(5, 4, 3).permute(2, 1, 0)


LAYOUTS = [
    pytest.param(channels_last, id="channels_last"),
    pytest.param(transposed, id="transposed"),
    pytest.param(permuted, id="permuted"),
]

#: In-place writes over the whole of a tensor the program computed from its input.
WRITES = {
    "empty_like.fill_": lambda x: torch.empty_like(x).fill_(1.0),
    "zeros_like.fill_": lambda x: torch.zeros_like(x).fill_(1.0),
    "clone.fill_": lambda x: x.clone().fill_(2.0),
    "mul.fill_": lambda x: (x * 2).fill_(2.0),
    "exp.fill_ 0-dim tensor": lambda x: x.exp().fill_(torch.tensor(3.0)),
    "mul.fill_ int 0-dim tensor": lambda x: (x * 2).fill_(torch.tensor(3)),
    "mul.zero_": lambda x: (x * 2).zero_(),
    "empty in x's layout.fill_": lambda x: torch.empty_strided(x.shape, x.stride()).fill_(1.0),
    "empty_like.zero_.add_": lambda x: torch.empty_like(x).zero_().add_(x),
    "empty_like.copy_ 0-dim": lambda x: torch.empty_like(x).copy_(torch.tensor(4.0)),
}


def assert_like_eager(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.stride() == expected.stride(), f"strides {actual.stride()}, eager {expected.stride()}"
    torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("make", LAYOUTS)
@pytest.mark.parametrize("name", list(WRITES))
def test_an_in_place_write_keeps_the_layout_of_what_it_writes(name, make):
    program = WRITES[name]
    x = make()
    assert_like_eager(thunder_rs.jit(program)(x), program(x))


@pytest.mark.parametrize("make", LAYOUTS)
@pytest.mark.parametrize("name", ["clone.fill_", "mul.zero_", "mul.fill_ int 0-dim tensor"])
def test_an_in_place_write_keeps_the_layout_with_gradients(name, make):
    program = WRITES[name]
    x = make().requires_grad_()
    expected = program(x)
    actual = thunder_rs.jit(program)(x)
    assert_like_eager(actual.detach(), expected.detach())
    cotangent = torch.randn_like(expected)
    (eager_grad,) = torch.autograd.grad(expected, x, cotangent)
    (grad,) = torch.autograd.grad(actual, x, cotangent)
    torch.testing.assert_close(grad, eager_grad)
    assert grad.stride() == eager_grad.stride()  # eager's zero gradient of an overwritten tensor: zeros_like(grad)


def test_a_filled_tensor_with_a_gradient_keeps_its_layout():
    x = channels_last().requires_grad_()
    value = torch.tensor(2.0, requires_grad=True)

    def program(x, value):
        return (x * 3).fill_(value)

    expected = program(x, value)
    actual = thunder_rs.jit(program)(x, value)
    assert_like_eager(actual.detach(), expected.detach())
    eager_grads = torch.autograd.grad(expected.sum(), (x, value))
    grads = torch.autograd.grad(actual.sum(), (x, value))
    for grad, eager_grad in zip(grads, eager_grads, strict=True):
        assert_like_eager(grad, eager_grad)


def test_a_fill_of_a_factory_tensor_is_one_full_tensor():
    """Eager's ``torch.zeros(n)`` is contiguous, so the fill needs nothing of it: the trace keeps
    one ``full``, not the zeros and a fill of them."""
    jfn = thunder_rs.jit(lambda x: x + torch.zeros(4, 5).fill_(2.0) + x.new_ones(4, 5).zero_())
    x = transposed()
    torch.testing.assert_close(jfn(x), x + 2.0)
    names = thunder_rs.last_traces(jfn)[-1].symbol_names()
    assert not any("fill" in name for name in names), names


@pytest.mark.parametrize("program", [lambda x, row: torch.empty_like(x).copy_(row), lambda x, row: (x * 2).copy_(row)])
def test_a_broadcast_copy_is_a_tensor_of_its_own(program):
    """``empty_like(x).copy_(row)`` is dense, as in eager: the caller may write to it."""
    x, row = torch.randn(4, 5), torch.randn(5)
    out = thunder_rs.jit(program)(x, row)
    assert_like_eager(out, program(x, row))
    out.add_(1.0)
    torch.testing.assert_close(out, (row + 1).expand(4, 5))


@pytest.mark.parametrize("make", LAYOUTS)
@pytest.mark.parametrize("value", [2.0, torch.tensor(3.0), torch.tensor(3)], ids=["number", "float", "int"])
def test_fill_decomposed_keeps_the_layout_of_its_input(make, value):
    x = make()
    with decomposing():
        actual = thunder_rs.jit(lambda x: torch.fill(x, value))(x)
    assert_like_eager(actual, torch.fill(x, value))


@pytest.mark.parametrize("make", [*LAYOUTS, pytest.param(lambda: torch.randn(3, 4), id="contiguous")])
def test_unsqueeze_copy_returns_a_new_contiguous_tensor(make):
    """Its decomposition is a reshape, which the torch executor would run as a view of the input."""
    x = make()
    before = x.clone()
    actual = thunder_rs.jit(lambda x: torch.unsqueeze_copy(x, 1))(x)
    assert_like_eager(actual, torch.unsqueeze_copy(x, 1))
    actual.add_(1.0)
    assert torch.equal(x, before), "the copy shares memory with the input"


@pytest.mark.parametrize("make", LAYOUTS)
def test_an_input_a_copy_writes_is_returned_as_itself(make):
    """``x.copy_(y); return x`` returns the caller's ``x`` (its layout), not a copy of ``y``."""

    def program(x, y):
        x.copy_(y)
        return x, y

    x, y = make(), make().contiguous()
    expected_x = y.clone()
    out_x, out_y = thunder_rs.jit(program)(x, y)
    assert out_x is x
    assert out_y is y
    torch.testing.assert_close(x, expected_x)


COPIES_INTO_NEW = {
    "zeros.copy_ of a view": lambda x: torch.zeros(x.mT.shape).copy_(x.mT),
    "empty_like.copy_ of a view": lambda x: torch.empty_like(x.mT).copy_(x.mT),
    "mul.copy_ of a view": lambda x: (x.mT * 1).copy_(x.mT),
    "zeros.copy_ of the input": lambda x: torch.zeros(x.shape).copy_(x),
    "zeros.copy_ of the input, then used": lambda x: torch.zeros(x.shape).copy_(x) + 1,
}


@pytest.mark.parametrize("make", [*LAYOUTS, pytest.param(lambda: torch.randn(4, 5), id="contiguous")])
@pytest.mark.parametrize("name", list(COPIES_INTO_NEW))
def test_a_copy_into_a_new_tensor_has_memory_of_its_own(name, make):
    """A copy of a view or an input, into a tensor the program made, shares no memory with them
    and has eager's layout: contiguous for a factory's tensor, the view's for ``empty_like``'s."""
    program = COPIES_INTO_NEW[name]
    x = make()
    before = x.clone()
    actual = thunder_rs.jit(program)(x)
    assert_like_eager(actual, program(x))
    actual.add_(1.0)
    assert torch.equal(x, before), "the copy shares memory with the input"


#: Permutes that move only size-1 dims: the same elements in the same order as a reshape, but
#: eager's strides for those dims are the permuted ones.
SIZE_ONE_PERMUTES = {
    "to channels_last at 1x1": (lambda x: x.permute(0, 3, 1, 2), (2, 1, 1, 8)),
    "a leading size-1 dim": (lambda x: x.permute(1, 0, 2), (1, 3, 4)),
    "then squeezed": (lambda x: x.permute(0, 3, 1, 2).squeeze(2), (2, 1, 1, 8)),
    "then reshaped keeping a size-1 dim": (lambda x: x.permute(0, 3, 1, 2).reshape(2, 8, 1), (2, 1, 1, 8)),
    "then flattened": (lambda x: x.permute(0, 3, 1, 2).flatten(1), (2, 1, 1, 8)),
    "then scaled": (lambda x: x.permute(0, 3, 1, 2) * torch.ones(8, 1, 1), (2, 1, 1, 8)),
}


@pytest.mark.parametrize("name", list(SIZE_ONE_PERMUTES))
def test_a_permute_of_size_one_dims_strides_as_eagers(name):
    """ConvNeXt's ``permute(0, 3, 1, 2)`` back from channels-last at a 1x1 image gave row-major
    strides (8, 1, 1, 1) where eager's are (8, 1, 8, 8), channels_last to ATen: the depthwise
    convolution after it then returned row-major weight gradients where eager's are channels_last."""
    program, shape = SIZE_ONE_PERMUTES[name]
    x = torch.randn(shape)
    out, expected = thunder_rs.jit(program)(x), program(x)
    torch.testing.assert_close(out, expected)
    assert out.stride() == expected.stride()


def test_a_convolution_after_a_permute_of_size_one_dims_has_eagers_gradient_strides():
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
    eager = copy.deepcopy(conv)
    x = torch.randn(2, 1, 1, 8)
    thunder_rs.jit(lambda x: conv(x.permute(0, 3, 1, 2)))(x).square().sum().backward()
    eager(x.permute(0, 3, 1, 2)).square().sum().backward()
    torch.testing.assert_close(conv.weight.grad, eager.weight.grad)
    assert conv.weight.grad.stride() == eager.weight.grad.stride() == (9, 1, 3, 1)


@pytest.mark.parametrize(
    "write",
    [
        lambda t: t.fill_(1.5),
        lambda t: t.zero_(),
        lambda t: t.copy_(torch.arange(12.0).reshape(4, 3)),
        lambda t: t.mul_(0).add_(2),
    ],
)
def test_a_tensor_made_from_python_values_keeps_its_layout_when_written(write):
    # The call's copy of a tensor built without tensor arguments was an input to the writes,
    # which left its layout to a copy back: the written value was returned contiguous.
    def made(x):
        return write(torch.empty_strided((4, 3), (1, 4)).zero_()) + x

    x = torch.randn(4, 3)
    out, expected = thunder_rs.jit(made)(x), made(x)
    torch.testing.assert_close(out, expected)
    assert out.stride() == expected.stride() == (1, 4)
