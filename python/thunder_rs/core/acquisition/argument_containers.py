"""Lists and dicts passed as arguments that the program changes: a training loop's metrics.

``metrics["loss"] = loss``, ``losses.append(loss)``, ``stats.setdefault(k, [])``, ``del d[k]`` or
``lst[i] = t`` on a list, dict, ``defaultdict`` or ``OrderedDict`` passed as an argument (or
nested in one: ``batch["log"].append(t)``) change the caller's container in eager. Tracing runs
the program on the copies that torch's pytree makes of them (``tree_unflatten``), so the changes
are found after tracing by comparing each copy's items with those it was made with, by identity
(``TracedContainers``). Each changed container's new contents become an effect every call
repeats on that call's container, found at the same place of its arguments (``ArgumentContainer``,
from the call ``hold_call`` notes): items it held before are kept as those objects (``Old``), new
values are stored as the trace made them, tensors each call's (``effects.ContentsWrite``). A
nested container is written before the one holding it, so each is found where the call had it.
The items and keys are part of the cache key (the flatten's spec and leaves): a call finding the
keys or the length the previous one left compiles again, where the program reads them. One the
program's code only writes into (``losses.append(loss)``), or a dict it reads only at constant
keys, is keyed by its type or by those items (``written_only``). A ``deque`` is changed as a
list is (its ``maxlen`` kept). A copy the program returns is returned as the caller's container
(``returned``), as eager returns the one it was given.

A change no call can make again is refused naming the argument and the line: a container of the
arguments stored into another (a compiled call would store a copy), values no compiled call can
store again (an object made in the call), keys that are no plain values; so is a call passing one
container in two places to such a program (``refuse_aliased``), traced as two, or one that an
argument object holds. A call passing one the program also reads as state (a global, an
attribute, a closure variable, or a list held in one) where it changes the one or the other
(``state_held``) runs as eager code (``StateAliased``): the argument was traced apart from the
state, and the program's reads of the one would miss its writes into the other.
"""

import collections
import contextlib
import threading
from typing import Any

import torch
from torch.utils import _pytree as pytree

from thunder_rs.core.base.proxies import SymbolicSize

from thunder_rs.core.acquisition.written_only import Written, replay
from thunder_rs.core.base.userframe import read_site
from thunder_rs.core.state.containers import ContainerAt, _repeatable
from thunder_rs.core.state.guards import CellSource, is_simple
from thunder_rs.core.state.reached import _changed, _items, _restore
from thunder_rs.errors import ThunderNotImplementedError

#: The containers whose copies tracing can change and a call can change again: exact types, as
#: torch's pytree opens them (a subclass is a leaf, or a node of its own).
WRITTEN = (list, dict, collections.defaultdict, collections.OrderedDict, collections.deque)
#: The written containers holding a sequence (the others, mappings).
_SEQUENCES = (list, collections.deque)
#: Containers followed into (tuples: a namedtuple too), as torch's pytree opens them.
_OPENED = (tuple, *WRITTEN)

_call = threading.local()
#: (``hold_call``'s: the arguments of the call whose effects run, as ``held_call.arguments``)
held_call = _call
#: Where a program's own error carries what makes its changes of argument containers again
#: (``failed_state``), a callable of the call's ``(args, kwargs)``.
ARGUMENTS_MADE = "_thunder_rs_arguments_made"


def hold_call(args, kwargs) -> None:
    """Notes the arguments of the call whose effects run next (``release_call`` after them)."""
    _call.arguments = (args, kwargs)


def release_call() -> None:
    _call.arguments = None


class ArgumentContainer:
    """The container at ``path`` of each call's ``(args, kwargs)``; ``label`` names it; ``made(it,
    contents)`` gives it the contents a write made (``replace_contents``; ``merge_contents`` for a
    ``written_only`` projection, ``written_only.replay`` for a ``WriteLog``'s writes)."""

    __slots__ = ("path", "label", "made")

    def __init__(self, path: tuple, label: str, made=None):
        self.path, self.label, self.made = path, label, made if made is not None else replace_contents

    def object(self, flat):
        node = _call.arguments
        for step in self.path:
            node = node[step]
        return node


