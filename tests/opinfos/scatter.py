"""Scatters and index writes: scatter, scatter_reduce, index_reduce, index_copy, index_fill,
index_put, assignment where a boolean mask is, put, take, fill, and as_strided of inputs with an
explicit storage offset.

Writes without reduction use indices without repeats (eager leaves the written value undefined
where they repeat); reductions repeat them on purpose, with ties and zeros in the values so
that the gradients' conventions at ties (shared evenly) and zeros (exact products) are tested.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .core import ALL, FLOATS, NUMERIC, ErrorInput, OpInfo, SampleInput, Transposed, cpu, make, tensor, transposed

REPEATED = ((0, 1, 0), (2, 2, 1))  # along dim 1 of a (2, 4) tensor


def _index(rows, device):
    return torch.tensor(rows, dtype=torch.int64, device=device)


def _ties(dtype, device, shape, values):
    """A tensor of `shape` holding `values` (repeated values: ties for the extrema, zeros for prod)."""
    return torch.tensor(values, device=device).to(dtype).reshape(shape)


def scatter_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    a, src = make((2, 4), dtype, device), make((2, 3), dtype, device)
    yield SampleInput(a, 1, _index(((3, 0, 1), (2, 1, 0)), device), src)
    yield SampleInput(
        make((3, 2), dtype, device), 0, _index(((2, 0),), device), make((2, 2), dtype, device)
    )  # src larger
    yield SampleInput(a, -1, _index(((1,), (3,)), device), value=1)
    yield SampleInput(make((), dtype, device), 0, _index(0, device), make((), dtype, device))
    yield SampleInput(
        make((0, 3), dtype, device), 0, torch.zeros(0, 3, dtype=torch.int64, device=device), make((0, 3), dtype, device)
    )
    yield SampleInput(tensor(Transposed((4, 2)), dtype, device), 0, _index(((3, 0), (1, 2)), device), src.mT[:2])
    if dtype != torch.bool:
        yield SampleInput(a, 1, _index(REPEATED, device), src, reduce="add")
        yield SampleInput(a, 1, _index(REPEATED, device), src, reduce="multiply")
    # An empty index: eager checks no shapes against it (larger than the input and than src here).
    empty = torch.zeros(0, 6, dtype=torch.int64, device=device)
    yield SampleInput(a, 0, empty, make((0, 5), dtype, device))
    yield SampleInput(a, 0, empty, value=2)


def scatter_errors() -> Iterable[ErrorInput]:
    idx = torch.tensor([[0, 1]])
    yield ErrorInput(SampleInput(cpu((2, 4)), 1, idx.float(), cpu((1, 2))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 4)), 1, idx, cpu((1, 2), torch.float64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 4)), 1, torch.tensor([[[0]]]), cpu((1, 1, 1))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 4)), 1, torch.zeros(3, 1, dtype=torch.int64), cpu((3, 1))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 4)), 1, idx, cpu((1, 2)), reduce="max"), RuntimeError)


def scatter_reduce_samples(reduce: str):
    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for include_self in (True, False):
            a = _ties(dtype, device, (2, 4), (1, 0, 2, 5, 0, 3, 3, 1))
            src = _ties(dtype, device, (2, 3), (1, 2, 1, 3, 3, 0))
            yield SampleInput(a, 1, _index(REPEATED, device), src, reduce, include_self=include_self)
            yield SampleInput(
                make((2, 4), dtype, device),
                1,
                _index(REPEATED, device),
                make((2, 3), dtype, device),
                reduce,
                include_self=include_self,
            )
        yield SampleInput(
            make((4, 3), dtype, device), 0, _index(((0, 3, 0), (0, 0, 2)), device), make((2, 3), dtype, device), reduce
        )
        yield SampleInput(make((3,), dtype, device), 0, _index((2, 2, 0, 2), device), make((5,), dtype, device), reduce)
        yield SampleInput(
            tensor(Transposed((2, 4)), dtype, device),
            -1,
            _index(REPEATED, device),
            make((2, 3), dtype, device),
            reduce,
            include_self=False,
        )
        empty = torch.zeros(0, 6, dtype=torch.int64, device=device)  # eager checks no shapes against it
        yield SampleInput(make((2, 4), dtype, device), 0, empty, make((0, 5), dtype, device), reduce)

    return generate


def scatter_reduce_errors() -> Iterable[ErrorInput]:
    idx = torch.tensor([[0, 1]])
    yield ErrorInput(SampleInput(cpu((2, 4)), 1, idx, cpu((1, 2)), "add"), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 4)), 1, idx, cpu((1, 2), torch.float64), "sum"), RuntimeError)


def index_reduce_samples(reduce: str):
    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for include_self in (True, False):
            a = _ties(dtype, device, (4, 2), (1, 0, 2, 5, 0, 3, 3, 1))
            src = _ties(dtype, device, (3, 2), (1, 2, 1, 3, 3, 0))
            yield SampleInput(a, 0, _index((0, 2, 0), device), src, reduce, include_self=include_self)
        yield SampleInput(
            make((2, 4), dtype, device), 1, _index((3, 1, 0), device), make((2, 3), dtype, device), reduce
        )
        yield SampleInput(make((), dtype, device), 0, _index((0,), device), make((), dtype, device), reduce)

    return generate


def index_reduce_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((4, 2)), 0, torch.tensor([0, 1]), cpu((2, 2)), "sum"), RuntimeError)
    yield ErrorInput(SampleInput(cpu((4, 2)), 0, torch.tensor([0, 1]), cpu((3, 2)), "prod"), RuntimeError)


def index_copy_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(make((2, 4), dtype, device), 1, _index((2, 0), device), make((2, 2), dtype, device))
    yield SampleInput(make((4, 3), dtype, device), 0, _index((3, 0, 1), device), make((3, 3), dtype, device))
    yield SampleInput(make((), dtype, device), 0, _index((0,), device), make((), dtype, device))
    yield SampleInput(tensor(Transposed((4, 3)), dtype, device), 0, _index((1,), device), make((1, 3), dtype, device))


def index_copy_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((4, 2)), 0, torch.tensor([0, 1]), cpu((3, 2))), IndexError)
    yield ErrorInput(SampleInput(cpu((4, 2)), 0, torch.tensor([0, 1]), cpu((2, 3))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((4, 2)), 0, torch.tensor([[0, 1]]), cpu((2, 2))), IndexError)


def index_fill_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    value = True if dtype == torch.bool else -2
    yield SampleInput(make((2, 4), dtype, device), 1, _index((2, 0, -1), device), value)
    yield SampleInput(make((4, 3), dtype, device), 0, _index((1, 1), device), make((), dtype, device))
    yield SampleInput(make((), dtype, device), 0, _index((0,), device), value)
    yield SampleInput(tensor(Transposed((4, 3)), dtype, device), -1, _index((2,), device).reshape(()), value)


def index_fill_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((4, 2)), 0, torch.tensor([0, 1]), cpu((2,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((4, 2)), 2, torch.tensor([0, 1]), 1.0), IndexError)


def take_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(make((2, 4), dtype, device), _index(((0, -1), (3, 3)), device))
    yield SampleInput(make((), dtype, device), _index(0, device))
    yield SampleInput(make((3,), dtype, device), torch.zeros(0, dtype=torch.int64, device=device))
    yield SampleInput(tensor(Transposed((4, 3)), dtype, device), _index((1, 5, 11), device))


def put_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(make((2, 4), dtype, device), _index((0, -1, 3), device), make((3,), dtype, device))
    yield SampleInput(make((3, 3), dtype, device), _index(((0, 8),), device), make((1, 2), dtype, device))
    yield SampleInput(tensor(Transposed((4, 3)), dtype, device), _index((5,), device), make((1,), dtype, device))
    if dtype != torch.bool:
        yield SampleInput(make((2, 4), dtype, device), _index((0, -1, 0), device), make((3,), dtype, device), True)


def put_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 3)), torch.tensor([0, 1]), cpu((3,))), IndexError)
    yield ErrorInput(SampleInput(cpu((3, 3)), torch.tensor([0, 1]), cpu((2,), torch.float64)), RuntimeError)


def index_put_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(
        make((2, 4, 3), dtype, device),
        (_index((0, 1), device), _index(((2,), (-1,)), device)),
        make((3,), dtype, device),
    )
    yield SampleInput(make((5, 5), dtype, device), (_index((2, 4), device),), make((2, 5), dtype, device))
    yield SampleInput(
        make((5, 5), dtype, device),
        (torch.tensor([True, True, False, True, False], device=device),),
        make((5,), dtype, device),
    )
    yield SampleInput(make((3, 2), dtype, device), (torch.rand(3, 2, device=device) > 0.5,), make((), dtype, device))
    if dtype != torch.bool:
        yield SampleInput(make((5, 5), dtype, device), (_index((2, 1, 2), device),), make((3, 5), dtype, device), True)
        yield SampleInput(
            make((5, 2), dtype, device),
            (torch.tensor([True, False, True, True, False], device=device),),
            make((1, 2), dtype, device),
            True,
        )


def index_put_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((5, 5)), (torch.tensor([2, 4]),), cpu((3, 5))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5, 5)), (torch.tensor([2, 4]),), cpu((2, 5), torch.float64)), RuntimeError)


def _put_where_masked(a, mask, value):
    """``a[mask] = value`` on a copy: a row broadcast to every row the mask picks."""
    out = a.clone()
    out[mask] = value
    return out


def _put_where_masked_dim1(a, mask, value):
    out = a.clone()
    out[:, mask] = value
    return out


def put_where_masked_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    mask = torch.tensor([True, False, True, True, False], device=device)
    yield SampleInput(make((5, 4), dtype, device), mask, make((4,), dtype, device))
    yield SampleInput(make((5, 4), dtype, device), mask, make((1, 1, 4), dtype, device))  # leading ones dropped
    yield SampleInput(make((5, 4), dtype, device), mask, make((), dtype, device))
    yield SampleInput(
        make((5, 4), dtype, device), torch.zeros(5, dtype=torch.bool, device=device), make((4,), dtype, device)
    )


def put_where_masked_dim1_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    mask = torch.tensor([True, False, True, True, False], device=device)
    yield SampleInput(make((2, 5, 3), dtype, device), mask, make((2, 1, 3), dtype, device))
    yield SampleInput(make((2, 5, 3), dtype, device), mask, make((3,), dtype, device))


def fill_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(make((2, 4), dtype, device), 2)
    yield SampleInput(make((2, 4), dtype, device), make((), dtype, device))
    yield SampleInput(make((), dtype, device), 1.5)
    yield SampleInput(tensor(Transposed((2, 4)), dtype, device), True)


def as_strided_input_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """An explicit storage offset of an input counts from its memory's start: an eager fallback."""
    yield SampleInput(make((3, 3), dtype, device), (2, 2), (1, 2), 1)
    yield SampleInput(make((10,), dtype, device)[3:], (2, 2), (1, 2))


