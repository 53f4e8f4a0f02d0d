"""Gradients that round as eager's: grad rules computing eager's ``derivatives.yaml`` formula
(``FunctionsManual.cpp``) in its order of operations, so that the compiled gradients are bit-equal
to eager's, not a few ulps off (``benchmarks/op_fidelity.py`` finds those over PyTorch's op_db).

- ``var`` and ``var_mean`` (``var_backward``): ``(2 / (n - correction)) * grad * (x - mean)``, the
  scalar times the cotangent first.
- ``hypot``: ``grad * self / result`` and ``grad * other / result``.
- p = 0 norms (``torch.norm``, ``linalg.norm``, ``linalg.vector_norm``): ``norm_backward`` gives
  no gradient, and the input gets none (``torch.autograd.grad`` gives None, not zeros).
- ``sinc``: ``sinc_backward``, ``grad * ((x pi cos(x pi) - sin(x pi)) / (x x pi))``.
- ``logit``: aten's ``logit_backward``, ``grad / (x * (1 - x))`` masked outside its range.
- The special functions' prims: ``ndtri``, ``log_ndtr`` (``(grad * c) * exp(...)``), ``i1``, ``i1e``,
  ``modified_bessel_i1`` and ``bessel_j1`` (``i1_backward`` and friends: ``x`` replaced by eps where
  ``|x| <= eps``), ``bessel_y1`` and ``modified_bessel_k1`` (times ``x.reciprocal()``); ``entr``
  (``grad * (-(1 + x.log()))``), ``ldexp`` and ``mvlgamma`` (``mvlgamma_backward``: the digammas
  of ``x + arange(...)`` summed by one reduction).
"""

from __future__ import annotations

import pytest
import torch

import thunder_rs

DTYPES = [torch.float32, torch.float64]


def _run(program, inputs):
    # (copies with the inputs' strides: a stepped input stays stepped)
    args = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(t).requires_grad_() for t in inputs]
    out = program(*args)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(7)
    cotangents = [torch.randn(o.shape, dtype=torch.float64, generator=gen).to(o.dtype) for o in outs]
    return (*outs, *torch.autograd.grad(outs, args, cotangents))


def assert_bit_equal_to_eager(program, inputs) -> None:
    expected = _run(program, inputs)
    actual = _run(thunder_rs.jit(program), inputs)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.stride() == e.stride(), f"result {i}: strides {a.stride()}, eager {e.stride()}"
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True, msg=f"result {i} differs from eager")


def randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(dtype)


VARIANCES = {
    "var": lambda x: torch.var(x),
    "var dim": lambda x: torch.var(x, 1),
    "var keepdim correction 0": lambda x: torch.var(x, (0, 2), correction=0, keepdim=True),
    "var correction 2": lambda x: torch.var(x, -1, correction=2),
    "var_mean": lambda x: torch.var_mean(x, 1),
    "var_mean all": lambda x: torch.var_mean(x, unbiased=False),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(VARIANCES))
def test_variance_gradient_is_eagers(name, dtype):
    assert_bit_equal_to_eager(VARIANCES[name], [randn(3, 7, 5, dtype=dtype)])


# -- elementwise ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hypot_gradient_is_eagers(dtype):
    """``grad * self / result`` for each operand (one broadcast)."""
    assert_bit_equal_to_eager(torch.hypot, [randn(4, 5, dtype=dtype), randn(5, dtype=dtype, seed=1)])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sinc_gradient_is_eagers(dtype):
    x = torch.cat([randn(30, dtype=dtype) * 3, torch.tensor([0.0, 1.0, -2.0], dtype=dtype)])
    assert_bit_equal_to_eager(torch.sinc, [x])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("eps", [None, 0.1, 0.0])
