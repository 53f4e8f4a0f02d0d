"""Matrix products: matmul (and `@`), bmm, mm, mv, dot, inner, outer, addmm, baddbmm, linear."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from .core import ACCUMULATING, ALL, NUMERIC, ErrorInput, OpInfo, SampleInput, Strided, Transposed, cpu, tensor
from .random import seeded

# matmul's cases by rank: 1-D·1-D is a dot product, a 1-D operand gains and loses a dim, batch dims
# broadcast, and an empty inner dim gives zeros.
MATMUL_SHAPES = (
    ((4,), (4,)),
    ((3, 4), (4,)),
    ((4,), (4, 5)),
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),
    ((4,), (2, 4, 5)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (3, 4, 5)),
    ((0, 4), (4, 5)),
    ((3, 0), (0, 5)),
    (Transposed((3, 4)), Transposed((4, 5))),
)

BMM_SHAPES = (
    ((2, 3, 4), (2, 4, 5)),
    ((0, 3, 4), (0, 4, 5)),
    ((2, 3, 0), (2, 0, 5)),
    (Transposed((2, 3, 4)), (2, 4, 5)),
)


MM_SHAPES = (((3, 4), (4, 5)), ((0, 4), (4, 5)), ((3, 0), (0, 5)), (Transposed((3, 4)), Transposed((4, 5))))
MV_SHAPES = (((3, 4), (4,)), ((0, 4), (4,)), ((3, 0), (0,)), (Transposed((3, 4)), Strided((4,))))
DOT_SHAPES = (((4,), (4,)), ((0,), (0,)), (Strided((4,)), (4,)))
# inner contracts the last dims of any ranks; a 0-dim operand makes it a product.
INNER_SHAPES = (((4,), (4,)), ((2, 3), (5, 4, 3)), ((), (3, 4)), ((2, 0), (3, 0)), (Transposed((3, 4)), (2, 4)))
OUTER_SHAPES = (((3,), (4,)), ((0,), (4,)), (Strided((3,)), (4,)))


def pair_samples(shapes):
    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for a, b in shapes:
            yield SampleInput(tensor(a, dtype, device), tensor(b, dtype, device))

    return generate


def matmul_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3)), cpu((4, 2))), RuntimeError)
    yield ErrorInput(SampleInput(cpu(()), cpu((2,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3)), cpu((3, 2), torch.float64)), RuntimeError)  # no type promotion
    yield ErrorInput(SampleInput(cpu((2, 3), torch.bool), cpu((3, 2), torch.bool)), NotImplementedError)


def bmm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3)), cpu((3, 2))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 2, 3)), cpu((3, 3, 2))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 2, 3)), cpu((2, 4, 2))), RuntimeError)


def product_errors(a_shape, b_shape) -> Callable[[], Iterable[ErrorInput]]:
    """A shape mismatch, a dtype mismatch (products never promote) and a rank the op does not take."""

    def errors() -> Iterable[ErrorInput]:
        bad_b = (*b_shape[:-1], b_shape[-1] + 1) if len(b_shape) == 1 else (*b_shape[:-2], b_shape[-2] + 1, b_shape[-1])
        yield ErrorInput(SampleInput(cpu(a_shape), cpu(bad_b)), RuntimeError)
        yield ErrorInput(SampleInput(cpu(a_shape), cpu(b_shape, torch.float64)), RuntimeError)
        yield ErrorInput(SampleInput(cpu((2, *a_shape)), cpu(b_shape)), RuntimeError)

    return errors


def outer_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 1)), cpu((4,))), RuntimeError)


def inner_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3)), cpu((2, 4))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,), torch.float64)), RuntimeError)


def add_product_samples(input_shapes, a_shape, b_shape):
    """addmm/baddbmm: inputs that broadcast to the product, and integer-valued beta and alpha."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        a, b = tensor(a_shape, dtype, device), tensor(b_shape, dtype, device)
        for shape in input_shapes:
            yield SampleInput(tensor(shape, dtype, device), a, b)
        yield SampleInput(tensor(input_shapes[0], dtype, device), a, b, beta=2, alpha=3)
        if dtype.is_floating_point:  # beta=0 ignores the input, NaN included
            yield SampleInput(torch.full(input_shapes[0], math.nan, dtype=dtype, device=device), a, b, beta=0)
        yield SampleInput(tensor(input_shapes[0], dtype, device), tensor(Transposed(a_shape), dtype, device), b)

    return generate


def add_product_errors(input_shape, a_shape, b_shape) -> Callable[[], Iterable[ErrorInput]]:
    def errors() -> Iterable[ErrorInput]:
        yield ErrorInput(SampleInput(cpu(input_shape, torch.float64), cpu(a_shape), cpu(b_shape)), RuntimeError)
        yield ErrorInput(SampleInput(cpu((7,)), cpu(a_shape), cpu(b_shape)), RuntimeError)

    return errors


