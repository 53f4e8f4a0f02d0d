"""Shape ops: reshape, view, permute, transpose, movedim, contiguous, expand, (un)squeeze, flatten,
cat, stack, split, chunk, repeat, flip, pad. Most take one tensor plus static arguments, so their
samples are case tables."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .core import (
    ALL,
    PROMOTION_PARTNER,
    ErrorInput,
    OpInfo,
    SampleInput,
    Strided,
    Transposed,
    cases,
    chain_samples,
    cpu,
    make,
    tensor,
)
from .elementwise import unary_samples

RESHAPE_ROWS = (
    ((3, 4), (12,)),
    ((3, 4), (2, -1)),
    ((3, 4), (4, 3)),
    ((2, 3, 4), (4, 1, 6)),
    ((), (1,)),
    ((1,), ()),
    ((), (-1,)),
    ((0, 3), (3, 0)),
    ((0, 3), (-1,)),
    ((0, 3), (0, 5)),
)
RESHAPES = cases(*RESHAPE_ROWS)

NONCONTIGUOUS_RESHAPES = cases(
    (Transposed((3, 4)), (12,)),  # needs a copy
    (Strided((2, 3, 4)), (-1,)),
)

# Views that are legal on non-contiguous inputs: they split a dim, or merge dims with compatible strides.
NONCONTIGUOUS_VIEWS = cases(
    (Transposed((3, 4)), (3, 2, 2)),
    (Strided((2, 3, 4)), (6, 4)),
)


def reshape_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), (5, 3)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), (-1, -1)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((0, 3)), (0, -1)), RuntimeError)  # -1 is ambiguous with 0 elements


def view_errors() -> Iterable[ErrorInput]:
    # Eager also rejects viewing a non-contiguous tensor as (12,). thunder_rs proxies carry no
    # strides and run `view` as `reshape`, as Lightning Thunder does, so that case succeeds there
    # (a documented divergence): only the shape errors are shared.
    yield from reshape_errors()


# (spec, the shape of `other`): view_as and reshape_as take the shape from a tensor of any dtype.
SHAPE_AS_ROWS = (
    ((3, 4), (12,)),
    ((3, 4), (2, 6)),
    ((2, 3, 4), (4, 1, 6)),
    ((), (1,)),
    ((1,), ()),
    ((0, 3), (3, 0)),
)
NONCONTIGUOUS_SHAPE_AS_ROWS = ((Transposed((3, 4)), (3, 2, 2)), (Strided((2, 3, 4)), (6, 4)))


def shape_as(*rows: tuple):
    """A sample generator for view_as/reshape_as from rows of (spec, shape of `other`)."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for spec, shape in rows:
            yield SampleInput(tensor(spec, dtype, device), make(shape, torch.float64, device))

    return generate


def shape_as_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((5, 3))), RuntimeError)


def splatted(rows: tuple) -> tuple:
    """Rows of (spec, sizes) as (spec, *sizes), for methods that take sizes as varargs."""
    return tuple((spec, *sizes) for spec, sizes in rows if sizes)


PERMUTE_ROWS = (
    ((), ()),
    ((5,), (0,)),
    ((3, 4), (1, 0)),
    ((2, 3, 4), (2, 0, 1)),
    ((2, 3, 4), (-1, 0, 1)),
    ((0, 3, 2), (1, 2, 0)),
    (Transposed((3, 4)), (1, 0)),
)
PERMUTES = cases(*PERMUTE_ROWS)


def permute_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), (0,)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), (0, 0)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), (0, 2)), IndexError)


TRANSPOSES = cases(
    ((), 0, 0),
    ((5,), 0, -1),
    ((3, 4), 0, 1),
    ((2, 3, 4), -1, 0),
    ((2, 0, 4), 1, 2),
    (Transposed((3, 4)), 0, 1),
)

UNFLATTENS = cases(
    ((3, 4), 1, (2, 2)),
    ((3, 4), 0, (3, 1)),
    ((2, 6), -1, (2, -1)),
    ((5,), 0, [5]),
    ((0, 4), 1, (2, 2)),
    ((0, 4), 0, (0, 1)),
    (Transposed((3, 4)), 1, (2, 2)),
    (Strided((2, 6)), 1, (3, 2)),
)


