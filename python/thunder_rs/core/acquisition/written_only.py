"""Lists, dicts and deques passed as arguments that the program only writes into: out of the key.

A training loop's log (``log.append(loss)``) or metrics dict (``metrics["loss"] = loss``) grows
with every call. Keyed by its items (``argument_containers``), it would compile on every call,
where eager runs the same code on a longer list. When the code of the jitted function uses a
parameter only as ``p.append(v)``, ``p.extend(v)``, ``p.appendleft(v)``, ``p.extendleft(v)`` or
``p[<constant>] = v`` (``written_uses``, read from its bytecode once), nothing the program computes
depends on what the container holds: a call passing a list, dict or deque that takes those
writes is keyed by the container's type alone (``Written``), the program is traced with a
``WriteLog`` that records the writes in their order, and every call makes them again on its own
container (``replay``), as eager does: a log that grew hits the cache.

A plain dict the code also reads only at constant keys (``stats["n"] += 1``, ``cfg["scale"]``,
``m.get("steps", 0)``, ``m.setdefault("first", None)``: constant defaults, ``[]`` or ``{}``)
is keyed by those items alone: the call passes ``(its Written, a dict of the items read)``, the
program is traced on that dict, and every call sets the items it changed in the caller's dict
(``argument_containers.merge_contents``); its other items (the caller's own) stay out of the
key. An int read there is an int input as any: a counter compiles as a plain int counter does.
An item the code reads only to write into it (``m["grads"].append(g)``,
``m.setdefault("losses", []).append(loss)``) is keyed as a write-only container itself.

A container the call also passes otherwise (twice, inside another argument, held by an argument
object) is refused on every call that passes it (``argument_containers.refuse_aliased``); one the
program also reaches as state (a global, an attribute, a closure variable) makes the call run as
eager code, warned once (``call_paths``): the program's reads of the one would miss its writes
into the stand-in.

A parameter the code reads in any other way (``len(p)``, ``for v in p``, ``p[k]`` with a key
computed, passed to another function, stored, returned, captured by an inner
function) keeps its contents in the key, as before. So does every parameter of a function that reads its
frame's variables (``locals()``, ``vars()``, ``eval``, ``sys._getframe``), and of a module's
``forward`` (its hooks receive the arguments too).
"""

import collections
import dis
import sys
import types

from thunder_rs.core.state.guards import is_simple
from thunder_rs.errors import ThunderNotImplementedError

#: What each container type takes of the writes ``written_uses`` finds.
_TAKES: dict[type, frozenset[str]] = {
    list: frozenset({"append", "extend"}),
    dict: frozenset({"setitem"}),
    collections.defaultdict: frozenset({"setitem"}),
    collections.OrderedDict: frozenset({"setitem"}),
    collections.deque: frozenset({"append", "extend", "appendleft", "extendleft"}),
}
_METHODS = frozenset({"append", "extend", "appendleft", "extendleft"})
#: Names whose use lets a function read its parameters other than through its bytecode's loads.
_FRAME_READERS = frozenset({"locals", "vars", "eval", "exec", "_getframe", "currentframe", "f_locals"})
_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK"})


class Written:
    """The leaf a write-only container becomes in a call's key: one object per container type and
    argument place (kept for the process), so the key holds the type and nothing of the items.
    ``projected``: a dict read at constant keys, passed as ``(its Written, a dict of those items)``."""

    __slots__ = ("kind", "path", "projected", "__weakref__")

    def __init__(self, kind: type, path: tuple, projected: bool):
        self.kind, self.path, self.projected = kind, path, projected

    def __repr__(self) -> str:
        return f"<a {self.kind.__name__} the program only writes into{' or reads at constant keys' * self.projected}>"


_markers: dict = {}


def _marker(kind: type, path: tuple, projected: bool = False) -> Written:
    at = (kind, path, projected)
    found = _markers.get(at)
    return found if found is not None else _markers.setdefault(at, Written(kind, path, projected))


