"""The core language: helpers that ltorch decompositions build on.

Broadcasting, type promotion and dim canonicalisation live here. They emit prims and never
appear as symbols in traces. Errors name the ltorch op that called them.
"""

import operator

import torch

from thunder_rs import prims
from thunder_rs.core.base import dtypes
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderOverflowError,
    ThunderRuntimeError,
    ThunderValueError,
    check,
)
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt, identical, same_shape

Number = (bool, int, float)

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


def check_python_int(a) -> None:
    """Eager's error for a Python int number argument no Scalar holds: below int64, "can't convert
    negative int to unsigned"; past uint64, "int too big to convert" (its argument parser's
    ``OverflowError``, whatever the tensor's dtype)."""
    if type(a) is int and not _INT64_MIN <= a <= _UINT64_MAX:
        message = "can't convert negative int to unsigned" if a < 0 else "int too big to convert"
        raise ThunderOverflowError(message)


def _check_uint64_scalar(op: str, operands, compute: torch.dtype) -> None:
    """A Python int past int64 (up to uint64: eager's uint64 Scalar) with integer or bool tensors:
    eager's error of a bool tensor, else a refusal (eager's integer kernels wrap it, each its own
    way: ``x * 2**63`` as ``x * -2**63``, ``x.clamp(max=2**63)`` not); a floating result takes
    it as a float, rounded once as eager's ``double(uint64_t)``."""
    if dtypes.is_inexact(compute):
        return
    for x in operands:
        if type(x) is int and x > _INT64_MAX:
            if all(t.dtype == torch.bool for t in operands if isinstance(t, torch.Tensor)):
                raise ThunderRuntimeError(
                    "Promotion for uint16, uint32, uint64 types is not supported, attempted to promote Bool and UInt64"
                )
            raise ThunderNotImplementedError(
                f"{op}: the Python int {x} at {user_location()} is past int64, which eager takes as a uint64 "
                f"scalar that its {compute} kernel wraps; thunder_rs does not represent uint64 scalars "
                "(convert it to a tensor of the dtype wanted, or to a float)"
            )


def canonicalize_dim(ndim: int, dim: int, op: str, arg: str = "dim") -> int:
    """``dim`` as a non-negative index into a tensor of rank ``ndim`` (0-d tensors accept 0, -1)."""
    rank = max(ndim, 1)
    if type(dim) is SymInt:  # a dim given by an int argument that changes between calls: specialised
        dim = operator.index(dim)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ThunderValueError(f"{op}: expected an int for {arg}, got {dim!r}")
    check(
        -rank <= dim < rank,
        op,
        f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim}) (argument {arg})",
        ThunderIndexError,
    )
    return dim % rank


