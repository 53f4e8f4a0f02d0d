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

- views, reductions and joins (``thunder_rs.torch.batching``), and the layers of torch.func's
  ensembling and per-sample programs: matmul/linear, convolution, pooling, batch_norm, dropout,
  cross_entropy/nll_loss (``thunder_rs.torch.nn_batching``), registered with ``batching_rule``;

any other op raises an error naming it and the user's line, rather than batching it wrongly.
Calls that involve no proxy run torch's vmap.

``in_dims`` and ``out_dims`` pair with the arguments and outputs as functorch pairs them: an int
for every leaf, or a (nested) tuple that is a tree prefix of the arguments (torch's generic
``associative_scan`` maps ``((0, 0), (0, 0))`` over two pairs of tensors); ``None`` leaves a leaf
unmapped. Dynamo's graphs hold a ``torch.vmap`` as functorch's level calls, which open and close
levels of this same interpreter while a graph is traced (the end of this module).
"""

import contextlib
import contextvars

import torch
from torch._C import DisableTorchFunctionSubclass
from torch._functorch import predispatch
from torch._functorch.vmap import vmap_impl
from torch.utils._pytree import _broadcast_to_and_flatten, tree_flatten, tree_unflatten

from thunder_rs.core.lang.langctx import is_metadata_query, refuse_data_dependent, user_location
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.recorder import active_recorder, lift_captured
from thunder_rs.core.lang import functorch_calls, vmap_state
from thunder_rs.core.lang.vmap_state import levels_of, physical
from thunder_rs.errors import ThunderNotImplementedError, ThunderValueError

_levels, _randomness = vmap_state.levels, vmap_state.randomness


class BatchedProxy(TensorProxy):
    """A traced value inside ``vmap``: logical metadata, and ``physical`` with ``levels`` leading
    level dims."""

    physical: torch.Tensor
    levels: int
    #: functorch's physical tensor as a permutation of ``physical``'s dims (None: the same dims),
    #: where functorch's levels are not all in front: an input mapped over ``in_dims`` keeps
    #: its data where it is, each level at its in_dim, as dtype conversions of it do (other
    #: rules move their levels first). Rules whose output layout follows it (embedding's) read it.
    order: tuple | None = None
    #: whether ``physical`` is a view of the tensor the vmap mapped (an argument, as ``_enter``
    #: made it), so that a write into it goes where eager's write into the batched tensor goes:
    #: in-place rules (``thunder_rs.torch.batching``) write only such tensors.
    mapped_argument: bool = False

    def __new__(cls, physical: torch.Tensor, levels: int):
        logical = tuple(physical.shape[levels:])
        # No trace value stands for a batched proxy (its ops are recorded on ``physical``).
        proxy = TensorProxy.__new__(
            cls,
            None,  # type: ignore[arg-type]
            logical,
            physical.dtype,
            physical.device,
            physical.requires_grad,
        )
        proxy.physical = physical
        proxy.levels = levels
        return proxy

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return batched_call(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents=None):
        return f"BatchedProxy({self.physical!r}, levels={self.levels})"


vmap_state.BATCHED.append(BatchedProxy)


def refusal(func, why: str):
    name = getattr(func, "__name__", str(func))
    return ThunderNotImplementedError(
        f"torch.vmap: {name} has no thunder_rs batching rule ({why}) at {user_location()}; elementwise ops, "
        "views, reductions, joins, matmul/linear, einsum, convolution, pooling, batch_norm, layer_norm, "
        "group_norm, embedding, scaled_dot_product_attention, dropout in eval, cross_entropy/nll_loss, new_* "
        "creation, indexing and in-place arithmetic on mapped arguments are batched while tracing"
    )


def wrap(phys, depth: int):
    return BatchedProxy(phys, depth) if depth else phys


def active_sizes() -> tuple:
    """The sizes of the active vmap levels, outermost first."""
    return _levels.get()


def randomness() -> str:
    """The innermost level's ``randomness`` (what decides a random op under it, as in functorch)."""
    return _randomness.get()[-1]


