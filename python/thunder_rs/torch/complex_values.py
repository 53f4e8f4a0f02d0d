"""Complex values built from real ones and taken apart: ``torch.polar``, ``torch.complex``,
``torch.view_as_complex`` and ``torch.view_as_real``, each one prim (``prims.polar``, ...) that
the torch executor runs as eager's kernel, with torch's gradients (the ``complex`` prim family).

The two views alias their input as eager's do: a write through one reaches the tensor it views
(``views.opaque``), and ``view_as_complex`` takes only what eager can view (a last dim of 2 with
stride 1, the other strides and the storage offset even), with eager's errors.

Rotary embeddings (Meta's Llama) differentiate through a complex ``mul`` between the two views;
the symbols marked ``complex_grads`` here compute complex values with gradients in the trace,
since every prim their decompositions record has a VJP rule that holds for complex values
(``Prim::differentiates_complex``). Other complex calls with gradients run eagerly
(``core.lang.complex_calls``).
"""

import torch

from thunder_rs import clang, prims
from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.lang.langctx import PROPERTY_TO_LTORCH, TORCH_TO_LTORCH
from thunder_rs.core.lang.symint import identical
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.common import require_tensor
from thunder_rs.torch.indexing import is_basic, traced_bounds
from thunder_rs.torch.storage_offsets import eager_offset
from thunder_rs.torch.strides import FALLBACK_LAYOUTS, contiguous_strides, strides_of
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.views import opaque

__all__ = ["polar", "complex", "view_as_complex", "view_as_real"]

#: What a complex tensor's parts may be: eager's ``complex``/``polar`` take half too (complex32,
#: which the trace has no dtype for: eager's op runs those).
_PARTS = (torch.float32, torch.float64)


def _parts(op: str, fn, a, b, names: tuple[str, str]):
    """``prim(a, b)`` broadcast, for two real tensors of one floating dtype, with eager's errors."""
    for x, name in zip((a, b), names):
        check(
            isinstance(x, torch.Tensor),
            op,
            lambda: f"{op.removeprefix('ltorch.')}(): argument '{name}' must be Tensor, not {type(x).__name__}",
            ThunderTypeError,
        )
    if a.dtype == b.dtype == torch.float16:
        return None
    check(
        a.dtype in (*_PARTS, torch.float16) and b.dtype in (*_PARTS, torch.float16),
        op,
        lambda: f"Expected both inputs to be Half, Float or Double tensors but got {_name(a)} and {_name(b)}",
        ThunderNotImplementedError,
    )
    check(
        a.dtype == b.dtype,
        op,
        lambda: f"Expected object of scalar type {_name(a)} but got scalar type {_name(b)} for second argument",
        ThunderRuntimeError,
    )
    shape = clang.broadcast_shapes(op, a.shape, b.shape)
    return fn(clang.expand_to(a, shape), clang.expand_to(b, shape))


def _name(t) -> str:
    """torch's ScalarType name of ``t``'s dtype (``Float``), as its errors print it."""
    return {torch.float16: "Half", torch.float32: "Float", torch.float64: "Double"}.get(
        t.dtype, str(t.dtype).removeprefix("torch.").capitalize()
    )


@torchsymbol(torch.polar)
def polar(abs, angle):
    out = _parts("ltorch.polar", prims.polar, abs, angle, ("abs", "angle"))
    return user_fallback(torch.polar, (abs, angle), {}) if out is None else out


@torchsymbol(torch.complex)
def complex(real, imag):
    out = _parts("ltorch.complex", prims.complex, real, imag, ("real", "imag"))
    return user_fallback(torch.complex, (real, imag), {}) if out is None else out


def _viewable_as_complex(input) -> None:
    """Eager's checks of ``view_as_complex`` on the layout of its tensor for ``input``."""
    op = "ltorch.view_as_complex"
    strides = strides_of(input)
    check(strides[-1] == 1, op, "Tensor must have a last dimension with stride 1", ThunderRuntimeError)
    check(
        all(type(s) is not int or s % 2 == 0 for s in strides[:-1]),
        op,
        "Tensor must have a stride divisible by 2 for all but last dimension",
        ThunderRuntimeError,
    )
    offset = eager_offset(input)
    check(
        type(offset) is not int or offset % 2 == 0,
        op,
        "Tensor must have a storage_offset divisible by 2",
        ThunderRuntimeError,
    )


@torchsymbol(torch.view_as_complex)
def view_as_complex(input):
    op = "ltorch.view_as_complex"
    require_tensor(op, input)
    if input.dtype == torch.float16:
        return user_fallback(torch.view_as_complex, (input,), {})
    check(
        input.dtype in _PARTS,
        op,
        lambda: (
            "view_as_complex is only supported for half, float and double tensors, but got a tensor of "
            f"scalar type: {_name(input)}"
        ),
        ThunderNotImplementedError,
    )
    check(input.ndim > 0, op, "Input tensor must have one or more dimensions", ThunderRuntimeError)
    check(input.shape[-1] == 2, op, "Tensor must have a last dimension of size 2", ThunderRuntimeError)
    _viewable_as_complex(input)
    return prims.view_as_complex(input, False)


