"""Uses of a traced module's identity, which are refused naming the line.

While traced, a module's methods run on a copy of it (``modules.ModuleBinding.clone``: tracing
leaves the user's module untouched, for other threads). The copy has the class, attributes and
state of the user's module, but not its identity: ``id(self)``, ``hash(self)``, a weak
reference to it, ``self is other``, a cache keyed by it (``functools.lru_cache`` on a method,
``cache[self]``, ``{self: ...}``) and a membership test (``self in seen``: its hash or ``==``,
both the identity unless its class defines them) would see the copy, so a compiled call would
key a cache, compare or cache as no eager call does (and never share a cache with eager calls).
Python cannot give the copy the module's identity, so a method that uses it so, found in its
bytecode as it runs, is refused.

The bytecode is read as each Python version writes it (``_normalized``): 3.12's
``LOAD_FAST_CHECK``, 3.13's ``LOAD_FAST_LOAD_FAST`` and ``STORE_FAST_LOAD_FAST`` (two locals in
one instruction), 3.14's borrowing loads and subscripts as ``BINARY_OP``, and ``LOAD_DEREF``
where an inner function also reads the receiver (it is a cell then).
"""

import builtins
import dis
import functools
import opcode
import sys
import weakref
from typing import NamedTuple

from thunder_rs.errors import ThunderNotImplementedError

#: The code of the readers standing in for cached functions (``cached_reads``): not the caller's line.
READER_CODES: set = set()
#: Callables whose result is a module's identity when given one (by name, for the error).
_IDENTITY_CALLS = {
    id: "id",
    hash: "hash",
    weakref.ref: "weakref.ref",
    weakref.proxy: "weakref.proxy",
    weakref.finalize: "weakref.finalize",
}
#: Loads of one local (a cell where an inner function reads it too); not 3.12's
#: ``LOAD_FAST_AND_CLEAR``, which saves a comprehension variable's outer value without using it.
_LOAD_LOCAL = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_DEREF"})
#: 3.13's and 3.14's loads of two locals (``argval``: their names).
_LOAD_LOCAL_PAIR = frozenset({"LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW"})
#: Loads of constants (3.14's small ints and immortal constants among them).
_LOAD_CONST = frozenset({"LOAD_CONST", "LOAD_SMALL_INT", "LOAD_CONST_IMMORTAL", "LOAD_CONST_MORTAL"})
_LOAD_ATTR = ("LOAD_ATTR", "LOAD_METHOD")
#: Methods of dicts and sets that look their first argument up by its hash and ``==``.
_LOOKUPS = frozenset({"get", "pop", "setdefault", "__contains__", "__getitem__", "discard", "remove", "add"})
_CALLS = ("PRECALL", "CALL")
#: Where the operand just before is a key (3.14 subscripts with ``BINARY_OP`` ``[]``).
_SUBSCRIPTS = ("BINARY_SUBSCR", "STORE_SUBSCR", "DELETE_SUBSCR")
#: The operands an operand of a comparison or display may start with.
_OPERAND_STARTS = frozenset({"LOAD_FAST", "LOAD_CONST", "LOAD_GLOBAL", "LOAD_NAME"})

#: id(code) -> (code, receiver name, its candidate uses): ``(kind, detail, line)``.
_uses: dict = {}
#: The code object walked last and its instructions (one tuple, read at once by each thread).
_last_walk: tuple = (None, [])


def instructions(code) -> list:
    """``code``'s instructions (``dis.get_instructions``; on CPython 3.11, ``_walk_311``). The
    observer finds a method's read chains and, on a traced module, its identity uses in the same
    call: one walk of the bytecode for both (walks are most of a first compile's time)."""
    global _last_walk
    last = _last_walk
    if last[0] is not code:
        last = _last_walk = (code, _walk(code))
    return last[1]


