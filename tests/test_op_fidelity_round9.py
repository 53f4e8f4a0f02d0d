"""Op fidelity, round 9: integer, bool, complex and float16 dtypes (``benchmarks/op_fidelity.py
--dtypes``): outputs, dtypes and gradients bit-equal to eager's (``torch.equal``).

- ``Tensor.sum_to_size(())``: eager's ``sum_to`` takes ``tensor.sum()`` for an empty size, so an
  integer or bool tensor sums to int64, and a 0-d tensor's result is a new tensor; the trace kept
  the dtype (bool, int32) and returned a 0-d input itself.
- ``F.cosine_embedding_loss`` of integer or bool inputs: eager sums the products as ``sum`` does
  (int64) and adds its epsilon as a float, so the loss is the default dtype; the trace refused
  ("prims.add: number b=1e-12 (float) ...").
- ``F.poisson_nll_loss`` of integer inputs: eager's ``exp``/``log`` promote them to the default
  dtype; the trace refused ("prims.exp: expected a floating-point ...").
- ``torch.addbmm`` of int8, uint8 and int32 batches: eager accumulates each product into the result
  in its dtype (wrapping); the trace summed the products with ``sum``'s int64 and refused to add
  them to the input ("expected input to have dtype torch.int64").
- ``torch.rsqrt``'s gradient in float16: eager's ``-0.5 * grad * result.pow(3)``, whose float16
  ``pow`` is one float32 ``powf`` rounded once; the prim's VJP multiplied ``y * y * y`` in float16
  (an ulp off in about a fifth of the elements).
- Factories of complex values (``torch.full(size, 1 + 2j)``, ``torch.linspace(0, 1j, 5)``,
  ``torch.logspace(..., dtype=torch.complex128)``): eager's op where the trace has no complex
  decomposition, as calls on complex tensors already were; they were refused (``prims.full:
  expected a number for fill_value, got PyConst(1)``). A random one (``torch.randn(...,
  dtype=torch.complex64)``) stays refused by name: its draws are not replayed.
- ``torch.fft.fft``/``rfft``/``ihfft`` of a real input zero-padded to ``n`` points: the input's
  gradient is laid out as eager's (``constant_pad_nd``'s backward, a new tensor); the pad prim's VJP
  gave a view of the cotangent.
- Shifts of a bool tensor (``bool_tensor << 1``, ``1 << bool_tensor``, ``bitwise_left_shift``):
  eager promotes the bool operand to the result's dtype (int64 with a number); the call's meta run
  refused it ("Expected input tensor to have an integral dtype. Got torch.bool").
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")

INTEGERS = [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool]


def _assert_eager(fn, *args):
    """``fn``'s result compiled is eager's: dtype, shape and values, bit for bit (NaN where eager's)."""
    expected = fn(*args)
    actual = thunder_rs.jit(fn)(*args)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def _values(dtype, shape, low, high, seed=0):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [*INTEGERS, torch.float32])
@pytest.mark.parametrize("shape", [(), (1,), (5,), (2, 3)])
def test_sum_to_an_empty_size_is_eager_s_sum(dtype, shape):
    x = _values(dtype, shape, 0, 100)
    _assert_eager(lambda x: x.sum_to_size(()), x)
    _assert_eager(lambda x: x.sum_to_size(torch.Size([])), x)


def test_sum_to_an_empty_size_of_a_0d_tensor_is_a_new_tensor():
    x = torch.tensor(1.5)
    out = thunder_rs.jit(lambda x: x.sum_to_size(()).add_(1))(x)
    assert torch.equal(x, torch.tensor(1.5)) and torch.equal(out, torch.tensor(2.5))


