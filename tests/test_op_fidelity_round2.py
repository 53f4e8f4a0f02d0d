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


_W = torch.randn(4, 6, dtype=torch.complex64)
_MASK = torch.rand(4, 6) > 0.5
#: Complex calls with gradients that move, copy, select, zero or sum elements: traced (no eager
#: fallback; they ran eager's op), values, strides and gradients eager's.
MOVING_OPS = {
    "cat": lambda z: torch.cat([z, _W, z[:1]]),
    "cat_legacy_empty": lambda z: torch.cat([z, torch.zeros(0, dtype=z.dtype, requires_grad=True)], 1),
    "stack": lambda z: torch.stack([z, z * 2], 1),
    "hstack_vstack": lambda z: torch.hstack([z, z]) + torch.vstack([z, z]).reshape(4, 12),
    "split": lambda z: torch.split(z, [1, 3])[1] * 2,
    "chunk": lambda z: z.chunk(3, 1)[2],
    "tensor_split": lambda z: torch.tensor_split(z, [1, 4], 1)[1],
    "unbind": lambda z: torch.unbind(z, 1)[3],
    "select_narrow": lambda z: z.select(1, 2) + z.narrow(1, 1, 1).squeeze(1),
    "t": lambda z: z.t(),
    "T_mT": lambda z: z.T + z.mT,
    "flip_roll": lambda z: torch.flip(z, [0]) + torch.roll(z, 2, 1),
    "rot90": lambda z: torch.rot90(z, 1, [0, 1]),
    "movedim": lambda z: torch.movedim(z.reshape(2, 2, 6), 0, 2),
    "tril_triu": lambda z: torch.tril(z, 1) + torch.triu(z, -1),
    "diagonal": lambda z: torch.diagonal(z, 1),
    "diag_trace": lambda z: torch.diag(z, 2) + torch.trace(z) + torch.linalg.diagonal(z),
    "block_diag": lambda z: torch.block_diag(z, z[:2, :3]),
    "where": lambda z: torch.where(_MASK, z, _W) + z.where(_MASK[0], _W[0]),
    "repeat_tile": lambda z: z.repeat(2, 1) + torch.tile(z, (2, 1)),
    "broadcast_to": lambda z: torch.broadcast_to(z[:1], (3, 6)),
    "sum": lambda z: z.sum(0) + z.sum_to_size(1, 6).squeeze(0),
    "clone": lambda z: torch.clone(z.t()),
    "pad": lambda z: torch.nn.functional.pad(z, (1, 2, 0, 1)),
    "unflatten_ravel": lambda z: torch.unflatten(z, 1, (2, 3)).ravel(),
    "pixel_shuffle": lambda z: torch.pixel_shuffle(z.reshape(1, 4, 3, 2), 2),
    "fftshift": lambda z: torch.fft.fftshift(z) + torch.fft.ifftshift(z, 1),
}


@pytest.mark.parametrize("name", MOVING_OPS)
def test_complex_calls_with_gradients_that_move_elements_are_traced_as_eager(name):
    torch.manual_seed(0)
    fn = MOVING_OPS[name]
    z = torch.randn(4, 6, dtype=torch.complex64, requires_grad=True)
    assert thunder_rs.examine(fn, z).fallbacks == {}
    expected, actual = fn(z), thunder_rs.jit(fn)(z)
    assert torch.equal(actual, expected) and actual.stride() == expected.stride()
    cotangent = torch.randn(expected.shape, dtype=expected.dtype)
    (e,), (a,) = (torch.autograd.grad(out, z, cotangent) for out in (expected, actual))
    assert torch.equal(a, e) and a.stride() == e.stride()


def test_a_legacy_empty_complex_operand_of_cat_gets_eager_s_empty_gradient():
    z = torch.randn(3, dtype=torch.complex128, requires_grad=True)
    empty = torch.zeros(0, dtype=torch.complex128, requires_grad=True)

    def fn(a, b):
        return torch.cat([a, b])

    expected, actual = fn(z, empty), thunder_rs.jit(fn)(z, empty)
    cotangent = torch.randn(3, dtype=torch.complex128)
    grads = [torch.autograd.grad(out, (z, empty), cotangent) for out in (expected, actual)]
    assert all(torch.equal(a, e) for a, e in zip(grads[1], grads[0]))


def test_non_constant_complex_padding_with_gradients_still_runs_eager_s_op():
    z = torch.randn(1, 3, 5, dtype=torch.complex64, requires_grad=True)

    def fn(a):
        return torch.nn.functional.pad(a, (2, 1), mode="reflect")

    assert thunder_rs.examine(fn, z).fallbacks == {"torch.nn.functional.pad": 1}
    expected, actual = fn(z), thunder_rs.jit(fn)(z)
    cotangent = torch.randn(expected.shape, dtype=expected.dtype)
    (e,), (a,) = (torch.autograd.grad(out, z, cotangent) for out in (expected, actual))
    assert torch.equal(actual, expected) and torch.equal(a, e)