def linear_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def t(spec):
        return tensor(spec, dtype, device)

    yield SampleInput(t((4,)), t((3, 4)))
    yield SampleInput(t((2, 4)), t((3, 4)), t((3,)))
    yield SampleInput(t((2, 5, 4)), t((3, 4)), t((3,)))
    yield SampleInput(t((2, 4)), t((3, 4)), bias=None)
    yield SampleInput(t((0, 4)), t((3, 4)), t((3,)))
    yield SampleInput(t((2, 4)), t(Transposed((3, 4))), t((3,)))  # a weight stored transposed
    yield SampleInput(t((2, 4)), t((4,)))  # a 1-D weight gives a dot product per row


def linear_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((5, 3))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((5, 4)), cpu((4,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu(()), cpu((1, 1))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((5, 4), torch.float64)), RuntimeError)


def _rmatmul(a, b):
    """``a @ b`` as Python runs it when ``a`` has no ``__matmul__`` for ``b``: ``b.__rmatmul__(a)``."""
    return b.__rmatmul__(a)


OPS = [
    OpInfo("matmul", torch.matmul, pair_samples(MATMUL_SHAPES), matmul_errors, NUMERIC, tolerances=ACCUMULATING),
    OpInfo(
        "matmul",
        operator.matmul,
        pair_samples(MATMUL_SHAPES),
        matmul_errors,
        NUMERIC,
        variant="operator",
        tolerances=ACCUMULATING,
    ),
    OpInfo("rmatmul", _rmatmul, pair_samples(MATMUL_SHAPES), matmul_errors, NUMERIC, tolerances=ACCUMULATING),
    OpInfo("bmm", torch.bmm, pair_samples(BMM_SHAPES), bmm_errors, NUMERIC, tolerances=ACCUMULATING),
    OpInfo("mm", torch.mm, pair_samples(MM_SHAPES), product_errors((3, 4), (4, 5)), NUMERIC, tolerances=ACCUMULATING),
    OpInfo("mv", torch.mv, pair_samples(MV_SHAPES), product_errors((3, 4), (4,)), NUMERIC, tolerances=ACCUMULATING),
    OpInfo("dot", torch.dot, pair_samples(DOT_SHAPES), product_errors((4,), (4,)), NUMERIC, tolerances=ACCUMULATING),
    OpInfo("inner", torch.inner, pair_samples(INNER_SHAPES), inner_errors, NUMERIC, tolerances=ACCUMULATING),
    OpInfo("outer", torch.outer, pair_samples(OUTER_SHAPES), outer_errors, ALL),
    OpInfo(
        "addmm",
        torch.addmm,
        add_product_samples(((3, 5), (5,), (3, 1)), (3, 4), (4, 5)),
        add_product_errors((3, 5), (3, 4), (4, 5)),
        NUMERIC,
        tolerances=ACCUMULATING,
    ),
    OpInfo(
        "baddbmm",
        torch.baddbmm,
        add_product_samples(((2, 3, 5), (3, 5), (1, 3, 1)), (2, 3, 4), (2, 4, 5)),
        add_product_errors((2, 3, 5), (2, 3, 4), (2, 4, 5)),
        NUMERIC,
        tolerances=ACCUMULATING,
    ),
    OpInfo("linear", F.linear, linear_samples, linear_errors, NUMERIC, tolerances=ACCUMULATING),
]


def lowrank_samples(dtype, device) -> Iterable[SampleInput]:
    """Tall, wide (taken transposed), batched and transposed inputs, a mean matrix, no power
    iteration."""
    yield SampleInput(tensor((7, 5), dtype, device), q=3)
    yield SampleInput(tensor((2, 4, 6), dtype, device), 2, niter=1)
    yield SampleInput(tensor(Transposed((6, 5)), dtype, device), q=4, niter=0)


def svd_lowrank_samples(dtype, device) -> Iterable[SampleInput]:
    yield from lowrank_samples(dtype, device)
    yield SampleInput(tensor((2, 7, 5), dtype, device), 3, M=tensor((7, 5), dtype, device))


def pca_lowrank_samples(dtype, device) -> Iterable[SampleInput]:
    yield from lowrank_samples(dtype, device)
    yield SampleInput(tensor((8, 5), dtype, device), center=False)


def pca_lowrank_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((5, 4)), q=5), ValueError)
    yield ErrorInput(SampleInput(cpu((5, 4)), niter=-1), ValueError)


OPS += [
    OpInfo("svd_lowrank", seeded(torch.svd_lowrank), svd_lowrank_samples, tolerances=ACCUMULATING),
    OpInfo("pca_lowrank", seeded(torch.pca_lowrank), pca_lowrank_samples, pca_lowrank_errors, tolerances=ACCUMULATING),
]
