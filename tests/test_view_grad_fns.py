"""Views a jitted program returns of its input or of an intermediate, compared with eager by what a
caller debugging autograd sees: the view's ``grad_fn`` (``x[:]`` a SliceBackward0, ``x.t()`` a
TBackward0, ``x.expand_as(x)`` an ExpandBackward0, ``aten.alias(x)`` an AliasBackward0), ``_base``,
``_is_view()``, strides, the gradient after a backward, and an in-place write through the view
afterwards (version counters, the base's CopySlices, the gradient through the write).

What differed: the call took such a view again by the shape prims the trace recorded (a reshape,
a permute, a broadcast), so every view's node was a ViewBackward0, PermuteBackward0 or
ExpandBackward0; it now takes it by the torch op the program called (``views.PrimStep.call``)."""

import pytest
import torch

import thunder_rs

#: name -> program returning a view of its (3, 4) argument
PROGRAMS = {
    "x[:]": lambda x: x[:],
    "x[1:]": lambda x: x[1:],
    "x[:, 1:3]": lambda x: x[:, 1:3],
    "x[1]": lambda x: x[1],
    "x[...]": lambda x: x[...],
    "x[None]": lambda x: x[None],
    "expand_as": lambda x: x.expand_as(x),
    "expand": lambda x: x.expand(2, 3, 4),
    "view of its shape": lambda x: x.view(x.shape),
    "view_as": lambda x: x.view_as(x),
    "reshape_as": lambda x: x.reshape_as(x),
    "aten.alias": lambda x: torch.ops.aten.alias(x),
    "t": lambda x: x.t(),
    "transpose": lambda x: x.transpose(0, 1),
    "mT": lambda x: x.mT,
    "T": lambda x: x.T,
    "swapaxes": lambda x: x.swapaxes(0, 1),
    "permute": lambda x: x.permute(1, 0),
    "unsqueeze": lambda x: x.unsqueeze(0),
    "unsqueeze, squeeze": lambda x: x.unsqueeze(0).squeeze(0),
    "narrow": lambda x: x.narrow(1, 1, 2),
    "narrow of all": lambda x: x.narrow(0, 0, 3),
    "select": lambda x: x.select(1, 2),
    "t of t": lambda x: x.t().t(),
    "slice of a transpose": lambda x: x.t()[1:],
    "of an intermediate, t": lambda x: (x * 2).t(),
    "of an intermediate, x[1:]": lambda x: (x * 2)[1:],
    "of an intermediate, unsqueeze": lambda x: (x + 1).unsqueeze(1),
}

#: a few for the slower cases
SOME = ["x[:]", "x[1]", "expand_as", "aten.alias", "t", "mT", "unsqueeze", "narrow", "of an intermediate, t"]


def _argument(kind: str) -> torch.Tensor:
    leaf = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64, requires_grad=True)
    return leaf if kind == "leaf" else leaf * 1


def _name(t) -> str:
    return type(t.grad_fn).__name__


def _facts(out, x) -> tuple:
    return (_name(out), out._base is x, out._is_view(), out.stride(), out.requires_grad, out.is_leaf)


@pytest.mark.parametrize("kind", ["leaf", "non-leaf"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_returned_view_has_eagers_grad_fn_and_base(name, kind):
    program = PROGRAMS[name]
    sides = []
    for fn in (program, thunder_rs.jit(program)):
        x = _argument(kind)
        sides.append(_facts(fn(x), x))
    assert sides[1] == sides[0]


def _backward(fn):
    """The leaf's gradient (and its strides) from a weighted loss of the view."""
    x = _argument("leaf")
    out = fn(x)
    weights = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * weights).sum().backward()
    return x.grad, x.grad.stride()


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_gradient_through_a_returned_view_is_eagers(name):
    program = PROGRAMS[name]
    (eager, eager_strides), (compiled, strides) = _backward(program), _backward(thunder_rs.jit(program))
    assert torch.equal(compiled, eager) and strides == eager_strides


def _written_through(fn, kind: str):
    """What a caller sees after writing the returned view in place: the error eager raises (a view
    of a leaf that requires grad), else the nodes, versions and values, and the leaf's gradient."""
    leaf = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64, requires_grad=True)
    x = leaf if kind == "leaf" else leaf * 1
    out = fn(x)
    before = (x._version, out._version)
    try:
        out.mul_(2)
    except RuntimeError as e:
        return str(e)
    facts = (_name(out), _name(x), before, x._version, out._version, out._base is x)
    x.sum().backward() if kind == "non-leaf" else out.sum().backward()
    return facts, out.detach(), leaf.grad


@pytest.mark.parametrize("kind", ["leaf", "non-leaf"])
@pytest.mark.parametrize("name", SOME + ["x[:, 1:3]", "x[None]", "view of its shape", "select"])
def test_writing_a_returned_view_in_place_is_eagers(name, kind):
    program = PROGRAMS[name]
    eager, compiled = _written_through(program, kind), _written_through(thunder_rs.jit(program), kind)
    if isinstance(eager, str):
        assert compiled == eager
        return
    assert compiled[0] == eager[0]
    assert torch.equal(compiled[1], eager[1]) and torch.equal(compiled[2], eager[2])


@pytest.mark.parametrize("name", SOME)
def test_a_view_returned_with_another_output_has_eagers_grad_fn(name):
    """The view returned beside an output the program computes (the compiled call's own node)."""
    view = PROGRAMS[name]

    def program(x):
        return x.sin(), view(x)

    sides = []
    for fn in (program, thunder_rs.jit(program)):
        x = _argument("non-leaf")
        a, b = fn(x)
        sides.append(_facts(b, x))
    assert sides[1] == sides[0]


def test_a_view_taken_again_uses_the_arguments_as_they_were_when_the_program_took_it():
    """The torch op takes the view again with the arguments the program gave it then: a list of
    dims the program changes afterwards is not read again."""

    def program(x):
        dims = [1, 0]
        y = x.permute(dims)
        dims.reverse()
        return y

    sides = []
    for fn in (program, thunder_rs.jit(program)):
        x = _argument("leaf")
        sides.append([_facts(fn(x), x) for _ in range(2)])
    assert sides[1] == sides[0]
