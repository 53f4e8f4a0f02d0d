"""Elementwise ops: unary math, binary math and comparisons, Python operators, where/masked_fill/clamp."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch

from .core import (
    ALL,
    FLOATS,
    INTEGRAL,
    NUMERIC,
    PROMOTION_PARTNER,
    ErrorGenerator,
    ErrorInput,
    OpInfo,
    SampleInput,
    Tolerance,
    chain_errors,
    cpu,
    extremal,
    make,
    no_errors,
    strided,
    transposed,
    with_kwargs,
)

# Special functions are computed by different series in different kernels.
SPECIAL = {torch.float32: Tolerance(rtol=1e-5, atol=1e-5), torch.float64: Tolerance(rtol=1e-7, atol=1e-7)}

UNARY_SHAPES = ((), (0,), (5,), (3, 4), (2, 0, 3))


def unary_samples(
    dtype: torch.dtype, device: str, *, extremal_values: bool = True, **domain: Any
) -> Iterable[SampleInput]:
    """One tensor of each rank, empty and non-contiguous layouts, and (for floats) the extremal values."""
    for shape in UNARY_SHAPES:
        yield SampleInput(make(shape, dtype, device, **domain))
    yield SampleInput(transposed((3, 4), dtype, device, **domain))
    yield SampleInput(strided((2, 3, 4), dtype, device, **domain))
    if dtype.is_floating_point and extremal_values:
        yield SampleInput(extremal(dtype, device))


def rejects(*dtypes: torch.dtype, arity: int = 1) -> ErrorGenerator:
    """Error inputs: all `arity` operands of one of `dtypes`, which eager has no kernel for."""

    def errors() -> Iterable[ErrorInput]:
        for dtype in dtypes:
            yield ErrorInput(SampleInput(*(cpu((3,), dtype) for _ in range(arity))), NotImplementedError)

    return errors


def unary(name: str, op: Callable | None = None, *, dtypes=ALL, **kw: Any) -> OpInfo:
    """An entry whose samples are `unary_samples`; `low`/`high`/`exclude_zero` set its domain."""
    domain = {k: kw.pop(k) for k in ("low", "high", "exclude_zero") if k in kw}
    return OpInfo(
        name,
        op or getattr(torch, name),
        partial(unary_samples, **domain),
        dtypes=dtypes,
        **kw,
    )


UNARY_OPS = [
    unary("abs", dtypes=NUMERIC, error_inputs=rejects(torch.bool)),
    unary("neg", dtypes=NUMERIC, error_inputs=rejects(torch.bool)),
    # Floating math: integer and bool inputs promote to the default float dtype.
    unary("exp"),
    unary("exp2"),
    unary("expm1"),
    unary("log", low=0.1),
    unary("log1p", low=-0.9),
    unary("log2", low=0.1),
    unary("log10", low=0.1),
    unary("sin"),
    unary("cos"),
    unary("tan", low=-1.3, high=1.3),
    unary("tanh"),
    unary("sinh"),
    unary("cosh"),
    unary("asin", low=-0.95, high=0.95),
    unary("acos", low=-0.95, high=0.95),
    unary("atan"),
    unary("asinh"),
    unary("acosh", low=1.05),
    unary("atanh", low=-0.95, high=0.95),
    unary("erf"),
    unary("erfc"),
    unary("erfinv", low=-0.95, high=0.95, tolerances=SPECIAL),
    unary("sqrt", low=0.1),
    unary("rsqrt", low=0.1),
    unary("reciprocal", exclude_zero=True),
    unary("lgamma", tolerances=SPECIAL),
    unary("digamma", low=0.1, tolerances=SPECIAL),
    # Bessel and normal-distribution functions (torch.special); int and bool promote to float.
    unary("i0", tolerances=SPECIAL),
    unary("i0e", torch.special.i0e, tolerances=SPECIAL),
    unary("i1", torch.special.i1, tolerances=SPECIAL),
    unary("i1e", torch.special.i1e, tolerances=SPECIAL),
    unary("ndtri", torch.special.ndtri, dtypes=FLOATS, low=0.05, high=0.95, tolerances=SPECIAL),
    unary("erfcx", torch.special.erfcx, tolerances=SPECIAL),
    unary("log_ndtr", torch.special.log_ndtr, tolerances=SPECIAL),
    unary(
        "frexp",
        dtypes=FLOATS,
        error_inputs=lambda: iter([ErrorInput(SampleInput(cpu((3,), torch.int64)), RuntimeError)]),
    ),
    *(
        unary(name, getattr(torch.special, name), tolerances=SPECIAL)
        for name in (
            "bessel_j0",
            "bessel_j1",
            "modified_bessel_i0",
            "modified_bessel_i1",
            "airy_ai",
            "spherical_bessel_j0",
        )
    ),
    *(
        unary(name, getattr(torch.special, name), low=0.1, tolerances=SPECIAL)
        for name in (
            "bessel_y0",
            "bessel_y1",
            "modified_bessel_k0",
            "modified_bessel_k1",
            "scaled_modified_bessel_k0",
            "scaled_modified_bessel_k1",
        )
    ),
    # Sign and rounding keep the input dtype; rounding has no bool kernel.
    unary("sign"),
    unary("signbit", supports_grad=False),
    unary("floor", dtypes=NUMERIC, error_inputs=rejects(torch.bool)),
    unary("ceil", dtypes=NUMERIC, error_inputs=rejects(torch.bool)),
    unary("round", dtypes=NUMERIC, error_inputs=rejects(torch.bool)),
    unary("trunc", dtypes=NUMERIC, error_inputs=rejects(torch.bool)),
    unary("isfinite", supports_grad=False),
    unary("bitwise_not", dtypes=INTEGRAL, error_inputs=rejects(torch.float32), supports_grad=False),
    # The same ops spelled as Python operators and builtins.
    unary("neg", operator.neg, dtypes=NUMERIC, variant="operator", error_inputs=rejects(torch.bool)),
    unary("bitwise_not", operator.invert, dtypes=INTEGRAL, variant="operator", supports_grad=False),
    unary("abs", abs, dtypes=NUMERIC, variant="builtin"),
]

# Pairs of operand shapes: equal, broadcasting, 0-dim against n-dim, and empty.
BINARY_SHAPES = (
    ((), ()),
    ((5,), (5,)),
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),
    ((3, 1), (1, 4)),
    ((2, 1, 4), (3, 1)),
    ((3, 4), ()),
    ((), (3, 4)),
    ((0, 3), (0, 3)),
    ((0, 3), (3,)),
)

# Operators dispatch to the same op as the function form, so they need only its main cases.
OPERATOR_SHAPES = (((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 4), ()), ((0, 3), (3,)))


def binary_samples(
    dtype: torch.dtype,
    device: str,
    *,
    lhs: dict | None = None,
    rhs: dict | None = None,
    scalars: tuple = (2, 2.5, True),
    partner: dict | None = PROMOTION_PARTNER,
    shapes: tuple = BINARY_SHAPES,
    scalar_first: bool = False,
) -> Iterable[SampleInput]:
    """Operand pairs of `shapes`, non-contiguous operands, Python scalars on the right, and a right
    operand of another dtype (0-dim, which does not take part in promotion, and full-size).
    `scalar_first`: also a 0-dim float32 operand on the left of a bfloat16 one (``ltorch.cpu_scalar_times``),
    and on its right (``ltorch.cpu_times_scalar``).

    `lhs`/`rhs` are each operand's domain, as keyword arguments of `make`.
    """
    lhs, rhs = lhs or {}, rhs or {}
    for lhs_shape, rhs_shape in shapes:
        yield SampleInput(make(lhs_shape, dtype, device, **lhs), make(rhs_shape, dtype, device, **rhs))
    yield SampleInput(transposed((3, 4), dtype, device, **lhs), strided((3, 4), dtype, device, **rhs))
    for scalar in scalars:
        yield SampleInput(make((3, 4), dtype, device, **lhs), scalar)
    if partner:
        other = partner[dtype]
        for shape in ((), (3, 4)):
            yield SampleInput(make((3, 4), dtype, device, **lhs), make(shape, other, device, **rhs))
    if scalar_first and dtype == torch.float32:
        yield SampleInput(make((), dtype, device, **lhs), make((3, 4), torch.bfloat16, device, **rhs))
        yield SampleInput(make((3, 4), torch.bfloat16, device, **lhs), make((), dtype, device, **rhs))


def broadcast_mismatch() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((5,))), RuntimeError)
    # Two dims differ: eager checks from the last and names dimension 3 (LeViT's attention biases
    # at another image size than the model's).
    yield ErrorInput(SampleInput(cpu((2, 4, 6, 6)), cpu((4, 5, 5))), RuntimeError, match="non-singleton dimension 3")


def scalar_rejected() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 2.0), TypeError)


NONZERO = {"exclude_zero": True}
DIVISION = {"rhs": NONZERO}
# Integers to negative integer powers raise in eager; a positive base keeps float results real.
POW = {"lhs": {"low": 0.5, "high": 3}, "rhs": {"low": 0, "high": 3}}
NO_SCALARS = {"scalars": ()}
NO_BOOL_SCALAR = {"scalars": (2, 2.5)}
BITWISE = {"scalars": (2, True), "partner": {torch.int64: torch.int32, torch.bool: torch.int64}}


@dataclass(frozen=True)
class Binary:
    """One binary op: its torch function, its Python operator (if any), and how to sample it."""

    fn: Callable
    operator: Callable | None = None
    dtypes: tuple[torch.dtype, ...] = ALL
    samples: dict = field(default_factory=dict)  # keyword arguments of `binary_samples`
    rejected: tuple[torch.dtype, ...] = ()  # dtypes eager has no kernel for
    errors: tuple = ()  # error generators of the function form (they may pass keywords)
    grad: bool = True
    scalar_lhs_grad: bool | None = None  # None: same as `grad`

    def entries(self, name: str) -> list[OpInfo]:
        """The function form, the operator form, and the operator with a Python scalar on the left."""
        shared_errors = (broadcast_mismatch, rejects(*self.rejected, arity=2))
        fn_samples = partial(binary_samples, **self.samples)
        fn = OpInfo(name, self.fn, fn_samples, chain_errors(*shared_errors, *self.errors), self.dtypes)
        if self.operator is None:
            return [replace(fn, supports_grad=self.grad)]
        # The operator reaches the same op as the function, so its main cases are enough.
        operator_samples = partial(fn_samples, shapes=OPERATOR_SHAPES, scalars=(2,), partner=None)
        # `2 - a` reaches torch as `a.__rsub__(2)`.
        scalar_lhs_samples = partial(unary_samples, **self.samples.get("rhs", {}))
        scalar_lhs_grad = self.grad if self.scalar_lhs_grad is None else self.scalar_lhs_grad
        return [
            replace(fn, supports_grad=self.grad),
            replace(
                fn,
                op=self.operator,
                sample_inputs=operator_samples,
                error_inputs=chain_errors(*shared_errors),
                variant="operator",
                supports_grad=self.grad,
            ),
            replace(
                fn,
                op=partial(_scalar_lhs, self.operator),
                sample_inputs=scalar_lhs_samples,
                error_inputs=no_errors,
                variant="scalar_lhs",
                supports_grad=scalar_lhs_grad,
            ),
        ]


def _scalar_lhs(op: Callable, a: torch.Tensor) -> torch.Tensor:
    return op(2, a)


def int_alpha_rejected() -> Iterable[ErrorInput]:
    ints = cpu((3,), torch.int64)
    yield ErrorInput(SampleInput(ints, ints, alpha=2.5), RuntimeError)


def bad_rounding_mode() -> Iterable[ErrorInput]:
    a = cpu((3,))
    yield ErrorInput(SampleInput(a, a, rounding_mode="bogus"), RuntimeError)


def integer_division_by_zero() -> Iterable[ErrorInput]:
    a = cpu((3,), torch.int64)
    yield ErrorInput(SampleInput(a, torch.zeros_like(a)), RuntimeError)


def bool_subtrahend() -> Iterable[ErrorInput]:
    # A Python bool becomes a bool tensor, which subtraction rejects even from a float tensor:
    # with NotImplementedError in recent torch, with RuntimeError (its base class) in torch 2.9.
    a = cpu((3,))
    try:
        torch.sub(a, True)
    except RuntimeError as e:
        yield ErrorInput(SampleInput(a, True), type(e))


def negative_integer_power() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,), torch.int64), -1), RuntimeError)


NUMERIC_NO_BOOL = {"dtypes": NUMERIC, "rejected": (torch.bool,)}
INTEGER_DIVISION = {**NUMERIC_NO_BOOL, "samples": DIVISION}
COMPARISON = {"grad": False}
BITWISE_OP = {"dtypes": INTEGRAL, "samples": BITWISE, "rejected": (torch.float32,), "grad": False}
MINMAX = {"samples": NO_SCALARS, "errors": (scalar_rejected,)}

BINARY = {
    "add": Binary(torch.add, operator.add),
    "sub": Binary(torch.sub, operator.sub, **NUMERIC_NO_BOOL, samples=NO_BOOL_SCALAR, errors=(bool_subtrahend,)),
    "mul": Binary(torch.mul, operator.mul, samples={"scalar_first": True}),
    "div": Binary(torch.div, operator.truediv, samples=DIVISION, errors=(bad_rounding_mode,)),
    "true_divide": Binary(torch.true_divide, samples=DIVISION),
    # Eager has no derivative for floor_divide, nor for remainder with respect to the divisor.
    "floor_divide": Binary(torch.floor_divide, operator.floordiv, **INTEGER_DIVISION, grad=False),
    "remainder": Binary(torch.remainder, operator.mod, **INTEGER_DIVISION, scalar_lhs_grad=False),
    "fmod": Binary(torch.fmod, **INTEGER_DIVISION, errors=(integer_division_by_zero,)),
    "pow": Binary(torch.pow, operator.pow, **NUMERIC_NO_BOOL, samples=POW, errors=(negative_integer_power,)),
    "maximum": Binary(torch.maximum, **MINMAX),
    "minimum": Binary(torch.minimum, **MINMAX),
    "atan2": Binary(torch.atan2, **MINMAX),
    "eq": Binary(torch.eq, operator.eq, **COMPARISON),
    "ne": Binary(torch.ne, operator.ne, **COMPARISON),
    "lt": Binary(torch.lt, operator.lt, **COMPARISON),
    "le": Binary(torch.le, operator.le, **COMPARISON),
    "gt": Binary(torch.gt, operator.gt, **COMPARISON),
    "ge": Binary(torch.ge, operator.ge, **COMPARISON),
    "bitwise_and": Binary(torch.bitwise_and, operator.and_, **BITWISE_OP),
    "bitwise_or": Binary(torch.bitwise_or, operator.or_, **BITWISE_OP),
    "bitwise_xor": Binary(torch.bitwise_xor, operator.xor, **BITWISE_OP),
    # No integer kernel; the gradient goes to the first operand whole.
    "nextafter": Binary(
        torch.nextafter, dtypes=FLOATS, samples=NO_SCALARS, rejected=(torch.int64,), errors=(scalar_rejected,)
    ),
}

# zeta(x, q): no derivative in x (eager's backward raises, thunder_rs refuses to trace it), so the
# gradient in q is checked with a number x.
ZETA_OPS = [
    OpInfo(
        "zeta",
        torch.special.zeta,
        partial(binary_samples, scalars=(), partner=None, rhs={"low": 0.5}),
        dtypes=ALL,
        tolerances=SPECIAL,
    ),
    OpInfo(
        "zeta",
        lambda q: torch.special.zeta(2.5, q),
        partial(unary_samples, low=0.5),
        dtypes=FLOATS,
        variant="number_x",
        tolerances=SPECIAL,
    ),
]

BINARY_OPS = [entry for name, binary in BINARY.items() for entry in binary.entries(name)] + ZETA_OPS


def div_rounding_errors(rounding_mode: str) -> ErrorGenerator:
    def errors() -> Iterable[ErrorInput]:
        ints, bools = cpu((3,), torch.int64), cpu((3,), torch.bool)
        yield ErrorInput(SampleInput(ints, torch.zeros_like(ints), rounding_mode=rounding_mode), RuntimeError)
        yield ErrorInput(SampleInput(bools, bools, rounding_mode=rounding_mode), NotImplementedError)

    return errors


DIV_SAMPLES = partial(binary_samples, **DIVISION)
SMALL_SCALARS = partial(binary_samples, scalars=(2,))

BINARY_VARIANTS = [
    OpInfo("add", torch.add, with_kwargs(SMALL_SCALARS, alpha=2), int_alpha_rejected, NUMERIC, "alpha"),
    OpInfo("sub", torch.sub, with_kwargs(SMALL_SCALARS, alpha=0.5), dtypes=FLOATS, variant="alpha"),
    *(
        OpInfo("div", torch.div, with_kwargs(DIV_SAMPLES, rounding_mode=m), div_rounding_errors(m), NUMERIC, m)
        for m in ("trunc", "floor")
    ),
]


# (condition, input, other): all three broadcast together.
WHERE_SHAPES = (
    ((3, 4), (3, 4), (3, 4)),
    ((3, 4), (4,), (3, 1)),
    ((4,), (3, 4), ()),
    ((), (), ()),
    ((0, 3), (0, 3), (3,)),
)


def where_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def cond(shape):
        return make(shape, torch.bool, device)

    def x(shape, layout=make, dt=dtype):
        return layout(shape, dt, device)

    shapes = (
        ((3, 4), (3, 4), (3, 4)),
        ((3, 4), (4,), (3, 1)),
        ((4,), (3, 4), ()),
        ((), (), ()),
        ((0, 3), (0, 3), (3,)),
    )
    for c, a, b in shapes:
        yield SampleInput(cond(c), x(a), x(b))
    yield SampleInput(cond((3, 4)), x((3, 4), transposed), x((3, 4), strided))
    yield SampleInput(cond((3, 4)), x((3, 4)), 0)
    yield SampleInput(cond((3, 4)), 1.5, x((3, 4)))
    yield SampleInput(cond((3, 4)), x((3, 4)), x((3, 4), dt=PROMOTION_PARTNER[dtype]))


def where_errors() -> Iterable[ErrorInput]:
    a = cpu((3, 4))
    yield ErrorInput(SampleInput(cpu((3, 4), torch.int64), a, a), RuntimeError)
    yield ErrorInput(SampleInput(a > 0, a, cpu((5,))), RuntimeError)


def masked_fill_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def mask(shape):
        return make(shape, torch.bool, device)

    def x(shape, layout=make):
        return layout(shape, dtype, device)

    value = {torch.bool: True, torch.int64: 7}.get(dtype, -1.5)
    yield SampleInput(x((3, 4)), mask((3, 4)), value)
    yield SampleInput(x((3, 4)), mask((4,)), value)
    yield SampleInput(x((4,)), mask((3, 4)), value)  # out-of-place masked_fill broadcasts self too
    yield SampleInput(x(()), mask(()), torch.tensor(3, dtype=dtype, device=device))  # (a 0-dim tensor fill value)
    yield SampleInput(x(()), mask(()), value)
    yield SampleInput(x((0, 4)), mask((4,)), value)
    yield SampleInput(x((3, 4), transposed), mask((3, 4)), value)
    yield SampleInput(x((3, 4)), mask((3, 4)), 2.5)  # a float fill is cast to an integer self
    yield SampleInput(x((3, 4)), mask((3, 4)), torch.tensor(3, dtype=dtype, device=device))
    yield SampleInput(x((3, 4)), mask((3, 4)), torch.tensor(2.5, dtype=torch.float64, device=device))


def masked_fill_errors() -> Iterable[ErrorInput]:
    a = cpu((3, 4))
    yield ErrorInput(SampleInput(a, cpu((3, 4), torch.int64), 1.0), RuntimeError)
    yield ErrorInput(SampleInput(a, a > 0, torch.ones(1)), RuntimeError)
    yield ErrorInput(SampleInput(a, cpu((5,), torch.bool), 1.0), RuntimeError)


def clamp_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(shape, layout=make):
        return layout(shape, dtype, device)

    yield SampleInput(x((3, 4)), -2, 3)
    yield SampleInput(x((3, 4)), min=0.5)
    yield SampleInput(x((3, 4)), max=0.5)
    yield SampleInput(x((3, 4)), 2, 1)  # min > max: everything becomes max
    yield SampleInput(x(()), -1, 1)
    yield SampleInput(x((0, 4)), -1, 1)
    yield SampleInput(x((3, 4), transposed), -1.5, 1.5)
    yield SampleInput(x((3, 4)), x((4,)), x((3, 1)))
    yield SampleInput(x((3, 4)), min=x(()))
    yield SampleInput(x((3, 4), strided), max=x((3, 4)))


#: Values at and around common thresholds (0, +-1, 0.5, 6), each exactly representable.
TIES = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 6.0, 7.0, 0.0, 1.0, -1.0)


def tie_samples(*calls: tuple) -> Callable:
    """Samples of TIES (1-D and 2-D) with each ``(args, kwargs)`` of ``calls``: gradients at ties."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        values = torch.tensor(TIES, dtype=dtype, device=device)
        for args, kwargs in calls:
            yield SampleInput(values, *args, **kwargs)
            yield SampleInput(values.reshape(3, 4), *args, **kwargs)

    return generate


