"""Devices as eager resolves them: a ``cuda`` device without an index is the CUDA device current
when the call runs (aten's ``ensure_has_index`` in ``Tensor.to``; a factory allocates under the
current device), so a tensor made or moved to ``"cuda"`` is on ``cuda:0`` (or the device
``torch.cuda.set_device`` chose). A program that names one is traced with the index and runs only
while the current device is the one it was traced with (a changed device compiles again)."""

import torch

from thunder_rs.core.state.guards import StateGuard
from thunder_rs.core.state.observe import thread_state

__all__ = ["current_cuda_index", "indexed"]


def current_cuda_index() -> int:
    """The current CUDA device's index; 0 where CUDA is not there (fake CUDA tensors, which
    ``FakeTensorMode`` puts on ``cuda:0``). Read by the guard on every call: once CUDA is
    initialized, without ``torch.cuda.current_device``'s checks (a few microseconds)."""
    if torch.cuda.is_initialized():
        return torch._C._cuda_getDevice()
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


def indexed(device: torch.device) -> torch.device:
    """``device`` with its index: a ``cuda`` device without one is the current CUDA device, which
    the traced program's entry then guards."""
    if device.type != "cuda" or device.index is not None:
        return device
    index = current_cuda_index()
    observer = thread_state.observer
    if observer is not None:
        observer.guard_state(StateGuard("torch.cuda.current_device()", current_cuda_index, index))
    return torch.device("cuda", index)
