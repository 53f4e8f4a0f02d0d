"""``torch.func.grad`` and ``grad_and_value`` of traced values, traced: the function's calls and
their backward become ops of the program, which thunder_rs compiles as the rest of it.

The function runs on stand-ins of the differentiated arguments that require grad (an alias of
each, recorded as a cast to its own dtype), under ``enable_grad`` as torch.func's transform runs
it; the Rust VJP pass then emits the backward of what it recorded, from a cotangent of ones, into
the program (``Recorder.differentiate``, the same rules the compiled call's backward uses). Once
differentiated, the values it recorded require grad as they do at the level outside the transform
(eager's results carry the outer level's gradients, or none), so that the program's own backward
differentiates the transform (a gradient penalty's second order) and ``requires_grad`` is
eager's.

Under ``torch.vmap`` (per-sample gradients, ``vmap(grad(loss), in_dims=(None, 0, 0))``) the
function runs on the physical tensors of the batching interpreter (``core.lang.vmap``): each
differentiated argument is first expanded over the active levels, so that every example's
gradient is its own, and the backward of the batched ops is the batched backward.

What the trace cannot differentiate (a function whose backward runs eager fallbacks, or that
thunder_rs cannot trace) runs as one eager call instead (``functorch_calls``), as do the transform's
errors (a non-scalar output): ``UNTRACED`` says so, and what was recorded is dropped.
"""

import torch
from torch._C import DisableTorchFunctionSubclass
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs import prims
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang import vmap_state
from thunder_rs.core.lang.recorder import active_recorder, lift_captured, proxies

#: What ``grad`` returns when the call cannot be traced (it then runs as an eager call).
UNTRACED = object()

_SET_REQUIRES_GRAD = torch._C.TensorBase.__dict__["requires_grad"].__set__


class _Untraceable(Exception):
    """The call runs eagerly instead."""


def _batched(x) -> bool:
    return hasattr(x, "physical")  # (a BatchedProxy: ``core.lang.vmap``)


def _full(x, sizes: tuple) -> TensorProxy:
    """``x``'s physical tensor with one leading dim per active level, of that level's size."""
    levels = x.levels if _batched(x) else 0
    phys = x.physical if _batched(x) else x
    shape = tuple(phys.shape)
    phys = phys.reshape(shape[:levels] + (1,) * (len(sizes) - levels) + shape[levels:])
    return phys.expand(*sizes, *shape[levels:])


def _differentiable(rec, x, sizes: tuple):
    """A stand-in of ``x`` that requires grad: an alias of it (of its physical tensor expanded
    over the active levels, under vmap), returned as the function sees it, and that alias."""
    if not isinstance(x, TensorProxy) or not x.dtype.is_floating_point:
        raise _Untraceable  # (torch.func raises its error: the eager call does)
    phys = _full(x, sizes) if sizes else x
    alias = prims.convert_element_type(phys, phys.dtype)
    rec.set_requires_grad(alias._vid, True)
    (alias,) = proxies(rec.tensors([alias._vid]))
    seen = vmap_state.BATCHED[0](alias, len(sizes)) if sizes else alias
    return seen, alias


def _argnums(argnums, count: int) -> tuple:
    nums = (argnums,) if isinstance(argnums, int) else argnums
    if not isinstance(nums, tuple) or not nums or not all(isinstance(n, int) and -count <= n < count for n in nums):
        raise _Untraceable
    return tuple(n % count for n in nums)


def _as_outside(rec, tree) -> None:
    """The flags of ``tree``'s proxies as the level outside sees them (``differentiate`` changed
    them in the trace)."""
    for x in tree_flatten(tree)[0]:
        for p in (x, x.physical) if _batched(x) else (x,):
            if isinstance(p, TensorProxy) and p._vid is not None:
                (meta,) = rec.tensors([p._vid])
                with DisableTorchFunctionSubclass():
                    _SET_REQUIRES_GRAD(p, meta.requires_grad)
        if _batched(x):
            with DisableTorchFunctionSubclass():
                _SET_REQUIRES_GRAD(x, x.physical.requires_grad)


def _run(rec, mark: int, func, argnums, has_aux: bool, args: tuple, kwargs: dict):
    """The traced call: ``(gradients as the arguments' structure, output, aux)``."""
    sizes = vmap_state.levels.get()
    nums = _argnums(argnums, len(args))
    given = list(args)
    aliases: list = []
    specs = []
    with torch.enable_grad():  # (torch.func's grad differentiates under no_grad too)
        for n in nums:
            leaves, spec = tree_flatten(given[n])
            made = [_differentiable(rec, x, sizes) for x in leaves]
            given[n] = tree_unflatten([seen for seen, _ in made], spec)
            aliases.append([alias for _, alias in made])
            specs.append(spec)
        out = func(*given, **kwargs)
    aux = None
    if has_aux:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise _Untraceable
        out, aux = out
    if not isinstance(out, TensorProxy) or out.ndim != 0 or not out.dtype.is_floating_point:
        raise _Untraceable
    phys: TensorProxy = _full(out, sizes) if sizes else out
    seed = torch.ones(tuple(phys.shape), dtype=phys.dtype, device=phys.device)
    assert isinstance(seed, TensorProxy)  # recorded: a creation op while tracing
    flat = [a for group in aliases for a in group]
    grads = rec.differentiate(mark, [(phys._vid, seed._vid)], [a._vid for a in flat], torch.is_grad_enabled())
    grads = [torch.zeros_like(a) if g is None else proxies([g])[0] for g, a in zip(grads, flat)]
    if sizes:
        grads = [vmap_state.BATCHED[0](g, len(sizes)) for g in grads]
    _as_outside(rec, (out, aux))
    it = iter(grads)
    trees = [tree_unflatten([next(it) for _ in group], spec) for group, spec in zip(aliases, specs)]
    return (trees[0] if isinstance(argnums, int) else tuple(trees)), out, aux


def grad(func, argnums, has_aux: bool, with_value: bool, args: tuple, kwargs: dict):
    """``torch.func.grad`` (or ``grad_and_value``) of ``func`` on traced ``args``, traced; or
    ``UNTRACED``, nothing recorded, where it cannot be."""
    rec = active_recorder()
    args, kwargs = lift_captured(args, kwargs)
    mark = rec.mark()
    try:
        grads, out, aux = _run(rec, mark, func, argnums, has_aux, args, kwargs)
    except Exception:  # (the eager call raises eager's error, or computes what tracing cannot)
        rec.rewind(mark)
        return UNTRACED
    if with_value:
        return (grads, (out, aux)) if has_aux else (grads, out)
    return (grads, aux) if has_aux else grads