class WriteLog:
    """What the program is traced with in place of a write-only container: its writes, in order,
    as ``(method, value)`` (``("setitem", (key, value))`` for ``p[key] = value``)."""

    __slots__ = ("kind", "ops")

    def __init__(self, kind: type):
        self.kind = kind
        self.ops: list[tuple[str, object]] = []

    def _made(self, method: str, args: tuple, kwargs: dict) -> None:
        if kwargs or len(args) != 1:  # (the container's own method raises eager's error)
            getattr(self.kind(), method)(*args, **kwargs)
        self.ops.append((method, list(args[0]) if method.startswith("extend") else args[0]))

    def append(self, *args, **kwargs) -> None:
        self._made("append", args, kwargs)

    def appendleft(self, *args, **kwargs) -> None:
        self._made("appendleft", args, kwargs)

    def extend(self, *args, **kwargs) -> None:
        self._made("extend", args, kwargs)

    def extendleft(self, *args, **kwargs) -> None:
        self._made("extendleft", args, kwargs)

    def __setitem__(self, key, value) -> None:
        self.ops.append(("setitem", (key, value)))

    def _read(self, what: str):
        raise ThunderNotImplementedError(
            f"thunder_rs.jit: a {self.kind.__name__} the jitted function's code only writes into was read ({what}) "
            "by other code the call ran (through the function's frame): thunder_rs keys and traces it by its writes "
            "alone. Read it in the jitted function itself, or pass what is read as an argument"
        )

    def __len__(self) -> int:
        return self._read("len")

    def __bool__(self) -> bool:
        return self._read("bool")

    def __iter__(self):
        return self._read("iter")

    def __contains__(self, item) -> bool:
        return self._read("in")

    def __getitem__(self, key):
        return self._read("an item")


def replay(container, ops: list) -> None:
    """Makes the writes ``ops`` (a ``WriteLog``'s, with a call's values) on ``container``."""
    for method, value in ops:
        if method == "setitem":
            container[value[0]] = value[1]
        else:
            getattr(container, method)(value)


def write_logs(flat_inputs: list, leaves: list) -> list:
    """Puts a ``WriteLog`` in ``leaves`` in place of each ``Written`` of ``flat_inputs``; returns
    the ``(Written, WriteLog)`` pairs."""
    logs = []
    for i, x in enumerate(flat_inputs):
        if type(x) is Written and not x.projected:
            leaves[i] = WriteLog(x.kind)
            logs.append((x, leaves[i]))
    return logs


def unprojected(args, kwargs, flat_inputs: list) -> tuple:
    """``(args, kwargs, paths)``: the program's arguments, each dict it reads only at constant keys
    (``(Written, items)`` in the call's flatten) as the dict of those items, and their paths."""
    paths = [x.path for x in flat_inputs if type(x) is Written and x.projected]
    if not paths:
        return args, kwargs, paths
    args, kwargs = list(args), dict(kwargs)
    for where, at in paths:
        held = args if where == 0 else kwargs
        held[at] = held[at][1]
    return tuple(args), kwargs, paths


def written_uses(code: types.CodeType) -> dict:
    """``{parameter name: the writes the code makes through it}`` for each parameter the code uses
    only as ``p.append(v)`` and the like (``_uses_of``); the others are left out."""
    if code.co_flags & (0x20 | 0x80 | 0x100 | 0x200) or _FRAME_READERS & set(code.co_names):
        return {}  # (a generator or coroutine; a frame reader)
    count = code.co_argcount + code.co_kwonlyargcount
    params: dict[str, set[str]] = {n: set() for n in code.co_varnames[:count] if n not in code.co_cellvars}
    instructions = list(dis.get_instructions(code))
    for i, ins in enumerate(instructions):
        names = ins.argval if type(ins.argval) is tuple else (ins.argval,)
        for name in [n for n in names if type(n) is str and n in params]:
            if "FAST" not in ins.opname and "DEREF" not in ins.opname and "CLOSURE" not in ins.opname:
                continue  # (a global or attribute of the same name)
            uses = _uses_of(instructions[i + 1 : i + 8]) if ins.opname in _LOADS else None
            if uses is None:
                params.pop(name)
            else:
                params[name].update(uses)
    return {n: frozenset(uses) for n, uses in params.items()}