class Ins(NamedTuple):
    """An instruction as ``dis.Instruction`` has it, in the fields the readers of bytecode take
    (``argrepr`` only where they read it: ``BINARY_OP``'s operator)."""

    opname: str
    arg: int | None
    argval: object
    argrepr: str
    #: ``(lineno, end_lineno, col_offset, end_col_offset)``, as ``dis.Positions`` (3.11 on) has them
    positions: tuple | None
    #: where it is in ``co_code`` and its opcode (``code_reads._stored_before`` follows jumps)
    offset: int = 0
    opcode: int = 0


#: ``Ins`` made as its ``__new__`` makes it, without that function's frame (a fifth of a walk).
_new = tuple.__new__


def _walk_311(code) -> list:
    """``dis.get_instructions(code)`` as ``Ins``, 2.8 times as fast: CPython 3.11's ``dis``
    (``_get_instructions_bytes``) finds jump targets in a second pass and writes each argument's
    repr, for every instruction of every function a first compile observes (a fifth of a cold
    GPT-2 compile). Argument values follow ``dis``'s rules for 3.11 (``tests/test_state_caches.py``
    compares them over the standard library's and torch's code)."""
    raw, names, consts, varname = code.co_code, code.co_names, code.co_consts, code._varname_from_oparg
    positions = list(code.co_positions())
    out, extended, caches = [], 0, 0
    for offset in range(0, len(raw), 2):
        if caches:
            caches -= 1
            continue
        op = raw[offset]
        caches = _CACHES[op]
        arg = argval = None
        argrepr = ""
        if op >= _HAVE_ARGUMENT:
            arg = raw[offset + 1] | extended
            extended = (arg << 8) if op == _EXTENDED_ARG else 0
            if extended >= _INT_OVERFLOW:
                extended -= 2 * _INT_OVERFLOW
            argval = _argval_311(op, arg, offset, names, consts, varname)
            if op == _BINARY_OP:
                argrepr = _NB_OPS[arg][1]
        else:
            extended = 0
        out.append(_new(Ins, (_OPNAMES[op], arg, argval, argrepr, positions[offset // 2], offset, op)))
    return out


def _argval_311(op: int, arg: int, offset: int, names, consts, varname):
    """``dis``'s ``argval`` of instruction ``op`` with argument ``arg`` at ``offset`` (3.11)."""
    if op in _HASCONST:
        return consts[arg] if op == _LOAD_CONST_OP else _UNKNOWN
    if op in _HASNAME:
        return names[arg >> 1] if op == _LOAD_GLOBAL else names[arg]
    if op in _HASJREL:
        return offset + 2 + (-arg if op in _BACKWARD else arg) * 2
    if op in _HASJABS:
        return arg * 2
    if op in _HASLOCAL:
        return varname(arg)
    if op in _HASCOMPARE:
        return dis.cmp_op[arg]
    if op == _FORMAT_VALUE:
        return (_FORMAT_CONVERTERS[arg & 0x3][0], bool(arg & 0x4))
    return arg


# The tables of 3.11's ``dis`` and ``opcode``, some private, read for the fast walk on 3.11 alone
# (whose rules ``_argval_311`` follows); other versions walk with ``dis.get_instructions``.
_CACHES: list = getattr(opcode, "_inline_cache_entries", [])
_NB_OPS: list = getattr(opcode, "_nb_ops", [])
_FORMAT_CONVERTERS: tuple = getattr(dis, "FORMAT_VALUE_CONVERTERS", ())
_OPNAMES = getattr(dis, "_all_opname", dis.opname)
_INT_OVERFLOW = getattr(dis, "_INT_OVERFLOW", 2**31)
_UNKNOWN = getattr(dis, "UNKNOWN", None)
_HASCONST, _HASNAME, _HASJREL, _HASJABS = map(frozenset, (dis.hasconst, dis.hasname, dis.hasjrel, dis.hasjabs))
_HASLOCAL, _HASCOMPARE = frozenset(dis.haslocal) | frozenset(dis.hasfree), frozenset(dis.hascompare)
_BACKWARD = frozenset(op for op, name in enumerate(dis.opname) if "JUMP_BACKWARD" in name)
_HAVE_ARGUMENT, _EXTENDED_ARG = dis.HAVE_ARGUMENT, dis.EXTENDED_ARG
_BINARY_OP, _LOAD_CONST_OP = dis.opmap.get("BINARY_OP"), dis.opmap["LOAD_CONST"]
_LOAD_GLOBAL, _FORMAT_VALUE = dis.opmap["LOAD_GLOBAL"], dis.opmap.get("FORMAT_VALUE")


def _walk(code) -> list:
    if sys.version_info[:2] == (3, 11):
        return _walk_311(code)
    return list(dis.get_instructions(code))


class Op(NamedTuple):
    """An instruction as the scan reads it, whatever the version: loads of a local are
    ``LOAD_FAST``, of a constant ``LOAD_CONST``, subscripts ``BINARY_SUBSCR``."""

    opname: str
    argval: object
    arg: int | None
    line: int


def _normalized(instructions, first_line: int) -> list[Op]:
    """``instructions`` (``dis.Instruction``s, or objects with their ``opname``, ``argval``,
    ``arg``, ``argrepr`` and ``positions``) as ``Op``s, an instruction of two loads as two."""
    ops: list[Op] = []
    line = first_line
    for ins in instructions:
        positions = getattr(ins, "positions", None)  # (3.11 on; its first item is the line)
        line = positions[0] if positions is not None and positions[0] is not None else line
        opname = ins.opname
        if opname in _LOAD_LOCAL_PAIR:
            ops.extend(Op("LOAD_FAST", local, None, line) for local in ins.argval)
        elif opname == "STORE_FAST_LOAD_FAST":
            ops += [Op("STORE_FAST", ins.argval[0], None, line), Op("LOAD_FAST", ins.argval[1], None, line)]
        elif opname in _LOAD_LOCAL:
            ops.append(Op("LOAD_FAST", ins.argval, ins.arg, line))
        elif opname in _LOAD_CONST:
            ops.append(Op("LOAD_CONST", ins.argval, ins.arg, line))
        elif opname == "BINARY_OP" and getattr(ins, "argrepr", "") == "[]":
            ops.append(Op("BINARY_SUBSCR", None, ins.arg, line))
        else:
            ops.append(Op(opname, ins.argval, ins.arg, line))
    return ops


def _chain_before(ops, end: int) -> tuple:
    """The names of the load chain ending just before ``end`` (``weakref.ref``: ``("weakref",
    "ref")``), or () where it is not a global's chain."""
    attrs: list[str] = []
    k = end - 1
    while k >= 0 and ops[k].opname in _LOAD_ATTR:
        attrs.insert(0, ops[k].argval)
        k -= 1
    if k >= 0 and ops[k].opname in ("LOAD_GLOBAL", "LOAD_NAME"):
        return (ops[k].argval, *attrs)
    return ()


def _call_after_constants(ops, k: int) -> bool:
    """Whether the instructions from ``k`` load constants and then call (the arguments after a
    first one: ``CACHE.get(self, 1)``)."""
    while k < len(ops) and ops[k].opname in _LOAD_CONST:
        k += 1
    return k < len(ops) and ops[k].opname in _CALLS


def _operand_start(ops, end: int) -> int | None:
    """Where the operand ending just before ``end`` starts, when it is a load and its attribute
    reads; else None (an operand computed otherwise has no start the scan can tell)."""
    k = end - 1
    while k > 0 and ops[k].opname in _LOAD_ATTR:
        k -= 1
    return k if k >= 0 and ops[k].opname in _OPERAND_STARTS else None


def _loads(ops, k: int, name: str) -> bool:
    return k >= 0 and ops[k].opname == "LOAD_FAST" and ops[k].argval == name


def _compared(ops, i: int, name: str):
    """The use of ``name`` by the ``is`` or ``in`` at ``i``: ``is`` with it on either side (not
    with a constant), ``in`` with it on the left (``x in self`` asks the module)."""
    right = _operand_start(ops, i)
    if right is None:
        return None
    left_end = right - 1  # (an expression whose code ends in a local's load is that load)
    if "LOAD_CONST" in (ops[right].opname, ops[left_end].opname):
        return None  # (``self is None``)
    if ops[i].opname == "IS_OP" and _loads(ops, left_end, name):
        return ("is", _attribute_of(ops, right, i, name), ops[i].line)
    if ops[i].opname == "IS_OP" and right == i - 1 and _loads(ops, right, name):
        left = _operand_start(ops, right)
        return ("is", None if left is None else _attribute_of(ops, left, right, name), ops[i].line)
    if ops[i].opname == "CONTAINS_OP" and _loads(ops, left_end, name):
        return ("key", f"'{name} in ...', a membership test by its hash or ==", ops[i].line)
    return None


def _attribute_of(ops, start: int, end: int, name: str) -> str | None:
    """The attribute of ``name`` that the operand ``ops[start:end]`` is, where it is one:
    ``name.attr``, or a local every store of which is ``name.attr`` or ``getattr(name, "attr"[,
    default])`` (``language_model = getattr(self, "language_model", None)`` then ``language_model
    is not self``, Hugging Face's ``get_input_embeddings``); else None."""
    if end - start == 2 and _loads(ops, start, name) and ops[start + 1].opname in _LOAD_ATTR:
        return ops[start + 1].argval
    if end - start != 1 or ops[start].opname != "LOAD_FAST" or ops[start].argval == name:
        return None
    local = ops[start].argval
    attrs = {
        _stored_attribute(ops, k, name) for k, op in enumerate(ops) if op.opname == "STORE_FAST" and op.argval == local
    }
    return attrs.pop() if len(attrs) == 1 and None not in attrs else None


def _stored_attribute(ops, store: int, name: str) -> str | None:
    """The attribute of ``name`` the store at ``store`` stores (``name.attr``, ``getattr(name,
    "attr"[, default])``, or either through a walrus), or None."""
    k = store - 1
    k -= k >= 0 and ops[k].opname == "COPY"
    if k >= 1 and ops[k].opname in _LOAD_ATTR and _loads(ops, k - 1, name):
        return ops[k].argval
    while k >= 0 and ops[k].opname in _CALLS:
        k -= 1
    consts = 0
    while k - consts >= 0 and ops[k - consts].opname == "LOAD_CONST" and consts < 2:
        consts += 1
    first = k - consts + 1  # the attribute's name
    if consts == 0 or not _loads(ops, first - 1, name) or first - 2 < 0:
        return None
    getter = ops[first - 2]
    if getter.opname not in ("LOAD_GLOBAL", "LOAD_NAME") or getter.argval != "getattr":
        return None
    attr = ops[first].argval
    return attr if isinstance(attr, str) else None


def _displayed(ops, i: int, name: str):
    """The use of ``name`` as a key of the dict or set display built at ``i``: its operands
    are read back from the last while they are loads (a key of a dict display is every other)."""
    count = ops[i].arg * 2 if ops[i].opname == "BUILD_MAP" else ops[i].arg
    end = i
    for j in range(count):  # j: the operand's place from the last
        is_key = ops[i].opname == "BUILD_SET" or (count - 1 - j) % 2 == 0
        if is_key and _loads(ops, end - 1, name):
            return ("key", f"{name} as a key of a {'set' if ops[i].opname == 'BUILD_SET' else 'dict'}", ops[i].line)
        start = _operand_start(ops, end)
        if start is None:
            return None
        end = start
    return None


def _candidates(code, name: str) -> list:
    """The uses of the local ``name`` in ``code`` that may be by identity (``uses_in``)."""
    return uses_in(instructions(code), name, code.co_firstlineno)


def uses_in(instructions, name: str, first_line: int = 0) -> list:
    """The uses of the local ``name`` among ``instructions`` (of any version: ``_normalized``)
    that may be by identity, as ``(kind, detail, line)``: calls taking it alone (``id``,
    ``hash``, weak references: resolved against the globals as it runs), ``is`` comparisons with
    what is not a constant, method calls on it (cached ones: resolved on its class), and uses
    that hash it or compare it by ``==`` (a subscript's key, ``in``, a key of a dict or set
    display: refused unless its class defines them)."""
    ops = _normalized(instructions, first_line)
    found: list[tuple[str, object, int]] = []
    for i, op in enumerate(ops):
        after = ops[i + 1] if i + 1 < len(ops) else None
        if _loads(ops, i, name) and after is not None:
            if after.opname in _CALLS and after.arg == 1:
                chain = _chain_before(ops, i)
                if chain:
                    found.append(("call", chain, op.line))
            elif (
                len(chain := _chain_before(ops, i)) > 1 and chain[-1] in _LOOKUPS and _call_after_constants(ops, i + 1)
            ):
                found.append(("lookup", chain, op.line))  # (``CACHE.get(self, 1)``: its first argument)
            elif after.opname in _LOAD_ATTR:
                found.append(("method", after.argval, op.line))
            elif after.opname in _SUBSCRIPTS:
                found.append(("key", f"{name} as a subscript's key (a dict keyed by it)", op.line))
        elif op.opname in ("IS_OP", "CONTAINS_OP"):
            use = _compared(ops, i, name)
            found += [use] if use else []
        elif op.opname in ("BUILD_MAP", "BUILD_SET") and op.arg:
            use = _displayed(ops, i, name)
            found += [use] if use else []
    return found


def _resolve(chain: tuple, globals_: dict):
    value = globals_.get(chain[0], getattr(builtins, chain[0], None))
    for attr in chain[1:]:
        value = getattr(value, attr, None)
    return value


def _construct(kind: str, detail, name: str, receiver, globals_: dict) -> str | None:
    """What a candidate use is, named for the error, when it does use the module's identity."""
    if kind == "call":
        what = _IDENTITY_CALLS.get(_resolve(detail, globals_))
        return f"{what}({name})" if what is not None else None
    if kind == "method":
        # (as found on the class: a cached staticmethod or classmethod is keyed by its arguments alone)
        cached = isinstance(_on_class(type(receiver), detail), functools._lru_cache_wrapper)
        return f"{name}.{detail}(), a method cached by functools (keyed by {name})" if cached else None
    if kind == "lookup":
        # A dict's or set's method looking the module up (``CACHE.get(self, 1)``): by its hash or ``==``.
        found = _resolve(detail, globals_)
        holder = getattr(found, "__self__", None)
        cls = type(receiver)
        by_identity = cls.__hash__ is object.__hash__ or cls.__eq__ is object.__eq__
        if isinstance(holder, (dict, set, frozenset)) and found.__name__ in _LOOKUPS and by_identity:
            return f"{'.'.join(detail)}({name}, ...), a lookup keyed by {name}"
        return None
    if kind == "key":
        cls = type(receiver)
        return detail if cls.__hash__ is object.__hash__ or cls.__eq__ is object.__eq__ else None
    if detail is not None and _within(receiver, detail):
        return None
    return f"an 'is' comparison of {name}"


def _on_class(cls: type, name: str):
    """What ``cls`` holds as ``name`` in its own or a base's ``__dict__``, running no descriptor:
    ``inspect.getattr_static`` on a class, whose checks for shadowed ``__dict__``s and the
    metaclass cost most of a method call's observation (a module's methods are called per layer)."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name, _ABSENT)
        if found is not _ABSENT:
            return found
    return None


_ABSENT = object()


def _within(receiver, attr: str) -> bool:
    """Whether ``receiver``'s attribute ``attr`` is compared with it as eager compares them: it is
    no module, or one of the traced copy's tree (the copy's submodules are copies too), so that
    ``is`` answers for the copies as for the modules."""
    try:
        value = getattr(receiver, attr, None)
    except Exception:  # (a property that fails: the comparison is not known to be the module's)
        return False
    modules = getattr(receiver, "modules", None)
    if not hasattr(value, "_modules") or modules is None:
        return not hasattr(value, "_modules")
    return any(value is m for m in modules())


def refuse_identity_uses(code, name: str, receiver, globals_: dict) -> None:
    """Raises where ``code``, running a traced module's method with the copy as ``name``, uses
    the module's identity (see the module doc)."""
    known = _uses.get(id(code))
    if known is None or known[1] != name:
        known = _uses[id(code)] = (code, name, _candidates(code, name))
    for kind, detail, line in known[2]:
        construct = _construct(kind, detail, name, receiver, globals_)
        if construct is not None:
            raise ThunderNotImplementedError(
                f"thunder_rs.jit: {construct} at {code.co_filename}:{line} uses the identity of the module "
                f"{type(receiver).__name__}, which a compiled call cannot reproduce: thunder_rs traces a copy of the "
                "module, whose id, hash and weak references are not the module's, so a cache keyed by it or a "
                "comparison would not be eager's. Key caches by a value the module holds (an attribute set in "
                "__init__), or compare attributes instead"
            )


def cached_call(cached, frame, calls: list, misses: dict) -> None:
    """A call of ``cached`` (a function cached by ``functools.lru_cache`` or ``functools.cache``)
    runs its code (``frame``) while traced: it missed the cache, which keeps what it returns under
    a key of its arguments. Arguments holding stand-ins (a traced tensor, a symbolic size) would stay
    in the key, returned to later calls, eager ones too: refused naming the caller's line, the cache
    cleared after tracing. Otherwise noted in ``calls`` as ``(cached, line, refused)``: a stand-in
    the result holds is found after tracing (``escapes``), which names that line.

    The cache counts a miss before it runs the code (``misses``: id -> its count when the code last
    ran): code run with the count unchanged is the function called itself, past its cache (its
    ``__wrapped__``; transformers' ``compile_compatible_method_lru_cache`` does so while
    ``torch.compiler.is_compiling()``, as under Dynamo), which caches nothing and is traced as any
    other function. A miss made where the hook does not see it leaves the count ahead: the next run
    is taken as a miss, which errs on the side of refusing."""
    count = cached.cache_info().misses
    if misses.get(id(cached)) == count:
        return
    misses[id(cached)] = count
    caller = frame.f_back
    while caller is not None and caller.f_code in READER_CODES:
        caller = caller.f_back  # (the stand-in the program called, ``cached_reads``)
    where = f"{caller.f_code.co_filename}:{caller.f_lineno}" if caller is not None else "an unknown line"
    refused = any(type(x).__name__ in _STAND_INS for x in frame.f_locals.values())
    calls.append((cached, where, refused))
    if refused:
        raise cache_fill_error(cached, where)


#: What a traced program's stand-ins for tensors, sizes and shapes are, by type name (``core.lang`` and
#: ``core.base.proxies`` make them).
_STAND_INS = frozenset({"TensorProxy", "SymInt", "SymFloat", "SymbolicSize"})


def cache_fill_error(cached, where: str) -> ThunderNotImplementedError:
    """The error for a function cached by functools whose cache the traced program filled with a
    stand-in (in its key or its result), called at ``where``; its cache was cleared."""
    name = getattr(cached, "__qualname__", repr(cached))
    return ThunderNotImplementedError(
        f"thunder_rs.jit: {name}, cached by functools.lru_cache, is called at {where} with arguments it has not "
        "cached, while traced: its cache would keep the trace's stand-in for a tensor or a size, and return it to "
        f"later calls (thunder_rs cleared its cache). Call {name}.__wrapped__ there (computed by every call), call "
        f"{name} outside the jitted function and pass the result in, or fill its cache before the first call"
    )
