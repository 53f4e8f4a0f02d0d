"""The harness of the training programs of ``test_user_programs_round2.py`` and
``test_user_loops_round2.py``: a program's steps run on a jitted model and on the same model
built eagerly from the same seed, and everything each step computed (loss, outputs, gradients)
and the state after (parameters, buffers, optimizer state, random state) compared.

(Models are built twice rather than deep-copied: a deep copy of a parametrized module shares its
class, whose properties ``remove_parametrizations`` deletes.)"""

from collections.abc import Callable

import torch
from torch import nn

import thunder_rs

#: One step: ``program(model, step) -> (loss, outputs)``, ``model`` jitted or eager.
Program = Callable[[Callable, int], tuple[torch.Tensor, list]]
EXACT = dict(rtol=0, atol=0)


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-2)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def run_steps(model, call, program: Program, steps: int, make_optimizer, before, after_backward) -> dict:
    """``steps`` steps of ``program`` on ``call`` (``model`` or its jitted form) from one seed,
    ``before(step, model)`` first, ``after_backward(model)`` (gradient clipping) before the
    optimizer's step; what each step computed, and the state after."""
    optimizer = make_optimizer(model.parameters())
    record: dict = {}
    for step in range(steps):
        torch.manual_seed(10 + step)
        if before is not None:
            before(step, model)
        optimizer.zero_grad()
        loss, outputs = program(call, step)
        loss.backward()
        if after_backward is not None:
            record[f"step {step} after backward"] = after_backward(model)
        record[f"step {step} loss"] = loss.detach()
        record.update({f"step {step} output {i}": out.detach() for i, out in enumerate(outputs)})
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        record.update({f"step {step} grad of {n}": g for n, g in grads.items()})
        optimizer.step()
        record[f"step {step} random state"] = torch.get_rng_state()
    record.update({f"parameter {n}": p.detach().clone() for n, p in model.named_parameters()})
    record.update({f"buffer {n}": b.clone() for n, b in model.named_buffers()})
    for i, state in optimizer.state_dict()["state"].items():
        record.update({f"optimizer state {i} {k}": v for k, v in state.items()})
    return record


def trains_as_eager(
    make, program: Program, *, steps=3, compiles=1, make_optimizer=adamw, before=None, after_backward=None, **tol
):
    """Trains ``make()`` jitted, then the same model built eagerly; every recorded tensor equals
    eager's (``tol``: exactly by default), and the jitted model compiled ``compiles`` times."""
    tol = tol or EXACT
    torch.manual_seed(0)
    model = make()
    torch.manual_seed(0)
    eager = make()
    jmodel = thunder_rs.jit(model)
    actual = run_steps(model, jmodel, program, steps, make_optimizer, before, after_backward)
    expected = run_steps(eager, eager, program, steps, make_optimizer, before, after_backward)
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, equal_nan=True, **tol, msg=lambda m: f"{name}: {m}")
    assert thunder_rs.compile_stats(jmodel).cache_misses == compiles
    return jmodel


def rows(features: int, batch: int = 4):
    def program(model, step):
        out = model(torch.randn(batch, features))
        return out.square().mean(), [out]

    return program


def returns_loss(*make_inputs):
    """A program calling a model that returns ``(loss, output)`` on fresh inputs."""

    def program(model, step):
        loss, out = model(*(make() for make in make_inputs))
        return loss, [out]

    return program


class Loss(nn.Module):
    """``model``'s output and its mean square, as a program's model returns them."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(x)
        return out.square().mean(), out
