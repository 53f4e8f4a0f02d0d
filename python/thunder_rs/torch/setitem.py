"""Indexed assignment while a program is traced: ``a[key] = value`` written through a view for basic
indexing, a ``where`` for one boolean mask, and eager's indexed assignment on a copy for tensor
indices; each value is ``inplace.assign``ed as every in-place call's is."""

import torch

from thunder_rs import clang
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang import values, version_tracking
from thunder_rs.core.lang.fallback import fallback
from thunder_rs.core.lang.langctx import MUTATING, TORCH_TO_LTORCH
from thunder_rs.errors import ThunderNotImplementedError, ThunderTypeError, check
from thunder_rs.torch.elementwise import where
from thunder_rs.torch.indexing import check_mask_shapes, is_basic, key_read_by_values
from thunder_rs.torch.inplace import _read_to_overwrite, assign
from thunder_rs.torch.scatter import masked_put
from thunder_rs.torch.shape import reshape_to

_MASKS = (torch.bool, torch.uint8)


def _is_mask(entry) -> bool:
    return isinstance(entry, torch.Tensor) and entry.dtype in _MASKS


def setitem_on_copy(a, key, value):
    """``a[key] = value`` on a copy of ``a``: indexed assignment by tensors, as one eager fallback."""
    out = a.clone()
    entries = key if type(key) is tuple else (key,)
    if a.is_meta and any(isinstance(e, torch.Tensor) and e.ndim == 0 for e in entries):
        # A 0-dim index tensor is read as a number (``x[x.argmax()] = v``), which a meta tensor
        # has none of: the copy's metadata is all the trace needs; the call checks the value.
        return out
    out[key] = value
    return out


def _drop_leading_ones(value, ndim: int):
    """``value`` without the leading size-one dims beyond ``ndim`` (eager's indexed assignment drops them)."""
    if not isinstance(value, torch.Tensor) or value.ndim <= ndim:
        return value
    lead = 0
    while value.ndim - lead > ndim and value.shape[lead] == 1:
        lead += 1
    return reshape_to(value, value.shape[lead:]) if lead else value


def _selects_all(a, entries: tuple) -> bool:
    """Whether eager's indexed assignment writes into ``a`` itself for the basic ``entries`` (only
    ellipses and slices of whole dims, which its slicing skips), not into a view of it."""
    if not all(e is Ellipsis or type(e) is slice for e in entries):
        return False
    dims = [i for i, e in enumerate(entries) if e is not Ellipsis]
    at = dims if Ellipsis not in entries else [i if i < entries.index(Ellipsis) else i - len(entries) for i in dims]
    return all(_whole(entries[i], a.shape[d]) for i, d in zip(dims, at))


def _whole(s: slice, size) -> bool:
    step_one = s.step is None or (type(s.step) is int and s.step == 1)
    starts = s.start is None or (type(s.start) is int and s.start == 0)
    return step_one and starts and (s.stop is None or (type(s.stop) is int and type(size) is int and s.stop >= size))


def _masked_assign(a, entries: tuple, at: int, value) -> bool:
    """``a[entries] = value`` where ``entries[at]`` is a boolean mask and the others are basic:
    a ``where`` on the view the basic entries select. Only a ``value`` with one element per true
    mask element is data-dependent: where the jit reads values that assignment is left to the
    caller (returns False), elsewhere it is refused."""
    op = "setitem"
    mask = entries[at]
    check_mask_shapes(entries, a)
    basic = entries[:at] + (slice(None),) * mask.ndim + entries[at + 1 :]
    view = TORCH_TO_LTORCH[torch.Tensor.__getitem__](a, basic)
    version_tracking.note_view(torch.Tensor.__getitem__, (a, basic), view, _selects_all(a, basic))
    ellipsis = a.ndim - sum(1 for e in basic if e is not None and e is not Ellipsis)
    start = sum(1 if e is None or isinstance(e, slice) else ellipsis if e is Ellipsis else 0 for e in entries[:at])
    rest = view.ndim - start - mask.ndim
    if isinstance(value, torch.Tensor):
        value = _drop_leading_ones(value, start + 1 + rest)
        at_mask = value.ndim - rest - 1  # the dim of value that lines up with the selected elements
        if at_mask >= 0:
            if value.shape[at_mask] != 1 and values.active() is not None:
                return False
            check(
                value.shape[at_mask] == 1,
                op,
                lambda: (
                    f"a value of shape {list(value.shape)} gives one element per true mask element, which is "
                    "data-dependent; assign a value that broadcasts (argument value)"
                ),
                ThunderNotImplementedError,
            )
        # (a tensor's gradient: the picked rows summed as eager's index_put sums them)
        new = masked_put(_read_to_overwrite(view), mask, clang.maybe_convert(value, view.dtype), start)
    else:
        mask = reshape_to(clang.maybe_convert(mask, torch.bool), (1,) * start + tuple(mask.shape) + (1,) * rest)
        # (eager's gradient of the old values: the gradient with zeros where the mask is, not added to zeros)
        new = where(mask, clang.maybe_convert(value, view.dtype), _read_to_overwrite(view))
    assign(view, new, op, copy=True, overwrite=True)
    return True


def setitem(a, key, value):
    """``a[key] = value``: basic indexing writes through a view, a boolean mask is a ``where``, and
    tensor indices run eager's indexed assignment on a copy."""
    op = "setitem"
    check(isinstance(a, TensorProxy), op, lambda: f"expected a tensor, got {type(a).__name__}", ThunderTypeError)
    entries = key if type(key) is tuple else (key,)
    if all(map(is_basic, entries)):
        view = TORCH_TO_LTORCH[torch.Tensor.__getitem__](a, key)
        version_tracking.note_view(torch.Tensor.__getitem__, (a, key), view, _selects_all(a, entries))
        assign(view, _drop_leading_ones(value, view.ndim), op, copy=True)
        return
    masks = [i for i, e in enumerate(entries) if _is_mask(e)]
    if len(masks) == 1 and all(is_basic(e) for i, e in enumerate(entries) if i != masks[0]):
        if _masked_assign(a, entries, masks[0], value):
            return
    key = key_read_by_values(key, a)  # the masks' nonzero indices, where the jit reads values
    check(
        not any(map(_is_mask, key if type(key) is tuple else (key,))),
        op,
        "a boolean mask together with other tensor or list indices is data-dependent (argument key)",
        ThunderNotImplementedError,
    )
    assign(a, fallback(setitem_on_copy, (a, key, value), {}), op, copy=True)


def _register() -> None:
    TORCH_TO_LTORCH[torch.Tensor.__setitem__] = setitem
    MUTATING.add(torch.Tensor.__setitem__)


_register()
