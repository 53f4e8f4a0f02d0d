"""The reads a function's code can make, found once from its bytecode (:class:`CodeReads`):
globals, closure cells, and attribute chains on its arguments and locals (``self.config.scale``,
``cfg["sub"]["scale"]``, ``getattr(cfg, "scale", 1.0)``); and which code's reads are the program's
(``interesting``: not torch's internals, thunder_rs or the standard library). The observer
(``observe.py``) evaluates them at each call of the traced program.

A chain on ``self`` is evaluated when the method is entered, so one that reads what the method
stored earlier (``self.pyramid = [...]`` then ``self.pyramid``) or what a method it called stored
on every path (``self.reset()`` setting ``self.items = []``) would guard the value of the last call:
both are left out (``_stored_first``, ``stored_by_calls``)."""

import dis
import inspect
import os
import sysconfig

import torch

from thunder_rs.core.base.userframe import PACKAGE_DIR
from thunder_rs.core.state.guards import Item as _Item
from thunder_rs.core.state.guards import attributes_of
from thunder_rs.core.state.identity import instructions
from thunder_rs.core.state.type_reads import type_calls


def _dir(path: str) -> str:
    return os.path.dirname(os.path.abspath(path)) + os.sep


_TORCH_DIR = _dir(torch.__file__)
#: torch code whose reads are the program's: the standard modules' forwards (``self.p``, ``self.eps``)
#: and the distributions' methods (``self.loc`` of a prior the program keeps).
_TORCH_MODULES_DIR = os.path.join(_TORCH_DIR, "nn", "modules") + os.sep
_TORCH_DISTRIBUTIONS_DIR = os.path.join(_TORCH_DIR, "distributions") + os.sep
_TORCH_MODULES_SKIPPED = ("module.py", "lazy.py", "_functions.py")
STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
#: Where the standard library's code is (``os`` and ``_collections_abc`` are frozen modules).
_STDLIB_FILES = (*STDLIB_DIRS, "<frozen ")
#: the import system's code (what it reads and writes, ``.pyc`` files, is no effect of the program)
IMPORTING = ("<frozen importlib.", os.path.join(os.path.dirname(os.__file__), "importlib") + os.sep)
_LOAD_ATTR = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_LOAD_ROOT = frozenset(
    {"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_GLOBAL", "LOAD_NAME"}
)
_LOAD_LOCAL = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})
_LOAD_TWO = frozenset({"LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW"})
#: Stack copies that keep a chain going (``self.steps += 1`` copies ``self`` before reading ``steps``).
_COPIES = frozenset({"COPY", "DUP_TOP"})
#: Builtins that read an attribute named by a string: ``getattr(config, "scale", 1.0)``.
_READS_BY_NAME = frozenset({"getattr", "hasattr"})
#: Loads of a constant key before a subscript (``cfg["scale"]``, ``scales[0]``).
_CONST_LOADS = frozenset({"LOAD_CONST", "LOAD_SMALL_INT"})
#: Names of library code that reads all of an object's attributes, which the observer does not
#: follow (``vars(cfg)``, ``cfg.__dict__``, ``dataclasses.astuple``/``fields``/``replace``,
#: ``operator.attrgetter``, ``copy.copy``): a code that uses one reads its objects whole.
_READS_WHOLE = frozenset({"vars", "__dict__", "fields", "asdict", "astuple", "replace", "attrgetter", "copy"})
#: Names of library code that reads attributes of what an object holds, by a path the observer
#: cannot see (``operator.attrgetter("block.gain")``, ``vars(cfg)["sub"].scale``,
#: ``self.get_submodule(path)``; and
#: ``functools.reduce(getattr, path.split("."), self)``: ``_reads_nested``): a code that uses one
#: reads its objects whole, and the objects they hold (``ALL_NESTED``).
_READS_NESTED = frozenset({"attrgetter", "vars", "get_submodule", "get_parameter", "get_buffer"})
#: The last step of every chain of a code that reads objects and what they hold whole
#: (``_READS_NESTED``).
ALL_NESTED = "<all attributes, nested>"
#: The last step of every chain of a code that reads objects whole (``_READS_WHOLE``, or
#: ``getattr(cfg, name)`` by a computed name): the object the chain reaches is guarded whole.
ALL_ATTRIBUTES = "<all attributes>"
#: The step of a chain that calls what it reached with no arguments (``self.parent_ref().scale``):
#: followed only through a ``weakref.ref``, whose call runs no code of the program.
CALLED = "()"


