"""Reductions: sum, prod, mean, var, std (and their _mean forms), amax/amin, max/min (full, along a dim
and elementwise), argmax/argmin, all/any, count_nonzero, logsumexp."""

from __future__ import annotations

from collections.abc import Iterable
import math
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


def count_nonzero_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """count_nonzero takes no keepdim: every dim, one, a tuple, on each layout; zeros are common."""
    x = make((3, 4), dtype, device, low=-1, high=2) if dtype != torch.bool else make((3, 4), dtype, device)
    x = x.round() if dtype.is_floating_point else x
    yield SampleInput(x)
    yield SampleInput(x, 0)
    yield SampleInput(x, (-1, 0))
    yield SampleInput(x, ())
    yield SampleInput(make((), dtype, device))
    yield SampleInput(make((), dtype, device), 0)
    yield SampleInput(make((0, 3), dtype, device), 1)
    yield SampleInput(transposed((3, 4), dtype, device), 1)
    yield SampleInput(strided((2, 3, 4), dtype, device), (0, 2))


def logsumexp_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """The reductions with a dim, then large and infinite values (the shift by the maximum)."""
    # Eager's logsumexp rejects an empty tuple of dims, which other reductions read as every dim.
    for sample in reduction_samples(dtype, device, dims=frozenset({"int", "tuple"})):
        if sample.args[1:] != ((),):
            yield sample
    big = torch.tensor([[1e3, 1e3 - 1, -1e3], [-math.inf, -math.inf, -math.inf], [math.inf, 0, 1]], device=device)
    yield SampleInput(big.to(dtype), 1)


def _min_values(x, dim, keepdim=False):
    return x.min(dim, keepdim=keepdim).values


def _elementwise_min(a, b):
    return torch.min(a, b)


def elementwise_extremum_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """torch.max/min of two tensors: equal shapes, broadcasting, 0-dim, empty, non-contiguous."""
    for lhs, rhs in (((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)), ((), (3, 4)), ((0, 3), (3,))):
        yield SampleInput(make(lhs, dtype, device), make(rhs, dtype, device))
    yield SampleInput(transposed((3, 4), dtype, device), strided((3, 4), dtype, device))


def _max_values(x, dim, keepdim=False):
    return x.max(dim, keepdim=keepdim).values


INT_DIM_ERRORS = partial(dim_errors, tuple_dims=False)
PROD_SAMPLES = partial(reduction_samples, dims=frozenset({"omitted", "int"}))
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
    # prod takes one int dim (or none); integers and bools multiply in int64.
    OpInfo("prod", torch.prod, PROD_SAMPLES, INT_DIM_ERRORS, ALL, tolerances=ACCUMULATING),
    OpInfo(
        "prod",
        torch.prod,
        with_kwargs(PROD_SAMPLES, dtype=torch.float64),
        dtypes=NUMERIC,
        variant="dtype",
        tolerances=ACCUMULATING,
    ),
    OpInfo("mean", torch.mean, reduction_samples, FLOAT_ONLY_ERRORS, tolerances=ACCUMULATING),
    OpInfo("var", torch.var, var_samples, FLOAT_ONLY_ERRORS, tolerances=ACCUMULATING),
    OpInfo("std", torch.std, var_samples, FLOAT_ONLY_ERRORS, tolerances=ACCUMULATING),
    OpInfo("var_mean", torch.var_mean, var_samples, FLOAT_ONLY_ERRORS, tolerances=ACCUMULATING),
    OpInfo("std_mean", torch.std_mean, var_samples, FLOAT_ONLY_ERRORS, tolerances=ACCUMULATING),
    *(
        OpInfo(
            name,
            getattr(torch, name),
            partial(reduction_samples, identity=False),
            chain_errors(dim_errors, empty_dim_error, empty_full_error(RuntimeError)),
            ALL,
        )
        for name in ("amax", "amin")
    ),
    OpInfo(
        "max",
        torch.max,
        partial(reduction_samples, dims=frozenset({"omitted"}), identity=False),
        empty_full_error(RuntimeError),
        ALL,
        variant="full",
    ),
    OpInfo(
        "min",
        torch.min,
        partial(reduction_samples, dims=frozenset({"omitted"}), identity=False),
        empty_full_error(RuntimeError),
        ALL,
        variant="full",
    ),
    # max/min along a dim return (values, indices); indices point at the first extremum.
    OpInfo("max", torch.max, DIM_SAMPLES, chain_errors(INT_DIM_ERRORS, empty_dim_error), ALL, variant="dim"),
    OpInfo("max", _max_values, DIM_SAMPLES, dtypes=FLOATS, variant="dim_values"),
    OpInfo("min", torch.min, DIM_SAMPLES, chain_errors(INT_DIM_ERRORS, empty_dim_error), ALL, variant="dim"),
    OpInfo("min", _min_values, DIM_SAMPLES, dtypes=FLOATS, variant="dim_values"),
    OpInfo("min", _elementwise_min, elementwise_extremum_samples, dtypes=ALL, variant="elementwise"),
    *(
        OpInfo(
            name,
            getattr(torch, name),
            partial(reduction_samples, dims=frozenset({"omitted", "None", "int"}), identity=False),
            chain_errors(INT_DIM_ERRORS, empty_full_error(IndexError), rejects_bool),
            NUMERIC,
            supports_grad=False,
        )
        for name in ("argmax", "argmin")
    ),
    # all/any give bool (uint8 for uint8 input) whatever the input dtype, and have an identity.
    *(
        OpInfo(name, getattr(torch, name), reduction_samples, dim_errors, ALL, supports_grad=False)
        for name in ("all", "any")
    ),
    OpInfo("count_nonzero", torch.count_nonzero, count_nonzero_samples, dim_errors, ALL, supports_grad=False),
    OpInfo("logsumexp", torch.logsumexp, logsumexp_samples, dim_errors, NUMERIC, tolerances=ACCUMULATING),
]


