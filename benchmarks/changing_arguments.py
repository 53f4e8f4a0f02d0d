"""Compiles and per-call cost of arguments that change on every call, on the CPU.

    python benchmarks/changing_arguments.py [--calls N]

Two loops a training or decode script runs: a step that appends its loss to a log list and
counts in a dict it is given (``log.append(loss)``, ``metrics["n"] += 1``), and a step taking
an int that changes on every call (a position, a step counter: ``x * n + 1``). Reported: the
compiles (cache misses), the entries stored and evicted, and the median thread CPU time per
call over the last third of the calls, against eager's. Runs single-threaded.
"""

import argparse
import statistics
import time

import torch

import thunder_rs


def logged_step(x, w, log, metrics):
    loss = (x @ w).pow(2).mean()
    log.append(loss.detach())
    metrics["n"] += 1
    return loss


def scaled(x, n):
    return x * n + 1


def _per_call(fn, calls: list) -> float:
    times = []
    for args in calls:
        start = time.thread_time_ns()
        fn(*args)
        times.append(time.thread_time_ns() - start)
    return statistics.median(times[-len(times) // 3 :]) / 1e3


def _report(name: str, fn, make_calls) -> None:
    jfn = thunder_rs.jit(fn)
    jit_us, eager_us = _per_call(jfn, make_calls()), _per_call(fn, make_calls())
    stats = thunder_rs.compile_stats(jfn)
    print(
        f"{name:34s} compiles {stats.cache_misses:4d}  evictions {stats.evictions:5d}  "
        f"jit {jit_us:7.1f} us/call  eager {eager_us:6.1f} us/call"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    calls = parser.parse_args().calls
    torch.set_num_threads(1)
    x, w, v = torch.randn(16, 8), torch.randn(8, 4), torch.randn(8)

    def logged():
        log, metrics = [], {"n": 2}
        return [(x, w, log, metrics)] * calls

    _report("log.append + dict counter", logged_step, logged)
    _report("int changing every call", scaled, lambda: [(v, n) for n in range(2, 2 + calls)])
    _report("int repeated", scaled, lambda: [(v, 5)] * calls)


if __name__ == "__main__":
    main()
