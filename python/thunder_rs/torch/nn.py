"""Neural-network ops (``torch.nn.functional``) of layers: softmax, dropout, linear and
embedding, with the backward kernels of eager's autograd they differentiate with and their grad
rules. Activations are in ``activations.py``, layer and RMS norm in ``layer_norms.py``, batch norm
in ``batch_norms.py``, the base losses in ``base_losses.py`` (the rest in ``losses.py``, distances
in ``distances.py``) and scaled dot-product attention in ``attention.py``.

Half-precision inputs are computed in float32 and converted back, as eager kernels do. Where
eager has a kernel only for floating dtypes, an integer input raises NotImplementedError as there.
Where eager's autograd runs a fused kernel (softmax, dropout, embedding) the grad rule calls the
same kernel, a symbol here whose body is what it computes; the other rules compute their forward
by calling their own symbol and write the backward with ltorch ops.
"""

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang import replayed_draws
from thunder_rs.core.lang.fallback import refuse_draw_made_again, user_fallback
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import (
    ThunderAssertionError,
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    check,
)
from thunder_rs.torch.common import (
    SCALAR_NAMES,
    refuse_sparse_grads,
    broadcast_back,
    cast,
    compute_dtype,
    is_int,
    require_float,
    sum_to,
    to_compute_dtype,
    upcast,
)
from thunder_rs.torch.factorizations import opaque
from thunder_rs.torch.linalg import column_major, mm_product, row_major
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.core.lang.eager_layouts import eager_strides
from thunder_rs.core.lang.symint import identical, same_shape

T = torch.Tensor


__all__ = [
    "softmax",
    "log_softmax",
    "tensor_softmax",
    "tensor_log_softmax",
    "dropout",
    "linear",
    "embedding",
    "embedding_renorm",
    "native_dropout",
    "native_dropout_backward",
    "softmax_backward",
    "log_softmax_backward",
    "embedding_backward",
]


# -- softmax ---------------------------------------------------------------------------------------


def _softmax(op: str, a, dim, dtype, log: bool):
    """(log-)softmax of ``a`` along ``dim``, shifted by the max so that exp cannot overflow."""
    if dim is None:  # F.softmax's deprecated implicit dim
        dim = 0 if a.ndim in (0, 1, 3) else 1
    dim = clang.canonicalize_dim(a.ndim, dim, op)
    if dtype is not None:
        a = clang.maybe_convert(a, dtype)
    require_float(op, a)
    x = upcast(a)
    dims = (dim,) if x.ndim else ()
    # A zero-size dim has no max; sums over it are empty, so nothing can overflow.
    shifted = x if x.ndim and x.shape[dim] == 0 else prims.sub(x, broadcast_back(prims.amax(x, dims), x.shape, dims))
    exps = prims.exp(shifted)
    total = broadcast_back(prims.sum(exps, dims), x.shape, dims)
    out = prims.sub(shifted, prims.log(total)) if log else prims.div(exps, total)
    return clang.maybe_convert(out, a.dtype)


@torchsymbol(F.softmax)
def softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax("ltorch.softmax", input, dim, dtype, log=False)


@torchsymbol(F.log_softmax)
def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax("ltorch.log_softmax", input, dim, dtype, log=True)


# torch.softmax and Tensor.softmax take dtype as their third positional argument where F.softmax
# takes _stacklevel, so they are symbols of their own.
@torchsymbol(torch.softmax, T.softmax, torch.special.softmax)
def tensor_softmax(input, dim, dtype=None):
    return _softmax("ltorch.softmax", input, dim, dtype, log=False)


@torchsymbol(torch.log_softmax, T.log_softmax, torch.special.log_softmax)
def tensor_log_softmax(input, dim, dtype=None):
    return _softmax("ltorch.log_softmax", input, dim, dtype, log=True)


# -- dropout, linear, embedding --------------------------------------------------------------------


@torchsymbol(F.dropout)
def dropout(input, p=0.5, training=True, inplace=False):
    op = "ltorch.dropout"
    check(0.0 <= p <= 1.0, op, f"dropout probability has to be between 0 and 1, but got {p} (argument p)")
    if not training or p == 0:
        return input
    if p == 1:  # eager multiplies by zero, so NaN and inf stay NaN
        return prims.mul(input, 0)
    check(
        input.dtype.is_floating_point,
        op,
        f"result type Float can't be cast to the desired output type {input.dtype} (argument input)",
        ThunderRuntimeError,
    )
    refuse_draw_made_again("torch.nn.functional.dropout")
    noise = prims.uniform(tuple(input.shape), 0.0, 1.0, input.device, upcast(input).dtype)
    keep = prims.convert_element_type(prims.lt(noise, 1.0 - p), input.dtype)
    # input * (keep / (1 - p)), as eager computes it: dropped NaNs stay NaN.
    return prims.mul(input, prims.mul(keep, 1.0 / (1.0 - p)))


