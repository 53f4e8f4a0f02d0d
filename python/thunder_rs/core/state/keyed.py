"""Dicts of lasting state keyed by a symbolic size: a cache of masks by sequence length.

A program that keeps a tensor per size in a dict (``if n not in _MASKS: _MASKS[n] = mask(n)``,
then ``x @ _MASKS[n]``) hashes the size, which would compile it for that size only, and the dict
is guarded with its items (``core.state.containers``), which every new size changes: two compiles
per size. Where the size is symbolic and the dict holds no item under its value when the call
begins, the program relied on that alone: the key is absent. The hash then leaves the size
symbolic (``SymInt.__hash__`` asks ``key_use``), each call checks that its own value is not a key
(a size check, ``observe.check_sizes``, run on every call), the item the program stores goes in
under that call's value, and the dict's guard asks only that a dict is there: one compile serves
every new size.

That holds only where the program did nothing else with the dict: one function uses it, only as
``key in d``, ``d[key]`` and ``d[key] = value`` with one variable as the key (assigned once, not
in a loop), which held a symbolic size in every run of the function (checked as each returns),
and the function reads no attribute by name. Otherwise, and where the key is there (the item is then read as a
tensor of that size), the size is specialised as any hashed size, and the dict guarded whole.
"""

import dis
import functools

import torch

from thunder_rs.core.state.guards import MISSING
from thunder_rs.core.state.identity import instructions as walked

_KEYED = frozenset({"CONTAINS_OP", "BINARY_SUBSCR", "STORE_SUBSCR"})
_FAST = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_DEREF"})
_ROOT_LOADS = _FAST | {"LOAD_GLOBAL", "LOAD_CLASSDEREF"}
_KEY_LOADS = _FAST
#: Instructions of two loads or stores (Python 3.13 on): the scan does not see through them.
_FUSED = frozenset(
    {"LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST"}
)
_ATTRS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_STORES = frozenset({"STORE_FAST", "STORE_DEREF", "DELETE_FAST", "DELETE_DEREF"})
_JUMPS = frozenset(dis.hasjabs) | frozenset(dis.hasjrel)
#: Reads by name or of a whole namespace, which could reach the dict unseen.
_BY_NAME = frozenset({"getattr", "setattr", "delattr", "hasattr", "vars", "locals", "globals", "eval", "exec"})
_MODULE_STORES = ("_modules", "_parameters", "_buffers")


@functools.lru_cache(maxsize=1024)
def _instructions(code) -> tuple:
    # (``identity.instructions``: ``dis.get_instructions``' fields, 2.8 times as fast on 3.11)
    instructions = tuple(walked(code))
    return instructions, {ins.offset: i for i, ins in enumerate(instructions)}


def _attribute(obj, name: str):
    """``obj.name`` where it is plain data (an instance attribute, a module's store, a class
    attribute that is no descriptor), else MISSING: reading it runs no code."""
    attributes = getattr(obj, "__dict__", None)
    if isinstance(attributes, dict):
        if name in attributes:
            return attributes[name]
        if isinstance(obj, torch.nn.Module):
            for store in _MODULE_STORES:
                if name in attributes.get(store, ()):
                    return attributes[store][name]
    for cls in type(obj).__mro__:
        if name in cls.__dict__:
            value = cls.__dict__[name]
            return MISSING if hasattr(type(value), "__get__") else value
    return MISSING


def _evaluate(frame, chain: tuple, local: dict | None = None):
    """The value of ``chain`` (a root load, then attribute loads) in ``frame`` (whose locals are
    ``local`` where given), or MISSING."""
    root = chain[0]
    if root.opname == "LOAD_GLOBAL":
        value = frame.f_globals.get(root.argval, frame.f_builtins.get(root.argval, MISSING))
    else:
        value = (frame.f_locals if local is None else local).get(root.argval, MISSING)
    for ins in chain[1:]:
        if value is MISSING:
            break
        value = _attribute(value, ins.argval)
    return value


def _chain_ending(instructions: tuple, end: int) -> tuple | None:
    """The chain of loads that ends at ``end``, or None."""
    start = end
    while start >= 0 and instructions[start].opname in _ATTRS:
        start -= 1
    if start < 0 or instructions[start].opname not in _ROOT_LOADS:
        return None
    return instructions[start : end + 1]


def container_of(frame) -> tuple:
    """``(container, key variable)`` of the ``in``, subscript or item store ``frame`` is running,
    a single variable its key; ``(MISSING, None)`` for anything else."""
    instructions, at = _instructions(frame.f_code)
    i = at.get(frame.f_lasti)
    if i is None or instructions[i].opname not in _KEYED or i < 2:
        return MISSING, None
    if instructions[i].opname == "CONTAINS_OP":
        chain = _chain_ending(instructions, i - 1)
        key = instructions[i - 1 - len(chain)] if chain is not None and i - 1 - len(chain) >= 0 else None
    else:
        chain, key = _chain_ending(instructions, i - 2), instructions[i - 1]
    if chain is None or key is None or key.opname not in _KEY_LOADS:
        return MISSING, None
    return _evaluate(frame, chain), key.argval