class Old:
    """The item a container held under ``key`` before the call, kept as that object."""

    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key


class TracedContainers:
    """The lists and dicts of a traced call's ``(args, kwargs)`` (the copies tracing made), each
    with its path and its items then."""

    def __init__(self, args, kwargs, names: list, logs: tuple | list = (), projected: tuple | list = ()):
        #: the names of the positional parameters, for messages
        self.names = names
        #: ``(written_only.Written, written_only.WriteLog)`` of the containers only written into
        self.logs = logs
        #: the paths of the dicts read only at constant keys, traced on their items read (``written_only``)
        self.projected = frozenset(projected)
        self.found: list = []
        for i, value in enumerate(args):
            self._visit(value, (0, i))
        for name, value in kwargs.items():
            self._visit(value, (1, name))

    def _visit(self, x, path: tuple) -> None:
        if type(x) not in _OPENED and not isinstance(x, tuple):
            return
        if type(x) in WRITTEN:
            self.found.append((x, path, _items(x)))
        for key, value in enumerate(x) if isinstance(x, (tuple, *_SEQUENCES)) else x.items():
            self._visit(value, (*path, key))

    def label(self, container, path: tuple) -> str:
        """``the <type> <name>[<key>]`` of the container at ``path``."""
        name = path[1] if path[0] == 1 or path[1] >= len(self.names) else self.names[path[1]]
        return f"the {type(container).__name__} {name}" + "".join(f"[{step!r}]" for step in path[2:])

    def copies(self) -> dict:
        """The ``ArgumentContainer`` finding the caller's container, by the id of its copy."""
        return {id(c): ArgumentContainer(path, self.label(c, path)) for c, path, _ in self.found}

    def returned(self, out):
        """``out`` with each copy it holds (in tuples, lists and dicts) as the ``ArgumentContainer``
        finding the caller's: a call returns that, as eager returns the container it was given.
        (One that an object the program returns holds: ``outputs.flatten_output``'s ``arguments``.)"""
        copies = self.copies()

        def leaf(x) -> bool:  # (a torch.Size whole, as ``outputs.is_size``)
            return id(x) in copies or type(x) is torch.Size or type(x) is SymbolicSize

        if not copies or not any(id(x) in copies for x in pytree.tree_leaves(out, is_leaf=leaf)):
            return out
        return pytree.tree_map(lambda x: copies.get(id(x), x), out, is_leaf=leaf)

    def changes(self, refuse) -> list:
        """``(ArgumentContainer, None, new contents)`` for each container the program changed,
        the deepest first (the copies keep their changes: the program may return them).
        ``refuse(container, path, why)`` raises for a change no call can make again."""
        ids = {id(c) for c, _, _ in self.found}
        writes = []
        for container, path, before in sorted(self.found, key=lambda f: -len(f[1])):
            if not _changed(container, before):
                continue
            contents = _contents(container, before)
            why = _unrepeatable(contents, ids)
            if why is not None:
                refuse(container, path, why)
            writes.append((ArgumentContainer(path, self.label(container, path), self.made(path)), None, contents))
        return writes

    def made(self, path: tuple):
        """What gives the container at ``path`` the contents a call made (``ArgumentContainer.made``)."""
        return merge_contents if path in self.projected else replace_contents

    def logged(self, refuse) -> list:
        """``(ArgumentContainer, None, writes)`` for each ``written_only.WriteLog`` of ``logs``
        the program wrote into, made again in order by every call."""
        ids = {id(c) for c, _, _ in self.found}
        writes = []
        for marker, log in self.logs:
            if not log.ops:
                continue
            for method, value in log.ops:
                why = _unrepeatable({value[0]: value[1]} if method == "setitem" else [value], ids)
                if why is not None:
                    refuse(marker.kind(), marker.path, why)
            label = self.label(marker.kind(), marker.path)
            writes.append((ArgumentContainer(marker.path, label, replay), None, log.ops))
        return writes

    @contextlib.contextmanager
    def as_before(self):
        """The copies as they were made, for the while of the block (then as the program left them)."""
        changed = [(c, before, _items(c)) for c, _, before in self.found if _changed(c, before)]
        for container, before, _ in changed:
            _put(container, before)
        try:
            yield
        finally:
            for container, _, now in changed:
                _put(container, now)


