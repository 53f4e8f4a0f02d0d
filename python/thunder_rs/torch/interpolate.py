"""Interpolation (``F.interpolate``, which the ``upsample`` aliases call): nearest, nearest-exact,
(bi/tri)linear, bicubic and area resizing of 1 to 3 spatial dims, bilinear and bicubic also
antialiased (``antialias=True``), with its backward kernel ``upsample_backward`` and its grad rule.

Except area (adaptive average pooling), each mode is separable: along each spatial dim an
output element is a weighted sum of a few input elements ("taps"), whose positions and weights
``_taps`` computes as aten's CPU kernels do (in float32 for the nearest modes, in the compute
dtype otherwise). The decomposition takes the taps with one ``take`` per dim; the backward,
``upsample_backward``, adds the weighted gradients back with one ``index_add`` per dim, and the
torch executor runs it as the aten backward eager's autograd calls.

Sizes may be symbolic (an FPN resizing to its skip connection's shape): a scale aten computes
from the sizes is then a 0-d tensor the trace computes from them on each call, in the dtype aten
divides them in, and nearest's branches on the sizes (out == in, out == 2 * in) are taken per
call by a ``where``, not by a guard; where the sizes are constants, the scales are constants.
"""

import fractions
import functools
import math

import torch
import torch.nn.functional as F

from thunder_rs import prims
from thunder_rs.torch.adaptive_pooling import _adaptive_avg_grad
from thunder_rs.torch.common import OpaqueKernel, read_ints, size_value
from thunder_rs.torch.symbols import ltorch
from thunder_rs.errors import (
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    ThunderValueError,
    check,
)
from thunder_rs.core.lang.eager_layouts import suggested_format
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt, floor_of_product, is_positive, is_symbolic
from thunder_rs.torch.creation import filled
from thunder_rs.torch.symbols import torchsymbol

__all__ = ["interpolate", "upsample_backward"]

_LINEAR_MODES = {"linear": 1, "bilinear": 2, "trilinear": 3, "bicubic": 2}
_MODES = ("nearest", "nearest-exact", "area", *_LINEAR_MODES)
_CUBIC_A = -0.75
_HALVES = (torch.float16, torch.bfloat16)
#: The support of each antialiasing filter in input elements at scale 1 (aten's ``interp_size``).
_AA_SUPPORT = {"bilinear": 2, "bicubic": 4}
#: The bound on a scale factor's numerator and denominator below which a symbolic size is scaled
#: as a fraction (``_scaled``).
_SHORT = 2**20


# -- arguments -------------------------------------------------------------------------------------


def _check_mode(op: str, input, mode: str, align_corners, antialias) -> None:
    check(
        mode in _MODES,
        op,
        f"unsupported mode {mode!r}; thunder_rs supports {', '.join(_MODES)} (argument mode)",
        ThunderNotImplementedError,
    )
    check(
        not antialias or (mode in _AA_SUPPORT and input.ndim == 4),
        op,
        "Anti-alias option is restricted to bilinear, bicubic, and lanczos modes and requires a 4-D tensor "
        "as input (argument antialias)",
        ThunderValueError,
    )
    check(
        not antialias or input.dtype.is_floating_point,
        op,
        lambda: f"antialiased {mode} interpolation is not implemented for {input.dtype} (argument input)",
        ThunderNotImplementedError,
    )
    check(
        mode in _LINEAR_MODES or align_corners is None,
        op,
        "align_corners option can only be set with the "
        "interpolating modes: linear | bilinear | bicubic | trilinear (argument align_corners)",
        ThunderValueError,
    )
    check(
        input.ndim in (3, 4, 5),
        op,
        f"Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) for the modes: "
        "nearest | linear | bilinear | bicubic | trilinear | area | nearest-exact (argument input)",
        ThunderNotImplementedError,
    )
    wanted = _LINEAR_MODES.get(mode)
    needed = None if wanted is None else wanted + 2
    check(
        needed is None or needed == input.ndim,
        op,
        lambda: f"Got {input.ndim}D input, but {mode} mode needs {needed}D input (argument mode)",
        ThunderNotImplementedError,
    )
    floats_only = mode not in ("nearest", "nearest-exact")
    ok = input.dtype.is_floating_point or (not floats_only and input.dtype == torch.uint8)
    check(
        ok,
        op,
        lambda: f"{mode} interpolation is not implemented for {input.dtype} (argument input)",
        ThunderNotImplementedError,
    )


