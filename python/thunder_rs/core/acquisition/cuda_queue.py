"""Work a traced program puts on the CUDA device queue between its kernels, made at that point of
every call, as eager makes it.

- ``Stream.wait_stream``, ``Stream.wait_event``, ``Stream.record_event``, ``Event.record`` and
  ``Event.wait`` (``torch.cuda``'s) are effect symbols of the trace (``fallback.record_effect``),
  kept in program order by every pass. A trace holding one runs on the per-op executors
  (``fallback.QUEUE_EFFECTS``; ``generate``): its kernels are launched one by one in program
  order, so each wait or mark falls between the kernels eager's falls between (a fusion region
  would move kernels across it).
- ``torch.cuda.Event(...)`` and ``torch.cuda.Stream(...)`` made by the program are made anew by
  every call (an effect, into a ``Made`` the later effects read; a stream on the device current
  then, unless the program chose it), and the event's ``synchronize`` is made in order; one
  returned or stored where it outlives the call is refused, naming the line that made it (a
  compiled call would hand back the one tracing made).
- ``with torch.cuda.stream(s)`` switches the current stream to ``s`` and back as effects, so the
  kernels between are launched on ``s``, as eager's. The backward switches to ``s`` where it reaches
  the block's end and back at its start (``<label>.in_backward``, emitted by the VJP pass), after
  waits between the streams either way: eager's autograd runs each call's backward on the stream
  its forward ran on. The stream is that call's own (``core.lang.queue_values``): one it made or
  took again, whichever thread runs its backward and whenever.
- ``torch.Event(...)`` (a C type, whose ``__new__`` no stand-in replaces: ``torch.Event`` itself
  is replaced while traced, by a class its events are instances of) is made anew by every call, as
  ``torch.cuda.Event``'s are, and refused where it outlives the call.
- A stream the program reads from ``torch.cuda.current_stream()`` (``default_stream()``) is that
  call's current stream (``cuda_state``: what takes it again); one read from state is the one
  read (a guarded read); one passed as an argument is refused, naming the line (the entry is not
  keyed on it).
- ``torch.cuda.nvtx``'s ``range_push``, ``range_pop``, ``mark`` and ``range`` context push, pop
  and mark on every call, in order with the other effects (they do not keep a trace off the
  fusion executors: a profile of the compiled call shows its own kernels inside the ranges).

``query`` and ``elapsed_time`` give the program a value of the call's run, which a trace would
reuse: refused (``cuda_events``).
"""

import functools
import sys
import threading

import torch
from torch.utils import _pytree as pytree

from thunder_rs import _core
from thunder_rs.core.acquisition.effects import recorded_effects, refuse_formatted
from thunder_rs.core.acquisition.setters import SetterCall, program_of
from thunder_rs.core.lang.devices import program_chose_device
from thunder_rs.core.lang import queue_values
from thunder_rs.core.lang.fallback import CALL_EFFECTS, FALLBACK_IMPLS, QUEUE_EFFECTS, record_effect, symbol_id
from thunder_rs.core.lang.rng import STATE_CALLS
from thunder_rs.core.state.guards import InputSource
from thunder_rs.core.state.observe import thread_state
from thunder_rs.errors import UNDO_AFTER_ERROR, ThunderNotImplementedError

__all__ = [
    "Made",
    "forget_made_events",
    "queue_places",
    "refuse_escaped_events",
    "refuse_switched_writes",
    "stream_switch_site",
]


class Made:
    """An event or stream the program makes: every call makes its own (``make``), which the
    effects after it in that call take (``value``); per thread, as calls on two threads make two.
    A call's backward takes its own call's (``queue_values``: on autograd's device thread, or
    after a later call made another); a thread that made none otherwise takes the one made last."""

    __slots__ = ("kind", "kwargs", "last", "local", "where")

    def __init__(self, kind: type, kwargs: dict, where: str):
        self.kind, self.kwargs, self.local, self.where = kind, kwargs, threading.local(), where
        self.last = None

    def make(self) -> None:
        self.local.value = self.last = self.kind(**self.kwargs)

    def value(self):
        return getattr(self.local, "value", self.last)

    def __repr__(self) -> str:
        return f"<the {self.kind.__module__}.{self.kind.__qualname__} made at {self.where}>"


def _now(value):
    """What an effect's argument is in this call: the current stream taken again, the event this
    call made, else itself."""
    kind = type(value)
    if kind is functools.partial:
        return value()
    if kind is Made:
        return value.value()
    return value


def _as_is(value):
    return value


