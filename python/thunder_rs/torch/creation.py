"""Creation ops: arange, zeros/ones/full/empty and their ``_like`` and ``Tensor.new_`` forms,
tril/triu, eye, linspace and logspace, and the conjugation ops, which for real tensors return their
input (random ones are in ``random.py``), and ``torch.tensor`` and its kin of data holding symbolic
sizes (``torch.tensor(x.shape[0])``), which the trace computes from the sizes.

Sizes come as varargs or one sequence (``zeros(2, 3)``, ``zeros((2, 3))``, ``zeros(x.shape)``).
``layout``, ``pin_memory``, ``memory_format`` and ``generator`` are accepted and ignored: the
torch executor passes them on when it runs a creation op whole. ``empty`` is ``full(..., 0)``,
since its values are unspecified.
"""

import math

import torch

from thunder_rs import clang, prims
from thunder_rs.core.base import dtypes
from thunder_rs.core.lang.devices import indexed
from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import PROXY_CALLS, SIZE_DATA
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt, identical
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.torch.common import require_tensor, is_int, size_value
from thunder_rs.torch.symbols import ltorch, torchsymbol

T = torch.Tensor
__all__ = [
    "arange",
    "full",
    "zeros",
    "ones",
    "empty",
    "empty_strided",
    "full_like",
    "zeros_like",
    "ones_like",
    "empty_like",
    "new_full",
    "new_zeros",
    "new_ones",
    "new_empty",
    "new_empty_strided",
    "tril",
    "triu",
]


def _shape(size, op: str) -> tuple[int, ...]:
    """The shape of varargs ``size``: ints, or one sequence of ints."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = size[0]
    check(
        all(is_int(s) for s in size),
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
    """Where a factory call puts its tensor: ``device``, else ``like``'s, else torch's default device
    (``torch.set_default_device``, a ``with torch.device(...)`` block), as eager's factories do; the
    cache key holds the default device (``cache.global_key``)."""
    if device is None:
        return like.device if like is not None else torch.get_default_device()
    return indexed(device if isinstance(device, torch.device) else torch.device(device))


def filled(shape, fill_value, device, dtype):
    """``shape`` filled with ``fill_value``: a number, or a symbolic size read on each call."""
    if type(fill_value) is SymInt:
        value = size_value(device, dtype, fill_value)
        return prims.broadcast_in_dim(value, shape, ()) if shape else value
    if type(fill_value) is SymFloat and dtype.is_floating_point:
        # A float of sizes, computed on each call (``prims.full`` takes a number known when
        # compiling): ones times it, exact in double, rounded to ``dtype`` as eager's fill rounds it.
        value = prims.mul(prims.full(shape, 1.0, device, torch.float64), fill_value)
        return value if dtype == torch.float64 else prims.convert_element_type(value, dtype)
    return prims.full(shape, clang.maybe_convert(fill_value, dtype), device, dtype)


def _contiguous(out):
    """``out`` as eager's factory makes it from sizes alone: contiguous, so that a fill written over
    it needs no layout from it (``inplace._fills``)."""
    out._made_contiguous = True
    return out


def fill_dtype(fill_value) -> torch.dtype:
    """The dtype ``torch.full`` infers from its fill value."""
    if isinstance(fill_value, bool):
        return torch.bool
    return torch.int64 if is_int(fill_value) else torch.get_default_dtype()


@torchsymbol(torch.full)
def full(size, fill_value, *, out=None, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False):
    check(
        isinstance(size, (tuple, list, torch.Size)),
        "ltorch.full",
        f"expected a sequence of ints for size, got {type(size).__name__} (argument size)",
        ThunderTypeError,
    )
    shape = _shape((size,), "ltorch.full")
    return _contiguous(filled(shape, fill_value, _device(device), dtype or fill_dtype(fill_value)))


def _define_constant(name: str, value):
    """``zeros``/``ones``/``empty``: a size and a fill value known in advance."""
    op = f"ltorch.{name}"

    @torchsymbol(getattr(torch, name), name=name, reads_numbers_from=0)
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
        out = prims.full(shape, clang.maybe_convert(value, dtype), _device(device), dtype)
        return _contiguous(out) if memory_format in (None, torch.contiguous_format) else out

    return constant


zeros = _define_constant("zeros", 0)
ones = _define_constant("ones", 1)
empty = _define_constant("empty", 0)


@torchsymbol(torch.empty_strided)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False):
    """An uninitialised tensor laid out by ``stride`` (``layout_rules``), which the torch executor
    makes as eager does; the trace's value is zeros. Sizes and strides may be symbolic."""
    op = "ltorch.empty_strided"
    dtype = dtype or torch.get_default_dtype()
    shape = _shape((size,), op)
    check(
        len(tuple(stride)) == len(shape),
        op,
        lambda: f"dimensionality of sizes ({len(shape)}) must match dimensionality of strides ({len(tuple(stride))})",
        ThunderRuntimeError,
    )
    return prims.full(shape, clang.maybe_convert(0, dtype), _device(device), dtype)


