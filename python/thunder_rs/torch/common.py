"""Helpers the op families share: argument predicates, the compute dtype of half-precision values,
the casts and reshapes grad rules write with ltorch ops, the pieces of a kernel's meta rule, and
opaque kernels (``OpaqueKernel``).

Each helper is written once here; a family keeps the helpers only it uses.
"""

import operator

import torch

from thunder_rs import _core
from thunder_rs.core.base.proxies import TensorProxy, requires_grad_of
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.recorder import current, note_gradient_through, output_meta, proxies
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt, hint
from thunder_rs import clang, prims
from thunder_rs.errors import ThunderNotImplementedError, ThunderTypeError, check
from thunder_rs.torch.symbols import ltorch

#: Eager's names of dtypes in its casting errors.
SCALAR_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Long",
    torch.int32: "Int",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
    torch.complex32: "ComplexHalf",
    torch.bcomplex32: "BComplex32",
}

#: The floating dtypes eager kernels compute in float32 (their opmath type).
LOW_PRECISION = (torch.float16, torch.bfloat16)


def is_int(x) -> bool:
    """Whether ``x`` is a Python int (which ``bool`` is not for torch's argument parsing) or a
    symbolic size (``SymInt``)."""
    return (isinstance(x, int) and not isinstance(x, bool)) or type(x) is SymInt


def read_ints(values: tuple) -> tuple:
    """``values`` (an int list argument) with each tensor among them read as eager's argument
    parser reads it, by ``__index__`` (a read of its value the compiled call checks; eager's error
    where it is not one integer): ViLT's ``F.interpolate(..., size=(h, w))`` and
    ``F.pad(x, (0, width - w, 0, height - h))`` of patch counts summed from a pixel mask. An
    integer tensor of one element is read by ``item()``, the same int: a read whose value changes
    between calls is then a symbolic size of the next compile (``value_sizes``), one for all the
    counts, where ``__index__`` must return a plain int (a compile per count)."""
    return tuple(_read_int(v) if isinstance(v, torch.Tensor) else v for v in values)


def _read_int(v):
    if isinstance(v, TensorProxy) and v.dtype in _INT_DTYPES and v.numel() == 1:
        return v.item()
    return operator.index(v)  # (eager's error, or a bool's value)


_INT_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


def is_number(x) -> bool:
    """Whether ``x`` is a Python number an op takes as a scalar: a bool, an int, a float, or one
    read from sizes on each call (``SymInt``, ``SymFloat``)."""
    return isinstance(x, (bool, int, float)) or type(x) in (SymInt, SymFloat)


def require_tensor(op: str, a, arg: str = "input") -> None:
    """Raises TypeError, naming ``op`` and the argument, unless ``a`` is a tensor."""
    check(
        isinstance(a, torch.Tensor),
        op,
        lambda: f"expected a tensor, got {type(a).__name__} (argument {arg})",
        ThunderTypeError,
    )


def require_tensors(op: str, tensors, arg: str = "tensors") -> None:
    """Raises TypeError, naming ``op``, the argument and the position, unless every item of
    ``tensors`` is a tensor."""
    for i, t in enumerate(tensors):
        check(
            isinstance(t, torch.Tensor),
            op,
            lambda: f"expected a tensor at position {i}, got {type(t).__name__} (argument {arg})",
            ThunderTypeError,
        )


def require_float(op: str, a, arg: str = "input") -> None:
    """Raises as eager does where it has a kernel only for floating dtypes: TypeError for a
    non-tensor ``a``, NotImplementedError for an integer or bool one."""
    require_tensor(op, a, arg)
    check(
        a.dtype.is_floating_point,
        op,
        lambda: f"not implemented for {a.dtype} (argument {arg})",
        ThunderNotImplementedError,
    )


def size_value(device, dtype, size):
    """A 0-d tensor of ``dtype`` holding ``size`` (read on each call where it is symbolic),
    converted as aten converts an ``int64_t`` size: the one element of an iota starting at it."""
    value = prims.reshape(prims.iota(1, size, 1, device, torch.int64), ())
    return value if dtype == torch.int64 else prims.convert_element_type(value, dtype)


