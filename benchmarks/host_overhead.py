"""Host cost of the GPT block's training step on the CPU: a proxy for the GPU step (issue 23).

    python benchmarks/host_overhead.py [--quick] [--no-compile] [--profile] [--json PATH]

On an H100 the bf16 GPT block step (``benchmarks/gpu_bench.py``) runs the same CUDA kernels as
eager but is host-bound: whatever Python thunder_rs runs per step shows up in wall time. This runs
the same step (forward, ``backward(g)``, AdamW step, ``zero_grad``; and the forward alone under
``no_grad``) at sizes where compute is negligible (n_embd 64, 4 heads, sequence 8, batch 1), in
float32, bfloat16 and float32 under bfloat16 autocast, and reports per step:

- the host (thread CPU) time and wall time of eager, thunder_rs with the torch executor alone,
  thunder_rs with its default executors and torch.compile (medians of interleaved repeats);
- how many aten ops each runs per step (a ``TorchDispatchMode`` count: each one is a kernel launch
  or a view on the GPU), with the ops thunder_rs runs more often than eager;
- with ``--profile``, where thunder_rs's Python time goes (cProfile's own time per function,
  summed by part: the jit's cache and guards, the generated forward and backward, the autograd
  glue, torch's ops, the optimizer).

Runs single-threaded. The machine's other load moves wall time; thread CPU time moves less.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import thunder_rs  # noqa: E402
from gpt import Block, GPTConfig  # noqa: E402

CONFIG = GPTConfig(block_size=8, n_embd=64, n_head=4, dropout=0.0)
BATCH = 1
PRECISIONS = ("float32", "bfloat16", "autocast-bf16")


class Workload:
    """The block, input and output gradient of one precision; ``step(case, wrap)`` builds a
    fresh copy's step so that every backend starts from the same weights."""

    def __init__(self, precision: str):
        torch.manual_seed(0)
        dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
        self.precision = precision
        self.block = Block(CONFIG).to(dtype)
        self.x = torch.randn(BATCH, CONFIG.block_size, CONFIG.n_embd, dtype=dtype)
        self.g = torch.randn_like(self.x)

    def _autocast(self):
        if self.precision == "autocast-bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self, case: str, wrap, phases: Counter | None = None):
        """One step of ``case`` of ``wrap(a fresh copy)``; with ``phases``, the step adds the ns
        each phase took to it (forward call, backward, optimizer step, zero_grad)."""
        block = copy.deepcopy(self.block)
        fn, x, g = wrap(block), self.x, self.g
        if case == "forward":

            def forward():
                with torch.no_grad(), self._autocast():
                    return fn(x)

            return forward
        # foreach, as AdamW chooses on CUDA: its per-parameter Python loop is not the GPU's cost.
        opt = torch.optim.AdamW(block.parameters(), lr=1e-4, foreach=True)
        xg = x.detach().clone().requires_grad_()
        clock = time.perf_counter_ns if phases is not None else (lambda: 0)
        spent = phases if phases is not None else Counter()

        def train_step():
            t0 = clock()
            with self._autocast():
                out = fn(xg)
            t1 = clock()
            out.backward(g)
            t2 = clock()
            opt.step()
            t3 = clock()
            opt.zero_grad(set_to_none=True)
            xg.grad = None
            spent.update(
                {"forward call": t1 - t0, "backward": t2 - t1, "optimizer step": t3 - t2, "zero_grad": clock() - t3}
            )
            return out

        return train_step


def backends(with_compile: bool) -> dict:
    """name -> how the block is wrapped."""
    found = {
        "eager": lambda m: m,
        "thunder_rs (torch)": lambda m: thunder_rs.jit(m, executors=["torch"]),
        "thunder_rs (default)": lambda m: thunder_rs.jit(m),
    }
    if with_compile:
        found["torch.compile"] = lambda m: torch.compile(m)
    return found


