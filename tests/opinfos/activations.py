"""More torch.nn.functional activations: shrinkage, gated, hard and smooth variants, SELU/CELU,
PReLU, RReLU in evaluation, softsign, softmin; their inplace=True and in-place forms."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from .core import (
    ACCUMULATING,
    FLOATS,
    NUMERIC,
    ErrorInput,
    OpInfo,
    SampleInput,
    Strided,
    Transposed,
    cases,
    cpu,
    make,
    with_kwargs,
)
from .elementwise import rejects, tie_samples, unary, unary_samples
from .nn import SOFTMAX_CASES

FLOAT_ONLY = {"dtypes": FLOATS, "error_inputs": rejects(torch.int64)}
#: Values at the cuts of hardswish, hardsigmoid and the shrink functions (+-3, +-lambd).
CUTS = (-4.0, -3.0, -2.0, -0.5, 0.0, 0.5, 1.0, 3.0, 4.0, -1.0, 0.25, 2.5)


def cut_samples(*calls: tuple) -> Callable:
    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        values = torch.tensor(CUTS, dtype=dtype, device=device)
        for args, kwargs in calls:
            yield SampleInput(values, *args, **kwargs)
            yield SampleInput(values.reshape(3, 4), *args, **kwargs)

    return generate


def in_place(fn: Callable, **kwargs) -> Callable:
    """``fn`` writing into a fresh local (eager refuses in-place writes to a leaf that requires grad)."""

    def call(x, *args, **kw):
        y = x * 1
        out = fn(y, *args, **kwargs, **kw)
        return out, y

    call.__name__ = f"{getattr(fn, '__name__', 'fn')}_in_place"
    return call


GLU_CASES = cases(
    ((4,), -1),
    ((3, 4), 1),
    ((4, 3), 0),
    ((2, 6, 3), -2),
    ((0, 4), -1),
    (Transposed((3, 4)), -1),
    (Strided((2, 3, 4)), -1),
)


def glu_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu(())), RuntimeError)
    yield ErrorInput(SampleInput(cpu((4,), torch.int64)), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((4,)), 2), IndexError)


def softshrink_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), -1.0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,), torch.int64)), NotImplementedError)


def celu_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), 0.0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,), torch.int64)), NotImplementedError)


def prelu_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def w(*shape):
        return make(shape, dtype, device, low=0.0, high=0.5)

    yield SampleInput(make((3, 4), dtype, device), w(4))
    yield SampleInput(make((2, 3, 5), dtype, device), w(3))
    yield SampleInput(make((2, 3, 5), dtype, device), w(1))
    yield SampleInput(make((2, 3, 2, 2), dtype, device), w())
    yield SampleInput(make((), dtype, device), w(1))
    yield SampleInput(make((5,), dtype, device), w(1))
    yield SampleInput(make((0, 3), dtype, device), w(3))
    yield SampleInput(make((4, 3), dtype, device).mT, w(4))
    yield SampleInput(torch.tensor(CUTS, dtype=dtype, device=device).reshape(3, 4), w(4))


def prelu_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((4,), torch.float64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((2, 2))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4), torch.int64), cpu((1,), torch.int64)), NotImplementedError)


def softmin_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4), torch.int64), -1), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((3, 4), torch.bool), -1, dtype=torch.float32), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2), IndexError)


def rrelu_eval(x, *args, **kwargs):
    return F.rrelu(x, *args, training=False, **kwargs)


OPS = [
    OpInfo("glu", F.glu, GLU_CASES, glu_errors),
    unary("hardshrink", F.hardshrink, **FLOAT_ONLY),
    OpInfo("hardshrink", F.hardshrink, with_kwargs(unary_samples, lambd=1.0), variant="lambd"),
    OpInfo("hardshrink", torch.Tensor.hardshrink, cut_samples(((), {}), ((1.0,), {})), variant="ties"),
    OpInfo("softshrink", F.softshrink, unary_samples, softshrink_errors),
    OpInfo("softshrink", F.softshrink, cut_samples(((), {}), ((1.0,), {}), ((0.0,), {})), variant="ties"),
    unary("tanhshrink", F.tanhshrink, dtypes=NUMERIC),
    unary("softsign", F.softsign, dtypes=NUMERIC),
    unary("mish", F.mish, **FLOAT_ONLY),
    unary("hardswish", F.hardswish, **FLOAT_ONLY),
    OpInfo("hardswish", F.hardswish, cut_samples(((), {})), variant="ties"),
    unary("hardsigmoid", F.hardsigmoid, **FLOAT_ONLY),
    OpInfo("hardsigmoid", F.hardsigmoid, cut_samples(((), {})), variant="ties"),
    unary("selu", F.selu, **FLOAT_ONLY),
    OpInfo("selu", F.selu, tie_samples(((), {})), variant="ties"),
    unary("selu", torch.selu, dtypes=FLOATS, variant="torch"),
    OpInfo("celu", F.celu, unary_samples, celu_errors),
    OpInfo("celu", F.celu, with_kwargs(unary_samples, alpha=0.5), variant="alpha"),
    OpInfo("celu", F.celu, tie_samples(((), {}), ((2.0,), {})), variant="ties"),
    OpInfo("rrelu", rrelu_eval, unary_samples, rejects(torch.int64), variant="eval"),
    OpInfo("rrelu", rrelu_eval, with_kwargs(unary_samples, lower=0.2, upper=0.4), variant="bounds"),
    OpInfo("rrelu", rrelu_eval, tie_samples(((), {})), variant="ties"),
    OpInfo("prelu", F.prelu, prelu_samples, prelu_errors),
    OpInfo("softmin", F.softmin, SOFTMAX_CASES, softmin_errors, tolerances=ACCUMULATING),
    OpInfo(
        "softmin",
        F.softmin,
        with_kwargs(SOFTMAX_CASES, dtype=torch.float64),
        dtypes=(*FLOATS, torch.int64),
        variant="dtype",
        tolerances=ACCUMULATING,
    ),
    # inplace=True and the in-place functions write into their input; gradients are eager's.
    *(
        OpInfo(name, in_place(fn, **kw), unary_samples, variant="inplace" if kw else "in_place")
        for name, fn, kw in (
            ("hardswish", F.hardswish, {"inplace": True}),
            ("hardsigmoid", F.hardsigmoid, {"inplace": True}),
            ("mish", F.mish, {"inplace": True}),
            ("selu", F.selu, {"inplace": True}),
            ("celu", F.celu, {"inplace": True}),
            ("rrelu", F.rrelu, {"inplace": True}),
            ("selu", torch.selu_, {}),
            ("celu", torch.celu_, {}),
            ("rrelu", torch.rrelu_, {}),
        )
    ),
]