@pytest.mark.parametrize("dtype", INTEGERS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cosine_embedding_loss_of_integers_is_eager_s(dtype, reduction):
    high = 2 if dtype == torch.bool else 120  # (uint8's and int8's products wrap, as eager's do)
    a, b = _values(dtype, (5, 6), 0, high, 1), _values(dtype, (5, 6), 0, high, 2)
    target = torch.tensor([1, -1, 1, -1, 1])
    _assert_eager(lambda a, b, t: F.cosine_embedding_loss(a, b, t, margin=0.3, reduction=reduction), a, b, target)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
@pytest.mark.parametrize("log_input", [True, False])
@pytest.mark.parametrize("full", [True, False])
def test_poisson_nll_loss_of_integers_is_eager_s(dtype, log_input, full):
    x, target = _values(dtype, (7,), 0, 6, 3), _values(dtype, (7,), 0, 6, 4)
    for reduction in ("none", "mean"):
        fn = lambda x, t: F.poisson_nll_loss(x, t, log_input=log_input, full=full, reduction=reduction)  # noqa: E731
        _assert_eager(fn, x, target)
    _assert_eager(lambda x, t: F.poisson_nll_loss(x, t.float(), log_input=log_input, full=full), x, target)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
@pytest.mark.parametrize(("beta", "alpha"), [(1, 1), (3, 5), (0, 2)])
def test_addbmm_of_integers_accumulates_in_their_dtype(dtype, beta, alpha):
    low, high = (0, 255) if dtype == torch.uint8 else (-100, 100)
    x = _values(dtype, (4, 5), low, high, 5)
    b1, b2 = _values(dtype, (6, 4, 7), low, high, 6), _values(dtype, (6, 7, 5), low, high, 7)
    _assert_eager(lambda x, b1, b2: torch.addbmm(x, b1, b2, beta=beta, alpha=alpha), x, b1, b2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_rsqrt_gradient_is_eager_s(dtype):
    gen = torch.Generator().manual_seed(0)
    x0 = (torch.rand(2000, generator=gen) * 4 + 0.01).to(dtype)
    g = torch.randn(2000, generator=gen).to(dtype)
    grads = []
    for fn in (torch.rsqrt, thunder_rs.jit(lambda x: torch.rsqrt(x))):
        x = x0.clone().requires_grad_()
        grads.append(torch.autograd.grad(fn(x), x, g)[0])
    assert grads[1].dtype == grads[0].dtype and torch.equal(grads[1], grads[0])


_COMPLEX_FACTORIES = {
    "full": lambda: torch.full((3,), 1 + 2j),
    "full_complex128": lambda: torch.full((2, 2), 1 - 2j, dtype=torch.complex128),
    "full_real_value": lambda: torch.full((3,), 2.5, dtype=torch.complex64),
    "linspace": lambda: torch.linspace(0, 1j, 5),
    "linspace_dtype": lambda: torch.linspace(0, 3, 7, dtype=torch.complex64),
    "logspace": lambda: torch.logspace(0, 1 + 1j, 4),
    "logspace_dtype": lambda: torch.logspace(0, 2, 4, dtype=torch.complex128),
}


@pytest.mark.parametrize("name", sorted(_COMPLEX_FACTORIES))
def test_complex_factories_are_eager_s(name):
    """A factory of complex values (a complex fill or bound, or a complex dtype) runs as eager's
    where the trace has no complex decomposition; it was refused (``prims.full: expected a number
    for fill_value, got PyConst(1)``, ``ltorch.linspace: not supported for dtype torch.complex64``)."""
    fn = _COMPLEX_FACTORIES[name]
    _assert_eager(lambda x: fn() + x, torch.zeros((), dtype=torch.complex64))


def test_a_random_complex_factory_is_refused_by_name():
    with pytest.raises(NotImplementedError, match=r"ltorch\.randn: expected a floating dtype, got torch\.complex64"):
        thunder_rs.jit(lambda: torch.randn(3, dtype=torch.complex64))()


_PADDED_TRANSFORMS = {
    "fft": lambda x: torch.fft.fft(x, n=10, dim=1, norm="ortho"),
    "rfft": lambda x: torch.fft.rfft(x, n=9, dim=0),
    "ihfft": lambda x: torch.fft.ihfft(x, n=11, dim=1),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(_PADDED_TRANSFORMS))
def test_a_padded_real_transform_s_gradient_is_laid_out_as_eager_s(name, dtype):
    """A real input zero-padded to ``n`` points: eager pads with ``constant_pad_nd``, whose
    backward is a new tensor laid out as the cotangent; the pad prim's VJP cropped the cotangent
    as a view of it (strides ``(140, 2, 20)`` for eager's ``(42, 1, 6)``)."""
    fn = _PADDED_TRANSFORMS[name]
    x0 = torch.randn(5, 6, 7, generator=torch.Generator().manual_seed(0), dtype=dtype)
    results = []
    for f in (fn, thunder_rs.jit(fn)):
        x = x0.clone().requires_grad_()
        out = f(x)
        g = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(7))
        results.append((out.detach(), torch.autograd.grad(out, x, g)[0]))
    (out, grad), (expected_out, expected_grad) = results[1], results[0]
    assert torch.equal(out, expected_out) and out.stride() == expected_out.stride()
    assert torch.equal(grad, expected_grad) and grad.stride() == expected_grad.stride(), (
        grad.stride(),
        expected_grad.stride(),
    )


_BOOL_SHIFTS = {
    "lshift_number": lambda b, i: b << 1,
    "rshift_number": lambda b, i: b >> 1,
    "lshift_int_tensor": lambda b, i: b << i,
    "int_tensor_rshift_bool": lambda b, i: i >> b,
    "rlshift": lambda b, i: 1 << b,
    "bitwise_left_shift": lambda b, i: torch.bitwise_left_shift(b, 2),
    "bitwise_right_shift_method": lambda b, i: b.bitwise_right_shift(i),
}


@pytest.mark.parametrize("name", sorted(_BOOL_SHIFTS))
def test_a_shifted_bool_tensor_is_promoted_as_eager_s(name):
    """Eager shifts a bool operand promoted to the result's dtype (``bool_tensor << 1`` is int64);
    the call's meta run refused it ("Expected input tensor to have an integral dtype")."""
    _assert_eager(_BOOL_SHIFTS[name], torch.tensor([True, False, True]), torch.tensor([1, 2, 3], dtype=torch.int32))


def test_a_complex_factory_of_real_tensor_bounds_is_eager_s():
    """``torch.linspace``/``logspace`` of 0-d real tensors into a complex dtype: eager's op (was
    refused: ``ltorch.linspace: not supported for dtype torch.complex64``)."""
    start, end = torch.tensor(-2.0), torch.tensor(3.0)
    _assert_eager(lambda a, b: torch.linspace(a, b, 7, dtype=torch.complex64), start, end)
    _assert_eager(lambda a, b: torch.logspace(a, b, 5, dtype=torch.complex128), start, end)
