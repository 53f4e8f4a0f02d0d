"""``torch.vmap`` over traced tensors: a batching interpreter for the ops that index-based functions
use (Hugging Face's attention-mask functions, which transformers 4.x always runs under vmap).

functorch's own vmap batches below ``__torch_function__``, where a proxy cannot go. While
thunder_rs traces, ``torch.vmap`` is this module's ``vmap``: a value inside it is a
``BatchedProxy`` whose shape, dtype and device are the per-example (logical) ones the function
sees, backed by a physical proxy with one leading dim per active vmap level (size 1 where the
value is not batched over that level). Each op on a ``BatchedProxy`` has a batching rule that
computes on the physical proxies, so the trace records ordinary batched ops:

- elementwise ops (arithmetic, comparisons, bitwise, ``where``, dtype and device moves) broadcast
  their operands' level dims, after giving every operand the same logical rank;
- ``new_*`` creation methods give an unbatched tensor, as in functorch;
- indexing an unbatched tensor with batched integer tensors (``mask[b, kv]``) is advanced
  indexing with the batched indices;

any other op raises an error naming it and the user's line, rather than batching it wrongly.
Calls that involve no proxy run torch's vmap.
"""

import contextvars

import torch
from torch._C import DisableTorchFunctionSubclass
from torch._functorch.vmap import vmap_impl
from torch.utils._pytree import tree_flatten

from thunder_rs.core.langctx import is_metadata_query, refuse_data_dependent, user_location
from thunder_rs.core.proxies import TensorProxy
from thunder_rs.core.recorder import active_recorder, lift_captured
from thunder_rs.errors import ThunderNotImplementedError, ThunderValueError

#: sizes of the active thunder_rs vmap levels, outermost first
_levels: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_vmap_levels", default=())


class BatchedProxy(TensorProxy):
    """A traced value inside ``vmap``: logical metadata, and ``physical`` with ``levels`` leading
    level dims."""

    physical: torch.Tensor
    levels: int

    def __new__(cls, physical: torch.Tensor, levels: int):
        logical = tuple(physical.shape[levels:])
        # No trace value stands for a batched proxy (its ops are recorded on ``physical``).
        proxy = TensorProxy.__new__(cls, None, logical,  # type: ignore[arg-type]
                                     physical.dtype, physical.device, physical.requires_grad)
        proxy.physical = physical
        proxy.levels = levels
        return proxy

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return batched_call(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents=None):
        return f"BatchedProxy({self.physical!r}, levels={self.levels})"


def _refuse(func, why: str):
    name = getattr(func, "__name__", str(func))
    return ThunderNotImplementedError(
        f"torch.vmap: {name} has no thunder_rs batching rule ({why}) at {user_location()}; only elementwise "
        "ops, new_* creation and indexing with batched integer indices are batched while tracing")


def _levels_of(x) -> int:
    return x.levels if isinstance(x, BatchedProxy) else 0


def _physical(x, depth: int, rank: int | None = None):
    """``x``'s physical tensor with ``depth`` level dims and, when ``rank`` is given, that many
    logical dims (size-1 dims inserted after the level dims)."""
    levels = _levels_of(x)
    phys = x.physical if isinstance(x, BatchedProxy) else x
    logical = tuple(phys.shape[levels:])
    ones = (1,) * (depth - levels) + (1,) * (0 if rank is None else rank - len(logical))
    if not ones:
        return phys
    return phys.reshape(tuple(phys.shape[:levels]) + ones + logical)


def _wrap(physical, depth: int):
    return BatchedProxy(physical, depth) if depth else physical


def _meta(x, shape):
    return torch.empty(shape, dtype=x.dtype, device="meta")


def _elementwise(func, args, kwargs):
    depth = len(_levels.get())
    tensors = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
    rank = max(x.ndim for x in tensors)
    # Batching changes ranks, and a 0-d tensor promotes differently from a dimensioned one:
    # refuse where the physical call would compute in another dtype than the logical one.
    for a in tensors:
        for b in tensors:
            logical = torch.result_type(_meta(a, a.shape), _meta(b, b.shape))
            physical = torch.result_type(_meta(a, (1,) * (depth + rank)), _meta(b, (1,) * (depth + rank)))
            if logical != physical:
                raise _refuse(func, f"operands of dtypes {a.dtype} and {b.dtype} and ranks {a.ndim} and {b.ndim}")
    lift = lambda x: _physical(x, depth, rank) if isinstance(x, torch.Tensor) else x  # noqa: E731
    out = func(*map(lift, args), **{k: lift(v) for k, v in kwargs.items()})
    return _wrap(out, depth)


def _conversion(func, args, kwargs):
    """``x.to(...)``, ``x.bool()``: the receiver's physical tensor converted, at its levels."""
    receiver, rest = args[0], args[1:]
    unwrap = lambda x: x.physical if isinstance(x, BatchedProxy) else x  # noqa: E731
    out = func(unwrap(receiver), *map(unwrap, rest), **{k: unwrap(v) for k, v in kwargs.items()})
    return _wrap(out, _levels_of(receiver))


def _creation(func, args, kwargs):
    """``x.new_ones(...)``: only ``x``'s dtype and device matter, so the result is unbatched."""
    return func(args[0].physical, *args[1:], **kwargs)


def _index_entries(func, args):
    if func is torch.Tensor.__getitem__:
        key = args[1]
        return args[0], key if isinstance(key, tuple) else (key,)
    return args[0], tuple(args[1])