@torchsymbol(torch.full_like)
def full_like(input, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None):
    return filled(tuple(input.shape), fill_value, _device(device, input), dtype or input.dtype)


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
    return _contiguous(
        filled(_shape((size,), "ltorch.new_full"), fill_value, _device(device, self), dtype or self.dtype)
    )


def _define_new_constant(name: str, value):
    """``Tensor.new_zeros``/``new_ones``/``new_empty``: dtype and device default to ``self``'s."""
    op = f"ltorch.{name}"

    @torchsymbol(getattr(T, name), name=name, reads_numbers_from=1)
    def new_constant(
        self, *sizes, size=None, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False
    ):
        dtype = dtype or self.dtype
        shape = _shape(sizes if size is None else (size,), op)
        return _contiguous(prims.full(shape, clang.maybe_convert(value, dtype), _device(device, self), dtype))

    return new_constant


new_zeros = _define_new_constant("new_zeros", 0)
new_ones = _define_new_constant("new_ones", 1)
new_empty = _define_new_constant("new_empty", 0)


@torchsymbol(T.new_empty_strided, name="new_empty_strided")
def new_empty_strided(
    self, size, stride, *, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False
):
    """``empty_strided`` with ``self``'s dtype and device by default."""
    return empty_strided(size, stride, dtype=dtype or self.dtype, device=_device(device, self))


def _legacy_new(self, *args, **kwargs):
    """``Tensor.new``: sizes (ints or a ``torch.Size``, as torch.distributions passes) give an
    uninitialised tensor of that shape, like ``new_empty``; data (a list, a tuple) is eager's
    call. Told apart here: the traced call would see a ``torch.Size`` as a plain tuple of data."""
    sizes = args[0] if len(args) == 1 and isinstance(args[0], torch.Size) else args or (0,)
    if all(type(n) is int for n in sizes) and set(kwargs) <= {"device"}:
        return new_empty(self, tuple(sizes), device=kwargs.get("device"))
    return user_fallback(T.new, (self, *args), kwargs)


PROXY_CALLS[T.new] = _legacy_new


# -- tensors of sizes ------------------------------------------------------------------------------
# ``torch.tensor(x.shape[0])``, ``torch.tensor([T, 2])``: data holding a symbolic size is a tensor
# the trace computes from the size on each call (``langctx.SIZE_DATA`` sends such calls here),
# where eager's call would read the size as a number and specialise the trace to it. Data these
# handlers do not take (a ragged list, a tensor or complex number in it, ``requires_grad=True``)
# returns None: the call's usual path, which specialises.


def _data_shape(data) -> tuple | None:
    """The shape of nested sequences ``data`` (``()`` for one value), or None where ragged."""
    if not isinstance(data, (list, tuple)):
        return ()
    inner = [_data_shape(d) for d in data]
    first = inner[0] if inner else ()
    if first is None or any(s != first for s in inner):
        return None
    return (len(data), *first)


def _leaves(data):
    if not isinstance(data, (list, tuple)):
        yield data
        return
    for d in data:
        yield from _leaves(d)


def _row(value, device, dtype):
    """One value of the data as a tensor of ``dtype`` of shape ``(1,)``."""
    if type(value) is SymInt:
        return clang.maybe_convert(prims.iota(1, value, 1, device, torch.int64), dtype)
    return filled((1,), value, device, dtype)


def tensor_of_sizes(data, dtype, device):
    """``torch.tensor(data)`` of numbers and sizes, with eager's dtype (the default dtype where a
    float is among them, else int64), or None where the data is not only real numbers."""
    shape, leaves = _data_shape(data), list(_leaves(data))
    if shape is None or not all(type(v) in (bool, int, float, SymInt, SymFloat) for v in leaves):
        return None
    if dtype is None:
        dtype = torch.get_default_dtype() if any(type(v) in (float, SymFloat) for v in leaves) else torch.int64
    if dtype.is_complex:
        return None
    if not shape:
        return filled((), leaves[0], device, dtype)
    rows = [_row(v, device, dtype) for v in leaves]
    flat = rows[0] if len(rows) == 1 else prims.cat(rows, 0)
    return flat if len(shape) == 1 else prims.reshape(flat, shape)