def test_logit_gradient_is_eagers(eps, dtype):
    """aten's ``logit_backward``, on values inside and outside [0, 1] and at its ends."""
    x = torch.rand(20, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(dtype)
    x = torch.cat([x, torch.tensor([0.0, 1.0, -0.5, 1.5, 0.05, 0.95], dtype=dtype)])
    assert_bit_equal_to_eager(lambda x: torch.logit(x, eps), [x])


ZERO_NORMS = {
    "torch.norm": lambda x: torch.norm(x, 0),
    "torch.norm dim": lambda x: torch.norm(x, 0, dim=1),
    "linalg.norm": lambda x: torch.linalg.norm(x.flatten(), 0),
    "linalg.vector_norm": lambda x: torch.linalg.vector_norm(x, 0, dim=-1),
}


@pytest.mark.parametrize("name", list(ZERO_NORMS))
def test_p_0_norm_gives_no_gradient_as_eager(name):
    x = randn(4, 5, dtype=torch.float32).requires_grad_()
    program = ZERO_NORMS[name]
    for fn in (program, thunder_rs.jit(program)):
        out = fn(x)
        assert torch.equal(out, program(x))
        assert torch.autograd.grad(out.sum(), [x], allow_unused=True) == (None,), fn


def _special_values(dtype: torch.dtype, layout: str, domain) -> torch.Tensor:
    """Values around 0 (exact zeros, some below the dtype's eps), negative and large ones, mapped
    into the function's ``domain``, laid out as ``layout`` says: contiguous, every other element
    of a wider tensor, or empty."""
    if layout == "empty":
        return torch.empty(0, 3, dtype=dtype)
    x = torch.cat([randn(40, dtype=torch.float64) * 4, torch.tensor([0.0, -0.0, 1e-30, -1e-9, 1e-3, 30.0])])
    x = domain(x).to(dtype).reshape(2, 23)
    if layout == "stepped":
        wide = torch.zeros(2, 46, dtype=dtype)
        wide[:, ::2] = x
        x = wide[:, ::2]
    return x


def _everywhere(x):
    return x


#: each function and the domain its values are mapped into
SPECIAL = {
    "ndtri": (torch.special.ndtri, torch.sigmoid),
    "log_ndtr": (torch.special.log_ndtr, _everywhere),
    "i1": (torch.special.i1, _everywhere),
    "i1e": (torch.special.i1e, _everywhere),
    "modified_bessel_i1": (torch.special.modified_bessel_i1, _everywhere),
    "modified_bessel_k1": (torch.special.modified_bessel_k1, torch.abs),
    "bessel_j1": (torch.special.bessel_j1, _everywhere),
    "bessel_y1": (torch.special.bessel_y1, torch.abs),
    "entr": (torch.special.entr, _everywhere),
    "mvlgamma p=1": (lambda x: torch.mvlgamma(x, 1), lambda x: x.abs() + 0.5),
    "mvlgamma p=3": (lambda x: torch.mvlgamma(x, 3), lambda x: x.abs() + 1.5),
}
#: those eager has a bfloat16 kernel for
BF16_SPECIAL = ["i1", "i1e", "entr", "mvlgamma p=1", "mvlgamma p=3"]


@pytest.mark.parametrize("layout", ["contiguous", "stepped", "empty"])
@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(SPECIAL))
def test_special_function_gradient_is_eagers(name, dtype, layout):
    if dtype == torch.bfloat16 and name not in BF16_SPECIAL:
        pytest.skip("eager has no bfloat16 kernel")
    function, domain = SPECIAL[name]
    assert_bit_equal_to_eager(function, [_special_values(dtype, layout, domain)])


@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shapes", [((4, 5), (4, 5)), ((4, 1), (5,)), ((0, 5), (5,))], ids=str)
def test_ldexp_gradient_is_eagers(shapes, dtype):
    """``grad * pow(2.0, other)`` and ``grad * result * ln 2``, also broadcast and empty."""
    first, second = shapes
    assert_bit_equal_to_eager(torch.ldexp, [randn(*first, dtype=dtype), randn(*second, dtype=dtype, seed=1) * 3])


@pytest.mark.parametrize("shape", [(), (1,), (4, 5)], ids=str)
@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16], ids=str)
def test_logcumsumexp_gradient_is_eagers(dtype, shape):
    """``logcumsumexp_backward``: a 0-d input's gradient is the cotangent itself."""
    assert_bit_equal_to_eager(lambda x: torch.logcumsumexp(x, 0), [randn(*shape, dtype=dtype)])


# -- losses --------------------------------------------------------------------------------------


def _probabilities(*shape: int, dtype: torch.dtype, layout: str, seed: int = 0) -> torch.Tensor:
    """Values in (0, 1), contiguous or every other element of a wider tensor."""
    x = torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(dtype)
    if layout != "stepped":
        return x
    wide = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


LOSS_SHAPES = {"matrix": (5, 6), "257": (257,), "0-dim": (), "empty": (0, 3)}


@pytest.mark.parametrize("layout", ["contiguous", "stepped"])
@pytest.mark.parametrize("shape", list(LOSS_SHAPES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16], ids=str)
def test_binary_cross_entropy_gradients_are_eagers(dtype, reduction, shape, layout):
    """``binary_cross_entropy_backward`` and ``-logit(x) * g`` for the target, divided by the
    count for ``mean`` (257 elements: a count bfloat16 rounds)."""
    if layout == "stepped" and shape != "matrix":
        pytest.skip("stepped: a matrix")
    x = _probabilities(*LOSS_SHAPES[shape], dtype=dtype, layout=layout)
    t = _probabilities(*LOSS_SHAPES[shape], dtype=dtype, layout=layout, seed=1)
    assert_bit_equal_to_eager(lambda x, t: torch.nn.functional.binary_cross_entropy(x, t, reduction=reduction), [x, t])