def _is_subscript(ins) -> bool:
    # BINARY_SUBSCR up to Python 3.13; BINARY_OP with the subscript operator from 3.14.
    return ins is not None and (ins.opname == "BINARY_SUBSCR" or (ins.opname == "BINARY_OP" and ins.argrepr == "[]"))


def _in_library(path: str) -> bool:
    """torch's internals, thunder_rs and the standard library: their reads are not the program's."""
    if path.startswith(PACKAGE_DIR):
        return True
    if path.startswith(_TORCH_DIR):
        if path.startswith(_TORCH_DISTRIBUTIONS_DIR):
            return False
        return not (path.startswith(_TORCH_MODULES_DIR) and not path.endswith(_TORCH_MODULES_SKIPPED))
    return path.startswith(STDLIB_DIRS) and "site-packages" not in path


def installed(path: str) -> bool:
    """Whether ``path`` is an installed package's (a virtual environment's platstdlib holds its site-packages)."""
    return f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


def in_stdlib(path: str) -> bool:
    """Whether ``path`` is the standard library's code."""
    return path.startswith(_STDLIB_FILES) and not installed(path)


_library_modules: dict = {}


def library_module(module) -> bool:
    """Whether ``module`` is torch, thunder_rs or the standard library (cached by id; modules live
    as long as the process)."""
    known = _library_modules.get(id(module))
    if known is None:
        path = getattr(module, "__file__", None)
        known = _library_modules[id(module)] = path is None or _in_library(os.path.abspath(path))
    return known


#: absolute path -> whether code there is ``interesting``: the hook's frame filters ask again for
#: the frames of every watched builtin call (``hook.program_frame``), where ``abspath`` cost most
_interesting_paths: dict = {}


def interesting(code) -> bool:
    """Whether the reads of ``code`` are the program's (user code, other libraries, torch.nn modules).
    Module and class bodies (code without fast locals) run at import, not as the program."""
    if not code.co_flags & inspect.CO_OPTIMIZED:
        return False
    path = code.co_filename
    if path.startswith("<"):
        return not path.startswith(("<thunder_rs", "<frozen"))
    known = _interesting_paths.get(path)
    if known is None:
        known = not _in_library(os.path.abspath(path))
        if os.path.isabs(path):  # (a relative one's answer follows the working directory)
            _interesting_paths[path] = known
    return known


#: ``classify``'s flags (``_core.CallObserver``): calls of the code are the program's; its returns
#: are wanted (chains on locals, followed when it returns); it is a module body (runs an import).
CALL, RETURN, MODULE = 1, 2, 4


def classify(code) -> int:
    """The flags of ``code`` for the observer's hook (``CALL``, ``RETURN``, ``MODULE``), once per
    code object and thread."""
    flags = MODULE if code.co_name == "<module>" else 0  # (as ``hook.importing_frame`` tells them)
    if interesting(code):
        reads = code_reads(code)
        flags |= CALL | (RETURN if reads.locals or reads.types else 0)
    return flags


class CodeReads:
    """The read chains of one code object, by kind of root: ``(root name, (attr, ...))``."""

    __slots__ = ("globals", "args", "cells", "locals", "line", "receiver", "types", "stores", "attribute_stores")

    def __init__(self, code):
        chains, whole = _chains(code)
        if _reads_nested(code):
            chains = {(root, (*_before_nested(attrs), ALL_NESTED)) for root, attrs in chains}
        elif whole:
            chains = {(root, (*attrs, ALL_ATTRIBUTES)) for root, attrs in chains}
        n_args = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
        args, free = frozenset(code.co_varnames[:n_args]), frozenset(code.co_freevars)
        self.globals = sorted({(n, a) for (op, n), a in chains if op in ("LOAD_GLOBAL", "LOAD_NAME")})
        self.cells = sorted({(n, a) for (op, n), a in chains if op in ("LOAD_DEREF", "LOAD_CLASSDEREF") and n in free})
        local = {(n, a) for (op, n), a in chains if op not in ("LOAD_GLOBAL", "LOAD_NAME") and n not in free and a}
        self.args = sorted((n, a) for n, a in local if n in args)
        self.locals = sorted((n, a) for n, a in local if n not in args)
        self.line = f"{code.co_filename}:{code.co_firstlineno}"
        #: the first argument's name (``self`` of a method), to tell which modules run
        self.receiver = code.co_varnames[0] if code.co_argcount else None
        #: its calls of ``type`` with one argument (``type_reads``), checked at its entry and return
        self.types = type_calls(code)
        #: the globals it sets or deletes (``global n; n = 1``): ``(name, offset)``, the first of each
        stored: dict = {}
        #: the attributes it sets or deletes of what a global holds (``settings.FLAG = 1``, ``sys.argv
        #: = [...]``): ``((global name, attribute), offset)``, the first of each
        attributes: dict = {}
        previous = None
        for ins in instructions(code):
            if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                stored.setdefault(ins.argval, ins.offset)
            elif ins.opname in ("STORE_ATTR", "DELETE_ATTR") and previous is not None:
                if previous.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                    attributes.setdefault((previous.argval, ins.argval), ins.offset)
            if ins.opname != "CACHE":
                previous = ins
        self.stores = tuple(stored.items())
        self.attribute_stores = tuple(attributes.items())


