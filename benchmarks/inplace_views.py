"""Per-call cost of in-place writes: an argument written twice (eager's versions set after the
write-back) and a view returned after its base, a tensor the program made, was written through it
(``benchmarks/results/stop59_final_cpu.txt``), jitted and eager, with and without grad.

Thread CPU time (``time.thread_time_ns``: a machine shared with other jobs moves wall times more),
us/call, min and median of ``--rounds`` rounds of ``--calls`` calls. Run with OMP_NUM_THREADS=1;
compare trees by running this with each tree's ``python`` on PYTHONPATH, alternating."""

import argparse
import time

import torch

import thunder_rs


def twice(x):
    x.add_(1)
    x.mul_(2)
    return x


def vw(x):
    y = x * 1
    v = y[1:]
    v.mul_(2)
    return v


def _timed(call, calls: int, rounds: int) -> tuple[float, float]:
    for _ in range(50):
        call()
    times = []
    for _ in range(rounds):
        t0 = time.thread_time_ns()
        for _ in range(calls):
            call()
        times.append((time.thread_time_ns() - t0) / calls / 1e3)
    times.sort()
    return times[0], times[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--grad", action="store_true", help="arguments that require grad (a non-leaf for twice)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for fn in (twice, vw):
        jf = thunder_rs.jit(fn)
        x = torch.randn(8, 8, requires_grad=args.grad)
        arg = (lambda: x * 1) if args.grad and fn is twice else (lambda: x)
        (jmin, jmed), (emin, emed) = (_timed(lambda f=f: f(arg()), args.calls, args.rounds) for f in (jf, fn))
        rows.append(f"{fn.__name__} jit {jmin:.1f}/{jmed:.1f} eager {emin:.1f}/{emed:.1f}")
    print(("grad: " if args.grad else "no grad: ") + " | ".join(rows) + " (us/call, min/median)")


if __name__ == "__main__":
    main()
