"""Reductions: sum, mean, prod, amax/amin, max/min, argmax/argmin, var/std, all/any, logsumexp; the
grad rules of var, std, var_mean and std_mean (eager's var and std backward, for complex values
too: the centred input times a real cotangent) and of max/min of a whole tensor.

Each op canonicalises its dims once, reshapes a 0-dim input to one element (prims reduce only
over dims that exist), calls the reduction prim and, for ``keepdim``, broadcasts the result
back to the input's rank with the reduced dims of size 1.
"""

import builtins
import math
from collections.abc import Callable

import torch

from thunder_rs import clang, prims
from thunder_rs.core.base import dtypes
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
)
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.torch.common import is_int, kept
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.torch.elementwise import maximum, minimum

T = torch.Tensor
__all__ = [
    "sum",
    "mean",
    "prod",
    "amax",
    "amin",
    "max",
    "min",
    "argmax",
    "argmin",
    "var",
    "std",
    "var_mean",
    "std_mean",
    "all",
    "any",
    "logsumexp",
    "count_nonzero",
]


def _dims(a, dim, op: str, *, sequences: bool = True) -> tuple[int, ...]:
    """Canonical reduction dims: ``None`` (or an empty sequence) means every dim."""
    if dim is None:
        return tuple(range(a.ndim))
    if is_int(dim):
        return (clang.canonicalize_dim(a.ndim, dim, op),)
    check(
        sequences and isinstance(dim, (tuple, list, torch.Size)) and builtins.all(is_int(d) for d in dim),
        op,
        lambda: (
            f"expected {'an int or a sequence of ints' if sequences else 'an int'} for dim, got {dim!r} (argument dim)"
        ),
        ThunderTypeError,
    )
    if len(dim) == 0:
        return tuple(range(a.ndim))
    out = tuple(clang.canonicalize_dim(a.ndim, d, op) for d in dim)
    for i, d in enumerate(out):
        check(
            d not in out[:i],
            op,
            f"dim {d} appears multiple times in the list of dims (argument dim)",
            ThunderRuntimeError,
        )
    return out


def _operand(a, dims):
    """``a`` and ``dims`` as a prim can reduce them: a 0-dim tensor becomes one element."""
    if a.ndim == 0:
        return prims.reshape(a, (1,)), (0,)
    return a, dims


def _keep(out, shape, dims, keepdim: bool):
    """``out`` with the reduced ``dims`` of ``shape`` reinserted as size 1 when ``keepdim``."""
    if not keepdim or len(shape) == 0:
        return out
    kept_shape = tuple(1 if i in dims else s for i, s in enumerate(shape))
    return prims.broadcast_in_dim(out, kept_shape, tuple(i for i in range(len(shape)) if i not in dims))


def _reduce(prim, a, dims, keepdim: bool, *params):
    """``prim(a, dims, *params)`` with keepdim applied to each of its outputs."""
    operand, prim_dims = _operand(a, dims)
    out = prim(operand, prim_dims, *params)
    if isinstance(out, tuple):
        return tuple(_keep(o, a.shape, dims, keepdim) for o in out)
    return _keep(out, a.shape, dims, keepdim)


def _numel(a, dims) -> int:
    """How many elements each output element reduces."""
    return math.prod(a.shape[d] for d in dims) if a.ndim else 1


def _is_full(dim) -> bool:
    """Whether ``dim`` asks for a reduction over every dim without naming one."""
    return dim is None or (not is_int(dim) and len(dim) == 0)


def _accumulate(prim, a, dims, keepdim: bool, dtype):
    """sum/prod: floats reduce in ``dtype`` (default: their own); integers and bools reduce in
    int64, then wrap to a narrower requested ``dtype`` as torch's own accumulation does."""
    target = dtype if dtype is not None else (a.dtype if dtypes.is_inexact(a.dtype) else torch.int64)
    compute = target if dtypes.is_inexact(target) else torch.int64
    operand = clang.maybe_convert(clang.maybe_convert(a, target), compute)
    return clang.maybe_convert(_reduce(prim, operand, dims, keepdim), target)


