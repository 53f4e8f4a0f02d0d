"""Scans: cumulative sums, products, extrema and log-sum-exp along one dim, over the scan prims."""

import torch

from thunder_rs import clang, prims
from thunder_rs.core import dtypes
from thunder_rs.errors import ThunderNotImplementedError, check
from thunder_rs.torch import torchsymbol

T = torch.Tensor
__all__ = ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"]


def _scan_dim(a, dim, op: str, out) -> int:
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    return clang.canonicalize_dim(a.ndim, dim, op)


def _accumulate(prim, op: str, a, dim, dtype, out):
    """cumsum/cumprod: integers and bool accumulate in int64 unless ``dtype`` says otherwise."""
    d = _scan_dim(a, dim, op, out)
    if dtype is None:
        dtype = a.dtype if dtypes.is_inexact(a.dtype) else torch.int64
    return prim(clang.maybe_convert(a, dtype), d)


@torchsymbol(torch.cumsum, T.cumsum)
def cumsum(input, dim, *, dtype=None, out=None):
    return _accumulate(prims.cumsum, "ltorch.cumsum", input, dim, dtype, out)


@torchsymbol(torch.cumprod, T.cumprod)
def cumprod(input, dim, *, dtype=None, out=None):
    return _accumulate(prims.cumprod, "ltorch.cumprod", input, dim, dtype, out)


@torchsymbol(torch.cummax, T.cummax)
def cummax(input, dim, *, out=None):
    d = _scan_dim(input, dim, "ltorch.cummax", out)
    return torch.return_types.cummax(prims.cummax(input, d))


@torchsymbol(torch.cummin, T.cummin)
def cummin(input, dim, *, out=None):
    d = _scan_dim(input, dim, "ltorch.cummin", out)
    return torch.return_types.cummin(prims.cummin(input, d))


@torchsymbol(torch.logcumsumexp, T.logcumsumexp)
def logcumsumexp(input, dim, *, out=None):
    op = "ltorch.logcumsumexp"
    d = _scan_dim(input, dim, op, out)
    check(dtypes.is_inexact(input.dtype), op, f'"logcumsumexp_out_cpu" not implemented for {input.dtype} (argument input)',
          ThunderNotImplementedError)
    return prims.logcumsumexp(input, d)