def _sizes_and_scales(op: str, input, size, scale_factor, mode, recompute_scale_factor):
    """The output's spatial sizes and the scales the kernel is given (None: from the sizes), as
    F.interpolate computes them."""
    n = input.ndim - 2
    spatial = tuple(input.shape[2:])
    check(
        size is None or scale_factor is None,
        op,
        "only one of size or scale_factor should be defined (argument scale_factor)",
        ThunderValueError,
    )
    check(
        size is not None or scale_factor is not None,
        op,
        "either size or scale_factor should be defined (argument size)",
        ThunderValueError,
    )
    if size is not None:
        check(
            not recompute_scale_factor,
            op,
            "recompute_scale_factor is not meaningful with an explicit size (argument recompute_scale_factor)",
            ThunderValueError,
        )
        sizes = read_ints(tuple(size) if isinstance(size, (list, tuple)) else (size,) * n)
        check(
            len(sizes) == n,
            op,
            f"Input and output must have the same number of spatial dimensions, but got input "
            f"with spatial dimensions of {list(spatial)} and output size of {size} (argument size)",
            ThunderValueError,
        )
        check(
            all(isinstance(s, (int, SymInt)) for s in sizes),
            op,
            f"expected size to be ints, got {size} (argument size)",
            ThunderTypeError,
        )
        scales = (None,) * n
    else:
        scales = tuple(scale_factor) if isinstance(scale_factor, (list, tuple)) else (scale_factor,) * n
        check(
            len(scales) == n,
            op,
            f"Input and scale_factor must have the same number of spatial dimensions, but "
            f"got input with spatial dimensions of {list(spatial)} and scale_factor of shape {scale_factor} "
            "(argument scale_factor)",
            ThunderValueError,
        )
        sizes = tuple(_scaled(s, f) for s, f in zip(spatial, scales))
        if recompute_scale_factor or mode == "area":
            scales = (None,) * n
    check(
        all(s > 0 for s in spatial) and all(o > 0 for o in sizes),
        op,
        f"Input and output sizes should be greater "
        f"than 0, but got input {list(spatial)} and output {list(sizes)} (argument size)",
        ThunderRuntimeError,
    )
    check(
        input.shape[1] > 0,
        op,
        f"Non-empty data tensor expected but got a tensor with sizes {list(input.shape)} (argument input)",
        ThunderRuntimeError,
    )
    return sizes, scales


def _scaled(size, factor):
    """``floor(float(size) * factor)``, as F.interpolate sizes its output. A symbolic size stays
    symbolic by a whole factor (upsampling by 2), and by a short binary fraction ``m / d`` (1.5 is
    3 / 2): the double product is then exactly ``size * m / d`` wherever ``size * m < 2**53`` (a
    guard), so its floor is ``size * m // d``. By any other factor (0.1 has no short binary
    fraction), ``size * a // b`` of the nearest short fraction ``a / b`` where ``size * a / b`` is
    no integer (``_near_fraction``: guards); elsewhere the size is taken at its value (a guard)."""
    if type(factor) is SymFloat:
        exact = floor_of_product(size, factor)
        if exact is not None:
            return exact
    if type(size) is SymInt and factor > 0:
        m, d = float(factor).as_integer_ratio()
        if d == 1:  # an output of 2**53 elements or more is never made
            return size * m
        if m < _SHORT and d < _SHORT and size * m < 2**53:
            return size * m // d
        near = _near_fraction(float(factor))
        if near is not None and size < near[2] and (size * near[0]) % near[1] != 0:
            return size * near[0] // near[1]
    return int(math.floor(float(size) * factor))


