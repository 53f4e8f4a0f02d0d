"""Linear algebra ops: matmul and its fixed-rank forms (mm, bmm, mv, dot), inner, outer, addmm, baddbmm,
and the weight-gradient product view folding makes (flattened_product).

Products do not promote: torch requires both operands to have one dtype and raises RuntimeError
otherwise, as it does for shape mismatches. The checks here run before ``prims.matmul`` so that
errors have eager's types; the prim's own meta errors are the backstop.
"""

import torch

from thunder_rs import clang, prims
from thunder_rs.errors import (
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
)
from thunder_rs.torch.symbols import torchsymbol

T = torch.Tensor
__all__ = ["matmul", "rmatmul", "mm", "bmm", "mv", "dot", "inner", "outer", "addmm", "baddbmm", "flattened_product"]


def _check_operands(op: str, a, b, names: tuple[str, str], ranks=None) -> None:
    """Both are tensors of one dtype and device (not bool), of the ``ranks`` given."""
    for x, name in zip((a, b), names):
        check(
            isinstance(x, torch.Tensor),
            op,
            lambda: f"expected a tensor, got {type(x).__name__} (argument {name})",
            ThunderTypeError,
        )
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


@torchsymbol(torch.matmul, T.matmul, T.__matmul__, torch.linalg.matmul)
def matmul(input, other):
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
    return prims.matmul(input, other)


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
    check(
        input.shape[0] == tensor.shape[0],
        op,
        f"inconsistent tensor size: {input.shape[0]} and {tensor.shape[0]} elements (argument tensor)",
        ThunderRuntimeError,
    )
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
    # Contract the last dims as one matrix product: (A, k) @ (k, B), then restore both leading shapes.
    a = prims.reshape(input, (_prod(input.shape[:-1]), k))
    b = prims.reshape(other, (_prod(other.shape[:-1]), k))
    out = prims.matmul(a, prims.transpose(b, (1, 0)))
    return prims.reshape(out, (*input.shape[:-1], *other.shape[:-1]))


def _prod(sizes) -> int:
    out = 1
    for s in sizes:
        out *= s
    return out


@torchsymbol(torch.outer, T.outer, torch.ger, T.ger)
def outer(input, vec2):
    op = "ltorch.outer"
    for x, name in ((input, "input"), (vec2, "vec2")):
        check(
            isinstance(x, torch.Tensor),
            op,
            f"expected a tensor, got {type(x).__name__} (argument {name})",
            ThunderTypeError,
        )
        check(
            x.ndim == 1,
            op,
            f"expected a 1-D tensor, but got a {x.ndim}-D tensor (argument {name})",
            ThunderRuntimeError,
        )
    column = prims.reshape(input, (input.shape[0], 1))
    row = prims.reshape(vec2, (1, vec2.shape[0]))
    return clang.elementwise(prims.mul, op, column, row)


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
        tuple(broadcast) == tuple(product.shape),
        op,
        f"input of shape {list(input.shape)} does not broadcast to the product's shape {list(product.shape)} "
        "(argument input)",
        ThunderRuntimeError,
    )
    if alpha != 1:
        product = prims.mul(product, clang.maybe_convert(alpha, product.dtype))
    if beta == 0:
        return product
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
    rows = _prod(g.shape[:-1])
    flat_g = prims.transpose(prims.reshape(g, (rows, g.shape[-1])), (1, 0))
    return prims.matmul(flat_g, prims.reshape(x, (rows, x.shape[-1])))
