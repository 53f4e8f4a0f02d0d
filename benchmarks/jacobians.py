"""What a jacobian computes under thunder_rs.jit against eager (torch.func), on the CPU.

    python benchmarks/jacobians.py [--repeats N]

``jacrev`` of ``sin(x @ w)`` in ``w`` with x (8, 4096) and ``jacfwd`` of it with x (4096, 8)
and w (8, 8): each a 64-element basis. functorch computes the forward once, unbatched, and
batches only the VJP (JVP) over the basis; reported are whether the jit's jacobian is
bit-equal to eager's, the shapes of the products and of the sin/cos its trace computes (a
forward recomputed per basis element shows as a leading 64), and the median wall time of a
call of each. Runs single-threaded.
"""

import argparse
import re
import statistics
import time

import torch

import thunder_rs

_SHAPE = r'\[([\d, ]*)\]"$'


def _jacrev(x, w):
    return torch.func.jacrev(lambda w: (x @ w).sin())(w)


def _jacfwd(x, w):
    return torch.func.jacfwd(lambda w: (x @ w).sin())(w)


def _computed(jfn, ops: str) -> list:
    lines = str(thunder_rs.last_traces(jfn)[-1]).splitlines()
    found = (re.search(_SHAPE, line) for line in lines if re.search(rf"^ *t\d+ = .*[._ ]({ops})_?\(", line))
    return [m[1] for m in found if m]


def _median_ms(fn, args, repeats: int) -> float:
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    repeats = parser.parse_args().repeats
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cases = {
        "jacrev": (_jacrev, torch.randn(8, 4096), torch.randn(4096, 8)),
        "jacfwd": (_jacfwd, torch.randn(4096, 8), torch.randn(8, 8)),
    }
    for name, (fn, x, w) in cases.items():
        jfn = thunder_rs.jit(fn)
        equal = torch.equal(jfn(x, w), fn(x, w))
        products, sines = _computed(jfn, "matmul|mm|bmm|linear"), _computed(jfn, "sin|cos")
        jit_ms, eager_ms = _median_ms(jfn, (x, w), repeats), _median_ms(fn, (x, w), repeats)
        print(f"{name}: equal={equal} products={products} sin/cos={sines} jit={jit_ms:.2f} ms eager={eager_ms:.2f} ms")


if __name__ == "__main__":
    main()