@torchsymbol(torch.sum, T.sum)
def sum(input, dim=None, keepdim=False, *, dtype=None):
    return _accumulate(prims.sum, input, _dims(input, dim, "ltorch.sum"), keepdim, dtype)


@torchsymbol(torch.prod, T.prod)
def prod(input, dim=None, keepdim=False, *, dtype=None):
    return _accumulate(prims.prod, input, _dims(input, dim, "ltorch.prod", sequences=False), keepdim, dtype)


@torchsymbol(torch.mean, T.mean)
def mean(input, dim=None, keepdim=False, *, dtype=None):
    op = "ltorch.mean"
    target, arg = (input.dtype, "input") if dtype is None else (dtype, "dtype")
    check(
        dtypes.is_inexact(target),
        op,
        lambda: (
            f"could not infer output dtype; {arg} must be a floating point or complex dtype, got {target} "
            f"(argument {arg})"
        ),
        ThunderNotImplementedError,
    )
    dims = _dims(input, dim, op)
    # Half precision accumulates in float32, as torch does.
    compute = torch.float32 if target in (torch.float16, torch.bfloat16) else target
    total = _reduce(prims.sum, clang.maybe_convert(input, compute), dims, keepdim)
    # A symbolic count divides as the size it is, computed each call (``float`` would specialise it).
    count = _numel(input, dims)
    return clang.maybe_convert(prims.div(total, count if type(count) is SymInt else float(count)), target)


@register_grad(mean)
def mean_grad(input, dim=None, keepdim=False, *, dtype=None):
    """Eager's ``mean_backward``: the cotangent expanded to the input's shape, then divided by the
    count, a new contiguous tensor. Differentiating the decomposition divides first and expands
    the quotient, a broadcast with strides of 0."""
    out = mean(input, dim, keepdim, dtype=dtype)
    g = get_grad(out)
    dims = _dims(input, dim, "ltorch.mean")
    shaped = g if keepdim or input.ndim == 0 else kept(g, tuple(input.shape), dims)
    count = _numel(input, dims)
    # (a broadcast, no decision: comparing a reduced size with 1 would guard it, a count of 1 too)
    spread = prims.broadcast_in_dim(shaped, tuple(input.shape), tuple(range(input.ndim)))
    grad = ltorch.true_divide(spread, count)
    put_grad(input, clang.maybe_convert(grad, input.dtype), complex_values=True)  # (scaled by a real count)
    return out


def _check_nonempty(a, dims, full: bool, op: str):
    """Reductions without an identity (amax, max, argmax) reject zero-size reduced dims."""
    if math.prod(a.shape) != 0:
        return
    check(
        not full,
        op,
        "Expected reduction dim to be specified for input.numel() == 0 (argument dim)",
        ThunderRuntimeError,
    )
    for d in dims:
        check(
            a.shape[d] != 0, op, f"Expected reduction dim {d} to have non-zero size (argument dim)", ThunderIndexError
        )


def _define_extremum(name: str, prim):
    op = f"ltorch.{name}"

    @torchsymbol(getattr(torch, name), getattr(T, name), name=name)
    def extremum(input, dim=(), keepdim=False):
        dims = _dims(input, dim, op)
        _check_nonempty(input, dims, _is_full(dim), op)
        return _reduce(prim, input, dims, keepdim)

    return extremum


amax = _define_extremum("amax", prims.amax)
amin = _define_extremum("amin", prims.amin)


def _index_input(a):
    """argmax/argmin prims need numbers: bools compare as 0 and 1."""
    return clang.maybe_convert(a, torch.uint8) if a.dtype == torch.bool else a


