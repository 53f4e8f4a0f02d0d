"""Per-call CPU time of a compiled program whose call that may raise on values sits in a ``try``
block (a Cholesky factorisation, an embedding lookup), against eager.

    OMP_NUM_THREADS=1 python benchmarks/try_checks.py [--sizes 64,256] [--reps 7] [--calls 200]

Each case runs under ``torch.no_grad()`` on inputs where the call succeeds: a compiled call runs
the op once where its check is the op itself (stop 65), twice where the check and the op are
separate calls (stop 64). The figure is the median over ``--reps`` of the CPU time
(``time.process_time``) of ``--calls`` calls, per call, in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import thunder_rs


def _factored(a, b):
    try:
        low = torch.linalg.cholesky(a)
    except torch.linalg.LinAlgError:
        low = torch.eye(a.shape[-1], dtype=a.dtype)
    return torch.cholesky_solve(b, low)


def _looked_up(ids, table):
    try:
        return F.embedding(ids, table)
    except IndexError:
        return table[:1].expand(ids.shape[0], -1)


def _cases(sizes: list[int]) -> list[tuple[str, object, tuple]]:
    cases = []
    for n in sizes:
        m = torch.randn(n, n, dtype=torch.float64)
        cases.append(
            (
                f"cholesky {n}x{n} f64",
                _factored,
                (m @ m.T + n * torch.eye(n, dtype=torch.float64), torch.ones(n, 1, dtype=torch.float64)),
            )
        )
    for n in sizes:
        cases.append(
            (
                f"embedding {n * 16} ids of 4096x{n}",
                _looked_up,
                (torch.randint(0, 4096, (n * 16,)), torch.randn(4096, n)),
            )
        )
    return cases


def _per_call_us(fn, args: tuple, calls: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.process_time()
        for _ in range(calls):
            fn(*args)
        times.append((time.process_time() - start) / calls * 1e6)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="64,256")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print("| case | eager us/call | thunder_rs.jit us/call |\n| --- | --- | --- |")
    with torch.no_grad():
        for name, fn, inputs in _cases([int(s) for s in args.sizes.split(",")]):
            jitted = thunder_rs.jit(fn)
            torch.testing.assert_close(jitted(*inputs), fn(*inputs), rtol=0, atol=0)
            eager = _per_call_us(fn, inputs, args.calls, args.reps)
            compiled = _per_call_us(jitted, inputs, args.calls, args.reps)
            print(f"| {name} | {eager:.1f} | {compiled:.1f} |")


if __name__ == "__main__":
    main()
