"""Uses of a traced module's identity, which are refused naming the line.

While traced, a module's methods run on a copy of it (``modules.ModuleBinding.clone``: tracing
leaves the user's module untouched, for other threads). The copy has the class, attributes and
state of the user's module, but not its identity: ``id(self)``, ``hash(self)``, a weak
reference to it, ``self is other`` and a cache keyed by it (``functools.lru_cache`` on a method)
would see the copy, so a compiled call would key a cache, compare or cache as no eager call does
(and never share a cache with eager calls). Python cannot give the copy the module's identity, so
a method that uses it so, found in its bytecode as it runs, is refused.
"""

import builtins
import dis
import functools
import weakref

from thunder_rs.errors import ThunderNotImplementedError

#: Callables whose result is a module's identity when given one (by name, for the error).
_IDENTITY_CALLS = {
    id: "id",
    hash: "hash",
    weakref.ref: "weakref.ref",
    weakref.proxy: "weakref.proxy",
    weakref.finalize: "weakref.finalize",
}
_LOAD_FAST = ("LOAD_FAST", "LOAD_FAST_CHECK")
_LOAD_ATTR = ("LOAD_ATTR", "LOAD_METHOD")
_CALLS = ("PRECALL", "CALL")

#: id(code) -> (code, receiver name, its candidate uses): ``(kind, detail, line)``.
_uses: dict = {}
#: The code object walked last and its instructions (one tuple, read at once by each thread).
_last_walk: tuple = (None, [])


def instructions(code) -> list:
    """``code``'s instructions (``dis.get_instructions``). The observer finds a method's read chains
    and, on a traced module, its identity uses in the same call: one walk of the bytecode for both
    (walks are most of a first compile's time)."""
    global _last_walk
    last = _last_walk
    if last[0] is not code:
        last = _last_walk = (code, list(dis.get_instructions(code)))
    return last[1]


def _chain_before(instructions, end: int) -> tuple:
    """The names of the load chain ending just before ``end`` (``weakref.ref``: ``("weakref",
    "ref")``), or () where it is not a global's chain."""
    attrs: list[str] = []
    k = end - 1
    while k >= 0 and instructions[k].opname in _LOAD_ATTR:
        attrs.insert(0, instructions[k].argval)
        k -= 1
    if k >= 0 and instructions[k].opname in ("LOAD_GLOBAL", "LOAD_NAME"):
        return (instructions[k].argval, *attrs)
    return ()


def _operand_start(instructions, end: int) -> int:
    """Where the operand (a load and its attribute reads) ending just before ``end`` starts."""
    k = end - 1
    while k > 0 and instructions[k].opname in _LOAD_ATTR:
        k -= 1
    return k


def _candidates(code, name: str) -> list:
    """The uses of the local ``name`` that may be by identity: calls taking it alone (``id``,
    ``hash``, weak references: resolved against the globals as it runs), ``is`` comparisons with
    what is not a constant, and method calls on it (cached ones: resolved on its class)."""
    found: list[tuple[str, object, int]] = []
    listed = instructions(code)
    line = code.co_firstlineno
    for i, ins in enumerate(listed):
        positions = getattr(ins, "positions", None)  # (3.11 on)
        line = positions.lineno if positions is not None and positions.lineno is not None else line
        after = listed[i + 1] if i + 1 < len(listed) else None
        if ins.opname in _LOAD_FAST and ins.argval == name and after is not None:
            if after.opname in _CALLS and after.arg == 1:
                chain = _chain_before(listed, i)
                if chain:
                    found.append(("call", chain, line))
            elif after.opname in _LOAD_ATTR:
                found.append(("method", after.argval, line))
        elif ins.opname == "IS_OP":
            right = _operand_start(listed, i)
            left = _operand_start(listed, right)
            if "LOAD_CONST" in (listed[right].opname, listed[left].opname):
                continue  # (``self is None``)
            bare = [listed[k] for k, whole in ((right, right == i - 1), (left, left == right - 1)) if whole]
            if any(o.opname in _LOAD_FAST and o.argval == name for o in bare):
                found.append(("is", None, line))
    return found


def _resolve(chain: tuple, globals_: dict):
    value = globals_.get(chain[0], getattr(builtins, chain[0], None))
    for attr in chain[1:]:
        value = getattr(value, attr, None)
    return value


def refuse_identity_uses(code, name: str, receiver, globals_: dict) -> None:
    """Raises where ``code``, running a traced module's method with the copy as ``name``, uses
    the module's identity (see the module doc)."""
    known = _uses.get(id(code))
    if known is None or known[1] != name:
        known = _uses[id(code)] = (code, name, _candidates(code, name))
    for kind, detail, line in known[2]:
        where = f"{code.co_filename}:{line}"
        if kind == "call":
            what = _IDENTITY_CALLS.get(_resolve(detail, globals_))
            construct = f"{what}({name})" if what is not None else None
        elif kind == "method":
            cached = isinstance(getattr(type(receiver), detail, None), functools._lru_cache_wrapper)
            construct = f"{name}.{detail}(), a method cached by functools (keyed by {name})" if cached else None
        else:
            construct = f"an 'is' comparison of {name}"
        if construct is not None:
            raise ThunderNotImplementedError(
                f"thunder_rs.jit: {construct} at {where} uses the identity of the module "
                f"{type(receiver).__name__}, which a compiled call cannot reproduce: thunder_rs traces a copy of the "
                "module, whose id, hash and weak references are not the module's, so a cache keyed by it or a "
                "comparison would not be eager's. Key caches by a value the module holds (an attribute set in "
                "__init__), or compare attributes instead"
            )
