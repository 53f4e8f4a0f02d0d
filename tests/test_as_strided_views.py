"""``as_strided`` of an argument, returned from a jitted program, against eager: eager's result is a
view of the argument with an ``AsStridedBackward0`` history, which the caller may write in place
(a view of a tensor that is not a leaf) and which shares memory with the argument, also where the
program writes the argument after taking the view.

What differed: a training call returned the view the compiled autograd Function made (history
``CompiledFunctionBackward``): writing it in place raised "Output 0 of CompiledFunction is a view and
is being modified inplace", which eager does not raise; and a view taken before the program wrote
the argument came back as a tensor of its own, not sharing the argument's memory."""

import pytest
import torch

import thunder_rs

LAYOUTS = {
    "its own layout": lambda x: x.as_strided(x.size(), x.stride()),
    "rows from an offset": lambda x: x.as_strided((2, 4), (4, 1), 4),
    "overlapping windows": lambda x: x.as_strided((3, 2), (1, 1)),
    "transposed": lambda x: x.as_strided((4, 3), (1, 4)),
}


def _seen_by_the_caller(fn, leaf: bool):
    """``fn``'s output as the caller sees it, an in-place write to it, and the argument's gradient."""
    x0 = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    x = x0 if leaf else x0 * 1
    out = fn(x)
    seen = [type(out.grad_fn).__name__, out.stride(), out._base is x, out.data_ptr() == x.data_ptr()]
    try:
        out.mul_(2)
        seen.append("written")
    except RuntimeError as e:
        seen.append(str(e))
    (out * torch.arange(out.numel()).view(out.shape)).sum().backward()
    return seen, x0.grad


@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "not a leaf"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_as_strided_of_an_argument_in_a_training_call_is_eagers_view(name, leaf):
    program = LAYOUTS[name]
    (expected, eager_grad), (got, grad) = (_seen_by_the_caller(fn, leaf) for fn in (program, thunder_rs.jit(program)))
    assert got == expected
    assert torch.equal(grad, eager_grad)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_as_strided_taken_before_the_argument_is_written_shares_its_memory_as_in_eager(requires_grad):
    def program(x):
        v = x.as_strided((2, 2), (1, 2))
        x.add_(1)
        return v

    sides = []
    for fn in (program, thunder_rs.jit(program)):
        x = torch.arange(12.0).view(3, 4).requires_grad_(requires_grad) * 1
        out = fn(x)
        sides.append((out.tolist(), out._base is x, out.data_ptr() == x.data_ptr(), type(out.grad_fn).__name__))
    assert sides[1] == sides[0]