def unflatten_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 1, (3, 2)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 1, ()), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2, (2, 2)), IndexError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 1, (-1, -1)), RuntimeError)


# t() takes tensors of at most 2 dims; `.T` reverses every dim; `.mT` swaps the last two.
MATRIX_TRANSPOSES = cases(((),), ((5,),), ((3, 4),), ((0, 3),), (Transposed((3, 4)),), (Strided((3, 4)),))
BATCH_TRANSPOSES = cases(((3, 4),), ((2, 3, 4),), ((2, 0, 3),), (Transposed((3, 4)),), (Strided((2, 3, 4)),))


def t_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3, 4))), RuntimeError)


def mT_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,))), RuntimeError)


def _T(a):
    return a.T


def _mT(a):
    return a.mT


MOVEDIMS = cases(
    ((2, 3, 4), 0, 2),
    ((2, 3, 4), -1, 0),
    ((2, 3, 4), (0, 1), (2, 0)),
    ((2, 3, 4), [2, 0, 1], [0, 1, 2]),
    ((), 0, -1),
    ((3, 0), 0, 1),
    (Transposed((3, 4)), 0, 1),
    (Strided((2, 3, 4)), (1,), (2,)),
)


def movedim_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), (0, 1), (0,)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), (0, 0), (1, 2)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), 3, 0), IndexError)


def dim_out_of_range(*args) -> Iterable[ErrorInput]:
    """A dim just past the end of a 2-D tensor, followed by `args`."""
    yield ErrorInput(SampleInput(cpu((3, 4)), 2, *args), IndexError)


# `Tensor.expand` takes sizes as varargs.
EXPANDS = cases(
    ((3, 1), 3, 4),
    ((3, 1), -1, 4),
    ((3, 1), 2, 3, 4),
    ((4,), 3, 4),
    ((), 2, 3),
    ((0, 1), 0, 4),
    (Transposed((3, 1)), 3, 4),
)


def expand_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 5, 4), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 4), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), -1, 3, 4), RuntimeError)  # -1 in a new leading dim