def _reads_nested(code) -> bool:
    """Whether ``code`` uses one of ``_READS_NESTED``, or both ``reduce`` and ``getattr`` (not
    ``reduce(operator.mul, shape)`` alone)."""
    names = {ins.argval for ins in instructions(code) if ins.opname.startswith("LOAD_")}
    return not names.isdisjoint(_READS_NESTED) or {"reduce", "getattr"} <= names


def _before_nested(attrs: tuple) -> tuple:
    """The steps of a chain before the method that reads by a path (``self.get_submodule(path).gain``
    reads ``self``, nested)."""
    return attrs[: next((i for i, a in enumerate(attrs) if a in _READS_NESTED), len(attrs))]


def _chains(code) -> tuple:
    """``((load op, root name), (attr, ...))`` for each load followed by attribute reads and
    subscripts by a constant key (an ``_Item`` step: ``cfg["sub"]["scale"]``). A read by name,
    ``getattr(chain, "name"[, default])`` or ``hasattr(chain, "name")``, ends its chain with that
    name. With them, whether the code reads objects whole (``_READS_WHOLE``)."""
    attrs: list = []
    chains, root = set(), None
    whole = False
    by_name = False  # the chain being read is getattr's or hasattr's first argument
    after_by_name = False  # the last instruction loaded the builtin getattr or hasattr
    listed = instructions(code)
    stored = _stored_before(code, listed)
    subscripted = False  # the instruction is the subscript of a constant key already taken
    for i, (ins, after) in enumerate(zip(listed, [*listed[1:], None])):
        op = ins.opname
        whole = whole or (op.startswith("LOAD_") and ins.argval in _READS_WHOLE)
        if root is not None and not attrs and op in _LOAD_ATTR and _stored_first(root, ins.argval, stored[i - 1]):
            root = None
            continue
        if subscripted:
            subscripted = False
            continue
        if op in _LOAD_ATTR and root is not None:
            attrs.append(ins.argval)
            continue
        if op in ("PRECALL", "CALL") and ins.arg == 0 and root is not None and attrs and attrs[-1] != CALLED:
            if op == "CALL":  # (3.11's ``PRECALL 0`` before it: passed over)
                attrs.append(CALLED)
            continue
        # A subscript right on a local (``kwargs["x"]``) is not followed: a local is state only
        # through attribute reads, and reading locals has a cost (``frame.f_locals``).
        if (
            op in _CONST_LOADS
            and root is not None
            and (attrs or root[0] not in _LOAD_LOCAL)
            and type(ins.argval) in (str, int)
            and not by_name
            and _is_subscript(after)
        ):
            attrs.append(_Item(ins.argval))
            subscripted = True
            continue
        if op in _COPIES and root is not None:
            continue
        if root is not None:
            if by_name and op == "LOAD_CONST" and type(ins.argval) is str:
                attrs.append(ins.argval)
            elif by_name:
                whole = True  # getattr(cfg, name): any attribute
            chains.add((root, tuple(attrs)))
            root, attrs = None, []
        by_name, after_by_name = after_by_name, op == "LOAD_GLOBAL" and ins.argval in _READS_BY_NAME
        if op in _LOAD_ROOT:
            root = (op, ins.argval)
        elif op in _LOAD_TWO:
            root = ("LOAD_FAST", ins.argval[1])
    if root is not None:
        chains.add((root, tuple(attrs)))
    return chains | _class_chains(listed) | _called_chains(code, listed), whole


