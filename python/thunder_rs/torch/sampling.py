"""Spatial transformers (``torch.nn.functional``): ``affine_grid`` and ``grid_sample``.

``affine_grid`` is aten's generator: a base grid of evenly spaced coordinates (``linspace``
computed as aten computes it) times each transposed theta. ``grid_sample`` is aten's
``grid_sampler`` kernel, which the torch executor runs as eager does, and whose gradients are
the backward kernel eager's autograd runs for it (``grid_sampler_backward``, opaque), so that
values and gradients are eager's bit for bit. The kernel's decomposition, for executors that fuse
prims, unnormalises each grid point into input coordinates, applies the padding mode (clip for
border, fold for reflection), and reads the input at the nearest point or at the four neighbours
with bilinear weights, one ``take_along_axis`` per neighbour; neighbours outside the input weigh
zero. Bicubic and 3-D (5-D input) sampling have no decomposition, nor do bfloat16 and float16
inputs (eager's kernel rounds each step of its formula in that dtype): only eager's kernel runs them.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.torch.symbols import ltorch
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderValueError, check
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.common import OpaqueKernel, flows
from thunder_rs.torch.creation import _spaced
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.symint import SymInt, same_shape
from thunder_rs.core.state.guards import StateGuard
from thunder_rs.core.state.observe import thread_state

__all__ = ["affine_grid", "grid_sample", "grid_sampler"]


# -- affine_grid -----------------------------------------------------------------------------------


def _linspace_from_neg_one(theta, steps: int, align_corners: bool):
    """aten's ``linspace(-1, 1, steps)``, computed as ``torch.linspace``'s CPU kernel computes it
    (``creation._spaced``: each point one FMA from its nearer end), then scaled by (steps - 1) /
    steps in the dtype without align_corners; a single step is 0."""
    dtype, device = theta.dtype, theta.device
    if steps <= 1:
        return prims.full((steps,), 0.0, device, dtype)
    values, _ = _spaced("ltorch.affine_grid", -1, 1, steps, dtype, device)
    values = clang.maybe_convert(values, dtype)
    if not align_corners and type(steps) is SymInt:  # (``float(steps)`` would specialise it)
        return ltorch.true_divide(ltorch.mul(values, steps - 1), steps)
    if not align_corners:
        values = prims.div(prims.mul(values, float(steps - 1)), float(steps))
    return values


def _check_affine_grid(op: str, theta, size) -> int:
    check(
        theta.dtype.is_floating_point,
        op,
        f"Expected theta to have floating point type, but got {theta.dtype} (argument theta)",
        ThunderValueError,
    )
    check(
        len(size) in (4, 5),
        op,
        f"affine_grid only supports 4D and 5D sizes, for 2D and 3D affine transforms, "
        f"respectively. Got size {list(size)} (argument size)",
        ThunderNotImplementedError,
    )
    n = len(size) - 2
    check(
        theta.ndim == 3 and same_shape(theta.shape[-2:], (n, n + 1)),
        op,
        f"Expected a batch of {n}D affine matrices "
        f"of shape Nx{n}x{n + 1} for size {list(size)}. Got {list(theta.shape)} (argument theta)",
        ThunderValueError,
    )
    return n


@torchsymbol(F.affine_grid)
def affine_grid(theta, size, align_corners=None):
    op = "ltorch.affine_grid"
    n = _check_affine_grid(op, theta, size)
    align_corners = bool(align_corners)
    spatial = tuple(size[2:])
    # F.affine_grid only warns about unit sizes with align_corners (and then skips the size check).
    check(
        (align_corners and any(d == 1 for d in spatial)) or all(d > 0 for d in size),
        op,
        f"Expected non-zero, positive output size. Got {list(size)} (argument size)",
        ThunderValueError,
    )
    batch = size[0]
    grid_shape = (batch, *spatial)
    # Coordinate k of the base grid runs along spatial dim n - 1 - k (x along the last); then 1.
    columns = [
        prims.broadcast_in_dim(_linspace_from_neg_one(theta, spatial[n - 1 - k], align_corners), grid_shape, (n - k,))
        for k in range(n)
    ]
    columns.append(prims.full(grid_shape, 1.0, theta.device, theta.dtype))
    base = prims.cat([prims.reshape(c, (*grid_shape, 1)) for c in columns], n + 1)
    points = prims.reshape(base, (batch, math.prod(spatial), n + 1))
    return prims.reshape(ltorch.bmm(points, ltorch.transpose(theta, 1, 2)), (*grid_shape, n))


# -- grid_sample -----------------------------------------------------------------------------------


def _check_grid_sample(op: str, input, grid, mode: str, padding_mode: str) -> None:
    check(
        mode in ("bilinear", "nearest", "bicubic"),
        op,
        f"expected mode to be 'bilinear', 'nearest' or 'bicubic', but got: '{mode}' (argument mode)",
        ThunderValueError,
    )
    check(
        padding_mode in ("zeros", "border", "reflection"),
        op,
        "expected padding_mode to be 'zeros', 'border', or "
        f"'reflection', but got: '{padding_mode}' (argument padding_mode)",
        ThunderValueError,
    )
    check(
        input.dtype == grid.dtype,
        op,
        f"expected input and grid to have same dtype, but input has {input.dtype} and "
        f"grid has {grid.dtype} (argument grid)",
        ThunderRuntimeError,
    )
    check(
        input.ndim in (4, 5) and input.ndim == grid.ndim,
        op,
        f"expected 4D or 5D input and grid with same number "
        f"of dimensions, but got input with sizes {list(input.shape)} and grid with sizes {list(grid.shape)} "
        "(argument grid)",
        ThunderRuntimeError,
    )
    check(
        input.shape[0] == grid.shape[0],
        op,
        f"expected grid and input to have same batch size, but got input with "
        f"sizes {list(input.shape)} and grid with sizes {list(grid.shape)} (argument grid)",
        ThunderRuntimeError,
    )
    check(
        grid.shape[-1] == input.ndim - 2,
        op,
        f"expected grid to have size {input.ndim - 2} in last dimension, but "
        f"got grid with sizes {list(grid.shape)} (argument grid)",
        ThunderRuntimeError,
    )
    check(
        all(s > 0 for s in input.shape[2:]),
        op,
        f"expected input to have non-empty spatial dimensions, but input "
        f"has sizes {list(input.shape)} (argument input)",
        ThunderRuntimeError,
    )
    check(
        input.ndim == 4 or mode != "bicubic",
        op,
        "bicubic interpolation only supports 4D input (argument mode)",
        ThunderRuntimeError,
    )
    check(
        input.dtype.is_floating_point,
        op,
        f"not implemented for {input.dtype} (argument input)",
        ThunderNotImplementedError,
    )


def _reflect(x, low: float, span):
    """aten's ``reflect_coordinates``: ``x`` folded into [low, low + span]; ``span`` is a whole
    number of pixels, a symbolic size as it is (the prims convert it on each call)."""
    if span == 0:
        return prims.mul(x, 0.0)
    span = _number(span)
    dist = prims.abs(prims.sub(x, low))
    extra = prims.fmod(dist, span)
    flips = prims.floor(prims.div(dist, span))
    even = prims.eq(prims.fmod(flips, 2.0), 0.0)
    return prims.where(even, prims.add(extra, low), prims.add(prims.sub(span, extra), low))


def _number(size):
    """A size as a prim's scalar operand: a float, or a symbolic size as it is (a float of it
    would specialise it; the prim converts it to the tensor's dtype on each call)."""
    return size if type(size) is SymInt else float(size)


