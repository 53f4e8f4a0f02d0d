"""Training-step benchmark: thunder_rs against eager PyTorch (and Lightning Thunder / torch.compile).

    python benchmarks/bench_train.py [--quick] [--with-compile] [--json PATH] [--cases a,b]

A step is forward, loss, backward (and an AdamW step for the GPT), with gradients zeroed first.
The backend compiles the module, never the step: the step calls the compiled module, then runs
the loss's backward and the optimizer eagerly, as a training loop does. "first call" is the first
step of a fresh module (compiling forward and backward included), "per step" a warm step.

Runs single-threaded on CPU. Backends that cannot be imported are skipped with a one-line note.
See benchmarks/harness.py for what is measured and how.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import harness  # noqa: E402
from gpt import GPT, Block, GPTConfig, random_tokens  # noqa: E402

BLOCK_CONFIG = GPTConfig(block_size=32, n_embd=64, n_head=4, dropout=0.0)
GPT_CONFIG = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.0)
BATCH = 4
LR = 1e-3


# ----------------------------------------------------------------------------- training steps


class TrainStep:
    """One training step of ``module``, calling ``forward`` for the module's forward.

    ``build(forward, module)`` returns the step function; it owns the optimizer, so each fresh
    step has its own. A ``TrainStep`` runs eagerly; ``around(compiled)`` is the same step calling
    ``compiled`` instead, which is how a backend's compiled module enters the step.
    """

    def __init__(self, module: nn.Module, build: Callable[[Callable, nn.Module], Callable]):
        self.module = module
        self._build = build
        self._step = build(module, module)

    def __call__(self, *args):
        return self._step(*args)

    def around(self, forward: Callable) -> Callable:
        return self._build(forward, self.module)


def block_mse_step(forward, module: nn.Module):
    def step(x, target):
        module.zero_grad(set_to_none=True)
        x.grad = None
        loss = F.mse_loss(forward(x), target)
        loss.backward()
        return loss.detach()

    return step


def gpt_adamw_step(forward, module: nn.Module):
    optimizer = torch.optim.AdamW(module.parameters(), lr=LR)

    def step(idx, targets):
        optimizer.zero_grad(set_to_none=True)
        _, loss = forward(idx, targets)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def module_backend(backend: harness.Backend) -> harness.Backend:
    """``backend`` applied to the module inside a ``TrainStep`` rather than to the step."""
    if not backend.available:
        return backend

    def wrap(step: TrainStep):
        return step.around(backend.wrap(step.module))

    return harness.Backend(
        backend.name, wrap=wrap, note=backend.note, reset=backend.reset, max_first_repeats=backend.max_first_repeats
    )


# ----------------------------------------------------------------------------- cases


def _randn(*shape, seed=0, requires_grad=False):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(requires_grad)


def build_cases(
    block_config: GPTConfig = BLOCK_CONFIG, gpt_config: GPTConfig = GPT_CONFIG, batch: int = BATCH
) -> list[harness.Case]:
    def make_block_step():
        torch.manual_seed(0)
        return TrainStep(Block(block_config).train(), block_mse_step)

    def block_args():
        shape = (batch, block_config.block_size, block_config.n_embd)
        return _randn(*shape, requires_grad=True), _randn(*shape, seed=1)

    def make_gpt_step():
        return TrainStep(GPT(gpt_config, seed=0).train(), gpt_adamw_step)

    def make_gpt_dropout_step():
        return TrainStep(GPT(GPTConfig(**{**gpt_config.__dict__, "dropout": 0.1}), seed=0).train(), gpt_adamw_step)

    def gpt_args():
        seq = gpt_config.block_size
        return random_tokens(gpt_config, batch, seq, seed=1), random_tokens(gpt_config, batch, seq, seed=2)

    b, g = block_config, gpt_config
    return [
        harness.Case(
            "gpt_block_train",
            make_block_step,
            block_args,
            inner=20,
            description=f"GPT block n_embd {b.n_embd}, {b.n_head} heads, seq {b.block_size}, batch {batch}: "
            "forward, mse loss, backward (input requires grad)",
        ),
        harness.Case(
            "nanogpt_train",
            make_gpt_step,
            gpt_args,
            inner=10,
            description=f"GPT {g.n_layer} layers, n_embd {g.n_embd}, vocab {g.vocab_size}, "
            f"seq {g.block_size}, batch {batch}: forward with targets, backward, AdamW step",
        ),
        harness.Case(
            "nanogpt_dropout_train",
            make_gpt_dropout_step,
            gpt_args,
            inner=10,
            description="the same GPT with dropout 0.1 (embeddings, attention, residuals, MLP)",
        ),
    ]


# ----------------------------------------------------------------------------- targets

# (case, metric, limit, label); metric "ratio" is per step vs eager, "first_ms" the first step's time.
TARGETS = [
    ("gpt_block_train", "first_ms", 100.0, "first call, GPT block train < 100 ms"),
    ("gpt_block_train", "ratio", 1.1, "per step, GPT block train  <= 1.1x eager"),
]


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = harness.parse_args(__doc__, argv)
    torch.set_num_threads(1)
    cases = harness.select(build_cases(), args.cases)
    backends = harness.backends_from_args(args)
    print(harness.format_skipped(backends))
    load_before = os.getloadavg()[0]
    rows = harness.run_all(cases, [module_backend(b) for b in backends], harness.settings_for(args.quick))
    print(f"\n{harness.format_header(load_before, args.quick, backends)}\n")
    for case in cases:
        print(f"  {case.name:<22} {case.description}")
    print()
    print(harness.format_table(rows, per_label="per step"))
    targets = harness.evaluate_targets(TARGETS, rows)
    print()
    print(harness.format_targets(targets))
    if args.json:
        harness.write_json(args.json, rows, targets, backends, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
