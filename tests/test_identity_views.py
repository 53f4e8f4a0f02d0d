"""Views that change nothing, returned from a jitted program, compared with eager: ``x.view(x.shape)``,
``x[:]``, ``x.expand(x.shape)``, ``aten.alias(x)``, ``x.t().t()`` and the like are new tensors in eager,
views whose ``_base`` is ``x`` (so ``requires_grad_()``, ``t_()`` or ``.data =`` on the result leave ``x``
as it is), while ``flatten(1, 1)``, ``atleast_2d`` of a matrix and ``contiguous()`` return ``x`` itself.

What differed: the trace computed such a view as its input, so the call returned the caller's tensor
itself (``out is x``), and under autograd with no history (``grad_fn`` None where eager's is a
ViewBackward); a view a program took under ``no_grad`` of a tensor that requires grad came back with a
history eager's has not."""

import contextlib

import pytest
import torch

import thunder_rs

#: name -> (program, argument shape)
PROGRAMS = {
    "alias": (lambda x: torch.ops.aten.alias(x), (3, 4)),
    "view": (lambda x: x.view(x.shape), (3, 4)),
    "view_as": (lambda x: x.view_as(x), (3, 4)),
    "reshape": (lambda x: x.reshape(x.shape), (3, 4)),
    "expand": (lambda x: x.expand(x.shape), (3, 4)),
    "slice": (lambda x: x[:], (3, 4)),
    "ellipsis": (lambda x: x[...], (3, 4)),
    "empty key": (lambda x: x[()], (3, 4)),
    "as_strided": (lambda x: x.as_strided(x.size(), x.stride()), (3, 4)),
    "permute": (lambda x: x.permute(0, 1), (3, 4)),
    "transpose of a dim with itself": (lambda x: x.transpose(1, 1), (3, 4)),
    "t of a vector": (lambda x: x.t(), (5,)),
    "squeeze of nothing": (lambda x: x.squeeze(), (3, 4)),
    "narrow of all": (lambda x: x.narrow(0, 0, 3), (3, 4)),
    "split into one": (lambda x: x.split(3)[0], (3, 4)),
    "chunk into one": (lambda x: x.chunk(1)[0], (3, 4)),
    "hsplit into one": (lambda x: x.hsplit(1)[0], (3, 4)),
    "unsafe_split into one": (lambda x: x.unsafe_split(3)[0], (3, 4)),
    "ravel of a vector": (lambda x: x.ravel(), (5,)),
    "movedim to itself": (lambda x: x.movedim(0, 0), (3, 4)),
    "t of t": (lambda x: x.t().t(), (3, 4)),
    "unsqueeze then squeeze": (lambda x: x.unsqueeze(0).squeeze(0), (3, 4)),
    "of a transposed argument": (lambda x: x.view(x.shape), "transposed"),
    # eager returns the tensor itself
    "flatten of a dim": (lambda x: x.flatten(1, 1), (3, 4)),
    "flatten of a vector": (lambda x: x.flatten(), (5,)),
    "atleast_2d of a matrix": (lambda x: torch.atleast_2d(x), (3, 4)),
    "atleast_3d of a cube": (lambda x: torch.atleast_3d(x), (2, 2, 2)),
    "contiguous": (lambda x: x.contiguous(), (3, 4)),
    "sum_to_size of its size": (lambda x: x.sum_to_size(x.shape), (3, 4)),
}