def _source_coordinate(coord, size: int, padding_mode: str, align_corners: bool):
    """A normalised grid coordinate in input pixels, with the padding mode applied."""
    if type(size) is SymInt:  # aten's grid_sampler_unnormalize, in the tensor's dtype
        shifted = prims.add(coord, 1.0)
        if align_corners:  # ((coord + 1) / 2) * (size - 1)
            x = prims.mul(prims.div(shifted, 2.0), size - 1)
        else:  # ((coord + 1) * size - 1) / 2
            x = prims.div(prims.sub(prims.mul(shifted, size), 1.0), 2.0)
    elif align_corners:
        x = prims.mul(prims.add(coord, 1.0), (size - 1) / 2)
    else:
        x = prims.add(prims.mul(coord, size / 2), size / 2 - 0.5)
    if padding_mode == "reflection":
        x = _reflect(x, 0.0, size - 1) if align_corners else _reflect(x, -0.5, size)
    if padding_mode in ("border", "reflection"):
        # aten's clip_coordinates_set_grad: no gradient at the bounds either (minimum and maximum
        # would give half of it there, as at a tie: an identity affine grid's edges).
        high = _number(size - 1)
        x = prims.where(prims.le(x, 0.0), 0.0, prims.where(prims.ge(x, high), high, x))
    return x