def _put(container, items: tuple) -> None:
    """Gives ``container`` the ``items`` (``_items``) it held."""
    if type(container) is collections.deque:
        container.clear()
        container.extend(items)
    else:
        _restore(container, items)


def _unrepeatable(contents, ids: set) -> str | None:
    """Why the new items of ``contents`` (``_contents``) cannot be stored by every call, or None."""
    for key, value in contents.items() if type(contents) is not list else enumerate(contents):
        if not is_simple(key) and not (type(key) is tuple and all(map(is_simple, key))):
            return f"it stored an item under a key that is no plain value (a {type(key).__name__})"
        if type(value) is Old:
            continue
        if _holds(value, ids):
            return "it stored a list or dict of the arguments in it (a compiled call would store a copy)"
        if not _repeatable(value):
            kind = type(value).__name__
            return f"it stored a value no compiled call can store again in it (a value of type {kind} made by the call)"
    return None


def _holds(value, ids: set) -> bool:
    if id(value) in ids:
        return True
    if isinstance(value, (tuple, list)):
        return any(_holds(v, ids) for v in value)
    return isinstance(value, dict) and any(_holds(v, ids) for v in value.values())


def _contents(container, before: tuple):
    """The new contents of ``container``, with ``Old`` for the items it held ``before``."""
    if type(container) in _SEQUENCES:
        at: dict = {}
        for j, item in enumerate(before):
            at.setdefault(id(item), j)
        return [Old(at[id(v)]) if id(v) in at else v for v in container]
    held = dict(before)
    keys: dict = {}
    for key, item in before:
        keys.setdefault(id(item), key)
    contents = {}
    for key, value in container.items():
        if key in held and held[key] is value:
            contents[key] = Old(key)
        else:
            contents[key] = Old(keys[id(value)]) if id(value) in keys else value
    return contents


def replace_contents(container, contents) -> None:
    """Gives ``container`` the ``contents`` an ``ArgumentContainer`` write made (``Old`` items
    those it holds now)."""
    if type(container) in _SEQUENCES:
        items = list(container)
        new = [items[v.key] if type(v) is Old else v for v in contents]
        container.clear()  # (a deque has no slice assignment; it keeps its ``maxlen``)
        container.extend(new)
        return
    before = dict(container)
    new = [(k, before[v.key] if type(v) is Old else v) for k, v in contents.items()]
    container.clear()
    for key, value in new:
        container[key] = value


def merge_contents(container, contents: dict) -> None:
    """Sets in ``container`` (a dict the program reads only at constant keys) the items of
    ``contents`` it changed, each as eager's ``d[key] = value`` (``Old``: the item it held then
    under that key); its other items stay."""
    before = dict(container)
    for key, value in contents.items():
        if type(value) is not Old:
            container[key] = value
        elif value.key != key:
            container[key] = before[value.key]


def write_arguments(writes: list, args, kwargs) -> None:
    """Gives the containers at the paths of ``writes``, ``(path, contents, made)``, those contents
    (``made``: ``ArgumentContainer.made``)."""
    for path, new, made in writes:
        node = (args, kwargs)
        for step in path:
            node = node[step]
        made(node, new)


def arguments_made_again(error: BaseException, args, kwargs) -> None:
    """Makes again, on the caller's lists and dicts passed as ``args`` and ``kwargs``, the changes
    the program made to them before raising ``error`` (``note_made_before_error``)."""
    again = getattr(error, "__dict__", {}).pop(ARGUMENTS_MADE, None)
    if again is not None:
        again(args, kwargs)