def broadcast_back(x, shape, dims):
    """Broadcasts ``x``, reduced over ``dims`` of ``shape``, back to ``shape``."""
    return prims.broadcast_in_dim(x, tuple(shape), tuple(d for d in range(len(shape)) if d not in dims))


def sum_all(a):
    """The sum of every element of ``a``, by one prim."""
    return prims.sum(a, tuple(range(a.ndim)))


# -- grad rules ------------------------------------------------------------------------------------
# Grad rules record ltorch calls, which an executor runs whole (``ltorch.to``, ``ltorch.sum``).


def upcast(a):
    """``a`` in the dtype eager kernels compute in, float32 for half-precision floats, by a prim
    (decompositions, and grad rules whose rounding must follow eager's kernel op by op)."""
    return clang.maybe_convert(a, torch.float32) if a.dtype in LOW_PRECISION else a


def in_opmath(g, like):
    """``g`` and the dtype to round the gradient back to (float32 math for half precision)."""
    return (ltorch.to(g, torch.float32), like.dtype) if like.dtype in LOW_PRECISION else (g, None)


def rounded(grad, dtype):
    """``grad`` rounded back to ``dtype`` (``in_opmath``'s), or as it is for None."""
    return grad if dtype is None else ltorch.to(grad, dtype)


def compute_dtype(dtype):
    """The dtype eager kernels compute ``dtype`` values in: float32 for half-precision floats."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def conj_for(out):
    """Eager's grad formulas' ``.conj()`` of a derivative, where the result ``out`` is complex."""
    return prims.conj if out.dtype.is_complex else _unchanged


def _unchanged(t):
    return t


def cast(a, dtype):
    """``a`` in ``dtype``, by a recorded ``ltorch.to`` only when it is not already."""
    return a if a.dtype == dtype else ltorch.to(a, dtype)


def to_compute_dtype(a):
    """``a`` in the dtype eager kernels compute in, float32 for half-precision floats, by a
    recorded ``ltorch.to`` (grad rules and kernels, whose casts an executor runs whole)."""
    return cast(a, compute_dtype(a.dtype))


def sum_to(grad, shape):
    """``grad`` summed over the dims that broadcasting added in front of ``shape`` or expanded
    from size 1, so that it has ``shape``."""
    shape = tuple(shape)
    lead = grad.ndim - len(shape)
    expanded = tuple(lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1)
    if not expanded:
        return ltorch.sum(grad, tuple(range(lead))) if lead else grad
    total = ltorch.sum(grad, (*range(lead), *expanded), keepdim=True)
    return ltorch.reshape(total, shape) if lead else total


def kept(t, shape, dims):
    """``t``, reduced over ``dims`` of ``shape`` without keepdim, with those dims back as size 1
    (the shape keepdim gives), so that it broadcasts against ``shape``."""
    return ltorch.reshape(t, tuple(1 if i in dims else s for i, s in enumerate(shape)))


# -- kernels' meta rules ---------------------------------------------------------------------------
# Each kernel's meta rule describes the outputs its decomposition records, as ``(shape, dtype)``
# or ``(shape, dtype, flows)`` where ``flows`` is False for an output that no input requiring
# grad reaches, so that it can be recorded whole (``recorder.record_kernel``). tests/test_kernels.py
# checks each against its decomposition.


def one_or_tuple(values: list):
    """A symbol's outputs: one tensor alone, several as a tuple."""
    return values[0] if len(values) == 1 else tuple(values)


def like(t):
    """The ``(shape, dtype)`` of ``t``."""
    return tuple(t.shape), t.dtype


def flows(*tensors) -> bool:
    """Whether one of ``tensors`` (numbers and None allowed) requires grad."""
    return any(isinstance(t, torch.Tensor) and requires_grad_of(t) for t in tensors)


def masked_meta(output_mask, *outputs):
    """The outputs that ``output_mask`` asks for."""
    return [o for wanted, o in zip(output_mask, outputs) if wanted]


