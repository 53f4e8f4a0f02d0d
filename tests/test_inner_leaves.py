"""Tensors made to require grad inside the program (``x.detach().requires_grad_()``,
``torch.ones(3, requires_grad=True)``, ``nn.Parameter(t)`` in a forward), against eager: the
outputs computed from such a leaf require grad and carry a backward, with or without inputs that
require grad, and the inputs get eager's gradients; a leaf the program returns or stores (whose
``.grad`` eager's backward fills) is refused, naming the construct and the line."""

import inspect

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def _line(fn, text: str) -> str:
    """``file:line`` of the line of ``fn`` that holds ``text``."""
    lines, start = inspect.getsourcelines(fn)
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"{inspect.getsourcefile(fn)}:{start + offset}"


def _detached_leaf(x, w):
    x2 = x.detach().requires_grad_()
    return (x2 @ w).sum(0)


def _factory_leaf(x, w):
    z = torch.ones(3, requires_grad=True)
    return (x * z) @ w


def _like_leaf(x, w):
    z = torch.full_like(x, 0.5, requires_grad=True)
    return (x * z) @ w


def _parameter_leaf(x, w):
    p = torch.nn.Parameter(x * 2)
    return (p @ w).tanh()


def _unread_input(x, w):
    x2 = x.detach().requires_grad_()
    return (x2 * 2).sum()


def _leaf_and_input(x, w):
    x2 = x.detach().requires_grad_()
    return (x2 * 2).sum(), w * 3


PROGRAMS = [_detached_leaf, _factory_leaf, _like_leaf, _parameter_leaf, _unread_input, _leaf_and_input]


def _args(wanted: str):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, generator=g), torch.randn(3, 4, generator=g)
    return x.requires_grad_("x" in wanted), w.requires_grad_("w" in wanted)


def _autograd_state(t) -> tuple:
    return t.requires_grad, t.grad_fn is not None, t.is_leaf


