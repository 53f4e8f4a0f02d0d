"""Rearranging ops beyond `shape.py` and `joins.py`: rotations and flips, fixed-dim splits, stacking, tiling,
broadcasting several tensors, grids, block diagonals, Kronecker products, shuffles, diagonals,
triangle indices, sliding windows, as_strided, and the `*_copy` ops."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from .core import (
    ALL,
    FLOATS,
    NUMERIC,
    PROMOTION_PARTNER,
    ErrorInput,
    OpInfo,
    SampleInput,
    Strided,
    Transposed,
    cases,
    cpu,
    tensor,
)

ROT90 = cases(
    ((3, 4),),
    ((3, 4), 2),
    ((3, 4), -1),
    ((2, 3, 4), 3, [2, 0]),
    ((2, 3, 4), 4, (1, -1)),
    ((0, 3), 1),
    (Transposed((3, 4)), 1, [1, 0]),
)


def rot90_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 1, [0]), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 1, [0, -2]), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), 1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 1, [0, 2]), IndexError)


FLIP_LR = cases(((3, 4),), ((2, 3, 4),), ((3, 1),), (Strided((2, 3, 4)),))
FLIP_UD = cases(((3,),), ((3, 4),), ((1, 4),), ((0, 2),), (Transposed((3, 4)),))

SPLIT_WITH_SIZES = cases(
    ((5, 4), [2, 3]),
    ((5, 4), [1, 0, 3], 1),
    ((5, 4), (4,), -1),
    ((0, 4), [0], 0),
    (Transposed((3, 4)), [1, 2]),
)
UNSAFE_SPLIT = cases(((5, 4), 2), ((5, 4), 3, 1), ((5, 4), 5), (Strided((2, 3, 4)), 2, -1))
UNSAFE_CHUNK = cases(((5, 4), 2), ((5, 4), 3, 1), ((3,), 5), (Strided((2, 3, 4)), 2, -1))


def split_with_sizes_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((5,)), [2, 2]), RuntimeError, "split")
    yield ErrorInput(SampleInput(cpu((5,)), [2, 3], 1), IndexError, "split")


def directional_split(name: str, spec_rows: tuple) -> OpInfo:
    fn = getattr(torch, name)
    return OpInfo(name, fn, cases(*spec_rows), lambda: directional_split_errors(fn), ALL)


def directional_split_errors(fn) -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 3, 3)), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu(()), 1), RuntimeError)


HSPLIT = (((6,), 3), ((3, 4), 2), ((3, 4), [1, 3]), ((2, 4, 3), [5]), (Transposed((3, 4)), 4))
VSPLIT = (((4, 3), 2), ((4, 3), [1, -1]), ((0, 3), 1), (Strided((2, 3, 4)), [1]))
DSPLIT = (((2, 3, 4), 2), ((2, 3, 4), [1, 2, 2]), (Transposed((2, 4, 3)), 3))


def several(*specs_args):
    """Samples of ops over several tensors given positionally: rows of (specs, kwargs)."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for specs, kwargs in specs_args:
            yield SampleInput(*(tensor(s, dtype, device) for s in specs), **kwargs)

    return generate


