"""CPU time of the hit path: the cache key of a call's tensor arguments and whole jitted calls.

    python benchmarks/hit_cpu.py [--rounds 25]

Thread CPU time (one thread), medians of interleaved rounds, which leaves out the time other
processes hold the cores: a loaded machine moves ``bench_overhead.py``'s wall-clock figures by
more than a key field costs. Reports the key and its lookup for one and two tensor arguments
(``fast_key_fn``), and per call of two small functions and a ``Linear`` under ``no_grad``, jitted
and eager. Run it against another checkout of the Python package (``PYTHONPATH=<other>/python``)
to compare before and after.
"""

import argparse
import statistics
import time
import timeit

import torch

import thunder_rs
from thunder_rs.core.acquisition.cache import fast_key_fn


def _per_call_ns(fn, number: int) -> float:
    return timeit.Timer(fn, timer=time.thread_time).timeit(number) / number * 1e9


def _tiny(a, b):
    return torch.exp(torch.sin((a + b) * a) - b)


def _double(a):
    return a * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    rounds = parser.parse_args().rounds
    torch.set_num_threads(1)
    table: dict = {}
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    for args in ((a,), (a, b)):  # (as ``ThunderFunction.__call__`` finds the key function and looks the key up)
        table[f"key + lookup, {len(args)} tensor(s)"] = {
            "ns": lambda args=args, cache={}: cache.get(fast_key_fn(len(args))(args, None))
        }
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    for name, fn, args in (("tiny 2 args", _tiny, (a, b)), ("one arg", _double, (a,)), ("Linear", lin, (a,))):
        jfn = thunder_rs.jit(fn)
        jfn(*args)
        table[name] = {"jit ns": lambda jfn=jfn, args=args: jfn(*args), "eager ns": lambda fn=fn, args=args: fn(*args)}
    samples: dict = {(row, col): [] for row, cols in table.items() for col in cols}
    with torch.no_grad():
        for _ in range(rounds):
            for row, cols in table.items():
                for col, fn in cols.items():
                    samples[row, col].append(_per_call_ns(fn, 2000))
    for row, cols in table.items():
        print(f"{row:28s} " + "  ".join(f"{col} {statistics.median(samples[row, col]):7.0f}" for col in cols))


if __name__ == "__main__":
    main()
