"""A cache entry: one compiled trace, the conditions under which it may run, and what runs after it.

An entry may run when its key matched (the flat inputs' metadata and global state) and its
``check`` passes: the Python values it was specialised on are unchanged (guards), module
attributes it read are unchanged (re-checked only after some module attribute was written), and
the hooks of the modules it called are the same (re-checked only after a hook was registered or
removed anywhere), and the tensors it read from outside its inputs keep their ``requires_grad`` and
dtype. ``check`` is None when there is nothing to check, so such entries cost nothing.
"""

from dataclasses import dataclass, field
from typing import Any
from operator import attrgetter

from torch.utils.hooks import RemovableHandle as _handles

from thunder_rs.core.acquisition.cache import forward_ad_duals
from thunder_rs.core.state.guard_terms import compile_check
from thunder_rs._core import DictStamps
from thunder_rs.core.state.guards import Guards, StructureGuard, attributes_of
from thunder_rs.core.state.modules import hook_snapshot, hook_stores_in_use, hooks_version, registered_since
from thunder_rs.core.state.modules import write_epoch
from thunder_rs.core.lang.values import ValueTree


@dataclass(eq=False)
class Entry:
    fn: object
    #: the generated source and the file name it was compiled under, to label runtime errors
    source: str
    filename: str
    #: when not None, positions of the flat inputs passed to ``fn``
    positions: tuple | None
    traces: list
    #: the backward's traces, empty for a forward-only entry
    backward_traces: list = field(default_factory=list)
    guards: Guards | None = None
    #: ``check(flat) -> bool``, or None when the entry may always run once its key matched
    check: object = None
    #: ``post(out, flat)`` turns the trace's outputs into the program's (rebuilding structures,
    #: repeating prints and attribute writes), or None when the trace returns them as they are
    post: object = None
    #: whether ``post`` changes containers of the call's arguments (``argument_containers``),
    #: found from the call ``hold_call`` notes
    call_args: bool = False
    #: for such an entry, where its calls hold the containers one must not pass twice
    #: (``argument_containers.container_places``), found on its first call
    container_places: Any = None
    #: the lists and dicts of state the program read that no call may pass as an argument
    #: (``argument_containers.state_held``), or None
    state_aliases: tuple | None = None
    #: the hit counter's value at the entry's last use, for least-recently-used eviction
    last_used: int = 0
    #: the write epoch and the newest change stamp of ``module_dicts`` at which module guards last
    #: held, and the hooks seen then
    epoch: int = -1
    stamp: int = -1
    hooks_id: int = -1
    hooks: tuple = ()
    #: the modules (the user's) whose hooks a call runs, or None when the program calls none
    hook_modules: list | None = None
    #: tensors the program reads from outside its inputs, and their ``captured_meta`` when traced
    captured: tuple = ()
    captured_meta: tuple = ()
    #: ``tail(flat)``: all captured inputs of a call, when argument objects hold some of them
    #: (``Acquired.tail``); None when ``fn`` appends ``captured`` itself
    tail: Any = None
    #: the values the program read from traced tensors (``values.Read``), which ``fn`` checks,
    #: their ``values.decision`` keys, and the ``values.ValueTree`` of the variants of its key
    reads: tuple = ()
    decisions: tuple = ()
    tree: ValueTree | None = None
    #: for an entry compiled with symbolic sizes, its ``dynamic.SymbolicEntry`` and the ``(sizes,
    #: held)`` it was compiled with: a variant for other values read is compiled with them too
    symbolic: object = None
    symbolic_args: tuple = ()
    #: for an entry compiled inside a forward-AD level, ``forward_ad_duals`` of what ``tail`` read then
    held_duals: tuple | None = None

    def why_not(self, flat) -> str:
        """Why ``check`` failed, in words (slow path)."""
        if self.guards is not None:
            reason = self.guards.first_failure(flat)
            if reason is not None:
                return reason
        if self.hook_modules is not None and hook_snapshot(self.hook_modules) != self.hooks:
            return "hooks were registered or removed on the modules the program calls"
        for t, then in zip(self.captured, self.captured_meta):
            now = captured_meta(t)
            if now != then:
                fields = ("requires_grad", "dtype")
                changes = ", ".join(f"{f} {a} -> {b}" for f, a, b in zip(fields, then, now) if a != b)
                return f"a tensor the program reads from outside its inputs changed: {changes}"
        if self.held_duals is not None and forward_ad_duals(self.tail(flat)) != self.held_duals:
            return (
                "which tensors the program reads per call from argument objects or module attributes are forward-AD "
                f"duals changed: {self.held_duals[1]} -> {forward_ad_duals(self.tail(flat))[1]}"
            )
        return "unknown"


#: What a compiled call specialised on for a tensor read from outside the inputs (a global, a
#: closure's, a parameter of a module the program reaches): unfreezing it (``requires_grad_()``)
#: must recompile, or it would get no gradient.
captured_meta = attrgetter("requires_grad", "dtype")


#: ``make_check``'s per-call guards before their first check.
_UNCOMPILED = object()


def _compiled_when_called(guards: list):
    """``compile_check(guards)``, compiled on its first call: module guards run only after a module
    attribute was written, which most entries never see (compiling those of the decode benchmark's
    GPT-2, 81, took 1.1 ms of each 35 ms compile)."""
    compiled: list = []

    def check(flat) -> bool:
        if not compiled:
            compiled.append(compile_check(guards))
        return compiled[0](flat)

    return check if guards else None