def state_held(places: list, inputs, items: list, objects_hold: list) -> tuple | None:
    """What ``refuse_aliased`` checks a call's arguments against, where the program changes lists,
    dicts or deques of lasting state it read (``items``: the trace's item writes, ``ContainerAt``
    those of state) or of its arguments (``inputs.argument_writes``): ``({id: (container, where,
    origin, name, changed)}, the paths of the arguments' containers the program changes, the
    sources of the containers argument objects hold)``; else None. ``places``:
    ``StateContainers.lasting`` (globals, attributes, closure variables; none a copy tracing made
    of an argument's, ``inputs.argument_copies``), with the lists in a list of plain values (read
    whole, its items unseen); ``objects_hold``: ``ArgumentObjects.containers``,
    found again on every call. Each container is held: its id stays its own while the entry lives."""
    changed = {(id(at.source), at.name) for at, _, _ in items if type(at) is ContainerAt}
    written = frozenset(w[0].path for w in inputs.argument_writes)
    if not changed and not written:
        return None
    held: dict = {}
    for container, source, name, origin in places:
        label = source.label if type(source) is CellSource else name  # (as ``StateContainers.sites``)
        read = (source.describe(name), origin, label, (id(source), name) in changed)
        stack = [(container, read)]
        while stack:
            x, (where, *rest) = stack.pop()
            if id(x) in held or id(x) in inputs.argument_copies:
                continue
            held[id(x)] = (x, where, *rest)
            if is_simple(x):  # (read whole: the lists in it are read unseen; they hold plain values only)
                stack.extend((v, (f"an item of {where}", *rest)) for v in x if type(v) in WRITTEN)
    sources = tuple(source for x, _, source in objects_hold if type(x) in WRITTEN) if written else ()
    return (held, written, sources) if held or sources else None


_NO_STATE: tuple = ({}, frozenset(), ())


def refuse_aliased(args, kwargs, keyed=None, state: tuple | None = None, twice: bool = True, flat=None) -> None:
    """Refuses a call passing one list or dict in two places of its arguments to a program that
    changes such containers (``twice``): tracing changed a copy of each, as if they were two; and
    one passing a list or dict the program also reads as state (``state``: ``state_held``), where
    it changes the one or the other: tracing took them apart, and its reads of the one would miss
    its writes into the other (``flat``: the call's, where argument objects hold containers).
    ``keyed``: the call's ``(args, kwargs)`` as keyed (``written_only``), whose containers only
    written into are not walked (a log of every step's loss), those read at constant keys only at
    the items read. (On every call of such a program: the places are named only for the error.)"""
    seen: dict = {}
    state = state or _NO_STATE
    if twice and state[2] and flat is not None:  # (the containers argument objects hold, as this call's hold them)
        for source in state[2]:
            x = _held_at(source, flat)
            if type(x) in WRITTEN:
                seen.setdefault(id(x), f"{source.label}, reached from the arguments")
    for container, path in _walked(args, kwargs, keyed, []):
        _seen(seen, container, path, state, twice)


def container_places(args, kwargs, keyed: tuple | None = None) -> tuple | None:
    """Where ``refuse_aliased`` finds the containers of the call, as paths into ``(args, kwargs)``:
    the same for every call of one entry, whose key holds the structure of what it walks (the
    pytree spec of the keyed call). None where the walk opens a tuple that torch's pytree keeps
    whole (a subclass, not a namedtuple): what it holds is not in the key."""
    unkeyed: list = []
    places = tuple(path for _, path in _walked(args, kwargs, keyed, unkeyed))
    return None if unkeyed else places


