"""Running the recording so far where a traced program reads a value (``values``), in segments.

Each read needs the values of the program up to it. Running the recording from its start at
each read costs, over a program with n reads, n times its prefix (a Qwen2-MoE's experts loop reads
once per expert and layer: 136 runs, each compiled and run from the start, for 8 layers). Here
each evaluation runs only the calls no earlier one ran (``Recorder.segment``), on the tensors
those computed, which are kept until the acquisition ends, with the generators as the earlier
segment left them, so the draws are those of a run from the start. Each call of the program runs
once while tracing then, as in eager.

At the end of the trace the calls after the last read run too (``Snapshots.last``, returning only
the program's outputs), and the compiled call of the call traced returns those outputs
(``FirstOutputs``) where no gradient is to be recorded: a first call runs the program once, as
eager does, rather than once while tracing and again compiled (Mask R-CNN's first call at 800 px,
one thread: 9.7 s, now 5.8 s; eager 4.6 s).

Where a call to run again has an effect on state (a random draw in a composite an earlier
segment ran in part, ``torch.manual_seed``), the segment starts over from the program's start.
Kept tensors are memory eager would have freed, in inference: once they pass half of what the
device had free, they are dropped and each later read runs the program from its start, returning
only what it reads (as before segments).
"""

import contextlib
import os

import torch
from torch.utils._python_dispatch import _disable_current_modes

from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.fallback import CALL_EFFECTS
from thunder_rs.core.lang.reads import CHECK
from thunder_rs.core.lang.recorder import active_recorder, current, paused_recording
from thunder_rs.core.lang.value_sizes import CHECK_INTS, CHECK_SIZES
from thunder_rs.core.state.cached_reads import set_eager_caller
from thunder_rs.core.state.observe import thread_state
from thunder_rs.errors import ThunderNotImplementedError

#: the symbols of the checks reads record: they only compare, so they may run again or not at all
_CHECKS = [CHECK, CHECK_SIZES, CHECK_INTS]