def _noted(value):
    """``_now``, noted for the call's backward where it is the call's own (``queue_values``)."""
    kind = type(value)
    if kind is functools.partial or kind is Made:
        now = value() if kind is functools.partial else value.value()
        queue_values.note(value, now)
        return now
    return value


def _in_this_call(value):
    """What an effect's argument was in the forward of the call whose backward runs: a stream the
    call made or took again is that call's, on whichever thread and whenever its backward runs."""
    kind = type(value)
    if kind is functools.partial or kind is Made:
        found = queue_values.of(value, _now)
        return _now(value) if found is _now else found
    return value


#: label -> the effect's implementation (one symbol each) and the function it runs, a cell
_effects: dict = {}


def _effect(label: str, real, queued: bool = True, now=_now, in_backward=None):
    """The implementation of the effect ``label`` (``torch.cuda.Stream.wait_stream``): ``real``
    called with each call's arguments (``now``). One symbol per label: it runs the function in
    place when the program was last traced (torch's, which a test's runtime may replace). Not
    made where tracing runs the recording so far for a value the program reads (``snapshots``,
    which may run it again from the start): the first call runs the whole program and makes it,
    once, as eager's (``fallback.CALL_EFFECTS``). ``in_backward``: what the backward runs where it
    passes the effect (``<label>.in_backward``, called with the same arguments; ``vjp``), or None."""
    found = _effects.get(label)
    if found is not None:
        found[1][0] = real
        return found[0]
    cell = [real]
    resolve = now if in_backward is None else _noted  # (noted for the call's backward: ``queue_values``)

    def run(*args):
        if not thread_state.inside:  # (else a run of the recording while tracing, for a value read)
            cell[0](*map(resolve, args))

    run.__module__, _, run.__name__ = label.rpartition(".")
    run.__qualname__ = run.__name__
    _effects[label] = (run, cell)
    FALLBACK_IMPLS[symbol_id(run, effect=True)] = run  # (its outputs are none: no flattening per call)
    if in_backward is not None:  # (a backward the program takes itself, torch.func.grad, is traced: run as ``run``)

        def run_in_backward(*args):
            if not thread_state.inside:
                in_backward(*map(_in_this_call, args))

        FALLBACK_IMPLS[_core.register_symbol(f"{label}.in_backward", fallback=True, effect=True)] = run_in_backward
    STATE_CALLS.add(label)
    CALL_EFFECTS.add(label)
    if queued:
        QUEUE_EFFECTS.add(label)
    return run


def _site(program) -> str:
    return f"{program.f_code.co_filename}:{program.f_lineno}"


#: ``id`` -> (event or stream, its ``Made``) of those the programs traced made
_made: dict = {}


#: ``id`` of a tracing's recorded effects (``effects.recorded_effects``, one list per tracing) ->
#: where its program entered ``torch.cuda.stream(s)`` first (``refuse_switched_writes``)
_switched: dict = {}


def forget_made_events() -> None:
    _made.clear()
    _switched.clear()


def stream_switch_site() -> str | None:
    """Where the program traced entered a stream first (``with torch.cuda.stream(s)``), or None."""
    return _switched.get(id(recorded_effects())) if _switched else None


def refuse_switched_writes(site: str | None, writebacks) -> None:
    """Refuses a program that enters a stream at ``site`` and writes its inputs (``writebacks``):
    the compiled call copies the values written back after it runs, on the stream current then,
    where eager's kernels wrote them on the stream entered (a wait for that stream would not cover
    the copies)."""
    if site is not None and writebacks is not None:
        raise ThunderNotImplementedError(
            f"with torch.cuda.stream(...): the program enters a stream at {site} and writes into its inputs, "
            "which a compiled call copies back after running, on the stream current when it is called rather than "
            "on that one. Return the new values, or enter the stream outside the jitted function"
        )


def _held(value, program, label: str, taken_again):
    """What stands for ``value``, a stream or event argument of ``label``, in the trace."""
    if value is None:
        return None
    made = _made.get(id(value))
    if made is not None and made[0] is value:
        return made[1]
    again = taken_again(value)
    if again is not None:
        return again
    observer = thread_state.observer
    if observer is not None and isinstance(observer.state.source_of(value), InputSource):
        raise ThunderNotImplementedError(
            f"{label}: the program passes it a stream or event that is an argument of the call at {_site(program)}; "
            "the compiled call is not made again for another one. Read it from a module attribute or a global, or "
            "make it inside the function"
        )
    return value


