"""Scans: cumulative sums, products, extrema and log-sum-exp along one dim, over the scan prims;
the trapezoidal rule, plain and cumulative; and torch's associative scan (Mamba's selective scan)."""

import torch
from torch._higher_order_ops.associative_scan import associative_scan_op, generic_associative_scan

from thunder_rs import clang, prims
from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.base import dtypes
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.symbols import torchsymbol

T = torch.Tensor
__all__ = ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "trapezoid", "cumulative_trapezoid"]


def _scan_dim(a, dim, op: str, out) -> int:
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    return clang.canonicalize_dim(a.ndim, dim, op)


def _accumulate(prim, op: str, a, dim, dtype, out):
    """cumsum/cumprod: integers and bool accumulate in int64 unless ``dtype`` says otherwise."""
    d = _scan_dim(a, dim, op, out)
    if dtype is None:
        dtype = a.dtype if dtypes.is_inexact(a.dtype) else torch.int64
    return prim(clang.maybe_convert(a, dtype), d)


@torchsymbol(torch.cumsum, T.cumsum)
def cumsum(input, dim, *, dtype=None, out=None):
    return _accumulate(prims.cumsum, "ltorch.cumsum", input, dim, dtype, out)


@register_grad(cumsum)
def cumsum_grad(input, dim, *, dtype=None, out=None):
    """Eager's ``cumsum_backward(grad.to(input.dtype), dim)``: the cotangent cast to the input's
    dtype first, then summed from the end (``grad`` itself where the dim holds one element); for
    complex values too, a sum with no conjugation. (The prim's VJP summed in the result's dtype
    and cast after.)"""
    result = cumsum(input, dim, dtype=dtype, out=out)
    if not dtypes.is_inexact(input.dtype):
        return result
    d = clang.canonicalize_dim(input.ndim, dim, "ltorch.cumsum")
    g = clang.maybe_convert(get_grad(result), input.dtype)
    size = input.shape[d] if input.ndim else 1
    if type(size) is not int or size > 1:  # (a symbolic size sums: flipping one element is a copy)
        g = ltorch.flip(ltorch.cumsum(ltorch.flip(g, (d,)), d), (d,))
    put_grad(input, g, complex_values=True)
    return result


@torchsymbol(torch.cumprod, T.cumprod)
def cumprod(input, dim, *, dtype=None, out=None):
    return _accumulate(prims.cumprod, "ltorch.cumprod", input, dim, dtype, out)


@torchsymbol(name="cumprod_backward")
def cumprod_backward(grad, input, dim: int, output):
    """Eager's ``cumprod_backward``, which the torch executor runs (``TORCH_IMPLS``): without a
    zero, ``reversed_cumsum(output * grad).div(input)``; with one, an O(n) pass of its own, whose
    sums round otherwise than a formula's. The decomposition is the exact formula (the prim's
    VJP): ``y_j / x_k`` before the first zero, the products with that zero replaced by one at
    it, zero after it."""
    is_zero = ltorch.eq(input, 0)
    zeros_so_far = ltorch.cumsum(clang.maybe_convert(is_zero, torch.int64), dim)
    before = ltorch.eq(zeros_so_far, 0)
    first = ltorch.logical_and(ltorch.eq(zeros_so_far, 1), is_zero)
    summed = ltorch.flip(ltorch.cumsum(ltorch.flip(ltorch.mul(grad, output), (dim,)), dim), (dim,))
    before_grad = ltorch.true_divide(summed, ltorch.where(before, input, 1))
    skipped = ltorch.cumprod(ltorch.where(first, 1, input), dim)
    first_grad = ltorch.flip(ltorch.cumsum(ltorch.flip(ltorch.mul(grad, skipped), (dim,)), dim), (dim,))
    return ltorch.where(before, before_grad, ltorch.where(first, first_grad, 0))


@register_grad(cumprod)
def cumprod_grad(input, dim, *, dtype=None, out=None):
    """Eager's kernel (``cumprod_backward``) for a floating input accumulated in its own dtype;
    others keep the prim's VJP."""
    result = cumprod(input, dim, dtype=dtype, out=out)
    if input.ndim == 0 or not input.dtype.is_floating_point or result.dtype != input.dtype:
        return result
    d = clang.canonicalize_dim(input.ndim, dim, "ltorch.cumprod")
    put_grad(input, cumprod_backward(get_grad(result), input, d, result))
    return result


@torchsymbol(torch.cummax, T.cummax)
def cummax(input, dim, *, out=None):
    d = _scan_dim(input, dim, "ltorch.cummax", out)
    return torch.return_types.cummax(prims.cummax(input, d))


