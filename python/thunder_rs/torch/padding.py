"""Padding: ``F.pad`` in every mode and ``constant_pad_nd``.

Constant padding is ``ltorch.pad`` (a pad prim, ``torch/joins.py``). Reflect, replicate and
circular padding copy input elements: along each padded dim, output position ``j`` reads a
source position known while tracing, so the padded dim is a concatenation of slices of the
input (read forwards, or backwards where it reflects). Their gradient is the sum of the
slices' gradients, what eager's backward kernels compute.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import prims
from thunder_rs.core.lang.eager_layouts import _suggested
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.common import is_int
from thunder_rs.torch.symbols import ltorch, read_numbers, torchsymbol
from thunder_rs.torch.joins import pad as constant_pad
from thunder_rs.torch.shape import clone, slice_in_dim

__all__ = ["constant_pad_nd", "reflection_pad", "replication_pad", "circular_pad"]


def take_positions(a, dim: int, positions):
    """``a`` indexed along ``dim`` by the known ``positions``: each run of consecutive positions
    (rising or falling) is one slice, flipped when it falls."""
    runs, i = [], 0
    while i < len(positions):
        j = i + 1
        step = positions[j] - positions[i] if j < len(positions) else 1
        step = step if step in (1, -1) else 1
        while j < len(positions) and positions[j] - positions[j - 1] == step:
            j += 1
        lo, hi = min(positions[i], positions[j - 1]), max(positions[i], positions[j - 1])
        part = slice_in_dim(a, dim, lo, hi + 1)
        runs.append(prims.flip(part, (dim,)) if step == -1 and hi > lo else part)
        i = j
    if len(runs) == 1:
        return runs[0]
    return prims.cat(runs, dim)


def fresh(out, a):
    """``out``, or a copy of ``a`` when ``out`` is ``a``: what eager returns from an op that copies
    even when it has nothing to do, made where the op is called (its gradient reaches ``a`` in
    eager's order among ``a``'s others) and laid out as ``a`` (``empty_like``)."""
    return clone(a) if out is a else out


def _reflect(src: int, size: int) -> int:
    if src < 0:
        return -src
    return 2 * (size - 1) - src if src >= size else src


def _replicate(src: int, size: int) -> int:
    return min(max(src, 0), size - 1)


#: F.pad's non-constant modes: how many dims a pad of each length pads, and the input ranks it accepts.
_RANKS = {2: (2, 3), 4: (3, 4), 6: (4, 5)}


def _check_modes(op: str, mode: str, a, pad) -> list[tuple[int, int, int]]:
    """(dim, left, right) for each dim padded, last dim first, after eager's checks."""
    check(
        isinstance(pad, (tuple, list)) and all(is_int(p) for p in pad),
        op,
        f"argument 'pad' must be tuple of ints, got {pad!r} (argument pad)",
        ThunderTypeError,
    )
    check(len(pad) % 2 == 0, op, "Padding length must be divisible by 2 (argument pad)", ThunderRuntimeError)
    check(
        a.ndim in _RANKS.get(len(pad), ()),
        op,
        lambda: (
            f"Padding size {len(pad)} is not supported for {a.ndim}D input tensor: {mode} padding pads 1 to 3 trailing "
            "dims of a 2D to 5D input, with one or two leading dims (argument pad)"
        ),
        ThunderNotImplementedError,
    )
    k = len(pad) // 2
    if mode != "circular":
        check(
            a.dtype != torch.bool,
            op,
            f"{mode} padding is not implemented for 'Bool' (argument input)",
            ThunderNotImplementedError,
        )
        lead = 1 if a.ndim == k + 2 else 0
        check(
            all(s != 0 for s in a.shape[lead:]),
            op,
            lambda: (
                f"Expected {k + 1}D or {k + 2}D (batch mode) tensor with possibly 0 batch size and other non-zero "
                f"dimensions for input, but got: {list(a.shape)} (argument input)"
            ),
            ThunderRuntimeError,
        )
    return [(a.ndim - 1 - i, pad[2 * i], pad[2 * i + 1]) for i in range(k)]