def time_interleaved(steps: dict, inner: int, repeats: int) -> dict:
    """name -> (median thread CPU µs per step, median wall µs per step), the steps run in turn
    ``repeats`` times ``inner`` steps each, so that the machine's load falls on all alike."""
    samples: dict = {name: ([], []) for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
            for _ in range(inner):
                step()
            samples[name][0].append((time.thread_time_ns() - cpu) / inner / 1e3)
            samples[name][1].append((time.perf_counter_ns() - wall) / inner / 1e3)
    return {name: (statistics.median(c), statistics.median(w)) for name, (c, w) in samples.items()}


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count_ops(step) -> Counter:
    """The aten ops one (warm) step runs, by name."""
    with _CountOps() as mode:
        step()
    return mode.ops


def _part(file: str, name: str) -> str:
    if file.startswith("<thunder_rs"):
        return "generated backward" if name == "backward" else "generated forward"
    if file == "~":
        return "torch ops and builtins (C)"
    for marker, part in (
        ("thunder_rs/core/run/autograd.py", "autograd glue (core/run/autograd.py)"),
        ("torch/autograd/function.py", "autograd glue (torch.autograd.Function)"),
        ("thunder_rs/executors", "executors' Python"),
        ("thunder_rs/", "jit: cache, guards, entry"),
        ("torch/optim", "optimizer (eager in every column)"),
    ):
        if marker in file:
            return part
    return "other Python"


def profile_parts(step, steps: int) -> dict:
    """cProfile's own time per step (µs), summed by part of the step."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    parts: Counter = Counter()
    for (file, _, name), row in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        parts[_part(file, name)] += row[2] / steps * 1e6
    return dict(parts.most_common())


@contextlib.contextmanager
def timing_generated_code(phases: Counter):
    """While active, jits compiled add the ns their generated forward and backward take to
    ``phases`` (wrapping what ``core.run.generate`` hands to ``core.run.autograd.grad_function``)."""
    import thunder_rs.core.run.generate as jit_module  # noqa: PLC0415 (the benchmark reaches into the jit)

    original = jit_module.grad_function

    def timed(part, fn):
        def run(*args):
            start = time.perf_counter_ns()
            try:
                return fn(*args)
            finally:
                phases[part] += time.perf_counter_ns() - start

        return run

    def grad_function(forward, backward, *args, **kwargs):
        return original(timed("generated forward", forward), timed("generated backward", backward), *args, **kwargs)

    jit_module.grad_function = grad_function
    try:
        yield
    finally:
        jit_module.grad_function = original


def phase_breakdown(workload: Workload, names: dict, settings) -> dict:
    """name -> µs per training step of each phase (and, for thunder_rs, of its generated code),
    with fresh steps apart from the timed ones."""
    found = {}
    for name in ("eager", "thunder_rs (torch)"):
        phases: Counter = Counter()
        with timing_generated_code(phases):
            step = workload.step("train step", names[name], phases)
            step()  # compiles while the generated code is wrapped
        for _ in range(settings.warmup):
            step()
        phases.clear()
        steps = settings.inner * settings.repeats
        for _ in range(steps):
            step()
        found[name] = {part: ns / steps / 1e3 for part, ns in phases.items()}
    return found


def run_case(workload: Workload, case: str, names: dict, settings) -> dict:
    steps = {name: workload.step(case, wrap) for name, wrap in names.items()}
    for step in steps.values():
        for _ in range(settings.warmup):
            step()
    times = time_interleaved(steps, settings.inner, settings.repeats)
    ops = {name: count_ops(step) for name, step in steps.items()}
    result = {
        "times": times,
        "ops": {n: sum(c.values()) for n, c in ops.items()},
        "extra_ops": dict(ops["thunder_rs (torch)"] - ops["eager"]),
        "missing_ops": dict(ops["eager"] - ops["thunder_rs (torch)"]),
    }
    if case == "train step":
        result["phases"] = phase_breakdown(workload, names, settings)
    if settings.profile:
        result["parts"] = {n: profile_parts(steps[n], settings.inner * 4) for n in ("eager", "thunder_rs (torch)")}
    return result


def report(precision: str, case: str, result: dict) -> str:
    eager_cpu = result["times"]["eager"][0]
    lines = [
        f"\n## {case}, {precision}\n",
        "| backend | host µs/step | wall µs/step | / eager (host) | aten ops/step |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, (cpu, wall) in result["times"].items():
        lines.append(f"| {name} | {cpu:.0f} | {wall:.0f} | {cpu / eager_cpu:.2f}x | {result['ops'][name]} |")
    lines.append(
        f"\nthunder_rs (torch) ops beyond eager: {result['extra_ops'] or 'none'}; "
        f"eager's not run: {result['missing_ops'] or 'none'}"
    )
    for name, phases in result.get("phases", {}).items():
        lines.append(f"\nwall µs per step, {name}: " + ", ".join(f"{part} {us:.0f}" for part, us in phases.items()))
    for name, parts in result.get("parts", {}).items():
        lines.append(
            f"\ncProfile own time per step, {name}: "
            + ", ".join(f"{part} {us:.0f} µs" for part, us in parts.items() if us >= 1)
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out (its start-up is slow)")
    parser.add_argument("--profile", action="store_true", help="cProfile breakdown of thunder_rs's Python time")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--json", help="write the results here")
    settings = parser.parse_args()
    settings.warmup, settings.inner, settings.repeats = (5, 20, 5) if settings.quick else (10, 50, 11)
    torch.set_num_threads(1)
    names = backends(not settings.no_compile)
    results = {}
    for precision in settings.precisions.split(","):
        workload = Workload(precision)
        for case in ("train step", "forward"):
            result = run_case(workload, case, names, settings)
            results[f"{case}, {precision}"] = result
            print(report(precision, case, result), flush=True)
    if settings.json:
        with open(settings.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