def _define_max(name: str, reduce_prim, arg_prim, elementwise, return_type):
    """``torch.max``/``torch.min``: a full reduction, (values, indices) along a dim, or elementwise."""
    op = f"ltorch.{name}"

    @torchsymbol(getattr(torch, name), getattr(T, name), name=name)
    def extremum(input, dim=None, keepdim=False, *, other=None):
        if isinstance(dim, torch.Tensor) or other is not None:
            return elementwise(input, dim if other is None else other)
        if dim is None:
            dims = tuple(range(input.ndim))
            _check_nonempty(input, dims, True, op)
            return _reduce(reduce_prim, input, dims, False)
        dims = _dims(input, dim, op, sequences=False)
        _check_nonempty(input, dims, False, op)
        if input.ndim == 0:  # one element: itself, at index 0
            operand, prim_dims = _operand(_index_input(input), dims)
            return return_type((_reduce(reduce_prim, input, dims, keepdim), arg_prim(operand, prim_dims[0])))
        # The values are the input's elements at the indices: eager's backward gives the gradient
        # to those alone, where amax's would split it among ties.
        d = dims[0]
        indices = _keep(arg_prim(_index_input(input), d), input.shape, dims, True)
        values = prims.take_along_axis(input, indices, d)
        if not keepdim:
            values, indices = prims.squeeze(values, (d,)), prims.squeeze(indices, (d,))
        return return_type((values, indices))

    return extremum


# Annotated: the grad rules at the end of this file register on them while this import cycle is checked.
max: Callable = _define_max("max", prims.amax, prims.argmax, maximum, torch.return_types.max)
min: Callable = _define_max("min", prims.amin, prims.argmin, minimum, torch.return_types.min)


def _define_argextremum(name: str, prim):
    op = f"ltorch.{name}"

    @torchsymbol(getattr(torch, name), getattr(T, name), name=name)
    def argextremum(input, dim=None, keepdim=False):
        check(input.dtype != torch.bool, op, "does not support bool input (argument input)", ThunderNotImplementedError)
        if dim is None:
            check(
                math.prod(input.shape) != 0,
                op,
                "Expected reduction dim to be specified for input.numel() == 0 (argument dim)",
                ThunderIndexError,
            )
            out = prim(input, None)
            return prims.broadcast_in_dim(out, (1,) * input.ndim, ()) if keepdim and input.ndim else out
        dims = _dims(input, dim, op, sequences=False)
        _check_nonempty(input, dims, False, op)
        operand, prim_dims = _operand(input, dims)
        return _keep(prim(operand, prim_dims[0]), input.shape, dims, keepdim)

    return argextremum


argmax = _define_argextremum("argmax", prims.argmax)
argmin = _define_argextremum("argmin", prims.argmin)


def _correction(dim, unbiased, correction, op: str):
    """(dim, correction) from torch.var's two signatures: ``var(x, dim, *, correction)`` and the
    legacy ``var(x, dim, unbiased)`` / ``var(x, unbiased)``."""
    if isinstance(dim, bool):
        check(unbiased is None, op, "got unbiased twice (argument unbiased)", ThunderTypeError)
        dim, unbiased = None, dim
    check(
        unbiased is None or correction is None,
        op,
        "cannot take both unbiased and correction (argument correction)",
        ThunderTypeError,
    )
    if correction is None:
        correction = 0 if unbiased is False else 1
    # (the var prims' correction is a number: one from a symbolic size is specialised)
    return dim, int(correction) if type(correction) is SymInt else correction


def _variance(name: str, input, dim, unbiased, keepdim, correction, prim):
    op = f"ltorch.{name}"
    check(
        dtypes.is_inexact(input.dtype),
        op,
        lambda: f"std and var only support floating point and complex dtypes, got {input.dtype} (argument input)",
        ThunderNotImplementedError,
    )
    dim, correction = _correction(dim, unbiased, correction, op)
    return _reduce(prim, input, _dims(input, dim, op), keepdim, correction)