def masked_scatter_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Masks of the input's shape, broadcast from a row or broadcasting the input, all-false and
    all-true, a longer source, non-contiguous operands and empty tensors."""
    mask = torch.tensor(
        [[True, False, True, True], [False, False, True, False], [True, True, False, False]], device=device
    )
    yield SampleInput(make((3, 4), dtype, device), mask, make((6,), dtype, device))
    yield SampleInput(make((3, 4), dtype, device), mask[0], make((2, 5), dtype, device))
    yield SampleInput(make((4,), dtype, device), mask, make((7,), dtype, device))
    yield SampleInput(make((3, 4), dtype, device), torch.zeros_like(mask), make((2,), dtype, device))
    yield SampleInput(transposed((4, 3), dtype, device), mask.mT.contiguous().mT.mT, make((12,), dtype, device))
    yield SampleInput(
        make((2, 0), dtype, device), torch.ones(2, 0, dtype=torch.bool, device=device), make((0,), dtype, device)
    )
    yield SampleInput(make((), dtype, device), torch.tensor(True, device=device), make((3,), dtype, device))


def masked_scatter_errors() -> Iterable[ErrorInput]:
    mask = torch.tensor([True, False, True])
    yield ErrorInput(SampleInput(cpu((3,)), mask.float(), cpu((3,))), RuntimeError, "boolean")
    yield ErrorInput(SampleInput(cpu((3,)), mask, cpu((3,), torch.float64)), RuntimeError, "dtype")
    yield ErrorInput(SampleInput(cpu((3,)), torch.ones(2, dtype=torch.bool), cpu((3,))), RuntimeError, "size")


OPS = [
    OpInfo("scatter", torch.scatter, scatter_samples, scatter_errors, ALL),
    *(
        OpInfo(
            "scatter_reduce",
            torch.scatter_reduce,
            scatter_reduce_samples(r),
            scatter_reduce_errors if r == "sum" else lambda: iter(()),
            NUMERIC,
            variant=r,
        )
        for r in ("sum", "prod", "mean", "amax", "amin")
    ),
    *(
        OpInfo(
            "index_reduce",
            torch.index_reduce,
            index_reduce_samples(r),
            index_reduce_errors if r == "prod" else lambda: iter(()),
            NUMERIC,
            variant=r,
        )
        for r in ("prod", "mean", "amax", "amin")
    ),
    OpInfo("index_copy", torch.index_copy, index_copy_samples, index_copy_errors, ALL),
    OpInfo("index_fill", torch.index_fill, index_fill_samples, index_fill_errors, ALL),
    OpInfo("take", torch.take, take_samples, dtypes=ALL),
    OpInfo("put", torch.put, put_samples, put_errors, ALL),
    OpInfo("index_put", torch.index_put, index_put_samples, index_put_errors, ALL),
    OpInfo("setitem", _put_where_masked, put_where_masked_samples, dtypes=ALL, variant="mask"),
    OpInfo("setitem", _put_where_masked_dim1, put_where_masked_dim1_samples, dtypes=ALL, variant="mask_dim1"),
    OpInfo("fill", torch.fill, fill_samples, dtypes=ALL),
    OpInfo("masked_scatter", torch.masked_scatter, masked_scatter_samples, masked_scatter_errors, ALL),
    OpInfo("as_strided", torch.as_strided, as_strided_input_samples, dtypes=FLOATS, variant="input_offset"),
]
