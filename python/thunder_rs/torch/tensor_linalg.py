"""``torch.linalg.tensorinv`` and ``tensorsolve`` as eager's composites write them: the tensor
reshaped to a square matrix, inverted (solved) by the opaque factorization eager calls
(``linalg.py``'s ``linalg_inv``, ``linalg_solve``), and the result reshaped back, so that values,
gradients and layouts are eager's. They need no grad rule of their own: the decomposition's
gradient is the factorization's own derivative (eager's ``LinalgInvExBackward0``,
``LinalgSolveExBackward0``) through the reshapes, as eager's autograd records it.
"""

import math

import torch

from thunder_rs.errors import ThunderRuntimeError, check
from thunder_rs.torch.common import require_tensor
from thunder_rs.torch.symbols import ltorch, torchsymbol

LA = torch.linalg
__all__ = ["linalg_tensorinv", "linalg_tensorsolve"]


@torchsymbol(LA.tensorinv)
def linalg_tensorinv(A, ind=2, *, out=None):
    op = "ltorch.linalg_tensorinv"
    require_tensor(op, A, "A")
    check(
        ind > 0,
        op,
        f"Expected a strictly positive integer for 'ind', but got {ind} (argument ind)",
        ThunderRuntimeError,
    )
    end, start = tuple(A.shape[ind:]), tuple(A.shape[:ind])
    rows, columns = math.prod(end), math.prod(start)
    check(
        rows == columns,
        op,
        lambda: (
            "Expected self to satisfy the requirement prod(self.shape[ind:]) == prod(self.shape[:ind]), but got "
            f"{rows} != {columns} (argument A)"
        ),
        ThunderRuntimeError,
    )
    inverse = ltorch.linalg_inv(ltorch.reshape(A, (rows, rows)))
    return ltorch.reshape(inverse, (*end, *start))


@torchsymbol(LA.tensorsolve)
def linalg_tensorsolve(A, B, dims=None, *, out=None):
    op = "ltorch.linalg_tensorsolve"
    require_tensor(op, A, "A")
    require_tensor(op, B, "B")
    ndim = A.ndim
    if dims is not None:
        dims = tuple(dims)
        A = ltorch.movedim(A, dims, tuple(range(ndim - len(dims), ndim)))
    result_shape = tuple(A.shape[B.ndim :])
    rows, count = math.prod(result_shape), math.prod(B.shape)
    check(
        rows == count,
        op,
        lambda: (
            "Expected self to satisfy the requirement prod(self.shape[other.ndim:]) == prod(self.shape[:other.ndim]), "
            f"but got {rows} != {count} (argument A)"
        ),
        ThunderRuntimeError,
    )
    solution = ltorch.linalg_solve(ltorch.reshape(A, (rows, rows)), ltorch.flatten(B))
    return ltorch.reshape(solution, result_shape)
