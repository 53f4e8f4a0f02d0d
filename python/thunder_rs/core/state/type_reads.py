"""``type(x)`` of a stand-in for a number, found in the program's bytecode as it runs.

While traced, a float input is a ``SymFloat`` and a symbolic size a ``SymInt``: ``isinstance`` and
``x.__class__`` answer as for a float or an int (their ``__class__``), but ``type(x)`` is the
stand-in's own class, so ``type(lr) is float``, ``type(n) in (int, float)`` or a table of handlers
keyed by type would take another path than eager's. Python cannot make ``type()`` of an object that
records arithmetic be ``float``, so the call is found instead: where the program's code calls the
builtin ``type`` on a chain of a local (``type(s)``, ``type(self.p)``, ``type(cfg["lr"])``), the
observer evaluates the chain when the code is entered and when it returns, and a stand-in found
there answers for the read (its ``_thunder_type_read(site, exact=True)``): a float input is noted as
specialised (the compile traces again with it a constant, a plain float), a size makes the symbolic
compile fail (the compile takes the sizes constant). Where the operand is computed (``type(a + b)``,
``type(f(x))``) or its local is rebound in the code (a loop's variable, which held other values in
between), every stand-in among the frame's locals and the items of the lists, tuples and dicts
they hold answers too, with ``exact=False``: float inputs are taken constant, sizes are left
symbolic (they are in most frames' locals, and a compile per size is dearer than one per value).
Not seen: ``type`` called otherwise (``builtins.type(s)``, an alias), in code the observer does not
report (torch's internals, the standard library), or while another profiler holds the hook.
"""

import builtins
from typing import NamedTuple

import torch

from thunder_rs.core.base.proxies import SymbolicSize, TensorProxy
from thunder_rs.core.state.guards import Item, attributes_of
from thunder_rs.core.state.identity import instructions
from thunder_rs.core.state.tensor_types import TypeUse, check_tensor_type, type_use

_ROOTS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_DEREF"})
_CONSTS = frozenset({"LOAD_CONST", "LOAD_SMALL_INT"})
#: A call's instruction (3.10's ``CALL_FUNCTION``), and 3.11's ``PRECALL`` before it.
_CALLS = frozenset({"CALL", "CALL_FUNCTION"})
#: What rebinds a local (3.12's comprehension stores, 3.13's pairs among them).
_STORES = frozenset(
    {
        "STORE_FAST",
        "DELETE_FAST",
        "STORE_DEREF",
        "DELETE_DEREF",
        "STORE_FAST_MAYBE_NULL",
        "STORE_FAST_STORE_FAST",
        "STORE_FAST_LOAD_FAST",
    }
)
_MISSING = object()
#: Iterators over lists, tuples and dicts, whose items ``_items`` reads.
_ITERATORS: frozenset = frozenset(map(type, (iter([]), iter(()), iter({}), iter({}.values()), iter({}.items()))))
#: What a chain's items are read from (exactly these types: their items run no code of the program).
_CONTAINERS = (dict, list, tuple, torch.Size, SymbolicSize)


class TypeCall(NamedTuple):
    """A call of ``type`` with one argument in a code: the operand's ``root`` local and ``steps``
    (attribute names, ``Item`` keys) when it is such a chain (None when computed), ``fixed`` when
    the local is never rebound (its values at the code's entry and return are those passed), the
    call's ``line``."""

    root: str | None
    steps: tuple
    fixed: bool
    line: int
    #: what the code does with the class (``tensor_types.type_use``), for a chain's
    use: TypeUse | None = None


def type_calls(code) -> tuple:
    """The calls of the global ``type`` with one argument in ``code`` (``TypeCall``s); () where it
    loads no ``type`` (most code)."""
    if "type" not in code.co_names:
        return ()
    listed = instructions(code)
    stored = {n for ins in listed if ins.opname in _STORES for n in _names(ins.argval)}
    found = []
    for i, ins in enumerate(listed):
        if ins.opname not in ("LOAD_GLOBAL", "LOAD_NAME") or ins.argval != "type":
            continue
        line = _line(ins, code.co_firstlineno)
        chain = _chain_called(listed, i + 1)
        if chain is not None:
            use = type_use(listed, i, chain[2])
            found.append(TypeCall(chain[0], chain[1], chain[0] not in stored, line, use))
        elif _called(listed, i):
            found.append(TypeCall(None, (), False, line))
    return tuple(found)


def _names(argval) -> tuple:
    return argval if type(argval) is tuple else (argval,)


def _line(ins, first: int) -> int:
    positions = getattr(ins, "positions", None)
    return positions[0] if positions is not None and positions[0] is not None else first


