"""Linear algebra ops: matmul and its fixed-rank forms (mm, bmm, mv, dot), inner, outer, addmm, baddbmm,
and the weight-gradient product view folding makes (flattened_product).

Products do not promote: torch requires both operands to have one dtype and raises RuntimeError
otherwise, as it does for shape mismatches. The checks here run before ``prims.matmul`` so that
errors have eager's types; the prim's own meta errors are the backstop. The grad rule of
matmul makes the calls eager's composite matmul makes, on the same views of its operands.
The factorizations and solvers are ``factorizations``' opaque symbols.
"""

import math

import torch

from thunder_rs import clang, prims
from thunder_rs.core.base.proxies import requires_grad_of
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.eager_layouts import eager_strides
from thunder_rs.errors import (
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
)
from thunder_rs.torch.common import conj_for, require_tensor, sum_to
from thunder_rs.torch.strides import strides_of
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.core.lang.symint import identical, same_shape

T = torch.Tensor
__all__ = ["matmul", "rmatmul", "mm", "bmm", "mv", "dot", "inner", "outer", "addmm", "baddbmm", "flattened_product"]


def _check_operands(op: str, a, b, names: tuple[str, str], ranks=None) -> None:
    """Both are tensors of one dtype and device (not bool), of the ``ranks`` given."""
    for x, name in zip((a, b), names):
        require_tensor(op, x, name)
    if ranks is not None:
        for x, name, rank in zip((a, b), names, ranks):
            check(
                x.ndim == rank,
                op,
                f"expected a {rank}-D tensor, got a {x.ndim}-D tensor (argument {name})",
                ThunderRuntimeError,
            )
    check(
        a.dtype == b.dtype,
        op,
        lambda: (
            f"expected {names[0]} and {names[1]} to have the same dtype, but got {a.dtype} and {b.dtype} "
            f"(argument {names[1]})"
        ),
        ThunderRuntimeError,
    )
    check(
        a.device == b.device,
        op,
        lambda: (
            f"expected all tensors to be on the same device, but got {a.device} and {b.device} (argument {names[1]})"
        ),
        ThunderRuntimeError,
    )
    check(a.dtype != torch.bool, op, "not implemented for 'Bool' (argument input)", ThunderNotImplementedError)


def _check_inner(op: str, a, b, names: tuple[str, str]) -> None:
    """The contracted dims agree: ``a``'s last with ``b``'s first (1-D) or second-to-last."""
    k_a = a.shape[-1]
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    check(
        k_a == k_b,
        op,
        lambda: (
            f"{names[0]} {list(a.shape)} and {names[1]} {list(b.shape)} cannot be multiplied ({k_a} != {k_b}) "
            f"(argument {names[1]})"
        ),
        ThunderRuntimeError,
    )


def _check_matmul(input, other) -> None:
    op = "ltorch.matmul"
    names = ("input", "other")
    _check_operands(op, input, other, names)
    check(
        input.ndim >= 1 and other.ndim >= 1,
        op,
        f"both arguments to matmul need to be at least 1D, but they are {input.ndim}D and {other.ndim}D",
        ThunderRuntimeError,
    )
    _check_inner(op, input, other, names)
    clang.broadcast_shapes(op, input.shape[:-2], other.shape[:-2])


def check_lengths(op: str, input, other, name: str) -> None:
    """Raises eager's error unless the vectors ``input`` and ``other`` (argument ``name``) have one length."""
    check(
        input.shape[0] == other.shape[0],
        op,
        lambda: f"inconsistent tensor size: {input.shape[0]} and {other.shape[0]} elements (argument {name})",
        ThunderRuntimeError,
    )


@torchsymbol(torch.matmul, T.matmul, T.__matmul__, torch.linalg.matmul)
def matmul(input, other):
    _check_matmul(input, other)
    return prims.matmul(input, other)


