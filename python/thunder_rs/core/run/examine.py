"""``thunder_rs.examine``: everything in a program that thunder_rs cannot compile as it is.

The program is traced once on proxies while problems are collected instead of raised
(``core.problems``): torch calls with no thunder_rs symbol (eager fallbacks, counted), reads of a
traced tensor's value (data-dependent control flow; tracing goes on with a stand-in value, so
later rows may come from a branch the real values would not take), in-place writes to leaves
that require grad, calls whose symbol refuses its arguments, and the error that stopped tracing,
if one did.
"""

import re
import traceback
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten

from thunder_rs.core.base import problems as P
from thunder_rs.core.base.lazy import LazyModule
from thunder_rs.core.state.modules import ModuleBinding
from thunder_rs.core.lang.rng import STATE_CALLS
from thunder_rs.core.base.userframe import is_user_file

#: Acquisition, loaded at the first ``examine`` (``core.run.jit`` loads it at the first compile).
_ACQUIRE = LazyModule("thunder_rs.core.acquisition.acquire")

#: A fallback symbol's number among callables of one name (``fallback``'s registry is by name)
_NUMBERED = re.compile(r"\.\d+$")


@dataclass
class ExamineReport:
    #: symbol name -> calls, of the recorded trace (empty when tracing stopped)
    supported: dict = field(default_factory=dict)
    #: fallback symbol name -> calls that run eagerly (the trace's; when tracing stopped, the torch
    #: calls met before)
    fallbacks: dict = field(default_factory=dict)
    #: every ``Problem`` met, in order
    problems: list = field(default_factory=list)
    #: whether the whole program was traced (no error stopped it)
    completed: bool = True

    def count(self, kind: str) -> int:
        return sum(p.kind == kind for p in self.problems)

    def rows(self) -> list:
        """``(kind, what, count, where)`` per distinct problem, in the order first met; ``where``
        lists the distinct lines."""
        grouped: dict = {}
        for p in self.problems:
            grouped.setdefault((p.kind, p.what), []).append(p)
        return [
            (kind, what, len(ps), ", ".join(dict.fromkeys(p.where for p in ps))) for (kind, what), ps in grouped.items()
        ]

    def __str__(self) -> str:
        blocking = [p for p in self.problems if p.kind != P.FALLBACK]
        head = (
            f"thunder_rs.examine: {sum(self.supported.values())} supported calls, "
            f"{sum(self.fallbacks.values())} eager fallbacks, {len(blocking)} problems"
            + ("" if self.completed else " (tracing stopped at an error)")
        )
        rows = [("kind", "op / construct", "count", "where")] + [(k, w, str(n), at) for k, w, n, at in self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [head]
        for i, (kind, what, n, where) in enumerate(rows):
            lines.append(f"  {kind:{widths[0]}}  {what:{widths[1]}}  {n:>{widths[2]}}  {where}")
            if i == 0:
                lines.append("  " + "-" * (sum(widths) + 4 + len("where") + 2))
        details = [f"  {p.kind}: {p.what}: {p.detail}" for p in self.problems if p.detail and p.kind != P.FALLBACK]
        if details:
            lines += ["details:", *dict.fromkeys(details)]
        if self.supported:
            lines.append(
                "supported: " + ", ".join(f"{n} x{c}" for n, c in sorted(self.supported.items(), key=lambda kv: -kv[1]))
            )
        return "\n".join(lines)


def _where(error: BaseException) -> str:
    """``file:line`` of the innermost user frame of ``error``'s traceback."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if is_user_file(f.filename)]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "<unknown>"


def examine(fn, *args, **kwargs) -> ExamineReport:
    """Traces ``fn(*args, **kwargs)`` and reports every construct thunder_rs cannot compile as
    it is, instead of raising on the first (see the module docstring)."""
    binding = ModuleBinding(fn) if isinstance(fn, torch.nn.Module) else None
    flat, spec = tree_flatten((args, kwargs))
    report = ExamineReport()
    with P.collect() as found:
        try:
            trace = _ACQUIRE.load().acquire(fn, flat, spec, binding).trace
        except Exception as e:  # noqa: BLE001 (anything tracing raises is reported, not raised)
            found.append(P.Problem(P.STOPPED, type(e).__name__, _where(e), str(e)))
            trace = None
    report.problems = found
    report.completed = trace is not None
    if trace is None:
        report.fallbacks = dict(Counter(p.what for p in found if p.kind == P.FALLBACK))
        return report
    for name, n in Counter(trace.symbol_names()).items():
        known = name.startswith(("ltorch.", "prims.")) or name in STATE_CALLS
        if known:
            report.supported[name] = n
        else:  # (without the registry's ``.N`` telling apart callables of one name: ``fallback``)
            torch_name = _NUMBERED.sub("", name)
            report.fallbacks[torch_name] = report.fallbacks.get(torch_name, 0) + n
    return report
