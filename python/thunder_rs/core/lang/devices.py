"""Devices as eager resolves them: a ``cuda`` device without an index is the CUDA device current
when the call runs (aten's ``ensure_has_index`` in ``Tensor.to``; a factory allocates under the
current device), so a tensor made or moved to ``"cuda"`` is on ``cuda:0`` (or the device
``torch.cuda.set_device`` chose). A program that names one is traced with the index and runs only
while the current device is the one it was traced with (a changed device compiles again), unless
the program chose the device itself before (``torch.cuda.set_device``, inside ``with
torch.cuda.device(i)``: ``acquisition.cuda_state``), where ``cuda`` is the device it chose."""

import threading

import torch

from thunder_rs.core.state.guards import StateGuard
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.state.observe import thread_state
from thunder_rs.errors import ThunderNotImplementedError

__all__ = [
    "choose_device",
    "current_cuda_index",
    "guard_current_device",
    "indexed",
    "leave_device",
    "program_chose_device",
    "refuse_pinned",
]


def current_cuda_index() -> int:
    """The current CUDA device's index; 0 where CUDA is not there (fake CUDA tensors, which
    ``FakeTensorMode`` puts on ``cuda:0``). Read by the guard on every call: once CUDA is
    initialized, without ``torch.cuda.current_device``'s checks (a few microseconds)."""
    if torch.cuda.is_initialized():
        return torch._C._cuda_getDevice()
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


class _Chosen(threading.local):
    """Per thread, for the acquisition of ``observer``: whether its program set the current device
    (``set``) and the device contexts it is inside (``entered``)."""

    observer = None
    set = False
    entered = 0


_chosen = _Chosen()


def _of_this_acquisition() -> _Chosen:
    if _chosen.observer is not thread_state.observer:
        _chosen.observer, _chosen.set, _chosen.entered = thread_state.observer, False, 0
    return _chosen


def choose_device(context: bool) -> None:
    """The program being traced made another device current: for the rest of it (``set_device``),
    or until it leaves the context it entered (``context``)."""
    chosen = _of_this_acquisition()
    if context:
        chosen.entered += 1
    else:
        chosen.set = True


def leave_device() -> None:
    """The program left a device context it entered (``choose_device(context=True)``)."""
    chosen = _of_this_acquisition()
    chosen.entered = max(chosen.entered - 1, 0)


def program_chose_device() -> bool:
    """Whether the current CUDA device is, at this point of the program, one it chose itself:
    what ``cuda`` means there then depends on no state the call begins with."""
    chosen = _of_this_acquisition()
    return chosen.set or chosen.entered > 0


def guard_current_device(index: int) -> None:
    """Guards the current CUDA device the program reads (``index``), unless it chose it itself."""
    observer = thread_state.observer
    if observer is not None and not program_chose_device():
        observer.guard_state(StateGuard("torch.cuda.current_device()", current_cuda_index, index))


def indexed(device: torch.device) -> torch.device:
    """``device`` with its index: a ``cuda`` device without one is the current CUDA device, which
    the traced program's entry then guards."""
    if device.type != "cuda" or device.index is not None:
        return device
    index = current_cuda_index()
    guard_current_device(index)
    return torch.device("cuda", index)


def refuse_pinned(name: str) -> None:
    """Refuses a call of the program that pins host memory (``x.pin_memory()``, a factory's
    ``pin_memory=True``): whether a tensor's storage is pinned is no part of a trace, so a compiled
    call would hand on pageable memory where eager's is pinned (a factory's fill elided into a
    copy of another tensor), or compute where eager, without a GPU, raises."""
    raise ThunderNotImplementedError(
        f"{name} at {user_location()}: pins host memory (pin_memory), which a trace does not represent: a compiled "
        "call could hand on a tensor in pageable memory where eager's is pinned. Pin the tensors outside the jitted "
        "function (a .to('cpu', non_blocking=True) of a CUDA tensor inside it pins its result as eager's does)"
    )