def _matmul_as_eager(input, other):
    """``torch.matmul``: eager's calls where they depend on which operand requires grad (the
    tensors' flag, in grad mode or not), which the torch executor's ``torch.matmul`` cannot see
    (its tensors do not require grad): a batch against a vector or a matrix that requires grad
    eager folds into one ``mm``/``mv`` (``_should_fold``) even where the batch copies to fold, and of
    3-D operands with different batches it squeezes a batch of one that requires grad (then folds
    the other's). The others are one ``ltorch.matmul``."""
    _check_matmul(input, other)
    if _should_fold(input, other) and not _should_fold(input, other, small_requires_grad=False):
        transpose = other.ndim > input.ndim  # eager's folds ``other.mT`` by ``input.t()``
        t1 = other.mT if transpose else input
        t2 = (input.t() if input.ndim == 2 else input) if transpose else other
        out = matmul(t1.reshape((math.prod(t1.shape[:-1]), t1.shape[-1])), t2)
        out = out.reshape((*t1.shape[:-1], *t2.shape[1:]))
        return out.mT.contiguous() if transpose and t2.ndim == 2 else out
    if input.ndim == 3 and other.ndim == 3 and input.shape[0] != other.shape[0]:
        if input.shape[0] == 1 and input.requires_grad:
            return _matmul_as_eager(input.squeeze(0), other)
        if other.shape[0] == 1 and other.requires_grad:
            return _matmul_as_eager(input, other.squeeze(0))
    return matmul(input, other)


for _fn in matmul.torch_fns:
    TORCH_TO_LTORCH[_fn] = _matmul_as_eager


@torchsymbol(T.__rmatmul__)
def rmatmul(input, other):
    return matmul(other, input)


@torchsymbol(torch.mm, T.mm)
def mm(input, mat2):
    op = "ltorch.mm"
    _check_operands(op, input, mat2, ("input", "mat2"), ranks=(2, 2))
    _check_inner(op, input, mat2, ("input", "mat2"))
    return prims.matmul(input, mat2)


@torchsymbol(torch.bmm, T.bmm)
def bmm(input, mat2):
    op = "ltorch.bmm"
    _check_operands(op, input, mat2, ("input", "mat2"), ranks=(3, 3))
    check(
        input.shape[0] == mat2.shape[0],
        op,
        f"batch sizes differ: {input.shape[0]} and {mat2.shape[0]} (argument mat2)",
        ThunderRuntimeError,
    )
    _check_inner(op, input, mat2, ("input", "mat2"))
    return prims.matmul(input, mat2)


@torchsymbol(torch.mv, T.mv)
def mv(input, vec):
    op = "ltorch.mv"
    _check_operands(op, input, vec, ("input", "vec"), ranks=(2, 1))
    _check_inner(op, input, vec, ("input", "vec"))
    return prims.matmul(input, vec)


@torchsymbol(torch.dot, T.dot)
def dot(input, tensor):
    op = "ltorch.dot"
    _check_operands(op, input, tensor, ("input", "tensor"), ranks=(1, 1))
    check_lengths(op, input, tensor, "tensor")
    return prims.matmul(input, tensor)


@torchsymbol(torch.inner, T.inner)
def inner(input, other):
    op = "ltorch.inner"
    if isinstance(input, torch.Tensor) and isinstance(other, torch.Tensor) and (input.ndim == 0 or other.ndim == 0):
        return clang.elementwise(prims.mul, op, input, other)
    _check_operands(op, input, other, ("input", "other"))
    k = input.shape[-1]
    check(
        k == other.shape[-1],
        op,
        f"the last dimension must match on both input tensors but got shapes {list(input.shape)} and "
        f"{list(other.shape)} (argument other)",
        ThunderRuntimeError,
    )
    # eager's inner is tensordot of the last dims
    return ltorch.tensordot(input, other, ([input.ndim - 1], [other.ndim - 1]))


@torchsymbol(torch.outer, T.outer, torch.ger, T.ger)
def outer(input, vec2):
    op = "ltorch.outer"
    for x, name in ((input, "input"), (vec2, "vec2")):
        require_tensor(op, x, name)
        check(
            x.ndim == 1,
            op,
            f"expected a 1-D tensor, but got a {x.ndim}-D tensor (argument {name})",
            ThunderRuntimeError,
        )
    column = prims.reshape(input, (input.shape[0], 1))
    row = prims.reshape(vec2, (1, vec2.shape[0]))
    return clang.elementwise(prims.mul, op, column, row)