def _tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    return None if requires_grad else tensor_of_sizes(data, dtype, _device(device))


def _as_tensor(data, dtype=None, device=None, copy=None, requires_grad=False):
    """``torch.as_tensor``/``asarray`` of data (of a tensor: ``PROXY_CALLS``)."""
    return None if requires_grad else tensor_of_sizes(data, dtype, _device(device))


def _scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False):
    if requires_grad or type(s) not in (SymInt, SymFloat):
        return None
    if type(s) is SymFloat:
        return filled((), s, _device(device), dtype or torch.get_default_dtype())
    return size_value(_device(device), dtype or torch.get_default_dtype(), s)


def _new_tensor(self, data, *, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False):
    """``Tensor.new_tensor``: ``self``'s dtype and device unless given, whatever the data."""
    return None if requires_grad else tensor_of_sizes(data, dtype or self.dtype, _device(device, self))


SIZE_DATA.update(
    {
        torch.tensor: _tensor,
        torch.as_tensor: _as_tensor,
        torch.asarray: _as_tensor,
        torch.scalar_tensor: _scalar_tensor,
        T.new_tensor: _new_tensor,
    }
)


def _check_arange(start, end, step, op: str):
    for name, value in (("start", start), ("end", end), ("step", step)):
        check(
            is_int(value) or isinstance(value, (float, SymFloat)),
            op,
            f"expected a number for {name}, got {type(value).__name__} (argument {name})",
            ThunderTypeError,
        )
        if isinstance(value, SymFloat):  # (comparisons, which a float of sizes answers as a relation)
            message = f"unsupported range: {start} -> {end} (argument {name})"
            check(-math.inf < value < math.inf, op, message, ThunderRuntimeError)
        elif isinstance(value, float):
            check(
                math.isfinite(value), op, f"unsupported range: {start} -> {end} (argument {name})", ThunderRuntimeError
            )
    check(step != 0, op, "step must be nonzero (argument step)", ThunderRuntimeError)
    check(
        (step > 0 and end >= start) or (step < 0 and end <= start),
        op,
        "upper bound and lower bound inconsistent with step sign (argument step)",
        ThunderRuntimeError,
    )


def _whole_length(start, end, step: int):
    """``ceil((end - start) / step)`` in integers, for sizes that may be symbolic."""
    return (end - start + step - 1) // step if step > 0 else (start - end - step - 1) // -step


def _iota(length, start, step, device, dtype):
    """``start + i * step`` for ``i < length``: an iota, whose step is a number; by a symbolic
    step, the iota of int64 indices times it (exact in int64), then in ``dtype``."""
    if type(step) is not SymInt:
        return prims.iota(length, start, step, device, dtype)
    values = prims.mul(prims.iota(length, 0, 1, device, torch.int64), step)
    return clang.maybe_convert(values if identical(start, 0) else prims.add(values, start), dtype)


@torchsymbol(torch.arange, reads_numbers_from=0)
def arange(
    start=0, end=None, step=1, *, out=None, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False
):
    """``start + i * step`` for ``i < ceil((end - start) / step)``. Integer dtypes step in integers
    (``start`` and ``step`` truncated, as torch does); floating ones compute in float64 and round once."""
    op = "ltorch.arange"
    # a bool is eager's integer Scalar (``arange(False, True, True)``: ``[0]``, int64)
    start, end, step = (int(v) if type(v) is bool else v for v in (start, end, step))
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = torch.int64 if all(is_int(x) for x in (start, end, step)) else torch.get_default_dtype()
    check(
        dtypes.is_int(dtype) or dtypes.is_float(dtype),
        op,
        f'"arange" not implemented for {dtype} (argument dtype)',
        ThunderNotImplementedError,
    )
    # In integers where it can be (``(end - start + step - 1) // step``), whole floats included:
    # a symbolic end or step keeps the length symbolic (``arange(T)``, ``arange(1.0, 3 * T, T)``,
    # Funnel's ``arange(-2 * T, 2 * T, 1.0, dtype=torch.int64)``); a float compared with a size
    # would specialise it.
    start, end, step = (int(v) if isinstance(v, float) and v.is_integer() else v for v in (start, end, step))
    _check_arange(start, end, step, op)
    whole = all(is_int(v) for v in (start, end, step))
    length = _whole_length(start, end, step) if whole else math.ceil((end - start) / step)
    device = _device(device)
    if dtypes.is_int(dtype) or (is_int(start) and is_int(step)):
        if not is_int(step):
            step = int(step)  # truncated for integer dtypes, as torch does
            if step == 0:
                return prims.full((length,), int(start), device, dtype)
        # A symbolic start stays symbolic (``arange(T, T + 2)``, positions after a cache's length).
        return _iota(length, start if is_int(start) else int(start), step, device, dtype)
    if whole:  # a whole float step: start + i * step in float64 (a symbolic start stays symbolic)
        return clang.maybe_convert(_iota(length, start, step, device, torch.float64), dtype)
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
            is_int(diagonal),
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