def _flat(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("wanted", ["", "w", "xw"])
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_outputs_computed_from_a_leaf_made_inside_require_grad_and_inputs_get_eagers_gradients(fn, wanted):
    jfn = thunder_rs.jit(fn)
    for _ in range(2):  # (the call traced, then the cached entry)
        args, twins = _args(wanted), _args(wanted)
        expected, actual = _flat(fn(*args)), _flat(jfn(*twins))
        for e, a in zip(expected, actual):
            torch.testing.assert_close(a, e)
            assert _autograd_state(a) == _autograd_state(e)
        sum(e.sum() for e in expected).backward()  # (eager fills the inner leaf's .grad, which no one sees)
        sum(a.sum() for a in actual).backward()
        for e, a in zip(args, twins):
            assert (a.grad is None) == (e.grad is None)
            if e.grad is not None:
                torch.testing.assert_close(a.grad, e.grad)


def test_a_leaf_made_under_no_grad_gives_outputs_that_do_not_require_grad():
    x, w = _args("")
    with torch.no_grad():
        expected, actual = _detached_leaf(x, w), thunder_rs.jit(_detached_leaf)(x, w)
    assert not expected.requires_grad and not actual.requires_grad
    torch.testing.assert_close(actual, expected)


def _grad_enabled_inside(x):
    x2 = x.detach().requires_grad_()
    with torch.enable_grad():
        return (x2 * x2).sum()


def test_a_leaf_used_under_enable_grad_inside_a_call_made_under_no_grad():
    x = torch.randn(3)
    with torch.no_grad():
        expected, actual = _grad_enabled_inside(x), thunder_rs.jit(_grad_enabled_inside)(x)
    assert expected.requires_grad and actual.requires_grad and actual.grad_fn is not None
    actual.backward()  # (eager's works: it fills the leaf's .grad)
    torch.testing.assert_close(actual.detach(), expected.detach())


def _returns_the_leaf(x):
    x2 = x.detach().requires_grad_()
    return x2, (x2 * x2).sum()


def _saliency(x, w):
    x2 = x.detach().requires_grad_()
    score = (x2 @ w).max()
    return score, x2


def _returns_a_factory_leaf(x):
    z = torch.zeros(3, requires_grad=True)
    return x * z, z


class _Keeps(torch.nn.Module):
    def forward(self, x):
        self.leaf = x.detach().requires_grad_()
        return self.leaf * 2


@pytest.mark.parametrize("wanted", [False, True])
@pytest.mark.parametrize(
    "fn, construct, text",
    [
        (_returns_the_leaf, "Tensor.requires_grad_", "x2 = x.detach()"),
        (_saliency, "Tensor.requires_grad_", "x2 = x.detach()"),
        (_returns_a_factory_leaf, "torch.zeros(requires_grad=True)", "z = torch.zeros"),
    ],
    ids=["returned", "saliency", "factory"],
)
def test_a_returned_leaf_made_inside_is_refused_naming_the_construct_and_line(fn, construct, text, wanted):
    # Eager returns a leaf whose .grad a backward fills; the compiled call's would be no leaf, or
    # require no grad, and a backward would leave its .grad empty.
    x = torch.randn(3, requires_grad=wanted)
    args = (x, torch.randn(3, 4)) if fn is _saliency else (x,)
    leaf = _flat(fn(*args))[-1 if fn is not _returns_the_leaf else 0]
    assert leaf.is_leaf and leaf.requires_grad
    with pytest.raises(ThunderNotImplementedError, match="returns a tensor it made a leaf") as e:
        thunder_rs.jit(fn)(*args)
    assert str(e.value).startswith(construct) and _line(fn, text) in str(e.value)


def test_a_leaf_stored_on_the_module_is_refused():
    with pytest.raises(ThunderNotImplementedError, match="stores a tensor it made a leaf") as e:
        thunder_rs.jit(_Keeps())(torch.randn(3))
    assert _line(_Keeps.forward, "self.leaf =") in str(e.value)


def _tensor_leaf(x):
    return x * torch.tensor([1.0, 2.0, 3.0], requires_grad=True)


def test_a_tensor_of_data_made_a_leaf_is_refused_naming_the_line():
    with pytest.raises(ThunderNotImplementedError, match="requires_grad=True") as e:
        thunder_rs.jit(_tensor_leaf)(torch.randn(3, requires_grad=True))
    assert _line(_tensor_leaf, "torch.tensor") in str(e.value)


def _written_leaf(x):
    x2 = x.detach().requires_grad_()
    with torch.no_grad():
        x2.mul_(2)  # (still that leaf in eager)
    return x2


def _leaf_no_more(x):
    x2 = x.detach().requires_grad_()
    x2.requires_grad_(False)
    return x2, x2 * 2


def test_a_leaf_written_in_place_under_no_grad_and_returned_is_refused():
    assert _written_leaf(torch.randn(3)).is_leaf
    with pytest.raises(ThunderNotImplementedError, match="returns a tensor it made a leaf") as e:
        thunder_rs.jit(_written_leaf)(torch.randn(3))
    assert _line(_written_leaf, "x2 = x.detach()") in str(e.value)


def test_a_leaf_that_stops_requiring_grad_is_returned_as_eager_returns_it():
    x = torch.randn(3)
    expected, actual = _leaf_no_more(x), thunder_rs.jit(_leaf_no_more)(x)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e)
        assert _autograd_state(a) == _autograd_state(e)


def leaf_flags(x, w):
    x2 = x.detach().requires_grad_()
    p = torch.nn.Parameter(x.detach() * 1)
    flags = (x2.is_leaf, x2.grad_fn is None, p.is_leaf, p.grad_fn is None, (x2 * 2).is_leaf)
    return (x2 * w).sum() + (p * w).sum(), flags


def test_a_leaf_made_inside_answers_is_leaf_and_grad_fn_as_eager():
    # (were False and a refused grad_fn read: nn.Linear built in a forward failed registering its weight)
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    out, flags = thunder_rs.jit(leaf_flags)(x, w)
    expected, eager_flags = leaf_flags(x, w)
    assert flags == eager_flags == (True, True, True, True, False)
    torch.testing.assert_close(out, expected)
    assert torch.equal(*(torch.autograd.grad(o, w)[0] for o in (out, expected)))