def _recorded(label: str, real, program, args: tuple, taken_again) -> None:
    held = tuple(_held(a, program, label, taken_again) for a in args)
    record_effect(_effect(label, real), held, {}, [])


def _queued(label: str, taken_again):
    """A stand-in for a method of a stream or event, recorded as an effect where the program calls it."""

    def make(real):
        def stand_in(self, *args, **kwargs):
            program = program_of(sys._getframe(1))
            if program is None:
                return real(self, *args, **kwargs)
            _recorded(label, real, program, (self, *args, *kwargs.values()), taken_again)
            return None

        return stand_in

    return make


def _note_made(made, kind: type, kwargs: dict, program) -> None:
    """Notes ``made``, an event or stream the program made: every call makes its own, in order."""
    held = Made(kind, kwargs, _site(program))
    _made[id(made)] = (made, held)
    label = f"{kind.__module__.partition('.streams')[0]}.{kind.__qualname__}"
    record_effect(_effect(label, Made.make, False, _as_is), (held,), {}, [])


def _new(names: tuple, device):
    """``torch.cuda.Event.__new__`` or ``torch.cuda.Stream.__new__`` (``names``: its arguments
    by position), made anew by every call where the program makes one; ``device(made, kwargs)``
    the device to make it on (None: the current one)."""

    def make(real):
        def __new__(cls, *args, **kwargs):
            made = real(cls, *args, **kwargs)
            program = program_of(sys._getframe(1))
            if program is None:
                return made
            owner = next(k for k in (torch.cuda.Event, torch.cuda.Stream) if issubclass(cls, k))
            if cls is not owner:
                raise ThunderNotImplementedError(
                    f"{cls.__qualname__}: the program makes one of a subclass of {owner.__qualname__} at "
                    f"{_site(program)}, which a compiled call cannot make anew on every call. Make it outside the "
                    "jitted function"
                )
            kwargs = dict(zip(names, args), **kwargs)
            device(made, kwargs)
            _note_made(made, cls, kwargs, program)
            return made

        return __new__

    return make


def _generic_event(real):
    """``torch.Event`` (a C type, whose ``__new__`` no stand-in replaces): a class that makes
    ``real``'s events, one made by the program anew by every call (``_note_made``; its methods are
    C ones, refused: ``state.cuda_calls``), and for which ``real``'s events are instances."""

    class EventType(type):
        def __instancecheck__(cls, obj) -> bool:
            return isinstance(obj, real)

        def __subclasscheck__(cls, sub) -> bool:
            return issubclass(sub, real)

        def __call__(cls, *args, **kwargs):
            made = real(*args, **kwargs)
            program = program_of(sys._getframe(1))
            if program is not None:
                _note_made(made, real, dict(zip(("device",), args), **kwargs), program)
            return made

    return EventType("Event", (), {"__module__": real.__module__, "__qualname__": real.__qualname__})


def _stream_device(stream, kwargs: dict) -> None:
    """A stream made on the current device is made on the call's, unless the program chose it."""
    if kwargs.get("device") is None and program_chose_device():
        kwargs["device"] = stream.device


def _record_event(taken_again):
    """``Stream.record_event(event=None)``: an event made there where none is given (the
    program's, made anew by every call), then recorded on the stream."""

    def make(real):
        def record_event(self, event=None):
            program = program_of(sys._getframe(1))
            if program is None:
                return real(self, event)
            if event is None:
                event = torch.cuda.Event()
                _note_made(event, torch.cuda.Event, {}, program)
            _recorded("torch.cuda.Stream.record_event", real, program, (self, event), taken_again)
            return event

        return record_event

    return make


def _synchronize(real):
    """``Event.synchronize()``: of an event the program made, in order (the host waits for what
    that call's event holds); of one made outside, made again after the call (as
    ``Stream.synchronize``: ``cuda_state``)."""

    def synchronize(self):
        program = program_of(sys._getframe(1))
        if program is None:
            return real(self)
        made = _made.get(id(self))
        if made is not None and made[0] is self:
            record_effect(_effect("torch.cuda.Event.synchronize", real), (made[1],), {}, [])
        else:
            recorded = recorded_effects()
            if recorded is not None:
                recorded.append(SetterCall(real, (self,)))
        return None

    return synchronize


