"""The harness of ``test_user_loops_round6.py``: round 5's (``user_loops_round5.py``: a program
built from one seed in eager, under ``thunder_rs.jit`` and under ``torch.compile(backend=
"thunder_rs")``, run step by step and compared with eager's) with more of the state compared after
each step: learning-rate schedulers' state, a ``GradScaler``'s whole state, tensors and lists of
tensors the program keeps (a queue, slow weights), and a log of Python numbers it appends to; and
the compile counts read: the cache misses of the jitted callables the world lists under
``"jitted"``, and the graphs thunder_rs compiled under ``torch.compile``."""

import torch

import thunder_rs
from thunder_rs.dynamo import compiled_graphs
from torch import nn

from user_loops_round5 import DYNAMO_OPTIMIZER_TOL, assert_same, run_world, wrap

__all__ = ["assert_same", "run", "state", "trains_as_eager", "wrap"]


def copied(value):
    """``value`` with its tensors, in lists and tuples too (LBFGS's history), copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return [copied(v) for v in value]
    return value


def state(world: dict) -> dict:
    """What ``world`` holds after a step, as copies: the modules' parameters, gradients and
    buffers, the optimizers' state and learning rates, the schedulers' and scalers' state, the
    random state, and the tensors, lists and numbers the program keeps."""
    out: dict = {"random state": torch.get_rng_state()}
    for key, value in world.items():
        if isinstance(value, nn.Module) and key != "step":
            for name, p in value.named_parameters():
                out[f"{key}.{name}"] = p.detach().clone()
                out[f"{key}.{name}.grad"] = None if p.grad is None else p.grad.clone()
            out.update({f"{key}.{name}": b.clone() for name, b in value.named_buffers()})
        elif isinstance(value, torch.optim.Optimizer):
            for i, kept in value.state_dict()["state"].items():
                out.update({f"{key} state {i} {name}": copied(t) for name, t in kept.items()})
            out[f"{key} learning rates"] = [float(group["lr"]) for group in value.param_groups]
        elif isinstance(value, torch.optim.lr_scheduler.LRScheduler):
            out[f"{key} last lr"] = [float(lr) for lr in value.get_last_lr()]
            out[f"{key} epoch"] = value.last_epoch
        elif isinstance(value, torch.amp.GradScaler):
            kept = value.state_dict()
            out[f"{key} state"] = [float(kept[k]) for k in ("scale", "_growth_tracker")] if kept else []
        elif isinstance(value, torch.Tensor):
            out[key] = value.detach().clone()
        elif isinstance(value, (list, dict)) and key != "jitted":
            out[key] = copied(list(value.values()) if isinstance(value, dict) else value)
    return out


def run(make, step, mode: str, steps: int = 3) -> tuple[list, dict]:
    """``steps`` steps of the program in ``mode``: per step, what it returned and the state after
    (this module's ``state``); and the world."""
    return run_world(make, step, mode, steps, state)


def jit_misses(world: dict) -> int:
    return sum(thunder_rs.cache_misses(j) for j in world.get("jitted", []))


def trains_as_eager(make, step, modes=("jit", "compile"), steps: int = 3, misses=None, dynamo=False, **tol) -> dict:
    """The program in each of ``modes`` computes what eager computes, step by step. Under ``jit``
    the callables the world lists under ``"jitted"`` compiled ``misses`` times (when given); under
    ``torch.compile`` thunder_rs compiled at least one of Dynamo's graphs. ``dynamo``: the compiled
    step holds an adaptive optimizer's step, which Dynamo rewrites (``DYNAMO_OPTIMIZER_TOL``): the
    compiled program is compared bit for bit with Dynamo's own (``backend="eager"``), and with
    eager's within that tolerance. Returns the worlds."""
    expected, _ = run(make, step, "eager", steps)
    worlds = {}
    for mode in modes:
        before = compiled_graphs()
        if mode == "compile":
            torch._dynamo.reset()  # (else Dynamo's limit of compiles per code object may run it eagerly)
        record, worlds[mode] = run(make, step, mode, steps)
        if mode == "jit" and misses is not None:
            assert jit_misses(worlds[mode]) == misses
        if mode == "compile":
            new = [g for g in compiled_graphs() if all(g is not b for b in before)]
            assert any(g.jitted is not None and thunder_rs.cache_misses(g.jitted) for g in new), "nothing compiled"
        if mode == "compile" and dynamo:
            torch._dynamo.reset()
            assert_same(record, run(make, step, "dynamo_eager", steps)[0], **tol)
            assert_same(record, expected, **(tol or DYNAMO_OPTIMIZER_TOL))
        else:
            assert_same(record, expected, **tol)
    return worlds