def expand_as_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Each case of EXPANDS, the target shape given by a tensor (of another dtype: only its shape counts)."""
    for sample in EXPANDS(dtype, device):
        a, *sizes = sample.args
        shape = tuple(s if s != -1 else a.shape[i - (len(sizes) - a.ndim)] for i, s in enumerate(sizes))
        yield SampleInput(a, make(shape, torch.float64, device))


def expand_as_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((5, 4))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((4,))), RuntimeError)


def broadcast_to_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for sample in EXPANDS(dtype, device):
        a, *sizes = sample.args
        yield SampleInput(a, tuple(sizes))
    yield SampleInput(make((3, 1), dtype, device), torch.Size([2, 3, 5]))


def broadcast_to_errors() -> Iterable[ErrorInput]:
    for error in expand_errors():
        a, *sizes = error.sample.args
        yield ErrorInput(SampleInput(a, tuple(sizes)), error.exc_type)


UNSQUEEZES = cases(
    ((), 0),
    ((), -1),
    ((5,), 1),
    ((3, 4), 1),
    ((3, 4), -1),
    ((3, 4), -3),
    ((0, 3), 0),
    (Transposed((3, 4)), 1),
)


def unsqueeze_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 3), IndexError)


SQUEEZES = cases(
    ((1, 3, 1),),
    ((1, 3, 1), 0),
    ((1, 3, 1), -1),
    ((1, 3, 1), 1),  # not of size 1: a no-op
    ((1, 3, 1), (0, 2)),
    ((),),
    ((), 0),
    ((1, 0, 1),),
    (Transposed((1, 4)), 0),
)

FLATTENS = cases(
    ((),),
    ((3, 4),),
    ((2, 3, 4), 1),
    ((2, 3, 4), 0, 1),
    ((2, 3, 4), -2, -1),
    ((5,), 0, 0),
    ((2, 0, 3),),
    (Transposed((3, 4)),),
    (Strided((2, 3, 4)), 1),
)


def flatten_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), 2, 1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, 2), IndexError)


def cat_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def t(spec, dt=dtype):
        return tensor(spec, dt, device)

    yield SampleInput([t((3, 4)), t((2, 4))])
    yield SampleInput([t((3, 4)), t((3, 2))], 1)
    yield SampleInput([t((2, 3, 4)), t((2, 3, 4)), t((2, 3, 1))], -1)
    yield SampleInput([t((3, 4))], 0)
    yield SampleInput([t((3, 4)), t((0, 4))], 0)
    yield SampleInput([t((3, 4)), t((0,))], 1)  # a 1-D empty tensor is skipped whatever its rank
    yield SampleInput([t(Transposed((3, 4))), t(Strided((3, 4)))], 0)
    yield SampleInput([t((3, 4)), t((1, 4), PROMOTION_PARTNER[dtype])], 0)


def cat_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput([cpu((3, 4)), cpu((3, 5))], 0), RuntimeError)
    yield ErrorInput(SampleInput([cpu((3, 4)), cpu((3,))], 0), RuntimeError)
    yield ErrorInput(SampleInput([cpu((3, 4)), cpu((3, 4))], 2), IndexError)
    yield ErrorInput(SampleInput([cpu(())], 0), RuntimeError)
    yield ErrorInput(SampleInput([], 0), ValueError)


def chunk_cat_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def t(spec):
        return tensor(spec, dtype, device)

    yield SampleInput([t((3, 5)), t((3, 8))], 1, 3)  # padded to a multiple of the chunks
    yield SampleInput([t((3, 5)), t((3, 4, 2))], 1, 2)  # other ranks: the trailing dims flattened
    yield SampleInput([t(Transposed((6, 4)))], -1, 4)
    yield SampleInput([t((7,)), t((4,))], 0, 3)


def chunk_cat_errors() -> Iterable[ErrorInput]:
    a, b = cpu((3, 5)), cpu((3, 4, 2))
    yield ErrorInput(SampleInput([a, b], -1, 2), RuntimeError)
    yield ErrorInput(SampleInput([a, b], 2, 2), RuntimeError)
    yield ErrorInput(SampleInput([a], 1, 0), RuntimeError)
    yield ErrorInput(SampleInput([], 0, 2), RuntimeError)
    yield ErrorInput(SampleInput([cpu((0, 3))], 0, 2), RuntimeError)
    yield ErrorInput(SampleInput([a, cpu((3, 5), torch.float64)], 1, 2), RuntimeError)
    yield ErrorInput(SampleInput([a, cpu((2, 5))], 1, 2), RuntimeError)
    yield ErrorInput(SampleInput([a], 5, 2), IndexError)


def _gradient(a, **kwargs):
    return torch.gradient(a, **kwargs)


def gradient_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Each edge order, a scalar spacing, spacings per dim, one dim, several dims, a transposed input."""
    yield SampleInput(tensor((5,), dtype, device))
    yield SampleInput(tensor((5, 4), dtype, device), edge_order=2)
    yield SampleInput(tensor(Transposed((4, 6)), dtype, device), spacing=[0.5, 3], edge_order=2)
    yield SampleInput(tensor((3, 4, 5), dtype, device), spacing=2.0, dim=1)
    yield SampleInput(tensor((3, 4, 5), dtype, device), dim=[0, -1])