def _read(flat, width: int, height: int, iy, ix, weight):
    """``flat`` (N, C, H * W) read at integer points (iy, ix) of shape (N, Ho, Wo), times
    ``weight``; points outside the input read zero."""
    n, c, _ = flat.shape
    right, bottom = _number(width - 1), _number(height - 1)
    inside = prims.bitwise_and(
        prims.bitwise_and(prims.ge(ix, 0.0), prims.le(ix, right)),
        prims.bitwise_and(prims.ge(iy, 0.0), prims.le(iy, bottom)),
    )
    x = prims.convert_element_type(prims.minimum(prims.maximum(ix, 0.0), right), torch.int64)
    y = prims.convert_element_type(prims.minimum(prims.maximum(iy, 0.0), bottom), torch.int64)
    points = ix.shape[1] * ix.shape[2]
    index = prims.reshape(prims.add(prims.mul(y, width), x), (n, 1, points))
    values = prims.take_along_axis(flat, prims.broadcast_in_dim(index, (n, c, points), (0, 1, 2)), 2)
    scale = prims.reshape(prims.where(inside, weight, 0.0), (n, 1, points))
    return prims.mul(values, prims.broadcast_in_dim(scale, (n, c, points), (0, 1, 2)))


@torchsymbol(F.grid_sample)
def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    _check_grid_sample("ltorch.grid_sample", input, grid, mode, padding_mode)
    return grid_sampler(input, grid, INTERPOLATIONS[mode], PADDINGS[padding_mode], bool(align_corners))


# -- grid_sampler's kernels ------------------------------------------------------------------------

#: F.grid_sample's modes and padding modes as aten's ``grid_sampler`` numbers them.
INTERPOLATIONS = {"bilinear": 0, "nearest": 1, "bicubic": 2}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}


def _grid_sampler_meta(input, grid, interpolation, padding, align_corners):
    return [((*input.shape[:2], *grid.shape[1:-1]), input.dtype, flows(input, grid))]


def _eager_sampler_meta(input, grid, interpolation, padding, align_corners):
    return [((*input.shape[:2], *grid.shape[1:-1]), input.dtype, True, None)]


#: aten's ``grid_sampler`` where no decomposition stands for it (bicubic, 3-D): what the kernel's
#: decomposition records for those calls, so that an executor that translates decompositions
#: (nvFuser) leaves the call to the torch executor, which runs it as eager does. It raised instead,
#: and with nvFuser among the executors (the CUDA default) F.grid_sample of a 5-D input or in
#: bicubic mode was refused.
grid_sampler_eager = OpaqueKernel("grid_sampler_eager", _eager_sampler_meta)


@torchsymbol(name="grid_sampler", meta=_grid_sampler_meta)
def grid_sampler(input, grid, interpolation, padding, align_corners):
    """aten's ``grid_sampler`` (the kernel eager's F.grid_sample calls): ``input`` read at the
    ``grid``'s points, a new contiguous tensor. The decomposition, for executors that fuse prims,
    takes 2-D bilinear and nearest sampling in float32 and float64; bicubic and 3-D sampling, and
    bfloat16 and float16 (whose kernels round each step of the kernel's own formula in that dtype:
    the decomposition's rounding picked other pixels, up to 14 off in bfloat16), only eager's kernel
    runs (``grid_sampler_eager``)."""
    mode = next(name for name, code in INTERPOLATIONS.items() if code == interpolation)
    padding_mode = next(name for name, code in PADDINGS.items() if code == padding)
    if input.ndim != 4 or mode == "bicubic" or input.dtype not in (torch.float32, torch.float64):
        return grid_sampler_eager(input, grid, interpolation, padding, align_corners)[0]
    n, c, height, width = input.shape
    out_h, out_w = grid.shape[1:3]
    coords = [
        prims.reshape(prims.slice(grid, (0, 0, 0, k), (n, out_h, out_w, k + 1), (1, 1, 1, 1)), (n, out_h, out_w))
        for k in range(2)
    ]
    x = _source_coordinate(coords[0], width, padding_mode, align_corners)
    y = _source_coordinate(coords[1], height, padding_mode, align_corners)
    flat = prims.reshape(input, (n, c, height * width))
    if mode == "nearest":  # std::nearbyint: halves to even, as round does
        # A weight of one that depends on the grid, so that the grid's gradient is eager's zeros.
        one = prims.where(prims.full(x.shape, True, x.device, torch.bool), 1.0, x)
        out = _read(flat, width, height, prims.round(y), prims.round(x), one)
    else:
        out = _bilinear(flat, width, height, x, y)
    return prims.reshape(out, (n, c, out_h, out_w))


def _bilinear(flat, width: int, height: int, x, y):
    """``flat`` read at (y, x) as the four neighbours weighted by their distances."""
    west, north = prims.floor(x), prims.floor(y)
    east, south = prims.add(west, 1.0), prims.add(north, 1.0)
    w, nn = prims.sub(x, west), prims.sub(y, north)
    e, s = prims.sub(1.0, w), prims.sub(1.0, nn)
    corners = (
        (north, west, prims.mul(s, e)),
        (north, east, prims.mul(s, w)),
        (south, west, prims.mul(nn, e)),
        (south, east, prims.mul(nn, w)),
    )
    out = None
    for iy, ix, weight in corners:
        term = _read(flat, width, height, iy, ix, weight)
        out = term if out is None else prims.add(out, term)
    return out