def ignoring(product, input):
    """``product``, where ``beta == 0`` ignores ``input``'s values (NaN included) but eager still
    gives it a gradient, the cotangent times 0: a selection of ``product`` over ``input``, whose
    gradient for ``input`` is zeros (without it, ``input.grad`` stayed None)."""
    if not (torch.is_grad_enabled() and input.requires_grad):
        return product
    keep = prims.broadcast_in_dim(prims.full((), True, product.device, torch.bool), tuple(product.shape), ())
    return prims.where(keep, product, clang.expand_to(clang.maybe_convert(input, product.dtype), product.shape))


def _add_scaled(op: str, product, input, beta, alpha):
    """``beta * input + alpha * product``; ``beta == 0`` ignores ``input`` (NaN included), as torch does."""
    check(
        input.dtype == product.dtype,
        op,
        f"expected input to have dtype {product.dtype}, but got {input.dtype} (argument input)",
        ThunderRuntimeError,
    )
    broadcast = clang.broadcast_shapes(op, input.shape, product.shape)
    check(
        same_shape(broadcast, product.shape),
        op,
        f"input of shape {list(input.shape)} does not broadcast to the product's shape {list(product.shape)} "
        "(argument input)",
        ThunderRuntimeError,
    )
    if alpha != 1:
        product = prims.mul(product, clang.maybe_convert(alpha, product.dtype))
    if beta == 0:
        return ignoring(product, input)
    scaled = input if beta == 1 else prims.mul(input, clang.maybe_convert(beta, input.dtype))
    return prims.add(clang.expand_to(scaled, product.shape), product)


@torchsymbol(torch.addmm, T.addmm)
def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    op = "ltorch.addmm"
    check(isinstance(input, torch.Tensor), op, "expected a tensor (argument input)", ThunderTypeError)
    _check_operands(op, mat1, mat2, ("mat1", "mat2"), ranks=(2, 2))
    _check_inner(op, mat1, mat2, ("mat1", "mat2"))
    return _add_scaled(op, prims.matmul(mat1, mat2), input, beta, alpha)


@torchsymbol(torch.baddbmm, T.baddbmm)
def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    op = "ltorch.baddbmm"
    check(isinstance(input, torch.Tensor), op, "expected a tensor (argument input)", ThunderTypeError)
    _check_operands(op, batch1, batch2, ("batch1", "batch2"), ranks=(3, 3))
    check(
        batch1.shape[0] == batch2.shape[0],
        op,
        f"batch sizes differ: {batch1.shape[0]} and {batch2.shape[0]} (argument batch2)",
        ThunderRuntimeError,
    )
    _check_inner(op, batch1, batch2, ("batch1", "batch2"))
    return _add_scaled(op, prims.matmul(batch1, batch2), input, beta, alpha)


def _flattened_mm(g, x):
    return torch.mm(g.flatten(0, -2).t(), x.flatten(0, -2))


@torchsymbol(_flattened_mm, name="flattened_product")
def flattened_product(g, x):
    """``g`` and ``x`` contracted over their leading dims (which are equal):
    ``g.flatten(0, -2).t() @ x.flatten(0, -2)``, a linear layer's weight gradient over a batch.
    Not a torch op: the view-folding pass makes it of the four calls this decomposition makes,
    and the torch executor runs it as one."""
    rows = math.prod(g.shape[:-1])
    flat_g = prims.transpose(prims.reshape(g, (rows, g.shape[-1])), (1, 0))
    return prims.matmul(flat_g, prims.reshape(x, (rows, x.shape[-1])))


# -- grad rule of matmul ---------------------------------------------------------------------------


def column_major(m) -> bool:
    """Whether eager's matrix ``m`` has strides ``(1, rows)``, where ATen's mm lays out its gradient
    column-major too (``mm_mat1_backward``, ``mm_mat2_backward``): that differs from a row-major
    one only by the stride of a dim of size 1 (``rel_k.t()`` of shape [k, 1]), which
    ``AccumulateGrad`` keeps as it comes."""
    strides = eager_strides(m)
    # (as data: a symbolic stride compared with a value would specialise the size it is)
    return strides is not None and identical(strides[0], 1) and identical(strides[1], m.shape[0])


