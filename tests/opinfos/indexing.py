"""Indexing (`Tensor.__getitem__`): ints, slices, None, Ellipsis, and integer index tensors; select,
unbind, index_select, gather, take_along_dim, scatter_add, index_add; the scatter forms of views;
topk, sort and argsort.

Each basic index is written out in its own entry, as user code writes it, so the index is static.
Boolean masks are left out: their result shape depends on the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import partial

import torch

from .core import (
    ALL,
    NUMERIC,
    ErrorInput,
    OpInfo,
    SampleInput,
    Strided,
    TensorSpec,
    Transposed,
    cases,
    cpu,
    make,
    strided,
    tensor,
    transposed,
)

ANY = ((3, 4), (2, 3, 4), Transposed((3, 4)), Strided((2, 3, 4)))


def rejected_shapes(*rows: tuple[tuple[int, ...], type[Exception]]) -> Callable[[], Iterable[ErrorInput]]:
    """Error inputs from rows of (shape, exception): the index cannot apply to a tensor of that shape."""
    return lambda: (ErrorInput(SampleInput(cpu(shape)), exc) for shape, exc in rows)


def basic(variant: str, index: Callable, specs: tuple[TensorSpec, ...], errors=()) -> OpInfo:
    return OpInfo(
        "getitem",
        index,
        cases(*((spec,) for spec in specs)),
        rejected_shapes(*errors),
        ALL,
        variant=variant,
    )


BASIC_OPS = [
    basic("int", lambda a: a[1], (*ANY, (3, 0)), [((), IndexError), ((1, 4), IndexError)]),
    basic("negative_int", lambda a: a[-1], (*ANY, (3, 0)), [((0, 4), IndexError)]),
    basic("int_tuple", lambda a: a[1, 2], ANY, [((3,), IndexError)]),
    basic("slice", lambda a: a[1:3], (*ANY, (0, 4)), [((), IndexError)]),
    basic("slice_clamped", lambda a: (a[5:], a[-10:2]), ANY),  # out-of-range bounds clamp
    basic("step", lambda a: a[:, ::2], (*ANY, (3, 0))),
    basic("start_step", lambda a: a[1::3], ANY),
    basic("none", lambda a: a[None], (*ANY, ())),
    basic("none_inner", lambda a: a[:, None], ANY),
    basic("ellipsis", lambda a: a[..., 1], ANY),
    basic("ellipsis_only", lambda a: a[...], (*ANY, ())),
    basic("mixed", lambda a: a[1, None, ..., 1:], ANY),
    basic("int_list", lambda a: a[[1, -1, 1]], ANY),
    # Negative and zero steps are not supported by torch at all.
    basic("negative_step", lambda a: a[::-1], (), [((3, 4), ValueError)]),
    basic("zero_step", lambda a: a[::0], (), [((3, 4), ValueError)]),
]


def _index_tensor(shape: tuple[int, ...], size: int, device: str, dtype=torch.int64) -> torch.Tensor:
    """Indices into a dim of `size`, negative ones included."""
    return torch.randint(-size, size, shape, dtype=dtype, device=device)


def index_tensor_samples(dtype: torch.dtype, device: str, *, dim: int) -> Iterable[SampleInput]:
    """One index tensor into `dim`: 1-D for several layouts, then 2-D, 0-dim, empty and int32 indices."""
    for spec in ((3, 4), (2, 3, 4), Transposed((3, 4)), Strided((2, 3, 4))):
        x = tensor(spec, dtype, device)
        yield SampleInput(x, _index_tensor((2,), x.shape[dim], device))
    x = make((3, 4), dtype, device)
    size = x.shape[dim]
    for shape in ((2, 3), (), (0,)):
        yield SampleInput(x, _index_tensor(shape, size, device))
    yield SampleInput(x, _index_tensor((5,), size, device, torch.int32))


def index_pair_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Two index tensors that broadcast together: (2, 1) with (3,), and equal shapes."""
    for spec in ((3, 4), (3, 4, 5), Transposed((3, 4))):
        x = tensor(spec, dtype, device)
        yield SampleInput(x, _index_tensor((2, 1), 3, device), _index_tensor((3,), 4, device))
    x = make((3, 4), dtype, device)
    yield SampleInput(x, _index_tensor((2,), 3, device), _index_tensor((2,), 4, device))
    yield SampleInput(x, _index_tensor((0,), 3, device), _index_tensor((0,), 4, device))