def module_dicts(guards: list) -> DictStamps:
    """The dicts behind an entry's module guards: each module's instance dict and its submodule,
    parameter and buffer stores. A write to one that ``nn.Module.__setattr__`` does not see
    (``module.__dict__[k] = v``, ``vars(m)[k] = v``, ``object.__setattr__``) stamps it newer
    (``_core.DictStamps``), which has the next call check the module guards."""
    found: dict = {}
    for guard in guards:
        module = guard.module if isinstance(guard, StructureGuard) else getattr(guard.source, "obj", None)
        attributes = attributes_of(module) if module is not None else None
        if isinstance(attributes, dict):
            found[id(attributes)] = attributes
            for store in ("_modules", "_parameters", "_buffers"):
                if isinstance(held := attributes.get(store), dict):
                    found[id(held)] = held
    return DictStamps(list(found.values()))


def make_check(
    entry: Entry, guards: Guards, traced_from: int = -1, epoch_from: int | None = None, stamp_from: int = -1
):
    """The entry's ``check``: module guards when a module attribute was written, hooks when a hook
    was registered anywhere, the metadata of captured tensors, then the per-call guards.
    ``traced_from`` is ``hooks_version()`` as tracing began: hooks the program registered since on
    the modules it called and left there fail the next call's check (eager's runs them).
    ``epoch_from`` is ``write_epoch`` as tracing began: a module write since (another thread's)
    has the next call check the module guards; ``stamp_from`` is ``modules.dict_stamp()`` then: a
    dict of ``module_dicts`` changed since (through its ``__dict__``) has it check them too.

    Each check reads a counter before what it compares and records that reading: a write another
    thread makes meanwhile moves the counter past it, and the next call compares again."""
    # The per-call guards are compiled when the entry is first checked: most entries a run compiles
    # on its way to a symbolic one (a decode's prompt and first token) serve no later call.
    per_call: Any = _UNCOMPILED if guards.per_call else None
    modules, hooked = _compiled_when_called(guards.modules), entry.hook_modules
    captured = entry.captured
    if captured:
        entry.captured_meta = tuple(map(captured_meta, captured))
    if per_call is None and modules is None and hooked is None and not captured:
        return None
    epoch, newest = write_epoch, module_dicts(guards.modules if modules is not None else []).newest

    def check(flat) -> bool:
        nonlocal per_call
        if captured and tuple(map(captured_meta, captured)) != entry.captured_meta:
            return False
        if modules is not None and ((now := epoch[0]) != entry.epoch or newest() > entry.stamp):
            stamp = newest()  # (read before the guards compare, as the epoch)
            if not modules(flat):
                return False
            entry.epoch, entry.stamp = now, stamp
        if hooked is not None:
            if (version := _handles.next_id) != entry.hooks_id:  # (``hooks_version()``, without its frame)
                if hook_snapshot(hooked) != entry.hooks:
                    return False
                entry.hooks_id = version
            # A removal does not move the version: the stores that had hooks must keep them all.
            for store, n in present:
                if len(store) != n:
                    return False
        if per_call is None:
            return True
        if per_call is _UNCOMPILED:
            per_call = compile_check(guards.per_call)
        return per_call(flat)

    entry.epoch = write_epoch[0] if epoch_from is None else epoch_from
    entry.stamp = stamp_from if stamp_from >= 0 else newest()
    present: tuple = ()
    if hooked is not None:
        version = hooks_version()
        entry.hooks, entry.hooks_id = hook_snapshot(hooked), version
        present = hook_stores_in_use(hooked)
        if traced_from >= 0 and registered_since(hooked, traced_from):
            entry.hooks, entry.hooks_id = (None,), -1  # (no snapshot: compared, and found changed, next call)
    return check


def checking_held_duals(entry: Entry, flat):
    """The ``check`` of ``entry``, compiled inside a forward-AD level, and that the tensors it reads per
    call from argument objects and module attributes (``tail``) are duals of the caller's level
    where they were then (``forward_ad_duals``): ``module.w = make_dual(...)`` after a call with a
    plain ``w`` compiles again, whose trace carries the tangent or refuses the program's dual API
    (the entry of the plain ``w`` dropped it)."""
    check: Any = entry.check
    tail = entry.tail
    duals = entry.held_duals = forward_ad_duals(tail(flat))

    def checked(flat) -> bool:
        return forward_ad_duals(tail(flat)) == duals and (check is None or check(flat))

    return checked


def make_post(structure, effects: list, num_outputs: int):
    """The entry's ``post``, or None when the trace's outputs are the program's. With ``effects``
    the trace returns a tuple: the program's flat outputs, then the tensors the effects take."""
    if not effects:
        return None if structure is None else structure.unflatten
    rebuild = structure.unflatten

    def post(out, flat):
        extras = out[num_outputs:]
        for effect in effects:
            effect.apply(extras, flat)
        return rebuild(out[:num_outputs], flat)

    return post


def first_call(entry: Entry, first) -> None:
    """Makes ``first`` ``entry``'s callable for one call, then its own again (``generate``: the
    call traced returns the outputs its reads computed)."""
    own = entry.fn

    def call(*inputs):
        entry.fn = own
        return first(*inputs)

    entry.fn = call
