"""Creation ops: arange, zeros/ones/full/empty and their ``_like`` and ``Tensor.new_`` forms,
and tril/triu (random ones are in ``random.py``).

Sizes come as varargs or one sequence (``zeros(2, 3)``, ``zeros((2, 3))``, ``zeros(x.shape)``).
``layout``, ``pin_memory``, ``memory_format`` and ``generator`` are accepted and ignored: the
torch executor passes them on when it runs a creation op whole. ``empty`` is ``full(..., 0)``,
since its values are unspecified.
"""

import math

import torch

from thunder_rs import clang, prims
from thunder_rs.core.base import dtypes
from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.lang.langctx import PROXY_CALLS
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.symbols import torchsymbol

T = torch.Tensor
__all__ = [
    "arange",
    "full",
    "zeros",
    "ones",
    "empty",
    "full_like",
    "zeros_like",
    "ones_like",
    "empty_like",
    "new_full",
    "new_zeros",
    "new_ones",
    "new_empty",
    "tril",
    "triu",
]

_CPU = torch.device("cpu")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _shape(size, op: str) -> tuple[int, ...]:
    """The shape of varargs ``size``: ints, or one sequence of ints."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = size[0]
    check(
        all(_is_int(s) for s in size),
        op,
        lambda: f"expected a sequence of ints for size, got {tuple(size)!r} (argument size)",
        ThunderTypeError,
    )
    check(
        all(s >= 0 for s in size),
        op,
        lambda: f"Dimension size must be non-negative, got {list(size)} (argument size)",
        ThunderRuntimeError,
    )
    return tuple(size)


def _device(device, like=None) -> torch.device:
    if device is None:
        return like.device if like is not None else _CPU
    return device if isinstance(device, torch.device) else torch.device(device)


def _fill(shape, fill_value, device, dtype):
    return prims.full(shape, clang.maybe_convert(fill_value, dtype), device, dtype)


def _fill_dtype(fill_value) -> torch.dtype:
    """The dtype ``torch.full`` infers from its fill value."""
    if isinstance(fill_value, bool):
        return torch.bool
    return torch.int64 if isinstance(fill_value, int) else torch.get_default_dtype()


@torchsymbol(torch.full)
def full(size, fill_value, *, out=None, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False):
    check(
        isinstance(size, (tuple, list, torch.Size)),
        "ltorch.full",
        f"expected a sequence of ints for size, got {type(size).__name__} (argument size)",
        ThunderTypeError,
    )
    shape = _shape((size,), "ltorch.full")
    return _fill(shape, fill_value, _device(device), dtype or _fill_dtype(fill_value))


def _define_constant(name: str, value):
    """``zeros``/``ones``/``empty``: a size and a fill value known in advance."""
    op = f"ltorch.{name}"

    @torchsymbol(getattr(torch, name), name=name)
    def constant(
        *sizes,
        size=None,
        out=None,
        dtype=None,
        layout=None,
        device=None,
        requires_grad=False,
        pin_memory=False,
        memory_format=None,
    ):
        dtype = dtype or torch.get_default_dtype()
        shape = _shape(sizes if size is None else (size,), op)
        return prims.full(shape, clang.maybe_convert(value, dtype), _device(device), dtype)

    return constant


zeros = _define_constant("zeros", 0)
ones = _define_constant("ones", 1)
empty = _define_constant("empty", 0)


@torchsymbol(torch.full_like)
def full_like(input, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None):
    return _fill(tuple(input.shape), fill_value, _device(device, input), dtype or input.dtype)


def _define_constant_like(name: str, value):
    @torchsymbol(getattr(torch, name), name=name)
    def constant_like(input, *, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None):
        return full_like(input, value, dtype=dtype, device=device)

    return constant_like


zeros_like = _define_constant_like("zeros_like", 0)
ones_like = _define_constant_like("ones_like", 1)
empty_like = _define_constant_like("empty_like", 0)


@torchsymbol(T.new_full)
def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False):
    return _fill(_shape((size,), "ltorch.new_full"), fill_value, _device(device, self), dtype or self.dtype)


def _define_new_constant(name: str, value):
    """``Tensor.new_zeros``/``new_ones``/``new_empty``: dtype and device default to ``self``'s."""
    op = f"ltorch.{name}"

    @torchsymbol(getattr(T, name), name=name)
    def new_constant(
        self, *sizes, size=None, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False
    ):
        dtype = dtype or self.dtype
        shape = _shape(sizes if size is None else (size,), op)
        return prims.full(shape, clang.maybe_convert(value, dtype), _device(device, self), dtype)

    return new_constant