def _uses_of(after: list) -> tuple | None:
    """What the load of a parameter followed by ``after`` does with it: writes (``"append"``,
    ``"setitem"``), reads of an item by a constant key (``("getitem", key)``: ``p["n"]``,
    ``p["n"] += 1``) and writes into such an item (``("into", key, "append")``: ``p["log"].append(v)``,
    ``p.setdefault("log", []).append(v)``); None for any other use."""
    if after and _is_method_load(after[0]) and after[0].argval in _METHODS:
        return (after[0].argval,)
    if after and _is_method_load(after[0]) and after[0].argval in ("get", "setdefault"):
        key, n = _constant_key_call(after[1:])
        if key is _NO_KEY:
            return None
        if after[0].argval == "get":
            return (("getitem", key),)
        method = after[n + 1] if len(after) > n + 1 else None
        if method is not None and _is_method_load(method) and method.argval in _METHODS:
            return (("into", key, method.argval), "setitem")
        return (("getitem", key), "setitem")
    if len(after) < 2 or after[0].opname != "LOAD_CONST" or not is_simple(after[0].argval):
        return None
    key, ops = after[0].argval, [a.opname for a in after[1:]]
    if ops[0] == "STORE_SUBSCR":
        return ("setitem",)
    if ops[0] == "BINARY_SUBSCR" and len(after) > 2 and _is_method_load(after[2]) and after[2].argval in _METHODS:
        return (("into", key, after[2].argval),)
    if ops[0] == "BINARY_SUBSCR":
        return (("getitem", key),)
    if ops[:3] == ["COPY", "COPY", "BINARY_SUBSCR"] and after[1].arg == after[2].arg == 2:  # (``p[k] += v``)
        return (("getitem", key), "setitem")
    return None


_NO_KEY = object()
#: Arguments after a constant key that leave it the key: a constant, an empty list or dict.
_PLAIN_DEFAULTS = {"LOAD_CONST": None, "BUILD_LIST": 0, "BUILD_MAP": 0}


def _constant_key_call(args: list) -> tuple:
    """``(key, where the call ends in args)`` of a call ``p.get(<constant>)``, ``p.get(<constant>,
    <constant>)`` or ``p.setdefault(<constant>, [])`` whose argument instructions are ``args``, or
    ``(_NO_KEY, 0)``."""
    if not args or args[0].opname != "LOAD_CONST" or not is_simple(args[0].argval):
        return _NO_KEY, 0
    n = 1
    if len(args) > 1 and args[1].opname in _PLAIN_DEFAULTS and _PLAIN_DEFAULTS[args[1].opname] in (None, args[1].arg):
        n = 2
    if len(args) > n and args[n].opname in ("PRECALL", "CALL") and args[n].arg == n:
        ends = n + 1 if args[n].opname == "PRECALL" and len(args) > n + 1 and args[n + 1].opname == "CALL" else n
        return args[0].argval, ends + 1
    return _NO_KEY, 0


def _is_method_load(ins) -> bool:
    """A method looked up to be called (``p.append(v)``), not a bound method made (``f = p.append``)."""
    return ins.opname == "LOAD_METHOD" or (ins.opname == "LOAD_ATTR" and sys.version_info >= (3, 12) and ins.arg & 1)