def _indexing(func, args, kwargs):
    """``x[i, j]`` with integer tensor (or int) indices for x's leading dims and ``x`` unbatched:
    advanced indexing with the physical indices, whose level dims lead the result."""
    x, entries = _index_entries(func, args)
    if isinstance(x, BatchedProxy):
        raise _refuse(func, "indexing a batched tensor")
    for e in entries:
        if not (isinstance(e, int) or isinstance(e, torch.Tensor) and not e.dtype.is_floating_point
                and e.dtype != torch.bool):
            raise _refuse(func, f"index {type(e).__name__}; only integer tensors and ints for the leading dims")
    depth = len(_levels.get())
    rank = max((e.ndim for e in entries if isinstance(e, torch.Tensor)), default=0)
    key = tuple(_physical(e, depth, rank) if isinstance(e, torch.Tensor) else e for e in entries)
    return _wrap(x[key], depth)


#: torch callables -> batching rules; the elementwise family adds its ops (``batch_as_elementwise``).
_RULES: dict = {}
for _name in ("to", "bool", "long", "int", "float", "double", "contiguous", "clone", "type_as"):
    _RULES[getattr(torch.Tensor, _name)] = _conversion
for _name in ("new_ones", "new_zeros", "new_full", "new_empty", "new_tensor"):
    _RULES[getattr(torch.Tensor, _name)] = _creation
for _fn in (torch.Tensor.__getitem__, torch.ops.aten.index, torch.ops.aten.index.Tensor):
    _RULES[_fn] = _indexing


def batch_as_elementwise(*torch_fns) -> None:
    """Batches calls of ``torch_fns`` on ``BatchedProxy`` operands by broadcasting their level
    dims: right for ops whose every output element depends only on the operands' elements at the
    same (broadcast) position."""
    _RULES.update(dict.fromkeys(torch_fns, _elementwise))


def batched_call(func, args, kwargs):
    """A torch call that takes a ``BatchedProxy``: metadata queries answer logically; other calls
    go to their batching rule."""
    rule = _RULES.get(func)
    if rule is not None:
        return rule(func, args, kwargs)
    if is_metadata_query(func):
        with DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
    refuse_data_dependent(func)
    raise _refuse(func, "no rule")


# -- vmap ------------------------------------------------------------------------------------------


def _traced(tree) -> bool:
    return any(isinstance(x, TensorProxy) for x in tree_flatten(tree)[0])


def _enter(args, in_dims):
    """The arguments as seen inside a new level, and the level's size."""
    if isinstance(in_dims, int) or in_dims is None:
        in_dims = (in_dims,) * len(args)
    if not isinstance(in_dims, (tuple, list)) or len(in_dims) != len(args):
        raise ThunderValueError(f"torch.vmap: in_dims {in_dims!r} must be an int or one entry per argument "
                                f"({len(args)} arguments) at {user_location()}")
    depth = len(_levels.get())
    inner, size = [], None
    for x, d in zip(args, in_dims):
        if d is None:
            inner.append(x)
            continue
        if not isinstance(x, torch.Tensor) or not isinstance(d, int):
            raise ThunderNotImplementedError(f"torch.vmap: in_dims {d!r} for a {type(x).__name__}; thunder_rs maps "
                                             f"tensor arguments over int dims only, at {user_location()}")
        if not -x.ndim <= d < x.ndim:
            raise ThunderValueError(f"torch.vmap: in_dim {d} is out of range for a tensor of rank {x.ndim} "
                                    f"at {user_location()}")
        d %= x.ndim
        if size is not None and x.shape[d] != size:
            raise ThunderValueError(f"torch.vmap: Expected all tensors to have the same size in the mapped "
                                    f"dimension, got sizes {size} and {x.shape[d]} at {user_location()}")
        size = x.shape[d]
        phys = _physical(x, depth)
        inner.append(BatchedProxy(torch.movedim(phys, depth + d, depth), depth + 1))
    if size is None:
        raise ThunderValueError(f"torch.vmap: at least one argument must be mapped over (in_dims) at {user_location()}")
    return inner, size


def _exit(out, out_dim: int, size: int, depth: int):
    """An output of level ``depth`` (1-based) seen from the level outside it, its level dim moved
    to logical dim ``out_dim``."""
    if not isinstance(out, torch.Tensor):
        raise ThunderValueError(f"torch.vmap: the function must return tensors, got {type(out).__name__} "
                                f"at {user_location()}")
    phys = _physical(out, depth)
    shape = list(phys.shape)
    shape[depth - 1] = size
    phys = phys.expand(shape)
    logical_rank = phys.ndim - depth + 1
    out_dim = out_dim % logical_rank
    return _wrap(torch.movedim(phys, depth - 1, depth - 1 + out_dim), depth - 1)


def vmap_entry(func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs):
    """functorch's ``vmap_impl`` while thunder_rs traces: what a ``vmap`` bound before tracing
    (``from torch.func import vmap``) calls."""
    return vmap(func, in_dims, out_dims, randomness, chunk_size=chunk_size)(*args, **kwargs)


def vmap(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None):
    """``torch.vmap`` while thunder_rs traces: batches calls on proxies with this module's rules."""

    def batched(*args, **kwargs):
        if active_recorder() is not None:  # real tensors the program captured are trace inputs too
            args, kwargs = lift_captured(args, kwargs)
        if not (_traced(args) or _traced(kwargs)):
            return vmap_impl(func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs)  # functorch's
        inner, size = _enter(args, in_dims)
        token = _levels.set((*_levels.get(), size))
        try:
            out = func(*inner, **kwargs)
        finally:
            _levels.reset(token)
        depth = len(_levels.get()) + 1
        if isinstance(out, tuple):
            dims = out_dims if isinstance(out_dims, (tuple, list)) else (out_dims,) * len(out)
            return tuple(_exit(o, d, size, depth) for o, d in zip(out, dims))
        return _exit(out, out_dims, size, depth)

    return batched