def canonicalize_dims(ndim: int, dims, op: str, arg: str = "dim") -> tuple[int, ...]:
    """Canonical, de-duplicated-checked dims; ``None`` or ``()`` means every dim."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int) or type(dims) is SymInt:
        dims = (dims,)
    out = tuple(canonicalize_dim(ndim, d, op, arg) for d in dims)
    check(
        len(set(out)) == len(out), op, f"dim {tuple(dims)} appears multiple times in the list of dims (argument {arg})"
    )
    return out


def broadcast_shapes(op: str, *shapes) -> tuple[int, ...]:
    """The shape ``shapes`` broadcast to. A size against the constant 1 (or the first at its dim)
    is taken without a decision: a symbolic count compared with 1 would be a guard, one that
    counts of 1 fail, where the result is the count either way."""
    ndim = max((len(s) for s in shapes), default=0)
    out: list = [None] * ndim
    for shape in shapes:
        offset = ndim - len(shape)
        # From the last dim, as eager checks: a mismatch is reported at the dim eager names.
        for i in range(ndim - 1, offset - 1, -1):
            size = shape[i - offset]
            # A size that is the other's as data decides nothing: ``t - 1`` against ``t - 1`` would
            # ask whether it is 1 and guard ``t != 2``.
            if out[i] is None or _is_one(out[i]) or identical(size, out[i]):
                out[i] = size
                continue
            if _is_one(size) or size == out[i] or size == 1:
                continue
            check(
                out[i] == 1,
                op,
                lambda: (
                    f"The size of tensor a ({out[i]}) must match the size of tensor b ({size}) at non-singleton "
                    f"dimension {i} (shapes {', '.join(str(list(s)) for s in shapes)})"
                ),
                ThunderRuntimeError,
            )
            out[i] = size
    return tuple(1 if size is None else size for size in out)


def _is_one(size) -> bool:
    return type(size) is int and size == 1


def expand_to(a, shape):
    """Broadcasts ``a`` to ``shape`` (a no-op when it already has it)."""
    shape = tuple(shape)
    if same_shape(a.shape, shape):
        return a
    offset = len(shape) - a.ndim
    return prims.broadcast_in_dim(a, shape, tuple(range(offset, len(shape))))


def maybe_convert(a, dtype):
    """``a`` converted to ``dtype``: tensors by a prim, numbers in Python."""
    if isinstance(a, torch.Tensor):
        return a if a.dtype == dtype else prims.convert_element_type(a, dtype)
    if type(a) is SymFloat:  # a float of sizes: computed on each call, converted by the op as eager's is
        return a if dtypes.is_inexact(dtype) else maybe_convert(float(a), dtype)
    if isinstance(a, Number):
        check_python_int(a)
        if dtype == torch.bool:
            return bool(a)
        if dtypes.is_inexact(dtype):
            return float(a)
        try:
            value = int(a)
        except (ValueError, OverflowError):  # NaN or infinity, as eager's error says
            value = None
        if value is None or not _INT64_MIN <= value <= _INT64_MAX:  # (a uint64 scalar: eager's fills refuse it)
            raise ThunderRuntimeError(f"value cannot be converted to type {dtype} without overflow")
        return value
    return a


# Type promotion kinds, as in Thunder and torch._prims_common.
DEFAULT, INT_TO_FLOAT, ALWAYS_BOOL, COMPLEX_TO_FLOAT, NUMBER_TO_INT = range(5)


def promote(op: str, operands, kind=DEFAULT) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) of an elementwise op over ``operands``."""
    result = dtypes.result_type(*operands)
    check(
        result in dtypes.CODES,
        op,
        lambda: (
            f"the operands promote to {result}, a dtype thunder_rs does not support (operands: {_dtypes_of(operands)})"
        ),
        ThunderNotImplementedError,
    )
    compute = result
    if kind == INT_TO_FLOAT and not dtypes.is_inexact(result):
        compute = result = torch.get_default_dtype()
    elif kind == ALWAYS_BOOL:
        result = torch.bool
    elif kind == COMPLEX_TO_FLOAT and dtypes.is_complex(result):
        result = torch.float32 if result == torch.complex64 else torch.float64
    return compute, result


def _dtypes_of(operands) -> str:
    return ", ".join(str(x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__ for x in operands)


def _device_of(op, operands):
    # (``torch.device``s: equal where their names are, without making the names)
    devices = {x.device for x in operands if isinstance(x, torch.Tensor) and x.ndim > 0}
    devices = devices or {x.device for x in operands if isinstance(x, torch.Tensor)}
    check(len(devices) <= 1, op, lambda: f"expected all tensors on one device, got {sorted(map(str, devices))}")


def elementwise(prim, op: str, *operands, kind=DEFAULT):
    """Promotes, broadcasts and applies an elementwise ``prim`` over tensors and numbers."""
    tensors = [x for x in operands if isinstance(x, torch.Tensor)]
    check(bool(tensors), op, "expected at least one tensor argument", ThunderValueError)
    _device_of(op, operands)
    for x in operands:
        check_python_int(x)
    compute, result = promote(op, operands, kind)
    _check_uint64_scalar(op, operands, compute)
    shape = broadcast_shapes(op, *(t.shape for t in tensors))
    args = [
        expand_to(maybe_convert(x, compute), shape) if isinstance(x, torch.Tensor) else maybe_convert(x, compute)
        for x in operands
    ]
    out = prim(*args)
    return maybe_convert(out, result) if kind not in (ALWAYS_BOOL,) else out