@torchsymbol(F.linear)
def linear(input, weight, bias=None):
    op = "ltorch.linear"
    check(
        input.ndim >= 1,
        op,
        f"both arguments to linear need to be at least 1D, but they are {input.ndim}D and "
        f"{weight.ndim}D (argument input)",
        ThunderRuntimeError,
    )
    check(
        weight.ndim in (1, 2),
        op,
        f"expected a 1-D or 2-D weight, got {weight.ndim}-D (argument weight)",
        ThunderRuntimeError,
    )
    check(
        input.dtype == weight.dtype,
        op,
        f"expected input and weight to have the same dtype, but got {input.dtype} and {weight.dtype} (argument weight)",
        ThunderRuntimeError,
    )
    check(
        input.shape[-1] == weight.shape[-1],
        op,
        f"input {list(input.shape)} and weight {list(weight.shape)}^T cannot be multiplied "
        f"({input.shape[-1]} != {weight.shape[-1]}) (argument weight)",
        ThunderRuntimeError,
    )
    if bias is not None:
        check(weight.ndim == 2, op, "a 1-D weight takes no bias (argument bias)", ThunderRuntimeError)
        check(
            bias.dtype == input.dtype,
            op,
            f"expected bias to have dtype {input.dtype}, but got {bias.dtype} (argument bias)",
            ThunderRuntimeError,
        )
        out_shape = (*input.shape[:-1], weight.shape[0])
        check(
            clang.broadcast_shapes(op, bias.shape, out_shape) == out_shape,
            op,
            f"bias of shape {list(bias.shape)} does not broadcast to the output shape {list(out_shape)} "
            "(argument bias)",
            ThunderRuntimeError,
        )
    return prims.linear(input, weight, bias)


@torchsymbol(F.embedding)
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    op = "ltorch.embedding"
    # max_norm first writes the referenced rows of weight (``forward_writes.embedding``): a symbol does not write.
    check(
        max_norm is None,
        op,
        "max_norm renormalises weight in place, which only F.embedding does (argument max_norm)",
        ThunderNotImplementedError,
    )
    check(
        input.dtype in (torch.int64, torch.int32),
        op,
        f"Expected indices to have one of the following scalar types: Long, Int; but got {input.dtype} "
        "(argument input)",
        ThunderRuntimeError,
    )
    check(weight.ndim == 2, op, f"'weight' must be 2-D, got {weight.ndim}-D (argument weight)", ThunderRuntimeError)
    refuse_sparse_grads(op, weight, sparse)
    if padding_idx is not None:
        # padding_idx only changes the gradient; eager checks its range with assertions.
        check(
            -weight.shape[0] <= padding_idx < weight.shape[0],
            op,
            "Padding_idx must be within num_embeddings (argument padding_idx)",
            ThunderAssertionError,
        )
    return prims.embedding(input, weight)


@torchsymbol(torch.ops.aten.embedding_renorm.default, name="embedding_renorm")
def embedding_renorm(input, indices, max_norm, norm_type):
    """``input`` (an embedding table) with each row ``indices`` references scaled down to norm
    ``max_norm`` where its norm exceeds it, as eager's ``embedding_renorm_`` computes: the row's
    norm in the table's dtype read as a double, the factor ``max_norm / (norm + 1e-7)`` in double,
    the product in the table's compute dtype. A row referenced several times is scaled once: each
    reference computes the same row from the same old one."""
    op = "ltorch.embedding_renorm"
    check(
        input.ndim == 2,
        op,
        f"Expected 2-dimensional tensor, but got {input.ndim}-dimensional tensor for argument #1 'self' "
        "(while checking arguments for embedding_renorm_) (argument input)",
        ThunderRuntimeError,
    )
    check(
        indices.dtype in (torch.int64, torch.int32),
        op,
        f"Expected tensor for argument #2 'indices' to have one of the following scalar types: Long, Int; "
        f"but got {indices.dtype} instead (while checking arguments for embedding_renorm_) (argument indices)",
        ThunderRuntimeError,
    )
    index = ltorch.reshape(indices, (indices.numel(),))
    rows = ltorch.index_select(input, 0, index)
    norms = cast(ltorch.linalg_vector_norm(rows, norm_type, 1, keepdim=True), torch.float64)
    scale = ltorch.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
    scaled = cast(to_compute_dtype(rows) * cast(scale, compute_dtype(input.dtype)), input.dtype)
    return ltorch.index_copy(input, 0, index, scaled)


