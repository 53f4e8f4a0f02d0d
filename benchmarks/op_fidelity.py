"""Bit-for-bit fidelity of compiled ops to eager, over PyTorch's own operator database.

For every OpInfo in ``torch.testing._internal.common_methods_invocations.op_db`` and each dtype
(float32 and float64; bfloat16 with ``--bf16``; any of the OpInfo's CPU dtypes with ``--dtypes``,
e.g. ``int64,int32,uint8,int8,bool,complex64,complex128,float16``), the first samples run in eager and under
``thunder_rs.jit``: the outputs, and the gradients of every input that requires grad
(``torch.autograd.grad`` with a fixed random cotangent per output, where the OpInfo supports
backward in the dtype: never for integers and bool), are compared with
``torch.equal`` (NaN-aware), and the outputs' strides too. Each (op, dtype) is then

- ``bit-equal``: every value and stride is eager's;
- ``strides``: the values are eager's, some output's strides are not;
- ``ulps``: some value differs within ``torch.testing.assert_close``'s tolerance for the dtype
  (max abs and rel difference reported);
- ``mismatched``: some value, shape, dtype or gradient's presence differs beyond it;
- ``refused``: thunder_rs raises on a sample that eager runs;
- ``not-native``: some sample traces an eager fallback (not a compiled op; left out of the rest);
- ``nondeterministic``: eager differs from itself on a sample (uninitialised memory), not judged.

Forward and gradients are classified apart (``fwd`` and ``grad``); an op's class is the worse.
Run: ``python benchmarks/op_fidelity.py [--samples N] [--only a,b] [--bf16] [--dtypes a,b] [--out NAME]``;
the table goes to ``benchmarks/results/NAME.{json,md}``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import pathlib
import time
import warnings
from typing import Any

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten

import thunder_rs

warnings.filterwarnings("ignore")

ORDER = ["bit-equal", "strides", "ulps", "mismatched", "refused", "not-native", "nondeterministic"]
RESULTS = pathlib.Path(__file__).parent / "results"


def _tensors(value) -> list:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _run(fn, sample, dtype) -> tuple[list, list]:
    """The tensor outputs of ``fn`` on ``sample`` and the gradients of its inputs that require grad,
    from a cotangent drawn per differentiable output (the same for eager and compiled)."""
    torch.manual_seed(0)  # random ops must draw what eager draws
    out = fn(sample.input, *sample.args, **sample.kwargs)
    outs = _tensors(out)
    inputs = [t for t in _tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
    diff = [o for o in outs if o.requires_grad]
    if not inputs or not diff:
        return outs, []
    gen = torch.Generator().manual_seed(7)
    cots = [_cotangent(o, gen) for o in diff]
    grads = torch.autograd.grad(diff, inputs, cots, allow_unused=True)
    return [o.detach() for o in outs], list(grads)


def _cotangent(out: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    wide = torch.complex128 if out.is_complex() else torch.float64
    return torch.randn(out.shape, dtype=wide, generator=gen).to(out.dtype)


def _compare(actual: list, expected: list, check_strides: bool) -> tuple[str, float, float, str]:
    """The class of ``actual`` against ``expected`` and the largest abs and rel difference."""
    cls, max_abs, max_rel, why = "bit-equal", 0.0, 0.0, ""
    if len(actual) != len(expected):
        return "mismatched", math.inf, math.inf, f"{len(actual)} results, eager {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        if a is None or e is None:
            if (a is None) != (e is None):
                return "mismatched", math.inf, math.inf, f"result {i}: None vs {type(e).__name__}"
            continue
        if a.shape != e.shape or a.dtype != e.dtype:
            return "mismatched", math.inf, math.inf, f"result {i}: {a.shape} {a.dtype}, eager {e.shape} {e.dtype}"
        if a.is_floating_point() or a.is_complex():
            equal = torch.equal(a, e) or bool(((a == e) | (a.isnan() & e.isnan())).all())
        else:
            equal = torch.equal(a, e)
        if not equal:
            wide = torch.complex128 if a.is_complex() else torch.float64
            d = (a.to(wide) - e.to(wide)).abs()
            finite = d[d.isfinite()]
            abs_d = finite.max().item() if finite.numel() else math.inf
            rel = d / e.to(wide).abs().clamp_min(1e-30)
            rel = rel[rel.isfinite()]
            rel_d = rel.max().item() if rel.numel() else math.inf
            max_abs, max_rel = max(max_abs, abs_d), max(max_rel, rel_d)
            try:
                torch.testing.assert_close(a, e, equal_nan=True)
                cls = "mismatched" if cls == "mismatched" else "ulps"
            except AssertionError:
                cls, why = "mismatched", f"result {i}: differs by {abs_d:.3g}"
        elif check_strides and a.numel() > 1 and a.stride() != e.stride() and cls == "bit-equal":
            cls, why = "strides", f"result {i}: strides {a.stride()}, eager {e.stride()}"
    return cls, max_abs, max_rel, why


def _worse(a: str, b: str) -> str:
    return a if ORDER.index(a) >= ORDER.index(b) else b


def judge(op, dtype, n_samples: int) -> dict[str, Any]:
    """The classes of ``op`` in ``dtype`` over its first ``n_samples`` samples."""
    grad = op.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
    grad = grad and dtype in op.supported_backward_dtypes("cpu")
    torch.manual_seed(0)
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=grad))[:n_samples]
    row: dict[str, Any] = {"fwd": "bit-equal", "grad": "bit-equal", "abs": 0.0, "rel": 0.0, "why": "", "n": 0}

    def note(kind: str, cls: str, abs_d=0.0, rel_d=0.0, why=""):
        if ORDER.index(cls) > ORDER.index(row[kind]) and why:
            row["why"] = f"{kind}: {why}"
        row[kind] = _worse(row[kind], cls)
        row["abs"], row["rel"] = max(row["abs"], abs_d), max(row["rel"], rel_d)

    for sample in samples:
        fn = lambda *a, **k: op.op(*a, **k)  # noqa: E731  a fresh function: a fresh cache
        try:
            expected = _run(fn, sample, dtype)
            again = _run(fn, sample, dtype)
        except Exception:  # noqa: BLE001  eager rejects it: not a sample we can judge
            continue
        if _compare(again[0], expected[0], False)[0] != "bit-equal":
            note("fwd", "nondeterministic", why="eager differs from itself")
            continue
        row["n"] += 1
        try:
            fallbacks = thunder_rs.examine(fn, sample.input, *sample.args, **sample.kwargs).fallbacks
        except Exception:  # noqa: BLE001
            fallbacks = {}
        if fallbacks:
            note("fwd", "not-native", why=", ".join(sorted(fallbacks)))
            continue
        try:
            actual = _run(thunder_rs.jit(fn), sample, dtype)
        except Exception as e:  # noqa: BLE001
            note("fwd", "refused", why=f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}")
            continue
        note("fwd", *_compare(actual[0], expected[0], True))
        note("grad", *_compare(actual[1], expected[1], True))
    return row


def _markdown(table: dict, counts: dict) -> str:
    lines = ["# Op fidelity to eager (CPU)", "", "| dtype | kind | " + " | ".join(ORDER) + " |"]
    lines.append("|" + "---|" * (len(ORDER) + 2))
    for key, c in counts.items():
        dtype, kind = key.split("/")
        lines.append(f"| {dtype} | {kind} | " + " | ".join(str(c.get(k, 0)) for k in ORDER) + " |")
    lines += ["", "| op | dtype | fwd | grad | max abs | max rel | first difference |", "|---|---|---|---|---|---|---|"]
    for name, rows in sorted(table.items()):
        for dtype, r in rows.items():
            if r["fwd"] == r["grad"] == "bit-equal":
                continue
            lines.append(
                f"| {name} | {dtype} | {r['fwd']} | {r['grad']} | {r['abs']:.3g} | {r['rel']:.3g} | {r['why']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated op names")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 too (the summary only)")
    parser.add_argument("--dtypes", default="", help="comma-separated dtypes instead (int64,bool,complex64,...)")
    parser.add_argument("--out", default="", help="results/NAME.{json,md}; nothing written when empty")
    options = parser.parse_args()
    only = set(filter(None, options.only.split(",")))
    dtypes = [torch.float32, torch.float64] + ([torch.bfloat16] if options.bf16 else [])
    if options.dtypes:
        dtypes = [getattr(torch, d.strip()) for d in options.dtypes.split(",") if d.strip()]
    table: dict[str, dict] = {}
    start = time.perf_counter()
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if only and op.name not in only and name not in only:
            continue
        for dtype in dtypes:
            if dtype not in op.supported_dtypes("cpu"):
                continue
            try:
                row = judge(op, dtype, options.samples)
            except Exception as e:  # noqa: BLE001  the sample generator itself failed
                print(f"{name} {dtype}: skipped ({type(e).__name__})", flush=True)
                continue
            if row["n"] == 0:
                continue
            table.setdefault(name, {})[str(dtype).removeprefix("torch.")] = row
            if row["fwd"] != "bit-equal" or row["grad"] != "bit-equal":
                print(
                    f"{name:40} {str(dtype):15} fwd={row['fwd']:10} grad={row['grad']:10} "
                    f"abs={row['abs']:.3g} rel={row['rel']:.3g} {row['why'][:90]}",
                    flush=True,
                )
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for rows in table.values():
        for dtype, r in rows.items():
            counts[f"{dtype}/fwd"][r["fwd"]] += 1
            if r["grad"] != "bit-equal" or r["fwd"] not in ("refused", "not-native", "nondeterministic"):
                counts[f"{dtype}/grad"][r["grad"]] += 1
            counts[f"{dtype}/op"][_worse(r["fwd"], r["grad"])] += 1
    for key, c in sorted(counts.items()):
        print(f"{key:16} " + "  ".join(f"{k}={c.get(k, 0)}" for k in ORDER))
    print(f"{time.perf_counter() - start:.0f} s")
    if options.out:
        RESULTS.mkdir(exist_ok=True)
        payload = {"counts": {k: dict(v) for k, v in sorted(counts.items())}, "ops": table}
        (RESULTS / f"{options.out}.json").write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
        (RESULTS / f"{options.out}.md").write_text(_markdown(table, dict(sorted(counts.items()))))


if __name__ == "__main__":
    main()