def _called_chains(code, listed: list) -> set:
    """The chains read of what a method of the first argument returns when called with arguments
    (``self.get(name).scale``: ``("get", CALLED, "scale")``), followed from what it returns
    (``AttributeReads._await_result``); those of a call with none are ``_chains``'s own."""
    found = set()
    for j, (receiver, called) in _method_calls(code, listed).items():
        attrs = []
        for ins in listed[j + 1 :]:
            if ins.opname not in _LOAD_ATTR:
                break
            attrs.append(ins.argval)
        if attrs:
            found.add((("LOAD_FAST", receiver), (called[len(_CALLED) :], CALLED, *attrs)))
    return found


_NO_OPS = frozenset({"RESUME", "NOP", "CACHE", "EXTENDED_ARG"})


#: id of a getter's code -> (the code, ``returned_chain``'s answer for it): a property read on
#: every call of the code reading it would walk the getter's bytecode again at each
_returned_chains: dict = {}


def returned_chain(fn) -> tuple | None:
    """The attributes of its first argument that the function ``fn`` returns when its whole code
    is ``return self.a.b`` (a property's getter): ``("a", "b")``; else None."""
    code = getattr(fn, "__code__", None)
    if code is None or code.co_argcount != 1:
        return None
    known = _returned_chains.get(id(code))
    if known is None:
        known = _returned_chains[id(code)] = (code, _returned_chain(code))
    return known[1]


def _returned_chain(code) -> tuple | None:
    listed = [ins for ins in instructions(code) if ins.opname not in _NO_OPS]
    if len(listed) < 3 or listed[0].opname not in _LOAD_LOCAL or listed[0].argval != code.co_varnames[0]:
        return None
    *reads, last = listed[1:]
    if last.opname != "RETURN_VALUE" or any(ins.opname != "LOAD_ATTR" for ins in reads):
        return None
    return tuple(ins.argval for ins in reads)


def _class_chains(listed: list) -> set:
    """The chains ``type(x).attr...`` read on a local or cell ``x``, as ``x.__class__.attr...``
    (``type(self).calls += 1``, ``type(cfg).scale``: class attributes, guarded as class reads)."""
    found = set()
    for i, ins in enumerate(listed[:-3]):
        if ins.opname not in ("LOAD_GLOBAL", "LOAD_NAME") or ins.argval != "type":
            continue
        operand = listed[i + 1]
        if operand.opname not in _LOAD_LOCAL and operand.opname != "LOAD_DEREF":
            continue
        j = i + 2
        while j < len(listed) and listed[j].opname == "PRECALL":
            j += 1
        if j >= len(listed) or listed[j].opname not in ("CALL", "CALL_FUNCTION") or listed[j].arg != 1:
            continue
        attrs = ["__class__"]
        for after in listed[j + 1 :]:
            if after.opname in _COPIES:
                continue
            if after.opname not in _LOAD_ATTR:
                break
            attrs.append(after.argval)
        if len(attrs) > 1:
            found.add((("LOAD_FAST" if operand.opname != "LOAD_DEREF" else "LOAD_DEREF", operand.argval), tuple(attrs)))
    return found


_UNCONDITIONAL = frozenset({"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP"})
_ENDS = frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"})
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)


def _stored_first(root: tuple, attr: str, stored: frozenset) -> bool:
    """Whether ``root.attr`` was stored earlier on every path (``self.pyramid = [...]``): the
    chain reads what the call stored, not the state the call began with (RAFT's correlation
    pyramid, rebuilt by each call)."""
    return root[0] in _LOAD_LOCAL and (root[1], attr) in stored


