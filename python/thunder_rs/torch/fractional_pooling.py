"""Fractional max pooling (``F.fractional_max_pool2d`` and ``3d``): max pooling over windows of a
fixed size whose starts step pseudo-randomly, a step per output position drawn from one sample
in [0, 1) per plane and spatial dim.

``F``'s functions draw the samples with ``torch.rand(N, C, n, dtype=input.dtype)`` unless given
(``ltorch.rand`` draws what eager draws) and call aten's kernel (``torch._C._nn.fractional_max_
pool2d``), which takes the samples as an argument. The kernel's window starts are eager's
``generate_intervals``: ``int((i + u) * alpha) - int(u * alpha)`` computed in the input's dtype,
``alpha = (size - k) / (out - 1)``, the last window at ``size - k``; 2-d samples hold (w, h), 3-d
ones (t, h, w). Each window's elements are gathered from the plane at their flat positions, and
its maximum and index are eager's (the first maximum, the last NaN: ``pooling.eager_argmax``).
The torch executor runs each symbol whole as eager's call; the gradient is eager's backward
kernel (the output's gradient added at the indices, in output order), its own gradient eager's
double backward.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import prims
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    ThunderValueError,
    check,
)
from thunder_rs.torch.common import flows, is_int, like, require_tensor
from thunder_rs.torch.pooling import _scatter_to_indices, eager_argmax, indexed_backward_grad
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = [
    "fractional_max_pool2d",
    "fractional_max_pool3d",
    "fractional_max_pool2d_with_indices",
    "fractional_max_pool3d_with_indices",
    "fractional_max_pool2d_kernel",
    "fractional_max_pool3d_kernel",
    "fractional_max_pool2d_backward",
    "fractional_max_pool3d_backward",
]

_aten = torch.ops.aten
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: The sample each spatial dim's starts come from (eager's kernels: 2-d samples are (w, h)).
_SAMPLE_OF_DIM = {2: (1, 0), 3: (0, 1, 2)}


def _ints(op: str, value, n: int, name: str) -> tuple:
    """aten's ``int[n]``: one int for every dim, or n of them."""
    if is_int(value):
        return (value,) * n
    check(
        isinstance(value, (tuple, list)) and all(is_int(v) for v in value),
        op,
        lambda: f"fractional_max_pool{n}d(): argument '{name}' must be tuple of ints, not {type(value).__name__}",
        ThunderTypeError,
    )
    check(
        len(value) == n,
        op,
        f"fractional_max_pool{n}d: {name} must either be a single Int or tuple of Ints (argument {name})",
        ThunderRuntimeError,
    )
    return tuple(value)


def _check(op: str, n: int, input, kernel, output, samples) -> None:
    """The checks of eager's meta function and kernel (``fractional_max_pool_check_shape``), in order."""
    require_tensor(op, input, "input")
    require_tensor(op, samples, "random_samples")
    name = f"fractional_max_pool{n}d()"
    check(
        all(k > 0 for k in kernel),
        op,
        lambda: f"{name}: kernel size should be greater than zero, but got {'x'.join(map(str, kernel))}",
        ThunderRuntimeError,
    )
    check(
        input.ndim in (n + 1, n + 2),
        op,
        lambda: f"{name}: Expected {n + 1}D or {n + 2}D tensor, but got: {list(input.shape)} (argument input)",
        ThunderRuntimeError,
    )
    check(
        all(s > 0 for s in input.shape[1:]),
        op,
        lambda: f"{name}: Expected input to have non-zero size for non-batch dimensions, but got {list(input.shape)}",
        ThunderRuntimeError,
    )
    for size, k, out, dim in zip(input.shape[-n:], kernel, output, ("time", "height", "width")[3 - n :]):
        check(
            out + k - 1 <= size,
            op,
            lambda: f"{name}: pool {dim} {k} too large relative to input {dim} {size}",
            ThunderRuntimeError,
        )
    check(
        input.dtype in _FLOATS,
        op,
        lambda: f'"fractional_max_pool{n}d_out_frame" not implemented for {input.dtype} (argument input)',
        ThunderNotImplementedError,
    )
    check(
        samples.dtype == input.dtype,
        op,
        "Expect _random_samples to have the same dtype as input (argument random_samples)",
        ThunderRuntimeError,
    )
    check(
        samples.ndim == 3,
        op,
        f"Expect _random_samples to have 3 dimensions, got {samples.ndim}",
        ThunderRuntimeError,
    )
    batch, channels = (1, input.shape[0]) if input.ndim == n + 1 else input.shape[:2]
    check(
        samples.shape[0] >= batch,
        op,
        "Expect _random_samples.size(0) no less then input batch size.",
        ThunderRuntimeError,
    )
    check(
        samples.shape[1] == channels,
        op,
        "Expect _random_samples.size(1) equals to input channel size.",
        ThunderRuntimeError,
    )
    check(
        samples.shape[2] == n,
        op,
        lambda: f"Expect _random_samples.size(2) equals to {n}; got {samples.shape[2]}.",
        ThunderRuntimeError,
    )


