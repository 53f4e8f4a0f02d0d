"""torch.func inside a jitted program: thunder_rs against eager PyTorch (and torch.compile).

    python benchmarks/bench_func.py [--quick] [--with-compile] [--json PATH] [--cases a,b]

Per-sample gradients as torch.func's tutorial computes them,
``vmap(grad(loss), in_dims=(None, None, 0, 0))(params, buffers, x, y)`` with ``functional_call``
on an MLP and a small CNN, a plain ``grad`` of an MLP's loss, and the jacobians of a small MLP's
output (``jacrev``, ``jacfwd``, ``hessian`` of its loss, ``jvp``, ``linearize``'s jvp function on two
tangents), and an ensemble of MLPs with BatchNorm in training (``stack_module_state`` +
``functional_call`` + ``vmap``, the stacked running statistics updated per model): thunder_rs
traces the gradient through its VJP and batching rules (``core.lang.traced_grads``), forward mode
as reverse mode twice. Runs single-threaded on CPU; see
benchmarks/harness.py for what is measured and how.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 8, 3), nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(torch.flatten(x, 1))


def per_sample_grads(model: nn.Module):
    """The tutorial's program over ``model`` (its structure only: the parameters are arguments)."""

    def loss_fn(params, buffers, x, y):
        out = torch.func.functional_call(model, (params, buffers), (x.unsqueeze(0),))
        return F.cross_entropy(out, y.unsqueeze(0))

    def program(params, buffers, x, y):
        return torch.vmap(torch.func.grad(loss_fn), in_dims=(None, None, 0, 0))(params, buffers, x, y)

    return program


def grad_of_loss(model: nn.Module):
    def loss_fn(params, x, y):
        return F.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    def program(params, x, y):
        return torch.func.grad(loss_fn)(params, x, y)

    return program


def jacobian(model: nn.Module, kind: str):
    """``kind`` of the MLP's output (or of its loss, for the hessian) in its input."""

    def predict(params, x):
        return torch.func.functional_call(model, params, (x,))

    def program(params, x):
        if kind == "jvp":
            return torch.func.jvp(lambda x: predict(params, x), (x,), (x.cos(),))
        if kind == "linearize":
            out, jvp_fn = torch.func.linearize(lambda x: predict(params, x).tanh(), x)
            return out, jvp_fn(x.cos()), jvp_fn(x.sin())
        if kind == "hessian":
            return torch.func.hessian(lambda x: predict(params, x).tanh().sum())(x)
        return getattr(torch.func, kind)(lambda x: predict(params, x).tanh())(x)

    return program


class BNMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(32, 64), nn.BatchNorm1d(64), nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.bn(self.fc1(x))))


def ensemble(models: list) -> Callable:
    """torch.func's ensembling tutorial, in training: each model's own minibatch."""
    base = copy.deepcopy(models[0]).to("meta")

    def program(params, buffers, x):
        call = lambda p, b, x: torch.func.functional_call(base, (p, b), (x,))  # noqa: E731
        return torch.vmap(call)(params, buffers, x)

    return program


def _ensemble_args(models: list) -> tuple:
    params, buffers = torch.func.stack_module_state(models)
    params = {k: v.detach().requires_grad_() for k, v in params.items()}
    return params, buffers, torch.randn(len(models), 64, 32, generator=_gen(1))


def _jacobian_args(model: nn.Module) -> tuple:
    return _state(model)[0], torch.randn(4, 32, generator=_gen(1))


def _state(model: nn.Module) -> tuple[dict, dict]:
    return (
        {k: v.detach() for k, v in model.named_parameters()},
        {k: v.detach() for k, v in model.named_buffers()},
    )


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _args(model: nn.Module, shape: tuple, with_buffers: bool = True) -> tuple:
    torch.manual_seed(0)
    params, buffers = _state(model)
    x, y = torch.randn(*shape, generator=_gen(1)), torch.randint(0, 10, (shape[0],), generator=_gen(2))
    return (params, buffers, x, y) if with_buffers else (params, x, y)


def build_cases() -> list[harness.Case]:
    torch.manual_seed(0)
    mlp, cnn = MLP(), CNN()
    bn_models = [BNMLP() for _ in range(5)]
    return [
        harness.Case(
            "per_sample_grads_mlp_b64",
            lambda: per_sample_grads(mlp),
            lambda: _args(mlp, (64, 32)),
            inner=20,
            description="vmap(grad(cross_entropy of MLP 32-64-10)), 64 examples",
        ),
        harness.Case(
            "per_sample_grads_cnn_b32",
            lambda: per_sample_grads(cnn),
            lambda: _args(cnn, (32, 1, 14, 14)),
            inner=10,
            description="vmap(grad(cross_entropy of conv 1->8 3x3, pool, linear)), 32 examples of 14x14",
        ),
        harness.Case(
            "grad_mlp_b64",
            lambda: grad_of_loss(mlp),
            lambda: _args(mlp, (64, 32), with_buffers=False),
            inner=50,
            description="grad(cross_entropy of MLP 32-64-10) over a batch of 64",
        ),
        *(
            harness.Case(
                f"{kind}_mlp",
                (lambda kind: lambda: jacobian(mlp, kind))(kind),
                lambda: _jacobian_args(mlp),
                inner=10,
                description=f"torch.func.{kind} of an MLP 32-64-10 in its input, 4 examples",
            )
            for kind in ("jacrev", "jacfwd", "hessian", "jvp", "linearize")
        ),
        harness.Case(
            "ensemble_bn_mlp_x5",
            lambda: ensemble(bn_models),
            lambda: _ensemble_args(bn_models),
            inner=20,
            description="vmap over 5 stacked MLPs 32-64(BatchNorm, training)-10, 64 examples each",
        ),
    ]


def main(argv=None) -> int:
    args = harness.parse_args(__doc__, argv)
    torch.set_num_threads(1)
    cases = harness.select(build_cases(), args.cases)
    backends = harness.backends_from_args(args)
    print(harness.format_skipped(backends))
    load_before = os.getloadavg()[0]
    rows = harness.run_all(cases, backends, harness.settings_for(args.quick))
    print(f"\n{harness.format_header(load_before, args.quick, backends)}\n")
    print(harness.format_table(rows))
    if args.json:
        harness.write_json(args.json, rows, [], backends, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
