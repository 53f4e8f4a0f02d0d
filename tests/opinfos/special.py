"""Elementwise math beyond the prims: fused arithmetic, log-space sums, floating-point predicates,
logical ops, torch.special functions, and metadata predicates answered in Python."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from functools import partial

import torch

from .core import ALL, FLOATS, NUMERIC, ErrorInput, OpInfo, SampleInput, cpu, make, strided, transposed, with_kwargs
from .elementwise import (
    MINMAX,
    SPECIAL,
    Binary,
    binary_samples,
    rejects,
    tensor_tie_samples,
    unary,
    unary_samples,
)

NO_GRAD = {"supports_grad": False}


def ternary_samples(dtype: torch.dtype, device: str, *, value=None, rhs: dict | None = None) -> Iterable[SampleInput]:
    """(input, tensor1, tensor2): equal shapes, broadcasting, 0-d, empty, non-contiguous, mixed dtypes."""
    rhs = rhs or {}
    kw = {} if value is None else {"value": value}
    shapes = (
        ((3, 4), (3, 4), (3, 4)),
        ((3, 4), (4,), (3, 1)),
        ((), (), ()),
        ((0, 3), (3,), (0, 3)),
        ((4,), (3, 4), ()),
    )
    for a, b, c in shapes:
        yield SampleInput(make(a, dtype, device), make(b, dtype, device), make(c, dtype, device, **rhs), **kw)
    yield SampleInput(
        transposed((3, 4), dtype, device), strided((3, 4), dtype, device), make((3, 4), dtype, device, **rhs), **kw
    )
    if dtype.is_floating_point:
        other = torch.float64 if dtype == torch.float32 else torch.float32
        yield SampleInput(
            make((3, 4), dtype, device), make((3, 4), other, device), make((), other, device, **rhs), **kw
        )


def addcmul_errors() -> Iterable[ErrorInput]:
    b = cpu((3,), torch.bool)
    yield ErrorInput(SampleInput(b, b, b), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,)), cpu((3,)), value="x"), TypeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((5,)), cpu((3, 4))), RuntimeError)


def addcdiv_errors() -> Iterable[ErrorInput]:
    i = cpu((3,), torch.int64)
    yield ErrorInput(SampleInput(i, i, i), RuntimeError)


def lerp_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(shape, layout=make):
        return layout(shape, dtype, device)

    for weight in (0.3, 0.7, -0.6, 1.5):
        yield SampleInput(x((3, 4)), x((3, 4)), weight)
    yield SampleInput(x((3, 4)), x((4,)), make((3, 1), dtype, device, low=-1, high=2))
    yield SampleInput(x(()), x(()), x(()))
    yield SampleInput(x((0, 3)), x((3,)), 0.5)
    yield SampleInput(x((3, 4), transposed), x((3, 4), strided), x((3, 4)))
    yield SampleInput(x((3, 4)), x((3, 4)), torch.tensor(0.25, dtype=torch.float64, device=device))


def lerp_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,), torch.float64), 0.5), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,), torch.int64), cpu((3,), torch.int64), 0.5), NotImplementedError)


def logaddexp_ties(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    values = torch.tensor([-math.inf, math.inf, 0.0, 1.0, math.nan, -math.inf, 3.0], dtype=dtype, device=device)
    yield SampleInput(values, values.flip(0))
    yield SampleInput(values, values)


POSITIVE_RHS = {"rhs": {"low": 0.1, "high": 5}}
FLOAT_BINARY = {"dtypes": FLOATS, "rejected": (torch.int64,)}

BINARY = {
    "logaddexp": Binary(torch.logaddexp, **FLOAT_BINARY, **MINMAX),
    "logaddexp2": Binary(torch.logaddexp2, **FLOAT_BINARY, **MINMAX),
    "xlogy": Binary(torch.xlogy, samples=POSITIVE_RHS),
    "xlog1py": Binary(torch.special.xlog1py, samples={"rhs": {"low": -0.9, "high": 5}}),
    "copysign": Binary(torch.copysign),
    "fmax": Binary(torch.fmax, **MINMAX),
    "fmin": Binary(torch.fmin, **MINMAX),
    "hypot": Binary(torch.hypot, **FLOAT_BINARY, **MINMAX),
    "ldexp": Binary(torch.ldexp, samples={"rhs": {"low": -3, "high": 3}, "scalars": ()}),
    "float_power": Binary(
        torch.float_power, dtypes=NUMERIC, samples={"lhs": {"low": 0.5, "high": 3}, "rhs": {"low": 0, "high": 3}}
    ),
    "sub": Binary(torch.subtract, dtypes=NUMERIC, rejected=(torch.bool,), samples={"scalars": (2, 2.5)}),
    "logical_and": Binary(torch.logical_and, grad=False, **MINMAX),
    "logical_or": Binary(torch.logical_or, grad=False, **MINMAX),
    "logical_xor": Binary(torch.logical_xor, grad=False, **MINMAX),
}
BINARY_OPS = [entry for name, binary in BINARY.items() for entry in binary.entries(name)]
# torch.subtract is sub's alias: its entries are variants of sub's.
BINARY_OPS = [replace(op, variant="subtract") if op.name == "sub" else op for op in BINARY_OPS]


def heaviside_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,), torch.float64)), RuntimeError)


def isclose_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    a = make((3, 4), dtype, device)
    b = a.clone()
    if dtype.is_floating_point:
        b[0] += 1e-6
        b[1, :2] = math.nan
        a[1, :1] = math.nan
        b[2, 3] = math.inf
        a[2, 3] = math.inf
    yield SampleInput(a, b)
    yield SampleInput(a, b, equal_nan=True)
    yield SampleInput(a, b, rtol=0.0, atol=0.0)
    yield SampleInput(a, b, rtol=1e-2, atol=0.5)
    yield SampleInput(make((3, 4), dtype, device), make((4,), dtype, device))
    yield SampleInput(make((), dtype, device), make((0, 2), dtype, device))
    yield SampleInput(transposed((3, 4), dtype, device), strided((3, 4), dtype, device))


def isclose_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,), torch.float64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,)), rtol=-1.0), RuntimeError)


def polygamma_samples(n: int, dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for sample in unary_samples(dtype, device, extremal_values=False, low=0.1, high=5):
        yield SampleInput(n, *sample.args)


def tensor_polygamma_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for sample in unary_samples(dtype, device, extremal_values=False, low=0.1, high=5):
        yield SampleInput(*sample.args, 2)


def logit_ties(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    values = torch.tensor([0.0, 0.1, 0.2, 0.5, 0.8, 0.9, 1.0, 0.05], dtype=dtype, device=device)
    yield SampleInput(values, 0.1)
    yield SampleInput(values.reshape(2, 4), 0.2)


def branch_on_floating(x):
    return x + 1 if torch.is_floating_point(x) else x - 1


def branch_on_complex(x):
    return x + 1 if torch.is_complex(x) else x - 1


def branch_on_same_size(x):
    return x * 2 if torch.is_same_size(x, x.reshape(-1)) else x * 3


UNARY_OPS = [
    unary("frac", dtypes=FLOATS, error_inputs=rejects(torch.int64, torch.bool)),
    unary("deg2rad"),
    unary("rad2deg"),
    unary("square"),
    unary("sgn"),
    unary("positive", dtypes=NUMERIC, error_inputs=rejects(torch.bool)),
    unary("logit", dtypes=FLOATS, low=0.05, high=0.95),
    unary("logit", dtypes=(torch.int64, torch.bool), variant="integral"),
    OpInfo("logit", torch.logit, with_kwargs(unary_samples, eps=1e-2), variant="eps"),
    OpInfo("logit", torch.logit, logit_ties, variant="ties"),
    unary("nan_to_num"),
    OpInfo(
        "nan_to_num", torch.nan_to_num, with_kwargs(unary_samples, nan=1.5, posinf=2.0, neginf=-3.0), variant="values"
    ),
    unary("isnan", **NO_GRAD),
    unary("isinf", **NO_GRAD),
    unary("isposinf", **NO_GRAD),
    unary("isneginf", **NO_GRAD),
    unary("isreal", **NO_GRAD),
    unary("logical_not", **NO_GRAD),
    unary("sinc"),
    unary("entr", torch.special.entr, low=0.0),
    unary("entr", torch.special.entr, variant="negative"),
    unary("ndtr", torch.special.ndtr, tolerances=SPECIAL),
    unary("angle"),
    unary("real", dtypes=NUMERIC),
    *(
        OpInfo(
            "polygamma",
            torch.polygamma,
            partial(polygamma_samples, n),
            dtypes=NUMERIC,
            variant=f"n{n}",
            tolerances=SPECIAL,
        )
        for n in range(4)
    ),
    OpInfo("polygamma", torch.Tensor.polygamma, tensor_polygamma_samples, variant="method", tolerances=SPECIAL),
    unary("is_floating_point", branch_on_floating, dtypes=NUMERIC),
    unary("is_complex", branch_on_complex, dtypes=NUMERIC),
    unary("is_same_size", branch_on_same_size, dtypes=NUMERIC),
]

POLYNOMIALS = (
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
)


def polynomial_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Degrees 0 to 5 as a tensor (broadcast from a row) and as a number, a 0-d and an empty input,
    and integers (promoted to the default float)."""
    x = make((4, 6), dtype, device, low=-1, high=1)
    yield SampleInput(x, torch.arange(6, device=device))
    yield SampleInput(x, 3)
    yield SampleInput(make((), dtype, device, low=-1, high=1), torch.tensor(4, device=device))
    yield SampleInput(make((0, 2), dtype, device), 2)