def _starts(u, size: int, out: int, k: int):
    """Each plane's window starts along one dim, ``(planes, out)`` int64: eager's
    ``generate_intervals`` of its samples ``u`` ``(planes,)``, in their dtype."""
    planes, dtype = u.shape[0], u.dtype
    last = prims.full((planes, 1), size - k, u.device, torch.int64)
    if out == 1:
        return last
    number = lambda v: prims.full((), v, u.device, dtype)  # noqa: E731  (a value of the dtype)
    grid = (planes, out - 1)
    alpha = prims.broadcast_in_dim(prims.div(number(size - k), number(out - 1)), grid, ())
    i = prims.convert_element_type(prims.iota(out - 1, 0, 1, u.device, torch.int64), dtype)
    u2 = prims.broadcast_in_dim(u, grid, (0,))
    stepped = prims.mul(prims.add(prims.broadcast_in_dim(i, grid, (1,)), u2), alpha)
    first = prims.mul(u2, alpha)
    starts = prims.sub(prims.convert_element_type(stepped, torch.int64), prims.convert_element_type(first, torch.int64))
    return prims.cat([starts, last], 1)


def _pool(n: int, input, kernel, output, samples):
    """(out, indices) of a (planes, s1..sn) ``input`` with one sample row (n) per plane."""
    planes, sizes = input.shape[0], tuple(input.shape[1:])
    windows_shape = (planes, *output, *kernel)
    positions = None
    for d in range(n):
        u = prims.reshape(
            prims.slice(samples, (0, _SAMPLE_OF_DIM[n][d]), (planes, _SAMPLE_OF_DIM[n][d] + 1), (1, 1)), (planes,)
        )
        starts = _starts(u, sizes[d], output[d], kernel[d])
        offsets = prims.iota(kernel[d], 0, 1, input.device, torch.int64)
        along = prims.add(
            prims.broadcast_in_dim(starts, windows_shape, (0, 1 + d)),
            prims.broadcast_in_dim(offsets, windows_shape, (1 + n + d,)),
        )
        along = prims.mul(along, math.prod(sizes[d + 1 :]))
        positions = along if positions is None else prims.add(positions, along)
    flat_shape = (planes, math.prod(output) * math.prod(kernel))
    flat = prims.reshape(positions, flat_shape)
    values = prims.take_along_axis(prims.reshape(input, (planes, math.prod(sizes))), flat, 1)
    windows = prims.reshape(values, (planes, *output, math.prod(kernel)))
    positions = prims.reshape(positions, windows.shape)
    last = windows.ndim - 1
    out = prims.amax(windows, (last,))
    which = eager_argmax(windows, out, None)
    return out, prims.reshape(prims.take_along_axis(positions, which, last), out.shape)