def listed(*rows):
    """Samples of ops taking one list of tensors."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for specs in rows:
            yield SampleInput([tensor(s, dtype, device) for s in specs])

    return generate


ATLEAST_3D = several(
    (((),), {}),
    (((3,),), {}),
    (((2, 3),), {}),
    (((2, 3, 4),), {}),
    (((1, 2, 3, 4),), {}),
    (((), (3,), (2, 3)), {}),
    ((Transposed((3, 4)),), {}),
)
COLUMN_STACK = listed([(3,), (3, 2), (3,)], [(4,)], [(1,), ()], [Transposed((3, 2)), (3,)])
DSTACK = listed([(3,), (3,)], [(2, 3), (2, 3, 2)], [(), ()], [Strided((2, 3, 4)), (2, 3, 1)])


def stack_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput([]), RuntimeError)


TILE = cases(
    ((3, 4), (2,)), ((3, 4), (2, 1, 3)), ((), ()), ((), (2, 2)), ((0, 2), (2, 2)), (Transposed((3, 4)), (1, 2))
)
TILE_METHOD = cases(((3, 4), 2, 1), ((3,), 2, 2), (Strided((2, 3, 4)), 2))

REPEAT_INTERLEAVE = cases(
    ((3, 4), 2),
    ((3, 4), 3, 1),
    ((3, 4), 0, 0),
    ((), 3),
    ((2, 3, 4), 2, -1),
    (Transposed((3, 4)), 2, 0),
)


def repeat_interleave_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), -1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), 2, output_size=5), RuntimeError)


SUM_TO_SIZE = cases(
    ((2, 3, 4), 3, 1), ((2, 3, 4), (1, 1, 4)), ((3, 4), 3, 4), ((3, 1), 1), ((0, 3), 1, 3), (Transposed((3, 4)), 1, 4)
)


def sum_to_size_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3)), 3, 3), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3)), 1, 2, 3), RuntimeError)


BROADCAST_TENSORS = several(
    (((3, 1), (4,)), {}),
    (((2, 1, 3), (1, 4, 1), ()), {}),
    (((3,),), {}),
    (((0, 1), (3,)), {}),
    ((Transposed((3, 4)), (1, 4)), {}),
)


def broadcast_tensors_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), cpu((4,))), RuntimeError)


MESHGRID = several(
    (((3,), (4,)), {"indexing": "ij"}),
    (((3,), (4,), (2,)), {"indexing": "xy"}),
    (((3,), ()), {"indexing": "ij"}),
    (((3,),), {"indexing": "xy"}),
    (((0,), (2,)), {"indexing": "ij"}),
    ((Strided((3,)), (2,)), {"indexing": "xy"}),
)


def meshgrid_list_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput([tensor((3,), dtype, device), tensor((2,), dtype, device)], indexing="ij")
    yield SampleInput((tensor((2,), dtype, device),), indexing="xy")


def meshgrid_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 2)), indexing="ij"), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2,)), cpu((2,), torch.float64), indexing="ij"), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2,)), indexing="yx"), RuntimeError)


CARTESIAN_PROD = several((((3,), (2,)), {}), (((3,),), {}), (((2,), (0,), (2,)), {}), (((2,), (2,), (3,)), {}))


def block_diag_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def t(spec, dt=dtype):
        return tensor(spec, dt, device)

    yield SampleInput(t((2, 3)), t(()), t((3,)))
    yield SampleInput(t((2, 2)))
    yield SampleInput(t((0, 2)), t((2, 0)), t((1, 1)))
    yield SampleInput(t(Transposed((3, 2))), t((2, 3), PROMOTION_PARTNER[dtype]))


def block_diag_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 2, 2))), RuntimeError)


def kron_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def t(spec, dt=dtype):
        return tensor(spec, dt, device)

    yield SampleInput(t((2, 3)), t((3, 2)))
    yield SampleInput(t((2,)), t((3, 2, 2)))
    yield SampleInput(t(()), t((3,)))
    yield SampleInput(t((0, 2)), t((2, 2)))
    # Eager's kron views its inputs and fails on some non-contiguous ones; thunder_rs computes them.
    yield SampleInput(t((2, 3)), t((2,), PROMOTION_PARTNER[dtype]))


PIXEL_SHUFFLE = cases(
    ((1, 8, 2, 3), 2), ((2, 3, 9, 2, 2), 3), ((4, 2, 2), 1), ((0, 4, 1, 1), 2), (Transposed((1, 4, 2, 3)), 2)
)
PIXEL_UNSHUFFLE = cases(((1, 2, 4, 6), 2), ((2, 3, 1, 6, 3), 3), ((1, 2, 2), 1), (Strided((1, 2, 4, 6)), 2))
CHANNEL_SHUFFLE = cases(((2, 6, 3), 2), ((1, 6, 2, 2), 3), ((2, 4, 1), 4), (Transposed((2, 4, 3)), 2))


def pixel_shuffle_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((4, 2)), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((1, 5, 2, 2)), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((1, 4, 2, 2)), 0), RuntimeError)


def pixel_unshuffle_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((1, 4, 3, 2)), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((1, 4, 2, 3)), 2), RuntimeError)


def channel_shuffle_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 4)), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 5, 2)), 2), RuntimeError)


DIAG = cases(
    ((3,),), ((3,), 2), ((3,), -1), ((3, 4),), ((3, 4), 1), ((3, 4), -2), ((3, 4), 5), ((0,),), (Transposed((3, 4)), 1)
)
DIAG_EMBED = cases(
    ((2, 3),),
    ((2, 3), 1),
    ((2, 3), -2, 0, 2),
    ((2, 3), 1, 2, 0),
    ((3,), 0, -1, 0),
    ((2, 0),),
    (Strided((2, 3, 4)), 1, 1, 3),
)
DIAGFLAT = cases(((2, 3),), ((2, 3), 1), ((), -2), ((0,),), (Transposed((2, 3)), -1))
TRACE = cases(((3, 4),), ((4, 3),), ((0, 2),), (Transposed((3, 4)),))


def diag_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3, 4))), RuntimeError)
    yield ErrorInput(SampleInput(cpu(())), RuntimeError)


def diag_embed_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3)), 0, 1, 1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3)), 0, 0, 3), IndexError)


def trace_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 2), torch.bool)), NotImplementedError)


def triangle_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for row, col, offset in ((4, 3, 0), (4, 5, -1), (3, 5, 2), (0, 3, 0), (3, 3, -5), (3, 3, 7)):
        yield SampleInput(row, col, offset, device=device)
    yield SampleInput(3, 4, dtype=torch.int32, device=device)


def triangle_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(-1, 3), RuntimeError)
    yield ErrorInput(SampleInput(3, 3, dtype=torch.float32), NotImplementedError)


UNFOLD = cases(
    ((2, 5, 3), 1, 2, 1),
    ((2, 5, 7), -1, 3, 2),
    ((6,), 0, 6, 1),
    ((6,), 0, 0, 4),
    ((), 0, 1, 1),
    ((0, 3), 1, 2, 1),
    (Transposed((3, 5)), 1, 2, 2),
)


def unfold_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), 0, 4, 1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), 0, 2, 0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), 0, -1, 1), RuntimeError)


# Contiguous inputs; an explicit storage offset of an input tensor runs eagerly (its memory may
# start before it), so samples of it are in the `scatter` table's as_strided entry.
AS_STRIDED = cases(
    ((3, 3), (2, 2), (1, 2)),
    ((3, 3), (3, 3), (0, 1)),
    ((6,), (2, 3), (3, 1)),
    ((6,), (2, 2), (1, 1)),
    ((6,), (0, 2), (1, 1)),
    ((), (), ()),
)


def as_strided_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 3)), (2, 2), (1,)), RuntimeError)


def computed_as_strided(a, size, stride, offset):
    """as_strided of a tensor the program computes: its memory starts at its first element."""
    return torch.as_strided(a * 2, size, stride, offset)


AS_STRIDED_COMPUTED = cases(((3, 3), (2, 2), (1, 2), 1), ((3, 3), (4,), (2,), 1), ((6,), (2, 2), (0, 1), 4))


def copy_errors(*rows):
    """Error inputs from rows of (shape, args, exception, what the message names)."""
    return lambda: (ErrorInput(SampleInput(cpu(shape), *args), exc, match) for shape, args, exc, match in rows)


COPY_OPS = [
    OpInfo(
        "expand_copy",
        torch.expand_copy,
        cases(((3, 1), (2, 3, 4)), ((3, 1), (3, -1)), ((), (2,)), (Transposed((1, 3)), (2, 2, 3))),
        copy_errors(((3, 4), ((5, 4),), RuntimeError, "expand")),
        ALL,
    ),
    OpInfo("permute_copy", torch.permute_copy, cases(((3, 4), (1, 0)), ((2, 3, 4), (2, 0, 1)), ((), ())), dtypes=ALL),
    OpInfo(
        "t_copy", torch.t_copy, cases(((3, 4),), ((3,),), ((),)), copy_errors(((2, 3, 4), (), RuntimeError, "t")), ALL
    ),
    OpInfo("transpose_copy", torch.transpose_copy, cases(((3, 4), 0, 1), ((2, 3, 4), -1, 0), ((), 0, 0)), dtypes=ALL),
    OpInfo("view_copy", torch.view_copy, cases(((3, 4), (12,)), ((3, 4), (2, -1)), ((), (1,))), dtypes=ALL),
    OpInfo(
        "squeeze_copy",
        torch.squeeze_copy,
        cases(((1, 3, 1),), ((1, 3, 1), 0), ((1, 3, 1), [0, 2]), ((3,), 0)),
        dtypes=ALL,
    ),
    OpInfo("unsqueeze_copy", torch.unsqueeze_copy, cases(((3, 4), 1), ((), 0)), dtypes=ALL),
    OpInfo("unbind_copy", torch.unbind_copy, cases(((3, 4),), ((3, 4), 1), ((1, 4), 0)), dtypes=ALL),
    OpInfo("select_copy", torch.select_copy, cases(((3, 4), 0, 1), ((3, 4), 1, -1)), dtypes=ALL),
    OpInfo("diagonal_copy", torch.diagonal_copy, cases(((3, 4),), ((3, 4), 1), ((2, 3, 4), -1, 2, 0)), dtypes=ALL),
    OpInfo("alias_copy", torch.alias_copy, cases(((3, 4),), ((),), (Transposed((3, 4)),)), dtypes=ALL),
    OpInfo(
        "narrow_copy", torch.narrow_copy, cases(((3, 4), 0, 1, 2), ((3, 4), 1, 0, 4), ((3, 4), -1, -2, 1)), dtypes=ALL
    ),
    OpInfo("split_copy", torch.split_copy, cases(((5, 4), 2), ((3, 4), 3), ((3, 4), 2, 1)), dtypes=ALL),
    OpInfo("split_with_sizes_copy", torch.split_with_sizes_copy, cases(((5, 4), [2, 3]), ((3, 4), [4], 1)), dtypes=ALL),
    OpInfo("unfold_copy", torch.unfold_copy, cases(((2, 5), 1, 2, 1), ((6,), 0, 3, 3)), dtypes=ALL),
    OpInfo(
        "as_strided_copy", torch.as_strided_copy, cases(((3, 3), (2, 2), (1, 2)), ((6,), (3, 2), (1, 1))), dtypes=ALL
    ),
]

OPS = [
    OpInfo("rot90", torch.rot90, ROT90, rot90_errors, ALL),
    OpInfo("fliplr", torch.fliplr, FLIP_LR, lambda: iter([ErrorInput(SampleInput(cpu((3,))), RuntimeError)]), ALL),
    OpInfo("flipud", torch.flipud, FLIP_UD, lambda: iter([ErrorInput(SampleInput(cpu(())), RuntimeError)]), ALL),
    OpInfo("split_with_sizes", torch.split_with_sizes, SPLIT_WITH_SIZES, split_with_sizes_errors, ALL),
    OpInfo("unsafe_split", torch.unsafe_split, UNSAFE_SPLIT, dtypes=ALL),
    OpInfo("unsafe_chunk", torch.unsafe_chunk, UNSAFE_CHUNK, dtypes=ALL),
    directional_split("hsplit", HSPLIT),
    directional_split("vsplit", VSPLIT),
    directional_split("dsplit", DSPLIT),
    OpInfo("atleast_3d", torch.atleast_3d, ATLEAST_3D, dtypes=ALL),
    OpInfo("column_stack", torch.column_stack, COLUMN_STACK, stack_errors, ALL),
    OpInfo("dstack", torch.dstack, DSTACK, stack_errors, ALL),
    OpInfo("tile", torch.tile, TILE, lambda: iter([ErrorInput(SampleInput(cpu((2,)), (-1,)), RuntimeError)]), ALL),
    OpInfo("tile", torch.Tensor.tile, TILE_METHOD, dtypes=ALL, variant="method"),
    OpInfo("repeat_interleave", torch.repeat_interleave, REPEAT_INTERLEAVE, repeat_interleave_errors, ALL),
    OpInfo("sum_to_size", torch.Tensor.sum_to_size, SUM_TO_SIZE, sum_to_size_errors, ALL),
    OpInfo("broadcast_tensors", torch.broadcast_tensors, BROADCAST_TENSORS, broadcast_tensors_errors, ALL),
    OpInfo("meshgrid", torch.meshgrid, MESHGRID, meshgrid_errors, ALL),
    OpInfo("meshgrid", torch.meshgrid, meshgrid_list_samples, dtypes=ALL, variant="list"),
    OpInfo("cartesian_prod", torch.cartesian_prod, CARTESIAN_PROD, dtypes=ALL),
    OpInfo("block_diag", torch.block_diag, block_diag_samples, block_diag_errors, ALL),
    OpInfo("kron", torch.kron, kron_samples, dtypes=ALL),
    OpInfo("pixel_shuffle", F.pixel_shuffle, PIXEL_SHUFFLE, pixel_shuffle_errors, ALL),
    OpInfo("pixel_unshuffle", F.pixel_unshuffle, PIXEL_UNSHUFFLE, pixel_unshuffle_errors, ALL),
    OpInfo("channel_shuffle", torch.channel_shuffle, CHANNEL_SHUFFLE, channel_shuffle_errors, NUMERIC),
    OpInfo("diag", torch.diag, DIAG, diag_errors, ALL),
    OpInfo("diag_embed", torch.diag_embed, DIAG_EMBED, diag_embed_errors, ALL),
    OpInfo("diagflat", torch.diagflat, DIAGFLAT, dtypes=ALL),
    OpInfo("trace", torch.trace, TRACE, trace_errors, NUMERIC),
    OpInfo("tril_indices", torch.tril_indices, triangle_samples, triangle_errors, (torch.int64,), supports_grad=False),
    OpInfo("triu_indices", torch.triu_indices, triangle_samples, triangle_errors, (torch.int64,), supports_grad=False),
    OpInfo("unfold", torch.Tensor.unfold, UNFOLD, unfold_errors, ALL),
    OpInfo("as_strided", torch.as_strided, AS_STRIDED, as_strided_errors, ALL),
    OpInfo("as_strided", computed_as_strided, AS_STRIDED_COMPUTED, dtypes=FLOATS + (torch.int64,), variant="computed"),
    *COPY_OPS,
]