@torchsymbol(torch.cummin, T.cummin)
def cummin(input, dim, *, out=None):
    d = _scan_dim(input, dim, "ltorch.cummin", out)
    return torch.return_types.cummin(prims.cummin(input, d))


@torchsymbol(torch.logcumsumexp, T.logcumsumexp)
def logcumsumexp(input, dim, *, out=None):
    op = "ltorch.logcumsumexp"
    d = _scan_dim(input, dim, op, out)
    check(
        dtypes.is_inexact(input.dtype),
        op,
        f'"logcumsumexp_out_cpu" not implemented for {input.dtype} (argument input)',
        ThunderNotImplementedError,
    )
    return prims.logcumsumexp(input, d)


# -- trapezoidal rule ------------------------------------------------------------------------------


def _float(y):
    return y if dtypes.is_inexact(y.dtype) else clang.maybe_convert(y, torch.get_default_dtype())


def _trapezoids(op: str, y, x, dx, dim):
    """``(widths, heights)`` of the trapezoids along ``dim``: the spacing (a number, or ``diff(x)``
    shaped to broadcast) and the sums of neighbouring values."""
    check(x is None or dx is None, op, "trapezoid: received both x and dx (argument dx)", ThunderNotImplementedError)
    d = clang.canonicalize_dim(y.ndim, dim, op)
    n = y.shape[d]
    y = _float(y)
    pairs = max(n - 1, 0)
    # (Each pair's earlier slice taken first, as eager's slices are: their gradients reach ``y``
    # and ``x`` in the order its autograd adds them among their other uses.)
    earlier = ltorch.narrow(y, d, 0, pairs)
    heights = ltorch.add(ltorch.narrow(y, d, min(n, 1), pairs), earlier)
    if x is None:
        return (1 if dx is None else dx), heights, d
    check(
        isinstance(x, torch.Tensor),
        op,
        f"expected a tensor for x, got {type(x).__name__} (argument x)",
        ThunderTypeError,
    )
    if x.ndim == 1:
        check(
            x.shape[0] == n,
            op,
            "trapezoid: There must be one `x` value for each sample point (argument x)",
            ThunderRuntimeError,
        )
        x = ltorch.reshape(x, tuple(n if k == d else 1 for k in range(y.ndim)))
    xd = clang.canonicalize_dim(x.ndim, d - y.ndim, op)
    earlier = ltorch.narrow(x, xd, 0, pairs)
    widths = ltorch.sub(ltorch.narrow(x, xd, min(n, 1), pairs), earlier)
    return widths, heights, d


@torchsymbol(torch.trapezoid, torch.trapz)
def trapezoid(y, x=None, *, dx=None, dim=-1):
    op = "ltorch.trapezoid"
    widths, heights, d = _trapezoids(op, y, x, dx, dim)
    if y.shape[d] == 0:  # eager's zeros of y's dtype (zeros_like_except, an int y's too), which require no grad
        return ltorch.zeros(tuple(s for k, s in enumerate(y.shape) if k != d), dtype=y.dtype, device=y.device)
    if isinstance(widths, torch.Tensor):
        return ltorch.true_divide(ltorch.sum(ltorch.mul(widths, heights), d), 2)
    y = _float(y)
    ends = ltorch.add(ltorch.select(y, d, 0), ltorch.select(y, d, -1))
    return ltorch.mul(ltorch.sub(ltorch.sum(y, d), ltorch.mul(ends, 0.5)), widths)


@torchsymbol(torch.cumulative_trapezoid)
def cumulative_trapezoid(y, x=None, *, dx=None, dim=-1):
    op = "ltorch.cumulative_trapezoid"
    widths, heights, d = _trapezoids(op, y, x, dx, dim)
    if isinstance(widths, torch.Tensor):
        return ltorch.true_divide(cumsum(ltorch.mul(widths, heights), d), 2)
    return cumsum(ltorch.mul(heights, widths / 2), d)  # (eager's ``(dx / 2.) * (left + right)``, then summed)


# -- associative scan ------------------------------------------------------------------------------


def _associative_scan(combine_fn, xs, additional_inputs):
    """``torch.ops.higher_order.associative_scan`` (``combine_mode="pointwise"``, and Dynamo's
    graphs of either mode): its dense implementation, ``generic_associative_scan``, which calls
    the pointwise ``combine_fn`` on strided halves of the operands about log2(n) times, so the
    trace holds the scan's ops rather than an opaque call."""
    return generic_associative_scan(combine_fn, list(xs), additional_inputs=tuple(additional_inputs))


TORCH_TO_LTORCH[associative_scan_op] = _associative_scan


#: The aten calls the torch executor runs for the backward kernels.
TORCH_IMPLS = {cumprod_backward: torch.ops.aten.cumprod_backward}
