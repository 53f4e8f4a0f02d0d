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

With ``--errors``, each OpInfo's CPU error inputs (``op.error_inputs("cpu")``; sparse ones are out
of scope) run instead, in eager and under ``thunder_rs.jit`` (and, with ``--with-compile``, the first
of each op under ``torch.compile(backend="thunder_rs")``), each classed by ``ERROR_ORDER``:

- ``matches``: eager's exception type (or a subclass), and eager's own message, or one that the
  OpInfo's ``error_regex`` matches, or one that names the op;
- ``type-only``: eager's type, a message that neither matches nor names the op;
- ``other-type``: an exception eager would not have raised;
- ``crashed``: an internal error (a Rust panic, ``KeyError``, ``AttributeError``, an ``assert``, ...);
- ``silent``: a result where eager raises (the worst);
- ``eager-runs``: eager does not raise on it here (not judged).

Under ``torch.compile`` most ``other-type`` rows are Dynamo's own ``TorchRuntimeError`` ("RuntimeError
when making fake tensor call"), raised while it traces, before any backend runs (``backend="eager"``
raises the same).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import pathlib
import re
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


ERROR_ORDER = ["matches", "type-only", "other-type", "crashed", "silent", "eager-runs"]
#: internal errors: never what bad input should raise (unless eager raises the same)
CRASHES = (KeyError, AttributeError, AssertionError, NameError, UnboundLocalError, ZeroDivisionError, RecursionError)


def _error_inputs(op) -> list:
    """``op``'s CPU error inputs, made afresh from the same seed (so eager and compiled get equal ones)."""
    if op.error_inputs_func is None:
        return []
    torch.manual_seed(0)
    return list(op.error_inputs("cpu"))


def _raised(fn, error) -> BaseException | None:
    sample = error.sample_input
    try:
        fn(sample.input, *sample.args, **sample.kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001  a pyo3 PanicException is a BaseException
        return e
    return None


def _message(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:110] if str(e) else ''}"


def error_class(op, error, expected: BaseException | None, actual: BaseException | None) -> str:
    """The class (``ERROR_ORDER``) of what the compiled call raised, ``actual``, against eager's ``expected``."""
    if expected is None:
        return "eager-runs"
    if actual is None:
        return "silent"
    internal = type(actual).__name__ == "PanicException" or "internal error" in str(actual).lower()
    if internal or (isinstance(actual, CRASHES) and not isinstance(actual, type(expected))):
        return "crashed"
    if not isinstance(actual, type(expected)):
        return "other-type"
    text = str(actual)
    if text == str(expected) or (error.error_regex and re.search(error.error_regex, text)):
        return "matches"
    return "matches" if op.name.split(".")[-1].lower() in text.lower() else "type-only"


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="thunder_rs", dynamic=False)


def judge_errors(op, with_compile: bool) -> list[dict[str, Any]]:
    """One row per error input of ``op``: eager's exception and what ``thunder_rs.jit`` (and
    ``torch.compile``'s backend, on the first) raised, classed."""
    rows = []
    eager, jitted = _error_inputs(op), _error_inputs(op)
    compiled = _error_inputs(op)[:1] if with_compile else []
    for i, (e_in, j_in) in enumerate(zip(eager, jitted)):
        fn = lambda *a, **k: op.op(*a, **k)  # noqa: E731  a fresh function: a fresh cache
        expected = _raised(fn, e_in)
        actual = _raised(thunder_rs.jit(fn), j_in)
        row = {
            "i": i,
            "jit": error_class(op, e_in, expected, actual),
            "eager": _message(expected) if expected is not None else "",
            "got": _message(actual) if actual is not None else "",
            "regex": e_in.error_regex,
        }
        if i < len(compiled):
            with contextlib.redirect_stderr(None):
                got = _raised(_compiled(lambda *a, **k: op.op(*a, **k)), compiled[i])
            row["compile"] = error_class(op, e_in, expected, got)
            row["compile_got"] = _message(got) if got is not None else ""
        rows.append(row)
    return rows


def _errors_markdown(table: dict, counts: dict) -> str:
    lines = ["# Op error inputs against eager (CPU)", "", "| path | " + " | ".join(ERROR_ORDER) + " |"]
    lines.append("|" + "---|" * (len(ERROR_ORDER) + 1))
    for key, c in counts.items():
        lines.append(f"| {key} | " + " | ".join(str(c.get(k, 0)) for k in ERROR_ORDER) + " |")
    lines += ["", "| op | input | jit | compile | eager raised | jit raised |", "|---|---|---|---|---|---|"]
    for name, rows in sorted(table.items()):
        for r in rows:
            if r["jit"] in ("matches", "eager-runs") and r.get("compile", "matches") in ("matches", "eager-runs"):
                continue
            cells = [name, str(r["i"]), r["jit"], r.get("compile", ""), r["eager"], r["got"]]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main_errors(options) -> None:
    """The ``--errors`` mode: every error input of every OpInfo, classed; see the module doc."""
    only = set(filter(None, options.only.split(",")))
    table: dict[str, list] = {}
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    start = time.perf_counter()
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if only and op.name not in only and name not in only:
            continue
        try:
            rows = judge_errors(op, options.with_compile)
        except Exception as e:  # noqa: BLE001  the error-input generator itself failed
            print(f"{name}: skipped ({type(e).__name__}: {e})", flush=True)
            continue
        if not rows:
            continue
        table[name] = rows
        for r in rows:
            counts["jit"][r["jit"]] += 1
            if "compile" in r:
                counts["torch.compile"][r["compile"]] += 1
            if r["jit"] not in ("matches", "eager-runs"):
                print(f"{name:36} {r['i']:3} {r['jit']:10} {r['got'][:70]}  (eager {r['eager'][:60]})", flush=True)
    for key, c in sorted(counts.items()):
        print(f"{key:14} " + "  ".join(f"{k}={c.get(k, 0)}" for k in ERROR_ORDER))
    print(f"{len(table)} ops, {time.perf_counter() - start:.0f} s")
    if options.out:
        RESULTS.mkdir(exist_ok=True)
        payload = {"counts": {k: dict(v) for k, v in sorted(counts.items())}, "ops": table}
        (RESULTS / f"{options.out}.json").write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
        (RESULTS / f"{options.out}.md").write_text(_errors_markdown(table, dict(sorted(counts.items()))))


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
    parser.add_argument("--errors", action="store_true", help="the OpInfos' error inputs instead")
    parser.add_argument("--with-compile", action="store_true", help="--errors: torch.compile's backend too")
    options = parser.parse_args()
    if options.errors:
        return main_errors(options)
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
