"""The methods of torch's device-generic ``torch.Event`` and ``torch.Stream`` the program calls: C
methods of immutable types, which no stand-in can replace (``torch.cuda.Event``'s and
``torch.cuda.Stream``'s Python methods have stand-ins: ``acquisition.cuda_events``). The observer's
profile hook reports the program's calls of those ``C_CUDA`` names (``hook._dispatch_c_call``), and
``refuse_cuda_call`` refuses them, naming the line: recording an event, a wait between streams or
events, and a query or a timing mark or read a point among the kernels, where a compiled call
queues its kernels as one block, fused and in another order than eager's; a synchronization of
them would be made once, while traced (``torch.cuda.synchronize()`` and
``torch.accelerator.synchronize()`` are made again by every call). ``with`` a ``torch.Stream`` (or a
``torch.cuda.Stream``) is refused as its ``__exit__`` is called: its C ``__enter__`` made the stream
current, which a compiled call would not (``torch.cuda.stream(s)`` is made on every call:
``acquisition.cuda_queue``).
"""

import torch

from thunder_rs.errors import ThunderNotImplementedError

__all__ = ["C_CUDA", "refuse_cuda_call"]

#: owner (a type) -> the names of its C methods whose calls by the program are refused
C_CUDA: dict = {
    torch.Event: frozenset({"record", "wait", "query", "elapsed_time", "synchronize"}),
    torch.Stream: frozenset({"wait_event", "wait_stream", "record_event", "query", "synchronize", "__exit__"}),
}


def refuse_cuda_call(frame, function) -> None:
    """Refuses ``function``, a builtin bound to an instance of one of ``C_CUDA``' owners (or of a
    subclass), called by the program's ``frame``."""
    owner, name = getattr(function, "__self__", None), getattr(function, "__name__", None)
    kind = next((base for base in type(owner).__mro__ if name in C_CUDA.get(base, ())), None)
    if kind is None:
        return
    if name == "__exit__":
        _refuse_entered(frame, function, owner)
        return
    raise ThunderNotImplementedError(
        f"torch.{kind.__name__}.{name}: the program calls it at {frame.f_code.co_filename}:{frame.f_lineno}; a "
        "compiled call queues its kernels as one block, fused and in another order than eager's, so no point among "
        "them stands for that line, and a synchronization there would be made once. Time or order the jitted call "
        "from outside it (torch.cuda.synchronize() and torch.accelerator.synchronize() inside it are made on every "
        "call)"
    )


def _refuse_entered(frame, function, stream) -> None:
    """Refuses ``with stream:`` (``torch.Stream.__enter__``, a C slot no hook sees, made the stream
    current while traced; its ``__exit__`` is seen), after leaving the stream as eager's ``with``
    would. A stream of another device than the accelerator's (the CPU's), whose ``with`` switches
    nothing, is let through."""
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or stream.device.type != accelerator.type:
        return
    function(None, None, None)
    raise ThunderNotImplementedError(
        f"with torch.Stream(...): the program makes another stream current at {frame.f_code.co_filename}:"
        f"{frame.f_lineno}; a compiled call would launch the kernels inside on the stream current when it is "
        "called. Use torch.cuda.stream(s) there (made on every call), or enter the stream outside the jitted function"
    )