def mvlgamma_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Each p from 1 to 4 over values above (p - 1) / 2, where the sum is defined, non-contiguous
    and empty inputs, and integers (promoted to the default float)."""
    for p in (1, 2, 3, 4):
        yield SampleInput(make((3, 4), dtype, device, low=(p - 1) / 2 + 0.1, high=6), p)
    yield SampleInput(transposed((3, 4), dtype, device, low=2, high=5), 3)
    yield SampleInput(make((0, 2), dtype, device, low=2, high=5), 2)


def mvlgamma_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), 0), RuntimeError, "greater than or equal to 1")


def incomplete_gamma_errors() -> Iterable[ErrorInput]:
    ints = cpu((3,), torch.int64)
    yield ErrorInput(SampleInput(ints, ints), NotImplementedError)  # (no integer kernel)
    yield ErrorInput(SampleInput(cpu((3,)), 2.0), TypeError)  # (tensors only)
    yield ErrorInput(SampleInput(cpu((3,)), cpu((4,))), RuntimeError)


def _incomplete_gamma_entries(name: str, fn) -> list[OpInfo]:
    """Pairs of positive operands (broadcast, strided, of two dtypes); the gradient in ``x`` with
    ``a`` made inside the program (eager has none in ``a``)."""
    samples = partial(binary_samples, scalars=(), partner=None, lhs={"low": 0.1}, rhs={"low": 0.0})
    return [
        OpInfo(name, fn, samples, incomplete_gamma_errors, tolerances=SPECIAL),
        OpInfo(
            name,
            lambda x: fn(torch.full_like(x, 1.5), x),
            partial(unary_samples, low=0.0),
            variant="gradient_in_x",
            tolerances=SPECIAL,
        ),
    ]


OPS = [
    *(
        OpInfo(
            name, getattr(torch.special, name), polynomial_samples, dtypes=FLOATS + (torch.int64,), tolerances=SPECIAL
        )
        for name in POLYNOMIALS
    ),
    OpInfo(
        "mvlgamma",
        torch.mvlgamma,
        mvlgamma_samples,
        mvlgamma_errors,
        dtypes=FLOATS + (torch.int64,),
        tolerances=SPECIAL,
    ),
    *UNARY_OPS,
    *BINARY_OPS,
    OpInfo("fmax", torch.fmax, tensor_tie_samples(1), variant="ties"),
    OpInfo("fmin", torch.fmin, tensor_tie_samples(1), variant="ties"),
    OpInfo("logaddexp", torch.logaddexp, logaddexp_ties, variant="ties"),
    OpInfo("logaddexp2", torch.logaddexp2, logaddexp_ties, variant="ties"),
    OpInfo(
        "heaviside",
        torch.heaviside,
        partial(binary_samples, scalars=(), partner=None),
        heaviside_errors,
        ALL,
        supports_grad=False,
    ),
    OpInfo("isclose", torch.isclose, isclose_samples, isclose_errors, ALL, supports_grad=False),
    OpInfo("addcmul", torch.addcmul, ternary_samples, addcmul_errors, NUMERIC),
    OpInfo("addcmul", torch.addcmul, partial(ternary_samples, value=0.5), variant="value"),
    OpInfo("addcdiv", torch.addcdiv, partial(ternary_samples, value=-2, rhs={"exclude_zero": True}), addcdiv_errors),
    OpInfo("lerp", torch.lerp, lerp_samples, lerp_errors),
    *_incomplete_gamma_entries("igamma", torch.igamma),
    *_incomplete_gamma_entries("igammac", torch.igammac),
]
