"""Backward of the linear-algebra factorizations: thunder_rs against eager PyTorch.

    python benchmarks/bench_linalg.py [--ops eigh,svd,...] [--sizes 8,64] [--reps N]

For each op, matrix size (8x8, 64x64, and a batch of 4 of them) and dtype (float32, float64),
the forward runs untimed, then ``torch.autograd.grad`` of every differentiable output with a
fixed random cotangent is timed (median of ``--reps`` runs, single-threaded, CPU), for eager and
for ``thunder_rs.jit``. ``equal`` says whether the jit's gradient is eager's bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import thunder_rs


def _spd(a):
    return a @ a.mT + a.shape[-1] * torch.eye(a.shape[-1], dtype=a.dtype)


def _sym(a):
    return a + a.mT


def _well(a):
    return a + a.shape[-1] * torch.eye(a.shape[-1], dtype=a.dtype)


#: name -> (program, input maker)
OPS = {
    "eigh": (lambda a: torch.linalg.eigh(a), _sym),
    "eigvalsh": (lambda a: torch.linalg.eigvalsh(a), _sym),
    "svd": (lambda a: torch.linalg.svd(a, full_matrices=False), _well),
    "svdvals": (lambda a: torch.linalg.svdvals(a), _well),
    "qr": (lambda a: torch.linalg.qr(a), _well),
    "cholesky": (lambda a: torch.linalg.cholesky(a), _spd),
    "lu_factor": (lambda a: torch.linalg.lu_factor(a)[0], _well),
    "solve": (lambda a: torch.linalg.solve(a, a[..., :3]), _well),
    "det": (lambda a: torch.linalg.det(a), _well),
    "slogdet": (lambda a: torch.linalg.slogdet(a)[1], _well),
    "inv": (lambda a: torch.linalg.inv(a), _well),
}


def _outputs(out):
    outs = out if isinstance(out, tuple) else (out,)
    return [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]


def _backward_times(fn, a, cots, reps: int):
    times, grad = [], None
    for _ in range(reps):
        outs = _outputs(fn(a))
        start = time.perf_counter()
        (grad,) = torch.autograd.grad(outs, a, cots)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, grad


def run(name: str, shape: tuple, dtype, reps: int) -> dict:
    fn, make = OPS[name]
    torch.manual_seed(0)
    a = make(torch.randn(shape, dtype=dtype)).requires_grad_(True)
    gen = torch.Generator().manual_seed(1)
    cots = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in _outputs(fn(a))]
    jfn = thunder_rs.jit(fn)
    eager_ms, eager_grad = _backward_times(fn, a, cots, reps)
    jit_ms, jit_grad = _backward_times(jfn, a, cots, reps)
    equal = torch.equal(eager_grad, jit_grad) or bool(
        (eager_grad.isnan() == jit_grad.isnan()).all() and torch.equal(eager_grad.nan_to_num(), jit_grad.nan_to_num())
    )
    return {"op": name, "shape": shape, "dtype": dtype, "eager_ms": eager_ms, "jit_ms": jit_ms, "equal": equal}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--sizes", default="8,64")
    parser.add_argument("--reps", type=int, default=30)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'op':10} {'shape':14} {'dtype':8} {'eager ms':>9} {'jit ms':>9} {'ratio':>6}  equal")
    for name in opts.ops.split(","):
        for n in map(int, opts.sizes.split(",")):
            for shape in ((n, n), (4, n, n)):
                for dtype in (torch.float32, torch.float64):
                    r = run(name, shape, dtype, opts.reps)
                    print(
                        f"{name:10} {str(list(shape)):14} {str(dtype)[6:]:8} {r['eager_ms']:9.3f} "
                        f"{r['jit_ms']:9.3f} {r['jit_ms'] / r['eager_ms']:6.1f}  {r['equal']}"
                    )


if __name__ == "__main__":
    main()