@functools.lru_cache(maxsize=64)
def _near_fraction(c: float):
    """``(a, b, limit)`` for a factor ``c`` with no short binary fraction (1.7, 0.3): ``a / b`` the
    nearest fraction of a short denominator (17 / 10), and for every size ``T < limit`` whose
    ``T * a`` is no multiple of ``b`` (a guard each), ``floor(float(T) * c)`` is ``T * a // b``:
    ``T * a / b`` is at least ``1 / b`` from every integer, and the double product differs from it
    by less (``T * |c - a / b|``, plus its rounding, ``T * c * 2**-53``). A size where ``T * a / b``
    is an integer is taken at its value (there the rounding decides). None where no fraction is
    near enough."""
    exact = fractions.Fraction(c)
    near = exact.limit_denominator(_SHORT)
    if near == exact or near <= 0:
        return None
    error = abs(exact - near) + exact / 2**53
    limit = min(math.floor(1 / (near.denominator * error)), 2**62 // near.numerator)
    return (near.numerator, near.denominator, limit) if limit > 2 else None


# -- taps ------------------------------------------------------------------------------------------


def _rounded(x: float, dtype) -> float:
    """``x`` in ``dtype``: rounded to float32 as aten's ``compute_scales_value<float>`` gives it."""
    return float(torch.tensor(x, dtype=torch.float32)) if dtype == torch.float32 else x


def _scale(device, in_size, out_size, scale, align_corners: bool, dtype):
    """aten's ``area_pixel_compute_scale`` in ``dtype``: input elements per output element. A
    Python float where it is a constant; a ratio of symbolic sizes is a 0-d tensor, the sizes
    converted to ``dtype`` and divided in it on each call, as aten divides them."""
    if align_corners:
        if out_size <= 1:
            return 0.0
        num, den = in_size - 1, out_size - 1
    elif type(scale) is SymFloat and dtype in (torch.float32, torch.float64) and is_positive(scale):
        # 1.0 / scale computed in double on each call, rounded to dtype as ``_rounded`` rounds it
        return filled((), 1.0 / scale, device, dtype)
    elif scale is not None and scale > 0:
        return _rounded(1.0 / scale, dtype)
    else:
        num, den = in_size, out_size
    if is_symbolic((num, den)):
        return prims.div(size_value(device, dtype, num), size_value(device, dtype, den))
    return _rounded(num / den, dtype)


def _positions(device, dtype, out_size, scale, offset: float):
    """(o + offset) * scale for each output index o, in ``dtype``; ``scale`` a number or a 0-d tensor."""
    o = prims.convert_element_type(prims.iota(out_size, 0, 1, device, torch.int64), dtype)
    if not isinstance(scale, (int, float)):
        scale = prims.broadcast_in_dim(scale, (out_size,), ())
    return prims.mul(prims.add(o, offset) if offset else o, scale)


def _equal(a, b):
    """``a == b`` for sizes: a bool where ints or one expression tell, None where only each call's
    sizes do (no guard: a guard would flip where a decoder's sizes are sometimes twice the input's)."""
    d = a - b
    return d == 0 if type(d) is int else None


def _shortcuts(in_size, out_size, scale):
    """Whether aten's nearest copies the index (out == in) and halves it (out == 2 * in): bools,
    or None where only each call's sizes tell. A whole scale factor made ``out == in * scale``."""
    whole = scale is not None and type(scale) is not SymFloat and float(scale).is_integer()
    if whole and _equal(out_size, in_size * int(scale)):
        return scale == 1, scale == 2
    return _equal(out_size, in_size), _equal(out_size, 2 * in_size)


def _per_call(device, out_size, a, b, selected, otherwise):
    """``selected`` where ``a == b`` in this call, else ``otherwise``: aten's branch on its sizes."""
    same = prims.eq(size_value(device, torch.int64, a - b), 0)
    return prims.where(prims.broadcast_in_dim(same, (out_size,), ()), selected, otherwise)


def _nearest_taps(device, in_size, out_size, scale, exact: bool):
    """min(floor((o [+ 0.5]) * scale), in - 1), in float32 as aten computes it for every dtype,
    save that nearest (not exact) copies the index where out == in and halves it where out == 2 * in
    (``nearest_idx``, UpSampleKernel.cpp)."""
    copy, halve = (False, False) if exact else _shortcuts(in_size, out_size, scale)
    if copy is True:
        return prims.reshape(prims.iota(out_size, 0, 1, device, torch.int64), (out_size, 1)), None
    if halve is True:  # aten halves the index exactly
        source = prims.div(prims.iota(out_size, 0, 1, device, torch.int64), 2)
    else:
        s = _scale(device, in_size, out_size, scale, False, torch.float32)
        positions = _positions(device, torch.float32, out_size, s, 0.5 if exact else 0)
        source = prims.convert_element_type(prims.floor(positions), torch.int64)
        index = prims.iota(out_size, 0, 1, device, torch.int64) if None in (copy, halve) else None
        if halve is None:
            source = _per_call(device, out_size, out_size, 2 * in_size, prims.div(index, 2), source)
        if copy is None:
            source = _per_call(device, out_size, out_size, in_size, index, source)
    return prims.reshape(prims.minimum(source, in_size - 1), (out_size, 1)), None


def _source(device, dtype, in_size, out_size, scale, align_corners: bool, cubic: bool):
    """aten's ``area_pixel_compute_source_index``: each output element's position in the input."""
    s = _scale(device, in_size, out_size, scale, align_corners, dtype)
    if align_corners:
        return _positions(device, dtype, out_size, s, 0)
    src = prims.sub(_positions(device, dtype, out_size, s, 0.5), 0.5)
    return src if cubic else prims.maximum(src, 0.0)


def _stack(columns):
    return prims.cat([prims.reshape(c, (c.shape[0], 1)) for c in columns], 1)


def _linear_taps(device, dtype, in_size, out_size, scale, align_corners: bool):
    # Where the sizes are equal aten takes each element at its own index whatever scale it is
    # given (``compute_source_index_and_lambda``), as the scale 1 does.
    if scale is not None and not align_corners and out_size == in_size:
        scale = 1.0
    src = _source(device, dtype, in_size, out_size, scale, align_corners, cubic=False)
    low = prims.minimum(prims.convert_element_type(prims.floor(src), torch.int64), in_size - 1)
    lam = prims.minimum(prims.maximum(prims.sub(src, prims.convert_element_type(low, dtype)), 0.0), 1.0)
    high = prims.where(prims.lt(low, in_size - 1), prims.add(low, 1), low)
    return _stack([low, high]), _stack([prims.sub(1.0, lam), lam])


def _cubic_near(x):  # |x| <= 1
    return prims.add(prims.mul(prims.mul(prims.sub(prims.mul(x, _CUBIC_A + 2), _CUBIC_A + 3), x), x), 1.0)


def _cubic_far(x):  # 1 < |x| < 2
    inner = prims.add(prims.mul(prims.sub(prims.mul(x, _CUBIC_A), 5 * _CUBIC_A), x), 8 * _CUBIC_A)
    return prims.sub(prims.mul(inner, x), 4 * _CUBIC_A)


def _cubic_taps(device, dtype, in_size, out_size, scale, align_corners: bool):
    src = _source(device, dtype, in_size, out_size, scale, align_corners, cubic=True)
    base = prims.floor(src)
    t = prims.sub(src, base)
    base = prims.convert_element_type(base, torch.int64)
    index = _stack([prims.maximum(prims.minimum(prims.add(base, j - 1), in_size - 1), 0) for j in range(4)])
    rest = prims.sub(1.0, t)
    weights = _stack(
        [_cubic_far(prims.add(t, 1.0)), _cubic_near(t), _cubic_near(rest), _cubic_far(prims.add(rest, 1.0))]
    )
    return index, weights


def _aa_filter(mode: str, x):
    """aten's antialiasing filter at ``x``: the triangle (bilinear), Keys' cubic with a = -0.5 (bicubic, as PIL)."""
    x = prims.abs(x)
    if mode == "bilinear":
        return prims.where(prims.lt(x, 1.0), prims.sub(1.0, x), 0.0)
    near = prims.add(prims.mul(prims.mul(prims.sub(prims.mul(x, 1.5), 2.5), x), x), 1.0)
    far = prims.add(prims.mul(prims.sub(prims.mul(prims.sub(prims.mul(x, -0.5), -2.5), x), 4.0), x), 2.0)
    return prims.where(prims.lt(x, 1.0), near, prims.where(prims.lt(x, 2.0), far, 0.0))


def _stretches(s, in_size, out_size, scale) -> bool:
    """aten's ``scale >= 1.0`` (downsampling: the filter widens with the scale), decided on the
    sizes (or the given scale) where the scale is a tensor of them. At scale 1 either way gives
    the same taps: equal sizes take the way whose number of taps is a constant."""
    if isinstance(s, float):
        return s > 1.0
    return bool(scale < 1.0) if scale is not None else bool(in_size > out_size)


def _in_double(x, dtype):
    """``x`` (in ``dtype``) widened as C++ widens a float added to a double literal."""
    return x if dtype == torch.float64 else prims.convert_element_type(x, torch.float64)


def _aa_taps(device, dtype, in_size, out_size, mode: str, align_corners: bool, scale):
    """aten's antialiased taps (``_compute_indices_min_size_weights_aa``): the filter, widened by
    the scale when downsampling, centred on each output element's position; the taps inside the
    input, normalised to sum 1; ``ceil(support) * 2 + 1`` taps, those past the window weighing 0.
    Downsampling by a scale of symbolic sizes takes the sizes at their values (the number of taps
    follows the scale)."""
    s = _scale(device, in_size, out_size, scale, align_corners, dtype)
    support, invscale = _AA_SUPPORT[mode] * 0.5, 1.0
    if _stretches(s, in_size, out_size, scale):
        if not isinstance(s, float):
            in_size, out_size, scale = int(in_size), int(out_size), None if scale is None else float(scale)
            s = _scale(device, in_size, out_size, scale, align_corners, dtype)
        support, invscale = _rounded(support * s, dtype), _rounded(1.0 / s, dtype)
    taps = math.ceil(support) * 2 + 1
    center = _positions(device, dtype, out_size, s, 0.5)

    def bound(x, limit, clamp):
        rounded = prims.floor(prims.add(_in_double(x, dtype), 0.5))
        return clamp(prims.convert_element_type(rounded, torch.int64), limit)

    xmin = bound(prims.sub(center, support), 0, prims.maximum)
    size = prims.sub(bound(prims.add(center, support), in_size, prims.minimum), xmin)
    size = prims.minimum(prims.maximum(size, 0), taps)

    def wide(x):
        return prims.broadcast_in_dim(x, (out_size, taps), (0,))

    j = prims.broadcast_in_dim(prims.iota(taps, 0, 1, device, torch.int64), (out_size, taps), (1,))
    index = prims.add(wide(xmin), j)
    offset = prims.sub(prims.convert_element_type(index, dtype), wide(center))
    at = prims.convert_element_type(prims.mul(prims.add(_in_double(offset, dtype), 0.5), invscale), dtype)
    weights = prims.where(prims.lt(j, wide(size)), _aa_filter(mode, at), 0.0)
    columns = [prims.squeeze(prims.slice(weights, (0, k), (out_size, k + 1), (1, 1)), (1,)) for k in range(taps)]
    total = columns[0]
    for column in columns[1:]:  # in order, as aten adds them
        total = prims.add(total, column)
    normalised = prims.div(weights, wide(total))
    weights = prims.where(prims.ne(wide(total), 0.0), normalised, weights)
    return prims.minimum(index, in_size - 1), weights


def _taps(device, dtype, in_size, out_size, mode: str, align_corners, scale, antialias: bool = False):
    """The (out, taps) input positions and weights (None: one tap of weight 1) along one dim."""
    if antialias:
        return _aa_taps(device, dtype, in_size, out_size, mode, align_corners, scale)
    if mode in ("nearest", "nearest-exact"):
        return _nearest_taps(device, in_size, out_size, scale, mode == "nearest-exact")
    if mode == "bicubic":
        return _cubic_taps(device, dtype, in_size, out_size, scale, align_corners)
    return _linear_taps(device, dtype, in_size, out_size, scale, align_corners)


def _unchanged(in_size, out_size, scale) -> bool:
    """Whether a dim keeps its size, which aten's antialiased kernel leaves as it is whatever scale it
    is given; from the sizes alone (no scale) the taps copy it anyway, so no guard is taken then."""
    same = _equal(out_size, in_size)
    return same if same is not None else scale is not None and bool(out_size == in_size)


def _compute_dtype(dtype):
    return torch.float32 if dtype in _HALVES else dtype


def _resample(x, sizes, mode, align_corners, scales, antialias: bool = False):
    """``x`` resized along its last len(sizes) dims, one dim at a time: first to last, or, antialiased,
    last to first leaving a dim of unchanged size as it is (aten's separable kernel)."""
    n, dtype = len(sizes), _compute_dtype(x.dtype)
    out = x
    for i in reversed(range(n)) if antialias else range(n):
        axis, size, scale = x.ndim - n + i, sizes[i], scales[i]
        if antialias and _unchanged(out.shape[axis], size, scale):
            continue
        if out.dtype != dtype and not mode.startswith("nearest"):
            out = prims.convert_element_type(out, dtype)
        index, weights = _taps(x.device, dtype, out.shape[axis], size, mode, align_corners, scale, antialias)
        if antialias and i == n - 2 and _rows_as_first(x, out.shape[axis + 1]):
            index, weights = (_first_row(t) for t in (index, weights))
        taps = index.shape[1]
        taken = prims.take(out, prims.reshape(index, (size * taps,)), axis)
        taken = prims.reshape(taken, (*taken.shape[:axis], size, taps, *taken.shape[axis + 1 :]))
        if weights is None:
            out = prims.squeeze(taken, (axis + 1,))
            continue
        weighted = prims.mul(taken, prims.broadcast_in_dim(weights, taken.shape, (axis, axis + 1)))
        out = prims.sum(weighted, (axis + 1,))
    # a copy where every dim was left as it is: eager's output is a tensor of its own
    return out if out.dtype == x.dtype and out is not x else prims.convert_element_type(out, x.dtype)


def _rows_as_first(x, width) -> bool:
    """Whether aten's antialiased CPU kernel gives every output row the first one's value: its
    vertical pass does so where the output is one element wide with rows of stride 1 (laid out
    contiguous, or channels_last with one channel), a flaw of its ``TensorIterator`` there."""
    if x.device.type != "cpu" or not _is(width, 1):
        return False
    return suggested_format(x) != torch.channels_last or _is(x.shape[1], 1)


def _is(size, value: int) -> bool:
    same = _equal(size, value)
    return same if same is not None else bool(size == value)


def _first_row(taps):
    """The first output element's taps (positions or weights) for every output element."""
    first = prims.slice(taps, (0, 0), (1, taps.shape[1]), (1, 1))
    return prims.broadcast_in_dim(prims.squeeze(first, (0,)), taps.shape, (1,))


# -- symbols ---------------------------------------------------------------------------------------


_ADAPTIVE_AVG = {1: ltorch.adaptive_avg_pool1d, 2: ltorch.adaptive_avg_pool2d, 3: ltorch.adaptive_avg_pool3d}


def check_resize(op: str, input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    """F.interpolate's checks; the output's spatial sizes and the scales its kernel is given."""
    _check_mode(op, input, mode, align_corners, antialias)
    sizes, scales = _sizes_and_scales(op, input, size, scale_factor, mode, recompute_scale_factor)
    if antialias and input.dtype in _HALVES:
        _check_half_antialias(op, input, mode, sizes, scales)
    return sizes, scales


def _check_half_antialias(op: str, input, mode: str, sizes, scales) -> None:
    """Antialiased resizing in half precision: eager's CPU kernel has no weights for it (its
    ``compute_index_ranges_weights`` raises) but copies the input where no size changes; CUDA's
    kernel, which resizes both dims in one pass, thunder_rs does not implement."""
    n = len(sizes)
    check(
        input.device.type == "cpu",
        op,
        lambda: (
            f"antialiased {mode} interpolation is not implemented for {input.dtype} on {input.device} (argument input)"
        ),
        ThunderNotImplementedError,
    )
    unchanged = all(_unchanged(input.shape[input.ndim - n + i], sizes[i], scales[i]) for i in range(n))
    check(
        unchanged,
        op,
        lambda: (
            f"antialiased {mode} interpolation is not implemented for {input.dtype} on the CPU where a size "
            "changes, as in eager (argument input)"
        ),
        ThunderNotImplementedError,
    )


def resize(op: str, input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    """F.interpolate's meaning: the input resized."""
    sizes, scales = check_resize(op, input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    if mode == "area":
        return _ADAPTIVE_AVG[input.ndim - 2](input, sizes)
    return _resample(input, sizes, mode, bool(align_corners), scales, bool(antialias))


def _sizes_read(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``F.interpolate``'s ``size`` with its tensors read (``read_ints``) before the symbol is
    recorded, at the trace's top level, where a compiled call checks them (or defines them, where
    they change between calls): read in the decomposition, the trace kept the first call's sizes
    unchecked (ViLT's patch counts from a pixel mask)."""
    if len(args) > 1:
        return (args[0], _size_read(args[1]), *args[2:]), kwargs
    if "size" in kwargs:
        return args, {**kwargs, "size": _size_read(kwargs["size"])}
    return args, kwargs


def _size_read(size):
    if type(size) in (list, tuple):
        return type(size)(read_ints(tuple(size)))
    return read_ints((size,))[0] if isinstance(size, torch.Tensor) and size.ndim == 0 else size


@torchsymbol(F.interpolate, reads=_sizes_read)
def interpolate(
    input,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
):
    return resize(
        "ltorch.interpolate", input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias
    )


# ``F.upsample``, ``F.upsample_nearest`` and ``F.upsample_bilinear`` reach no
# ``__torch_function__`` of their own: they call ``F.interpolate``, which is ``interpolate`` above.


# -- backward kernel -------------------------------------------------------------------------------


def _unresample(grad, input_size, mode, align_corners, scales, antialias: bool = False):
    """The transpose of ``_resample``: each tap's weighted gradient added back, dim by dim in reverse.
    Antialiased, every dim is (aten's backward kernel weighs a dim of unchanged size too)."""
    n, dtype = len(scales), _compute_dtype(grad.dtype)
    if not antialias and _copies_back(grad.shape[-n:], input_size[-n:], mode, align_corners, scales):
        return grad
    g = grad if grad.dtype == dtype else prims.convert_element_type(grad, dtype)
    for i in range(n) if antialias else reversed(range(n)):
        axis = g.ndim - n + i
        size, in_size = g.shape[axis], input_size[axis]
        index, weights = _taps(grad.device, dtype, in_size, size, mode, align_corners, scales[i], antialias)
        taps = index.shape[1]
        spread_shape = (*g.shape[:axis], size, taps, *g.shape[axis + 1 :])
        spread = prims.broadcast_in_dim(g, spread_shape, tuple(d if d <= axis else d + 1 for d in range(g.ndim)))
        if weights is not None:
            spread = prims.mul(spread, prims.broadcast_in_dim(weights, spread_shape, (axis, axis + 1)))
        merged = prims.reshape(spread, (*g.shape[:axis], size * taps, *g.shape[axis + 1 :]))
        zeros = prims.full((*g.shape[:axis], in_size, *g.shape[axis + 1 :]), 0.0, g.device, dtype)
        g = prims.index_add(zeros, prims.reshape(index, (size * taps,)), merged, axis)
    return g if g.dtype == grad.dtype else prims.convert_element_type(g, grad.dtype)


def _copies_back(out_sizes, in_sizes, mode, align_corners: bool, scales) -> bool:
    """Whether aten's bicubic backward copies the gradient: where all sizes are equal, whatever
    scales it is given (``upsample_bicubic2d_backward_kernel``), though its forward does not. From
    sizes alone (no scales) the scale is 1 and the taps copy anyway: no guard is taken then."""
    given = not align_corners and any(s is not None for s in scales)
    return mode == "bicubic" and given and all(o == i for o, i in zip(out_sizes, in_sizes))


@torchsymbol(name="upsample_backward")
def upsample_backward(grad_output, input_size, mode, align_corners, scales, antialias=False):
    """The gradient of a resized input of ``input_size`` (all dims) from its output's: eager's
    ``upsample_<mode><n>d_backward`` (``_upsample_<mode>2d_aa_backward`` antialiased). ``scales``
    has one float or None per spatial dim."""
    return _unresample(grad_output, tuple(input_size), mode, bool(align_corners), tuple(scales), bool(antialias))


def _aten_upsample_backward(grad_output, input_size, mode, align_corners, scales, antialias=False):
    n = len(scales)
    name = (
        f"_upsample_{mode}2d_aa_backward"
        if antialias
        else {
            "nearest": f"upsample_nearest{n}d_backward",
            "nearest-exact": f"_upsample_nearest_exact{n}d_backward",
            "linear": "upsample_linear1d_backward",
            "bilinear": "upsample_bilinear2d_backward",
            "trilinear": "upsample_trilinear3d_backward",
            "bicubic": "upsample_bicubic2d_backward",
        }[mode]
    )
    corners = () if mode.startswith("nearest") else (align_corners,)
    fn = getattr(torch.ops.aten, name).default
    return fn(grad_output, list(grad_output.shape[2:]), list(input_size), *corners, *scales)


def _aa_backward_meta(grad_output, input_size, mode, align_corners, scales):
    return [(tuple(input_size), grad_output.dtype, False, None)]


#: eager's antialiased backward kernel itself, for half precision: on the CPU it has none and
#: raises when the backward runs, as in eager (the forward copies where no size changes).
upsample_aa_backward = OpaqueKernel("upsample_aa_backward", _aa_backward_meta)


def _aten_aa_backward(grad_output, input_size, mode, align_corners, scales):
    return _aten_upsample_backward(grad_output, input_size, mode, align_corners, scales, antialias=True)


# -- grad rule -------------------------------------------------------------------------------------


def _resize_grad(op: str, forward, input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    sizes, scales = check_resize(op, input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    n = input.ndim - 2
    if mode == "area":  # adaptive average pooling, as F.interpolate computes it
        return _adaptive_avg_grad(
            n,
            (None, ltorch.adaptive_avg_pool1d, ltorch.adaptive_avg_pool2d, ltorch.adaptive_avg_pool3d)[n],
            input,
            sizes,
        )
    out = forward()
    if antialias and input.dtype in _HALVES:
        grad = upsample_aa_backward(get_grad(out), tuple(input.shape), mode, bool(align_corners), scales)[0]
    else:
        grad = upsample_backward(get_grad(out), tuple(input.shape), mode, bool(align_corners), scales, bool(antialias))
    put_grad(input, grad)
    return out


@register_grad(ltorch.interpolate)
def interpolate_grad(
    input,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
):
    args = (input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    return _resize_grad("ltorch.interpolate", lambda: ltorch.interpolate(*args), *args)


#: The aten call the torch executor runs for the backward kernel.
TORCH_IMPLS = {upsample_backward: _aten_upsample_backward, upsample_aa_backward: _aten_aa_backward}