# -- backward kernels ------------------------------------------------------------------------------


@torchsymbol(name="native_dropout")
def native_dropout(input, p, train):
    """dropout in training mode (0 < p < 1), and its mask: each element kept with probability
    1 - p, as a bool, and scaled by 1 / (1 - p); dropped NaNs stay NaN, as in eager."""
    noise = ltorch.rand_like(input, dtype=compute_dtype(input.dtype))
    keep = noise < 1.0 - p
    return input * keep * (1.0 / (1.0 - p)), keep


def _native_dropout_backward_meta(grad_output, mask, scale):
    return [(clang.broadcast_shapes("native_dropout_backward", grad_output.shape, mask.shape), grad_output.dtype)]


@torchsymbol(
    torch.ops.aten.native_dropout_backward.default, name="native_dropout_backward", meta=_native_dropout_backward_meta
)
def native_dropout_backward(grad_output, mask, scale):
    return grad_output * mask * scale


def _softmax_backward_meta(grad_output, output, dim):
    return [(clang.broadcast_shapes("softmax_backward", grad_output.shape, output.shape), output.dtype)]


@torchsymbol(name="softmax_backward", meta=_softmax_backward_meta)
def softmax_backward(grad_output, output, dim):
    """The gradient of softmax's input from its output's, in the output's dtype."""
    g, y = to_compute_dtype(grad_output), to_compute_dtype(output)
    return cast(y * (g - ltorch.sum(g * y, dim, keepdim=True)), output.dtype)


@register_grad(softmax_backward)
def softmax_backward_grad(grad_output, output, dim):
    """Eager's (``_softmax_backward_data``'s): the cotangent in the output's dtype through
    ``softmax_backward`` for ``grad_output``, and ``softmax_double_backward``'s products and
    sums, in its order, for ``output``."""
    out = softmax_backward(grad_output, output, dim)
    g = cast(get_grad(out), output.dtype)
    if grad_output.requires_grad:
        put_grad(grad_output, softmax_backward(g, output, dim))
    if output.requires_grad:
        go_sum = ltorch.sum(output * grad_output, dim, keepdim=True)
        g_sum = ltorch.sum(output * g, dim, keepdim=True)
        put_grad(output, grad_output * g - go_sum * g - grad_output * g_sum)
    return out


def _softmax_backward_data(grad_output, output, dim, input_dtype):
    """``torch._softmax_backward_data`` called by the program: ``softmax_backward`` with eager's
    checks, its result in ``input_dtype`` where that is half precision of a float32 gradient
    (CUDA's half-to-float softmax; the CPU refuses it)."""
    op = "ltorch._softmax_backward_data"
    check(
        same_shape(grad_output.shape, output.shape),
        op,
        lambda: (
            "Expected tensor for argument #1 'grad' to have same size as tensor for argument #2 'output'; but "
            f"{list(grad_output.shape)} does not equal {list(output.shape)} (while checking arguments for "
            "softmax_backward) (argument output)"
        ),
        ThunderRuntimeError,
    )
    rank = max(grad_output.ndim, 1)
    check(
        -rank <= dim < rank,
        op,
        f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim}) (argument dim)",
        ThunderIndexError,
    )
    half_to_float = grad_output.dtype == torch.float32 and input_dtype == torch.float16
    names = [SCALAR_NAMES.get(d, str(d)) for d in (grad_output.dtype, output.dtype, input_dtype)]
    check(
        not half_to_float or grad_output.device.type != "cpu",
        op,
        f"expected scalar type {names[0]} but found {names[2]} (argument input_dtype)",
        ThunderRuntimeError,
    )
    check(
        grad_output.dtype == output.dtype,
        op,
        f"expected scalar type {names[0]} but found {names[1]} (argument output)",
        ThunderRuntimeError,
    )
    out = softmax_backward(grad_output, output, dim % rank if grad_output.ndim else 0)
    return cast(out, torch.float16) if half_to_float else out