def gradient_coordinate_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Coordinate tensors as spacing: one dim, and every dim at the second edge order."""
    points = {n: torch.tensor([0.0, 1.0, 3.0, 3.5, 7.0, 9.0][:n], dtype=dtype, device=device) for n in (4, 5, 6)}
    yield SampleInput(tensor((5, 4), dtype, device), spacing=[points[5]], dim=0)
    yield SampleInput(tensor(Transposed((4, 6)), dtype, device), spacing=[points[4], points[6]], edge_order=2)


def gradient_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((5,)), edge_order=3), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2,)), edge_order=2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((4, 4)), spacing=[1.0]), RuntimeError)
    yield ErrorInput(SampleInput(cpu((4, 4)), dim=[0, 0]), RuntimeError)
    yield ErrorInput(SampleInput(cpu((4, 4)), dim=2), IndexError)


def combinations_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for n, r, with_replacement in ((4, 2, False), (5, 3, True), (4, 1, False), (3, 0, False), (0, 2, False)):
        yield SampleInput(tensor((n,), dtype, device), r, with_replacement)


def combinations_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 2)), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), -1), RuntimeError)


def stack_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def t(spec, dt=dtype):
        return tensor(spec, dt, device)

    yield SampleInput([t((3, 4)), t((3, 4))])
    yield SampleInput([t((3, 4)), t((3, 4)), t((3, 4))], -1)
    yield SampleInput([t((3, 4))], 2)
    yield SampleInput([t(()), t(())])
    yield SampleInput([t((0, 3)), t((0, 3))], 1)
    yield SampleInput([t(Transposed((3, 4))), t(Strided((3, 4)))], 1)
    yield SampleInput([t((3, 4)), t((3, 4), PROMOTION_PARTNER[dtype])], 0)


def stack_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput([cpu((3, 4)), cpu((4, 3))]), RuntimeError)
    yield ErrorInput(SampleInput([cpu((3, 4)), cpu((3, 4))], 3), IndexError)


ATLEAST = cases(((),), ((5,),), ((3, 4),), ((2, 3, 4),), ((0,),), (Transposed((3, 4)),))


def atleast_many_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Several tensors at once, as varargs and as one list: a tuple comes back."""
    tensors = [make(shape, dtype, device) for shape in ((), (3,), (2, 3))]
    yield SampleInput(*tensors)
    yield SampleInput(tensors)


def concatenate_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """cat's samples, then the dim given as numpy's `axis` keyword and as torch's `dim` (Zamba-2's)."""
    yield from cat_samples(dtype, device)
    yield SampleInput([make((3, 4), dtype, device), make((3, 2), dtype, device)], axis=-1)
    yield SampleInput([make((3, 4), dtype, device), make((3, 2), dtype, device)], dim=-1)


def hstack_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """1-D tensors (and 0-dim ones, made 1-D) join along dim 0, others along dim 1."""

    def t(spec, dt=dtype):
        return tensor(spec, dt, device)

    yield SampleInput([t((3,)), t((2,))])
    yield SampleInput([t(()), t((2,)), t(())])
    yield SampleInput([t((3, 4)), t((3, 2))])
    yield SampleInput([t((2, 3, 4)), t((2, 1, 4))])
    yield SampleInput([t((3, 4)), t((3, 0))])
    yield SampleInput([t(Transposed((3, 4))), t(Strided((3, 4)))])
    yield SampleInput([t((3,)), t((2,), PROMOTION_PARTNER[dtype])])


def vstack_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """0-dim and 1-D tensors become rows; others join along dim 0."""

    def t(spec, dt=dtype):
        return tensor(spec, dt, device)

    yield SampleInput([t((3,)), t((3,))])
    yield SampleInput([t(()), t(())])
    yield SampleInput([t((3,)), t((2, 3))])
    yield SampleInput([t((2, 3, 4)), t((1, 3, 4))])
    yield SampleInput([t((0, 4)), t((2, 4))])
    yield SampleInput([t(Transposed((3, 4))), t(Strided((3, 4)))])
    yield SampleInput([t((2, 3)), t((3,), PROMOTION_PARTNER[dtype])])


def stack_like_errors() -> Iterable[ErrorInput]:
    """hstack/vstack: sizes that do not line up, and no tensors at all."""
    yield ErrorInput(SampleInput([cpu((3, 4)), cpu((2, 5))]), RuntimeError)
    yield ErrorInput(SampleInput([]), RuntimeError)


SPLITS = cases(
    ((5, 4), 2, 0),  # the last piece is shorter
    ((5, 4), [1, 4], 0),
    ((3, 4), 2, -1),
    ((3, 4), [1, 0, 3], 1),
    ((3, 4), 5, 0),
    ((0, 4), 2, 0),
    (Transposed((3, 4)), 3, 1),
)