def _kernel(n: int, input, kernel_size, output_size, random_samples):
    op = f"ltorch.fractional_max_pool{n}d_kernel"
    kernel = _ints(op, kernel_size, n, "kernel_size")
    output = _ints(op, output_size, n, "output_size")
    _check(op, n, input, kernel, output, random_samples)
    batched = input.ndim == n + 2
    lead = tuple(input.shape[:-n])
    planes = math.prod(lead)
    result_shape = (*lead, *output)
    if planes == 0 or math.prod(output) == 0:
        # (nothing to pool: an empty output that still follows input, as eager's does)
        empty = ltorch.mul(ltorch.zeros(result_shape, dtype=input.dtype, device=input.device), ltorch.sum(input))
        return empty, ltorch.zeros(result_shape, dtype=torch.int64, device=input.device)
    x = ltorch.reshape(input, (planes, *input.shape[-n:]))
    batch = input.shape[0] if batched else 1
    samples = ltorch.reshape(ltorch.narrow(random_samples, 0, 0, batch), (planes, n))
    out, indices = _pool(n, x, kernel, output, samples)
    return ltorch.reshape(out, result_shape), ltorch.reshape(indices, result_shape)


@torchsymbol(torch._C._nn.fractional_max_pool2d, name="fractional_max_pool2d_kernel")
def fractional_max_pool2d_kernel(input, kernel_size, output_size, random_samples):
    return _kernel(2, input, kernel_size, output_size, random_samples)


@torchsymbol(torch._C._nn.fractional_max_pool3d, name="fractional_max_pool3d_kernel")
def fractional_max_pool3d_kernel(input, kernel_size, output_size, random_samples):
    return _kernel(3, input, kernel_size, output_size, random_samples)


# -- F's functions: the samples drawn unless given ------------------------------------------------


def _output_size(n: int, input, output_size, output_ratio):
    """``F``'s output size: given, or ``int(size * ratio)`` per spatial dim."""
    name = f"fractional_max_pool{n}d"
    if output_size is None and output_ratio is None:
        raise ThunderValueError(f"{name} requires specifying either an output_size or an output_ratio")
    if output_size is not None:
        return output_size
    check(
        n == 3 or isinstance(output_ratio, (tuple, list)),
        f"ltorch.{name}",
        lambda: f"object of type '{type(output_ratio).__name__}' has no len() (argument output_ratio)",
        ThunderTypeError,
    )
    if n == 2 and len(output_ratio) > 2:
        raise ThunderValueError(f"{name} requires output_ratio to either be a single Int or tuple of Ints.")
    ratios = (output_ratio,) * n if not isinstance(output_ratio, (tuple, list)) else output_ratio
    check(len(ratios) >= n, f"ltorch.{name}", f"expected {n} output ratios, got {len(ratios)}", ThunderIndexError)
    return [int(input.shape[-n + d] * ratios[d]) for d in range(n)]


def _functional(n: int, input, kernel_size, output_size, output_ratio, samples):
    require_tensor(f"ltorch.fractional_max_pool{n}d", input, "input")
    output_size = _output_size(n, input, output_size, output_ratio)
    if samples is None:
        batch = 1 if input.ndim == n + 1 else input.shape[0]
        check(
            input.ndim >= n + 1,
            f"ltorch.fractional_max_pool{n}d",
            lambda: (
                f"Dimension out of range (expected to be in range of [{-input.ndim}, {input.ndim - 1}], "
                f"but got {-n - 1}) (argument input)"
            ),
            ThunderIndexError,
        )
        samples = ltorch.rand(batch, input.shape[-n - 1], n, dtype=input.dtype, device=input.device)
    kernel = fractional_max_pool2d_kernel if n == 2 else fractional_max_pool3d_kernel
    return kernel(input, kernel_size, output_size, samples)


@torchsymbol(F.fractional_max_pool2d)
def fractional_max_pool2d(
    input, kernel_size, output_size=None, output_ratio=None, return_indices=False, _random_samples=None
):
    out, indices = _functional(2, input, kernel_size, output_size, output_ratio, _random_samples)
    return (out, indices) if return_indices else out


@torchsymbol(F.fractional_max_pool3d)
def fractional_max_pool3d(
    input, kernel_size, output_size=None, output_ratio=None, return_indices=False, _random_samples=None
):
    out, indices = _functional(3, input, kernel_size, output_size, output_ratio, _random_samples)
    return (out, indices) if return_indices else out


