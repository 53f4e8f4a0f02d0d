"""CUDA events, waits between streams and ``Tensor.record_stream`` in a traced program.

A compiled call queues its kernels as one block on the stream current when it is called, fused and
in another order than eager's program: no point among them stands for a line of the program. So
what marks or orders such a point is refused, naming the line:

- ``torch.cuda.Event(...)`` made by the program (it can only be recorded among its kernels or
  timed), and ``record``, ``wait``, ``query`` and ``elapsed_time`` of an event made outside it
  (tracing would reuse what ``query`` and ``elapsed_time`` read once);
- ``Stream.wait_stream``, ``wait_event``, ``record_event`` and ``query`` (the waits make the
  kernels after the line wait, which the compiled call cannot tell apart);
- the same methods of ``torch.Event`` and ``torch.Stream`` (``torch.accelerator.current_stream()``'s),
  C methods of types no stand-in can change, and their ``synchronize``: ``core.state.cuda_calls``.

A CUDA graph captured or replayed (``with torch.cuda.graph(g)``, ``g.replay()``) is refused too:
tracing would make it once.

``Event.synchronize()`` of an event made outside is made again by every call after it runs, as
``Stream.synchronize`` is (``cuda_state``): the host waits for the work the event holds.
``t.record_stream(s)`` is made again by every call after it runs, on that call's tensor (an extra
output of the trace where the program computed it: the allocator keeps its memory for ``s`` as
eager's does), of ``s``, or of the stream current when the call runs where ``s`` was
``torch.cuda.current_stream()`` (``default_stream()``, ``torch.accelerator.current_stream()``).
"""

import functools
import sys

import torch

from thunder_rs.core.acquisition.effects import TracedValue, recorded_effects
from thunder_rs.core.acquisition.setters import SetterCall, program_of
from thunder_rs.core.state.guards import InputSource
from thunder_rs.core.state.observe import thread_state
from thunder_rs.errors import ThunderNotImplementedError

__all__ = ["PLACES", "record_stream_places"]

_EVENT = "torch.cuda.Event"


#: why a mark among the kernels is refused
_QUEUED = (
    "a compiled call queues its kernels as one block, fused and in another order than eager's, so no point among "
    "them stands for that line. Time or order the jitted call from outside it"
)
#: why a CUDA graph's capture or replay is refused
_GRAPHED = (
    "tracing made it once, and a compiled call would not make it where eager makes it on every call. Capture and "
    "replay graphs outside the jitted function"
)


def _refusal(label: str, why: str, program, tail: str = _QUEUED) -> ThunderNotImplementedError:
    return ThunderNotImplementedError(
        f"{label}: the program {why} at {program.f_code.co_filename}:{program.f_lineno}; {tail}"
    )


def _refused(label: str, why: str, tail: str = _QUEUED):
    def make(real):
        def refuse(*args, **kwargs):
            program = program_of(sys._getframe(1))
            if program is not None:
                raise _refusal(label, why, program, tail)
            return real(*args, **kwargs)

        return refuse

    return make


def _event_new(real):
    def __new__(cls, *args, **kwargs):
        program = program_of(sys._getframe(1))
        if program is not None:
            raise _refusal(_EVENT, "makes a CUDA event", program)
        return real(cls, *args, **kwargs)

    return __new__


def _event_synchronize(real):
    def synchronize(self):
        if program_of(sys._getframe(1)) is None:
            return real(self)
        recorded = recorded_effects()
        if recorded is not None:
            recorded.append(SetterCall(real, (self,)))
        return None

    return synchronize


class _RecordStream:
    """``tensor.record_stream(stream)`` the program made, made again after every call: ``stream``
    an ``InputSource`` for one of the call's arguments (or reached from them), what takes it again
    (``functools.partial``: ``torch.cuda.current_stream(device)``), else itself (read from the
    program's state, whose read the observer guards)."""

    __slots__ = ("real", "tensor", "stream")

    def __init__(self, real, tensor, stream):
        self.real, self.tensor, self.stream = real, tensor, stream

    def effect(self, extras: list):
        return _RecordStream(self.real, TracedValue(self.tensor, extras), self.stream)

    def apply(self, extras, flat) -> None:
        stream = self.stream
        if type(stream) is functools.partial:
            stream = stream()
        elif isinstance(stream, InputSource):
            stream = stream.object(flat)
        self.real(self.tensor.get(extras), stream)


def record_stream_places(taken_again):
    """The place of ``Tensor.record_stream``'s stand-in; ``taken_again(stream)`` is what takes
    ``stream`` again on a call where ``torch.cuda.current_stream`` gave it to the program
    (``cuda_state``), else None."""

    def make(real):
        def record_stream(self, stream):
            if program_of(sys._getframe(1)) is None:
                return real(self, stream)
            recorded = recorded_effects()
            if recorded is not None:
                source = thread_state.observer.state.source_of(stream)
                held = taken_again(stream) or (source if isinstance(source, InputSource) else stream)
                recorded.append(_RecordStream(real, self, held))
            return None

        return record_stream

    return ((torch.Tensor, "record_stream", make),)


#: ``(holder, name, stand-in maker)`` of the functions replaced while a program is traced
PLACES = (
    (torch.cuda.Event, "__new__", _event_new),
    (torch.cuda.Event, "record", _refused(f"{_EVENT}.record", "records a CUDA event")),
    (torch.cuda.Event, "wait", _refused(f"{_EVENT}.wait", "makes a stream wait for a CUDA event")),
    (torch.cuda.Event, "query", _refused(f"{_EVENT}.query", "asks whether a CUDA event's work is done")),
    (torch.cuda.Event, "elapsed_time", _refused(f"{_EVENT}.elapsed_time", "reads the time between CUDA events")),
    (torch.cuda.Event, "synchronize", _event_synchronize),
    (torch.cuda.Stream, "wait_stream", _refused("torch.cuda.Stream.wait_stream", "makes a stream wait for another")),
    (torch.cuda.Stream, "wait_event", _refused("torch.cuda.Stream.wait_event", "makes a stream wait for an event")),
    (torch.cuda.Stream, "record_event", _refused("torch.cuda.Stream.record_event", "records a CUDA event")),
    (torch.cuda.Stream, "query", _refused("torch.cuda.Stream.query", "asks whether a stream's work is done")),
    (torch.cuda.CUDAGraph, "replay", _refused("torch.cuda.CUDAGraph.replay", "replays a CUDA graph", _GRAPHED)),
    (torch.cuda.CUDAGraph, "capture_begin", _refused("torch.cuda.CUDAGraph.capture_begin", "captures", _GRAPHED)),
    (torch.cuda.graph, "__enter__", _refused("torch.cuda.graph", "captures a CUDA graph", _GRAPHED)),
)