def index_apart_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for spec in ((3, 4, 5), Strided((3, 4, 5))):
        x = tensor(spec, dtype, device)
        yield SampleInput(x, _index_tensor((2,), 3, device), _index_tensor((2,), 5, device))


def float_index_error() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), torch.tensor([0.0, 1.0])), IndexError)


def unbroadcastable_indices_error() -> Iterable[ErrorInput]:
    indices = (torch.tensor([0, 1]), torch.tensor([0, 1, 2]))
    yield ErrorInput(SampleInput(cpu((3, 4)), *indices), IndexError)


def _index_dim0(a, idx):
    return a[idx]


def _index_dim1(a, idx):
    return a[:, idx]


def _index_pair(a, i, j):
    return a[i, j]


def _index_apart(a, i, j):
    # Index tensors separated by a slice: the indexed dims move to the front of the result.
    return a[i, :, j]


TENSOR_OPS = [
    OpInfo("getitem", _index_dim0, partial(index_tensor_samples, dim=0), float_index_error, ALL, variant="tensor"),
    OpInfo("getitem", _index_dim1, partial(index_tensor_samples, dim=1), float_index_error, ALL, variant="tensor_dim1"),
    OpInfo("getitem", _index_pair, index_pair_samples, unbroadcastable_indices_error, ALL, variant="tensor_pair"),
    OpInfo("getitem", _index_apart, index_apart_samples, dtypes=ALL, variant="tensor_apart"),
]
SELECTS = cases(
    ((3, 4), 0, 1),
    ((3, 4), 1, -1),
    ((2, 3, 4), -1, 2),
    ((5,), 0, 4),
    ((3, 0), 0, 2),
    (Transposed((3, 4)), 1, 0),
    (Strided((2, 3, 4)), 2, 1),
)


def select_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu(()), 0, 0), IndexError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, 3), IndexError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2, 0), IndexError)


SLICES = cases(
    ((6, 4), 0, 1, 5, 2),
    ((6, 4), 1, -3),
    ((6, 4), -1, None, None, 3),
    ((5, 3), 0, 4, 2),  # end before start: empty
    ((5, 3), 0, -100, 100),  # out-of-range bounds clamp
    (Transposed((3, 4)), 1, 0, 3),
    (Strided((2, 3, 4)), 2, 1, None, 2),
)


def slice_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu(()), 0, 0, 1), IndexError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2, 0, 1), IndexError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, 0, 3, 0), RuntimeError)


UNBINDS = cases(((3, 4),), ((3, 4), 1), ((2, 3, 4), -1), ((0, 3), 0), ((3, 0), 0), (Transposed((3, 4)), 1))


def unbind_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu(())), IndexError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2), IndexError)


def _indices(shape: tuple[int, ...], size: int, device: str, dtype=torch.int64) -> torch.Tensor:
    """Non-negative indices into a dim of `size` (gather, scatter and index_add take no negative ones)."""
    return torch.randint(0, max(size, 1), shape, dtype=dtype, device=device)


def index_select_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for spec, dim in (((3, 4), 0), ((3, 4), 1), ((2, 3, 4), -1), (Transposed((3, 4)), 0), (Strided((2, 3, 4)), 2)):
        x = tensor(spec, dtype, device)
        yield SampleInput(x, dim, _indices((5,), x.shape[dim], device))
    x = make((3, 4), dtype, device)
    yield SampleInput(x, 1, _indices((), 4, device))
    yield SampleInput(x, 0, _indices((0,), 3, device))
    yield SampleInput(x, 1, _indices((3,), 4, device, torch.int32))
    yield SampleInput(make((0, 4), dtype, device), 1, _indices((2,), 4, device))


def index_select_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, torch.zeros(2, 2, dtype=torch.int64)), IndexError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, torch.zeros(2)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2, torch.zeros(2, dtype=torch.int64)), IndexError)


def gather_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Index tensors of the input's rank, no larger than it apart from the gathered dim."""
    for spec, dim, index_shape in (
        ((3, 4), 0, (5, 4)),
        ((3, 4), 1, (3, 2)),
        ((3, 4), 1, (2, 2)),
        ((2, 3, 4), -1, (2, 3, 6)),
        ((3, 4), 0, (0, 4)),
        (Transposed((3, 4)), 0, (2, 4)),
        (Strided((2, 3, 4)), 1, (2, 2, 2)),
    ):
        x = tensor(spec, dtype, device)
        yield SampleInput(x, dim, _indices(index_shape, x.shape[dim], device))
    yield SampleInput(make((), dtype, device), 0, _indices((), 1, device))
    yield SampleInput(make((3, 4), dtype, device), 1, _indices((4, 3), 4, device).mT)  # a non-contiguous index