def segment_reduce_samples(dtype, device) -> Iterable[SampleInput]:
    """Each reduction by lengths (with an empty segment) and offsets (positions outside every
    segment), with and without an initial value; a 2-D axis of per-row lengths, a transposed input,
    unsafe lengths that leave positions out, and no data."""
    if not dtype.is_floating_point:
        return
    lengths = torch.tensor([2, 0, 3, 1], device=device)
    offsets = torch.tensor([1, 1, 3, 5], device=device)
    for reduce in ("sum", "mean", "max", "min", "prod", "amax"):
        for initial in (None, 2.0):
            yield SampleInput(make((6,), dtype, device), reduce, lengths=lengths, initial=initial)
            yield SampleInput(make((6, 3), dtype, device), reduce, offsets=offsets, initial=initial)
    rows = torch.tensor([[2, 0, 2], [4, 0, 0], [1, 1, 2]], device=device)
    yield SampleInput(make((3, 4, 2), dtype, device), "mean", lengths=rows, axis=1)
    per_row = torch.tensor([[2, 4], [6, 0], [1, 5], [3, 3]], device=device)
    yield SampleInput(transposed((4, 6), dtype, device), "sum", lengths=per_row, axis=-1)
    yield SampleInput(make((6,), dtype, device), "max", lengths=torch.tensor([1, 2], device=device), unsafe=True)
    yield SampleInput(make((0, 2), dtype, device), "mean", lengths=torch.tensor([0, 0], device=device))


def segment_reduce_errors() -> Iterable[ErrorInput]:
    lengths = torch.tensor([1, 2, 2])
    yield ErrorInput(SampleInput(cpu((5,)), "median", lengths=lengths), RuntimeError, match="reduce")
    yield ErrorInput(SampleInput(cpu((5,)), "sum"), RuntimeError, match="lengths or offsets")
    yield ErrorInput(SampleInput(cpu((5,)), "sum", lengths=lengths, axis=1), IndexError, match="out of range")
    yield ErrorInput(SampleInput(cpu((5,)), "sum", lengths=lengths.float()), NotImplementedError, match="lengths")
    yield ErrorInput(SampleInput(cpu((5,), torch.int64), "sum", lengths=lengths), NotImplementedError, match="data")
    yield ErrorInput(SampleInput(cpu((5,)), "sum", lengths=torch.tensor([[1, 2, 2]])), RuntimeError, match="dims")
    yield ErrorInput(SampleInput(cpu((5,)), "sum", lengths=torch.tensor([1, 2, 3])), RuntimeError, match="sum to")
    yield ErrorInput(SampleInput(cpu((5,)), "sum", lengths=torch.tensor([1, -1, 5])), RuntimeError, match="negative")
    yield ErrorInput(
        SampleInput(cpu((5,)), "sum", offsets=torch.tensor([0, 3, 2])), RuntimeError, match="segment_length"
    )
    yield ErrorInput(
        SampleInput(cpu((5,), torch.float16), "sum", lengths=lengths, initial=1e6), RuntimeError, match="overflow"
    )


OPS.append(OpInfo("segment_reduce", torch.segment_reduce, segment_reduce_samples, segment_reduce_errors, FLOATS))
