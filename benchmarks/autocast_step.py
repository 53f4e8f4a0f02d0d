"""An autocast training step per region on the CPU: eager against compiled calls whose casts are
looked up in torch's autocast cache as this tree looks them up, as another tree's ``torch_casts``
looks them up, and made anew per call (stop 57's: not shared with eager's ops, the floor).

    python benchmarks/autocast_step.py [--before PATH] [--rounds N] [--wall]

``--before``: a ``torch_casts.py`` to compare with (``git show REV:python/thunder_rs/core/lang/
torch_casts.py > PATH``). 4 x ``nn.Linear(64, 64)``, batch 8, bfloat16 autocast: the forward in a
region, then ``backward()`` and the gradients cleared; one compiled call per region, then two. All
callables are built in one process and run round-robin, 100 steps a round; reported per step are
the minimum and median over rounds of the process CPU time (``--wall``: wall time, which the
machine's other load moves more). Runs single-threaded.
"""

import argparse
import importlib.util
import time
import timeit

import torch

import thunder_rs
from thunder_rs.core.lang import torch_casts
from thunder_rs.core.run import generate


def _plain(fn, casts):  # each cast made anew per call (stop 57)
    def call(*inputs):
        given = list(inputs)
        for at, leaf, _, dtype in casts:
            given[at] = torch_casts._cast_anew(given[leaf], dtype)
        return fn(*given)

    return call


def _jitted(model, step, with_cached_casts):
    """``model`` compiled with ``generate.with_cached_casts`` replaced while it traces."""
    kept = generate.with_cached_casts
    generate.with_cached_casts = with_cached_casts
    try:
        jm = thunder_rs.jit(model)
        step(jm)
    finally:
        generate.with_cached_casts = kept
    return jm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", help="a torch_casts.py to compare with")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--wall", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    x = torch.randn(8, 64)

    def one(f):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = f(x)
        y.float().sum().backward()
        for p in model.parameters():
            p.grad = None

    def two(f):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = f(x) + f(-x)
        y.float().sum().backward()
        for p in model.parameters():
            p.grad = None

    callables = [("eager", model), ("jit", _jitted(model, one, generate.with_cached_casts))]
    if args.before:
        spec = importlib.util.spec_from_file_location("before_torch_casts", args.before)
        assert spec is not None and spec.loader is not None
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
        callables.append(("jit before", _jitted(model, one, before.with_cached_casts)))
    callables.append(("jit plaincast", _jitted(model, one, _plain)))
    clock = time.perf_counter if args.wall else time.process_time
    for name, step in (("one call per region", one), ("two calls per region", two)):
        times: dict = {label: [] for label, _ in callables}
        for _, f in callables:
            step(f)
            step(f)
        for _ in range(args.rounds):
            for label, f in callables:
                times[label].append(timeit.Timer(lambda f=f: step(f), timer=clock).timeit(number=100) / 100 * 1e6)
        for label, t in times.items():
            t.sort()
            print(f"{name:22s} {label:13s} min {t[0]:8.1f} median {t[len(t) // 2]:8.1f} us/step")


if __name__ == "__main__":
    main()
