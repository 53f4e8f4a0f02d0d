"""CUDA events' and streams' readings, CUDA graphs and ``Tensor.record_stream`` in a traced program.

What gives the program a value of the call's run is refused, naming the line (tracing would reuse
what it read once): ``query`` and ``elapsed_time`` of a ``torch.cuda.Event``, ``Stream.query``, and
the same methods of ``torch.Event`` and ``torch.Stream`` (C methods of types no stand-in can change,
with their ``record``, waits and ``synchronize``: ``core.state.cuda_calls``). Events made, recorded
and waited on, waits between streams and ``with torch.cuda.stream(s)`` are made at their point of
every call: ``cuda_queue``.

A CUDA graph captured or replayed (``with torch.cuda.graph(g)``, ``g.replay()``) is refused too:
tracing would make it once.

``t.record_stream(s)`` is made again by every call after it runs, on that call's tensor (an extra
output of the trace where the program computed it: the allocator keeps its memory for ``s`` as
eager's does), of ``s``, or of the stream current when the call runs where ``s`` was
``torch.cuda.current_stream()`` (``default_stream()``, ``torch.accelerator.current_stream()``).
"""

import functools
import sys

import torch

from thunder_rs.core.acquisition.effects import TracedValue, recorded_effects
from thunder_rs.core.acquisition.setters import program_of
from thunder_rs.core.state.guards import InputSource
from thunder_rs.core.state.observe import thread_state
from thunder_rs.errors import ThunderNotImplementedError

__all__ = ["PLACES", "record_stream_places"]

_EVENT = "torch.cuda.Event"


#: why a reading of the call's run is refused
_QUEUED = (
    "tracing would read it once, and every compiled call would reuse that reading. Time or query the jitted call "
    "from outside it"
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


#: ``(holder, name, stand-in maker)`` of the functions replaced while a program is traced (those
#: that order the device queue: ``cuda_queue``)
PLACES = (
    (torch.cuda.Event, "query", _refused(f"{_EVENT}.query", "asks whether a CUDA event's work is done")),
    (torch.cuda.Event, "elapsed_time", _refused(f"{_EVENT}.elapsed_time", "reads the time between CUDA events")),
    (torch.cuda.Stream, "query", _refused("torch.cuda.Stream.query", "asks whether a stream's work is done")),
    (torch.cuda.CUDAGraph, "replay", _refused("torch.cuda.CUDAGraph.replay", "replays a CUDA graph", _GRAPHED)),
    (torch.cuda.CUDAGraph, "capture_begin", _refused("torch.cuda.CUDAGraph.capture_begin", "captures", _GRAPHED)),
    (torch.cuda.graph, "__enter__", _refused("torch.cuda.graph", "captures a CUDA graph", _GRAPHED)),
)