def _triangle_grad(symbol):
    """Eager's ``TrilBackward0``/``TriuBackward0``: the gradient's own triangle. The forward stays
    one call, as eager's kernel (differentiated through its decomposition, a ``where`` over a
    mask broadcast across the batch, it was laid out as the ``where``, not row-major as eager's
    ``tril``/``triu`` of a permuted input)."""

    def grad(input, diagonal=0):
        out = symbol(input, diagonal)
        put_grad(input, symbol(get_grad(out), diagonal), complex_values=True)  # (elements kept or zeroed)
        return out

    register_grad(symbol)(grad)


_triangle_grad(tril)
_triangle_grad(triu)


# -- eye, linspace and logspace; conjugation -------------------------------------------------------


# thunder_rs has no prim that builds or splits complex tensors, so ``complex``, ``polar``,
# ``view_as_real`` and ``view_as_complex`` stay eager fallbacks, and the conjugation ops refuse
# complex inputs with an error naming the op.


__all__ += ["eye", "linspace", "logspace", "conj", "conj_physical", "resolve_conj", "resolve_neg"]


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
            value is None or is_int(value),
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
    if type(value) is SymInt:  # a size (``linspace(0, T - 1, T)``): read on each call
        return size_value(device, dtype, value)
    if type(value) is SymFloat:  # a float of sizes (``linspace(0.0, T / 2, n)``): computed on each call
        return filled((), value, device, dtype)
    check(
        isinstance(value, (int, float)) and not isinstance(value, complex),
        op,
        f"expected a real number or a 0-d tensor, got {type(value).__name__} (argument {name})",
        ThunderTypeError,
    )
    return prims.full((), clang.maybe_convert(value, dtype), device, dtype)


def _fma(a, n, c):
    """``a * n + c`` rounded once, as the FMA eager's CPU kernels contract it to: float64 ``a``
    and ``c`` (0-d) and ``n``, exact integers below 2**26. ``a`` is split into two halves of 26
    bits (Veltkamp), whose products with ``n`` are exact; ``c`` plus the high product is summed
    exactly (TwoSum), and the low product and the error added last, which rounds as the FMA but
    where the three terms meet at a tie."""
    shape = n.shape
    a, c = (prims.broadcast_in_dim(x, shape, ()) for x in (a, c))
    scaled = prims.mul(a, 134217729.0)  # 2**27 + 1
    high = prims.sub(scaled, prims.sub(scaled, a))
    low = prims.sub(a, high)
    high_product, low_product = prims.mul(high, n), prims.mul(low, n)
    total = prims.add(c, high_product)
    part = prims.sub(total, c)
    error = prims.add(prims.sub(c, prims.sub(total, part)), prims.sub(high_product, part))
    return prims.add(total, prims.add(error, low_product))