def gather_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, torch.zeros(2, dtype=torch.int64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, torch.zeros(2, 5, dtype=torch.int64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, torch.zeros(2, 4)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2, torch.zeros(2, 4, dtype=torch.int64)), IndexError)


def take_along_dim_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Indices of the input's rank that broadcast with it off the dim, then flat indices (no dim)."""
    x = make((3, 4), dtype, device)
    yield SampleInput(x, _indices((3, 2), 4, device), 1)
    yield SampleInput(x, _indices((1, 5), 4, device), 1)
    yield SampleInput(x, _indices((2, 1), 3, device), 0)
    yield SampleInput(make((2, 1, 4), dtype, device), _indices((1, 3, 2), 4, device), -1)
    yield SampleInput(x, _indices((5,), 12, device))
    yield SampleInput(x, _indices((3, 0), 4, device), 1)
    yield SampleInput(transposed((3, 4), dtype, device), torch.argsort(make((3, 4), torch.float32, device), 1), 1)
    yield SampleInput(x, _indices((3, 4), 4, device), dim=-1)


def take_along_dim_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), torch.zeros(3, 2, dtype=torch.int32), 1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), torch.zeros(2, dtype=torch.int64), 1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), torch.zeros(3, 2, dtype=torch.int64), 2), IndexError)


def scatter_add_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Indices (repeated ones add up) no larger than `src`, nor than the input off the dim."""
    for spec, dim, index_shape, src_shape in (
        ((3, 4), 0, (2, 4), (2, 4)),
        ((3, 4), 1, (3, 6), (3, 6)),
        ((3, 4), 0, (2, 2), (3, 5)),
        ((2, 3, 4), -1, (2, 3, 2), (2, 3, 2)),
        ((3, 4), 0, (0, 4), (0, 4)),
        (Transposed((3, 4)), 1, (3, 2), (3, 2)),
    ):
        x = tensor(spec, dtype, device)
        yield SampleInput(x, dim, _indices(index_shape, x.shape[dim], device), make(src_shape, dtype, device))
    yield SampleInput(make((3, 4), dtype, device), 0, _indices((2, 4), 3, device), strided((2, 4), dtype, device))
    # An empty index: eager checks no shapes against it (larger than the input and than src here).
    empty = torch.zeros(0, 6, dtype=torch.int64, device=device)
    yield SampleInput(make((3, 4), dtype, device), 0, empty, make((0, 5), dtype, device))


def scatter_add_errors() -> Iterable[ErrorInput]:
    index = torch.zeros(2, 4, dtype=torch.int64)
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, index, cpu((2, 4), torch.float64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, torch.zeros(2, dtype=torch.int64), cpu((2, 4))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, index, cpu((1, 4))), RuntimeError)


def index_add_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """`source` has the input's shape but for the indexed dim, one slice per index (repeats add up)."""
    for spec, dim, count in (
        ((5, 3), 0, 4),
        ((5, 3), 1, 2),
        ((2, 3, 4), -1, 6),
        (Transposed((5, 3)), 0, 3),
        ((5, 3), 0, 0),
    ):
        x = tensor(spec, dtype, device)
        shape = list(x.shape)
        shape[dim] = count
        yield SampleInput(x, dim, _indices((count,), x.shape[dim], device), make(tuple(shape), dtype, device))
    x = make((5, 3), dtype, device)
    yield SampleInput(x, 0, _indices((2,), 5, device, torch.int32), strided((2, 3), dtype, device))
    yield SampleInput(x, 1, _indices((), 3, device), make((5, 1), dtype, device))
    alpha = 2 if dtype in (torch.int64, torch.bool) else 0.5
    yield SampleInput(x, 0, _indices((3,), 5, device), make((3, 3), dtype, device), alpha=alpha)


def index_add_errors() -> Iterable[ErrorInput]:
    index = torch.zeros(2, dtype=torch.int64)
    yield ErrorInput(SampleInput(cpu((5, 3)), 0, index, cpu((2, 3), torch.float64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5, 3)), 0, index, cpu((3, 3))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5, 3)), 0, index, cpu((2, 4))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5, 3)), 0, torch.zeros(2, 2, dtype=torch.int64), cpu((4, 3))), IndexError)