def split_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), [1, 1], 0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, 0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2, 2), IndexError)


CHUNKS = cases(
    ((5, 4), 2, 0),
    ((3, 4), 3, 1),  # 4 into 3 chunks gives only 2 chunks of 2
    ((3, 4), 5, 0),
    ((3, 4), 1, -1),
    ((0, 4), 2, 0),
    (Transposed((3, 4)), 2, 1),
)


def chunk_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2, 2), IndexError)


# `Tensor.repeat` takes the repeats as varargs or one sequence; extra repeats add leading dims.
REPEATS = cases(
    ((3, 4), 2, 1),
    ((3,), 2, 2),
    ((3, 4), (1, 2, 3)),
    ((), 3),
    ((), ()),
    ((2, 0), 2, 2),
    ((3, 4), 0, 1),
    (Transposed((3, 4)), 1, 2, 1),
    (Strided((2, 3, 4)), 2, 1, 1),
)


def repeat_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2, -1), RuntimeError)


# flip copies: eager returns a new tensor even when `dims` is empty.
FLIP_ROWS = (
    ((3, 4), (0,)),
    ((3, 4), (0, 1)),
    ((2, 3, 4), [-1, 0]),
    ((5,), (0,)),
    ((), ()),
    ((3, 4), ()),
    ((0, 3), (1,)),
    (Transposed((3, 4)), (1,)),
    (Strided((2, 3, 4)), (2,)),
)
FLIPS = cases(*FLIP_ROWS)


def flip_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), (0, 0)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), (2,)), IndexError)


# F.pad: (left, right) pairs from the last dim backwards; negative amounts crop. Values as the
# Hugging Face causal-LM loss pads its labels (-100 on int64), truncated fill values for integers.
PADS = cases(
    ((3, 4), (1, 2)),
    ((3, 4), (0, 1), "constant", -100),
    ((3, 4), (1, 1, 2, 0), "constant", 1.5),
    ((2, 3, 4), (1, -1, -1, 2)),
    ((2, 3, 4), (0, 0, 0, 0, 1, 1), "constant", -2.7),
    ((3, 4), ()),
    ((3, 4), (-2, -2)),
    ((0, 4), (1, 1)),
    ((), ()),
    (Transposed((3, 4)), (2, 1), "constant", 2.5),
    (Strided((2, 3, 4)), (1, 0, 0, 1)),
)
# Reflect, replicate and circular padding through F.pad (their symbols are in torch/padding.py).
FALLBACK_PADS = cases(
    ((2, 3, 4), (1, 1), "replicate"),
    ((2, 3, 4), (2, 1, 1, 0), "reflect"),
    ((2, 3, 4), (1, 2), "circular"),
    ((3, 4), (2, 1), "constant", float("inf")),
)


def pad_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), (1,)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), (1, 1, 1, 1, 1, 1)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), (-3, -2)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4), torch.int64), (1, 1), "constant", float("inf")), RuntimeError)