def wrap_tree(out, depth: int):
    """``wrap`` of each tensor of a call's output (a tensor, or a tuple of them such as
    ``torch.max``'s named tuple)."""
    if isinstance(out, torch.Tensor):
        return wrap(out, depth)
    if not isinstance(out, (tuple, list)):
        return out
    items = [wrap_tree(o, depth) for o in out]
    return type(out)(*items) if hasattr(type(out), "_fields") else type(out)(items)


def _meta(x, rank: int):
    """A stand-in of ``x``'s dtype and rank for ``torch.result_type``, which reads no sizes but
    the rank (a symbolic size would make a meta tensor of torch's SymInts, which we do not have)."""
    return torch.empty((1,) * rank, dtype=x.dtype, device="meta")


def elementwise(func, args, kwargs):
    depth = len(_levels.get())
    tensors = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
    rank = max(x.ndim for x in tensors)
    # Batching changes ranks, and a 0-d tensor promotes differently from a dimensioned one:
    # refuse where the physical call would compute in another dtype than the logical one.
    for a in tensors:
        for b in tensors:
            logical = torch.result_type(_meta(a, a.ndim), _meta(b, b.ndim))
            batched = torch.result_type(_meta(a, depth + rank), _meta(b, depth + rank))
            if logical != batched:
                raise refusal(func, f"operands of dtypes {a.dtype} and {b.dtype} and ranks {a.ndim} and {b.ndim}")
    lift = lambda x: physical(x, depth, rank) if isinstance(x, torch.Tensor) else x  # noqa: E731
    out = func(*map(lift, args), **{k: lift(v) for k, v in kwargs.items()})
    return wrap(out, depth)


def _conversion(func, args, kwargs):
    """``x.to(...)``, ``x.cuda()``, ``x.bool()``: the receiver's physical tensor converted, at its levels."""
    receiver, rest = args[0], args[1:]
    unwrap = lambda x: x.physical if isinstance(x, BatchedProxy) else x  # noqa: E731
    out = func(unwrap(receiver), *map(unwrap, rest), **{k: unwrap(v) for k, v in kwargs.items()})
    out = wrap(out, levels_of(receiver))
    if func is not torch.Tensor.contiguous and isinstance(out, BatchedProxy) and not kwargs.get("memory_format"):
        out.order = receiver.order  # (functorch's unary rules keep the levels where they are)
    return out


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
        if func is not torch.Tensor.__getitem__ or not all(
            e is None or e is Ellipsis or type(e) in (int, slice) for e in entries
        ):
            raise refusal(func, "indexing a batched tensor with tensors; only ints, slices, None and ...")
        return wrap(x.physical[(slice(None),) * x.levels + entries], x.levels)
    for e in entries:
        if not (
            isinstance(e, int)
            or isinstance(e, torch.Tensor)
            and not e.dtype.is_floating_point
            and e.dtype != torch.bool
        ):
            raise refusal(func, f"index {type(e).__name__}; only integer tensors and ints for the leading dims")
    depth = len(_levels.get())
    rank = max((e.ndim for e in entries if isinstance(e, torch.Tensor)), default=0)
    key = tuple(physical(e, depth, rank) if isinstance(e, torch.Tensor) else e for e in entries)
    return wrap(x[key], depth)


#: torch callables -> batching rules; the elementwise family adds its ops (``batch_as_elementwise``).
_RULES: dict = {}
for _name in ("to", "cuda", "cpu", "bool", "long", "int", "float", "double", "contiguous", "clone", "type_as"):
    _RULES[getattr(torch.Tensor, _name)] = _conversion
for _name in ("new_ones", "new_zeros", "new_full", "new_empty", "new_tensor"):
    _RULES[getattr(torch.Tensor, _name)] = _creation
for _fn in (torch.Tensor.__getitem__, torch.ops.aten.index, torch.ops.aten.index.Tensor):
    _RULES[_fn] = _indexing


def batching_rule(*torch_fns):
    """Registers the decorated ``rule(func, args, kwargs)`` as the batching rule of ``torch_fns``:
    it computes the call on the operands' physical tensors and returns ``BatchedProxy``s."""

    def register(rule):
        _RULES.update(dict.fromkeys(torch_fns, rule))
        return rule

    return register


