"""The user's frame: the innermost one outside thunder_rs and torch, which errors, warnings and
log records name."""

import ast
import dis
import inspect
import linecache
import os
import re
import sys
import textwrap
import tokenize
import warnings
import weakref

import torch

#: The thunder_rs package's directory (this file is thunder_rs/core/base/userframe.py): frames there
#: are never the user's.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep  # (not torchvision's, beside it)


def is_user_file(path: str) -> bool:
    """Whether code in ``path`` is the user's: not thunder_rs's, torch's or generated."""
    return not path.startswith(("<frozen", "<thunder_rs", PACKAGE_DIR, _TORCH_DIR))


def user_frame():
    """The innermost frame outside thunder_rs and torch (None when there is none)."""
    frame = sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


def user_location() -> str:
    """``file:line`` of the innermost frame outside thunder_rs and torch; in a graph Dynamo made
    (``torch.compile``), the user's line that the graph's call came from."""
    frame = user_frame()
    if frame is None:
        return "<unknown>"
    if frame.f_code.co_filename.startswith("<eval_with_key>"):
        where = _graph_source(frame)
        if where is not None:
            return where
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


_STACK_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def _graph_source(frame) -> str | None:
    """``file:line`` of the user's code a GraphModule's generated line runs: the last frame of its
    node's ``stack_trace`` (which Dynamo records), None where there is none."""
    gm = frame.f_locals.get("self")
    lines = getattr(gm, "_lineno_map", None)
    if not lines:
        return None
    index = lines.get(frame.f_lineno - getattr(gm, "_prologue_start", 0))
    nodes = list(gm.graph.nodes)
    if index is None or index >= len(nodes):
        return None
    found = _STACK_LINE.findall(nodes[index].meta.get("stack_trace") or "")
    return f"{found[-1][0]}:{found[-1][1]}" if found else None


#: Methods that change a list or dict in place.
_MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem", "__setitem__"}
)


def store_site(origin: str, name, held: bool = False) -> str:
    """``file:line`` of the first statement, in the function defined at ``origin`` (``file:line``,
    its first line), that changes a list or dict it knows as ``name`` (``self.cache[k] = v``,
    ``cache.append(v)``, ``cfg["cache"][k] = v``); ``origin`` when there is none. ``held``: else,
    of the first that changes a container ``name`` holds (``stats["seen"].append(v)``). For error
    messages only: it parses the function's file."""
    path, _, first = origin.rpartition(":")
    try:
        tree = ast.parse("".join(linecache.getlines(path)))
    except (SyntaxError, ValueError):
        return origin
    nodes = [
        node
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and str(_first_line(fn)) == first
        for node in ast.walk(fn)
        if isinstance(node, (ast.stmt, ast.expr))
    ]
    lines = [node.lineno for node in nodes if _changes(node, name)]
    if held and not lines:
        lines = [node.lineno for node in nodes if _changes(node, name, _rooted)]
    return f"{path}:{min(lines)}" if lines else origin


def read_site(origin: str, name) -> str:
    """``file:line`` of the first place, in the function defined at ``origin`` (``file:line``, its
    first line), that reads ``name`` (``self.seen``, a global ``seen``, ``cfg["seen"]``);
    ``origin`` when there is none, or when no function starts there (a read seen as it ran
    already names its line). For error messages only: it parses the function's file."""
    path, _, first = origin.rpartition(":")
    if not isinstance(name, str) or not linecache.getlines(path):
        return origin
    try:
        tree = ast.parse("".join(linecache.getlines(path)))
    except (SyntaxError, ValueError):
        return origin
    lines = [
        node.lineno
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and str(_first_line(fn)) == first
        for node in ast.walk(fn)
        if isinstance(node, (ast.Attribute, ast.Name, ast.Subscript))
        and isinstance(node.ctx, ast.Load)
        and _named(node, name)
        or isinstance(node, ast.AugAssign)  # (``type(self).calls += 1`` reads it too)
        and _named(node.target, name)
    ]
    return f"{path}:{min(lines)}" if lines else origin


def _first_line(fn) -> int:
    return min([fn.lineno, *(d.lineno for d in getattr(fn, "decorator_list", ()))])


def _changes(node, name, named=None) -> bool:
    """Whether the statement or call ``node`` changes a container named ``name`` (``named``: how
    the container's expression is matched with it, by default ``_named``)."""
    named = named or _named
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        return any(isinstance(t, ast.Subscript) and named(t.value, name) for t in targets)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _MUTATORS
        and named(node.func.value, name)
    )


def _rooted(expr, name) -> bool:
    """Whether ``expr`` is reached from the variable ``name`` by items and attributes (``stats["seen"]``)."""
    while isinstance(expr, (ast.Subscript, ast.Attribute)):
        expr = expr.value
    return isinstance(expr, ast.Name) and expr.id == name


def _named(expr, name) -> bool:
    if isinstance(expr, ast.Attribute):
        return expr.attr == name
    if isinstance(expr, ast.Name):
        return expr.id == name
    return isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and expr.slice.value == name


def callable_name(fn) -> str:
    """How messages name a jitted callable: its qualified name, else its type's name (a module)."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def warn_recompiles(name: str, misses: int, reason: str) -> None:
    warn_at_user_frame(f"thunder_rs: {name} recompiled {misses} times; last change: {reason}")


def warn_at_user_frame(message: str) -> None:
    """Warns at the user's call site: the first frame outside thunder_rs and torch."""
    frame = user_frame()
    if frame is None:
        warnings.warn(message, stacklevel=4)
    else:
        warnings.warn_explicit(
            message, UserWarning, frame.f_code.co_filename, frame.f_lineno, module=frame.f_globals.get("__name__")
        )