new_zeros = _define_new_constant("new_zeros", 0)
new_ones = _define_new_constant("new_ones", 1)
new_empty = _define_new_constant("new_empty", 0)


def _legacy_new(self, *args, **kwargs):
    """``Tensor.new``: sizes (ints or a ``torch.Size``, as torch.distributions passes) give an
    uninitialised tensor of that shape, like ``new_empty``; data (a list, a tuple) is eager's
    call. Told apart here: the traced call would see a ``torch.Size`` as a plain tuple of data."""
    sizes = args[0] if len(args) == 1 and isinstance(args[0], torch.Size) else args or (0,)
    if all(type(n) is int for n in sizes) and set(kwargs) <= {"device"}:
        return new_empty(self, tuple(sizes), device=kwargs.get("device"))
    return user_fallback(T.new, (self, *args), kwargs)


PROXY_CALLS[T.new] = _legacy_new


def _check_arange(start, end, step, op: str):
    for name, value in (("start", start), ("end", end), ("step", step)):
        check(
            isinstance(value, (int, float)) and not isinstance(value, bool),
            op,
            f"expected a number for {name}, got {type(value).__name__} (argument {name})",
            ThunderTypeError,
        )
        check(math.isfinite(value), op, f"unsupported range: {start} -> {end} (argument {name})", ThunderRuntimeError)
    check(step != 0, op, "step must be nonzero (argument step)", ThunderRuntimeError)
    check(
        (step > 0 and end >= start) or (step < 0 and end <= start),
        op,
        "upper bound and lower bound inconsistent with step sign (argument step)",
        ThunderRuntimeError,
    )


@torchsymbol(torch.arange)
def arange(
    start=0, end=None, step=1, *, out=None, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False
):
    """``start + i * step`` for ``i < ceil((end - start) / step)``. Integer dtypes step in integers
    (``start`` and ``step`` truncated, as torch does); floating ones compute in float64 and round once."""
    op = "ltorch.arange"
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = torch.int64 if all(_is_int(x) for x in (start, end, step)) else torch.get_default_dtype()
    check(
        dtypes.is_int(dtype) or dtypes.is_float(dtype),
        op,
        f'"arange" not implemented for {dtype} (argument dtype)',
        ThunderNotImplementedError,
    )
    _check_arange(start, end, step, op)
    length, device = math.ceil((end - start) / step), _device(device)
    if dtypes.is_int(dtype) or (_is_int(start) and _is_int(step)):
        if int(step) == 0:  # a fractional step truncates to 0 for integer dtypes
            return prims.full((length,), int(start), device, dtype)
        return prims.iota(length, int(start), int(step), device, dtype)
    index = prims.iota(length, 0, 1, device, torch.float64)
    return clang.maybe_convert(prims.add(prims.mul(index, float(step)), float(start)), dtype)


def _check_random_dtype(dtype, op: str):
    check(
        dtypes.is_float(dtype),
        op,
        f"expected a floating dtype, got {dtype} (argument dtype)",
        ThunderNotImplementedError,
    )


def _define_triangle(name: str, keep):
    """``tril``/``triu``: keeps the elements whose column minus row satisfies ``keep`` against ``diagonal``."""
    op = f"ltorch.{name}"

    @torchsymbol(getattr(torch, name), getattr(T, name), name=name)
    def triangle(input, diagonal=0):
        check(input.ndim >= 2, op, "input tensor must have at least 2 dimensions (argument input)", ThunderRuntimeError)
        check(
            _is_int(diagonal),
            op,
            f"expected an int for diagonal, got {diagonal!r} (argument diagonal)",
            ThunderTypeError,
        )
        rows, cols = input.shape[-2:]
        row = prims.broadcast_in_dim(prims.iota(rows, 0, 1, input.device, torch.int64), (rows, cols), (0,))
        col = prims.broadcast_in_dim(prims.iota(cols, 0, 1, input.device, torch.int64), (rows, cols), (1,))
        mask = clang.expand_to(keep(prims.sub(col, row), diagonal), tuple(input.shape))
        return prims.where(mask, input, clang.maybe_convert(0, input.dtype))

    return triangle


tril = _define_triangle("tril", prims.le)
triu = _define_triangle("triu", prims.ge)