def _grid_sampler_backward_meta(grad, input, grid, interpolation, padding, align_corners, output_mask, cudnn=None):
    """The gradients ``output_mask`` asks for, contiguous as eager's kernels write them."""
    return [(tuple(t.shape), t.dtype, False, None) for t, wanted in zip((input, grid), output_mask) if wanted]


#: ``(grad, input, grid, interpolation, padding, align_corners, output_mask, cudnn)`` -> the
#: gradients of input and grid ``output_mask`` asks for: eager's backward of the kernel
#: ``grid_sampler`` ran, ``cudnn`` the value of ``torch.backends.cudnn.enabled`` it ran under.
grid_sampler_backward = OpaqueKernel("grid_sampler_backward", _grid_sampler_backward_meta)


@register_grad(grid_sampler)
def grid_sampler_grad(input, grid, interpolation, padding, align_corners):
    out = grid_sampler(input, grid, interpolation, padding, align_corners)
    mask = (input.requires_grad, grid.requires_grad)
    # On CUDA the forward's kernel (cuDNN's or aten's) is the one its backward's must be: eager's
    # autograd records it when the forward runs, under the switch as it is then, not as it is when
    # the backward runs (``with torch.backends.cudnn.flags(enabled=False)`` around the forward).
    cudnn = _cudnn_switch() if input.device.type == "cuda" else None
    grads = grid_sampler_backward(get_grad(out), input, grid, interpolation, padding, align_corners, mask, cudnn)
    for x, grad in zip([x for x, wanted in zip((input, grid), mask) if wanted], grads):
        put_grad(x, grad)
    return out


def _cudnn_switch() -> bool:
    """``torch.backends.cudnn.enabled`` now; while a program is traced, its entry also runs only
    while the switch is what it was when the call began (a changed switch compiles again)."""
    value = torch.backends.cudnn.enabled
    observer = thread_state.observer
    if observer is not None:
        observer.guard_state(StateGuard("torch.backends.cudnn.enabled", _read_cudnn_switch, value))
    return value


def _read_cudnn_switch() -> bool:
    return torch.backends.cudnn.enabled


def _cudnn_acceptable(t: torch.Tensor, enabled: bool) -> bool:
    """aten's ``cudnn_is_acceptable`` (a CUDA tensor with elements, cuDNN built and ``enabled``), with
    ``cond_cudnn_grid_sampler``'s dtypes and ``canUse32BitIndexMath`` (fewer elements than
    ``INT32_MAX``, the last one's offset below it)."""
    limit = 2**31 - 1
    return (
        enabled
        and t.is_cuda
        and t.dtype in (torch.float64, torch.float32, torch.float16)
        and torch.backends.cudnn.is_available()
        and 0 < t.numel() < limit
        and sum((n - 1) * s for n, s in zip(t.shape, t.stride())) < limit
    )


def _takes_cudnn(input, grid, interpolation, padding, align_corners, enabled: bool) -> bool:
    """Whether aten's ``grid_sampler`` ran cuDNN's kernel under ``torch.backends.cudnn.enabled ==
    enabled``: bilinear with zero padding and aligned corners of a 4-D input of at most 1024
    channels (``cond_cudnn_grid_sampler`` in aten/src/ATen/native/GridSamplerUtils.h), which
    autograd differentiates by cuDNN's backward."""
    return (
        (interpolation, padding, align_corners) == (0, 0, True)
        and input.ndim == 4
        and input.shape[1] <= 1024
        and _cudnn_acceptable(input, enabled)
        and _cudnn_acceptable(grid, enabled)
    )


def _aten_grid_sampler_backward(grad, input, grid, interpolation, padding, align_corners, output_mask, cudnn=None):
    """``cudnn``: the switch the forward ran under (the trace's; None: as it is now)."""
    enabled = torch.backends.cudnn.enabled if cudnn is None else cudnn
    if _takes_cudnn(input, grid, interpolation, padding, align_corners, enabled):
        grads = torch.ops.aten.cudnn_grid_sampler_backward.default(input, grid, grad)
    else:
        kernel = torch.ops.aten.grid_sampler_2d_backward if input.ndim == 4 else torch.ops.aten.grid_sampler_3d_backward
        grads = kernel.default(grad, input, grid, interpolation, padding, align_corners, list(output_mask))
    kept = [g for g, wanted in zip(grads, output_mask) if wanted]
    return kept[0] if len(kept) == 1 else tuple(kept)


#: The aten calls the torch executor runs for the kernels.
TORCH_IMPLS = {
    grid_sampler: torch.grid_sampler,
    grid_sampler_eager: torch.grid_sampler,
    grid_sampler_backward: _aten_grid_sampler_backward,
}