TORCH_TO_LTORCH[torch._softmax_backward_data] = _softmax_backward_data
TORCH_TO_LTORCH[torch.ops.aten._softmax_backward_data] = _softmax_backward_data
TORCH_TO_LTORCH[torch.ops.aten._softmax_backward_data.default] = _softmax_backward_data


@torchsymbol(name="log_softmax_backward", meta=_softmax_backward_meta)
def log_softmax_backward(grad_output, output, dim):
    """The gradient of log_softmax's input from its output's, in the output's dtype."""
    g, y = to_compute_dtype(grad_output), to_compute_dtype(output)
    return cast(g - ltorch.exp(y) * ltorch.sum(g, dim, keepdim=True), output.dtype)


def _embedding_backward_meta(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    return [((num_weights, grad_output.shape[-1]), grad_output.dtype)]


@torchsymbol(name="embedding_backward", meta=_embedding_backward_meta)
def embedding_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The gradient of an embedding table of ``num_weights`` rows; ``padding_idx`` is -1 for
    none (else in range), and its row gets no gradient."""
    features, dtype, device = grad_output.shape[-1], grad_output.dtype, grad_output.device
    index = ltorch.reshape(indices, (indices.numel(),))
    rows = ltorch.reshape(grad_output, (indices.numel(), features))
    if padding_idx >= 0:
        rows = ltorch.where(ltorch.unsqueeze(index == padding_idx, -1), 0.0, rows)
    grad = ltorch.index_add(ltorch.zeros((num_weights, features), dtype=dtype, device=device), 0, index, rows)
    if scale_grad_by_freq:  # each row's gradient is divided by how often it was looked up
        ones = ltorch.ones_like(index, dtype=dtype)
        lookups = ltorch.index_add(ltorch.zeros(num_weights, dtype=dtype, device=device), 0, index, ones)
        grad = grad / ltorch.unsqueeze(ltorch.clamp(lookups, min=1), -1)
    return grad


# -- grad rules ------------------------------------------------------------------------------------


@register_grad(ltorch.dropout)
def dropout_grad(input, p=0.5, training=True, inplace=False):
    if not training or not 0 < p < 1 or not input.dtype.is_floating_point:
        return ltorch.dropout(input, p, training, inplace)
    if replayed_draws.replayable(input):  # (in a checkpoint: drawn again in the backward, as eager)
        refuse_draw_made_again("torch.nn.functional.dropout")
        out, mask = replayed_draws.native_dropout(input, p)
    else:
        out, mask = native_dropout(input, p, True)
    put_grad(input, dropout_input_grad(get_grad(out), mask, p, input))
    return out


def dropout_input_grad(grad, mask, p, input):
    """Eager's gradient of dropout's input. On the CPU eager multiplies by a noise tensor in the
    input's dtype (the mask divided by 1 - p, rounded to that dtype: 1.4297 for p = 0.3 in
    bfloat16) and the gradient is the product with it; CUDA's fused kernel scales by 1 / (1 - p)
    in float (``native_dropout_backward``). They differ in half precision."""
    if input.device.type == "cpu":
        return ltorch.mul(grad, ltorch.true_divide(ltorch.to(mask, input.dtype), 1.0 - p))
    return native_dropout_backward(grad, mask, 1.0 / (1.0 - p))


def _softmax_backward(input, out, dim, log: bool) -> None:
    """Puts the gradient of ``input`` from that of ``out``, its (log-)softmax along ``dim``
    (None: F.softmax's implicit dim). ``out`` may have another dtype (softmax's ``dtype``)."""
    if dim is None:
        dim = 0 if input.ndim in (0, 1, 3) else 1
    backward = log_softmax_backward if log else softmax_backward
    put_grad(input, cast(backward(get_grad(out), out, dim), input.dtype))


@register_grad(ltorch.softmax)
def softmax_grad(input, dim=None, _stacklevel=3, dtype=None):
    out = ltorch.softmax(input, dim, _stacklevel, dtype)
    _softmax_backward(input, out, dim, log=False)
    return out


@register_grad(ltorch.log_softmax)
def log_softmax_grad(input, dim=None, _stacklevel=3, dtype=None):
    out = ltorch.log_softmax(input, dim, _stacklevel, dtype)
    _softmax_backward(input, out, dim, log=True)
    return out


@register_grad(ltorch.tensor_softmax)
def tensor_softmax_grad(input, dim, dtype=None):
    out = ltorch.tensor_softmax(input, dim, dtype)
    _softmax_backward(input, out, dim, log=False)
    return out


@register_grad(ltorch.tensor_log_softmax)
def tensor_log_softmax_grad(input, dim, dtype=None):
    out = ltorch.tensor_log_softmax(input, dim, dtype)
    _softmax_backward(input, out, dim, log=True)
    return out


@register_grad(ltorch.linear)
def linear_grad(input, weight, bias=None):
    out = ltorch.linear(input, weight, bias)
    g = get_grad(out)
    if weight.ndim == 1:  # out = input @ weight, one feature
        column = ltorch.unsqueeze(g, -1)
        if input.requires_grad:
            put_grad(input, column * weight)
        if weight.requires_grad:
            put_grad(weight, sum_to(column * input, weight.shape))
        return out
    # Laid out as eager's, whose linear is a product with ``weight.t()`` (``addmm`` of a matrix):
    # a column-major matrix input gets a column-major gradient, and so does a weight that is not
    # row-major (its transpose is not column-major: mm_mat2_backward's plain product, transposed).
    if input.requires_grad:
        put_grad(input, mm_product(g, weight, input.ndim == 2 and column_major(input)))
    rows = math.prod(input.shape[:-1])
    if weight.requires_grad:
        # One product over the flattened batch: (out, rows) @ (rows, in).
        g2 = ltorch.reshape(g, (rows, weight.shape[0]))
        x2 = ltorch.reshape(input, (rows, weight.shape[1]))
        put_grad(weight, mm_product(ltorch.t(g2), x2, not row_major(weight)))
    if bias is not None and bias.requires_grad:
        # Eager's linear of a contiguous input of 3 or more dims is ``addmm`` of its rows
        # (``_flatten_nd_linear``): the bias's gradient sums the rows of the gradient reshaped, a
        # contiguous copy where it is no view of them (an attention's transposed key gradient), in
        # that order; summing the strided gradient over its batch dims adds in another order. (The
        # gradient's layout is not known here: views are laid out after the backward is built.)
        flattened = input.ndim >= 3 and bias.ndim == 1 and _contiguous(input)
        put_grad(bias, sum_to(ltorch.flatten(g, 0, -2) if flattened else g, bias.shape))
    return out


def _contiguous(p) -> bool:
    """Whether eager's tensor for proxy ``p`` is contiguous, its strides compared as data (a
    symbolic size is not decided on: a stride that is some other expression of it reads as not)."""
    strides = eager_strides(p)
    if strides is None:
        return True
    expected = 1
    for size, stride in zip(reversed(p.shape), reversed(strides)):
        if not identical(size, 1):
            if not identical(stride, expected):
                return False
            expected = expected * size
    return True


@register_grad(ltorch.embedding)
def embedding_grad(
    input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False
):
    out = ltorch.embedding(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
    rows = weight.shape[0]
    padding = -1 if padding_idx is None else padding_idx % rows
    put_grad(weight, embedding_backward(get_grad(out), input, rows, padding, scale_grad_by_freq))
    return out


# -- one_hot ---------------------------------------------------------------------------------------


def _one_hot_meta(tensor, num_classes):
    return SimpleNamespace(shape=(*tensor.shape, num_classes), dtype=torch.int64, requires_grad=False)


#: ``F.one_hot`` with a number of classes: eager's kernel runs it (its checks of the values
#: included), with the number computed on each call where it is a symbolic size.
_one_hot_symbol = opaque("one_hot", F.one_hot, meta=_one_hot_meta, integers_rejected=False)


def _one_hot(tensor, num_classes=-1):
    """``F.one_hot``: ``ltorch.one_hot`` for an int64 tensor and a positive number of classes
    (``F.one_hot(labels, x.shape[1])`` keeps a symbolic size so, where torch's meta kernel would
    specialise it); the eager fallback otherwise (``num_classes=-1`` sizes the result by the
    values; the rest raises eager's error there)."""
    if isinstance(tensor, TensorProxy) and tensor.dtype == torch.int64 and is_int(num_classes) and num_classes > 0:
        return _one_hot_symbol(tensor, num_classes)
    return user_fallback(F.one_hot, (tensor, num_classes), {})


TORCH_TO_LTORCH[F.one_hot] = _one_hot