GATHER_OPS = [
    OpInfo("select", torch.select, SELECTS, select_errors, ALL),
    OpInfo("slice", torch.ops.aten.slice.Tensor, SLICES, slice_errors, ALL),
    OpInfo("unbind", torch.unbind, UNBINDS, unbind_errors, ALL),
    OpInfo("index_select", torch.index_select, index_select_samples, index_select_errors, ALL),
    OpInfo("gather", torch.gather, gather_samples, gather_errors, ALL),
    OpInfo("take_along_dim", torch.take_along_dim, take_along_dim_samples, take_along_dim_errors, ALL),
    OpInfo("scatter_add", torch.scatter_add, scatter_add_samples, scatter_add_errors, NUMERIC),
    OpInfo("index_add", torch.index_add, index_add_samples, index_add_errors, NUMERIC),
]


def _distinct(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """Values without ties (ties leave the order of equal elements to the kernel), in `dtype`."""
    values = torch.randperm(math.prod(shape), device=device).reshape(shape) - math.prod(shape) // 2
    return values.to(dtype)


def topk_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(shape):
        return _distinct(shape, dtype, device)

    yield SampleInput(x((3, 4)), 2)
    yield SampleInput(x((3, 4)), 2, 0)
    yield SampleInput(x((2, 3, 4)), 3, -1, False)
    yield SampleInput(x((5,)), 5, largest=False)
    yield SampleInput(x((3, 4)), 0)
    yield SampleInput(x(()), 1)
    yield SampleInput(x((0, 4)), 2, 1)
    yield SampleInput(x((4, 3)).mT, 3, 1)


def topk_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 5), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2, 2), IndexError)


def sort_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(shape):
        return _distinct(shape, dtype, device)

    yield SampleInput(x((3, 4)))
    yield SampleInput(x((3, 4)), 0)
    yield SampleInput(x((2, 3, 4)), 1, True)
    yield SampleInput(x((5,)), descending=True)
    yield SampleInput(x(()))
    yield SampleInput(x((0, 4)), 1)
    yield SampleInput(x((4, 3)).mT, 1)
    # Stable sorts keep ties in input order, so repeated values are safe there.
    yield SampleInput(make((3, 6), dtype, device, low=-2, high=2), stable=True)
    yield SampleInput(make((6, 3), dtype, device, low=-2, high=2), stable=True, dim=0, descending=True)


def sort_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 2), IndexError)


SORT_OPS = [
    OpInfo("topk", torch.topk, topk_samples, topk_errors, NUMERIC),
    OpInfo("sort", torch.sort, sort_samples, sort_errors, ALL),
    OpInfo("argsort", torch.argsort, sort_samples, sort_errors, ALL, supports_grad=False),
]


def slice_scatter_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def t(spec):
        return tensor(spec, dtype, device)

    yield SampleInput(t((5, 4)), t((2, 4)), 0, 1, 3)
    yield SampleInput(t((5, 4)), t((5, 2)), 1, None, None, 2)
    yield SampleInput(t(Transposed((4, 6))), t((4, 2)), -1, -3, -1)
    yield SampleInput(t((3, 4)), t((0, 4)), 0, 2, 2)
    yield SampleInput(t((2, 3, 4)), t((2, 3, 1)), 2, 3, 100)


def slice_scatter_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((5, 4)), cpu((3, 4)), 0, 1, 3), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5, 4)), cpu((2, 4)), 2, 1, 3), IndexError)


def select_scatter_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(tensor((3, 4), dtype, device), tensor((4,), dtype, device), 0, 1)
    yield SampleInput(tensor(Strided((3, 4)), dtype, device), tensor((3,), dtype, device), 1, -1)
    yield SampleInput(tensor((2, 3, 4), dtype, device), tensor((2, 4), dtype, device), 1, 2)


def select_scatter_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3,)), 0, 1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((4,)), 0, 3), IndexError)


def diagonal_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(tensor((4, 4), dtype, device))
    yield SampleInput(tensor((3, 5), dtype, device), 2)
    yield SampleInput(tensor((5, 3), dtype, device), -1)
    yield SampleInput(tensor((2, 3, 4), dtype, device), 1, 2, 0)
    yield SampleInput(tensor(Transposed((4, 5)), dtype, device), 0, -1, -2)
    yield SampleInput(tensor((3, 3), dtype, device), 5)