def _spaced(op: str, start, end, steps, dtype, device):
    """``steps`` points from ``start`` to ``end``, computed as eager's CPU kernel does: the ends
    converted to ``dtype`` (integers truncated), a step computed in float32 for half precision
    (its opmath), float64 for integer dtypes, the first half of the points as ``start + step * i``
    and the second as ``end - step * (steps - 1 - i)``, each one FMA as the kernel's compiler
    contracts it (float16's a product and a sum in float32), rounded to ``dtype``. Returns them
    in the computing dtype, and that dtype."""
    _check_spaced(op, steps, dtype)
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    compute = compute if dtypes.is_float(dtype) else torch.float64
    first = _endpoint(op, start, "start", compute, device)
    last = _endpoint(op, end, "end", compute, device)
    if compute is not dtype:  # (eager's ``Scalar::to<scalar_t>``)
        first, last = (prims.convert_element_type(prims.convert_element_type(x, dtype), compute) for x in (first, last))
    if steps <= 1:
        return prims.broadcast_in_dim(first, (steps,), ()), compute
    step = prims.div(prims.sub(last, first), clang.maybe_convert(steps - 1, compute))
    if dtype == torch.float16:
        below = _product_plus(step, prims.iota(steps, 0, 1, device, compute), first)
        above = _product_plus(prims.neg(step), prims.iota(steps, steps - 1, -1, device, compute), last)
    else:
        index = prims.iota(steps, 0, 1, device, torch.float64)
        from_end = prims.iota(steps, steps - 1, -1, device, torch.float64)
        step, first, last = (clang.maybe_convert(x, torch.float64) for x in (step, first, last))
        # (float32 products of integers below 2**24 are exact in float64: one rounding to float32)
        fma = _product_plus if compute == torch.float32 else _fma
        below, above = fma(step, index, first), fma(prims.neg(step), from_end, last)
    lower_half = prims.lt(prims.iota(steps, 0, 1, device, torch.int64), clang.maybe_convert(steps // 2, torch.int64))
    return clang.maybe_convert(prims.where(lower_half, below, above), compute), compute


def _check_spaced(op: str, steps, dtype) -> None:
    check(
        is_int(steps), op, f"expected an int for steps, got {type(steps).__name__} (argument steps)", ThunderTypeError
    )
    check(steps >= 0, op, "number of steps must be non-negative (argument steps)", ThunderRuntimeError)
    check(
        not dtypes.is_complex(dtype) and dtype != torch.bool,
        op,
        f"not supported for dtype {dtype} (argument dtype)",
        ThunderNotImplementedError,
    )


def _product_plus(a, n, c):
    """``a * n + c`` of 0-d ``a`` and ``c``, rounded after the product and after the sum."""
    return prims.add(prims.broadcast_in_dim(c, n.shape, ()), prims.mul(n, prims.broadcast_in_dim(a, n.shape, ())))


@torchsymbol(torch.linspace)
def linspace(start, end, steps, *, out=None, dtype=None, layout=None, device=None, requires_grad=False):
    op = "ltorch.linspace"
    dtype = dtype or torch.get_default_dtype()
    device = _device(device, start if isinstance(start, TensorProxy) else None)
    values, _ = _spaced(op, start, end, steps, dtype, device)
    return clang.maybe_convert(values, dtype)


def _exponents(op: str, start, end, steps, dtype, device):
    """logspace's exponents as eager's CPU kernel computes them (``RangeFactories.cpp``, built
    without FMA): the ends converted to ``dtype`` (integers truncated), their difference in
    ``dtype``, a float64 step, and ``start + step * i`` (the second half ``end - step * (steps - 1
    - i)``) in float64, a product and a sum; a single step is the start as given."""
    _check_spaced(op, steps, dtype)
    first, last = (_endpoint(op, x, name, torch.float64, device) for x, name in ((start, "start"), (end, "end")))
    if steps <= 1:
        return prims.broadcast_in_dim(first, (steps,), ())
    first, last = (prims.convert_element_type(x, dtype) for x in (first, last))
    step = prims.div(
        prims.convert_element_type(prims.sub(last, first), torch.float64), clang.maybe_convert(steps - 1, torch.float64)
    )
    first, last = (prims.convert_element_type(x, torch.float64) for x in (first, last))
    below = _product_plus(step, prims.iota(steps, 0, 1, device, torch.float64), first)
    above = _product_plus(prims.neg(step), prims.iota(steps, steps - 1, -1, device, torch.float64), last)
    lower_half = prims.lt(prims.iota(steps, 0, 1, device, torch.int64), clang.maybe_convert(steps // 2, torch.int64))
    return prims.where(lower_half, below, above)


@torchsymbol(torch.logspace)
def logspace(start, end, steps, base=10.0, *, out=None, dtype=None, layout=None, device=None, requires_grad=False):
    """``base ** exponents``, the power taken in float64 as eager's kernel takes it."""
    op = "ltorch.logspace"
    check(
        isinstance(base, (int, float)),
        op,
        f"expected a real number for base, got {type(base).__name__} (argument base)",
        ThunderTypeError,
    )
    dtype = dtype or torch.get_default_dtype()
    device = _device(device, start if isinstance(start, TensorProxy) else None)
    exponents = _exponents(op, start, end, steps, dtype, device)
    powers = prims.pow(prims.full((steps,), float(base), device, torch.float64), exponents)
    return clang.maybe_convert(powers, dtype)


def _real_only(op: str, input):
    require_tensor(op, input)
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