def _stored_before(code, listed: list, calls: dict | None = None, force: bool = False) -> list:
    """For each instruction, the ``(local, attr)`` pairs that every path from the entry stored
    (``self.attr = value``: the local loaded right before ``STORE_ATTR``) before it runs, and
    ``(local, _CALLED + name)`` for the methods called on a local (``calls``, by the index of the
    call: ``self.reset()``). A must-analysis over the bytecode: a store on one branch only, or in a
    ``try`` whose handler goes on, is not stored; an instruction no path reaches has none."""
    none: frozenset = frozenset()
    stores = {ins.argval for ins in listed if ins.opname == "STORE_ATTR"}
    if not force and not calls and not any(ins.opname in _LOAD_ATTR and ins.argval in stores for ins in listed):
        return [none] * len(listed)  # (most code: ``__init__`` stores what it does not read)
    at = {ins.offset: i for i, ins in enumerate(listed)}
    # Python 3.10 has no exception table: its SETUP_FINALLY jumps to the handler with the state
    # before the ``try``, which is fewer stores than any point inside it.
    entries = getattr(dis.Bytecode(code), "exception_entries", ())
    targets = [ins.argval for ins in listed if ins.opcode in _JUMPS] + [e.target for e in entries]
    if not all(t in at for t in targets):
        return [none] * len(listed)  # a path it cannot follow: nothing is surely stored
    handlers = [(e.start, e.end, at[e.target]) for e in entries]
    before: list = [None] * len(listed)  # None: no path seen yet
    before[0], work = none, [0]
    while work:
        i = work.pop()
        ins, now = listed[i], before[i]
        after = _store_effect(listed, i, now) | ({calls[i]} if calls and i in calls else none)
        nexts = [at[ins.argval]] if ins.opcode in _JUMPS else []
        if ins.opname not in _ENDS and ins.opname not in _UNCONDITIONAL and i + 1 < len(listed):
            nexts.append(i + 1)
        edges = [(n, after) for n in nexts] + [(t, now) for s, e, t in handlers if s <= ins.offset < e]
        for n, state in edges:
            merged = state if before[n] is None else before[n] & state
            if merged != before[n]:
                before[n] = merged
                work.append(n)
    return [none if b is None else b for b in before]


def _store_effect(listed: list, i: int, now: frozenset) -> frozenset:
    """The stored pairs after instruction ``i``: a store of an attribute on a local adds it, a
    new value of the local or a deleted attribute takes pairs away."""
    ins, load = listed[i], listed[i - 1] if i > 0 else None
    if ins.opname == "STORE_ATTR" and load is not None and load.opname in _LOAD_LOCAL:
        return now | {(load.argval, ins.argval)}
    if ins.opname == "STORE_ATTR" and load is not None and load.opname in _LOAD_TWO:  # 3.13: value, then self
        return now | {(load.argval[1], ins.argval)}
    if ins.opname == "DELETE_ATTR":
        return frozenset(p for p in now if p[1] != ins.argval)
    if ins.opname.startswith("STORE_FAST") or ins.opname == "DELETE_FAST":  # 3.13: STORE_FAST_LOAD_FAST too
        names = ins.argval if type(ins.argval) is tuple else (ins.argval,)
        return frozenset(p for p in now if p[0] not in names)
    return now


#: Marks a method called on a local among ``_stored_before``'s pairs: ``(local, _CALLED + name)``.
_CALLED = "()"


def _method_calls(code, listed: list) -> dict:
    """``{index of the call: (receiver, _CALLED + method)}`` for each ``self.method(...)`` on the
    code's first argument whose arguments hold no jump (found by the stack depth from the
    method's load to its call)."""
    calls: dict = {}
    receiver = code.co_varnames[0] if code.co_argcount else None
    for k in range(1, len(listed) if receiver is not None else 0):
        ins, load = listed[k], listed[k - 1]
        if ins.opname not in _LOAD_ATTR or load.opname not in _LOAD_LOCAL or load.argval != receiver:
            continue
        depth = 0
        for j in range(k + 1, min(len(listed), k + 200)):
            nxt = listed[j]
            if nxt.opcode in _JUMPS or nxt.opname in _ENDS:
                break
            depth += dis.stack_effect(nxt.opcode, nxt.arg if nxt.opcode >= dis.HAVE_ARGUMENT else None, jump=False)
            if depth < 0:
                if nxt.opname.startswith("CALL"):
                    calls[j] = (load.argval, _CALLED + ins.argval)
                break
    return calls


def _stores_at_return(code) -> frozenset:
    """The pairs (``_stored_before``'s) that every path from ``code``'s entry to a return holds."""
    listed = instructions(code)
    before = _stored_before(code, listed, force=True)
    returns = [before[i] for i, ins in enumerate(listed) if ins.opname in ("RETURN_VALUE", "RETURN_CONST")]
    return frozenset.intersection(*returns) if returns else frozenset()


