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

The caller's bytecode tells: from the instruction at hand, only loads and string building up to a
call whose callable (the instruction starting where the call's source starts) is the function.
"""

import dis
import functools

import torch

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