def row_major(m) -> bool:
    """Whether eager's matrix ``m`` has strides ``(cols, 1)``: its transpose is column-major."""
    strides = eager_strides(m)
    return strides is None or (identical(strides[1], 1) and identical(strides[0], m.shape[1]))


def mm_product(x, y, by_columns: bool):
    """``x @ y``, computed as ``(y.t() @ x.t()).t()`` where eager's result is column-major."""
    return ltorch.t(ltorch.matmul(ltorch.t(y), ltorch.t(x))) if by_columns else ltorch.matmul(x, y)


def mm_first_grad(g, mat1, mat2):
    """Eager's ``mm_mat1_backward``: ``g @ mat2.t()``, column-major where ``mat1`` is."""
    return mm_product(g, ltorch.t(mat2), column_major(mat1))


def mm_second_grad(g, mat1, mat2):
    """Eager's ``mm_mat2_backward``: ``mat1.t() @ g``, column-major where ``mat2`` is."""
    return mm_product(ltorch.t(mat1), g, column_major(mat2))


def _scaled(t, factor):
    """Eager's ``maybe_multiply``: ``t`` itself for a factor of 1."""
    return t if factor == 1 else ltorch.mul(t, factor)


@register_grad(ltorch.mm)
def mm_grad(input, mat2):
    """Eager's ``mm_mat1_backward``/``mm_mat2_backward``; of complex values ``g @ mat2.t().conj()``
    and ``input.t().conj() @ g`` (conjugate Wirtinger)."""
    out = ltorch.mm(input, mat2)
    g = get_grad(out)
    complex_values = input.dtype.is_complex
    if input.requires_grad:
        other = prims.conj(mat2) if complex_values else mat2
        put_grad(input, mm_first_grad(g, input, other), complex_values=complex_values)
    if mat2.requires_grad:
        first = prims.conj(input) if complex_values else input
        put_grad(mat2, mm_second_grad(g, first, mat2), complex_values=complex_values)
    return out


@register_grad(ltorch.addmm)
def addmm_grad(input, mat1, mat2, *, beta=1, alpha=1):
    """Eager's: the cotangent times ``beta`` for ``input`` (summed to its shape), and the product's
    gradients (laid out as ``mm``'s) times ``alpha``."""
    out = ltorch.addmm(input, mat1, mat2, beta=beta, alpha=alpha)
    g = get_grad(out)
    complex_values = mat1.dtype.is_complex  # (real ``alpha``/``beta``: a complex number is eager's call)
    if requires_grad_of(input):
        put_grad(input, sum_to(_scaled(g, beta), input.shape), complex_values=complex_values)
    if requires_grad_of(mat1):
        other = prims.conj(mat2) if complex_values else mat2
        put_grad(mat1, _scaled(mm_first_grad(g, mat1, other), alpha), complex_values=complex_values)
    if requires_grad_of(mat2):
        first = prims.conj(mat1) if complex_values else mat1
        put_grad(mat2, _scaled(mm_second_grad(g, first, mat2), alpha), complex_values=complex_values)
    return out


@register_grad(ltorch.baddbmm)
def baddbmm_grad(input, batch1, batch2, *, beta=1, alpha=1):
    """Eager's: the cotangent times ``beta`` for ``input`` (summed to its shape), and each batched
    product's gradient times ``alpha`` after the product (the decomposition's VJP scaled the
    cotangent first: Bloom's attention scores in bfloat16 were an ulp apart)."""
    out = ltorch.baddbmm(input, batch1, batch2, beta=beta, alpha=alpha)
    g = get_grad(out)
    complex_values = batch1.dtype.is_complex  # (real ``alpha``/``beta``: a complex number is eager's call)
    if input.requires_grad:
        put_grad(input, sum_to(_scaled(g, beta), input.shape), complex_values=complex_values)
    if batch1.requires_grad:
        put_grad(batch1, _scaled(_bmm_first_grad(g, batch2), alpha), complex_values=complex_values)
    if batch2.requires_grad:
        put_grad(batch2, _scaled(_bmm_second_grad(g, batch1), alpha), complex_values=complex_values)
    return out


