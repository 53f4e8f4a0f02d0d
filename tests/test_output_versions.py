"""The tensors a compiled call returns come back at eager's ``_version`` (and their ``_base`` at
its): buffer reuse (``passes::reuse``) never writes a result into memory the call returns, where
eager's out-of-place calls return new tensors at version 0 (``x.exp().sin()`` came back at 1,
``.cos()`` after it at 2; a backward's gradient reached ``.grad`` at its count of writes)."""

import pytest
import torch

import thunder_rs


def _unary_chain(x, y):
    return x.exp().sin()


def _longer_chain(x, y):
    return (x * y).exp().sin().cos().tanh()


def _reduction_after_pointwise(x, y):
    return ((x * 2).exp().sum(0) + 1).sin()


def _multi_output(x, y):
    return (x.exp().sin(), (x + y).cos().neg(), x.sum())


def _returned_intermediate_and_later_result(x, y):
    b = (x * y).sin()
    return b, b.cos().tanh()


def _view_of_chain(x, y):
    return (x + y).exp().sin().t()


def _views_of_one_buffer(x, y):
    z = (x - y).exp().neg()
    return z[1:], z.view(-1)


PROGRAMS = [
    _unary_chain,
    _longer_chain,
    _reduction_after_pointwise,
    _multi_output,
    _returned_intermediate_and_later_result,
    _view_of_chain,
    _views_of_one_buffer,
]


def _flat(out):
    return out if isinstance(out, tuple) else (out,)


def assert_like_eager(actual, expected):
    """Values, dtypes, strides and versions (of each tensor and its ``_base``) as eager's."""
    actual, expected = _flat(actual), _flat(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape and a.stride() == e.stride()
        torch.testing.assert_close(a, e)
        assert a.is_inference() == e.is_inference()
        if e.is_inference():  # (no version counter)
            continue
        assert a._version == e._version
        assert (a._base is None) == (e._base is None)
        if e._base is not None:
            assert a._base._version == e._base._version


def _inputs(requires_grad=False):
    torch.manual_seed(0)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    return x.requires_grad_(requires_grad), y


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__.lstrip("_"))
@pytest.mark.parametrize("mode", ["plain", "no_grad", "inference_mode"])
def test_returned_tensors_are_at_eagers_versions(fn, mode):
    x, y = _inputs()
    jfn = thunder_rs.jit(fn)
    context = {"plain": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    for _ in range(2):  # (the second call runs the cached program)
        with context():
            expected, actual = fn(x, y), jfn(x, y)
        assert_like_eager(actual, expected)


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__.lstrip("_"))
def test_outputs_and_gradients_under_grad_are_at_eagers_versions(fn):
    """The forward's outputs, and the gradient the backward returns into ``x.grad``."""
    jfn = thunder_rs.jit(fn)
    grads = []
    for run in (fn, jfn):
        x, y = _inputs(requires_grad=True)
        out = run(x, y)
        sum(o.float().sum() for o in _flat(out) if o.requires_grad).backward()
        grads.append((out, x.grad))
    (expected, expected_grad), (actual, actual_grad) = grads
    assert_like_eager(tuple(o.detach() for o in _flat(actual)), tuple(o.detach() for o in _flat(expected)))
    assert [o._version for o in _flat(actual)] == [o._version for o in _flat(expected)]
    if fn is _multi_output:  # (x reaches three outputs: eager's autograd adds their gradients in place)
        torch.testing.assert_close(actual_grad, expected_grad)
    else:
        assert_like_eager(actual_grad, expected_grad)


@pytest.mark.parametrize("fn", [_longer_chain, _multi_output, _view_of_chain], ids=lambda f: f.__name__.lstrip("_"))
def test_symbolic_sizes_return_eagers_versions(fn):
    jfn = thunder_rs.jit(fn, dynamic=True)
    for n in (3, 5):
        x, y = torch.randn(n, 4), torch.randn(n, 4)
        assert_like_eager(jfn(x, y), fn(x, y))


def test_the_program_own_writes_of_a_returned_chain_count_as_eagers():
    """A returned result the program writes in place: eager's count (two), not the trace's."""

    def fn(x):
        z = x.exp().sin()
        z.mul_(2)
        z.add_(1)
        return z

    x = torch.randn(5)
    assert_like_eager(thunder_rs.jit(fn)(x), fn(x))


@pytest.mark.slow
@pytest.mark.parametrize("fn", [_longer_chain, _multi_output], ids=lambda f: f.__name__.lstrip("_"))
def test_the_inductor_executor_returns_eagers_versions(fn):
    jfn = thunder_rs.jit(fn, executors=["inductor"])
    x, y = _inputs()
    assert_like_eager(jfn(x, y), fn(x, y))
