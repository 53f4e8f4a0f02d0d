"""More creation ops: eye, linspace and logspace (number and tensor endpoints), and the conjugation
ops, which for real tensors return their input.

thunder_rs has no prim that builds or splits complex tensors, so ``complex``, ``polar``,
``view_as_real`` and ``view_as_complex`` stay eager fallbacks, and the conjugation ops refuse
complex inputs with an error naming the op.
"""

import torch

from thunder_rs import clang, prims
from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.base import dtypes
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.creation import _device, _is_int

T = torch.Tensor
__all__ = ["eye", "linspace", "logspace", "conj", "conj_physical", "resolve_conj", "resolve_neg"]


def identity(n: int, dtype, device, m: int | None = None):
    """The ``n`` by ``m`` (default ``n``) identity matrix: ones where row and column agree."""
    m = n if m is None else m
    rows = prims.broadcast_in_dim(prims.iota(n, 0, 1, device, torch.int64), (n, m), (0,))
    cols = prims.broadcast_in_dim(prims.iota(m, 0, 1, device, torch.int64), (n, m), (1,))
    return prims.convert_element_type(prims.eq(rows, cols), dtype)


@torchsymbol(torch.eye)
def eye(n, m=None, *, out=None, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False):
    op = "ltorch.eye"
    for value, name in ((n, "n"), (m, "m")):
        check(
            value is None or _is_int(value),
            op,
            f"expected an int, got {type(value).__name__} (argument {name})",
            ThunderTypeError,
        )
        check(
            value is None or value >= 0,
            op,
            f"{name} must be greater or equal to 0, got {value} (argument {name})",
            ThunderRuntimeError,
        )
    return identity(n, dtype or torch.get_default_dtype(), _device(device), m)


def _endpoint(op: str, value, name: str, dtype, device):
    """``start``/``end`` as a 0-d tensor of ``dtype``: a number, or a 0-d tensor (its value traced)."""
    if isinstance(value, TensorProxy):
        check(
            value.ndim == 0,
            op,
            f"linspace only supports 0-dimensional start and end tensors, but got {name} with {value.ndim} "
            "dimension(s).",
            ThunderRuntimeError,
        )
        check(
            not value.dtype.is_complex,
            op,
            f"complex endpoints are not supported by thunder_rs (argument {name})",
            ThunderNotImplementedError,
        )
        return clang.maybe_convert(value, dtype)
    check(
        isinstance(value, (int, float)) and not isinstance(value, complex),
        op,
        f"expected a real number or a 0-d tensor, got {type(value).__name__} (argument {name})",
        ThunderTypeError,
    )
    return prims.full((), clang.maybe_convert(value, dtype), device, dtype)


def _spaced(op: str, start, end, steps, dtype, device):
    """``steps`` points from ``start`` to ``end``, computed as eager's kernel does: the first half
    as ``start + i * step``, the second as ``end - (steps - 1 - i) * step``, in ``dtype`` (in float64
    for integer dtypes)."""
    check(
        _is_int(steps), op, f"expected an int for steps, got {type(steps).__name__} (argument steps)", ThunderTypeError
    )
    check(steps >= 0, op, "number of steps must be non-negative (argument steps)", ThunderRuntimeError)
    check(
        not dtypes.is_complex(dtype) and dtype != torch.bool,
        op,
        f"not supported for dtype {dtype} (argument dtype)",
        ThunderNotImplementedError,
    )
    compute = dtype if dtypes.is_float(dtype) else torch.float64
    first = _endpoint(op, start, "start", compute, device)
    last = _endpoint(op, end, "end", compute, device)
    if steps <= 1:
        return prims.broadcast_in_dim(first, (steps,), ()), compute
    step = prims.div(prims.sub(last, first), clang.maybe_convert(steps - 1, compute))
    index = prims.iota(steps, 0, 1, device, compute)
    half = steps // 2
    below = prims.add(
        prims.broadcast_in_dim(first, (steps,), ()), prims.mul(index, prims.broadcast_in_dim(step, (steps,), ()))
    )
    from_end = prims.iota(steps, steps - 1, -1, device, compute)
    above = prims.sub(
        prims.broadcast_in_dim(last, (steps,), ()), prims.mul(from_end, prims.broadcast_in_dim(step, (steps,), ()))
    )
    lower_half = prims.lt(prims.iota(steps, 0, 1, device, torch.int64), clang.maybe_convert(half, torch.int64))
    return prims.where(lower_half, below, above), compute


@torchsymbol(torch.linspace)
def linspace(start, end, steps, *, out=None, dtype=None, layout=None, device=None, requires_grad=False):
    op = "ltorch.linspace"
    dtype = dtype or torch.get_default_dtype()
    device = _device(device, start if isinstance(start, TensorProxy) else None)
    values, _ = _spaced(op, start, end, steps, dtype, device)
    return clang.maybe_convert(values, dtype)


@torchsymbol(torch.logspace)
def logspace(start, end, steps, base=10.0, *, out=None, dtype=None, layout=None, device=None, requires_grad=False):
    """``base ** linspace(start, end, steps)``, the power taken in the computing dtype."""
    op = "ltorch.logspace"
    check(
        isinstance(base, (int, float)),
        op,
        f"expected a real number for base, got {type(base).__name__} (argument base)",
        ThunderTypeError,
    )
    dtype = dtype or torch.get_default_dtype()
    device = _device(device, start if isinstance(start, TensorProxy) else None)
    exponents, compute = _spaced(op, start, end, steps, dtype, device)
    powers = prims.pow(prims.full((steps,), float(base), device, compute), exponents)
    return clang.maybe_convert(powers, dtype)


def _real_only(op: str, input):
    check(
        isinstance(input, torch.Tensor),
        op,
        f"expected a tensor, got {type(input).__name__} (argument input)",
        ThunderTypeError,
    )
    check(
        not input.dtype.is_complex,
        op,
        "complex tensors are not supported by thunder_rs (argument input)",
        ThunderNotImplementedError,
    )
    return input


@torchsymbol(torch.conj, T.conj)
def conj(input):
    """A real tensor is its own conjugate (eager returns the tensor itself)."""
    return _real_only("ltorch.conj", input)


@torchsymbol(torch.resolve_conj, T.resolve_conj)
def resolve_conj(input):
    return _real_only("ltorch.resolve_conj", input)


@torchsymbol(torch.resolve_neg, T.resolve_neg)
def resolve_neg(input):
    return _real_only("ltorch.resolve_neg", input)


@torchsymbol(torch.conj_physical, T.conj_physical)
def conj_physical(input):
    """A copy of a real tensor."""
    return ltorch.clone(_real_only("ltorch.conj_physical", input))
