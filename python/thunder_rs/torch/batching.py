"""Batching rules of ``torch.vmap`` over traced tensors for views, reductions and joins
(``core.lang.vmap``): each computes the call on the physical tensors, whose leading dims are the
vmap levels, by shifting the logical dims it names past them.

A logical dim ``d`` of a tensor with ``levels`` level dims and logical rank ``r`` is physical dim
``levels + d % r``; the level dims stay in front of every result. Joins give their operands the
same level dims, each of its level's size. Views are computed as ``reshape`` (values equal); so
in-place ops (``add_``, ``copy_``: an ensemble's BatchNorm counting its batches in a stacked
buffer) write only a tensor the vmap mapped, whose physical tensor is a view of the argument.
"""

import torch
import torch.nn.functional as F

from thunder_rs.core.lang.langctx import user_location
from thunder_rs.core.lang.vmap import (
    BatchedProxy,
    batching_rule,
    elementwise,
    levels_of,
    physical,
    refusal,
    wrap,
    wrap_tree,
)
from thunder_rs.core.lang.vmap_state import full
from thunder_rs.errors import ThunderIndexError, ThunderNotImplementedError, ThunderRuntimeError

T = torch.Tensor


def _dim(func, d: int, rank: int) -> int:
    """Logical dim ``d`` of a rank-``rank`` tensor normalised as torch does (a 0-d tensor has dims
    -1 and 0)."""
    bound = max(rank, 1)
    if not -bound <= d < bound:
        raise ThunderIndexError(
            f"{getattr(func, '__name__', func)}: Dimension out of range (expected to be in range of "
            f"[{-bound}, {bound - 1}], but got {d}) at {user_location()}"
        )
    return d % bound


def _arg(args, kwargs, index: int, name: str, default=None):
    return args[index] if len(args) > index else kwargs.get(name, default)


def _sizes(args, start: int = 1) -> tuple:
    """Sizes given as varargs (``x.view(2, 3)``) or as one sequence (``x.view((2, 3))``)."""
    rest = args[start:]
    return tuple(rest[0]) if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)) else tuple(rest)


# -- views -----------------------------------------------------------------------------------------


@batching_rule(T.view, T.reshape, torch.reshape)
def _reshape(func, args, kwargs):
    x = args[0]
    shape = _sizes(args) if len(args) > 1 else tuple(kwargs["shape"])
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise refusal(func, "a view as another dtype")
    lv = x.levels
    return wrap(x.physical.reshape((*x.physical.shape[:lv], *shape)), lv)


@batching_rule(T.view_as, T.reshape_as)
def _reshape_as(func, args, kwargs):
    return _reshape(T.reshape, (args[0], tuple(args[1].shape)), {})


@batching_rule(T.flatten, torch.flatten)
def _flatten(func, args, kwargs):
    x = args[0]
    rank, lv = x.ndim, x.levels
    start = _dim(func, _arg(args, kwargs, 1, "start_dim", 0), rank)
    end = _dim(func, _arg(args, kwargs, 2, "end_dim", -1), rank)
    if rank == 0:
        return wrap(x.physical.reshape((*x.physical.shape[:lv], 1)), lv)
    return wrap(torch.flatten(x.physical, lv + start, lv + end), lv)


@batching_rule(T.unflatten, torch.unflatten)
def _unflatten(func, args, kwargs):
    x = args[0]
    d = _dim(func, _arg(args, kwargs, 1, "dim"), x.ndim)
    return wrap(torch.unflatten(x.physical, x.levels + d, tuple(_arg(args, kwargs, 2, "sizes"))), x.levels)


@batching_rule(T.permute, torch.permute)
def _permute(func, args, kwargs):
    x = args[0]
    dims = _sizes(args) if len(args) > 1 else tuple(kwargs["dims"])
    lv = x.levels
    order = (*range(lv), *(lv + _dim(func, d, x.ndim) for d in dims))
    return wrap(x.physical.permute(order), lv)


@batching_rule(T.transpose, torch.transpose, T.swapaxes, torch.swapaxes, T.swapdims, torch.swapdims)
def _transpose(func, args, kwargs):
    x = args[0]
    d0, d1 = (_dim(func, _arg(args, kwargs, i, n), x.ndim) for i, n in ((1, "dim0"), (2, "dim1")))
    if x.ndim == 0:
        return x
    return wrap(x.physical.transpose(x.levels + d0, x.levels + d1), x.levels)