def handling_frame():
    """The innermost of the user's frames on the stack, up to the one thunder_rs called, that runs
    its current line inside the body of a ``try`` statement with ``except`` clauses (where an
    exception raised there is handled by the program); None where there is none."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code not in _PROGRAM_ENTRIES:  # (the frames beyond are not its)
        if is_user_file(frame.f_code.co_filename) and _in_try_body(frame.f_code, frame.f_lineno):
            return frame
        frame = frame.f_back
    return None


#: the codes of thunder_rs's functions that call the program (``program_entry``)
_PROGRAM_ENTRIES: set = set()


def program_entry(function):
    """Marks ``function`` as one that calls the program being traced: ``handling_frame`` looks no
    further out (the program may be torch's own function, even a builtin: no frame of its own)."""
    _PROGRAM_ENTRIES.add(function.__code__)
    return function


def _in_try_body(code, lineno: int | None) -> bool:
    if lineno is None:
        return False
    return any(first <= lineno <= last for first, last in _try_bodies(code))


#: code object -> its ``try`` bodies' line ranges (kept while the code lives)
_TRY_BODIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _try_bodies(code) -> tuple:
    """The line ranges of the bodies of the ``try`` statements with ``except`` clauses in the
    function of ``code`` (not in functions it defines), by parsing its file once per code object."""
    found = _TRY_BODIES.get(code)
    if found is None:
        found = _TRY_BODIES[code] = _parsed_try_bodies(code) if _handles_exceptions(code) else ()
    return found


_SETUP_FINALLY = dis.opmap.get("SETUP_FINALLY")  # (3.10's; later ones keep a table)
#: 3.11 on: the opcodes only an ``except`` clause compiles to (one naming what it catches; an
#: ``except*``), and a bare ``except:``'s first two (it pops the exception it handles; a ``with``'s
#: handler goes on with ``WITH_EXCEPT_START``, a ``finally``'s with its body, a statement)
_EXCEPT_OPS = bytes(dis.opmap[name] for name in ("CHECK_EXC_MATCH", "CHECK_EG_MATCH") if name in dis.opmap)
_BARE_EXCEPT = bytes((dis.opmap["PUSH_EXC_INFO"], dis.opmap["POP_TOP"])) if "PUSH_EXC_INFO" in dis.opmap else b""


def _handles_exceptions(code) -> bool:
    """Whether ``code`` may have a ``try`` statement with ``except`` clauses, without parsing its
    file: from 3.11, one whose opcodes have an ``except`` clause's (a ``with``, a ``try`` with only
    ``finally`` and a comprehension have handlers too, and need no parse); on 3.10, one with a
    ``SETUP_FINALLY`` (which every ``try`` starts with)."""
    table = getattr(code, "co_exceptiontable", None)
    if table is not None:
        if not table:
            return False
        ops = code.co_code[::2]  # (each instruction's opcode; inline caches read as 0)
        return any(op in ops for op in _EXCEPT_OPS) or _BARE_EXCEPT in ops
    raw = code.co_code
    return any(raw[i] == _SETUP_FINALLY for i in range(0, len(raw), 2))


def _parsed_try_bodies(code) -> tuple:
    fn, shift = _function_node(code)
    if fn is None:
        return ()
    tries = [node for node in _own_nodes(fn) if isinstance(node, _TRIES) and node.handlers]
    return tuple((t.body[0].lineno + shift, (t.body[-1].end_lineno or t.body[-1].lineno) + shift) for t in tries)


def _function_node(code) -> tuple:
    """The syntax tree of the function of ``code`` and what to add to its line numbers: its own
    lines parsed where they parse alone (a file of transformers' takes tens of milliseconds
    whole), else found in its file's tree; (None, 0) where neither has it."""
    lines, first = linecache.getlines(code.co_filename), code.co_firstlineno
    if code.co_name != "<lambda>" and 0 < first <= len(lines):
        try:
            tree = ast.parse(textwrap.dedent("".join(inspect.getblock(lines[first - 1 :]))))
        except (SyntaxError, ValueError, tokenize.TokenError):
            tree = None  # (a docstring's lines left of the def's indentation: the file's tree)
        fn = tree.body[0] if tree is not None and tree.body else None
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name == code.co_name:
            return fn, first - 1
    tree = _parsed(code.co_filename)
    if tree is None:
        return None, 0
    defs = [
        fn
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and _first_line(fn) == first
    ]
    return (defs[0], 0) if defs else (None, 0)


_TRIES = (ast.Try, getattr(ast, "TryStar", ast.Try))
#: path -> (its lines as ``linecache`` holds them, their syntax tree): a file parsed once for all
#: its functions while ``linecache`` keeps the same lines
_TREES: dict = {}


def _parsed(path: str):
    lines = linecache.getlines(path)
    held = _TREES.get(path)
    if held is not None and held[0] is lines:
        return held[1]
    try:
        tree = ast.parse("".join(lines))
    except (SyntaxError, ValueError):
        tree = None
    if len(_TREES) >= 16:  # (a few files' trees kept, not every file's ever read)
        _TREES.clear()
    _TREES[path] = (lines, tree)
    return tree


def _own_nodes(fn):
    """The nodes of the function ``fn``, not those of the functions and classes it defines."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