def keyed_variable(frame, container) -> str | None:
    """The variable that keys every use of ``container`` in the code ``frame`` runs, where each
    is ``var in d``, ``d[var]`` or ``d[var] = value`` and ``var`` is assigned at most once; else
    None. Chains are evaluated in ``frame`` to find which load ``container``."""
    code = frame.f_code
    instructions, _ = _instructions(code)
    names, local = set(), frame.f_locals
    for i, ins in enumerate(instructions):
        if (ins.opname == "LOAD_GLOBAL" and ins.argval in _BY_NAME) or ins.argval == "__dict__" or ins.opname in _FUSED:
            return None
        if ins.opname not in _ROOT_LOADS:
            continue
        end = i
        while end + 1 < len(instructions) and instructions[end + 1].opname in _ATTRS:
            end += 1
        for last in range(i, end + 1):
            if _evaluate(frame, instructions[i : last + 1], local) is not container:
                continue
            var = _key_of(instructions, i, last) if last == end else None
            if var is None:
                return None
            names.add(var)
    if len(names) != 1:
        return None
    (var,) = names
    stores = [i for i, ins in enumerate(instructions) if ins.opname in _STORES and ins.argval == var]
    return var if len(stores) <= 1 and not any(_in_loop(instructions, i) for i in stores) else None


def _in_loop(instructions: tuple, index: int) -> bool:
    """Whether the instruction at ``index`` may run more than once in one call: a backward jump
    passes over it (a ``for`` or ``while`` loop, a comprehension inlined from 3.12)."""
    offset = instructions[index].offset
    return any(
        ins.opcode in _JUMPS and type(ins.argval) is int and ins.argval <= offset < ins.offset for ins in instructions
    )


def _key_of(instructions: tuple, start: int, end: int) -> str | None:
    after = instructions[end + 1] if end + 1 < len(instructions) else None
    if after is not None and after.opname == "CONTAINS_OP" and start > 0:
        key = instructions[start - 1]
    elif after is not None and after.opname in _KEY_LOADS and end + 2 < len(instructions):
        key = after if instructions[end + 2].opname in ("BINARY_SUBSCR", "STORE_SUBSCR") else None
    else:
        return None
    return key.argval if key is not None and key.opname in _KEY_LOADS else None


class _Use:
    """A dict used with symbolic keys by one ``code``, keyed by ``variable``; ``keyed`` while
    nothing else was seen; ``present``: the values of keys it held (specialised), each read as the
    tensor there on every call (``StateContainers.read_per_call``)."""

    __slots__ = ("place", "code", "variable", "keyed", "present")

    def __init__(self, place, code, variable: str | None):
        self.place, self.code, self.variable = place, code, variable
        self.keyed = variable is not None
        self.present: set = set()


class KeyUses:
    """The dicts of lasting state one acquisition used with a symbolic key (``key_use``), by id."""

    def __init__(self):
        self.uses: dict = {}
        self.returns_seen = False

    def use(self, place, frame, size, sized, check_sizes) -> bool:
        """Whether ``size``, hashed by the ``in``, subscript or store ``frame`` runs on
        ``place``'s dict, stays symbolic: only when the dict held no item under its value at
        the start, and the program uses the dict in no other way (see the module doc)."""
        use = self.uses.get(id(place.container))
        if use is None:
            use = self.uses[id(place.container)] = _Use(place, frame.f_code, keyed_variable(frame, place.container))
        if not use.keyed or use.code is not frame.f_code or frame.f_locals.get(use.variable) is not size:
            use.keyed = False
            return False
        if size.expr.hint in dict(place.items):
            use.present.add(size.expr.hint)  # the item there is read: the size is specialised
            return False
        value, at = sized(), place.at()

        def absent(env) -> bool:
            held = at.object(None)
            return type(held) is dict and value(env) not in held

        absent.per_call = True  # type: ignore[attr-defined]
        absent.shown = f"{size.expr} not in {place.source.describe(place.name)}, read at {place.origin}"  # type: ignore[attr-defined]
        check_sizes(absent)
        return True

    def returned(self, frame, places) -> None:
        """Checks, as a function that used a dict returns, that its key variable held a symbolic
        size (or nothing): a run with a plain int used the dict by a key no check sees."""
        self.returns_seen = True
        for place in places:
            variable = keyed_variable(frame, place.container)
            value = frame.f_locals.get(variable, MISSING) if variable is not None else None
            if value is not MISSING and not isinstance(value, torch.SymInt):
                self.uses[id(place.container)] = _Use(place, frame.f_code, None)

    def relaxed(self, guards: dict) -> list:
        """The places whose dict needs no guard but being a dict: used only with symbolic keys,
        each absent (checked per call) or present with a tensor read per call (its ``TensorGuard``
        among ``guards``)."""
        return [
            use.place
            for use in self.uses.values()
            if use.keyed
            and self.returns_seen
            and use.place.codes == {use.code}
            and all(("held", id(use.place.container), k) in guards for k in use.present)
        ]


class DictAt:
    """A dict at ``name`` of ``source``, whatever its items (a cache used only by symbolic keys,
    whose absence each call checks)."""

    per_call = True

    def __init__(self, source, name, origin: str):
        self.source, self.name, self.origin = source, name, origin

    def holds(self, flat) -> bool:
        return type(self.source.mapping(flat).get(self.name, None)) is dict

    def describe(self, flat) -> str:
        now = self.source.mapping(flat).get(self.name, None)
        return f"{self.source.describe(self.name)} is no longer a dict: {type(now).__name__} (read at {self.origin})"

    def term(self, index: int, scope: dict) -> str:
        return f"type({self.source.code(f'm{index}', scope)}.get({self.name!r}, None)) is dict"