def batch_as_elementwise(*torch_fns) -> None:
    """Batches calls of ``torch_fns`` on ``BatchedProxy`` operands by broadcasting their level
    dims: right for ops whose every output element depends only on the operands' elements at the
    same (broadcast) position."""
    _RULES.update(dict.fromkeys(torch_fns, elementwise))


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
    raise refusal(func, "no rule")


# -- vmap ------------------------------------------------------------------------------------------


def _traced(tree) -> bool:
    return any(isinstance(x, TensorProxy) for x in tree_flatten(tree)[0])


def _flat_in_dims(args, in_dims) -> tuple[list, list, object]:
    """The arguments' leaves and their in_dims, as functorch pairs them: ``in_dims`` is an int (or
    None) for every leaf, or a tuple with one entry per argument, each a tree prefix of it (a
    nested tuple for a tuple argument, ``0`` for all of its leaves)."""
    if not isinstance(in_dims, (int, tuple)):
        raise ThunderValueError(
            f"torch.vmap: in_dims must be an int or a (nested) tuple matching the arguments, "
            f"got {type(in_dims).__name__} at {user_location()}"
        )
    leaves, spec = tree_flatten(args)
    dims = _broadcast_to_and_flatten(in_dims, spec)
    if dims is None:
        raise ThunderValueError(
            f"torch.vmap: in_dims {in_dims!r} is not compatible with the structure of the "
            f"{len(args)} arguments at {user_location()}"
        )
    return leaves, dims, spec


def _batch(x, dim: int, depth: int, size: int | None) -> BatchedProxy:
    """``x`` (seen at ``depth`` levels) mapped over its logical ``dim`` by level ``depth + 1``,
    whose size is ``size`` when another argument has set it."""
    if not -x.ndim <= dim < x.ndim:
        raise ThunderValueError(
            f"torch.vmap: in_dim {dim} is out of range for a tensor of rank {x.ndim} at {user_location()}"
        )
    dim %= x.ndim
    if size is not None and x.shape[dim] != size:
        raise ThunderValueError(
            f"torch.vmap: Expected all tensors to have the same size in the mapped "
            f"dimension, got sizes {size} and {x.shape[dim]} at {user_location()}"
        )
    out = BatchedProxy(torch.movedim(physical(x, depth), depth + dim, depth), depth + 1)
    rank = out.physical.ndim
    inner = x.order if isinstance(x, BatchedProxy) and x.order is not None and x.levels == depth else range(rank)
    moved = list(range(rank))
    moved.insert(depth + dim, moved.pop(depth))  # (the new physical's dims in x's physical order)
    order = tuple(moved[j] for j in inner)
    out.order = None if order == tuple(range(rank)) else order
    # (a batched value of an outer level is a view of what eager's is only if that level mapped it)
    out.mapped_argument = not isinstance(x, BatchedProxy) or x.mapped_argument
    return out


def _enter(args, in_dims):
    """The arguments as seen inside a new level, and the level's size."""
    leaves, dims, spec = _flat_in_dims(args, in_dims)
    depth = len(_levels.get())
    inner, size = [], None
    for x, d in zip(leaves, dims):
        if d is None:
            inner.append(x)
            continue
        if not isinstance(x, torch.Tensor) or not isinstance(d, int):
            raise ThunderValueError(
                f"torch.vmap: in_dim {d!r} for a {type(x).__name__}; only tensors are mapped, "
                f"over int dims (None for other arguments), at {user_location()}"
            )
        batched = _batch(x, d, depth, size)
        size = batched.physical.shape[depth]
        inner.append(batched)
    if size is None:
        raise ThunderValueError(f"torch.vmap: at least one argument must be mapped over (in_dims) at {user_location()}")
    return tree_unflatten(inner, spec), size