def tensor_tie_samples(bounds: int) -> Callable:
    """TIES with ``bounds`` tensor operands that tie with it in places (maximum and minimum take
    one, clamp two; the second sample has min > max)."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        values = torch.tensor(TIES, dtype=dtype, device=device)
        low, high = torch.zeros_like(values), torch.ones_like(values)
        yield SampleInput(values, *(low, high)[:bounds])
        yield SampleInput(values, *(high, low)[:bounds])
        yield SampleInput(values.reshape(3, 4), *(low.reshape(3, 4)[0], high[:4])[:bounds])

    return generate


def clamp_bound_samples(bound: str) -> Callable:
    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        def x(shape, layout=make):
            return layout(shape, dtype, device)

        yield SampleInput(x((3, 4)), 0.5 if dtype.is_floating_point else 1)
        yield SampleInput(x(()), -1)
        yield SampleInput(x((0, 4)), 1)
        yield SampleInput(x((3, 4), transposed), x((4,)))
        yield SampleInput(x((3, 4)), x(()))

    return generate


def clamp_errors() -> Iterable[ErrorInput]:
    a = cpu((3, 4))
    yield ErrorInput(SampleInput(a), RuntimeError)
    yield ErrorInput(SampleInput(a, torch.zeros(4), 1.0), TypeError)  # a tensor min with a scalar max
    yield ErrorInput(SampleInput(a, torch.zeros(5)), RuntimeError)


CONDITIONAL_OPS = [
    OpInfo("where", torch.where, where_samples, where_errors, ALL),
    OpInfo("masked_fill", torch.masked_fill, masked_fill_samples, masked_fill_errors, ALL),
    OpInfo("clamp", torch.clamp, clamp_samples, clamp_errors, NUMERIC),
    OpInfo("clamp", torch.clamp, tie_samples(((-1.0, 1.0), {}), ((0, 6), {}), ((), {"min": 0.5})), variant="ties"),
    OpInfo("clamp", torch.clamp, tensor_tie_samples(2), variant="tensor_ties"),
    OpInfo("clamp_min", torch.clamp_min, clamp_bound_samples("min"), dtypes=NUMERIC),
    OpInfo("clamp_max", torch.clamp_max, clamp_bound_samples("max"), dtypes=NUMERIC),
    OpInfo("clamp_min", torch.Tensor.clamp_min, tie_samples(((0.5,), {})), variant="method_ties"),
    OpInfo("maximum", torch.maximum, tensor_tie_samples(1), variant="ties"),
    OpInfo("minimum", torch.minimum, tensor_tie_samples(1), variant="ties"),
]

OPS = UNARY_OPS + BINARY_OPS + BINARY_VARIANTS + CONDITIONAL_OPS