@batching_rule(T.t, torch.t)
def _t(func, args, kwargs):
    x = args[0]
    if x.ndim > 2:
        raise refusal(func, f"t() of a {x.ndim}-d tensor")
    return x if x.ndim < 2 else _transpose(func, (x, 0, 1), {})


@batching_rule(T.T.__get__, T.mT.__get__)  # type: ignore[attr-defined]
def _transpose_property(func, args, kwargs):
    """``x.T`` (all dims reversed; a rank-2 transpose) and ``x.mT`` (the last two swapped)."""
    x = args[0]
    if func is T.mT.__get__:
        if x.ndim < 2:
            raise refusal(func, f"mT of a {x.ndim}-d tensor")
        return _transpose(T.transpose, (x, -2, -1), {})
    return _permute(T.permute, (x, *reversed(range(x.ndim))), {}) if x.ndim > 1 else x


@batching_rule(T.movedim, torch.movedim, T.moveaxis, torch.moveaxis)
def _movedim(func, args, kwargs):
    x = args[0]
    src, dst = _arg(args, kwargs, 1, "source"), _arg(args, kwargs, 2, "destination")
    src, dst = ((s,) if isinstance(s, int) else tuple(s) for s in (src, dst))
    lv = x.levels
    shift = lambda ds: tuple(lv + _dim(func, d, x.ndim) for d in ds)  # noqa: E731
    return wrap(torch.movedim(x.physical, shift(src), shift(dst)), lv)


@batching_rule(T.unsqueeze, torch.unsqueeze)
def _unsqueeze(func, args, kwargs):
    x = args[0]
    d = _dim(func, _arg(args, kwargs, 1, "dim"), x.ndim + 1)
    return wrap(x.physical.unsqueeze(x.levels + d), x.levels)


@batching_rule(T.squeeze, torch.squeeze)
def _squeeze(func, args, kwargs):
    x = args[0]
    dim = _arg(args, kwargs, 1, "dim")
    if dim is None:
        dims = tuple(d for d in range(x.ndim) if x.shape[d] == 1)
    else:
        dims = tuple(_dim(func, d, x.ndim) for d in ((dim,) if isinstance(dim, int) else dim))
    dims = tuple(x.levels + d for d in dims if x.ndim and x.shape[d] == 1)
    return wrap(x.physical.squeeze(dims) if dims else x.physical, x.levels)


@batching_rule(T.expand)
def _expand(func, args, kwargs):
    x = args[0]
    sizes = _sizes(args) if len(args) > 1 else tuple(kwargs["size"])
    lv = x.levels
    phys = physical(x, lv, len(sizes))
    return wrap(phys.expand((*phys.shape[:lv], *sizes)), lv)


@batching_rule(T.expand_as)
def _expand_as(func, args, kwargs):
    """``x.expand_as(other)``: to ``other``'s logical sizes (an unbatched ``x`` stays unbatched, as in functorch)."""
    if not isinstance(args[0], BatchedProxy):
        return args[0].expand(tuple(args[1].shape))
    return _expand(T.expand, (args[0], tuple(args[1].shape)), {})


@batching_rule(T.select, torch.select)
def _select(func, args, kwargs):
    x = args[0]
    d = _dim(func, _arg(args, kwargs, 1, "dim"), x.ndim)
    return wrap(x.physical.select(x.levels + d, _arg(args, kwargs, 2, "index")), x.levels)


@batching_rule(T.narrow, torch.narrow)
def _narrow(func, args, kwargs):
    x = args[0]
    d = _dim(func, _arg(args, kwargs, 1, "dim"), x.ndim)
    start, length = _arg(args, kwargs, 2, "start"), _arg(args, kwargs, 3, "length")
    return wrap(x.physical.narrow(x.levels + d, start, length), x.levels)


@batching_rule(T.split, torch.split, T.chunk, torch.chunk, T.unbind, torch.unbind)
def _split(func, args, kwargs):
    x = args[0]
    name = func.__name__
    if name == "unbind":
        d = _dim(func, _arg(args, kwargs, 1, "dim", 0), x.ndim)
        return tuple(wrap(p, x.levels) for p in x.physical.unbind(x.levels + d))
    second = "chunks" if name == "chunk" else "split_size_or_sections" if func is torch.split else "split_size"
    d = _dim(func, _arg(args, kwargs, 2, "dim", 0), x.ndim)
    parts = getattr(x.physical, name)(_arg(args, kwargs, 1, second), x.levels + d)
    return tuple(wrap(p, x.levels) for p in parts)