def _index_pad(op: str, mode: str, a, pad, source):
    for d, lo, hi in _check_modes(op, mode, a, pad):
        size = a.shape[d]
        if mode == "reflect":
            check(
                lo < size and hi < size,
                op,
                lambda: (
                    "Argument #4: Padding size should be less than the corresponding input dimension, but got: padding "
                    f"({lo}, {hi}) at dimension {d} of input {list(a.shape)} (argument pad)"
                ),
                ThunderRuntimeError,
            )
        check(
            size + lo + hi >= 1,
            op,
            f"input (W: {size}) is too small. Calculated output W: {size + lo + hi} (argument pad)",
            ThunderRuntimeError,
        )
        if (lo, hi) != (0, 0):
            symbolic = _symbolic(size, lo, hi) and lo >= 0 and hi >= 0
            a = _pad_by_slices(a, d, lo, hi, mode) if symbolic else _pad_by_positions(a, d, lo, hi, source)
    return a


def _symbolic(*sizes) -> bool:
    """Whether a padded dim's length or an amount is symbolic: then the padding is slices of
    symbolic bounds, not a list of positions (which would specialise them)."""
    return any(type(n) is SymInt for n in sizes)


def _pad_by_positions(a, d: int, lo: int, hi: int, source):
    size = a.shape[d]
    return take_positions(a, d, [source(j - lo, size) for j in range(size + lo + hi)])


def _pad_by_slices(a, d: int, lo: int, hi: int, mode: str):
    """Padding of a symbolic length (no position list to read runs from): the borders are slices
    of the input, flipped where they reflect, repeated where they replicate."""
    size = a.shape[d]
    if mode == "reflect":
        left, right = (slice_in_dim(a, d, 1, lo + 1), slice_in_dim(a, d, size - 1 - hi, size - 1))
        left, right = (prims.flip(part, (d,)) for part in (left, right))
    elif mode == "circular":
        left, right = slice_in_dim(a, d, size - lo, size), slice_in_dim(a, d, 0, hi)
    else:  # replicate
        first, last = slice_in_dim(a, d, 0, 1), slice_in_dim(a, d, size - 1, size)
        left, right = (_repeated(edge, d, n) if n else None for edge, n in ((first, lo), (last, hi)))
    return prims.cat([part for part in (left, a, right) if part is not None and part.shape[d] != 0], d)


def _repeated(edge, d: int, n):
    """``edge`` (length 1 along ``d``) repeated ``n`` times along ``d`` (a broadcast where ``n``
    is symbolic; the caller concatenates it)."""
    if type(n) is not SymInt:
        return prims.cat([edge] * n, d)
    return prims.broadcast_in_dim(edge, (*edge.shape[:d], n, *edge.shape[d + 1 :]), tuple(range(edge.ndim)))


def _reflect_pad(input, pad):
    return F.pad(input, pad, mode="reflect")


def _replicate_pad(input, pad):
    return F.pad(input, pad, mode="replicate")


def _circular_pad(input, pad):
    return F.pad(input, pad, mode="circular")


@torchsymbol(_reflect_pad, name="reflection_pad")
def reflection_pad(input, pad):
    """``F.pad(input, pad, "reflect")``: the border mirrored, the edge element not repeated."""
    return fresh(_index_pad("ltorch.reflection_pad", "reflect", input, pad, _reflect), input)


@torchsymbol(_replicate_pad, name="replication_pad")
def replication_pad(input, pad):
    """``F.pad(input, pad, "replicate")``: the edge element repeated."""
    return fresh(_index_pad("ltorch.replication_pad", "replicate", input, pad, _replicate), input)


