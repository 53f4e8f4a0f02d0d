"""The casts torch's autocast cache holds, read from Python.

Inside ``torch.autocast`` eager casts a float32 leaf that requires grad to the autocast dtype
once per region (``at::autocast::cached_cast``): every op of the region, in any compiled call or
outside them, reads that one tensor, so the backward sums the uses' gradients in the autocast
dtype at its ``ToCopyBackward0`` and casts the sum once. A compiled call takes such a cast of its
input as an input of its own (``autocast._lifted``), looked up here as the call begins.

torch binds no lookup of its cache (``_autocast_to_reduced_precision`` casts anew each time), so
an op autocast casts through the cache runs on the tensor and an empty partner, with autocast,
its dtype and grad mode set as the lookup needs, and the cast is read back from what its
backward saved. The cache holds the cast until torch clears it (as the outermost region is left,
or ``torch.clear_autocast_cache()``); the lookups are remembered until then, told by a cast of a
sentinel that only torch's cache holds, which dies as it is cleared (``generation``).
"""

import weakref
from typing import Any

import torch

from thunder_rs.errors import ThunderRuntimeError

_set_grad_enabled = torch._C._set_grad_enabled
_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_push_hooks = torch._C._autograd._push_saved_tensors_default_hooks
_pop_hooks = torch._C._autograd._pop_saved_tensors_default_hooks


_hooks_enabled = torch._C._autograd._saved_tensors_hooks_is_enabled  # type: ignore[attr-defined]
_function_modes = torch._C._is_torch_function_mode_enabled


def _same(x):
    return x


def nesting() -> int:
    """How many autocast regions are entered (torch clears its cache of casts when the count
    returns to 0); torch reads it only as it changes it."""
    level = torch.autocast_decrement_nesting()
    torch.autocast_increment_nesting()
    return level + 1


#: Empty float32 leaves that require grad, the partners of the lookups, by ``(shape, device)``.
_partners: dict = {}


def _partner(t: torch.Tensor, shape: tuple) -> torch.Tensor:
    key = (shape, t.device)
    z = _partners.get(key)
    if z is None:
        z = torch.empty(shape, device=t.device, requires_grad=True)
        if type(z) is torch.Tensor:  # (not one a mode made: a fake tensor is of its mode only)
            _partners[key] = z
    return z


def _saved_casts(t: torch.Tensor, marker: bool = True) -> tuple:
    """The casts of ``t`` and of its partner that an op autocast casts through its cache saves for
    its backward: ``t`` times an empty partner that requires grad (so that the cast of ``t`` is
    saved), ``mm`` by a ``(k, 0)`` matrix for a matrix, ``mv`` of a ``(0, k)`` matrix by a vector,
    else ``linalg.vecdot`` with ``t.ndim + 1`` dims of size 0 or 1. Under the caller's saved-tensor
    hooks the tensors packed are taken (an unpacked one is another)."""
    if _top_hooks(False) is not None and _hooks_enabled():
        packed: list = []

        def pack(x):
            packed.append(x)
            return x

        _push_hooks(pack, _same)
        try:
            torch.linalg.vecdot(t, _partner(t, (0,) + (1,) * t.ndim))
        finally:
            _pop_hooks()
        # (the partner's cast has one dim more)
        return next(x for x in packed if x.ndim == t.ndim), next(x for x in packed if x.ndim > t.ndim)
    if t.ndim == 2:
        node: Any = torch.mm(t, _partner(t, (t.shape[1], 0))).grad_fn
        return node._saved_self, node._saved_mat2 if marker else None
    if t.ndim == 1:  # (an ``mv``: twice as fast as ``vecdot``'s ops)
        node = torch.matmul(_partner(t, (0, t.shape[0])), t).grad_fn
        return node._saved_vec, node._saved_self if marker else None
    node = torch.linalg.vecdot(t, _partner(t, (0,) + (1,) * t.ndim)).grad_fn.next_functions[0][0]
    return node._saved_self, node._saved_other