def _bmm_first_grad(g, batch2):
    """Eager's ``grad.bmm(mat2.transpose(1, 2).conj())``."""
    return ltorch.bmm(g, ltorch.transpose(conj_for(batch2)(batch2), 1, 2))


def _bmm_second_grad(g, batch1):
    """Eager's ``self.transpose(1, 2).conj().bmm(grad)``."""
    return ltorch.bmm(ltorch.transpose(conj_for(batch1)(batch1), 1, 2), g)


@register_grad(ltorch.bmm)
def bmm_grad(input, mat2):
    """Eager's, for complex values (conjugate Wirtinger: each operand's gradient of the other
    conjugated); real ones differentiate the decomposition."""
    out = ltorch.bmm(input, mat2)
    if not input.dtype.is_complex:
        return out  # the decomposition's VJP
    return _conjugated_pair(out, input, mat2, lambda g: _bmm_first_grad(g, mat2), lambda g: _bmm_second_grad(g, input))


@register_grad(ltorch.mv)
def mv_grad(input, vec):
    """Eager's, for complex values: ``grad.ger(vec.conj())`` and ``self.conj().t().mv(grad)``."""
    out = ltorch.mv(input, vec)
    if not input.dtype.is_complex:
        return out  # the decomposition's VJP
    return _conjugated_pair(
        out, input, vec, lambda g: ltorch.outer(g, prims.conj(vec)), lambda g: ltorch.mv(ltorch.t(prims.conj(input)), g)
    )


@register_grad(ltorch.dot)
def dot_grad(input, tensor):
    """Eager's, for complex values: ``grad * tensor.conj()`` and ``grad * self.conj()``."""
    out = ltorch.dot(input, tensor)
    if not input.dtype.is_complex:
        return out  # the decomposition's VJP
    return _conjugated_pair(
        out, input, tensor, lambda g: ltorch.mul(g, prims.conj(tensor)), lambda g: ltorch.mul(g, prims.conj(input))
    )


def _conjugated_pair(out, first, second, first_grad, second_grad):
    """``out`` of a product of ``first`` and ``second``, each given ``*_grad(g)`` of the output's
    gradient ``g`` where it requires grad (eager's complex formulas: ``bmm``, ``mv``, ``dot``)."""
    g = get_grad(out)
    if first.requires_grad:
        put_grad(first, first_grad(g), complex_values=True)
    if second.requires_grad:
        put_grad(second, second_grad(g), complex_values=True)
    return out


# matmul's rule makes the calls eager's matmul makes. ATen's ``_matmul_impl`` is a composite: by
# the operands' ranks ``dot``, ``mv`` or ``mm``; a batch against a vector or a matrix folded into one
# ``mm``/``mv`` (``should_fold``), a matrix on the left transposed to the right; the others
# expanded to one batch, reshaped to 3-D (a copy where the batch does not fold) and multiplied by
# ``bmm``. Autograd differentiates those calls: ``mm``'s backward as ``mm_first_grad`` does,
# ``bmm``'s with the transposed view of the reshaped operand, and each view's backward reshapes or
# sums the gradient back. The rule takes the same views of the saved operands (tensor methods, so
# that the trace tracks their strides, and each reshape is a view or a copy as eager's) and makes
# the same products: one with the other operand transposed (the GEMM's other transposition flag),
# or ``bmm`` where eager's is ``mv``, rounds differently (``q @ k.transpose(-1, -2)`` of heads split
# from a linear's output, in float16, at 3 inputs in 4; T5's and UMT5's training steps).