class Snapshots:
    """The evaluations of one acquisition's recording. ``run(trace, consts, inputs)`` compiles
    and runs a snapshot's trace (``generate.snapshot_runner``)."""

    def __init__(self, run):
        self._run = run
        #: value id -> the tensor an earlier segment computed for it
        self._known: dict = {}
        #: the generators' states after the last segment (None: as the program starts)
        self._generators: list | None = None
        self._kept: dict = {}  # device -> bytes of kept tensors
        self._budgets: dict = {}  # device -> bytes they may take (``_budget``, when first kept)
        self._segments = True
        #: size value id -> the call's own value of a count traced at another one (``SymbolicSizes``)
        self.actual: dict = {}

    def values(self, wanted: list, inputs: list) -> list:
        """The values of ``wanted`` (value ids) for this call, ``inputs`` being the tensors the
        recording's inputs stand for."""
        known = self._known
        if all(v in known for v in wanted):
            return [known[v] for v in wanted]
        if not self._segments:
            trace = current().snapshot(wanted)
            return self._evaluate(trace, inputs, [*trace.size_inputs(), *trace.float_inputs()])[0]
        added = self._run_segment(wanted, inputs)
        out = [known[v] for v in wanted]
        if self._past_budget(added):
            self.forget()
            self._segments = False
        return out

    def _run_segment(self, wanted: list, inputs: list) -> list:
        """Runs the calls no earlier segment ran; returns the tensors they computed."""
        returned, values, self._generators = self._cut(current().segment, wanted, inputs)
        self._known.update(zip(returned, values))
        return values

    def _cut(self, cut, wanted: list, inputs: list, read: bool = True) -> tuple[list, list, list]:
        """Runs the segment ``cut`` (``Recorder.segment`` or ``last_segment``) makes for
        ``wanted`` (``read`` by the program, not at its end): the value ids it returns, their
        values, and the generators' states after it."""
        segment = cut(wanted, list(self._known), _CHECKS)
        if segment is None:  # an effect would run again: from the start
            self.forget()
            segment = cut(wanted, [], _CHECKS)
            assert segment is not None  # (nothing ran before: nothing runs again)
        trace, taken, known_inputs, sizes, returned = segment
        taking = [*(inputs[i] for i in taken), *(self._known[v] for v in known_inputs)]
        values, generators = self._evaluate(trace, taking, sizes, read)
        return returned, values, generators

    def last(self, wanted: list, inputs: list) -> tuple[list, list] | None:
        """The values of ``wanted`` (the program's outputs, value ids) once the calls no segment
        ran have run (``Recorder.last_segment``: only those values kept), and the generators'
        states after them, as the program leaves them. None where no segment ran (the program
        read no value: the compiled call runs it once) or the kept tensors passed the budget."""
        if self._generators is None or not self._segments:
            return None
        returned, values, generators = self._cut(current().last_segment, wanted, inputs, read=False)
        found = {**self._known, **dict(zip(returned, values))}
        return [found[v] for v in wanted], generators

    def _evaluate(self, trace, inputs: list, size_ids: list, read: bool = True) -> tuple[list, list]:
        """The values ``trace`` returns for ``inputs`` (the recording's size values ``size_ids``
        added: the call's own), and the generators' states after it; the generators are then as
        they were."""
        rec = current()
        consts = list(rec.consts())
        sizes = [self.actual.get(v, _hint(rec.size_value(v))) for v in size_ids]
        draws = trace.has_effects()
        if draws and read:
            refuse_read_after_call_effects(trace)
        with outside_the_trace(draws):
            if draws and self._generators is not None:  # (None from the start, and once past the budget)
                restore_generators(self._generators)
            values = list(self._run(trace, consts, [*inputs, *sizes]))
            # (A trace that draws nothing leaves the generators as the last one that drew: [] if none did.)
            return values, generator_states(consts) if draws else (self._generators or [])

    def _past_budget(self, values: list) -> bool:
        for t in values:
            if isinstance(t, torch.Tensor):
                self._kept[t.device] = self._kept.get(t.device, 0) + t.numel() * t.element_size()
        for device, n in self._kept.items():
            if device not in self._budgets:
                self._budgets[device] = _budget(device)
            if n > self._budgets[device]:
                return True
        return False

    def forget(self) -> None:
        """Drops the tensors kept: the next segment runs from the program's start."""
        self._known.clear()
        self._kept.clear()
        self._generators = None


def _hint(value):
    """A size value's size when traced (a float input's value is itself)."""
    return value if type(value) is float else value.hint


#: What ``FirstOutputs.take`` returns where the call is to run the program.
NOT_TAKEN = object()


class FirstOutputs:
    """The outputs of a compiled call for the call that was traced, computed while tracing it
    (``Snapshots.last``): its first call returns them rather than running the program a second
    time. ``take(inputs)`` returns them once, for the tensors they were computed from (the same
    objects, not written since), leaving the generators as the program leaves them; else
    ``NOT_TAKEN`` (outputs may be None: a program returning only its inputs, whose recording
    returns nothing)."""

    def __init__(self, inputs: list, outputs, generators: list):
        self._inputs = [(t, _version(t)) for t in inputs]
        self._outputs = [(outputs, generators)]

    def take(self, inputs: tuple):
        try:
            outputs, generators = self._outputs.pop()  # (atomic: one call takes them)
        except IndexError:
            return NOT_TAKEN
        mine = self._inputs
        self._inputs = []
        written = (a is not t or v is None or a._version != v for a, (t, v) in zip(inputs, mine))
        if len(inputs) < len(mine) or any(written):
            return NOT_TAKEN
        restore_generators(generators)
        return outputs

    def wrap(self, computation):
        """``computation`` (an entry's trace function), returning these outputs on its first call."""

        def first(*inputs):
            outputs = self.take(inputs)
            return computation(*inputs) if outputs is NOT_TAKEN else outputs

        return first


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter; None for an inference tensor, which has none (``inference_mode``
    allows writes to it that no counter shows, so its first outputs are computed again)."""
    return None if t.is_inference() else t._version


def _budget(device: torch.device) -> int:
    """Bytes of kept tensors allowed on ``device``: half of what is free there."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (AttributeError, ValueError, OSError):  # (no sysconf: not Linux)
        return 1 << 30


