"""Code objects of generated sources, compiled once per distinct source.

A compile's generated program is kept by its exact source (``program``): a new jit of the same
program, or a compile that generates the same source again, execs the code object compiled before.

``compile()`` of a generated trace costs about 10 us a line. Acquisition compiles and runs a
snapshot of the recording at each value the program reads (``core.lang.snapshots``): a
Qwen2-MoE's experts loop reads once per expert and layer, and a recompile reads at the same
places again. Those segments' sources differ in little more than the value ids their calls were
recorded under, so a snapshot's source is compiled in a canonical form (comments dropped, its
``t`` locals and ``_c`` constants numbered by first appearance) and the code object of that
form is kept: a read whose segment runs the same calls as an earlier one compiles nothing (the
first compile of the MoE run of ``benchmarks/dynamic_shapes.py``: 6 of 34 segments compiled).

Renaming is exact: the ``t`` names of a generated function are its parameters and locals, and
``_c`` names the constants its scope binds, which the scope binds under their new names; string
literals are left as they are, whatever they hold. A code object holds no scope: each run binds
the implementations the executors hold then.
"""

from __future__ import annotations

import re
from types import CodeType

#: Distinct canonical sources kept (the oldest dropped first): a snapshot's source is a few
#: hundred bytes to a few KB.
KEPT = 512

_codes: dict[tuple[str, str], CodeType] = {}

#: Generated programs kept (the oldest dropped first), and the longest source kept (a code object
#: takes a few times its source's memory): ``compile()`` costs about 10 us a line, some 5-15% of a
#: compile of the demo GPT, whose forward's source is 6 KB.
KEPT_PROGRAMS = 16
PROGRAM_CHARS = 1 << 19

_programs: dict[tuple[str, str], CodeType] = {}

#: A string literal (kept whole), a comment (dropped), or a name the canonical form renumbers.
_TOKEN = re.compile(r"""'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|#[^\n]*|\b(?:t|_c)\d+\b""")


def canonical(source: str) -> tuple[str, list[int]]:
    """``source`` without comments, its ``t`` names and ``_c`` constants numbered in order of
    first appearance; and the index of the constant each new ``_c{j}`` stands for."""
    names: dict[str, str] = {}
    consts: list[int] = []

    def renamed(match: re.Match) -> str:
        token = match.group()
        first = token[0]
        if first in "'\"":
            return token
        if first == "#":
            return ""
        name = names.get(token)
        if name is None:
            if first == "_":
                name = names[token] = f"_c{len(consts)}"
                consts.append(int(token[2:]))
            else:
                name = names[token] = f"t{len(names) - len(consts)}"
        return name

    return _TOKEN.sub(renamed, source), consts


def code(source: str, filename: str) -> CodeType:
    """The code object of ``source`` (compiled under ``filename``), compiled on its first use."""
    return _kept_code(_codes, KEPT, source, filename)


def program(source: str, filename: str) -> CodeType:
    """The code object of a compile's generated program (an execution trace's source): the
    same program compiled again (a new jit of the same module and inputs) compiles nothing.
    Sources over ``PROGRAM_CHARS`` characters are compiled each time, not kept."""
    if len(source) > PROGRAM_CHARS:
        return compile(source, filename, "exec")
    return _kept_code(_programs, KEPT_PROGRAMS, source, filename)


def _kept_code(kept: dict, limit: int, source: str, filename: str) -> CodeType:
    key = (source, filename)
    found = kept.get(key)
    if found is None:
        found = compile(source, filename, "exec")
        oldest = next(iter(kept), None) if len(kept) >= limit else None
        if oldest is not None:
            kept.pop(oldest, None)  # (another thread may have dropped it)
        kept[key] = found
    return found
