"""What the program does next with a value, told by its caller's bytecode, where that lets a
trace rely on less than the whole value.

Text made from a size holds its value, so making it specialises the size (``SymInt.__str__``).
``torch._assert(cond, f"... got {boxes.shape}")`` (torchvision's detection models check their
targets so) builds its message before the call, whether the condition holds or not: the message is
read only when the condition fails, and then the program raises while it is traced, with the
values of that call. A later call where the condition fails misses the guards or checks that the
condition recorded and is traced again, raising there. So a size formatted straight into an
argument of ``torch._assert`` is shown by its value and specialises nothing
(``only_assert_message``).

A float read from a tensor and passed straight to ``int`` (``int(t.item())``: torchvision's
``torch_choice`` draws a random index so) is used only as that int: the read's check compares the
int, not the float, which differs on every draw (``only_truncated``).

A size formatted straight into an argument of ``print`` or of a logging method (``log.info(f"T={T}")``,
``logging.warning``) reaches only that call, which tracing records and every compiled call makes
again: the text is made again by each call from its sizes (``printed_text``, ``only_printed``).

The caller's bytecode tells: from the instruction at hand, only loads and string building up to a
call whose callable (the instruction starting where the call's source starts) is the function.
"""

import builtins
import dis
import functools
import logging
import sys
import warnings

import torch

from thunder_rs.core.state.cached_reads import is_stand_in

# Instructions that may stand between formatting a size and passing the text to the call: loads
# and string building, nothing that reads the text (no comparison, no jump, no other call).
_BUILDING = frozenset(
    {
        "CACHE",
        "LOAD_CONST",
        "LOAD_FAST",
        "LOAD_DEREF",
        "LOAD_ATTR",
        "BINARY_SUBSCR",
        "FORMAT_VALUE",
        "FORMAT_SIMPLE",
        "FORMAT_WITH_SPEC",
        "CONVERT_VALUE",
        "BUILD_STRING",
    }
)
_CALLS = frozenset({"PRECALL", "CALL"})
# From Python 3.12, ``LOAD_ATTR`` loads a method with its object when the low bit of its argument is set.
_METHOD_FLAG = sys.version_info >= (3, 12)
#: The methods of a ``logging.Logger`` (and functions of ``logging``) that log a message.
_LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "fatal", "log"})


@functools.lru_cache(maxsize=512)
def _instructions(code) -> tuple[list, dict]:
    instructions = list(dis.get_instructions(code))
    return instructions, {ins.offset: k for k, ins in enumerate(instructions)}


def _is_torch_assert(load, frame) -> bool:
    """Whether ``load`` (the instruction before the call's arguments) loads ``torch._assert``."""
    if load.opname == "LOAD_GLOBAL" and load.argval == "_assert":
        return frame.f_globals.get("_assert") is torch._assert
    if load.opname in ("LOAD_ATTR", "LOAD_METHOD") and load.argval == "_assert":
        return True  # its object is checked by the caller (the load before it)
    return False


def _callable_load(instructions, k: int, call):
    """The instruction before ``k`` that loads the callable of ``call``: the last one whose source
    starts where the call's does and ends before the argument at ``k``; None if none."""
    start = (call.positions.lineno, call.positions.col_offset)
    at = instructions[k].positions
    for j in range(k - 1, -1, -1):
        ins = instructions[j]
        p = ins.positions
        if p is None or p.lineno is None:
            return None
        if (p.lineno, p.col_offset) == start and (p.end_lineno, p.end_col_offset) <= (at.lineno, at.col_offset):
            return j
        if (p.lineno, p.col_offset) < start:
            return None
    return None


def _enclosing_call(frame, argc: int):
    """The instructions of ``frame``'s code, the index of the callable's load, and of the call that
    the instruction ``frame`` runs builds an argument of (with ``argc`` arguments, nothing but
    loads and string building in between); None when there is no such call."""
    instructions, index = _instructions(frame.f_code)
    k = index.get(frame.f_lasti)
    if k is None or instructions[k].positions is None or instructions[k].positions.lineno is None:
        return None
    c = k + 1
    while c < len(instructions) and instructions[c].opname in _BUILDING:
        c += 1
    if c >= len(instructions) or instructions[c].opname not in _CALLS or instructions[c].arg != argc:
        return None
    call = instructions[c]
    if call.positions is None or call.positions.lineno is None:
        return None
    j = _callable_load(instructions, k, call)
    return None if j is None else (instructions, j)


def only_assert_message(frame) -> bool:
    """Whether the instruction ``frame`` runs formats text passed straight to a ``torch._assert``
    call (see the module doc)."""
    found = _enclosing_call(frame, 2)
    if found is None:
        return False
    instructions, j = found
    if not _is_torch_assert(instructions[j], frame):
        return False
    if instructions[j].opname == "LOAD_GLOBAL":
        return True
    owner = instructions[j - 1] if j else None
    return owner is not None and owner.opname == "LOAD_GLOBAL" and frame.f_globals.get(owner.argval) is torch


def only_truncated(frame) -> bool:
    """Whether the call ``frame`` runs returns its value straight to the builtin ``int`` (see the
    module doc)."""
    found = _enclosing_call(frame, 1)
    if found is None:
        return False
    load = found[0][found[1]]
    if load.opname != "LOAD_GLOBAL" or load.argval != "int":
        return False
    builtins = frame.f_builtins
    return frame.f_globals.get("int", builtins.get("int")) is int