def slice_indices(s: slice, size):
    """``s.indices(size)`` for a positive step, in comparisons a symbolic size or bound records
    as guards (``slice.indices`` takes ints only)."""
    if all(type(x) is int for x in (s.start, s.stop, size) if x is not None):
        return s.indices(size)

    def clamp(v, default):
        if v is None:
            return default
        if v < 0:
            # ``> 0``: a start that lands on 0 is the clamp's, so that ``keys[:, -w + 1:]`` of
            # ``w - 1`` keys (all of them) is decided as those of fewer are, not as longer ones.
            v = v + size
            return v if v > 0 else 0
        return v if v <= size else size

    return clamp(s.start, 0), clamp(s.stop, size), 1 if s.step is None else s.step


def pieces(size, step) -> list:
    """The lengths of ``size`` cut every ``step`` (at least one piece; the last may be shorter),
    as ``split`` and ``chunk`` cut. With symbolic sizes, the number of pieces is decided on the
    hints and the bounds it relies on, ``(count - 1) * step < size <= count * step``, recorded as
    guards: the lengths stay symbolic (``x.split(T // 2)``: two pieces while T is even)."""
    if type(size) is not SymInt and type(step) is not SymInt:
        count = max(-(-size // step) if step else 1, 1)
        return [min(step, size - i * step) for i in range(count)]
    count = max(-(-hint(size) // hint(step)), 1)
    if not (count - 1) * step < size <= count * step:
        raise AssertionError("the pieces' count was decided on the hints")  # the guards hold for them
    return [step] * (count - 1) + [size - (count - 1) * step]


# -- opaque kernels --------------------------------------------------------------------------------
# Symbols a grad rule records for one aten call of eager's autograd that no decomposition stands
# for (the fused attention kernels, grid_sampler's backward). The torch executor runs each as that
# call; every other executor leaves it to the torch executor, and no pass looks inside.


def record_opaque(sid: int, meta, args: tuple) -> tuple:
    """One call of the kernel ``sid``; ``meta`` describes each output as ``(shape, dtype,
    differentiable, strides)`` (strides None for contiguous ones)."""
    device = str(next(a for a in args if isinstance(a, TensorProxy)).device)
    flows = any(isinstance(a, TensorProxy) and a.requires_grad for a in args)
    described = meta(*args)
    metas = [
        output_meta(shape, dtype, device, flows and differentiable) for shape, dtype, differentiable, _ in described
    ]
    if flows:  # (a view input a gradient flows into: ``TensorProxy._view_grad``)
        note_gradient_through(metas, args)
    outs = proxies(current().call(sid, args, None, metas))
    for out, (*_, strides) in zip(outs, described):
        if strides is not None:
            out._strides = strides  # eager's layout, which views of the output follow
    return tuple(outs)


class OpaqueKernel:
    """``ltorch.<name>``, an opaque kernel with meta rule ``meta``; an effect (a random draw)
    when ``effect``. It stands for no torch callable, so it stays out of the registry that the
    language context and the OpInfo tables read (``ltorch.SYMBOLS``): only grad rules record it,
    and the tests of its family test it."""

    opaque = True
    torch_fns = ()

    def __init__(self, name: str, meta, *, effect: bool = False):
        self.__name__, self.symbol_name, self.meta = name, f"ltorch.{name}", meta
        self.symbol_id = _core.register_symbol(self.symbol_name, fallback=True, effect=effect)

    def __call__(self, *args):
        return record_opaque(self.symbol_id, self.meta, args)

    def __repr__(self):
        return f"<kernel {self.symbol_name}>"


def refuse_sparse_grads(op: str, weight, sparse: bool) -> None:
    """``F.embedding``'s and ``F.embedding_bag``'s ``sparse``: eager's weight gradient would be a
    sparse tensor (for SparseAdam), thunder_rs's are dense; without one (no grad, or a frozen
    weight) ``sparse`` only names the gradient's layout, and the results are eager's."""
    check(
        not (sparse and weight.requires_grad and torch.is_grad_enabled()),
        op,
        lambda: (
            f"sparse gradients are not supported (at {user_location()}): eager's weight gradient would be a "
            "sparse tensor (for SparseAdam), thunder_rs's a dense one; use sparse=False (argument sparse)"
        ),
        ThunderNotImplementedError,
    )
