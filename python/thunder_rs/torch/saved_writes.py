"""Which in-place writes bump eager's version counter of the memory they write: what
``core.lang.version_tracking`` checks the tensors eager saved for a backward against.

Every in-place op does (under ``torch.no_grad()`` too, and through ``.detach()``, which shares the
counter), except the updates a kernel makes of arguments it writes where autograd does not see
(BatchNorm's running statistics: eager's ``native_batch_norm`` saves them, and a second forward
that updates them leaves that backward valid, which reads them only in eval mode);
``inplace.assign`` says which writes are such updates (``tracked=False``, unless ``versioned``).
A write through ``.data``, whose tensor has a counter of its own, is noted as a write eager's
backward does not check but reads: the compile refuses it where a backward from the program's
outputs reaches a node that saved the tensor (``version_tracking``).
"""

import weakref

import torch

from thunder_rs.core.lang import version_tracking
from thunder_rs.core.lang.langctx import PROPERTY_TO_LTORCH
from thunder_rs.torch import views

#: The view steps of ``.data``: a write through one bumps no version the program's tensors share.
_OWN_COUNTER: weakref.WeakSet = weakref.WeakSet()


def written(dst, op: str, value=None, tracked: bool = True) -> None:
    """An in-place write of ``value`` into ``dst`` by ``op`` that eager counts (see the module doc),
    with the autograd node it gives ``dst``'s memory in eager: none where autograd does not see it
    (not ``tracked``, under ``no_grad``, through ``.detach()``, of tensors that require no grad),
    ``CopySlices`` where it writes through a view, else the node of the call that writes it."""
    link = dst._view
    counted = link is None or not any(step in _OWN_COUNTER for step in link.steps)
    node = None
    if tracked and counted and torch.is_grad_enabled() and not views.detached(dst):
        with torch._C.DisableTorchFunctionSubclass():
            grad = views.root_of(dst).requires_grad or getattr(value, "requires_grad", False)
        node = None if not grad else "call" if link is None else "view"
    version_tracking.written(dst, op, counted, node)
    if counted:
        views.note_version_bump(dst, value)


def _data_view(detach):
    """``.data``: ``detach``'s view, whose step is marked as having a counter of its own."""

    def data(a):
        out = detach(a)
        link = getattr(out, "_view", None)
        if link is not None and out is not a:
            _OWN_COUNTER.add(link.steps[-1])
        return out

    return data


PROPERTY_TO_LTORCH["data"] = _data_view(PROPERTY_TO_LTORCH["data"])  # (``views`` registered it)
assert views.root_of is not None