# F.fractional_max_poolNd_with_indices return the indices whatever return_indices says.
@torchsymbol(F.fractional_max_pool2d_with_indices)
def fractional_max_pool2d_with_indices(
    input, kernel_size, output_size=None, output_ratio=None, return_indices=False, _random_samples=None
):
    return _functional(2, input, kernel_size, output_size, output_ratio, _random_samples)


@torchsymbol(F.fractional_max_pool3d_with_indices)
def fractional_max_pool3d_with_indices(
    input, kernel_size, output_size=None, output_ratio=None, return_indices=False, _random_samples=None
):
    return _functional(3, input, kernel_size, output_size, output_ratio, _random_samples)


# -- gradients: eager's backward kernels ---------------------------------------------------------


def _backward_meta(grad_output, input, kernel_size, output_size, indices):
    # (``input``, whose values the result does not read, requires grad of it as in eager)
    return [(*like(input), flows(grad_output, input))]


@torchsymbol(_aten.fractional_max_pool2d_backward.default, name="fractional_max_pool2d_backward", meta=_backward_meta)
def fractional_max_pool2d_backward(grad_output, input, kernel_size, output_size, indices):
    return _scatter_to_indices(grad_output, input, indices, 2)


@torchsymbol(_aten.fractional_max_pool3d_backward.default, name="fractional_max_pool3d_backward", meta=_backward_meta)
def fractional_max_pool3d_backward(grad_output, input, kernel_size, output_size, indices):
    return _scatter_to_indices(grad_output, input, indices, 3)


_BACKWARD = {2: fractional_max_pool2d_backward, 3: fractional_max_pool3d_backward}


def _kernel_grad(n: int, symbol, input, kernel_size, output_size, random_samples):
    # (eager's forward refuses it: derivatives.yaml's ``non_differentiable``)
    check(
        not flows(random_samples),
        symbol.symbol_name,
        lambda: (
            f"The function 'fractional_max_pool{n}d' is not differentiable with respect to argument 'random_samples'. "
            "This input cannot have requires_grad True. (argument random_samples)"
        ),
        ThunderRuntimeError,
    )
    out, indices = symbol(input, kernel_size, output_size, random_samples)
    if flows(input):
        kernel = _ints(symbol.symbol_name, kernel_size, n, "kernel_size")
        output = _ints(symbol.symbol_name, output_size, n, "output_size")
        put_grad(input, _BACKWARD[n](get_grad(out), input, kernel, output, indices))
    return out, indices


@register_grad(ltorch.fractional_max_pool2d_kernel)
def fractional_max_pool2d_kernel_grad(input, kernel_size, output_size, random_samples):
    return _kernel_grad(2, ltorch.fractional_max_pool2d_kernel, input, kernel_size, output_size, random_samples)


@register_grad(ltorch.fractional_max_pool3d_kernel)
def fractional_max_pool3d_kernel_grad(input, kernel_size, output_size, random_samples):
    return _kernel_grad(3, ltorch.fractional_max_pool3d_kernel, input, kernel_size, output_size, random_samples)


def _backward_grad(n: int, grad_output, input, kernel_size, output_size, indices):
    """eager's: ``grad_output`` gets the cotangent gathered at the indices
    (``max_pool_double_backward``), ``input`` zeros."""
    return indexed_backward_grad(
        n, _BACKWARD[n](grad_output, input, kernel_size, output_size, indices), grad_output, input, indices
    )


@register_grad(ltorch.fractional_max_pool2d_backward)
def fractional_max_pool2d_backward_grad(grad_output, input, kernel_size, output_size, indices):
    return _backward_grad(2, grad_output, input, kernel_size, output_size, indices)


@register_grad(ltorch.fractional_max_pool3d_backward)
def fractional_max_pool3d_backward_grad(grad_output, input, kernel_size, output_size, indices):
    return _backward_grad(3, grad_output, input, kernel_size, output_size, indices)
