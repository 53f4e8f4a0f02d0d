"""The Python containers a program changed before its trace failed, left as eager leaves them.

A refusal of thunder_rs's (``ThunderError``) leaves none of the program's changes made: the call
was not made, and the user may run it eagerly. Tracing undoes the items it set in lists and
dicts; a program refused after tracing because it changed in place state it read (a global
``deque.append``, ``set.add``, a list subclass or a list in a global tuple appended to) left the
change made, which is put back (``put_back_refused``).

The program's own error (``raise``, a ``KeyError``) ends eager where it is raised, with what it
changed before made: ``CALLS.append(1)`` (or ``self.steps += 1``) then ``raise`` leaves the item
appended (the attribute set). Tracing undoes
those changes (a call compiled again must find the state as it was), so where the error leaves
the jit they are made again (``errors.settings_made_again``): in lists and dicts of lasting state
(globals, module attributes), of argument objects, and in lists and dicts passed as arguments
(on the caller's, ``argument_containers.arguments_made_again``), and attributes of modules and
state objects (``note_attributes_made``). A change holding a value of the trace (a tensor it
computed, a symbolic size), which eager has but a failed trace does not, cannot be made: the
error then says which containers were left as before the call.
"""

import collections
import functools

from torch.utils import _pytree as pytree

from thunder_rs.core.acquisition.argument_containers import ARGUMENTS_MADE, TracedContainers, write_arguments
from thunder_rs.core.acquisition.written_only import replay
from thunder_rs.core.acquisition.argument_containers import _contents as contents_of
from thunder_rs.core.acquisition.outputs import is_size
from thunder_rs.core.base.proxies import SymbolicSize, TensorProxy
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.core.state.guards import _thawed as thawed
from thunder_rs.core.state.guards import MISSING, DictGuard, InputSource, is_simple
from thunder_rs.core.state.items import changes_in_place, wrapped
from thunder_rs.core.state.modules import attribute_writes as module_writes
from thunder_rs.core.state.reached import _Contents, _changed, _contents, _items, _put_contents, _restore
from thunder_rs.errors import ThunderError, ThunderNotImplementedError, note_made_again


def _traced(value) -> bool:
    """Whether ``value`` holds a value of the trace, which no container of the user's may keep."""
    return any(
        isinstance(leaf, TensorProxy) or type(leaf) in (SymInt, SymFloat, SymbolicSize)
        for leaf in pytree.tree_leaves(value, is_leaf=is_size)
    )


def note_made_before_error(error: BaseException, places, reached, arguments: TracedContainers) -> None:
    """Notes on ``error``, the program's own (not a refusal), the changes it made before raising,
    found now, before tracing undoes them: in lists and dicts of lasting state (``places``: the
    observer's), of argument objects (``reached``) and passed as arguments (``arguments``)."""
    if isinstance(error, ThunderError) or not isinstance(getattr(error, "__dict__", None), dict):
        return
    again: list = []
    left: list = []
    state = [(p.container, p.items, p.at().label) for p in places]
    state += [(c, before, getattr(source, "label", "an argument")) for c, before, source in reached.containers]
    for container, before, label in state:
        if _changed(container, before):
            now = _items(container)
            (left if _traced(now) else again).append((functools.partial(_restore, container, now), label))
    for container, before, source in reached.in_place.values():
        now = _contents(container)
        if now != before:
            (left if _traced(now) else again).append((functools.partial(_put_contents, container, now), source.label))
    writes: list = []
    # (First the writes into containers it only writes into, found where the call had them.)
    for marker, log in arguments.logs:
        if log.ops:
            ok = not _traced(log.ops)
            (writes if ok else left).append(
                (marker.path, log.ops, replay) if ok else (None, arguments.label(marker.kind(), marker.path))
            )
    held = {id(c) for c, _, _ in arguments.found}
    for container, path, before in sorted(arguments.found, key=lambda f: -len(f[1])):
        if _changed(container, before):
            new = contents_of(container, before)
            values = new.values() if isinstance(new, dict) else new
            ok = not _traced(new) and not any(id(v) in held for v in values)
            made = arguments.made(path)
            (writes if ok else left).append((path, new, made) if ok else (None, arguments.label(container, path)))
    if again:
        note_made_again(error, functools.partial(_make, [fn for fn, _ in again]))
    if writes:
        error.__dict__[ARGUMENTS_MADE] = functools.partial(write_arguments, writes)
    if left:
        names = ", ".join(sorted({label for _, label in left}))
        error.__dict__.setdefault("__notes__", []).append(  # (``add_note``, from Python 3.11)
            f"thunder_rs: the traced program changed {names} before this error with values of the trace (a tensor "
            "it computed); they were left as before the call, where eager leaves them changed"
        )


def note_attributes_made(error: BaseException, writes: list, pairs: list, flat_inputs: list) -> None:
    """Notes on ``error``, the program's own, the attributes it set before raising (as
    ``note_made_before_error``): ``writes`` on state objects (``State.writes``, undone), and those
    on the modules it ran (``pairs``: ``(clone, the user's)``, the clone's instance dict changed)."""
    if isinstance(error, ThunderError) or not isinstance(getattr(error, "__dict__", None), dict):
        return
    try:
        writes = module_writes(pairs) + writes
    except Exception:  # (a change of a module's structure, refused had the program not raised: left undone)
        pass
    again: list = []
    left: list = []
    for holder, name, value in writes:
        holder = holder.object(flat_inputs) if isinstance(holder, InputSource) else holder
        (left if _traced(value) else again).append((holder, name, value))
    if again:
        note_made_again(error, functools.partial(_set_attributes, again))
    if left:
        names = ", ".join(sorted({name for _, name, _ in left}))
        error.__dict__.setdefault("__notes__", []).append(
            f"thunder_rs: the traced program set the attributes {names} before this error to values of the trace "
            "(a tensor it computed); they were left as before the call, where eager leaves them set"
        )