@torchsymbol(torch.view_as_real)
def view_as_real(input):
    op = "ltorch.view_as_real"
    require_tensor(op, input)
    check(input.dtype.is_complex, op, "view_as_real is only supported for complex tensors", ThunderTypeError)
    if input.dtype == torch.complex32:
        return user_fallback(torch.view_as_real, (input,), {})
    return prims.view_as_real(input, False)


def _register_views() -> None:
    """The two as views of their input (a write through one is written back through the
    other), computing complex values, gradients included, in the trace."""
    pairs = (
        (torch.view_as_complex, view_as_complex, view_as_real),
        (torch.view_as_real, view_as_real, view_as_complex),
    )
    for fn, take, put in pairs:
        view_op = opaque(take, lambda a, new, put=put: put(new), FALLBACK_LAYOUTS[fn], eager=fn)
        view_op.takes_complex = True
        TORCH_TO_LTORCH[fn] = view_op


#: Holomorphic elementwise math (``COMPLEX_GRADS``): the unary prims' VJP rules and ``div``'s hold
#: for complex values conjugated, as eager's formulas (``grad * result.conj()``, ...) compute them.
_HOLOMORPHIC = tuple(
    f
    for name in (
        *("exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "reciprocal", "square"),
        *("sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh"),
        *("arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "sigmoid", "div", "divide", "true_divide"),
        *("__truediv__", "__rtruediv__", "__rdiv__", "__div__", "abs", "absolute", "__abs__"),
    )
    for f in (getattr(torch, name, None), getattr(torch.Tensor, name, None))
    if f is not None
)
_HOLOMORPHIC += (torch.special.expit, torch.special.exp2, torch.special.expm1, torch.special.log1p)
_HOLOMORPHIC += (torch.nn.functional.tanhshrink, torch.nn.functional.sigmoid, torch.nn.functional.tanh)


#: Ops that move, select, repeat, scale by real numbers or multiply complex values, whose
#: decompositions record only prims that differentiate them and whose grad rules move or scale the
#: cotangent (``put_grad(..., complex_values=True)``): values and gradients eager's bit for bit on
#: the OpInfo samples (benchmarks/results/op_fidelity_stop64.md). Left eager's: ``trapz`` (its
#: complex sums a few ulps apart), ``addcmul``/``addcdiv``/``lerp``/``sinc`` (gradients ulps apart),
#: ``var``/``std``/``pow``/``cumsum`` (prims without complex rules); ``select_scatter`` and
#: ``slice_scatter`` (eager's autograd refuses their complex outputs).
_MOVED_OR_SCALED = tuple(
    f
    for name in (
        *("mean", "masked_fill", "diff", "outer", "ger", "kron", "repeat_interleave", "fill"),
        *("diag_embed", "diagflat", "diagonal_scatter", "cartesian_prod"),
        *("to", "double", "float", "half", "bfloat16", "mm", "addmm"),
        *("var", "std", "var_mean", "std_mean", "bmm", "baddbmm", "mv", "dot", "cumsum", "addcmul", "lerp"),
    )
    for f in (getattr(torch, name, None), getattr(torch.Tensor, name, None))
    if f is not None
)


#: The ops whose complex values carry gradients in the trace (their decompositions record only
#: prims whose VJP rules hold for complex values); other complex calls with gradients run eagerly.
COMPLEX_GRADS = (
    torch.mul,
    torch.Tensor.mul,
    torch.Tensor.__mul__,
    torch.Tensor.__rmul__,
    torch.multiply,
    torch.add,
    torch.Tensor.add,
    torch.Tensor.__add__,
    torch.Tensor.__radd__,
    torch.sub,
    torch.Tensor.sub,
    torch.Tensor.__sub__,
    torch.neg,
    torch.Tensor.neg,
    torch.Tensor.__neg__,
    torch.reshape,
    torch.Tensor.reshape,
    torch.Tensor.view,
    torch.flatten,
    torch.Tensor.flatten,
    torch.unsqueeze,
    torch.Tensor.unsqueeze,
    torch.squeeze,
    torch.Tensor.squeeze,
    torch.permute,
    torch.Tensor.permute,
    torch.transpose,
    torch.Tensor.transpose,
    torch.Tensor.expand,
    torch.Tensor.contiguous,
    # (ops that move, copy, select, zero or sum elements, with their grad rules' complex gradients:
    # ``put_grad(..., complex_values=True)``)
    *(torch.broadcast_to, torch.Tensor.broadcast_to, torch.broadcast_tensors, torch.Tensor.expand_as),
    *(torch.chunk, torch.Tensor.chunk, torch.unsafe_chunk, torch.split, torch.Tensor.split, torch.unsafe_split),
    *(torch.split_with_sizes, torch.Tensor.split_with_sizes, torch.split_with_sizes_copy),
    *(torch.tensor_split, torch.Tensor.tensor_split, torch.hsplit, torch.vsplit, torch.dsplit),
    *(torch.unbind, torch.Tensor.unbind, torch.unbind_copy, torch.select, torch.Tensor.select),
    *(torch.narrow, torch.Tensor.narrow, torch.narrow_copy, torch.clone, torch.Tensor.clone, torch.positive),
    *(torch.cat, torch.concat, torch.concatenate, torch.stack, torch.hstack, torch.vstack, torch.dstack),
    *(torch.column_stack, torch.flip, torch.Tensor.flip, torch.fliplr, torch.flipud, torch.roll, torch.Tensor.roll),
    *(torch.rot90, torch.movedim, torch.Tensor.movedim, torch.moveaxis, torch.swapaxes, torch.swapdims),
    *(torch.t, torch.Tensor.t, torch.t_copy, torch.transpose_copy, torch.permute_copy, torch.view_copy),
    *(torch.expand_copy, torch.squeeze_copy, torch.unsqueeze_copy, torch.alias_copy, torch.ravel, torch.Tensor.ravel),
    *(torch.Tensor.reshape_as, torch.Tensor.view_as, torch.unflatten, torch.Tensor.unflatten),
    *(torch.atleast_1d, torch.atleast_2d, torch.atleast_3d, torch.Tensor.repeat, torch.tile, torch.Tensor.tile),
    *(torch.tril, torch.Tensor.tril, torch.triu, torch.Tensor.triu, torch.diagonal, torch.Tensor.diagonal),
    *(torch.diagonal_copy, torch.linalg.diagonal, torch.diag, torch.Tensor.diag, torch.trace, torch.Tensor.trace),
    *(torch.block_diag, torch.where, torch.Tensor.where),
    *(torch.pixel_shuffle, torch.pixel_unshuffle, torch.channel_shuffle),
    *(torch.meshgrid, torch.sum, torch.Tensor.sum, torch.Tensor.sum_to_size, torch.rsub, torch.constant_pad_nd),
    # (holomorphic elementwise math: the unary prims' and ``div``'s rules conjugated, eager's formulas)
    *_HOLOMORPHIC,
    *_MOVED_OR_SCALED,
)


def _basic_key(args, kwargs) -> bool:
    """Whether ``t[key]`` is basic indexing (ints, slices with bounds that are not traced tensors,
    None, ...): a view by shape prims. Indexing by tensors or lists gathers, which the trace does
    not differentiate for complex values."""
    key = args[1] if len(args) > 1 else None
    return all(is_basic(k) and not traced_bounds(k) for k in (key if type(key) is tuple else (key,)))


def _mark_complex_grads() -> None:
    for fn in COMPLEX_GRADS:
        symbol = TORCH_TO_LTORCH.get(fn)
        if symbol is not None:
            symbol.complex_grads = True
    TORCH_TO_LTORCH[torch.Tensor.__getitem__].complex_grads = _basic_key
    TORCH_TO_LTORCH[torch.nn.functional.pad].complex_grads = _constant_mode
    TORCH_TO_LTORCH[torch.prod].complex_grads = _contiguous_in_own_dtype
    TORCH_TO_LTORCH[torch.cumulative_trapezoid].complex_grads = _evenly_spaced
    # (eager's ``pow_backward``, ``pow_backward_self`` and ``pow_backward_exponent`` conjugated)
    for fn in (torch.pow, torch.Tensor.pow, torch.Tensor.__pow__):
        TORCH_TO_LTORCH[fn].complex_grads = True
    # (without ``dtype=``; with it the symbol refuses complex values, and eager's op runs)
    # (matrix norms but the Frobenius norm refuse complex values in their symbols: eager's op)
    for fn in (torch.linalg.vector_norm, torch.linalg.matrix_norm, torch.linalg.norm, torch.norm, torch.Tensor.norm):
        TORCH_TO_LTORCH[fn].complex_grads = True
    for prop in ("T", "mT"):
        PROPERTY_TO_LTORCH[prop].complex_grads = True


def _contiguous_in_own_dtype(args, kwargs) -> bool:
    """Whether ``prod`` reduces a contiguous input in its own dtype, its grad rule's case. With a
    zero, eager's gradient is a new contiguous tensor, without one laid out as the input, which a
    rule cannot select by data for another layout; there, and for ``dtype=``, eager's op runs."""
    x = args[0] if args else kwargs.get("input")
    if kwargs.get("dtype") is not None or not isinstance(x, torch.Tensor):
        return False
    # (a size-1 dim's stride too: the gradient's strides keep it, which autograd passes on)
    return all(map(identical, strides_of(x), contiguous_strides(x.shape)))


def _evenly_spaced(args, kwargs) -> bool:
    """Whether ``cumulative_trapezoid`` has no ``x`` (a number spacing): its sums are cumsum's,
    traced; with sample points the complex quotient rounds otherwise (an ulp), eager's op."""
    return (len(args) < 2 or args[1] is None) and kwargs.get("x") is None


def _constant_mode(args, kwargs) -> bool:
    """Whether ``F.pad`` pads with a constant (the ``pad`` symbol); its other modes run eager's op."""
    mode = args[2] if len(args) > 2 else kwargs.get("mode", "constant")
    return mode == "constant"


_register_views()
_mark_complex_grads()
