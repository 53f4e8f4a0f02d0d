"""A sweep of shapes that change between calls (issue 26) over the OpInfo table: each sample whose
tensors can grow along one dim is called through one jitted function at three sizes (the sample's
own, then grown by 1 and by 3), each compared with eager (outputs and, in float dtypes, gradients),
and its compiles counted. The expected count is 2: a static compile, then a symbolic one (the dim
seen to change) that serves the third size too. Sizes 0 and 1 stay constant by design, so a dim
is grown only from 2 up.

A sample grows in the first of these ways eager accepts at both grown sizes (so a size tied to a
scalar argument, ``x.view(3, 4)``, skips the sample): every tensor whose dim 0 has the first
tensor's dim-0 size; every tensor whose last dim has the first tensor's last size; the first
tensor's dim 0 alone. Grown tensors repeat their own values (so index and domain-bound arguments
stay valid) in the layout of the original (contiguous, permuted-dense or strided).

Not a test (the whole table takes many minutes): run it as a script,
``PYTHONPATH=python python tests/dynamic_op_sweep.py [--all-samples] [--ops NAME,...] [--markdown]``;
it prints each sample that compiles more than twice or differs from eager, then a summary grouped
by cause. ``tests/test_dynamic_op_sweep.py`` runs a part of it.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).parent))
import thunder_rs  # noqa: E402
from opinfos import OPINFOS, OpInfo, SampleInput  # noqa: E402
from opinfos.sampling import kinds_of_samples, representative, sample_of  # noqa: E402

#: How much each call after the first grows the dim: sizes n, n + 1, n + 3.
GROWTH = (0, 1, 3)


@dataclass
class Outcome:
    """One sample's result: ``status`` is "symbolic" (2 compiles, eager's results), "specialises"
    (more compiles), "mismatch", "raised" or "skipped"; ``cause`` says why (grouped in the summary)."""

    op: str
    index: int
    how: str
    status: str
    compiles: int = 0
    cause: str = ""


def tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


# Growing a sample.


def strides_like(old: torch.Tensor, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides for ``shape`` in the layout of ``old``: the same order of dims in memory and the
    same gaps between them (a tensor that skips every other element still does). None where
    ``old``'s layout has no such pattern (a broadcast, stride-0 dim, or an uneven gap)."""
    if old.is_contiguous():
        return None
    order = sorted(range(old.ndim), key=lambda d: (old.stride(d), old.size(d)))
    strides = [0] * old.ndim
    inner = old.stride(order[0])
    if inner < 1:
        return None
    strides[order[0]] = inner
    for prev, d in zip(order, order[1:], strict=False):
        span = old.stride(prev) * old.size(prev)
        if span == 0 or old.stride(d) % span:
            return None
        strides[d] = strides[prev] * shape[prev] * (old.stride(d) // span)
    return tuple(strides)


def grown(t: torch.Tensor, dim: int, by: int) -> torch.Tensor | None:
    """``t`` longer by ``by`` along ``dim``, repeating its own values, in ``t``'s layout."""
    if by == 0:
        return t
    n = t.size(dim)
    values = torch.cat([t] * math.ceil((n + by) / n), dim).narrow(dim, 0, n + by)
    if t.is_contiguous():
        return values.contiguous()
    strides = strides_like(t, tuple(values.shape))
    if strides is None:
        return None
    extent = 1 + sum((s - 1) * st for s, st in zip(values.shape, strides, strict=True))
    out = torch.empty(extent, dtype=t.dtype, device=t.device).as_strided(values.shape, strides)
    return out.copy_(values)


def growable(sample: SampleInput) -> Iterator[tuple[str, Callable[[torch.Tensor, int], int | None]]]:
    """The ways ``sample`` may grow: a name and which dim of each tensor (by its position among
    the sample's tensors) grows, or None."""
    ts = tensors([sample.args, sample.kwargs])
    firsts = [t for t in ts if t.ndim >= 1]
    if not firsts:
        return
    first = firsts[0]
    n0, last = first.size(0), first.size(-1)
    if n0 >= 2:
        yield "dim 0 of all", lambda t, i: 0 if t.ndim >= 1 and t.size(0) == n0 else None
    if last >= 2 and first.ndim >= 2:
        yield "last dim of all", lambda t, i: t.ndim - 1 if t.ndim >= 1 and t.size(-1) == last else None
    if n0 >= 2 and len(firsts) > 1:
        yield "dim 0 of the first", lambda t, i: 0 if t is first else None
    if last >= 2 and first.ndim >= 2 and len(firsts) > 1:
        yield "last dim of the first", lambda t, i: t.ndim - 1 if t is first else None


def rebuilt(value: Any, grow: Callable[[torch.Tensor], torch.Tensor | None]) -> Any:
    if isinstance(value, torch.Tensor):
        out = grow(value)
        if out is None:
            raise LookupError("a layout the sweep cannot grow")
        return out
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(rebuilt(v, grow) for v in value)
    if isinstance(value, dict):
        return {k: rebuilt(v, grow) for k, v in value.items()}
    return value


def sample_grown(sample: SampleInput, which: Callable, by: int) -> SampleInput:
    def grow(t: torch.Tensor) -> torch.Tensor | None:
        dim = which(t, 0)
        return t if dim is None else grown(t, dim, by)

    return SampleInput(*rebuilt(sample.args, grow), **rebuilt(sample.kwargs, grow))


# Calling and comparing.


def with_grad(value: Any, leaves: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        leaf = value.detach().requires_grad_()
        leaves.append(leaf)
        return leaf
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(with_grad(v, leaves) for v in value)
    return value


def call(op: OpInfo, fn: Callable, sample: SampleInput, grad: bool) -> tuple[Any, list]:
    """``fn(sample)``'s outputs and, with ``grad``, the gradients of a seeded random cotangent
    with respect to the sample's floating tensors (kwargs ``op.nondifferentiable`` left out)."""
    if not grad:
        return fn(*sample.args, **sample.kwargs), []
    leaves: list[torch.Tensor] = []
    args = with_grad(sample.args, leaves)
    kwargs = {k: v if k in op.nondifferentiable else with_grad(v, leaves) for k, v in sample.kwargs.items()}
    out = fn(*args, **kwargs)
    outs = [t for t in tensors(out) if t.requires_grad]
    if not leaves or not outs or not all(bool(t.isfinite().all()) for t in leaves):
        return out, []  # (at non-finite inputs gradients are conventions, not calculus: not compared)
    torch.manual_seed(1)
    cotangents = [torch.randn(t.shape, dtype=t.dtype) for t in outs]
    grads = torch.autograd.grad(outs, leaves, cotangents, allow_unused=True, materialize_grads=True)
    return out, list(grads)


def difference(actual: Any, expected: Any, tolerance: dict) -> str | None:
    """What differs between ``actual`` and ``expected`` (tensors by dtype, shape and values), or None."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"a {type(actual).__name__}, eager a tensor"
        if (actual.dtype, actual.shape) != (expected.dtype, expected.shape):
            return f"{actual.dtype}{list(actual.shape)}, eager {expected.dtype}{list(expected.shape)}"
        try:
            torch.testing.assert_close(actual.detach(), expected.detach(), equal_nan=True, **tolerance)
        except AssertionError:
            return "values"
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return "structure"
        return next((d for a, e in zip(actual, expected, strict=True) if (d := difference(a, e, tolerance))), None)
    return None if actual == expected else f"{actual!r}, eager {expected!r}"


def grad_wanted(op: OpInfo, dtype: torch.dtype) -> bool:
    return op.supports_grad and dtype.is_floating_point


def eager_results(op: OpInfo, samples: list[SampleInput], grad: bool) -> tuple[list[tuple[Any, list]] | None, bool]:
    """Eager's outputs and gradients at each size (None where eager rejects a size), and whether
    gradients are compared: not where eager's backward fails (an op with no derivative)."""
    for with_grads in (True, False) if grad else (False,):
        try:
            torch.manual_seed(0)
            return [call(op, op.op, s, with_grads) for s in samples], with_grads
        except Exception:  # noqa: BLE001, S112 (eager rejects the grown sizes: the sample is skipped)
            continue
    return None, False


def normalised(text: str) -> str:
    """A cause with its sizes and names generalised, so that like causes group together."""
    text = text.splitlines()[0] if text else text
    text = re.sub(r"torch\.Size\(\[[^\]]*\]\)", "Size", text)
    text = re.sub(r"\b\d+\b", "N", text)
    return text[:160]


#: Ops whose compiles must follow the size (listed, not forced): the number of outputs is the
#: size or depends on it, torch's own kernel reads the size as an int, or thunder_rs keeps the
#: size constant by design.
MUST_SPECIALISE = {
    "unbind": "one output per element of the dim",
    "unbind_copy": "one output per element of the dim",
    "split": "the number of pieces depends on the size",
    "split_copy": "the number of pieces depends on the size",
    "unsafe_split": "the number of pieces depends on the size",
    "chunk": "the number of pieces depends on the size",
    "unsafe_chunk": "the number of pieces depends on the size",
    "svd_values": "torch.svd(compute_uv=False) makes zeros(m, m) from the sizes as ints (its own guard)",
    "conv_transpose1d": "a convolution's channels and weights are constant by design (trace_ir prims/conv.rs)",
}


def why_compiled_again(op: OpInfo, jfn: Callable) -> str:
    """Why the calls after the symbolic compile compiled again: symbolic compiles failed (and
    stopped), or the guard the third call's size failed (an equality specialises the size; an
    inequality is a decision, ``min(m, n)`` or a clamp, that flips between the grown sizes)."""
    function = thunder_rs._function(jfn)
    if op.id in MUST_SPECIALISE:
        return "must specialise: " + MUST_SPECIALISE[op.id]
    if function._dynamic_off is not None:
        return "symbolic compile failed: " + normalised(function._dynamic_off)
    reasons = thunder_rs.compile_stats(jfn).miss_reasons
    if not function._symbolic:
        return "no symbolic compile: " + normalised(reasons[1] if len(reasons) > 1 else "")
    found = re.search(r"does not serve it: (.*?) fails \(.*?decided at .*? \((.*?)\)", reasons[-1])
    if found is None:
        return "symbolic entry declined: " + normalised(reasons[-1].split("; ", 1)[-1])
    guard = normalised(found.group(1))
    if "==" in guard:
        return f"a size specialised: the guard {guard} (in {found.group(2)})"
    return f"a decision flips between the grown sizes: the guard {guard}"


def check_sample(op: OpInfo, dtype: torch.dtype, index: int, sample: SampleInput) -> Outcome:
    """The sample's outcome in the first way to grow it that eager accepts."""
    why = "no dim of size 2 or more"
    for how, which in growable(sample):
        why = "eager rejects the grown sizes"
        try:
            samples = [sample_grown(sample, which, by) for by in GROWTH]
        except LookupError:
            why = "a layout the sweep cannot grow"
            continue
        expected, grad = eager_results(op, samples, grad_wanted(op, dtype))
        if expected is None:
            continue
        if all(difference(e, expected[0], {}) is None for e, _ in expected[1:]) and not tensors(expected[0][0]):
            return Outcome(op.id, index, how, "skipped", cause="no tensor output")
        return run_sizes(op, index, how, samples, expected, grad, op.tolerance(dtype))
    return Outcome(op.id, index, "-", "skipped", cause=why)


def run_sizes(op: OpInfo, index: int, how: str, samples: list, expected: list, grad: bool, tolerance: dict) -> Outcome:
    """Calls one jitted ``op`` at each size of ``samples``, comparing with eager's ``expected``."""
    jfn = thunder_rs.jit(op.op)
    for size, (sample, (out, grads)) in enumerate(zip(samples, expected, strict=True)):
        torch.manual_seed(0)
        try:
            actual, actual_grads = call(op, jfn, sample, grad)
        except Exception as e:  # noqa: BLE001 (reported)
            cause = f"call {size + 1} raised {type(e).__name__}: {normalised(str(e))}"
            return Outcome(op.id, index, how, "raised", thunder_rs.cache_misses(jfn), cause)
        found = difference(actual, out, tolerance)
        what = "output"
        # (where eager's own gradient is not finite it is no reference: not compared)
        if found is None and grads and all(bool(g.isfinite().all()) for g in grads):
            found, what = difference(actual_grads, grads, tolerance), "grad"
        if found is not None:
            compiles = thunder_rs.cache_misses(jfn)
            cause = f"call {size + 1} ({phase(jfn, size)}): {what} {normalised(found)}"
            if size and static_differs(op, sample, out, grads, grad, tolerance):
                cause += " (a static compile differs too)"
            return Outcome(op.id, index, how, "mismatch", compiles, cause)
    compiles = thunder_rs.cache_misses(jfn)
    if thunder_rs.compile_stats(jfn).eager_calls:
        return Outcome(op.id, index, how, "specialises", compiles, "ran eagerly (value variants)")
    if compiles > 2:
        return Outcome(op.id, index, how, "specialises", compiles, why_compiled_again(op, jfn))
    return Outcome(op.id, index, how, "symbolic", compiles)


def phase(jfn: Callable, size: int) -> str:
    function = thunder_rs._function(jfn)
    if size == 0:
        return "static"
    if function._dynamic_off is not None:
        return "static again, symbolic failed"
    return "symbolic" if function._symbolic else "static"


def static_differs(op: OpInfo, sample: SampleInput, out: Any, grads: list, grad: bool, tolerance: dict) -> bool:
    """Whether a fresh jit (a static compile at this size) differs from eager too: then the
    difference is not one of symbolic sizes."""
    torch.manual_seed(0)
    try:
        actual, actual_grads = call(op, thunder_rs.jit(op.op), sample, grad)
    except Exception:  # noqa: BLE001
        return True
    return difference(actual, out, tolerance) is not None or difference(actual_grads, grads, tolerance) is not None


# The sweep.


def sweep_dtype(op: OpInfo) -> torch.dtype:
    return torch.float64 if torch.float64 in op.dtypes else op.dtypes[0]


def outcomes(ops: set[str] | None, all_samples: bool, first_only: bool = False) -> Iterator[Outcome]:
    """Each op's samples (its representative ones, or all) in ``sweep_dtype``; with ``first_only``
    only the first sample of each op that grows."""
    for op in OPINFOS:
        if ops and op.id not in ops:
            continue
        dtype = sweep_dtype(op)
        kinds = kinds_of_samples(op, dtype)
        indices = range(len(kinds)) if all_samples else representative(kinds, every_kind=True)
        for index in indices:
            outcome = check_sample(op, dtype, index, sample_of(op, dtype, index))
            yield outcome
            if first_only and outcome.status != "skipped":
                break


def summary(results: list[Outcome], markdown: bool) -> str:
    """Counts by status, then the samples of each cause, most common first."""
    statuses = Counter(r.status for r in results)
    lines = [", ".join(f"{statuses[s]} {s}" for s in ("symbolic", "specialises", "mismatch", "raised", "skipped"))]
    lines[0] = f"{len(results)} samples: {lines[0]}"
    lines.append(f"ops: {len({r.op for r in results if r.status == 'symbolic'})} with every grown sample symbolic")
    for status in ("specialises", "mismatch", "raised"):
        groups: dict[str, list[Outcome]] = defaultdict(list)
        for r in results:
            if r.status == status:
                groups[r.cause].append(r)
        if not groups:
            continue
        lines.append(f"\n{'## ' if markdown else '# '}{status} ({statuses[status]})\n")
        for cause, rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            names = ", ".join(sorted({f"{r.op}#{r.index}" for r in rs}))
            lines.append(f"- {len(rs)} × {cause}: {names}" if markdown else f"{len(rs)} x {cause}: {names}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="", help="comma-separated OpInfo ids (default: all)")
    parser.add_argument("--all-samples", action="store_true", help="every sample, not the representative ones")
    parser.add_argument("--first", action="store_true", help="only each op's first sample that grows")
    parser.add_argument("--verbose", action="store_true", help="print every sample's outcome")
    parser.add_argument("--markdown", action="store_true", help="the summary as a Markdown list")
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    results = []
    ops = set(filter(None, options.ops.split(",")))
    for outcome in outcomes(ops or None, options.all_samples, options.first):
        results.append(outcome)
        if options.verbose or outcome.status not in ("symbolic", "skipped"):
            print(
                f"{outcome.op}#{outcome.index} | {outcome.how} | {outcome.status} {outcome.compiles} | {outcome.cause}"
            )
            sys.stdout.flush()
    print(summary(results, options.markdown), flush=True)


if __name__ == "__main__":
    main()