@contextlib.contextmanager
def outside_the_trace(draws: bool = True):
    """Runs real computation in the middle of an acquisition: no recording, no torch function
    handling (the language mode, proxies), no guarded reads, no autograd graph, no autocast (the
    snapshot's casts are recorded ops), and, where it may draw random numbers (``draws``), every
    generator as it was before. One that draws nothing leaves the generators alone: setting them
    back would undo what other threads drew meanwhile (a data loader's augmentations, which then
    drew the same numbers again)."""
    states = generator_states(current().consts()) if draws else []
    autocasting = [d for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]
    thread_state.inside += 1
    try:
        for d in autocasting:
            torch.set_autocast_enabled(d, False)
        with paused_recording(), torch._C.DisableTorchFunction(), torch.no_grad():
            yield
    finally:
        for d in autocasting:
            torch.set_autocast_enabled(d, True)
        thread_state.inside -= 1
        restore_generators(states)


def refuse_read_after_call_effects(trace) -> None:
    """Refuses a value read after an effect only a compiled call makes (``fallback.CALL_EFFECTS``:
    a wait, an event, a stream switch, an nvtx range), in ``trace``, the recording so far: a call
    finding another value at the read runs the program again from its start, making it twice."""
    found = CALL_EFFECTS.intersection(trace.all_symbol_names())
    if found:
        raise ThunderNotImplementedError(
            f"{min(found)}: the program reads a tensor's value at {user_location()} after it; a compiled call that "
            "finds another value there runs the program again from its start, which would make it twice. Read the "
            "value before it, or outside the jitted function"
        )


def call_eagerly(fn, args: tuple, kwargs: dict) -> tuple:
    """``fn(*args, **kwargs)`` run as eager runs it, in the middle of an acquisition (a function
    cached by functools that misses its cache: ``core.state.cached_reads``): no recording, no torch
    function handling, the observer not watching, grad mode and autocast as the program set them.
    Returns what it returned and whether it drew random numbers (the generators are then set back:
    the trace's own draws are counted from where the program's call began)."""
    states = generator_states(current().consts() if active_recorder() is not None else ())
    thread_state.inside += 1
    try:
        with paused_recording(), torch._C.DisableTorchFunction():
            result = fn(*args, **kwargs)
            # (the generators' states are real tensors: compared outside the caller's dispatch
            # modes, a FakeTensorMode refusing real tensors among them)
            with _disable_current_modes():
                drew = any(not torch.equal(g.get_state(), state) for g, state in states)
    finally:
        thread_state.inside -= 1
    if drew:
        restore_generators(states)
    return result, drew


set_eager_caller(call_eagerly)


def generator_states(consts) -> list:
    """``(generator, state)`` for each generator a trace may draw from: the default ones, and
    those its calls name (``generator=g``, among its constants)."""
    generators = [torch.default_generator]
    if torch.cuda.is_initialized():
        generators.extend(torch.cuda.default_generators)
    # (``type.__instancecheck__``: torch.Generator's metaclass checks in Python, ~1 us a constant,
    # and this runs around every evaluation of a read: Mask R-CNN's first call, 1670 times)
    generators.extend(c for c in consts if _is_generator(torch.Generator, c))
    return [(g, g.get_state()) for g in generators]


_is_generator = type.__instancecheck__


def restore_generators(states: list) -> None:
    for generator, state in states:
        generator.set_state(state)