def _looked_up(t: torch.Tensor, device_type: str, dtype: torch.dtype, marker: bool) -> tuple:
    """The cast of ``t`` to ``dtype`` torch's cache holds, made and cached if it holds none, and
    (``marker``) that of an empty partner, which only the cache holds (``generation``). Grad mode,
    autocast and its dtype are set as the lookup needs only where they differ (inside the
    caller's region they are as it needs)."""
    grad, enabled = torch.is_grad_enabled(), torch.is_autocast_enabled(device_type)
    lower = torch.get_autocast_dtype(device_type)
    if grad and enabled and lower == dtype and not _function_modes():
        return _saved_casts(t, marker)
    _set_grad_enabled(True)
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_dtype(device_type, dtype)
    try:
        with torch._C.DisableTorchFunction():
            return _saved_casts(t, marker)
    finally:
        torch.set_autocast_dtype(device_type, lower)
        torch.set_autocast_enabled(device_type, enabled)
        _set_grad_enabled(grad)


#: A float32 leaf that requires grad, of thunder_rs's own, looked up where no cast marks the
#: contents of torch's cache yet (``generation``).
_SENTINEL: list[torch.Tensor] = []
#: A weak reference to a cast only torch's cache holds (a partner's): alive until it is cleared.
_generation: list = [None]
#: ``id(leaf) -> (weak references to the leaf and to its cast, generation)`` of the casts looked
#: up (weak: eager frees the casts as the region is left).
_looked: dict = {}


def _current() -> weakref.ref | None:
    ref = _generation[0]
    return ref if ref is not None and ref() is not None else None


def _new_generation(marker: torch.Tensor) -> weakref.ref:
    _looked.clear()
    ref = _generation[0] = weakref.ref(marker)
    return ref


def generation() -> weakref.ref:
    """The contents of torch's cache now: a weak reference to a cast only the cache holds, the
    same object until torch clears the cache."""
    ref = _current()
    if ref is not None:
        return ref
    sentinel = (
        _SENTINEL[0] if _SENTINEL else torch.ones(1, 1, device="cpu", requires_grad=True)
    )  # (on the CPU, whatever default device a mode sets)
    if not _SENTINEL and type(sentinel) is torch.Tensor:  # (not one a mode made: a fake tensor is of its mode only)
        _SENTINEL.append(sentinel)
    return _new_generation(_looked_up(sentinel, "cpu", torch.bfloat16, True)[1])


_REFUSED = (
    "autocast: torch's cache of autocast casts holds a {} cast of a weight that a thunder_rs-compiled call, traced "
    "where it held none, casts to {} (an enclosing region of another dtype cast it first); eager would read the {} "
    "cast. Use one autocast dtype per region, or torch.autocast(..., cache_enabled=False)"
)


def cached_cast(t: torch.Tensor, device_type: str, dtype: torch.dtype) -> torch.Tensor:
    """The cast of the leaf ``t`` that eager's ops of this autocast region read: the one torch's
    cache holds (made now where it holds none, with grad mode on, as torch >= 2.10 makes it)."""
    now = _current()
    hit = _looked.get(id(t)) if now is not None else None
    if hit is not None and hit[2] is now and hit[0]() is t:
        cast = hit[1]()
        if cast is not None:
            return cast
    cast, marker = _looked_up(t, device_type, dtype, now is None)
    if now is None:  # (the first lookup since torch cleared its cache: its partner's cast marks it)
        now = _new_generation(marker)
    if cast.dtype != dtype:
        raise ThunderRuntimeError(_REFUSED.format(cast.dtype, dtype, cast.dtype))
    _looked[id(t)] = (weakref.ref(t), weakref.ref(cast), now)
    return cast


def _cast_anew(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` cast to ``dtype`` with grad mode on, as torch's cache makes its casts."""
    grad = torch.is_grad_enabled()
    _set_grad_enabled(True)
    try:
        with torch._C.DisableTorchFunction():
            return t.to(dtype)
    finally:
        _set_grad_enabled(grad)


def with_cached_casts(fn, casts: tuple):
    """``fn`` given, at each position ``at`` of ``casts`` (``(at, leaf position, device type,
    dtype)``, in the trace's input order), torch's cached cast of its input at the leaf position,
    in place of the stand-in the captured inputs hold there. Called outside any region (traced in
    one the caller entered with autocast off, the program entering its own), a cast of its own:
    the program's region is the outermost, whose casts eager's cache drops as it is left."""

    def call(*inputs):
        given = list(inputs)
        outside = nesting() == 0
        for at, leaf, device_type, dtype in casts:
            given[at] = _cast_anew(given[leaf], dtype) if outside else cached_cast(given[leaf], device_type, dtype)
        return fn(*given)

    return call