def _should_fold(input, other, small_requires_grad: bool | None = None) -> bool:
    """ATen's ``should_fold``: whether a batch against a vector or a matrix is one ``mm``/``mv``
    (the batch folded into rows). Always where the smaller operand requires grad (its gradient is
    then one product, no sum over the batch), else where the batch folds without a copy."""
    big, small = (input, other) if input.ndim >= other.ndim else (other, input)
    if not (big.ndim >= 3 and small.ndim <= 2):
        return False
    if small.requires_grad if small_requires_grad is None else small_requires_grad:
        return True
    if input.ndim == 2:
        return False
    shape, strides = list(big.shape), list(strides_of(big))
    if big is other:  # the larger one is ``other.mT``
        shape[-2:], strides[-2:] = shape[:-3:-1], strides[:-3:-1]
    for i in range(big.ndim - 2):
        expected = strides[i + 1] * shape[i + 1]
        if not identical(strides[i], expected) and strides[i] != expected:
            return math.prod(shape) == 0  # (eager's first check: no guard where the strides fold)
    return True


def _mm_grads(g, mat1, mat2, wanted: tuple[bool, bool]):
    """``mm``'s backward (``mm_mat1_backward``, ``mm_mat2_backward``) for the operands ``wanted``."""
    first = mm_first_grad(g, mat1, mat2) if wanted[0] else None
    second = mm_second_grad(g, mat1, mat2) if wanted[1] else None
    return first, second


def _mv_grads(g, mat, vec, wanted: tuple[bool, bool]):
    """``mv``'s backward: ``grad.ger(vec)`` and ``mat.t().mv(grad)``."""
    first = ltorch.outer(g, vec) if wanted[0] else None
    second = ltorch.mv(mat.t(), g) if wanted[1] else None
    return first, second


def _folded_grads(g, input, other, wanted: tuple[bool, bool]):
    """The folded product's: ``input`` a batch (rows folded) against a vector or a matrix, or
    (transposed) a vector or a matrix against the batch ``other``, which eager folds as
    ``other.mT`` and multiplies by ``input.t()``, then transposes the result contiguous."""
    transpose = other.ndim > input.ndim
    t1 = other.mT if transpose else input
    t2 = (input.t() if input.ndim == 2 else input) if transpose else other
    wanted_t1, wanted_t2 = (wanted[1], wanted[0]) if transpose else wanted
    rows = math.prod(t1.shape[:-1])
    t1_folded = t1.reshape((rows, t1.shape[-1]))
    if t2.ndim == 2:
        g_rows = (g.mT if transpose else g).reshape((rows, t2.shape[1]))
        grad_t1, grad_t2 = _mm_grads(g_rows, t1_folded, t2, (wanted_t1, wanted_t2))
    else:
        grad_t1, grad_t2 = _mv_grads(g.reshape((rows,)), t1_folded, t2, (wanted_t1, wanted_t2))
    if grad_t1 is not None:
        grad_t1 = grad_t1.reshape(t1.shape)
        grad_t1 = grad_t1.mT if transpose else grad_t1
    if transpose and grad_t2 is not None and input.ndim == 2:
        grad_t2 = grad_t2.t()
    return (grad_t2, grad_t1) if transpose else (grad_t1, grad_t2)


def _batched_grads(g, input, other, wanted: tuple[bool, bool]):
    """The batched product's: both operands expanded to the broadcast batch and reshaped to one
    batch dim (``tensor1_expanded``, ``tensor2_expanded``; a vector ``other`` as a column), then
    ``bmm``'s backward, the reshapes' and the expands' (a sum over the broadcast dims)."""
    k = input.shape[-1]
    n = input.shape[-2] if input.ndim > 1 else 1
    p = other.shape[-1] if other.ndim > 1 else 1
    batch = tuple(clang.broadcast_shapes("ltorch.matmul", input.shape[:-2], other.shape[:-2]))
    count = math.prod(batch)
    input_expanded = input.expand((*batch, n, k)).reshape((count, n, k))
    if other.ndim == 1:
        other_expanded = other.expand((*batch, k)).reshape((count, k)).unsqueeze(2)
    else:
        other_expanded = other.expand((*batch, k, p)).reshape((count, k, p))
    g3 = g.reshape((count, n) if other.ndim == 1 else (count, n, p))
    g3 = g3.unsqueeze(-1) if other.ndim == 1 else g3
    grads = [None, None]
    if wanted[0]:
        grad = ltorch.bmm(g3, other_expanded.transpose(1, 2))
        grads[0] = sum_to(grad.reshape((*batch, n, k)), input.shape)
    if wanted[1]:
        grad = ltorch.bmm(input_expanded.transpose(1, 2), g3)
        if other.ndim == 1:
            grad = grad.squeeze(2).reshape((*batch, k))
        else:
            grad = grad.reshape((*batch, k, p))
        grads[1] = sum_to(grad, other.shape)
    return tuple(grads)


