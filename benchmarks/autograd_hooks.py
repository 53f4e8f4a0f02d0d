"""Per-call cost of a compiled call with two differentiable outputs (``core.run.output_hooks``: the
hook bookkeeping of its outputs): the call's autograd function applied alone (``grad_function``
around a forward of four ops, no trace, no guards) and the jitted call, with eager's ops; and a
jitted call returning an output another is computed from.

Thread CPU time (``time.thread_time_ns``: a machine shared with other jobs moves wall times more),
us/call, min and median of ``--rounds`` rounds of ``--calls`` calls. Run with OMP_NUM_THREADS=1;
compare trees by running this with each tree's ``python`` on PYTHONPATH, alternating."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import thunder_rs  # noqa: E402
from inplace_views import _timed  # noqa: E402 (the same rounds of thread CPU time)
from thunder_rs.core.run.autograd import grad_function  # noqa: E402


def two(x, w):
    return (x * w).sin(), (x + w).cos()


def loss_and_h(x, w):
    """An output another is computed from (``loss, logits``): the call keeps it by weak reference."""
    h = (x * w).sin()
    return h.sum(), h


class _Program:
    """What ``grad_function`` asks of a program on the forward path (no double backward)."""

    recording = False

    def keep(self, ctx, inputs):
        ctx.inputs = inputs


def _forward(x, w):
    with torch.no_grad():
        return two(x, w), ()


def _backward(saved, ga, gb):
    return ga, gb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x, w = (torch.randn(8, requires_grad=True) for _ in range(2))
    apply = grad_function(_forward, _backward, [0, 1], False, False, program=_Program(), reads=((0, 1), (0, 1)))
    rows = []
    for name, f in (
        ("apply", apply),
        ("jit", thunder_rs.jit(two)),
        ("eager", two),
        ("jit loss_and_h", thunder_rs.jit(loss_and_h)),
    ):
        low, mid = _timed(lambda f=f: f(x, w), args.calls, args.rounds)
        rows.append(f"{name} {low:.2f}/{mid:.2f}")
    print(" | ".join(rows) + " (us/call, min/median)")


if __name__ == "__main__":
    main()
