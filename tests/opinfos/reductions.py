"""Reductions: sum, mean, var, std, amax, max (full and along a dim), argmax."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

import torch

from .core import (
    ACCUMULATING,
    ALL,
    FLOATS,
    NUMERIC,
    ErrorInput,
    OpInfo,
    SampleInput,
    chain_errors,
    cpu,
    make,
    strided,
    transposed,
    with_kwargs,
)

NO_DIM = object()  # the call omits dim, which is not the same as dim=None for every op

# (shape, dim, keepdim). A few cases reduce a zero-size dim, which only ops with an identity can do.
REDUCTION_CASES = (
    ((), NO_DIM, False),
    ((), 0, False),
    ((), -1, True),
    ((5,), 0, False),
    ((3, 4), NO_DIM, False),
    ((3, 4), None, False),
    ((3, 4), 1, False),
    ((3, 4), -2, True),
    ((2, 3, 4), (0, 2), False),
    ((2, 3, 4), (-1, 0), True),
    ((2, 3, 4), (), False),  # an empty dim tuple reduces over every dim
    ((0, 3), 1, False),
    ((0, 3), 0, True),
    ((2, 0, 3), (0, 1), False),
)


def _dim_kind(dim) -> str:
    if dim is NO_DIM:
        return "omitted"
    if dim is None:
        return "None"
    return "tuple" if isinstance(dim, tuple) else "int"


def _reduces_zero_size(shape: tuple[int, ...], dim) -> bool:
    if 0 not in shape:
        return False
    if dim in (NO_DIM, None, ()):
        return True
    dims = dim if isinstance(dim, tuple) else (dim,)
    return any(shape[d] == 0 for d in dims)


def reduction_samples(
    dtype: torch.dtype,
    device: str,
    *,
    dims: frozenset[str] = frozenset({"omitted", "None", "int", "tuple"}),
    identity: bool = True,
) -> Iterable[SampleInput]:
    """The `REDUCTION_CASES` the op accepts, then non-contiguous inputs.

    `dims` lists the kinds of dim argument the op takes; ops without an `identity` cannot reduce
    zero-size dims.
    """
    for shape, dim, keep in REDUCTION_CASES:
        if _dim_kind(dim) not in dims or (not identity and _reduces_zero_size(shape, dim)):
            continue
        x = make(shape, dtype, device)
        if dim is NO_DIM:
            yield SampleInput(x)
        else:
            yield SampleInput(x, dim, keepdim=keep)
    int_dim = "int" in dims
    yield SampleInput(transposed((3, 4), dtype, device), *((1,) if int_dim else ()))
    yield SampleInput(strided((2, 3, 4), dtype, device), *((-1,) if int_dim else ()))


def var_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """The reduction cases with the default correction, then each way of choosing another one."""
    yield from reduction_samples(dtype, device)
    x = make((3, 4), dtype, device)
    yield SampleInput(x, 1, correction=0)
    yield SampleInput(x, (0, 1), correction=2, keepdim=True)
    yield SampleInput(x, None, correction=0)
    yield SampleInput(x, 0, unbiased=False)
    yield SampleInput(x, unbiased=False)


def dim_errors(tuple_dims: bool = True) -> Iterable[ErrorInput]:
    """Dims out of range, and a bad tuple of dims: repeated, or not accepted at all."""
    x = cpu((3, 4))
    yield ErrorInput(SampleInput(x, 2), IndexError)
    yield ErrorInput(SampleInput(cpu(()), 1), IndexError)
    if tuple_dims:
        yield ErrorInput(SampleInput(x, (0, -2)), RuntimeError)  # one dim named twice
    else:
        yield ErrorInput(SampleInput(x, (0, 1)), TypeError)


def rejects_int() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4), torch.int64), 1), NotImplementedError)


def empty_dim_error() -> Iterable[ErrorInput]:
    """Reducing a zero-size dim has no result when the reduction has no identity."""
    yield ErrorInput(SampleInput(cpu((0, 3)), 0), IndexError)


def empty_full_error(exc_type: type[Exception]):
    def errors() -> Iterable[ErrorInput]:
        yield ErrorInput(SampleInput(cpu((0, 3))), exc_type)

    return errors


def rejects_bool() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4), torch.bool)), NotImplementedError)


def _max_values(x, dim, keepdim=False):
    return x.max(dim, keepdim=keepdim).values


INT_DIM_ERRORS = partial(dim_errors, tuple_dims=False)
FLOAT_ONLY_ERRORS = chain_errors(dim_errors, rejects_int)
DIM_SAMPLES = partial(reduction_samples, dims=frozenset({"int"}), identity=False)

OPS = [
    # sum of integers and bools accumulates in int64.
    OpInfo("sum", torch.sum, reduction_samples, dim_errors, ALL, tolerances=ACCUMULATING),
    OpInfo(
        "sum",
        torch.sum,
        with_kwargs(reduction_samples, dtype=torch.float64),
        dtypes=NUMERIC,
        variant="dtype",
        tolerances=ACCUMULATING,
    ),
    OpInfo("mean", torch.mean, reduction_samples, FLOAT_ONLY_ERRORS, tolerances=ACCUMULATING),
    OpInfo("var", torch.var, var_samples, FLOAT_ONLY_ERRORS, tolerances=ACCUMULATING),
    OpInfo("std", torch.std, var_samples, FLOAT_ONLY_ERRORS, tolerances=ACCUMULATING),
    OpInfo(
        "amax",
        torch.amax,
        partial(reduction_samples, identity=False),
        chain_errors(dim_errors, empty_dim_error, empty_full_error(RuntimeError)),
        ALL,
    ),
    OpInfo(
        "max",
        torch.max,
        partial(reduction_samples, dims=frozenset({"omitted"}), identity=False),
        empty_full_error(RuntimeError),
        ALL,
        variant="full",
    ),
    # max along a dim returns (values, indices); indices point at the first maximum.
    OpInfo("max", torch.max, DIM_SAMPLES, chain_errors(INT_DIM_ERRORS, empty_dim_error), ALL, variant="dim"),
    OpInfo("max", _max_values, DIM_SAMPLES, dtypes=FLOATS, variant="dim_values"),
    OpInfo(
        "argmax",
        torch.argmax,
        partial(reduction_samples, dims=frozenset({"omitted", "None", "int"}), identity=False),
        chain_errors(INT_DIM_ERRORS, empty_full_error(IndexError), rejects_bool),
        NUMERIC,
        supports_grad=False,
    ),
]