@batching_rule(T.flip, torch.flip)
def _flip(func, args, kwargs):
    x = args[0]
    dims = _sizes(args) if len(args) > 1 else tuple(kwargs["dims"])
    return wrap(x.physical.flip(tuple(x.levels + _dim(func, d, x.ndim) for d in dims)), x.levels)


# -- reductions and normalisations along dims ------------------------------------------------------

_REDUCTIONS = (
    (T.sum, torch.sum, T.mean, torch.mean, T.prod, torch.prod, T.amax, torch.amax, T.amin, torch.amin)
    + (T.logsumexp, torch.logsumexp, T.all, torch.all, T.any, torch.any, T.std, torch.std, T.var, torch.var)
    + (T.max, torch.max, T.min, torch.min, T.argmax, torch.argmax, T.argmin, torch.argmin)
    + (T.norm, torch.norm, T.count_nonzero, torch.count_nonzero, T.nansum, torch.nansum)
)
#: Reductions whose dim is the third argument (``torch.norm(x, p, dim)``).
_DIM_THIRD = {T.norm, torch.norm}


@batching_rule(*_REDUCTIONS)
def _reduction(func, args, kwargs):
    x = args[0]
    position = 2 if func in _DIM_THIRD else 1
    dim = _arg(args, kwargs, position, "dim")
    name = func.__name__
    if name in ("max", "min") and isinstance(dim, torch.Tensor):
        return elementwise(func, args, kwargs)  # torch.max(a, b): the elementwise maximum
    if isinstance(dim, bool):
        raise refusal(func, "the unbiased flag given positionally")
    rest = list(args[position + 1 :]) if len(args) > position + 1 else []
    lead = list(args[1:position])
    kwargs = {k: v for k, v in kwargs.items() if k != "dim"}
    if func in _DIM_THIRD and not lead:  # (the order ``norm`` takes p and dim positionally in)
        lead = [kwargs.pop("p", "fro")]
    lv, rank = x.levels, x.ndim
    if rank == 0:  # a reduction of a 0-d tensor over its one dim (-1 or 0, or all of them)
        if rest:
            raise refusal(func, "a reduction of a 0-d tensor with positional options")
        kwargs.pop("keepdim", None)
        if dim is None and name in ("max", "min"):
            name = "a" + name
        return wrap_tree(getattr(torch, name)(x.physical.unsqueeze(-1), *lead, -1, **kwargs), lv)
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        if name in ("argmax", "argmin"):
            if kwargs.get("keepdim"):
                raise refusal(func, "argmax/argmin over all dims with keepdim")
            return wrap(getattr(torch, name)(x.physical.flatten(lv), -1), lv)
        if name in ("max", "min"):
            name = "a" + name
        dims = tuple(range(lv, lv + rank))
        return wrap_tree(getattr(torch, name)(x.physical, *lead, dims, *rest, **kwargs), lv)
    dims = tuple(lv + _dim(func, d, rank) for d in ((dim,) if isinstance(dim, int) else dim))
    physical_dim = dims[0] if isinstance(dim, int) else dims
    return wrap_tree(getattr(torch, name)(x.physical, *lead, physical_dim, *rest, **kwargs), lv)


_ALONG_DIM: tuple = (T.softmax, torch.softmax, F.softmax, T.log_softmax, torch.log_softmax, F.log_softmax)
_ALONG_DIM += (T.cumsum, torch.cumsum, T.cumprod, torch.cumprod, T.cummax, torch.cummax, T.cummin, torch.cummin)
_ALONG_DIM += (T.logcumsumexp, torch.logcumsumexp)


@batching_rule(*_ALONG_DIM)
def _along_dim(func, args, kwargs):
    """Ops computed independently along one dim: the same op along its physical dim."""
    x = args[0]
    dim = _arg(args, kwargs, 1, "dim")
    if dim is None:
        raise refusal(func, "softmax without dim (an implicit dim chosen by rank)")
    kwargs = {k: v for k, v in kwargs.items() if k not in ("dim", "_stacklevel")}
    rest = args[2:]
    if func in (F.softmax, F.log_softmax):
        rest = rest[1:]  # (_stacklevel)
        if rest:
            kwargs["dtype"] = rest[0]
            rest = ()
        func = torch.softmax if func is F.softmax else torch.log_softmax
    phys = x.physical if x.ndim else x.physical.unsqueeze(-1)
    d = x.levels + _dim(func, dim, x.ndim) if x.ndim else -1
    out = wrap_tree(getattr(torch, func.__name__)(phys, d, *rest, **kwargs), x.levels)
    return out if x.ndim else wrap_tree(_squeeze_last(out), 0)


