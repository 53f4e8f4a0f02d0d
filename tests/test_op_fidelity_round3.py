"""Op fidelity, round 3: compiled outputs and gradients bit-equal to eager's (``torch.equal``)
where eager's formula allows, for ops ``benchmarks/op_fidelity.py`` found a few ulps off.

- ``F.cosine_embedding_loss``: eager's kernel sums ``input1 * input2`` before the squares, so its
  autograd adds each input's three gradient terms as ``(square + square) + product``; the
  decomposition now traces the product first and its backward adds in that order.
- ``torch.var_mean``'s gradient in bfloat16 and float16: eager's ``var_backward`` centres the input
  on ``x.mean(dim)``, which ATen's CPU kernel sums and divides in float32 and rounds once; the VJP
  rounded the sum to the input's dtype before dividing.
- Complex elementwise math with gradients (``exp``/``log``/roots/trigonometric and hyperbolic
  functions and their inverses, ``sigmoid``, ``div``): traced instead of run as eager's op, each
  prim's VJP rule conjugated as torch's convention takes it (benchmarks/results/op_fidelity_stop63.md).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def _run(program: Callable, inputs: list[torch.Tensor], constants: int) -> list[torch.Tensor]:
    """The outputs of ``program`` and the gradients of its floating inputs but the last
    ``constants``, from a fixed cotangent."""
    wanted = len(inputs) - constants
    args = [t.detach().clone().requires_grad_(t.is_floating_point() and i < wanted) for i, t in enumerate(inputs)]
    out = program(*args)
    outs = list(out) if isinstance(out, tuple) else [out]
    if not any(o.requires_grad for o in outs):
        return [o.detach() for o in outs]
    gen = torch.Generator().manual_seed(7)
    cotangents = [torch.randn(o.shape, dtype=torch.float64, generator=gen).to(o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, [a for a in args if a.requires_grad], cotangents)
    return [o.detach() for o in outs] + list(grads)


def assert_bit_equal_to_eager(program: Callable, inputs: list[torch.Tensor], constants: int = 0) -> None:
    expected = _run(program, inputs, constants)
    actual = _run(thunder_rs.jit(program), inputs, constants)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == e.dtype and a.shape == e.shape, f"result {i}: {a.dtype} {a.shape}, eager {e.dtype} {e.shape}"
        assert torch.equal(a, e), f"result {i} differs from eager's by {(a.double() - e.double()).abs().max().item()}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cosine_embedding_loss(dtype, reduction):
    gen = torch.Generator().manual_seed(0)
    x1 = torch.randn(6, 9, generator=gen).to(dtype)
    x2 = torch.randn(6, 9, generator=gen).to(dtype)
    target = torch.tensor([1, -1, 1, -1, -1, 1]).to(dtype)

    def program(x1, x2, target):
        return F.cosine_embedding_loss(x1, x2, target, margin=-0.2, reduction=reduction)

    assert_bit_equal_to_eager(program, [x1, x2, target], constants=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cosine_embedding_loss_unbatched(dtype):
    gen = torch.Generator().manual_seed(1)
    x1, x2 = torch.randn(2, 11, generator=gen).to(dtype)
    assert_bit_equal_to_eager(
        lambda a, b, t: F.cosine_embedding_loss(a, b, t), [x1, x2, torch.tensor(1.0)], constants=1
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("dim", "correction", "keepdim"), [(1, 1, False), ((0, 2), 0, True), (None, 1, False)])
def test_var_mean_gradient(dtype, dim, correction, keepdim):
    x = torch.randn(5, 7, 6, generator=torch.Generator().manual_seed(2)).to(dtype)

    def program(x):
        return torch.var_mean(x, dim, correction=correction, keepdim=keepdim)

    assert_bit_equal_to_eager(program, [x])


# -- complex elementwise math with gradients, traced (round 3 of the op fidelity sweep) ------------

#: Holomorphic elementwise math of complex values with gradients: traced (each ran eager's op as a
#: fallback), values and gradients eager's bit for bit. Their prims' VJP rules hold for complex
#: values conjugated (``g * conj(f'(z))``, eager's formulas), ``acosh``'s and ``rsqrt``'s complex
#: forms as eager's (``(z + 1).rsqrt() * (z - 1).rsqrt()``, ``result.pow(3)``), ``sigmoid``'s as
#: its kernel's ``g * conj((1 - y) * y)``; and ``abs``, eager's ``grad * z.sgn()``.
HOLOMORPHIC = {
    **{name: getattr(torch, name) for name in ("exp", "exp2", "expm1", "log", "log1p", "log2", "log10")},
    **{name: getattr(torch, name) for name in ("sqrt", "rsqrt", "reciprocal", "square", "sigmoid")},
    **{name: getattr(torch, name) for name in ("sin", "cos", "tan", "tanh", "sinh", "cosh")},
    **{name: getattr(torch, name) for name in ("asin", "acos", "atan", "asinh", "acosh", "atanh")},
    "div": lambda z: torch.div(z, z.flip(0) + 1),
    "true_divide_method": lambda z: z.true_divide(z[:1]) + (2 / z),
    "chain": lambda z: torch.exp(z).sin() / torch.sqrt(z),
    # (not holomorphic: eager's ``grad * self.sgn()``, a real cotangent)
    "abs": torch.abs,
    "abs_times": lambda z: z.abs() * z,
}
COMPLEX = [torch.complex64, torch.complex128]


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("name", HOLOMORPHIC)
def test_complex_elementwise_math_with_gradients_is_traced_as_eager(name, dtype):
    torch.manual_seed(0)
    fn = HOLOMORPHIC[name]
    z = torch.randn(5, 7, dtype=dtype, requires_grad=True)
    assert thunder_rs.examine(fn, z).fallbacks == {}  # (traced, not eager's op)
    expected, actual = fn(z), thunder_rs.jit(fn)(z)
    assert torch.equal(actual, expected) and actual.stride() == expected.stride()
    cotangent = torch.randn(expected.shape, dtype=expected.dtype)
    (e,), (a,) = (torch.autograd.grad(out, z, cotangent) for out in (expected, actual))
    assert torch.equal(a, e) and a.stride() == e.stride()


def test_the_sigmoid_of_complex_values_is_complex_in_the_trace():
    """``torch.sigmoid`` of a complex tensor (no gradients): the symbol converted it to float32 in
    the trace's metadata, so that reading its imaginary part raised where eager runs."""
    z = torch.randn(6, dtype=torch.complex64)

    def fn(a):
        return torch.sigmoid(a).imag * 2

    assert torch.equal(thunder_rs.jit(fn)(z), fn(z))
