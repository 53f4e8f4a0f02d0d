"""The CUDA device and stream state a traced program sets or reads, as eager sets and reads it.

- ``torch.cuda.set_device(i)`` makes ``i`` current for the rest of the program and after it: made
  while traced (what follows makes its tensors on ``cuda`` there: ``devices.choose_device``), undone
  once tracing ends, and made again by every compiled call after it runs, in order with its other
  effects (``setters.SetterCall``).
- ``with torch.cuda.device(i)`` (``device_of``) makes ``i`` current inside the block only: the
  tensors made on ``cuda`` inside it are traced on ``cuda:i`` and the call begins with no guard for
  them; nothing is left to make again.
- ``torch.cuda.current_device()`` the program reads is guarded (a changed device compiles again),
  unless the program chose the device itself before.
- ``torch.cuda.synchronize()`` and ``Stream.synchronize()`` (``torch.cuda.current_stream()``'s
  or ``default_stream()``'s: of the device current when the call runs) are made again by every
  compiled call after it runs (the host waits for the call's kernels as eager's waited for the
  program's): the device or stream current at that point of eager's call.
- ``with torch.cuda.stream(s)`` and ``torch.cuda.set_stream(s)`` are refused, naming the line: a
  compiled call queues all its kernels on the stream current when it is called.
- ``torch.accelerator``'s ``set_device_index``, ``current_device_index``, ``synchronize``,
  ``current_stream``, ``set_stream`` and ``device_index`` context are the same state, and are
  followed as those are.
- What the program asks of the devices and their allocator (``cuda_queries``) and the events and
  waits between streams it makes (``cuda_events``) are guarded, made again or refused there.

The stand-ins take the places of torch's functions while some program is traced (``put_cuda_state``
from ``stdlib_state``) and act only for the program's own calls (``setters.program_of``);
torch's code calling them (``Stream.__new__`` entering a device context) gets torch's own. A
function of a module the program bound before tracing (``from torch.cuda import current_device``,
which it would call without looking it up in ``torch.cuda``) gets its stand-in where it is bound
(``cached_reads.register_stand_in``).
"""

import functools
import sys
import types

import torch

from thunder_rs.core.acquisition import cuda_events, cuda_queries, cuda_queue
from thunder_rs.core.acquisition.effects import recorded_effects
from thunder_rs.core.acquisition.setters import SetterCall, program_of
from thunder_rs.core.lang.devices import (
    choose_device,
    current_cuda_index,
    guard_current_device,
    leave_device,
    program_chose_device,
)
from thunder_rs.core.state.cached_reads import forget_stand_in, register_stand_in
from thunder_rs.errors import ThunderNotImplementedError

__all__ = ["put_cuda_state", "put_back_cuda_state"]


def _made_again(function, args: tuple) -> None:
    recorded = recorded_effects()
    if recorded is not None:
        recorded.append(SetterCall(function, args))


def _device_index(device, optional: bool = False):
    return torch.cuda._utils._get_device_index(device, optional=optional)


#: what undoes each ``set_device`` made while traced (run backwards once tracing ends)
_undo: list = []


def _set_device(real):
    def set_device(device):
        if program_of(sys._getframe(1)) is None:
            return real(device)
        index = _device_index(device)
        if index < 0:
            return real(device)
        before = current_cuda_index()
        real(index)
        _undo.append(lambda: real(before))
        choose_device(context=False)
        _made_again(real, (index,))
        return None

    return set_device


def _device_enter(real):
    def __enter__(self):
        result = real(self)
        idx = self.idx
        chose = idx is not None and idx >= 0 and program_of(sys._getframe(1)) is not None
        self._thunder_rs_chose = chose
        if chose:
            choose_device(context=True)
        return result

    return __enter__


def _device_exit(real):
    def __exit__(self, *exc):
        result = real(self, *exc)
        if self.__dict__.pop("_thunder_rs_chose", False):
            leave_device()
        return result

    return __exit__


def _current_device(real):
    def current_device():
        index = real()
        if program_of(sys._getframe(1)) is not None:
            guard_current_device(index)
        return index

    return current_device


def _where_chosen(device):
    """The device a synchronization made again after the call names: the one the program chose,
    else ``None`` (the current one then, which the program's ``set_device`` calls made again
    before it have made what eager's was)."""
    if device is None and not program_chose_device():
        return None
    return _device_index(device, optional=True)


def _synchronize(real):
    def synchronize(device=None):
        if program_of(sys._getframe(1)) is None:
            return real(device)
        _made_again(real, (_where_chosen(device),))  # (tracing queued no kernel to wait for)
        return None

    return synchronize