def _exit(out, out_dim: int | None, size: int, depth: int):
    """An output of level ``depth`` (1-based) seen from the level outside it, its level dim moved
    to logical dim ``out_dim``; ``out_dim`` None returns an output that is not batched as it is."""
    if out_dim is None:
        if isinstance(out, BatchedProxy) and out.levels == depth:
            raise ThunderValueError(
                f"torch.vmap: the function returns a batched tensor where out_dims is None at {user_location()}"
            )
        return out
    if not isinstance(out, torch.Tensor):
        raise ThunderValueError(
            f"torch.vmap: the function must return tensors, got {type(out).__name__} at {user_location()}"
        )
    phys = physical(out, depth)
    shape = list(phys.shape)
    shape[depth - 1] = size
    phys = phys.expand(shape)
    logical_rank = phys.ndim - depth + 1
    out_dim = out_dim % logical_rank
    return wrap(torch.movedim(phys, depth - 1, depth - 1 + out_dim), depth - 1)


def _exit_all(out, out_dims, size: int, depth: int):
    """The function's outputs (a tensor or a tree of them) seen from outside the level, with
    ``out_dims`` paired to them as functorch pairs them."""
    leaves, spec = tree_flatten(out)
    dims: list | None
    if isinstance(out, torch.Tensor):
        dims = list(out_dims) if isinstance(out_dims, tuple) and len(out_dims) == 1 else [out_dims]
    else:
        dims = _broadcast_to_and_flatten(out_dims, spec)
    if dims is None or not all(d is None or isinstance(d, int) for d in dims):
        raise ThunderValueError(
            f"torch.vmap: out_dims {out_dims!r} is not compatible with the structure of the "
            f"outputs at {user_location()}"
        )
    return tree_unflatten([_exit(o, d, size, depth) for o, d in zip(leaves, dims)], spec)


def vmap_entry(func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs):
    """functorch's ``vmap_impl`` while thunder_rs traces: what a ``vmap`` bound before tracing
    (``from torch.func import vmap``) calls."""
    return vmap(func, in_dims, out_dims, randomness, chunk_size=chunk_size)(*args, **kwargs)


_EAGER = object()


def vmap(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None):
    """``torch.vmap`` while thunder_rs traces: batches calls on proxies with this module's rules."""

    def batched(*args, **kwargs):
        if active_recorder() is not None:  # real tensors the program captured are trace inputs too
            args, kwargs = lift_captured(args, kwargs)
        if not (_traced(args) or _traced(kwargs)):
            return vmap_impl(func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs)  # functorch's
        if isinstance(func, functorch_calls.Transformed) and func.name not in functorch_calls.TRACED_IN_VMAP:
            return functorch_calls.vmapped(func, in_dims, out_dims, randomness, chunk_size, args, kwargs)
        if randomness not in ("error", "different", "same"):
            raise ThunderValueError(
                f"torch.vmap: randomness must be 'error', 'different' or 'same', got {randomness!r} "
                f"at {user_location()}"
            )
        inner, size = _enter(args, in_dims)
        draws = vmap_state.draws.get()
        tokens = _levels.set((*_levels.get(), size)), _randomness.set((*_randomness.get(), randomness))
        try:
            out = func(*inner, **kwargs)
        except functorch_calls.MapsATransform:
            out = _EAGER  # (the level closes first: the values it batched are the call's arguments again)
        finally:
            _levels.reset(tokens[0])
            _randomness.reset(tokens[1])
        if out is _EAGER:  # a torch.func transform of the batched values: the whole vmap runs eagerly
            if vmap_state.draws.get() != draws:
                raise ThunderNotImplementedError(
                    f"torch.vmap at {user_location()}: its function draws random numbers and then transforms the "
                    "values it batches (torch.func), which runs the whole vmap eagerly: the draws traced so far "
                    "would be drawn again; draw outside the vmap"
                )
            return functorch_calls.vmapped(func, in_dims, out_dims, randomness, chunk_size, args, kwargs)
        return _exit_all(out, out_dims, size, len(_levels.get()) + 1)

    return batched