def refuse_escaped_events(out, stored: list) -> None:
    """Refuses an event or stream the program made, or an nvtx depth (``_Depth``), that it returns or
    stores where it outlives the call (``stored``: the values it writes into its state), naming the
    line that made it."""
    if not (_made or _Depth.made):
        return
    for leaf in pytree.tree_leaves((out, stored)):
        if type(leaf) is _Depth:
            raise ThunderNotImplementedError(
                f"{leaf.label}: the program returns or keeps the depth it returns at {leaf.where}; a compiled "
                "call would hand back tracing's, where eager's is the depth of each call's run. Call it as a statement"
            )
        made = _made.get(id(leaf))
        if made is not None and made[0] is leaf:
            made_kind = made[1].kind
            kind, module = made_kind.__name__, made_kind.__module__.partition(".streams")[0]
            raise ThunderNotImplementedError(
                f"{module}.{kind}: the program returns or keeps the {kind.lower()} it makes at {made[1].where}; a "
                "compiled call would hand back the one tracing made, where eager's makes a new one on every call. "
                f"Make the {kind.lower()} outside the jitted function, or use it only inside"
            )


class _SwitchedStream:
    """``with torch.cuda.stream(s)`` in a call: the contexts entered, per thread (torch's own
    ``__enter__`` and ``__exit__``, taken before any stand-in)."""

    __slots__ = ("local",)

    def __init__(self):
        self.local = threading.local()

    def enter(self, stream) -> None:
        context = torch.cuda.StreamContext(stream)
        _ENTER(context)
        self.local.__dict__.setdefault("contexts", []).append(context)

    def exit(self, stream=None) -> None:
        _EXIT(self.local.contexts.pop(), None, None, None)

    # The backward of a block the program ran on a stream: eager's autograd runs each call's
    # backward on the stream its forward ran on, after what produced its gradients (on the stream
    # current around the block) and before what reads the gradients it produces.

    def join(self, stream) -> None:
        """Where the backward reaches the end of the block: waits for the current stream's work,
        then makes ``stream`` current."""
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        self.enter(stream)

    def leave(self, stream) -> None:
        """Where it reaches the block's start: back to the stream current before, which waits
        for ``stream``'s work."""
        self.exit()
        torch.cuda.current_stream(stream.device).wait_stream(stream)

    def exit_all(self) -> None:
        """Leaves the streams a call that raised entered and did not leave on this thread."""
        contexts = self.local.__dict__.get("contexts")
        while contexts:
            _EXIT(contexts.pop(), None, None, None)


_ENTER, _EXIT = torch.cuda.StreamContext.__enter__, torch.cuda.StreamContext.__exit__
_SWITCHED = _SwitchedStream()
UNDO_AFTER_ERROR.append(_SWITCHED.exit_all)


def _stream_enter(taken_again):
    """``StreamContext.__enter__``: the switch of the current stream recorded where the program
    enters it (tracing does not switch: it launches nothing)."""

    def make(real):
        def __enter__(self):
            program = program_of(sys._getframe(1))
            if program is None or self.stream is None or self.idx == -1:
                return real(self)
            stream = _held(self.stream, program, "with torch.cuda.stream(...)", taken_again)
            _switched.setdefault(id(recorded_effects()), _site(program))
            self._thunder_rs_switched = (stream,)
            enter = _effect("torch.cuda.StreamContext.__enter__", _SWITCHED.enter, in_backward=_SWITCHED.leave)
            record_effect(enter, (stream,), {}, [])
            return None

        return __enter__

    return make


def _stream_exit(real):
    def __exit__(self, *exc):
        stream = self.__dict__.pop("_thunder_rs_switched", None)
        if stream is None:
            return real(self, *exc)
        leave = _effect("torch.cuda.StreamContext.__exit__", _SWITCHED.exit, in_backward=_SWITCHED.join)
        record_effect(leave, stream, {}, [])
        return None

    return __exit__


def _plain_text(label: str, args: tuple, program) -> None:
    """Refuses text for an nvtx range or mark that is not plain (a traced tensor formatted into it)."""
    refuse_formatted(args, f"{label}: the text", _site(program), "pass text that holds no tensor")
    if not all(type(a) is str for a in args):
        raise ThunderNotImplementedError(
            f"{label}: the program passes it a value that is not plain text at {_site(program)}, which a compiled "
            "call cannot make again with later values; pass a str"
        )


def _nvtx_call(label: str):
    """A stand-in for an nvtx function: pushed, popped or marked by every call, in order."""

    def make(real):
        def stand_in(*args):
            program = program_of(sys._getframe(1))
            if program is None:
                return real(*args)
            _plain_text(label, args, program)
            record_effect(_effect(label, real, queued=False), args, {}, [])
            return None if label.endswith(".mark") else _Depth(label, _site(program))

        return stand_in

    return make