@torchsymbol(torch.var, T.var)
def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return _variance("var", input, dim, unbiased, keepdim, correction, prims.var)


@torchsymbol(torch.std, T.std)
def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return prims.sqrt(_variance("std", input, dim, unbiased, keepdim, correction, prims.var))


@torchsymbol(torch.var_mean)
def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return _variance("var_mean", input, dim, unbiased, keepdim, correction, prims.var_mean)


@torchsymbol(torch.std_mean)
def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    variance, mean_ = _variance("std_mean", input, dim, unbiased, keepdim, correction, prims.var_mean)
    return prims.sqrt(variance), mean_


def _count(predicate, a, dims, keepdim: bool):
    """How many elements of ``a`` along ``dims`` satisfy ``predicate`` (a comparison prim with 0), as int64."""
    hits = predicate(a, clang.maybe_convert(0, a.dtype))
    return _reduce(prims.sum, prims.convert_element_type(hits, torch.int64), dims, keepdim)


def _define_truth(name: str, predicate, verdict):
    """``all``/``any``: count the elements that decide the answer; uint8 inputs give uint8, others bool."""
    op = f"ltorch.{name}"

    @torchsymbol(getattr(torch, name), getattr(T, name), name=name)
    def truth(input, dim=None, keepdim=False):
        # An empty dim tuple reduces nothing here (sum reads it as every dim).
        dims = () if isinstance(dim, (tuple, list)) and not dim else _dims(input, dim, op)
        out = verdict(_count(predicate, input, dims, keepdim), 0)
        return clang.maybe_convert(out, torch.uint8) if input.dtype == torch.uint8 else out

    return truth


all = _define_truth("all", prims.eq, prims.eq)  # no element equals zero
any = _define_truth("any", prims.ne, prims.gt)  # some element differs from zero


@torchsymbol(torch.count_nonzero, T.count_nonzero)
def count_nonzero(input, dim=None):
    return _count(prims.ne, input, _dims(input, dim, "ltorch.count_nonzero"), False)


@torchsymbol(torch.logsumexp, T.logsumexp)
def logsumexp(input, dim, keepdim=False):
    """log(sum(exp(x))), shifted by the finite maximum so that large inputs do not overflow."""
    op = "ltorch.logsumexp"
    a = clang.maybe_convert(input, input.dtype if dtypes.is_inexact(input.dtype) else torch.get_default_dtype())
    dims = _dims(a, dim, op)
    if _numel(a, dims) == 0:
        return prims.log(_reduce(prims.sum, prims.exp(a), dims, keepdim))  # -inf, without a maximum to shift by
    operand, prim_dims = _operand(a, dims)
    peak = prims.amax(operand, prim_dims)
    peak = prims.where(prims.isfinite(peak), peak, clang.maybe_convert(0, a.dtype))
    kept = tuple(i for i in range(operand.ndim) if i not in prim_dims)
    shifted = prims.sub(operand, prims.broadcast_in_dim(peak, operand.shape, kept))
    out = prims.add(prims.log(prims.sum(prims.exp(shifted), prim_dims)), peak)
    return _keep(out, a.shape, dims, keepdim)


# -- grad rules ------------------------------------------------------------------------------------


def _kept(t, input, dims, keepdim: bool):
    """``t``, reduced over ``dims`` of ``input`` (``keepdim`` as the forward had it), with those dims as size 1."""
    return t if keepdim else kept(t, input.shape, dims)


def _std_input_grad(g, std, input, dim, unbiased, keepdim, correction, op: str):
    """Eager's std backward: the variance's gradient is ``g / (2 std)``, 0 where std is 0 (a
    constant slice), where differentiating ``sqrt(var)`` gave NaN there; then var's backward.
    Also returns the reduced dims and their element count."""
    g_var = ltorch.where(ltorch.eq(std, 0), 0.0, ltorch.true_divide(g, ltorch.mul(std, 2)))
    return _var_input_grad(g_var, input, dim, unbiased, keepdim, correction, op)