@torchsymbol(_circular_pad, name="circular_pad")
def circular_pad(input, pad):
    """``F.pad(input, pad, "circular")``: negative amounts crop first; the cropped dim then wraps
    around, as eager's kernel copies it (a wrap longer than the cropped dim reads memory eager
    never wrote, so it is refused)."""
    op = "ltorch.circular_pad"
    out = input
    for d, lo, hi in _check_modes(op, "circular", input, pad):
        size = input.shape[d]
        check(
            lo <= size and hi <= size,
            op,
            "Padding value causes wrapping around more than once. (argument pad)",
            ThunderRuntimeError,
        )
        check(
            size + lo + hi >= 0,
            op,
            "Negative padding value is resulting in an empty dimension. (argument pad)",
            ThunderRuntimeError,
        )
        cropped = size - max(-lo, 0) - max(-hi, 0)
        check(
            max(lo, hi, 0) <= cropped,
            op,
            lambda: (
                f"padding ({lo}, {hi}) of dimension {d} wraps around the {cropped} elements left after cropping more "
                "than once; eager reads memory it never wrote there (argument pad)"
            ),
            ThunderRuntimeError,
        )
        if _symbolic(size, lo, hi) and lo >= 0 and hi >= 0:
            out = _pad_by_slices(out, d, lo, hi, "circular") if (lo, hi) != (0, 0) else out
            continue
        first, left = max(-lo, 0), max(lo, 0)
        positions = [first + (j - left) % cropped for j in range(size + lo + hi)] if cropped else []
        if positions != list(range(size)):
            out = take_positions(out, d, positions) if positions else slice_in_dim(out, d, 0, 0)
    return fresh(out, input)


@register_grad(ltorch.circular_pad)
def circular_pad_grad(input, pad):
    """Eager's backward of its circular padding (``_pad_circular``: the input copied into the
    middle of a new tensor, then each dim's wraps copied from it, last dim first, left before
    right): each wrap's gradient moved onto its source's, in the reverse order, and the middle's
    the input's, one gradient. (Differentiating the slices the trace takes gave the input one per
    slice, added among the input's other uses in another order.) Crops keep the decomposition's."""
    out = circular_pad(input, pad)
    dims = _check_modes("ltorch.circular_pad", "circular", input, pad)
    if not (input.requires_grad and input.dtype.is_floating_point) or any(lo < 0 or hi < 0 for _, lo, hi in dims):
        return out
    g = get_grad(out)
    for d, lo, hi in reversed(dims):
        n = g.shape[d]
        if hi > 0:
            g = _copied_grad(g, d, n - hi, lo, hi)
        if lo > 0:
            g = _copied_grad(g, d, 0, n - lo - hi, lo)
    for d, lo, hi in dims:
        g = ltorch.narrow(g, d, lo, g.shape[d] - lo - hi)
    put_grad(input, g)
    return out


def _copied_grad(g, d: int, dst, src, n):
    """The gradient before eager's ``copy_`` of ``[src, src + n)`` along ``d`` into ``[dst, dst +
    n)`` of one tensor: ``g`` zeroed where it was written, plus the written part's gradient at its
    source (two full-size tensors added, as autograd adds them)."""
    size = g.shape[d]

    def zeros(k):
        return ltorch.zeros(tuple(k if i == d else s for i, s in enumerate(g.shape)), dtype=g.dtype, device=g.device)

    written = ltorch.narrow(g, d, dst, n)
    kept = ltorch.cat([ltorch.narrow(g, d, 0, dst), zeros(n), ltorch.narrow(g, d, dst + n, size - dst - n)], d)
    return kept + ltorch.cat([zeros(src), written, zeros(size - src - n)], d)


_MODES = {"reflect": reflection_pad, "replicate": replication_pad, "circular": circular_pad}


def _pad(input, pad, mode="constant", value=None):
    """``F.pad``: constant padding is ``ltorch.pad``; each other mode has its own symbol. Amounts
    given as 0-dim integer tensors are read as eager's argument parser reads them (EnCodec pads
    by a buffer and by a length it computes with tensors)."""
    (pad,), _ = read_numbers((pad,), {}, 0)
    if mode == "constant":  # eager copies even when nothing is padded (its layout: ``fresh``)
        return fresh(constant_pad(input, pad, mode, value), input)
    check(mode in _MODES, "ltorch.pad", f"Unrecognised padding mode {mode} (argument mode)", ThunderNotImplementedError)
    check(
        value is None or value == 0,
        "ltorch.pad",
        f'Padding mode "{mode}" doesn\'t take in value argument (argument value)',
        ThunderRuntimeError,
    )
    return _MODES[mode](input, pad)


TORCH_TO_LTORCH[F.pad] = _pad
# F.pad's own kernel, which the graphs torch.compile hands a backend call (Dynamo inlines F.pad).
TORCH_TO_LTORCH[torch._C._nn.pad] = _pad