class WrittenArguments:
    """The parameters of a jitted function that its code only writes into (``written_uses``), by
    position and by name; ``keyed`` puts ``Written`` in place of the containers passed there.
    Each place holds ``(the Written of each container type it takes, by type; the items read)``,
    made once: a call looks up its container's type (``_places``)."""

    __slots__ = ("positions", "names")

    def __init__(self, uses: dict, names: tuple, posonly: int):
        split = {n: _split(u) for n, u in uses.items()}
        self.positions = tuple((i, *_places(*split[n], (0, i))) for i, n in enumerate(names) if n in split)
        #: (a positional-only parameter's name passed as a keyword goes to ``**kwargs``)
        self.names = {n: _places(*u, (1, n)) for n, u in split.items() if n not in names[:posonly]}

    def keyed(self, args, kwargs) -> tuple:
        """``(args, kwargs)`` with each container the program only writes into as its ``Written``,
        each dict it reads only at constant keys as ``(Written, a dict of the items read)``."""
        new_args = None
        for i, markers, reads in self.positions:
            if i < len(args) and (marker := markers.get(type(args[i]))) is not None:
                new_args = new_args if new_args is not None else list(args)
                new_args[i] = (marker, _items_read(args[i], reads)) if reads else marker
        new_kwargs = None
        for name in kwargs.keys() & self.names.keys() if kwargs else ():
            markers, reads = self.names[name]
            if (marker := markers.get(type(kwargs[name]))) is not None:
                new_kwargs = new_kwargs if new_kwargs is not None else dict(kwargs)
                new_kwargs[name] = (marker, _items_read(kwargs[name], reads)) if reads else marker
        if new_args is None and new_kwargs is None:
            return args, kwargs
        return (args if new_args is None else tuple(new_args)), (kwargs if new_kwargs is None else new_kwargs)


def _split(uses: frozenset) -> tuple[frozenset, tuple]:
    """``(writes, items read)`` of a parameter's uses: each item read ``(key, None)``, or ``(key,
    the writes made into it)`` where the program only writes into it; in an order kept for the process."""
    read = {u[1] for u in uses if type(u) is tuple and u[0] == "getitem"}
    into: dict = {}
    for u in uses:
        if type(u) is tuple and u[0] == "into" and u[1] not in read:
            into.setdefault(u[1], set()).add(u[2])
    reads = [(k, None) for k in read] + [(k, frozenset(methods)) for k, methods in into.items()]
    return frozenset(u for u in uses if type(u) is str), tuple(sorted(reads, key=lambda r: repr(r[0])))


def _places(writes: frozenset, reads: tuple, path: tuple) -> tuple:
    """``({container type: its Written}, items read)`` of the parameter at ``path`` (``(0, i)``,
    ``(1, name)``) given ``writes`` and ``reads`` (``_split``): the types that take the writes (a
    plain dict only, where the program reads items of it: another's reads may insert,
    ``defaultdict``, or reorder), each item read as ``(key, None)`` or, where the program only
    writes into it, ``(key, {type: Written} of the types that take those writes)``."""
    kinds = [kind for kind, takes in _TAKES.items() if writes <= takes and (not reads or kind is dict)]
    markers = {kind: _marker(kind, path, bool(reads)) for kind in kinds}
    items = tuple((key, None if into is None else _places(into, (), (*path, key))[0]) for key, into in reads)
    return markers, items


def _items_read(container: dict, reads: tuple) -> dict:
    """The items of ``container`` the program reads (``_places``), each it only writes into as its
    ``Written`` where it is of a type that takes those writes."""
    items = {}
    for key, into in reads:
        if key in container:
            item = container[key]
            items[key] = item if into is None else into.get(type(item), item)
    return items


def written_arguments(fn) -> WrittenArguments | None:
    """The ``WrittenArguments`` of a plain function (or a jitted method's function), or None."""
    if type(fn) is not types.FunctionType:
        return None
    code = fn.__code__
    uses = written_uses(code)
    if not uses:
        return None
    return WrittenArguments(uses, code.co_varnames[: code.co_argcount], code.co_posonlyargcount)