def note_tensors_written(error: BaseException, inputs, binding, names: list, in_spec, captures) -> None:
    """Notes on ``error``, the program's own or eager's error raised for it (not a refusal), the
    tensors it wrote in place before raising: arguments, parameters and buffers (``inputs``, a
    ``TracedInputs``) and tensors of its state (``captures``: a global's). The trace failed, so no
    call was made and they keep their values, where eager, raising there, leaves them written: said
    on the error rather than left silently."""
    if isinstance(error, ThunderNotImplementedError) or not isinstance(getattr(error, "__dict__", None), dict):
        return
    written = [(k, p) for k, p in enumerate([*inputs.args, *inputs.params]) if p._vid != p._input_vid]
    held = [p for p in captures.proxies if p._vid != p._input_vid]
    if not written and not held:
        return
    arg_specs, kwarg_spec = in_spec.children()
    owners = [n for n, spec in zip(names, arg_specs.children()) for _ in range(spec.num_leaves)]
    owners += [None] * max(0, arg_specs.num_leaves - len(owners))  # (*args past the named)
    owners += [k for k, spec in zip(kwarg_spec.context, kwarg_spec.children()) for _ in range(spec.num_leaves)]
    described = []
    for k, _ in written:
        if k >= len(inputs.args):
            described.append(f"the module's {binding.qualified[k - len(inputs.args)]}")
        else:
            flat = inputs.positions[k]
            owner = owners[flat] if flat < len(owners) else None
            described.append(f"the argument {owner}" if owner is not None else f"the tensor argument at {flat}")
    described += [f"a tensor of its state of shape {list(p.shape)}" for p in held]
    error.__dict__.setdefault("__notes__", []).append(
        f"thunder_rs: the traced program wrote {', '.join(described)} in place before this error; no call was "
        "made, so they were left as before the call, where eager leaves them written"
    )


def _set_attributes(writes: list) -> None:
    for holder, name, value in writes:
        if value is MISSING:
            if hasattr(holder, name):
                delattr(holder, name)
        else:
            setattr(holder, name, value)


def _make(calls: list) -> None:
    for call in calls:
        call()


def put_back_refused(guards, flat_inputs) -> None:
    """Puts back the containers that ``guards`` (those failing after a trace that is refused for it)
    found changed in place: the refused call leaves none of its changes made."""
    for guard in guards:
        items, expected = getattr(guard, "items", None), getattr(guard, "expected", None)
        if guard.holds(flat_inputs) or getattr(guard, "fresh", False):
            continue
        frozen = getattr(guard, "frozen", None)
        if frozen is not None and type(expected) in (tuple, list) and guard.read(flat_inputs) is expected:
            _put_back_lists(expected, thawed(frozen))  # a list in a tuple compared by value: ``TUP[0].append(1)``
        if type(guard) is DictGuard:  # (an object guarded whole: its plain attributes as they were)
            _put_back_attributes(guard.source.mapping(flat_inputs), guard.found)
            continue
        if items is None or not changes_in_place(expected):
            continue
        if isinstance(expected, dict):
            before = ("dict", *items)
        elif isinstance(expected, memoryview):
            if not expected.readonly and expected.c_contiguous:
                expected.cast("B")[:] = bytes(items)
            continue
        elif isinstance(expected, bytearray):
            before = ("buffer", bytes(items), None)
        elif isinstance(expected, set):
            before = ("set", *items)
        elif isinstance(expected, (list, collections.deque)):
            before = ("items", *items)
        elif wrapped(expected) is not None:
            _put_back_wrapped(expected, items)
            continue
        else:
            continue
        _put_contents(expected, _Contents(before))


def _put_back_attributes(now, found: dict) -> None:
    """Gives an object's attributes ``now`` the plain values ``found`` kept, and removes those it lacked."""
    for name in [k for k in now if k not in found]:
        del now[name]
    for name, value in found.items():
        if is_simple(value) and now.get(name, MISSING) != value:
            now[name] = value


def _put_back_wrapped(container, items: tuple) -> None:
    """Gives the dicts and lists ``container`` keeps its items in (``items.wrapped``) the items
    that ``items`` (``items.members``) found there: a ``ChainMap``'s maps and what they held."""
    count = items[0]
    inner, at = items[1 : 1 + count], 1 + count
    if isinstance(container, collections.ChainMap):
        container.maps = inner[0]
    for m in inner:
        held, at = items[at + 1 : at + 1 + items[at]], at + 1 + items[at]
        if wrapped(m) is not None:
            _put_back_wrapped(m, held)
        elif isinstance(m, dict):
            _put_contents(m, _Contents(("dict", *held)))
        elif isinstance(m, (list, collections.deque)):
            _put_contents(m, _Contents(("items", *held)))


def _put_back_lists(value, before) -> None:
    """Gives the lists in ``value`` (tuples and lists of plain values) the items of ``before``, its
    value when read, keeping the lists that held as many."""
    if type(value) is not type(before) or type(value) not in (tuple, list):
        return
    if len(value) != len(before):
        if type(value) is list:
            value[:] = before
        return
    for i, (item, was) in enumerate(zip(value, before)):
        if type(item) in (tuple, list):
            _put_back_lists(item, was)
        elif type(value) is list and not (type(item) is type(was) and item == was):
            value[i] = was