def _chain_called(listed: list, j: int) -> tuple | None:
    """``(root, steps, index of the call)`` where ``listed[j:]`` loads a local and reads attributes and items by
    constant keys of it, then calls what was loaded before with it alone."""
    if j >= len(listed) or listed[j].opname not in _ROOTS:
        return None
    root, steps = listed[j].argval, []
    j += 1
    while j < len(listed):
        ins = listed[j]
        after = listed[j + 1] if j + 1 < len(listed) else None
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            steps.append(ins.argval)
        elif ins.opname in _CONSTS and after is not None and _subscript(after):
            steps.append(Item(ins.argval))
            j += 1
        elif ins.opname == "PRECALL" and ins.arg == 1:
            pass
        else:
            return (root, tuple(steps), j) if ins.opname in _CALLS and ins.arg == 1 else None
        j += 1
    return None


def _subscript(ins) -> bool:
    return ins.opname == "BINARY_SUBSCR" or (ins.opname == "BINARY_OP" and ins.argrepr == "[]")


def _called(listed: list, i: int) -> bool:
    """Whether the ``type`` loaded at ``i`` is called with one argument: a call whose source starts
    where the load's does (3.11 on; earlier versions have no positions, and only chains are seen)."""
    start = getattr(listed[i], "positions", None)
    if start is None or start[0] is None:
        return False
    for ins in listed[i + 1 : i + 400]:
        at = getattr(ins, "positions", None)
        if ins.opname in _CALLS and ins.arg == 1 and at is not None and (at[0], at[2]) == (start[0], start[2]):
            return True
    return False


def read_types(calls: tuple, local: dict, globals_: dict, filename: str) -> None:
    """Lets each stand-in the ``type`` calls ``calls`` of a frame may read answer (see the module
    doc), the frame's locals ``local`` at its entry or return."""
    if globals_.get("type", builtins.type) is not builtins.type:
        return  # (a ``type`` of the program's own)
    loose = None
    for call in calls:
        site = f"{filename}:{call.line}"
        if call.root is not None:
            value = _follow(local.get(call.root, _MISSING), call.steps)
            if call.use is not None and isinstance(value, TensorProxy):
                check_tensor_type(value, call.use, _described(call), local, globals_, site)
            _answer(value, site, True)
        if not call.fixed and loose is None:
            loose = site
    if loose is not None:
        for value in local.values():
            for item in (value, *_items(value)):
                _answer(item, loose, False)


def _described(call: TypeCall) -> str:
    """The program's text of a chain (``self.w``, ``cfg['x']``)."""
    return str(call.root) + "".join(f"[{s.key!r}]" if type(s) is Item else f".{s}" for s in call.steps)


def _items(value) -> tuple:
    """The items of a list, tuple or dict (its values), or of the one an iterator walks (the
    iterator a 3.11 comprehension's code takes: read without advancing it, those it passed too),
    pairs of a dict's items flattened."""
    kind = type(value)
    if kind in (list, tuple):
        return tuple(value)
    if kind is dict:
        return tuple(value.values())
    if kind not in _ITERATORS:
        return ()
    reduced = value.__reduce__()[1]  # ``(iter, (the items left,)[, position])``
    items = reduced[0] if reduced and type(reduced[0]) in (list, tuple) else ()
    return tuple(x for item in items for x in (item if type(item) is tuple else (item,)))


def _follow(value, steps: tuple):
    """The value the chain ``steps`` reaches from ``value``: items of exactly dicts, lists, tuples
    and shapes, attributes from instance dicts and slots, a tensor's shape; nothing that runs the
    program's code (nor records anything: ``x.T`` of a traced tensor would)."""
    try:
        return _reached(value, steps)
    except Exception:  # noqa: BLE001 (no such item, an object whose ``__dict__`` fails: no stand-in)
        return _MISSING


def _reached(value, steps: tuple):
    for step in steps:
        if value is _MISSING:
            return value
        if type(step) is Item:
            value = value[step.key] if type(value) in _CONTAINERS else _MISSING
        elif step == "shape" and isinstance(value, torch.Tensor):
            value = value.shape
        else:
            attributes = attributes_of(value)
            found = attributes.get(step, _MISSING) if attributes is not None else _MISSING
            if found is _MISSING and isinstance(value, torch.nn.Module):  # (its ``__getattr__``'s dicts)
                found = next((d[step] for d in _module_dicts(attributes) if step in d), _MISSING)
            value = found
    return value


def _module_dicts(attributes) -> tuple:
    """A module's parameters, buffers and submodules (what ``nn.Module.__getattr__`` reads)."""
    dicts = (attributes.get(n) for n in ("_parameters", "_buffers", "_modules")) if attributes is not None else ()
    return tuple(d for d in dicts if type(d) is dict)


def _answer(value, site: str, exact: bool) -> None:
    read = getattr(type(value), "_thunder_type_read", None)
    if read is not None and value is not _MISSING:
        read(value, site, exact)