KINDS = ["no grad", "leaf", "non-leaf"]
MODES = {"grad": contextlib.nullcontext, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def _argument(shape, kind):
    base = torch.randn(4, 3).t() if shape == "transposed" else torch.randn(shape)
    if kind == "no grad":
        return base
    leaf = base.requires_grad_()
    return leaf * 1 if kind == "non-leaf" else leaf


def _facts(out, x) -> tuple:
    """What a caller sees of ``out``, a result computed from ``x``."""
    return (
        out is x,
        out._base is x,
        out.requires_grad,
        out.grad_fn is None,
        out.is_leaf,
        out.stride(),
        out.data_ptr() == x.data_ptr(),
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_returned_view_that_changes_nothing_is_a_new_tensor_as_in_eager(name, kind):
    program, shape = PROGRAMS[name]
    sides = []
    for fn in (program, thunder_rs.jit(program)):
        x = _argument(shape, kind)
        out = fn(x)
        sides.append(_facts(out, x))
    assert sides[1] == sides[0]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["alias", "view", "slice", "expand", "t of t", "flatten of a dim"])
def test_identity_views_under_no_grad_and_inference_mode_are_eagers(name, kind, mode):
    program, shape = PROGRAMS[name]
    sides = []
    for fn in (program, thunder_rs.jit(program)):
        x = _argument(shape, kind)
        with MODES[mode]():
            out = fn(x)
        sides.append((*_facts(out, x), out.is_inference()))
    assert sides[1] == sides[0]


def _changes_of_the_result(x, out) -> list:
    """``x``'s metadata after a caller changes ``out``'s (eager's ``out`` is a tensor of its own),
    or the error a change raises (eager's for a view of a leaf that requires grad)."""
    seen = []
    for change in (torch.Tensor.t_, torch.Tensor.requires_grad_, lambda t: setattr(t, "data", torch.zeros(2))):
        try:
            change(out)
        except RuntimeError as e:
            seen.append(str(e))
        seen.append((tuple(x.shape), x.stride(), x.requires_grad, tuple(out.shape)))
    return seen


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("name", ["view", "slice", "ellipsis", "reshape", "expand", "alias", "as_strided"])
def test_changing_the_results_metadata_leaves_the_argument_as_in_eager(name, requires_grad):
    program, shape = PROGRAMS[name]
    sides = []
    for fn in (program, thunder_rs.jit(program)):
        x = torch.randn(shape, requires_grad=requires_grad)
        out = fn(x)
        sides.append(_changes_of_the_result(x, out))
    assert sides[1] == sides[0]


def test_requires_grad_of_the_result_leaves_the_argument_as_in_eager():
    for fn in (PROGRAMS["view"][0], thunder_rs.jit(PROGRAMS["view"][0])):
        x = torch.randn(3, 4)
        fn(x).requires_grad_()
        assert not x.requires_grad


def test_the_gradient_through_an_identity_view_is_eagers():
    def program(x):
        return x.view(x.shape), x[:] * 2

    grads = []
    for fn in (program, thunder_rs.jit(program)):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
        a, b = fn(x)
        assert a.grad_fn is not None
        (a * 3 + b).sum().backward()
        grads.append(x.grad)
    assert torch.equal(grads[1], grads[0])


def _twice(x):
    v = x.view(x.shape)
    return v, v


def _under_no_grad(x):
    y = x * 2
    with torch.no_grad():
        return y, x.view(x.shape), x.t(), y.t()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("program", [_twice, _under_no_grad], ids=["twice", "under no_grad"])
def test_views_returned_twice_or_taken_under_no_grad_are_eagers(program, kind):
    sides = []
    for fn in (program, thunder_rs.jit(program)):
        x = _argument((3, 3), kind)
        outs = fn(x)
        sides.append([(*_facts(o, x), o is outs[0]) for o in outs])
    assert sides[1] == sides[0]


def test_a_write_through_an_identity_view_in_the_program_is_eagers():
    def program(x):
        v = x.view(x.shape)
        v.mul_(2)
        return v, x + 1

    sides = []
    for fn in (program, thunder_rs.jit(program)):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
        a, b = fn(x)
        sides.append((a, b, x.clone(), a._base is x))
    for got, expected in zip(*sides):
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(expected))


@pytest.mark.parametrize("kind", ["no grad", "non-leaf"])  # (eager refuses to write a leaf that requires grad)
@pytest.mark.parametrize("name", ["view", "slice", "t of t"])
def test_an_identity_view_of_an_argument_written_in_place_is_eagers(name, kind):
    view, shape = PROGRAMS[name]

    def program(x):
        x.add_(1)
        return view(x)

    sides = []
    for fn in (program, thunder_rs.jit(program)):
        x = _argument(shape, kind)
        out = fn(x)
        sides.append((*_facts(out, x), torch.equal(out, x)))
    assert sides[1] == sides[0]


@pytest.mark.parametrize("inside", [True, False], ids=["in inference_mode", "outside"])
@pytest.mark.parametrize("name", ["view", "slice", "t of t", "flatten of a dim"])
def test_an_identity_view_of_an_inference_tensor_is_eagers(name, inside):
    program, shape = PROGRAMS[name]
    sides = []
    for fn in (program, thunder_rs.jit(program)):
        with torch.inference_mode():
            x = torch.randn(shape)
        with torch.inference_mode() if inside else contextlib.nullcontext():
            out = fn(x)
        sides.append((*_facts(out, x), out.is_inference()))
    assert sides[1] == sides[0]
