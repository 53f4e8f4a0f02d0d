"""Host cost of a training step through custom ``torch.autograd.Function``s on the CPU.

    python benchmarks/custom_function_step.py [--layers N] [--repeats N]

A stack of ``Linear -> tanh -> Function`` layers (the Function squares its input, its backward
reads one cotangent) at sizes where compute is negligible (4 x 16), so the step's Python cost
shows: eager and thunder_rs each run forward and ``backward()``; reported per step is the thread
CPU time of the step and of its backward alone (median and minimum of interleaved repeats: the
machine's other load moves wall time, and thread CPU time moves less), and the number of opaque
calls in thunder_rs's compiled backward (a custom Function's cotangent marker,
``fallback.materialized``, is one where it is kept).

Runs single-threaded.
"""

import argparse
import statistics
import time

import torch

import thunder_rs


class Squared(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x


class Stack(torch.nn.Module):
    def __init__(self, layers: int, width: int = 16):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = Squared.apply(layer(x).tanh())
        return x.sum()


def _per_step_us(model, x, steps: int) -> tuple[float, float]:
    """The thread CPU time of a step and of its ``backward()`` alone, in microseconds."""
    total = backward = 0.0
    for _ in range(steps):
        start = time.thread_time()
        loss = model(x)
        middle = time.thread_time()
        loss.backward()
        end = time.thread_time()
        total, backward = total + end - start, backward + end - middle
    return total / steps * 1e6, backward / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    eager = Stack(args.layers)
    compiled = thunder_rs.jit(eager)
    x = torch.randn(4, 16)
    times: dict[str, list[tuple[float, float]]] = {"eager": [], "thunder_rs": []}
    for model in (eager, compiled):
        _per_step_us(model, x, 50)  # (compiles, warms up)
    for _ in range(args.repeats):
        for name, model in (("eager", eager), ("thunder_rs", compiled)):
            times[name].append(_per_step_us(model, x, args.steps))
    for name, ts in times.items():
        steps, backwards = [t[0] for t in ts], [t[1] for t in ts]
        print(
            f"{name:>10}: {statistics.median(steps):7.1f} us/step (min {min(steps):.1f}), "
            f"backward {statistics.median(backwards):7.1f} us (min {min(backwards):.1f})"
        )
    backward = thunder_rs.last_backward_traces(compiled)[-1]
    print(f"opaque calls in the compiled backward: {str(backward).count(' = eager_')}")


if __name__ == "__main__":
    main()