class _Depth:
    """What ``range_push`` and ``range_pop`` return in a traced program: the depth of the nvtx
    ranges in a call's run, which a compiled call cannot hand on (it would reuse tracing's); a
    use of it is refused, naming the call's line, and so is returning or keeping it
    (``refuse_escaped_events``). A program that calls them as statements never sees it."""

    __slots__ = ("label", "where")
    made = False  # (whether any was: the escape check walks the results only then)

    def __init__(self, label: str, where: str):
        self.label, self.where = label, where
        _Depth.made = True

    def refuse(self, *args, **kwargs):
        raise ThunderNotImplementedError(
            f"{self.label}: the program uses the depth it returns at {self.where}; a compiled call would give "
            "tracing's, where eager's is the depth of each call's run. Call it as a statement"
        )

    def __repr__(self) -> str:
        return f"<the depth {self.label} returns at {self.where}>"


for _name in (
    *("bool", "int", "index", "float", "complex", "hash", "str", "format", "neg", "pos", "abs", "invert"),
    *("eq", "ne", "lt", "le", "gt", "ge"),
    *(
        f"{r}{op}"
        for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift")
        for r in ("", "r")
    ),
):
    setattr(_Depth, f"__{_name}__", _Depth.refuse)


class _TracedRange:
    """``torch.cuda.nvtx.range(msg)`` the program enters: a push and a pop, as effects."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __enter__(self) -> None:
        record_effect(_effect("torch.cuda.nvtx.range_push", _PUSH, queued=False), (self.text,), {}, [])

    def __exit__(self, *exc) -> None:
        record_effect(_effect("torch.cuda.nvtx.range_pop", _POP, queued=False), (), {}, [])


_PUSH, _POP = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop


def _nvtx_range(real):
    def range(msg, *args, **kwargs):  # noqa: A001 (torch's name)
        program = program_of(sys._getframe(1))
        if program is None:
            return real(msg, *args, **kwargs)
        text = msg.format(*args, **kwargs) if type(msg) is str else msg
        _plain_text("torch.cuda.nvtx.range", (text,), program)
        return _TracedRange(text)

    return range


def _nvtx_refused(label: str):
    def make(real):
        def stand_in(*args, **kwargs):
            program = program_of(sys._getframe(1))
            if program is not None:
                raise ThunderNotImplementedError(
                    f"{label}: the program calls it at {_site(program)}; the range's handle is a value of the call's "
                    "run, which a trace would reuse. Use torch.cuda.nvtx.range_push/range_pop or range there"
                )
            return real(*args, **kwargs)

        return stand_in

    return make


def queue_places(taken_again) -> tuple:
    """``(holder, name, stand-in maker)`` of the functions replaced while a program is traced;
    ``taken_again(stream)`` is what takes ``stream`` again on a call where the program read it
    from ``torch.cuda.current_stream()`` (``cuda_state``), else None."""
    nvtx = torch.cuda.nvtx
    return (
        (torch.cuda.Event, "__new__", _new(("enable_timing", "blocking", "interprocess"), lambda made, kwargs: None)),
        (torch.cuda.Stream, "__new__", _new(("device", "priority"), _stream_device)),
        (torch, "Event", _generic_event),
        (torch.cuda.Event, "record", _queued("torch.cuda.Event.record", taken_again)),
        (torch.cuda.Event, "wait", _queued("torch.cuda.Event.wait", taken_again)),
        (torch.cuda.Event, "synchronize", _synchronize),
        (torch.cuda.Stream, "wait_stream", _queued("torch.cuda.Stream.wait_stream", taken_again)),
        (torch.cuda.Stream, "wait_event", _queued("torch.cuda.Stream.wait_event", taken_again)),
        (torch.cuda.Stream, "record_event", _record_event(taken_again)),
        (torch.cuda.StreamContext, "__enter__", _stream_enter(taken_again)),
        (torch.cuda.StreamContext, "__exit__", _stream_exit),
        (nvtx, "range_push", _nvtx_call("torch.cuda.nvtx.range_push")),
        (nvtx, "range_pop", _nvtx_call("torch.cuda.nvtx.range_pop")),
        (nvtx, "mark", _nvtx_call("torch.cuda.nvtx.mark")),
        (nvtx, "range", _nvtx_range),
        (nvtx, "range_start", _nvtx_refused("torch.cuda.nvtx.range_start")),
        (nvtx, "range_end", _nvtx_refused("torch.cuda.nvtx.range_end")),
    )