@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16], ids=str)
def test_weighted_binary_cross_entropy_gradients_are_eagers(dtype):
    x, t = _probabilities(4, 6, dtype=dtype, layout=""), _probabilities(4, 6, dtype=dtype, layout="", seed=1)
    weight = _probabilities(6, dtype=dtype, layout="", seed=2)
    assert_bit_equal_to_eager(lambda x, t: torch.nn.functional.binary_cross_entropy(x, t, weight), [x, t])


@pytest.mark.parametrize("layout", ["contiguous", "stepped"])
@pytest.mark.parametrize("shape", list(LOSS_SHAPES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16], ids=str)
def test_soft_margin_loss_gradient_is_eagers(dtype, reduction, shape, layout):
    """``soft_margin_loss_backward``: ``target * z * -norm / (z + 1) * g`` with ``z = exp(-target *
    input)``, ``norm`` rounded to the dtype (``1 / 30`` in bfloat16)."""
    if layout == "stepped" and shape != "matrix":
        pytest.skip("stepped: a matrix")
    x = _probabilities(*LOSS_SHAPES[shape], dtype=dtype, layout=layout) * 4 - 2
    t = torch.where(_probabilities(*LOSS_SHAPES[shape], dtype=dtype, layout="", seed=1) > 0.5, 1.0, -1.0).to(dtype)

    def program(x):
        return torch.nn.functional.soft_margin_loss(x, t, reduction=reduction)

    assert_bit_equal_to_eager(program, [x])


# -- add-and-multiply products --------------------------------------------------------------------


def _stepped(t: torch.Tensor) -> torch.Tensor:
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


ADD_PRODUCTS = {
    "addmv": (torch.addmv, [(5,), (5, 7), (7,)]),
    "addmv broadcast": (torch.addmv, [(), (5, 7), (7,)]),
    "addmv empty": (torch.addmv, [(0,), (0, 7), (7,)]),
    "addr": (torch.addr, [(5, 7), (5,), (7,)]),
    "addr broadcast": (torch.addr, [(7,), (5,), (7,)]),
    "addr empty": (torch.addr, [(0, 7), (0,), (7,)]),
    "addbmm": (torch.addbmm, [(5, 6), (3, 5, 4), (3, 4, 6)]),
    "addbmm broadcast": (torch.addbmm, [(1, 6), (3, 5, 4), (3, 4, 6)]),
    "addbmm empty": (torch.addbmm, [(5, 6), (0, 5, 4), (0, 4, 6)]),
}


@pytest.mark.parametrize("layout", ["contiguous", "stepped"])
@pytest.mark.parametrize("scales", [(1, 1), (0.6, 0.2), (0, 0.5)], ids=str)
@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(ADD_PRODUCTS))
def test_add_product_gradients_are_eagers(name, dtype, scales, layout):
    """``maybe_multiply(product's gradient, alpha)``: the products scaled after, ``g * beta``."""
    fn, shapes = ADD_PRODUCTS[name]
    inputs = [randn(*shape, dtype=dtype, seed=i) for i, shape in enumerate(shapes)]
    if layout == "stepped":
        inputs = [_stepped(t) if t.ndim and t.numel() else t for t in inputs]
    beta, alpha = scales
    assert_bit_equal_to_eager(lambda *a: fn(*a, beta=beta, alpha=alpha), inputs)


# -- the op_db sweep (benchmarks/op_fidelity.py) over the ops fixed here -----------------------------

SWEPT = [
    "nn.functional.pdist",
    "nn.functional.pairwise_distance",
    "var",
    "var_mean",
    "hypot",
    "logit",
    "sinc",
    "norm",
    "special.ndtri",
    "special.log_ndtr",
    "special.i1",
    "special.i1e",
    "special.modified_bessel_i1",
    "special.bessel_j1",
    "special.bessel_y1",
    "special.entr",
    "ldexp",
    "mvlgamma.mvlgamma_p_3",
    "nn.functional.binary_cross_entropy",
    "nn.functional.soft_margin_loss",
    "addmv",
    "addr",
    "addbmm",
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", SWEPT)
def test_op_db_samples_are_bit_equal_to_eager(name, dtype):
    """The sweep's verdict on the op's first samples in PyTorch's op_db: forward and gradients bit-equal."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from op_fidelity import judge
    from torch.testing._internal.common_methods_invocations import op_db

    (op,) = [op for op in op_db if name == op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")]
    row = judge(op, dtype, 3)
    assert row["n"] and (row["fwd"], row["grad"]) == ("bit-equal", "bit-equal"), row
