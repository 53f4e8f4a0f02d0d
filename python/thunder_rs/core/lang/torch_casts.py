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
sentinel that only torch's cache holds, which dies as it is cleared (``generation``). A call
checks the caller's modes once for all its casts, and its lookups after the first of a generation
take partners already of the autocast dtype, so that each casts the leaf alone (``read_casts``).
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


def _hit(t: torch.Tensor, now: weakref.ref | None) -> torch.Tensor | None:
    """The cast of ``t`` looked up since torch's cache last changed generation, if any."""
    hit = _looked.get(id(t)) if now is not None else None
    if hit is not None and hit[2] is now and hit[0]() is t:
        return hit[1]()
    return None


def cached_cast(t: torch.Tensor, device_type: str, dtype: torch.dtype) -> torch.Tensor:
    """The cast of the leaf ``t`` that eager's ops of this autocast region read: the one torch's
    cache holds (made now where it holds none, with grad mode on, as torch >= 2.10 makes it)."""
    now = _current()
    cast = _hit(t, now)
    if cast is not None:
        return cast
    cast, marker = _looked_up(t, device_type, dtype, now is None)
    if now is None:  # (the first lookup since torch cleared its cache: its partner's cast marks it)
        now = _new_generation(marker)
    if cast.dtype != dtype:
        raise ThunderRuntimeError(_REFUSED.format(cast.dtype, dtype, cast.dtype))
    _looked[id(t)] = (weakref.ref(t), weakref.ref(cast), now)
    return cast


#: Empty partners in the autocast dtype that require grad, by ``(shape, device, dtype)``: autocast
#: leaves them as they are, so a lookup casts the leaf alone (``read_casts``).
_low_partners: dict = {}
#: The tensors a lookup of ``read_casts`` may be made for: plain ones, no subclass or mode's.
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_dispatch_modes = torch._C._len_torch_dispatch_stack


def _plan(t: torch.Tensor, dtype: torch.dtype) -> tuple | bool:
    """How ``read_casts`` looks up the cast of ``t`` (a leaf of a trace of static sizes, so
    one plan serves each call): ``(mm?, partner in dtype, float32 partner)``, False for other ranks."""
    if t.ndim not in (1, 2):
        return False
    shape = (t.shape[1], 0) if t.ndim == 2 else (0, t.shape[0])
    key = (shape, t.device, dtype)
    low = _low_partners.get(key)
    if low is None:
        low = _low_partners[key] = torch.empty(shape, device=t.device, dtype=dtype, requires_grad=True)
    return t.ndim == 2, low, _partner(t, shape)


#: the probes' ops and the lookups' weak references, bound once
_mm, _matmul, _ref = torch.mm, torch.matmul, weakref.ref


def read_casts(given: list, casts: tuple, plans: list) -> None:
    """Places in ``given`` (a call's inputs) the casts ``casts`` names (``with_cached_casts``), as
    ``cached_cast`` looks them up, its checks of the caller's modes made once per call and the
    partners once per entry (``plans``, by cast). Where the caller's region is as the lookup needs
    (grad mode on, autocast on in the cast's dtype, no modes or saved-tensor hooks), a leaf alone is
    cast through the cache (its partner is of that dtype already), read back from what ``mm`` (a
    matrix) or ``mv`` (a vector) saved; the first lookup of a generation takes the float32 partner,
    whose cast marks it. (Inline, not a function per weight: ~0.4 us a weight less.)"""
    now = _current()
    ready = (
        torch.is_grad_enabled()
        and not _function_modes()
        and not _dispatch_modes()
        and not (_top_hooks(False) is not None and _hooks_enabled())
    )
    device, lower = None, None  # (the autocast dtype of ``device``, None where autocast is off there)
    looked = _looked
    for i, (at, leaf, device_type, dtype) in enumerate(casts):
        t = given[leaf]
        cast = None
        if now is not None and (hit := looked.get(id(t))) is not None and hit[2] is now and hit[0]() is t:
            cast = hit[1]()
        if cast is None and ready and type(t) in _PLAIN:
            if device_type != device:
                device = device_type
                lower = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
            plan = plans[i]
            if plan is None:
                plan = plans[i] = _plan(t, dtype)
            if plan and lower == dtype:  # (of ``dtype``: ``mm`` and ``mv`` take one dtype)
                matrix, low, full = plan
                try:
                    if matrix:
                        node: Any = _mm(t, low if now is not None else full).grad_fn
                    else:
                        node = _matmul(low if now is not None else full, t).grad_fn
                except RuntimeError:  # (mm of two dtypes: ``cached_cast`` raises the error)
                    node = None
                if node is not None:
                    if now is None:
                        now = _new_generation(node._saved_mat2 if matrix else node._saved_self)
                    cast = node._saved_self if matrix else node._saved_vec
                    looked[id(t)] = (_ref(t), _ref(cast), now)
        if cast is None:
            cast = cached_cast(t, device_type, dtype)
            now = _current()
        given[at] = cast


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
    plans: list = [None] * len(casts)

    def call(*inputs):
        given = list(inputs)
        if nesting() > 0:
            read_casts(given, casts, plans)
        else:
            for at, leaf, _, dtype in casts:
                given[at] = _cast_anew(given[leaf], dtype)
        return fn(*given)

    return call