#: id(code) -> (code, the pairs every return of it holds): see ``_stores_at_return``
_returns: dict = {}


def _stores_of(cls: type, method: str) -> frozenset:
    """The attributes a call of ``cls``'s ``method`` stores on its receiver on every path (not
    through the methods it calls in turn)."""
    fn = inspect.getattr_static(cls, method, None)
    code = getattr(fn, "__code__", None)
    if code is None or not code.co_argcount:
        return frozenset()
    known = _returns.get(id(code))
    if known is None:
        known = _returns[id(code)] = (code, _stores_at_return(code))
    receiver = code.co_varnames[0]
    return frozenset(a for n, a in known[1] if n == receiver and not a.startswith(_CALLED))


#: id(code) -> (code, ``{attr: [methods called before each read of it], ...}``)
_after_calls: dict = {}


def _reads_after_calls(code) -> dict:
    """For each read of an attribute of ``code``'s first argument (``self.items``), the methods
    called on it before that read on every path (``self.reset()``), by attribute: a list of sets.
    Under None, reads this walk cannot pair with their object (``getattr(self, name)``)."""
    known = _after_calls.get(id(code))
    if known is not None:
        return known[1]
    listed = instructions(code)
    receiver = code.co_varnames[0]
    before = _stored_before(code, listed, _method_calls(code, listed), force=True)
    found: dict = {}
    for i in range(1, len(listed)):
        load, ins = listed[i - 1], listed[i]
        if ins.opname in _LOAD_ATTR and load.opname in _LOAD_LOCAL and load.argval == receiver:
            called = {a[len(_CALLED) :] for n, a in before[i - 1] if n == receiver and a.startswith(_CALLED)}
            found.setdefault(ins.argval, []).append(called)
        elif (
            (ins.opname in _LOAD_TWO and ins.argval[1] == receiver)
            or (ins.opname in _LOAD_ATTR and load.opname in _COPIES)
            or (ins.opname.startswith("LOAD_") and ins.argval in _READS_BY_NAME | _READS_WHOLE)
        ):
            found[None] = [set()]
    _after_calls[id(code)] = (code, found)
    return found


#: ``(id(code), class) -> (code, {attr: the methods code calls on its receiver that store it},
#: {those methods' names: the functions found})``
_storing_calls: dict = {}


def storing_methods(code, reads: CodeReads, cls: type) -> dict:
    """``{attr: methods}``: the attributes that methods of ``cls`` which ``code`` calls on its
    first argument store on it on every path. Found again when one of them was rebound."""
    known = _storing_calls.get((id(code), cls))
    if known is None or any(inspect.getattr_static(cls, m, None) is not fn for m, fn in known[2].items()):
        found: dict = {}
        for m in {a[0] for n, a in reads.args if n == reads.receiver and a and type(a[0]) is str}:
            for attr in _stores_of(cls, m):
                found.setdefault(attr, set()).add(m)
        storing = {m: inspect.getattr_static(cls, m, None) for ms in found.values() for m in ms}
        known = _storing_calls[(id(code), cls)] = (code, found, storing)
    return known[1]


def stored_by_calls(code, reads: CodeReads, attrs: tuple, value, storing: dict | None = None) -> bool:
    """Whether every read of ``self.attr`` (``attrs[0]``; ``value`` is ``code``'s first argument)
    comes after a call of one of its methods that stored that attribute on every path
    (``self.reset()`` setting ``self.items = []``, then ``self.items``): the chain reads what the
    call stored, not what the state held when the call began (guarding that recompiled on every
    call). Methods set on the instance are not followed. ``storing``: ``storing_methods(code,
    reads, type(value))`` when the caller found it (once per call, for each chain on ``self``)."""
    stores = (storing if storing is not None else storing_methods(code, reads, type(value))).get(attrs[0])
    if not stores:
        return False
    own = attributes_of(value)
    if own is not None and any(m in own for m in stores):
        return False
    reads_of = _reads_after_calls(code)
    if None in reads_of:
        return False
    return all(called & stores for called in reads_of.get(attrs[0], [set()]))


#: id(code) -> (code, its reads). By id: hashing a code object hashes its whole contents; the
#: code object is kept so that its id is not reused.
_code_reads: dict = {}


def code_reads(code) -> CodeReads:
    known = _code_reads.get(id(code))
    if known is None:
        known = _code_reads[id(code)] = (code, CodeReads(code))
    return known[1]