OPS = [
    OpInfo("pad", torch.nn.functional.pad, PADS, pad_errors, ALL),
    OpInfo("pad", torch.nn.functional.pad, FALLBACK_PADS, variant="modes"),
    OpInfo("reshape", torch.reshape, chain_samples(RESHAPES, NONCONTIGUOUS_RESHAPES), reshape_errors, ALL),
    OpInfo("reshape", torch.Tensor.reshape, cases(*splatted(RESHAPE_ROWS)), dtypes=ALL, variant="method"),
    OpInfo("view", torch.Tensor.view, chain_samples(RESHAPES, NONCONTIGUOUS_VIEWS), view_errors, ALL),
    OpInfo(
        "view_as",
        torch.Tensor.view_as,
        shape_as(*SHAPE_AS_ROWS, *NONCONTIGUOUS_SHAPE_AS_ROWS[:1]),
        shape_as_errors,
        ALL,
    ),
    OpInfo(
        "reshape_as",
        torch.Tensor.reshape_as,
        shape_as(*SHAPE_AS_ROWS, *NONCONTIGUOUS_SHAPE_AS_ROWS),
        shape_as_errors,
        ALL,
    ),
    OpInfo("ravel", torch.ravel, unary_samples, dtypes=ALL),
    OpInfo("unflatten", torch.unflatten, UNFLATTENS, unflatten_errors, ALL),
    OpInfo("unflatten", torch.Tensor.unflatten, UNFLATTENS, dtypes=ALL, variant="method"),
    OpInfo("permute", torch.permute, PERMUTES, permute_errors, ALL),
    OpInfo("permute", torch.Tensor.permute, cases(*splatted(PERMUTE_ROWS)), dtypes=ALL, variant="method"),
    OpInfo("transpose", torch.transpose, TRANSPOSES, lambda: dim_out_of_range(0), ALL),
    OpInfo("swapaxes", torch.swapaxes, TRANSPOSES, lambda: dim_out_of_range(0), ALL),
    OpInfo("t", torch.t, MATRIX_TRANSPOSES, t_errors, ALL),
    OpInfo("T", _T, cases(((),), ((3, 4),), ((0, 3),), (Transposed((3, 4)),)), dtypes=ALL),
    OpInfo("mT", _mT, BATCH_TRANSPOSES, mT_errors, ALL),
    OpInfo("movedim", torch.movedim, MOVEDIMS, movedim_errors, ALL),
    OpInfo("movedim", torch.Tensor.moveaxis, MOVEDIMS, dtypes=ALL, variant="moveaxis"),
    OpInfo("contiguous", torch.Tensor.contiguous, unary_samples, dtypes=ALL),
    OpInfo("alias", torch.ops.aten.alias, unary_samples, dtypes=ALL),
    OpInfo("expand", torch.Tensor.expand, EXPANDS, expand_errors, ALL),
    OpInfo("expand_as", torch.Tensor.expand_as, expand_as_samples, expand_as_errors, ALL),
    OpInfo("broadcast_to", torch.broadcast_to, broadcast_to_samples, broadcast_to_errors, ALL),
    OpInfo("unsqueeze", torch.unsqueeze, UNSQUEEZES, unsqueeze_errors, ALL),
    OpInfo("squeeze", torch.squeeze, SQUEEZES, dim_out_of_range, ALL),
    OpInfo("atleast_1d", torch.atleast_1d, ATLEAST, dtypes=ALL),
    OpInfo("atleast_1d", torch.atleast_1d, atleast_many_samples, dtypes=ALL, variant="many"),
    OpInfo("atleast_2d", torch.atleast_2d, ATLEAST, dtypes=ALL),
    OpInfo("atleast_2d", torch.atleast_2d, atleast_many_samples, dtypes=ALL, variant="many"),
    OpInfo("flatten", torch.flatten, FLATTENS, flatten_errors, ALL),
    OpInfo("cat", torch.cat, cat_samples, cat_errors, ALL),
    OpInfo("concatenate", torch.concatenate, concatenate_samples, cat_errors, ALL),
    OpInfo("stack", torch.stack, stack_samples, stack_errors, ALL),
    OpInfo("chunk_cat", torch._chunk_cat, chunk_cat_samples, chunk_cat_errors, ALL, supports_grad=False),
    OpInfo("gradient", _gradient, gradient_samples, gradient_errors),
    OpInfo("gradient", _gradient, gradient_coordinate_samples, variant="coordinates"),
    OpInfo("combinations", torch.combinations, combinations_samples, combinations_errors, ALL),
    OpInfo("hstack", torch.hstack, hstack_samples, stack_like_errors, ALL),
    OpInfo("vstack", torch.vstack, vstack_samples, stack_like_errors, ALL),
    OpInfo("split", torch.split, SPLITS, split_errors, ALL),
    OpInfo("chunk", torch.chunk, CHUNKS, chunk_errors, ALL),
    OpInfo("repeat", torch.Tensor.repeat, REPEATS, repeat_errors, ALL),
    OpInfo("flip", torch.flip, FLIPS, flip_errors, ALL),
    OpInfo("flip", torch.Tensor.flip, cases(*splatted(FLIP_ROWS)), dtypes=ALL, variant="method"),
]