def _squeeze_last(out):
    if isinstance(out, BatchedProxy):
        return wrap(out.physical.squeeze(-1), out.levels)
    return type(out)(*map(_squeeze_last, out)) if hasattr(type(out), "_fields") else type(out)(map(_squeeze_last, out))


# -- joins -----------------------------------------------------------------------------------------


@batching_rule(torch.cat, torch.concat, torch.concatenate, torch.stack)
def _join(func, args, kwargs):
    tensors = list(_arg(args, kwargs, 0, "tensors"))
    dim = _arg(args, kwargs, 1, "dim", 0)
    depth = max(map(levels_of, tensors))
    stack = func is torch.stack
    rank = max(t.ndim for t in tensors)
    d = _dim(func, dim, rank + 1 if stack else rank)
    physicals = [full(t, depth) for t in tensors]
    if not stack and any(t.ndim == 1 and t.shape[0] == 0 for t in tensors) and rank > 1:
        raise refusal(func, "cat of a legacy empty 1-d tensor")
    return wrap(getattr(torch, "stack" if stack else "cat")(physicals, depth + d), depth)


# -- in-place writes -------------------------------------------------------------------------------

_IN_PLACE = ("add_", "sub_", "mul_", "div_", "copy_", "fill_", "zero_", "lerp_", "addcmul_", "addcdiv_")
_IN_PLACE_DUNDERS = ("__iadd__", "__isub__", "__imul__", "__itruediv__")


@batching_rule(*(getattr(T, name) for name in (*_IN_PLACE, *_IN_PLACE_DUNDERS)))
def _in_place(func, args, kwargs):
    """``x.add_(y)`` on a tensor ``x`` the vmap mapped: ``x``'s physical tensor written with the
    operands at ``x``'s level dims, where ``x`` is batched over every level an operand is (else
    functorch's error), and the operands promote as in the logical call (else refused)."""
    receiver, name = args[0], getattr(func, "__name__", str(func))
    if isinstance(receiver, BatchedProxy) and not receiver.mapped_argument:
        raise ThunderNotImplementedError(
            f"torch.vmap: {name} writes a batched tensor that is not an argument the vmap maps at {user_location()} "
            "(a view or a result inside the vmapped function); thunder_rs writes in place only the mapped "
            "arguments themselves (an ensemble's stacked buffers). Use the out-of-place op"
        )
    levels = levels_of(receiver)
    for x in (x for x in (*args[1:], *kwargs.values()) if levels_of(x)):
        lifted = physical(x, levels, receiver.ndim) if levels_of(x) <= levels else None
        if lifted is None or any(o != 1 and r == 1 for o, r in zip(lifted.shape[:levels], receiver.physical.shape)):
            raise ThunderRuntimeError(
                f"vmap: {name}(self, *extra_args) is not possible because there exists a Tensor `other` in extra_args "
                "that has more elements than `self`. This happened due to `other` being vmapped over but `self` not "
                f"being vmapped over in a vmap. Please try to use out-of-place operators instead of {name}. "
                f"(at {user_location()})"
            )
        logical = torch.result_type(_meta(receiver, receiver.ndim), _meta(x, x.ndim))
        if logical != torch.result_type(_meta(receiver, levels + receiver.ndim), _meta(x, levels + receiver.ndim)):
            raise refusal(
                func, f"operands of dtypes {receiver.dtype} and {x.dtype} and ranks {receiver.ndim} and {x.ndim}"
            )
    lift = lambda x: physical(x, levels, receiver.ndim) if levels_of(x) else x  # noqa: E731
    func(receiver.physical, *map(lift, args[1:]), **{k: lift(v) for k, v in kwargs.items()})
    return receiver


def _meta(x, rank: int):
    """A stand-in of ``x``'s dtype and rank for ``torch.result_type`` (which reads the rank)."""
    return torch.empty((1,) * rank, dtype=x.dtype, device="meta")