def eager_matmul_grads(g, input, other, wanted: tuple[bool, bool]):
    """The gradients of ``input @ other`` for the cotangent ``g`` as eager's autograd computes
    them through ``_matmul_impl``'s calls (None for an operand not ``wanted``)."""
    ranks = (input.ndim, other.ndim)
    if ranks == (1, 1):  # dot: ``grad * tensor`` and ``grad * self``
        return (ltorch.mul(g, other) if wanted[0] else None, ltorch.mul(g, input) if wanted[1] else None)
    if ranks == (2, 1):
        return _mv_grads(g, input, other, wanted)
    if ranks == (1, 2):  # ``input.unsqueeze(0).mm(other).squeeze_(0)``
        first, second = _mm_grads(g.unsqueeze(0), input.unsqueeze(0), other, wanted)
        return (None if first is None else first.squeeze(0), second)
    if ranks == (2, 2):
        return _mm_grads(g, input, other, wanted)
    if _should_fold(input, other):
        return _folded_grads(g, input, other, wanted)
    if ranks == (3, 3) and input.shape[0] != other.shape[0]:
        # a batch of one that requires grad is squeezed (eager then folds the other batch)
        if input.shape[0] == 1 and input.requires_grad:
            first, second = eager_matmul_grads(g, input.squeeze(0), other, wanted)
            return (None if first is None else first.unsqueeze(0), second)
        if other.shape[0] == 1 and other.requires_grad:
            first, second = eager_matmul_grads(g, input, other.squeeze(0), wanted)
            return (first, None if second is None else second.unsqueeze(0))
    return _batched_grads(g, input, other, wanted)


def _at_most_matrices(args, kwargs) -> bool:
    """Whether ``torch.matmul``'s operands are two matrices, a matrix and a vector or two vectors:
    its complex gradients are traced (eager's ``mm``/``mv``/``dot`` backward conjugated). Batches,
    and a vector times a matrix (eager's ``mm`` of a conjugate view there sums the vector's
    gradient otherwise, an ulp off), run eager's op."""
    ranks = tuple(getattr(x, "ndim", 3) for x in args)
    return not kwargs and ranks in ((2, 2), (2, 1), (1, 1))


_matmul_as_eager.complex_grads = _at_most_matrices  # type: ignore[attr-defined]


@register_grad(ltorch.matmul)
def matmul_grad(input, other):
    out = ltorch.matmul(input, other)
    g = get_grad(out)
    wanted = (requires_grad_of(input), requires_grad_of(other))
    if input.dtype.is_complex and _at_most_matrices((input, other), {}):
        # (conjugate Wirtinger: each operand's gradient of the other conjugated, as eager's
        # ``grad * other.conj()``, ``grad.ger(vec.conj())``, ``g @ mat2.t().conj()``)
        first = eager_matmul_grads(g, input, prims.conj(other), (wanted[0], False))[0]
        second = eager_matmul_grads(g, prims.conj(input), other, (False, wanted[1]))[1]
        for x, grad in ((input, first), (other, second)):
            if grad is not None:
                put_grad(x, grad, complex_values=True)
        return out
    first, second = eager_matmul_grads(g, input, other, wanted)
    grads = [(x, grad) for x, grad in ((input, first), (other, second)) if grad is not None]
    # ``a @ a`` batched: eager's bmm of a view of each operand, whose backward nodes run newest
    # first, adds the second operand's gradient first (2-D: one mm node, in operand order)
    for x, grad in reversed(grads) if input is other and input.ndim >= 3 else grads:
        put_grad(x, grad)
    return out