@torchsymbol(torch.constant_pad_nd, reads_numbers_from=1)
def constant_pad_nd(input, pad, value=0):
    op = "ltorch.constant_pad_nd"
    check(
        len(pad) // 2 <= input.ndim,
        op,
        lambda: (
            "Length of pad should be no more than twice the number of dimensions of the input. Pad length is "
            f"{len(pad)} while the input has {input.ndim} dimensions. (argument pad)"
        ),
        ThunderRuntimeError,
    )
    return fresh(constant_pad(input, list(pad), "constant", value), input)


# -- grad rules ------------------------------------------------------------------------------------


def _source_index(mode: str, n_out: int, lo: int, size: int, device):
    """The input position each of ``n_out`` output positions reads along a dim padded by ``lo``
    in front: clamped into the dim (replicate) or mirrored at its ends (reflect)."""
    j = ltorch.arange(n_out, device=device) - lo
    if mode == "replicate":
        return ltorch.clamp(j, 0, size - 1)
    return (size - 1) - ltorch.abs((size - 1) - ltorch.abs(j))


def _index_pad_grad(symbol, mode: str, input, pad):
    """Eager's ``reflection_pad*d_backward`` and ``replication_pad*d_backward`` kernels: each
    output element's gradient added into its source element in the output's row-major order
    (a ``scatter_add`` over the flattened padded dims), so that the sums round as eager's. Half
    precision adds one element at a time too, in its own dtype (``_serial_sum``). Symbolic sizes
    take the same path (the decomposition's VJP, slices' gradients added, rounds otherwise)."""
    out = symbol(input, pad)
    k = len(pad) // 2
    sizes, amounts = tuple(input.shape[-k:]), [(pad[2 * i], pad[2 * i + 1]) for i in reversed(range(k))]
    if not (input.requires_grad and input.dtype.is_floating_point) or out is input:
        return out
    lead, n_out = tuple(input.shape[:-k]), tuple(out.shape[-k:])
    flat = None
    for i, (size, (lo, _), count) in enumerate(zip(sizes, amounts, n_out)):
        index = _source_index(mode, count, lo, size, input.device) * math.prod(sizes[i + 1 :])
        index = ltorch.reshape(index, tuple(count if d == i else 1 for d in range(k)))
        flat = index if flat is None else flat + index
    flat = ltorch.reshape(ltorch.expand(flat, (*lead, *n_out)), (*lead, math.prod(n_out)))
    g = ltorch.reshape(get_grad(out), (*lead, math.prod(n_out)))
    if input.dtype in (torch.float32, torch.float64):
        zeros = ltorch.zeros((*lead, math.prod(sizes)), dtype=input.dtype, device=input.device)
        grad = ltorch.reshape(ltorch.scatter_add(zeros, len(lead), flat, g), tuple(input.shape))
    else:
        grad = _serial_sum(flat, g, input, math.prod(sizes))
    layout = _suggested(input)  # (eager's kernel writes a channels_last input's gradient so)
    put_grad(input, grad if layout == torch.contiguous_format else grad.contiguous(memory_format=layout))
    return out


def _serial_sum(flat, g, input, plane: int):
    """The gradient of a half-precision ``input`` from ``g`` (its planes' output elements, row-major)
    added in that order into the positions ``flat`` gives, each sum rounded to the dtype: eager's
    kernels ``+=`` in bfloat16 and float16. (Its ``scatter_add`` sums these dtypes in float32, one
    rounding.) An accumulating ``index_put`` over one flat dim adds serially, in index order."""
    planes = math.prod(input.shape) // plane if plane else 0
    offsets = ltorch.reshape(ltorch.arange(planes, device=input.device) * plane, (*flat.shape[:-1], 1))
    index = ltorch.reshape(flat + offsets, (flat.numel(),))
    zeros = ltorch.zeros((planes * plane,), dtype=input.dtype, device=input.device)
    summed = ltorch.index_put(zeros, (index,), ltorch.reshape(g, (g.numel(),)), True)
    return ltorch.reshape(summed, tuple(input.shape))


@register_grad(ltorch.reflection_pad)
def reflection_pad_grad(input, pad):
    return _index_pad_grad(ltorch.reflection_pad, "reflect", input, pad)


@register_grad(ltorch.replication_pad)
def replication_pad_grad(input, pad):
    return _index_pad_grad(ltorch.replication_pad, "replicate", input, pad)
