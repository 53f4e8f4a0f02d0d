"""Where a compiled call's time goes under CPU autocast, against eager: the stop-58/59 step
(4 x ``nn.Linear(64, 64)``, batch 8, bfloat16, one region per step, forward in the region then
``backward()``), split into the forward and the backward, and the forward into its phases.

    python benchmarks/autocast_overhead.py [--rounds N]

Reported per step or per call: the minimum and median over rounds of the process CPU time (the
machine's other load moves wall time by 30%), all callables run round-robin in one process, 200
calls a round, single-threaded. ``jit (state before)``: the same compiled module with its cache
key reading the autocast state as stop 58's ``autocast.state`` did (a list, ``any`` and a new
``AutocastState`` per call), swapped into the key function's globals for its rounds only.
"""

import argparse
import contextlib
import time

import torch

import thunder_rs
from thunder_rs.core.acquisition.cache import fast_key_fn
from thunder_rs.core.lang import autocast, torch_casts


def _state_before():  # stop 58's ``autocast.state``
    if not torch._C._is_any_autocast_enabled():
        return None
    dtypes = [torch.get_autocast_dtype(d) if torch.is_autocast_enabled(d) else None for d in ("cpu", "cuda")]
    return autocast.AutocastState(*dtypes) if any(dtypes) else None


def _rounds(items, rounds: int, n: int = 200) -> None:
    """Prints min and median us per call of each ``(label, setup, fn)``, round-robin."""
    times: dict = {label: [] for label, _, _ in items}
    for _ in range(rounds):
        for label, setup, fn in items:
            with setup():
                start = time.process_time()
                for _ in range(n):
                    fn()
                times[label].append((time.process_time() - start) / n * 1e6)
    for label, t in times.items():
        t.sort()
        print(f"  {label:34s} min {t[0]:7.1f} median {t[len(t) // 2]:7.1f} us")


def _closure(fn) -> dict:
    return {n: c.cell_contents for n, c in zip(fn.__code__.co_freevars, fn.__closure__ or ())}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    x = torch.randn(8, 64)
    region = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    jm = thunder_rs.jit(model)
    with region():
        jm(x).float().sum().backward()
    key_globals = fast_key_fn(1).__globals__

    @contextlib.contextmanager
    def before():
        kept = key_globals["_autocast"]
        key_globals["_autocast"] = _state_before
        try:
            yield
        finally:
            key_globals["_autocast"] = kept

    def step(f):
        with region():
            y = f(x)
        y.float().sum().backward()
        for p in model.parameters():
            p.grad = None

    none = contextlib.nullcontext
    print("step per region (forward in the region, backward, grads cleared)")
    items = [("eager", none, lambda: step(model)), ("jit", none, lambda: step(jm))]
    _rounds([*items, ("jit (state before)", before, lambda: step(jm))], args.rounds)
    print("forward only, in its own region")
    entry = next(iter(jm._jfn._cache.values()))
    params = jm._jfn._module_tensors()
    cached = _closure(_closure(entry.fn)["fn"])  # (``_with_captured`` around ``with_cached_casts``)
    inner, casts, plans = cached["fn"], cached["casts"], cached["plans"]
    inputs = [x, *params, *_closure(entry.fn)["captured"]]
    given = list(inputs)
    with region():
        torch_casts.read_casts(given, casts, plans)  # (casts of an earlier region: only the call after them)

    def in_region(fn):
        def run():
            with region():
                fn()

        return run

    phases = [
        ("empty region", lambda: None),
        ("eager forward", lambda: model(x)),
        ("jit forward (module call)", lambda: jm(x)),
        ("jit entry callable (no key, guards)", lambda: entry.fn(x, *params)),
        ("read_casts (8 lookups)", lambda: torch_casts.read_casts(list(inputs), casts, plans)),
        ("autograd function + trace, cast given", lambda: inner(*given)),
        ("key + guards", lambda: (fast_key_fn(1)((x,), (True, jm._jfn._binding.metadata(params))), entry.check((x,)))),
        ("autocast.state()", autocast.state),
        ("autocast.state() before", _state_before),
    ]
    _rounds([(label, none, in_region(fn)) for label, fn in phases], args.rounds)


if __name__ == "__main__":
    main()
