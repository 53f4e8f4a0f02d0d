"""The harness of ``test_user_loops_round5.py``: a training program built three times from one
seed (eager, with ``thunder_rs.jit`` where the program says, and with its step under
``torch.compile(backend="thunder_rs")``), run step by step, and what each step returned and the
state after it (parameters, gradients, buffers, optimizer state, the scale of a ``GradScaler``,
the random state) compared with eager's.

A program is ``make(mode) -> world``, a dict of the modules, optimizers and scalers it trains and
``"step"``, the function one step calls; ``step(world, i)`` runs step ``i`` and returns what it
computed. ``mode`` is ``"eager"``, ``"jit"``, ``"compile"`` or ``"dynamo_eager"``
(``torch.compile(backend="eager")``: Dynamo's own rewriting, with no backend, to tell its
differences from ours); :func:`wrap` turns a function or module into the mode's."""

import torch
from torch import nn

import thunder_rs
from thunder_rs.dynamo import compiled_graphs
from thunder_rs.errors import ThunderError

EXACT = dict(rtol=0, atol=0)
#: Dynamo's optimizer steps (``torch.compile`` of ``optimizer.step()``) read the step count as a
#: tensor, where eager's read it as a Python number: Adam's bias corrections, RMSprop's and
#: Adagrad's steps differ from eager's in the last bits, whatever the backend.
DYNAMO_OPTIMIZER_TOL = dict(rtol=1e-5, atol=1e-6)


def wrap(mode: str, fn):
    """``fn`` (a function or a module) as ``mode`` runs it."""
    if mode == "eager":
        return fn
    if mode == "jit":
        return thunder_rs.jit(fn)
    return torch.compile(fn, backend="eager" if mode == "dynamo_eager" else "thunder_rs")


def state(world: dict) -> dict:
    """What ``world`` holds after a step, as copies."""
    out: dict = {}
    for key, value in world.items():
        if isinstance(value, nn.Module) and key != "step":
            for name, p in value.named_parameters():
                out[f"{key}.{name}"] = p.detach().clone()
                out[f"{key}.{name}.grad"] = None if p.grad is None else p.grad.clone()
            out.update({f"{key}.{name}": b.clone() for name, b in value.named_buffers()})
        elif isinstance(value, torch.optim.Optimizer):
            for i, kept in value.state_dict()["state"].items():
                out.update({f"{key} state {i} {name}": torch.as_tensor(t).clone() for name, t in kept.items()})
            out[f"{key} learning rates"] = [float(group["lr"]) for group in value.param_groups]
        elif isinstance(value, torch.amp.GradScaler):
            out[f"{key} scale"] = value.get_scale()
    out["random state"] = torch.get_rng_state()
    return out


def run_world(make, step, mode: str, steps: int = 3, snapshot=None) -> tuple[list, dict]:
    """``steps`` steps of the program in ``mode``: per step, what it returned and ``snapshot`` of
    the world after it (``state`` by default); and the world. A step that raises a ``RuntimeError``
    records the error's type and message in place of what it returned (a refusal of thunder_rs's
    is raised)."""
    torch.manual_seed(0)
    world = make(mode)
    record = []
    for i in range(steps):
        torch.manual_seed(100 + i)
        try:
            returned = step(world, i)
        except ThunderError:
            raise
        except RuntimeError as e:
            returned = f"{type(e).__name__}: {e}"
        record.append((returned, (snapshot or state)(world)))
    return record, world


def run(make, step, mode: str, steps: int = 3) -> list:
    """``steps`` steps of the program in ``mode``: per step, what it returned and the state after."""
    return run_world(make, step, mode, steps)[0]


def comparable(value):
    """``value`` with its strings (errors' messages) as tensors of their characters."""
    if isinstance(value, str):
        return torch.tensor([ord(c) for c in value])
    if isinstance(value, (list, tuple)):
        return [comparable(v) for v in value]
    return value


def assert_same(actual: list, expected: list, **tol) -> None:
    """Step by step, with messages naming the step."""
    assert len(actual) == len(expected)
    for i, ((got, got_state), (want, want_state)) in enumerate(zip(actual, expected)):
        got, want = comparable(got), comparable(want)
        torch.testing.assert_close(got, want, equal_nan=True, **(tol or EXACT), msg=lambda m: f"step {i}: {m}")
        assert got_state.keys() == want_state.keys()
        for name, value in want_state.items():
            torch.testing.assert_close(
                got_state[name], value, equal_nan=True, **(tol or EXACT), msg=lambda m: f"step {i} {name}: {m}"
            )


def trains_as_eager(make, step, modes=("jit", "compile"), steps: int = 3, **tol) -> None:
    """The program in each of ``modes`` computes what eager computes, step by step; under
    ``torch.compile`` thunder_rs compiled at least one of Dynamo's graphs."""
    expected = run(make, step, "eager", steps)
    for mode in modes:
        before = compiled_graphs()
        if mode == "compile":
            torch._dynamo.reset()  # (else Dynamo's limit of compiles per code object may run it eagerly)
        assert_same(run(make, step, mode, steps), expected, **tol)
        if mode == "compile":
            new = [g for g in compiled_graphs() if all(g is not b for b in before)]
            assert any(g.jitted is not None and thunder_rs.cache_misses(g.jitted) for g in new), "nothing compiled"