def diagonal_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,))), IndexError)
    yield ErrorInput(SampleInput(cpu((3, 3)), 0, 1, 1), RuntimeError)


def diagonal_scatter_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for sample in diagonal_samples(dtype, device):
        a = sample.args[0]
        src = torch.diagonal(a, *sample.args[1:]).clone() + 1
        yield SampleInput(a, src, *sample.args[1:])


def diagonal_scatter_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 3)), cpu((2,))), RuntimeError)


SCATTER_OPS = [
    OpInfo("slice_scatter", torch.slice_scatter, slice_scatter_samples, slice_scatter_errors, ALL),
    OpInfo("select_scatter", torch.select_scatter, select_scatter_samples, select_scatter_errors, ALL),
    OpInfo("diagonal", torch.diagonal, diagonal_samples, diagonal_errors, ALL),
    OpInfo("diagonal", torch.Tensor.diagonal, diagonal_samples, variant="method", dtypes=ALL),
    OpInfo("diagonal_scatter", torch.diagonal_scatter, diagonal_scatter_samples, diagonal_scatter_errors, ALL),
]


def _masked_index_args(shape, device: str, mask_shape=(3, 4)):
    """A mask and an index per dim of ``shape``, the indices out of range in places (where the
    mask may be false or true: eager clamps them)."""
    gen = torch.Generator().manual_seed(len(shape))
    mask = (torch.rand(mask_shape, generator=gen) > 0.4).to(device)
    indices = [torch.randint(-n - 2, n + 2, mask_shape, generator=gen).to(device) for n in shape]
    return mask, [indices[0], *(i.int() for i in indices[1:])]


def masked_index_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for spec in ((5, 6), Transposed((5, 6)), (0, 6), (4,)):
        a = tensor(spec, dtype, device)
        mask, indices = _masked_index_args(a.shape, device)
        yield SampleInput(a, mask, indices, -2.5 if dtype.is_floating_point else 3)
        if a.numel():  # (one index: the mask broadcasts over the result's other dims)
            yield SampleInput(a, mask if a.ndim == 1 else mask.unsqueeze(-1), indices[:1], 0)


def masked_index_put_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for spec in ((5, 6), Transposed((5, 6)), (0, 6)):
        a = tensor(spec, dtype, device)
        mask, indices = _masked_index_args(a.shape, device)
        yield SampleInput(a, mask, indices, make((3, 4), dtype, device))
        if a.numel():
            yield SampleInput(a, mask.unsqueeze(-1), indices[:1], make((3, 4, a.shape[1]), dtype, device))


def masked_index_errors() -> Iterable[ErrorInput]:
    mask, indices = _masked_index_args((5, 5), "cpu", (3, 3))
    yield ErrorInput(SampleInput(cpu((5, 5)), mask, [indices[0].float()], 1.0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5, 5)), mask, indices * 2, 1.0), IndexError)
    yield ErrorInput(SampleInput(cpu((5, 5)), mask, indices[:1], 1.0), RuntimeError)  # mask vs result


MASKED_INDEX_OPS = [
    OpInfo("unsafe_masked_index", torch._unsafe_masked_index, masked_index_samples, masked_index_errors, ALL),
    OpInfo(
        "unsafe_masked_index_put_accumulate",
        torch._unsafe_masked_index_put_accumulate,
        masked_index_put_samples,
        dtypes=NUMERIC,
    ),
]


def nonzero_static_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Fewer nonzero elements than rows (filled), more (cut), none, a 0-d and a transposed input."""
    a = make((3, 4), dtype, device) * (torch.arange(12, device=device).reshape(3, 4) % 3 != 0)
    yield SampleInput(a, size=10)
    yield SampleInput(a, size=3, fill_value=7)
    yield SampleInput(a.mT, size=8)
    yield SampleInput(torch.zeros(2, 3, dtype=dtype, device=device), size=2)
    yield SampleInput(make((), dtype, device), size=2)
    yield SampleInput(make((0, 3), dtype, device), size=2)


def nonzero_static_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), size=-1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), size=2, fill_value=1.5), TypeError)


OPS = BASIC_OPS + TENSOR_OPS + GATHER_OPS + SCATTER_OPS + SORT_OPS + MASKED_INDEX_OPS
OPS.append(
    OpInfo(
        "nonzero_static", torch.nonzero_static, nonzero_static_samples, nonzero_static_errors, ALL, supports_grad=False
    )
)
