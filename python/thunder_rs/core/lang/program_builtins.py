"""``int`` and ``float`` of sizes in the program's own code: symbolic, where the module only calls them.

Python's ``int(x)`` and ``float(x)`` must return a plain int and a plain float, so of a symbolic size
(``int(x.size(0))``, ``float(len(x))``, ``torch.full((n,), float(n))``, ``x[: int(T / 2)]``) they
took its value, a guard on it: a compile per length, where torch.compile keeps them symbolic (it
interprets the bytecode). While a program is traced, the globals of the program's modules that
call them hold a stand-in under the name (``int``, ``float``), put there when the program's first
function of the module that calls it is entered: of a size, ``int`` is the size itself and
``float`` the float ``T * 1.0`` computes (``SymFloat``, as ``torch.sym_float`` gives); of a float
of sizes, ``int`` truncates as Python's does (``int(T / 2)`` is ``T // 2``, with ``T >= 0``
guarded; a negative one, the int its value is, its range guarded: ``symint.int_of``) and ``float``
is the float itself. A decision on what they give guards as one on the size
does (``if float(n) > 3.5``: a relation); anything else is the builtin's own call, with its
answer and errors. Every stand-in is taken away when the last acquisition in progress ends.

Only where the name is never read but to call it: the stand-in is a function, where
``isinstance(v, int)``, ``type(v) is float``, ``dtype=float`` or ``int.from_bytes`` need the class.
The module's source is compiled (once per module) and every function in it is read: a load of the
name that is not the callee of a call (``LOAD_GLOBAL (NULL + int)``) anywhere in code that can run
after import (functions, lambdas, comprehensions, classes made in them) keeps the builtin for the
whole module, so code of the module other threads run meanwhile (where the stand-in calls the
builtin: no acquisition there) is never handed a function for the class either. A function whose
code is not the source's (the file changed since the import, code made by ``exec``) takes the
stand-in away from its module on entry, before its first instruction runs, as does a module
without readable source: the sizes are then specialised, as before. A module that defines the
name itself keeps its own. Text evaluated in the module's globals (``eval("int")``) is not read.
"""

import importlib.util
import linecache
import marshal
import os
import sys
import threading
import types

from thunder_rs.core.lang.recorder import active_recorder
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt, int_of
from thunder_rs.core.state.identity import instructions
from thunder_rs.core.state.observe import PROGRAM_CALLS, TRACING_GLOBALS

_builtin_int, _builtin_float = int, float


def _program_int(*args, **kwargs):
    """``int`` in the program's modules while tracing (see the module doc)."""
    if len(args) == 1 and not kwargs and active_recorder() is not None:
        x = args[0]
        if type(x) is SymInt:
            return x
        if type(x) is SymFloat:
            return int_of(x)
    return _builtin_int(*args, **kwargs)


def _program_float(*args, **kwargs):
    """``float`` in the program's modules while tracing (see the module doc)."""
    if len(args) == 1 and not kwargs and active_recorder() is not None:
        x = args[0]
        if type(x) is SymInt:
            return x.__sym_float__()
        if type(x) is SymFloat and not x.numpy:
            return x
    return _builtin_float(*args, **kwargs)


#: The stand-ins by the name they take.
STAND_INS = {"int": _program_int, "float": _program_float}
TRACING_GLOBALS.update(map(id, STAND_INS.values()))
_NAMES = tuple(STAND_INS)

_lock = threading.Lock()
#: ``(globals, name)`` of each stand-in put, to take away.
_put: list = []
#: Per module's globals (by id, with them): the names its code only calls, and the code it runs
#: by ``(name, first line, bytecode)``; None where its source could not be read.
_modules: dict = {}
#: Per code object (by id, with it): the names it only calls, or None where it reads one otherwise.
_codes: dict = {}


def _loads(code) -> tuple:
    """``(called, other)``: the names of ``_NAMES`` that ``code`` loads as the callee of a call,
    and those it loads another way."""
    called: set = set()
    other: set = set()
    for ins in instructions(code):
        if ins.argval in _NAMES and ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            (called if ins.opname == "LOAD_GLOBAL" and ins.arg & 1 else other).add(ins.argval)
    return called, other


def _uses(code) -> bool:
    names = code.co_names
    return "int" in names or "float" in names


def _scan(g: dict):
    """``(names only called, code keys)`` of the module whose globals are ``g`` (see ``_modules``)."""
    path = g.get("__file__")
    if not isinstance(path, str):
        return None
    top = _cached_code(path)
    if top is None:
        lines = linecache.getlines(path, g)
        try:
            top = compile("".join(lines), path, "exec", dont_inherit=True) if lines else None
        except (SyntaxError, ValueError, TypeError):
            top = None
    if top is None:
        return None
    unsafe, keys = set(), set()
    pending = [(top, False)]
    while pending:
        code, runs = pending.pop()
        runs = runs or bool(code.co_flags & 1)  # (CO_OPTIMIZED: a function's; bodies run at import)
        if runs and _uses(code):
            unsafe |= _loads(code)[1]
            keys.add((code.co_name, code.co_firstlineno, code.co_code))
        pending += [(c, runs) for c in code.co_consts if isinstance(c, types.CodeType)]
    return frozenset(_NAMES) - unsafe, keys


def _cached_code(path: str):
    """The code of the module at ``path`` as its import compiled it, from the bytecode cache
    (``__pycache__``), where a file there was compiled from the source as it is now (its size and
    modification time, as ``import`` checks them; a pyc checked by hash is not read); else None.
    Reading it costs a fraction of compiling the source again (48 ms of a large module's)."""
    try:
        stat = os.stat(path)
        with open(importlib.util.cache_from_source(path), "rb") as f:
            data = f.read()
    except (OSError, ValueError, NotImplementedError):
        return None
    header = (importlib.util.MAGIC_NUMBER, 0, int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)
    found = (data[:4], *(int.from_bytes(data[i : i + 4], "little") for i in (4, 8, 12)))
    if found != header:
        return None
    try:
        code = marshal.loads(memoryview(data)[16:])
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, types.CodeType) else None


def _module(g: dict):
    known = _modules.get(id(g))
    if known is None or known[0] is not g:
        known = _modules[id(g)] = (g, _scan(g))
    return known[1]


def note_call(code, g: dict) -> None:
    """The program enters ``code`` with globals ``g`` (``observe.PROGRAM_CALLS``): the stand-ins of
    the names it calls are put in ``g`` where the module's code only calls them; those it cannot
    have are taken away first."""
    if not _uses(code):
        return
    known = _codes.get(id(code))
    if known is None or known[0] is not code:
        known = _codes[id(code)] = (code, _loads(code)[0])
    module, called = _module(g), known[1]
    with _lock:
        own = module is not None and (code.co_name, code.co_firstlineno, code.co_code) in module[1]
        for name in _NAMES:
            stand_in = STAND_INS[name]
            if own and name in module[0] and name in called and name not in g:
                g[name] = stand_in
                _put.append((g, name))
            elif not own and g.get(name) is stand_in:
                del g[name]


def take_away() -> None:
    """Takes every stand-in away (the last acquisition in progress ended)."""
    with _lock:
        for g, name in _put:
            if g.get(name) is STAND_INS[name]:
                del g[name]
        _put.clear()


if sys.version_info >= (3, 11):  # (the callee flag of ``LOAD_GLOBAL``; 3.10 keeps the builtins)
    PROGRAM_CALLS.append(note_call)
