"""The reads a function's code can make, found once from its bytecode (:class:`CodeReads`):
globals, closure cells, and attribute chains on its arguments and locals (``self.config.scale``,
``cfg["sub"]["scale"]``, ``getattr(cfg, "scale", 1.0)``); and which code's reads are the program's
(``interesting``: not torch's internals, thunder_rs or the standard library). The observer
(``observe.py``) evaluates them at each call of the traced program."""

import dis
import inspect
import os
import sysconfig

import torch

from thunder_rs.core.base.userframe import PACKAGE_DIR
from thunder_rs.core.state.guards import Item as _Item
from thunder_rs.core.state.identity import instructions


def _dir(path: str) -> str:
    return os.path.dirname(os.path.abspath(path)) + os.sep


_TORCH_DIR = _dir(torch.__file__)
#: torch code whose reads are the program's: the standard modules' forwards (``self.p``, ``self.eps``)
#: and the distributions' methods (``self.loc`` of a prior the program keeps).
_TORCH_MODULES_DIR = os.path.join(_TORCH_DIR, "nn", "modules") + os.sep
_TORCH_DISTRIBUTIONS_DIR = os.path.join(_TORCH_DIR, "distributions") + os.sep
_TORCH_MODULES_SKIPPED = ("module.py", "lazy.py", "_functions.py")
STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
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
#: The last step of every chain of a code that reads objects whole (``_READS_WHOLE``, or
#: ``getattr(cfg, name)`` by a computed name): the object the chain reaches is guarded whole.
ALL_ATTRIBUTES = "<all attributes>"


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


_library_modules: dict = {}


def library_module(module) -> bool:
    """Whether ``module`` is torch, thunder_rs or the standard library (cached by id; modules live
    as long as the process)."""
    known = _library_modules.get(id(module))
    if known is None:
        path = getattr(module, "__file__", None)
        known = _library_modules[id(module)] = path is None or _in_library(os.path.abspath(path))
    return known


def interesting(code) -> bool:
    """Whether the reads of ``code`` are the program's (user code, other libraries, torch.nn modules).
    Module and class bodies (code without fast locals) run at import, not as the program."""
    if not code.co_flags & inspect.CO_OPTIMIZED:
        return False
    path = code.co_filename
    if path.startswith("<"):
        return not path.startswith(("<thunder_rs", "<frozen"))
    return not _in_library(os.path.abspath(path))


class CodeReads:
    """The read chains of one code object, by kind of root: ``(root name, (attr, ...))``."""

    __slots__ = ("globals", "args", "cells", "locals", "line", "receiver")

    def __init__(self, code):
        chains, whole = _chains(code)
        if whole:
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
    return chains, whole


_UNCONDITIONAL = frozenset({"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP"})
_ENDS = frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"})
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)


def _stored_first(root: tuple, attr: str, stored: frozenset) -> bool:
    """Whether ``root.attr`` was stored earlier on every path (``self.pyramid = [...]``): the
    chain reads what the call stored, not the state the call began with (RAFT's correlation
    pyramid, rebuilt by each call)."""
    return root[0] in _LOAD_LOCAL and (root[1], attr) in stored


def _stored_before(code, listed: list) -> list:
    """For each instruction, the ``(local, attr)`` pairs that every path from the entry stored
    (``self.attr = value``: the local loaded right before ``STORE_ATTR``) before it runs. A
    must-analysis over the bytecode: a store on one branch only, or in a ``try`` whose handler
    goes on, is not stored; an instruction no path reaches has none."""
    none: frozenset = frozenset()
    stores = {ins.argval for ins in listed if ins.opname == "STORE_ATTR"}
    if not any(ins.opname in _LOAD_ATTR and ins.argval in stores for ins in listed):
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
        after = _store_effect(listed, i, now)
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


#: id(code) -> (code, its reads). By id: hashing a code object hashes its whole contents; the
#: code object is kept so that its id is not reused.
_code_reads: dict = {}


def code_reads(code) -> CodeReads:
    known = _code_reads.get(id(code))
    if known is None:
        known = _code_reads[id(code)] = (code, CodeReads(code))
    return known[1]
