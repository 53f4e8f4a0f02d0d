"""Op fidelity against eager over torch's OpInfo database, round 2 (``benchmarks/op_fidelity.py``
in its default, ``--dtypes`` and ``--errors`` modes; ``benchmarks/results/op_fidelity_stop62.md``).

- ``torch.narrow`` with a tensor start: eager's ``narrow.Tensor`` takes only a 0-dim integral one; a
  one-element ``tensor([1])`` was read as the int 1 and the call ran (eager raises), a 0-dim bool or
  float one failed inside the slice prim with a TypeError.
- ``torch.tensor_split`` with split points given as a tensor (a 0-dim one: a number of sections; a
  1-D one: indices): read as eager's overload reads them, each compiled call checking the values;
  they were refused as data-dependent.
- ``Tensor.__rdiv__`` called with a number for self raises eager's AttributeError (a ValueError).
- Shifts of two bools (``bool_tensor << bool_tensor``) raise eager's NotImplementedError (torch's
  meta kernel's RuntimeError).
- The complex gradient of ``torch.fft.fft``/``ifft`` (and the n-D forms) of an input zero-padded to
  ``n`` points is laid out as eager's (``constant_pad_nd``'s backward, a new tensor), as a real
  input's already was; it was a view of the cotangent (``pad``'s grad rule now puts complex
  gradients: a crop holds for them).
"""

from __future__ import annotations

import pytest
import torch

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")


def _raises_as_eager(fn, *args) -> BaseException:
    """Eager raises on ``fn(*args)``; the compiled call raises an exception of the same type."""
    with pytest.raises(Exception) as expected:
        fn(*args)
    with pytest.raises(type(expected.value)) as actual:
        thunder_rs.jit(fn)(*args)
    return actual.value


def _narrow(x, start):
    return torch.narrow(x, 0, start, 1)


@pytest.mark.parametrize(
    "start",
    [torch.tensor([1]), torch.tensor([True]), torch.tensor(True), torch.tensor(1.0), torch.tensor([[0]])],
    ids=["one_element", "bool_1d", "bool_0d", "float_0d", "2d"],
)
def test_narrow_takes_only_a_0_dim_integral_tensor_start(start):
    x = torch.randn(3, 4)
    error = _raises_as_eager(_narrow, x, start)
    assert "start must be an 0-dim integral Tensor" in str(error) and "test_op_fidelity_round2.py" in str(error)


@pytest.mark.parametrize("method", [False, True])
def test_narrow_with_a_0_dim_integer_start_is_eager_s(method):
    x = torch.randn(5, 3, requires_grad=True)

    def fn(x, s):
        return x.narrow(0, s, 2) if method else torch.narrow(x, 0, s, 2)

    for s in (torch.tensor(1), torch.tensor(3), torch.tensor(-4, dtype=torch.int32)):
        expected, actual = fn(x, s), thunder_rs.jit(fn)(x, s)
        assert torch.equal(actual, expected) and actual.stride() == expected.stride()


def _grads(out, x):
    cotangents = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)) for i, o in enumerate(out)]
    return torch.autograd.grad(out, x, cotangents)[0]


@pytest.mark.parametrize(
    "points",
    [[2, 4], [3], [], [4, 1, 7], [0, 0, 5], 3, 1, 7],
    ids=["indices", "one_index", "no_index", "unordered", "repeated", "sections", "one_section", "more_sections"],
)
@pytest.mark.parametrize("dim", [0, 1])
def test_tensor_split_with_a_tensor_of_split_points_is_eager_s(points, dim):
    x = torch.randn(5, 6, requires_grad=True)
    points_tensor = torch.tensor(points, dtype=torch.int64)

    def fn(x, p):
        return torch.tensor_split(x, p, dim)

    expected, actual = fn(x, points_tensor), thunder_rs.jit(fn)(x, points_tensor)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert torch.equal(a, e) and a.stride() == e.stride()
    assert torch.equal(_grads(actual, x), _grads(expected, x))


def test_tensor_split_reads_the_split_points_on_every_call():
    x = torch.arange(10.0)
    jf = thunder_rs.jit(lambda x, p: [t.sum() for t in x.tensor_split(tensor_indices_or_sections=p)])
    for points in ([1, 3], [2, 4], [2, 4], [5], 4):
        p = torch.tensor(points)
        expected = [t.sum() for t in x.tensor_split(tensor_indices_or_sections=p)]
        assert [t.item() for t in jf(x, p)] == [t.item() for t in expected]


@pytest.mark.parametrize(
    "points",
    [torch.tensor([2.0]), torch.tensor([2], dtype=torch.int32), torch.tensor([[1]]), torch.tensor(0)],
    ids=["float", "int32", "2d", "zero_sections"],
)
def test_tensor_split_with_bad_split_points_raises_as_eager(points):
    error = _raises_as_eager(lambda x, p: torch.tensor_split(x, p), torch.randn(4, 2), points)
    assert "tensor_split" in str(error)


@pytest.mark.parametrize("other", [torch.tensor([1.0, 2.0]), 3])
def test_rdiv_of_a_number_self_raises_eager_s_attribute_error(other):
    error = _raises_as_eager(lambda a, b: torch.Tensor.__rdiv__(a, b), 2, other)
    assert "'int' object has no attribute 'reciprocal'" in str(error)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a << b,
        lambda a, b: a >> b,
        lambda a, b: torch.bitwise_left_shift(a, b),
        lambda a, b: torch.bitwise_right_shift(a, True),
        lambda a, b: True << b,
    ],
    ids=["lshift", "rshift", "bitwise_left_shift", "with_a_bool", "rlshift"],
)
def test_shifts_of_two_bools_raise_eager_s_not_implemented_error(fn):
    a, b = torch.tensor([True, False]), torch.tensor([True, True])
    error = _raises_as_eager(fn, a, b)
    assert "not implemented for 'Bool'" in str(error)


def test_shifts_of_a_bool_and_an_integer_still_run_as_eager():
    a = torch.tensor([True, False])
    for fn in (lambda a: a << 1, lambda a: a.int() >> a, lambda a: a << a.to(torch.uint8)):
        expected, actual = fn(a), thunder_rs.jit(fn)(a)
        assert torch.equal(actual, expected) and actual.dtype == expected.dtype


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.fft.fft(x, n=10, dim=1, norm="ortho"),
        lambda x: torch.fft.ifft(x, n=9, dim=0),
        lambda x: torch.fft.fft(x.transpose(1, 2), n=8),
        lambda x: torch.fft.fft2(x, s=(7, 9)),
        lambda x: torch.fft.ifftn(x, s=(4, 8, 9)),
        lambda x: torch.fft.hfft2(x, s=(7, 9)),
    ],
    ids=["fft", "ifft", "fft_of_transposed", "fft2", "ifftn", "hfft2"],
)
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_complex_gradients_of_padded_transforms_are_laid_out_as_eager_s(fn, dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 6, 7, dtype=dtype, requires_grad=True)
    assert thunder_rs.examine(fn, x).fallbacks == {}  # (traced, not eager's op)
    expected, actual = fn(x), thunder_rs.jit(fn)(x)
    assert torch.equal(actual, expected) and actual.stride() == expected.stride()
    cotangent = torch.randn(expected.shape, dtype=expected.dtype)
    (e,), (a,) = (torch.autograd.grad(out, x, cotangent) for out in (expected, actual))
    assert torch.equal(a, e) and a.stride() == e.stride() and a.is_conj() == e.is_conj()
