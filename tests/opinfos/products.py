"""Products built on matmul: addmv, addbmm, addr, vdot, tensordot, einsum, cross, linalg.cross,
linalg.vecdot, linalg.multi_dot, linalg.matrix_power, linalg.vander, vander, and the weight-gradient
product view folding makes (``ltorch.flattened_product``, through the torch function it runs)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from thunder_rs.torch.linalg import _flattened_mm

from .core import (
    ACCUMULATING,
    ALL,
    FLOATS,
    NUMERIC,
    ErrorInput,
    OpInfo,
    SampleInput,
    Strided,
    Transposed,
    cpu,
    make,
    tensor,
)

LA = torch.linalg


def specs(*rows) -> Callable:
    """Samples from rows of tensor specs, then keyword arguments as a trailing dict."""

    def generate(dtype, device) -> Iterable[SampleInput]:
        for row in rows:
            tensors, kwargs = (row[:-1], row[-1]) if isinstance(row[-1], dict) else (row, {})
            yield SampleInput(*(tensor(s, dtype, device) for s in tensors), **kwargs)

    return generate


ADDMV = specs(
    ((3,), (3, 4), (4,)),
    ((1,), (3, 4), (4,)),
    ((), (3, 4), Strided((4,))),
    ((3,), Transposed((3, 4)), (4,), {"beta": 2, "alpha": 3}),
    ((0,), (0, 4), (4,)),
    ((3,), (3, 0), (0,)),
)
ADDBMM = specs(
    ((3, 5), (2, 3, 4), (2, 4, 5)),
    ((5,), (2, 3, 4), (2, 4, 5), {"beta": 0}),
    ((3, 5), (0, 3, 4), (0, 4, 5)),
    ((3, 1), Transposed((2, 3, 4)), (2, 4, 5), {"alpha": 2}),
)
ADDR = specs(
    ((3, 4), (3,), (4,)),
    ((4,), (3,), (4,)),
    ((), Strided((3,)), (4,)),
    ((3, 4), (3,), (4,), {"beta": 2, "alpha": 3}),
    ((0, 4), (0,), (4,)),
    (Transposed((3, 4)), (3,), (4,), {"beta": 0}),
)
FLATTENED = specs(
    ((4, 8, 3), (4, 8, 5)),
    ((2, 3, 4, 6), (2, 3, 4, 2)),
    ((6, 3), (6, 5)),
    ((0, 8, 3), (0, 8, 5)),
    (Transposed((3, 5, 4)), (3, 5, 2)),
    ((2, 4, 3), Strided((2, 4, 5))),
)
VDOT = specs(((4,), (4,)), ((0,), (0,)), (Strided((4,)), (4,)))
CROSS = specs(
    ((3,), (3,)),
    ((2, 3), (1, 3)),
    ((4, 3), (4, 3), {"dim": -1}),
    ((3, 2), (3, 2), {"dim": 0}),
    (Transposed((3, 3)), (3, 3)),
    ((0, 3), (0, 3)),
)
LINALG_CROSS = specs(
    ((3,), (3,)), ((2, 3), (1, 3)), ((3, 2), (3, 2), {"dim": 0}), (Transposed((2, 3)), (2, 3)), ((0, 3), (0, 3))
)
VECDOT = specs(
    ((3,), (3,)), ((2, 3), (1, 3)), ((3, 2), (3, 2), {"dim": 0}), ((2, 0), (2, 0)), (Transposed((2, 3)), (2, 3))
)


def tensordot_samples(dtype, device) -> Iterable[SampleInput]:
    def t(spec):
        return tensor(spec, dtype, device)

    yield SampleInput(t((3, 4)), t((4, 5)), 1)
    yield SampleInput(t((3, 4, 5)), t((4, 5, 2)))
    yield SampleInput(t((3, 4, 5)), t((4, 3, 2)), ([1, 0], [0, 1]))
    yield SampleInput(t((3, 4)), t((5, 6)), 0)
    yield SampleInput(t(Transposed((3, 4))), t((4, 2)), dims=([1], [0]))
    yield SampleInput(t((0, 4)), t((4, 2)), 1)
    yield SampleInput(t((1, 1, 1)), t((2, 1, 2)), dims=([0, 1], [2, 0]))  # size 1 against 2: summed first


EINSUM_CASES = (
    ("ij,jk->ik", (3, 4), (4, 5)),
    ("ij,jk", (3, 4), (4, 5)),
    ("ii->i", (3, 3)),
    ("ii", (3, 3)),
    ("ij->", (3, 4)),
    ("ij->ji", Transposed((3, 4))),
    ("i,j->ij", (3,), Strided((4,))),
    ("bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
    ("...ij,...jk->...ik", (2, 3, 4), (4, 5)),
    ("bn,anm,bm->ba", (2, 3), (4, 3, 5), (2, 5)),
    ("ij,ij->i", (3, 1), (3, 4)),
    ("i,i->", (0,), (0,)),
    ("iij->j", (2, 2, 3)),
    ("i j , j k -> i k", (3, 4), (4, 2)),
)


def einsum_samples(dtype, device) -> Iterable[SampleInput]:
    for equation, *shapes in EINSUM_CASES:
        yield SampleInput(equation, *(tensor(s, dtype, device) for s in shapes))
    yield SampleInput("ij,jk", [tensor((3, 4), dtype, device), tensor((4, 2), dtype, device)])
    yield SampleInput(tensor((3, 4), dtype, device), [0, 1], tensor((4, 2), dtype, device), [1, 2], [0, 2])
    yield SampleInput(tensor((2, 3, 4), dtype, device), [Ellipsis, 1])


def einsum_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput("ij,jk->ik", cpu((3, 4)), cpu((5, 2))), RuntimeError)
    yield ErrorInput(SampleInput("ij->ik", cpu((3, 4))), RuntimeError)
    yield ErrorInput(SampleInput("ijk->i", cpu((3, 4))), RuntimeError)
    yield ErrorInput(SampleInput("ij,jk", cpu((3, 4)), cpu((4, 2), torch.float64)), RuntimeError)
    yield ErrorInput(SampleInput("ij,jk", cpu((3, 4))), RuntimeError)


def multi_dot_samples(dtype, device) -> Iterable[SampleInput]:
    def t(spec):
        return tensor(spec, dtype, device)

    yield SampleInput([t((3, 4)), t((4, 5))])
    yield SampleInput([t((3,)), t((3, 5)), t((5, 2))])
    yield SampleInput([t((10, 2)), t((2, 10)), t((10, 3))])
    yield SampleInput([t((3, 4)), t((4, 5)), t((5, 2)), t((2,))])
    yield SampleInput([t((4,)), t((4,))])
    yield SampleInput([t(Transposed((3, 4))), t((4, 0)), t((0, 2)), t((2, 6)), t((6, 1))])


def multi_dot_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput([cpu((3, 4))]), RuntimeError)
    yield ErrorInput(SampleInput([cpu((3, 4)), cpu((5, 2))]), RuntimeError)
    yield ErrorInput(SampleInput([cpu((3, 4)), cpu((2, 4, 2))]), RuntimeError)
    yield ErrorInput(SampleInput([cpu((3, 4)), cpu((4, 2), torch.float64)]), RuntimeError)


def matrix_power_samples(dtype, device) -> Iterable[SampleInput]:
    a = make((2, 3, 3), dtype, device, low=-1, high=1)
    for n in (0, 1, 2, 3, 6, 7):
        yield SampleInput(a, n)
    yield SampleInput(make((3, 3), dtype, device, low=-1, high=1).mT, 4)
    yield SampleInput(make((0, 2, 2), dtype, device), 3)
    if dtype.is_floating_point:
        yield SampleInput(
            make((3, 3), dtype, device, low=-1, high=1) + 3 * torch.eye(3, dtype=dtype, device=device), -2
        )


def matrix_power_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 3), torch.int64), -1), NotImplementedError)


def vander_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((4,), dtype, device, low=-2, high=2))
    yield SampleInput(make((2, 3), dtype, device, low=-2, high=2), N=5)
    yield SampleInput(make((4,), dtype, device, low=-2, high=2), N=2)
    yield SampleInput(make((0, 3), dtype, device))
    yield SampleInput(make((3, 4), dtype, device, low=-2, high=2, noncontiguous=True))
    yield SampleInput(make((), dtype, device, low=-2, high=2), N=3)


def vander_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), N=1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,), torch.bool)), NotImplementedError)


def torch_vander_samples(dtype, device) -> Iterable[SampleInput]:
    # (eager's backward of torch.vander fails: its cumprod writes into a result autograd saved)
    yield SampleInput(make((4,), dtype, device, low=-2, high=2))
    yield SampleInput(make((3,), dtype, device, low=-2, high=2), N=5, increasing=True)
    yield SampleInput(make((4,), dtype, device, low=-2, high=2, noncontiguous=True), 2)
    yield SampleInput(make((3,), dtype, device), N=1)
    yield SampleInput(make((3,), dtype, device), N=0)
    yield SampleInput(make((0,), dtype, device), N=3)


def torch_vander_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 2))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), N=-1), RuntimeError)


def same_dtype_errors(*shapes) -> Callable[[], Iterable[ErrorInput]]:
    """Mixed dtypes (products do not promote) and mismatched sizes (the last operand one longer)."""

    def errors() -> Iterable[ErrorInput]:
        yield ErrorInput(SampleInput(*(cpu(s) for s in shapes[:-1]), cpu(shapes[-1], torch.float64)), RuntimeError)
        yield ErrorInput(
            SampleInput(*(cpu(s) for s in shapes[:-1]), cpu((*shapes[-1][:-1], shapes[-1][-1] + 1))), RuntimeError
        )

    return errors


def cross_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 4)), cpu((2, 4)), dim=1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,), torch.float64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3)), cpu((3,))), RuntimeError)


def addr_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 5)), cpu((3,)), cpu((4,))), RuntimeError)
    yield ErrorInput(
        SampleInput(cpu((3, 4), torch.int64), cpu((3,), torch.int64), cpu((4,), torch.int64), alpha=0.5), RuntimeError
    )


def vecdot_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,), torch.int64), cpu((3,), torch.int64)), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,), torch.float64)), RuntimeError)


OPS = [
    OpInfo("addmv", torch.addmv, ADDMV, same_dtype_errors((3,), (3, 4), (4,)), NUMERIC, tolerances=ACCUMULATING),
    OpInfo(
        "addbmm",
        torch.addbmm,
        ADDBMM,
        same_dtype_errors((3, 5), (2, 3, 4), (2, 4, 5)),
        NUMERIC,
        tolerances=ACCUMULATING,
    ),
    OpInfo("addr", torch.addr, ADDR, addr_errors, ALL),
    OpInfo("flattened_product", _flattened_mm, FLATTENED, dtypes=NUMERIC, tolerances=ACCUMULATING),
    OpInfo("vdot", torch.vdot, VDOT, same_dtype_errors((4,), (4,)), NUMERIC, tolerances=ACCUMULATING),
    OpInfo(
        "tensordot",
        torch.tensordot,
        tensordot_samples,
        same_dtype_errors((3, 4), (4, 5)),
        NUMERIC,
        tolerances=ACCUMULATING,
    ),
    OpInfo("einsum", torch.einsum, einsum_samples, einsum_errors, NUMERIC, tolerances=ACCUMULATING),
    OpInfo("cross", torch.cross, CROSS, cross_errors, NUMERIC),
    OpInfo("linalg_cross", LA.cross, LINALG_CROSS, cross_errors, NUMERIC),
    OpInfo("linalg_vecdot", LA.vecdot, VECDOT, vecdot_errors, FLOATS, tolerances=ACCUMULATING),
    OpInfo("linalg_multi_dot", LA.multi_dot, multi_dot_samples, multi_dot_errors, NUMERIC, tolerances=ACCUMULATING),
    OpInfo(
        "linalg_matrix_power",
        LA.matrix_power,
        matrix_power_samples,
        matrix_power_errors,
        NUMERIC,
        tolerances=ACCUMULATING,
    ),
    OpInfo("linalg_vander", LA.vander, vander_samples, vander_errors, NUMERIC),
    OpInfo("vander", torch.vander, torch_vander_samples, torch_vander_errors, ALL, supports_grad=False),
]
