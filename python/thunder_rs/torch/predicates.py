"""Floating-point predicates (``isnan``, ``isclose``) and logical ops: bool tensors from the
prims' comparisons, integers and bools answering as eager's kernels do (finite; nonzero is true)."""

import math

import torch

from thunder_rs import clang, prims
from thunder_rs.clang import ALWAYS_BOOL
from thunder_rs.errors import ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.special import _full_like, _is_nan, _operands, _real_only
from thunder_rs.torch.symbols import torchsymbol

T = torch.Tensor
__all__ = [
    "isnan",
    "isinf",
    "isposinf",
    "isneginf",
    "isreal",
    "isclose",
    "logical_and",
    "logical_or",
    "logical_xor",
    "logical_not",
]


# -- floating-point predicates ---------------------------------------------------------------------


def _classify(op: str, a, test):
    """A bool tensor: ``test(a)`` for floating dtypes; integers and bools are finite, so all False."""
    _real_only(op, a)
    return test(a) if a.dtype.is_floating_point else _full_like(a, False, torch.bool)


@torchsymbol(torch.isnan, T.isnan)
def isnan(input):
    return _classify("ltorch.isnan", input, _is_nan)


@torchsymbol(torch.isinf, T.isinf)
def isinf(input):
    return _classify("ltorch.isinf", input, lambda x: prims.eq(prims.abs(x), math.inf))


@torchsymbol(torch.isposinf, T.isposinf)
def isposinf(input):
    return _classify("ltorch.isposinf", input, lambda x: prims.eq(x, math.inf))


@torchsymbol(torch.isneginf, T.isneginf)
def isneginf(input):
    return _classify("ltorch.isneginf", input, lambda x: prims.eq(x, -math.inf))


@torchsymbol(torch.isreal, T.isreal)
def isreal(input):
    _real_only("ltorch.isreal", input)
    return _full_like(input, True, torch.bool)


@torchsymbol(torch.isclose, T.isclose)
def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    op = "ltorch.isclose"
    check(
        input.dtype == other.dtype,
        op,
        lambda: f"{input.dtype} did not match {other.dtype} (argument other)",
        ThunderRuntimeError,
    )
    check(
        rtol >= 0,
        op,
        f"rtol must be greater than or equal to zero, but got {rtol} (argument rtol)",
        ThunderRuntimeError,
    )
    check(
        atol >= 0,
        op,
        f"atol must be greater than or equal to zero, but got {atol} (argument atol)",
        ThunderRuntimeError,
    )
    _real_only(op, input)
    (x, y), _, _ = _operands(op, input, other)
    close = prims.eq(x, y)
    if equal_nan and x.dtype.is_floating_point:
        close = prims.bitwise_or(close, prims.bitwise_and(_is_nan(x), _is_nan(y)))
    if rtol == 0 and atol == 0:
        return close
    # As eager: bools are compared in the default float dtype; rtol * other is floating.
    if x.dtype == torch.bool:
        x, y = (clang.maybe_convert(t, torch.get_default_dtype()) for t in (x, y))
    allowed = clang.elementwise(
        prims.add, op, clang.elementwise(prims.abs, op, clang.elementwise(prims.mul, op, y, rtol)), atol
    )
    actual = prims.abs(prims.sub(x, y))
    within = clang.elementwise(prims.le, op, actual, allowed, kind=ALWAYS_BOOL)
    finite = prims.isfinite(actual) if actual.dtype.is_floating_point else _full_like(actual, True, torch.bool)
    return prims.bitwise_or(close, prims.bitwise_and(finite, within))


# -- logical ops -----------------------------------------------------------------------------------


def _truth(a):
    return a if a.dtype == torch.bool else prims.ne(a, clang.maybe_convert(0, a.dtype))


def _logical(op: str, a, b, prim):
    check(
        isinstance(b, torch.Tensor),
        op,
        lambda: f"argument 'other' must be Tensor, not {type(b).__name__}",
        ThunderTypeError,
    )
    shape = clang.broadcast_shapes(op, a.shape, b.shape)
    return prim(*(clang.expand_to(_truth(x), shape) for x in (a, b)))


@torchsymbol(torch.logical_and, T.logical_and)
def logical_and(input, other):
    return _logical("ltorch.logical_and", input, other, prims.bitwise_and)


@torchsymbol(torch.logical_or, T.logical_or)
def logical_or(input, other):
    return _logical("ltorch.logical_or", input, other, prims.bitwise_or)


@torchsymbol(torch.logical_xor, T.logical_xor)
def logical_xor(input, other):
    return _logical("ltorch.logical_xor", input, other, prims.bitwise_xor)


@torchsymbol(torch.logical_not, T.logical_not)
def logical_not(input):
    return prims.bitwise_not(_truth(input))