def _var_input_grad(g_var, input, dim, unbiased, keepdim, correction, op: str):
    """Eager's ``var_backward``: ``2 / (n - correction) * g * (input - mean(input))``, in the
    input's dtype op by op. Also returns the reduced dims and their element count."""
    dim, correction = _correction(dim, unbiased, correction, op)
    dims = _dims(input, dim, op)
    count = math.prod(input.shape[d] for d in dims) if input.ndim else 1
    g_var = _kept(g_var, input, dims, keepdim)
    freedom = count - correction
    centered = ltorch.sub(input, ltorch.mean(input, dims, keepdim=True))
    if type(freedom) is SymInt and freedom != 0:  # a changing count divides as a size (a guard: not 0)
        return ltorch.mul(ltorch.true_divide(ltorch.mul(g_var, 2.0), freedom), centered), dims, count
    scale = 2.0 / freedom if freedom else math.inf  # eager's double division
    return ltorch.mul(ltorch.mul(g_var, scale), centered), dims, count


@register_grad(ltorch.var)
def var_grad(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """(the decomposition's VJP rounded the mean's sum before dividing, and the centred input
    before the cotangent multiplied, in half precision)"""
    out = ltorch.var(input, dim, unbiased, keepdim, correction=correction)
    grad, _, _ = _var_input_grad(get_grad(out), input, dim, unbiased, keepdim, correction, "ltorch.var")
    put_grad(input, grad, complex_values=True)  # (the centred input times a real cotangent)
    return out


@register_grad(ltorch.logsumexp)
def logsumexp_grad(input, dim, keepdim=False):
    """Eager's ``logsumexp_backward``: ``g * exp(input - out)`` (the decomposition's VJP went
    through the shift by the maximum and rounded otherwise)."""
    out = ltorch.logsumexp(input, dim, keepdim)
    if not input.dtype.is_floating_point:
        return out  # the decomposition's VJP
    dims = _dims(input, dim, "ltorch.logsumexp")
    g = _kept(get_grad(out), input, dims, keepdim)
    put_grad(input, g * ltorch.exp(input - _kept(out, input, dims, keepdim)))
    return out


@register_grad(ltorch.std)
def std_grad(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    out = ltorch.std(input, dim, unbiased, keepdim, correction=correction)
    grad, _, _ = _std_input_grad(get_grad(out), out, input, dim, unbiased, keepdim, correction, "ltorch.std")
    put_grad(input, grad, complex_values=True)
    return out


@register_grad(ltorch.var_mean)
def var_mean_grad(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Eager's ``var_mean_backward``: var's backward plus the mean's cotangent spread and divided."""
    var, mean = ltorch.var_mean(input, dim, unbiased, keepdim, correction=correction)
    g_var, g_mean = get_grad(var), get_grad(mean)
    grad, dims, count = _var_input_grad(g_var, input, dim, unbiased, keepdim, correction, "ltorch.var_mean")
    put_grad(
        input, ltorch.add(grad, ltorch.true_divide(_kept(g_mean, input, dims, keepdim), count)), complex_values=True
    )
    return var, mean


@register_grad(ltorch.std_mean)
def std_mean_grad(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    std, mean = ltorch.std_mean(input, dim, unbiased, keepdim, correction=correction)
    g_std, g_mean = get_grad(std), get_grad(mean)
    grad, dims, count = _std_input_grad(g_std, std, input, dim, unbiased, keepdim, correction, "ltorch.std_mean")
    put_grad(
        input, ltorch.add(grad, ltorch.true_divide(_kept(g_mean, input, dims, keepdim), count)), complex_values=True
    )
    return std, mean


def _exclusive_products_grad(g, input, d: int):
    """Eager's ``prod_safe_zeros_backward``: ``g`` times the conjugated product of the elements
    before each along ``d`` (an exclusive cumulative product) and of those after it."""
    n = input.shape[d]
    if math.prod(input.shape) == 0:
        return ltorch.expand_as(g, input)
    if n == 1:
        return g
    ones = ltorch.ones(tuple(1 if i == d else s for i, s in enumerate(input.shape)), dtype=g.dtype, device=g.device)
    before = ltorch.cumprod(ltorch.cat([ones, ltorch.narrow(input, d, 0, n - 1)], d), d)
    rest = ltorch.flip(ltorch.narrow(input, d, 1, n - 1), (d,))
    after = ltorch.flip(ltorch.cumprod(ltorch.cat([ones, rest], d), d), (d,))
    return ltorch.mul(g, prims.conj(ltorch.mul(before, after)))


@register_grad(ltorch.prod)
def prod_grad(input, dim=None, keepdim=False, *, dtype=None):
    """Eager's ``prod_backward`` for complex values: ``g * conj(out / input)`` where no element
    is zero; with zeros (anywhere in the tensor, as eager decides) the exclusive products
    (``prod_safe_zeros_backward``), and over every dim zeros where two or more are zero. Each
    branch is computed and the zero count selects, so no value is decided when tracing. Real
    values keep the prim's VJP."""
    out = ltorch.prod(input, dim, keepdim, dtype=dtype)
    if not input.dtype.is_complex or out.dtype != input.dtype:
        return out  # the decomposition's VJP
    g = get_grad(out)
    if input.ndim == 0:
        put_grad(input, g, complex_values=True)
        return out
    zeros = ltorch.sum(ltorch.eq(input, 0))
    if dim is None:
        plain = ltorch.mul(g, prims.conj(ltorch.true_divide(out, input)))
        flat = ltorch.reshape(input, (-1,))  # (eager's ``contiguous().view(-1)``: the same elements)
        safe = ltorch.reshape(_exclusive_products_grad(g, flat, 0), tuple(input.shape))
        safe = ltorch.where(ltorch.eq(zeros, 1), safe, 0)
    else:
        d = _dims(input, dim, "ltorch.prod", sequences=False)[0]
        g, kept_out = (g, out) if keepdim else (ltorch.unsqueeze(g, d), ltorch.unsqueeze(out, d))
        plain = ltorch.mul(g, prims.conj(ltorch.true_divide(kept_out, input)))
        safe = _exclusive_products_grad(g, input, d)
    put_grad(input, ltorch.where(ltorch.eq(zeros, 0), plain, safe), complex_values=True)
    return out


def _evenly_distributed(g, x, value):
    """Eager's ``evenly_distribute_backward``: on the CPU new zeros filled with the share where
    ``x`` is the value (contiguous), elsewhere the mask times the share (the mask's layout, ``x``'s)."""
    value_is_nan = ltorch.ne(value, value)
    mask = ltorch.where(value_is_nan, ltorch.ne(x, x), ltorch.eq(x, value))
    share = ltorch.true_divide(g, ltorch.sum(mask))
    if x.device.type == "cpu":
        return ltorch.masked_fill(ltorch.new_zeros(x, x.shape), mask, share)
    return ltorch.where(mask, share, 0.0)


def _define_full_extremum_grad(symbol):
    """``torch.max(x)``/``torch.min(x)``: eager's ``evenly_distribute_backward``. The other forms
    (along a dim, elementwise) differentiate their decomposition."""

    @register_grad(symbol)
    def full_extremum_grad(input, dim=None, keepdim=False, *, other=None):
        out = symbol(input, dim, keepdim, other=other)
        if dim is not None or other is not None or not input.dtype.is_floating_point:
            return out
        put_grad(input, ltorch.to(_evenly_distributed(get_grad(out), input, out), input.dtype))
        return out

    return full_extremum_grad


max_grad = _define_full_extremum_grad(ltorch.max)
min_grad = _define_full_extremum_grad(ltorch.min)