def _loaded(load, frame):
    """The object a ``LOAD_GLOBAL``, ``LOAD_FAST`` or ``LOAD_DEREF`` of ``frame`` loads (None for
    another instruction)."""
    if load.opname == "LOAD_GLOBAL":
        return frame.f_globals.get(load.argval, frame.f_builtins.get(load.argval))
    if load.opname in ("LOAD_FAST", "LOAD_DEREF"):
        return frame.f_locals.get(load.argval)
    return None


def _pops_pushes(ins, after_precall: bool) -> tuple[int, int] | None:
    """How many values ``ins`` takes off the stack and puts on it, for the instructions that may
    come between printed text and its call (loads, subscripts, string building, calls); None for
    any other (a jump, a store, unpacking)."""
    name, arg = ins.opname, ins.arg
    if name in ("LOAD_CONST", "LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE"):
        return 0, 1
    if name == "LOAD_GLOBAL":
        return 0, 1 + (arg & 1)  # (and a NULL before a callable)
    if name == "LOAD_ATTR":
        return 1, 1 + (arg & 1 if _METHOD_FLAG else 0)
    if name == "LOAD_METHOD":
        return 1, 2
    if name in ("BINARY_SUBSCR", "BINARY_OP"):
        return 2, 1
    if name == "FORMAT_VALUE":
        return 1 + bool(arg & 4), 1
    if name in ("BUILD_STRING", "BUILD_TUPLE", "BUILD_LIST"):
        return arg, 1
    if name == "PRECALL":
        return arg, 0
    if name == "CALL":
        return (2, 1) if after_precall else (arg + 2, 1)
    if name in ("CACHE", "KW_NAMES", "NOP"):
        return 0, 0
    return None


def only_printed(frame) -> bool:
    """Whether the instruction ``frame`` runs makes text that reaches nothing but a call of
    ``print`` or of a logging method of a ``logging.Logger`` or of ``logging`` named where it is
    called, as one of its arguments or joined into one by an f-string (see the module doc): the
    stack from there on, through straight-line loads, calls and string building, until an
    instruction takes the text."""
    instructions, index = _instructions(frame.f_code)
    k = index.get(frame.f_lasti)
    if k is None or instructions[k].positions is None or instructions[k].positions.lineno is None:
        return False
    depth, after_precall = 1, False  # values on the stack from the text up
    for c in range(k + 1, len(instructions)):
        ins = instructions[c]
        effect = _pops_pushes(ins, after_precall)
        if effect is None:
            return False
        pops, pushes = effect
        if pops >= depth:  # ``ins`` takes the text
            if ins.opname == "BUILD_STRING":
                depth = pushes
            elif ins.opname in _CALLS and not (ins.opname == "CALL" and after_precall):
                return _is_print_or_log(instructions, _callable_load(instructions, k, ins), frame)
            elif ins.opname != "FORMAT_VALUE" or ins.arg != 0:  # (an f-string's piece as it is)
                return False
        else:
            depth += pushes - pops
        after_precall = ins.opname == "PRECALL" or (after_precall and ins.opname == "CACHE")
    return False


def _is_print_or_log(instructions, j, frame) -> bool:
    """Whether the instruction at ``j`` loads the builtin ``print``, or a logging method of a
    ``logging.Logger`` or of ``logging`` that the instruction before it loads by name."""
    if j is None:
        return False
    load = instructions[j]
    if load.opname == "LOAD_GLOBAL":
        held = _loaded(load, frame)
        warn = _recorded_warn()
        return (load.argval == "print" and held is builtins.print) or (warn is not None and held is warn)
    if load.opname not in ("LOAD_ATTR", "LOAD_METHOD") or load.argval not in _LOG_METHODS or not j:
        return False
    owner = instructions[j - 1]
    if owner.positions is None or owner.positions[::2] != load.positions[::2]:
        return False
    if owner.opname == "CALL":
        return _gets_logger(instructions, j - 1, frame)
    held = _loaded(owner, frame)
    warns = held is warnings and load.argval == "warn" and _recorded_warn() is not None
    return held is logging or isinstance(held, logging.Logger) or warns


def _recorded_warn():
    """``warnings.warn``'s stand-in, which records the program's calls while it is traced, where it
    is in place (``stdlib_state``: on the module, and the names bound to ``warnings.warn`` the program
    reads, ``from warnings import warn``); else None."""
    warn = warnings.warn
    return warn if is_stand_in(warn) else None


def _gets_logger(instructions, c: int, frame) -> bool:
    """Whether the call at ``c`` is ``logging.getLogger(...)`` (or ``getLogger(...)`` imported from
    ``logging``), which returns a ``logging.Logger`` whatever its argument: the first instruction of
    its source loads the function, or ``logging`` with the next loading ``getLogger`` from it."""
    start = instructions[c].positions[::2]
    k = c
    while k > 0 and _starts_within(instructions[k - 1], start):
        k -= 1
    base = instructions[k]
    if base.opname != "LOAD_GLOBAL" or base.positions[::2] != start:
        return False
    held = _loaded(base, frame)
    if held is not logging.getLogger:
        attr = instructions[k + 1]
        if held is not logging or attr.opname not in ("LOAD_ATTR", "LOAD_METHOD") or attr.argval != "getLogger":
            return False
        k += 1
    # (the call at ``c`` is that of ``getLogger``: nothing after it loads from what it returns,
    # ``logging.getLogger(name).handlers[0].info`` or another method's result)
    return all(ins.opname in _CALLS or ins.positions[::2] != start for ins in instructions[k + 1 : c])


def _starts_within(ins, start: tuple) -> bool:
    """Whether ``ins``'s source starts at ``start`` or after it."""
    p = ins.positions
    return p is not None and p.lineno is not None and p.col_offset is not None and p[::2] >= start