#: ``id`` -> (stream, what takes it again on a call: the function that gave it to the program with
#: the device it was given, ``functools.partial``) of the streams ``torch.cuda.current_stream``,
#: ``torch.cuda.default_stream`` and ``torch.accelerator.current_stream`` gave the programs traced
_current_streams: dict = {}


def _current_stream(real):
    def current_stream(device=None):
        stream = real(device)
        if program_of(sys._getframe(1)) is not None:
            _current_streams[id(stream)] = (stream, functools.partial(real, _where_chosen(device)))
        return stream

    return current_stream


def _synchronize_taken(take) -> None:
    take().synchronize()


def _stream_synchronize(real):
    def synchronize(self):
        if program_of(sys._getframe(1)) is None:
            return real(self)
        held = _current_streams.get(id(self))
        if held is not None and held[0] is self:  # the stream current when the call runs, as eager's
            _made_again(_synchronize_taken, (held[1],))
        else:
            _made_again(real, (self,))
        return None

    return synchronize


def _refused(construct: str, program) -> ThunderNotImplementedError:
    return ThunderNotImplementedError(
        f"{construct}: the program makes another CUDA stream current at {program.f_code.co_filename}:"
        f"{program.f_lineno}; a compiled call queues all of its kernels on the stream current when it is called, "
        "so those eager queues on the stream it names would not be. Enter the stream outside the jitted function"
    )


def _set_stream(real):
    def set_stream(stream):
        program = program_of(sys._getframe(1))
        if program is not None and stream is not None:
            raise _refused(f"{real.__module__}.set_stream", program)
        return real(stream)

    return set_stream


def _current_stream_of(stream):
    """What takes ``stream`` again on a call (``functools.partial``) where ``torch.cuda.current_stream``
    (or ``default_stream``) gave it to the program, else None (``cuda_events``' ``record_stream``)."""
    held = _current_streams.get(id(stream))
    return held[1] if held is not None and held[0] is stream else None


#: ``(holder, name, stand-in maker)`` of the functions replaced while a program is traced
_PLACES = (
    (torch.cuda, "set_device", _set_device),
    (torch.cuda, "current_device", _current_device),
    (torch.cuda, "synchronize", _synchronize),
    (torch.cuda, "current_stream", _current_stream),
    (torch.cuda, "default_stream", _current_stream),
    (torch.cuda, "set_stream", _set_stream),
    (torch.cuda.device, "__enter__", _device_enter),
    (torch.cuda.device, "__exit__", _device_exit),
    (torch.cuda.Stream, "synchronize", _stream_synchronize),
    # (``torch.accelerator``'s, of the CUDA device: the same state through its own functions)
    (torch.accelerator, "set_device_index", _set_device),
    (torch.accelerator, "set_device_idx", _set_device),
    (torch.accelerator, "current_device_index", _current_device),
    (torch.accelerator, "current_device_idx", _current_device),
    (torch.accelerator, "synchronize", _synchronize),
    (torch.accelerator, "set_stream", _set_stream),
    (torch.accelerator, "current_stream", _current_stream),
    (torch.accelerator.device_index, "__enter__", _device_enter),
    (torch.accelerator.device_index, "__exit__", _device_exit),
    *cuda_queries.PLACES,
    *cuda_events.PLACES,
    *cuda_events.record_stream_places(_current_stream_of),
    *cuda_queue.queue_places(_current_stream_of),
)
_ABSENT = object()
#: ``(holder, name, what its ``__dict__`` held, or _ABSENT)`` of those in place now
_replaced: list = []


def put_cuda_state() -> None:
    """Puts the stand-ins in, around the functions in place now (while some program is traced);
    a module's are also put where the program bound them before (``from torch.cuda import
    current_device``: ``cached_reads.register_stand_in``)."""
    if _replaced:
        return
    bound: set = set()  # (a function two modules hold, torch.cuda's and torch.cuda.memory's: the first's)
    for holder, name, make in _PLACES:
        real = getattr(holder, name)
        _replaced.append((holder, name, vars(holder).get(name, _ABSENT), real))
        stand_in = make(real)
        setattr(holder, name, stand_in)
        if isinstance(holder, types.ModuleType) and id(real) not in bound:
            bound.add(id(real))
            register_stand_in(real, stand_in)


def put_back_cuda_state() -> None:
    """Puts torch's functions back and the current devices as they were before tracing (every
    call, the first one too, sets them again after running)."""
    while _replaced:
        holder, name, held, real = _replaced.pop()
        if held is _ABSENT:
            delattr(holder, name)
        else:
            setattr(holder, name, held)
        if isinstance(holder, types.ModuleType):
            forget_stand_in(real)
    while _undo:
        _undo.pop()()
    _current_streams.clear()
    cuda_queue.forget_made_events()