# -- functorch's vmap as Dynamo records it ---------------------------------------------------------
#
# Dynamo inlines ``torch.vmap`` into its graphs as functorch's level calls
# (``torch._functorch.predispatch``): ``_vmap_increment_nesting(size, randomness)``, then
# ``_add_batch_dim(x, in_dim, level)`` for each mapped input, the function's ops, then
# ``_remove_batch_dim(y, level, size, out_dim)`` for each output and ``_vmap_decrement_nesting()``.
# While thunder_rs traces such a graph they open and close a level of this module's vmap, so the
# ops between them are batched by the same rules as a ``torch.vmap`` call in a program.

#: functorch's level number for each active level (None until an ``_add_batch_dim`` names it):
#: the graph's numbers are those Dynamo saw, which need not be this thread's.
_level_ids: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_vmap_level_ids", default=())


@contextlib.contextmanager
def level_scope():
    """No vmap level active inside, and none left behind: a graph that fails between
    ``_vmap_increment_nesting`` and ``_vmap_decrement_nesting`` leaves its level open."""
    tokens = _levels.set(()), _level_ids.set(()), _randomness.set(())
    try:
        yield
    finally:
        _levels.reset(tokens[0])
        _level_ids.reset(tokens[1])
        _randomness.reset(tokens[2])


def _depth_of(level: int) -> int:
    """The depth (1-based) of the level functorch numbered ``level``; the innermost level takes
    the first number it is called by."""
    ids = _level_ids.get()
    if level in ids:
        return ids.index(level) + 1
    if not ids or ids[-1] is not None:
        raise ThunderValueError(f"torch.vmap: vmap level {level} is not active at {user_location()}")
    _level_ids.set((*ids[:-1], level))
    return len(ids)


def vmap_increment_nesting(batch_size: int, randomness: str) -> int:
    """Opens a level of ``batch_size``; its number is the one the graph names it by next."""
    _levels.set((*_levels.get(), batch_size))
    _level_ids.set((*_level_ids.get(), None))
    _randomness.set((*_randomness.get(), randomness))
    return len(_levels.get())


def add_batch_dim(x, batch_dim: int, level: int):
    """``x`` mapped over its dim ``batch_dim`` by the level numbered ``level``."""
    depth = _depth_of(level)
    if depth != len(_levels.get()):
        raise ThunderNotImplementedError(
            f"torch.vmap: mapping a tensor over level {level}, which is not the innermost, at {user_location()}"
        )
    if active_recorder() is not None:
        (x,), _ = lift_captured((x,), {})
    return _batch(x, batch_dim, depth - 1, _levels.get()[-1])


def remove_batch_dim(x, level: int, batch_size: int, out_dim: int):
    """``x`` seen from outside the level numbered ``level``, its level dim at ``out_dim``."""
    depth = _depth_of(level)
    if depth != len(_levels.get()):
        raise ThunderNotImplementedError(
            f"torch.vmap: leaving level {level}, which is not the innermost, at {user_location()}"
        )
    return _exit(x, out_dim, batch_size, depth)


def vmap_decrement_nesting() -> int:
    """Closes the innermost level."""
    depth = len(_levels.get())
    if depth == 0:
        raise ThunderValueError(f"torch.vmap: no vmap level to close at {user_location()}")
    _levels.set(_levels.get()[:-1])
    _level_ids.set(_level_ids.get()[:-1])
    _randomness.set(_randomness.get()[:-1])
    return depth


def _while_tracing(ours, functorchs):
    """``ours`` while this thread traces, functorch's own otherwise (another thread running a
    Dynamo graph eagerly while the override is installed)."""

    def call(*args):
        return (ours if active_recorder() is not None else functorchs)(*args)

    call.__name__ = functorchs.__name__
    return call


#: What ``torch._functorch.predispatch``'s vmap calls are while thunder_rs traces.
PREDISPATCH = {
    name: _while_tracing(ours, getattr(predispatch, name))
    for name, ours in (
        ("_vmap_increment_nesting", vmap_increment_nesting),
        ("_vmap_decrement_nesting", vmap_decrement_nesting),
        ("_add_batch_dim", add_batch_dim),
        ("_remove_batch_dim", remove_batch_dim),
    )
}
