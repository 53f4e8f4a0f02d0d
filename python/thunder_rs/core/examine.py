"""``thunder_rs.examine``: which torch calls of a program thunder_rs supports, which fall back."""

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten

from thunder_rs.core.acquire import acquire
from thunder_rs.core.modules import ModuleBinding
from thunder_rs.core.rng import STATE_CALLS


@dataclass
class ExamineReport:
    supported: dict = field(default_factory=dict)
    fallbacks: dict = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"{sum(self.supported.values())} supported calls, {sum(self.fallbacks.values())} eager fallbacks"]
        for title, counts in (("supported", self.supported), ("fallback", self.fallbacks)):
            lines += [f"  {title:9} {name:40} x{n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1])]
        return "\n".join(lines)


def examine(fn, *args, **kwargs) -> ExamineReport:
    """Traces ``fn(*args, **kwargs)`` and counts its top-level calls by symbol: ltorch symbols,
    prims and the generator-state calls (``torch.manual_seed``) are supported."""
    binding = ModuleBinding(fn) if isinstance(fn, torch.nn.Module) else None
    flat, spec = tree_flatten((args, kwargs))
    trace = acquire(fn, flat, spec, binding).trace
    counts = Counter(trace.symbol_names())
    report = ExamineReport()
    for name, n in counts.items():
        known = name.startswith(("ltorch.", "prims.")) or name in STATE_CALLS
        (report.supported if known else report.fallbacks)[name] = n
    return report
