"""The methods of torch's device-generic ``torch.Event`` and ``torch.Stream`` the program calls: C
methods of immutable types, which no stand-in can replace (``torch.cuda.Event``'s and
``torch.cuda.Stream``'s Python methods have stand-ins: ``acquisition.cuda_events``). The observer's
profile hook reports the program's calls of those ``C_CUDA`` names (``hook._dispatch_c_call``), and
``refuse_cuda_call`` refuses them, naming the line: recording an event, a wait between streams or
events, and a query or a timing mark or read a point among the kernels, where a compiled call
queues its kernels as one block, fused and in another order than eager's; a synchronization of
them would be made once, while traced (``torch.cuda.synchronize()`` and
``torch.accelerator.synchronize()`` are made again by every call).
"""

import torch

from thunder_rs.errors import ThunderNotImplementedError

__all__ = ["C_CUDA", "refuse_cuda_call"]

#: owner (a type) -> the names of its C methods whose calls by the program are refused
C_CUDA: dict = {
    torch.Event: frozenset({"record", "wait", "query", "elapsed_time", "synchronize"}),
    torch.Stream: frozenset({"wait_event", "wait_stream", "record_event", "query", "synchronize"}),
}


def refuse_cuda_call(frame, function) -> None:
    """Refuses ``function``, a builtin bound to an instance of one of ``C_CUDA``' owners (or of a
    subclass), called by the program's ``frame``."""
    owner, name = getattr(function, "__self__", None), getattr(function, "__name__", None)
    kind = next((base for base in type(owner).__mro__ if name in C_CUDA.get(base, ())), None)
    if kind is None:
        return
    raise ThunderNotImplementedError(
        f"torch.{kind.__name__}.{name}: the program calls it at {frame.f_code.co_filename}:{frame.f_lineno}; a "
        "compiled call queues its kernels as one block, fused and in another order than eager's, so no point among "
        "them stands for that line, and a synchronization there would be made once. Time or order the jitted call "
        "from outside it (torch.cuda.synchronize() and torch.accelerator.synchronize() inside it are made on every "
        "call)"
    )