def refuse_aliased_at(places: tuple, args, kwargs, keyed: tuple | None = None) -> None:
    """``refuse_aliased`` of a call whose containers are at ``places`` (``container_places``)."""
    if len(places) < 2:
        return
    call = (args, kwargs)
    found = set()
    for path in places:
        node = call
        for step in path:
            node = node[step]
        found.add(id(node))
    if len(found) < len(places):
        refuse_aliased(args, kwargs, keyed)  # (raises, naming the places)


def _walked(args, kwargs, keyed: tuple | None, unkeyed: list):
    """``(container, path)`` of each list or dict of the call (``refuse_aliased``), the path where
    its argument had it; a tuple opened that torch's pytree keeps whole is noted in ``unkeyed``."""
    walked_args, walked_kwargs = keyed if keyed is not None else (args, kwargs)
    stack: collections.deque[tuple[Any, tuple]] = collections.deque(
        (value, (0, i)) for i, value in enumerate(walked_args) if not _is_tensor(value)
    )
    stack.extend((value, (1, name)) for name, value in walked_kwargs.items())
    while stack:
        x, path = stack.popleft()
        marker = x if type(x) is Written else x[0] if type(x) is tuple and x and type(x[0]) is Written else None
        if marker is not None:  # (the caller's container, as its ``Written`` in the key)
            container = (args, kwargs)
            for step in marker.path:
                container = container[step]
            yield container, path
            if marker.projected:
                stack.extend((value, (*path, key)) for key, value in x[1].items())
            continue
        if type(x) not in _OPENED and not isinstance(x, tuple):
            continue
        if type(x) in WRITTEN:
            yield x, path
        elif type(x) is not tuple and not _opened_by_pytree(x):
            unkeyed.append(path)
        items = enumerate(x) if isinstance(x, (tuple, *_SEQUENCES)) else x.items()
        stack.extend((value, (*path, key)) for key, value in items if not _is_tensor(value))


def _opened_by_pytree(x) -> bool:
    """Whether torch's pytree flattens the tuple ``x`` (a namedtuple, a ``torch.return_types``
    tuple, a registered type): its items are in the cache key."""
    return type(x) in pytree.SUPPORTED_NODES or pytree.is_namedtuple_instance(x) or pytree.is_structseq_instance(x)


def _is_tensor(x) -> bool:
    return type(x) is torch.Tensor or type(x) is torch.nn.Parameter


def _held_at(source, flat):
    """The object at ``source`` (an ``InputSource``) in the call of ``flat``, or None."""
    try:
        return source.object(flat)
    except (LookupError, AttributeError, TypeError):
        return None


class StateAliased(ThunderNotImplementedError):
    """A call passing a list, dict or deque the program also reads as state (``refuse_aliased``),
    which the call then runs as eager code (``call_paths``)."""


def _refuse_state_alias(held: tuple, path: tuple) -> None:
    container, where, origin, name, _ = held
    raise StateAliased(
        f"the {type(container).__name__} at {_place(path)} is also {where}, which the program reads at "
        f"{read_site(origin, name)}; thunder_rs traces an argument's list, dict or deque apart from the state the "
        "program reads, so its reads of the one would miss its writes into the other (eager changes one object)"
    )


def _seen(seen: dict, x, path: tuple, state: tuple, twice: bool) -> None:
    held = state[0].get(id(x))
    if held is not None and (held[4] or path in state[1]):
        _refuse_state_alias(held, path)
    if not twice:
        return
    if id(x) in seen:
        raise ThunderNotImplementedError(
            f"thunder_rs.jit: the {type(x).__name__} at {_place(path)} is also passed at {_place(seen[id(x)])}, to a "
            "program that changes lists or dicts it is given; thunder_rs traced them as distinct containers. Pass "
            "distinct ones"
        )
    seen[id(x)] = path


def _place(path: tuple | str) -> str:
    """``positional argument 1['log']``, ``argument log[0]``: where ``path`` is in a call (a string:
    said already)."""
    if type(path) is str:
        return path
    where = f"positional argument {path[1]}" if path[0] == 0 else f"argument {path[1]}"
    return where + "".join(f"[{step!r}]" for step in path[2:])
