"""Train/eval toggles inside a jitted function on a module it does not own: a distillation step's
``teacher.eval()``, the teacher's forward, ``teacher.train()``, with the teacher (BatchNorm and
Dropout) held in a closure, a global, an argument object or a jitted module's attribute. Compared
with eager: outputs, the student's grads, every module's ``training`` after the call, BatchNorm's
running stats, and the number of compiles."""

import types

import pytest
import torch
from torch._dynamo.utils import counters

import thunder_rs

CALLS = 4


def _models():
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.5))
    return teacher, torch.nn.Linear(4, 4)


def _toggle(teacher, student, x):
    teacher.eval()
    with torch.no_grad():
        t = teacher(x)
    teacher.train()
    return student(x), t


def _eval_once(teacher, student, x):
    teacher.eval()
    with torch.no_grad():
        t = teacher(x)
    return student(x), t


def _train_then_eval(teacher, student, x):
    first = teacher(x)  # (train mode as found: running stats updated, dropout drawn)
    teacher.eval()
    second = teacher(x)
    teacher.train()
    return student(x) + first, second


BODIES = {"toggle": _toggle, "eval_once": _eval_once, "train_then_eval": _train_then_eval}


def _closure(body, teacher, student):
    def step(x):
        return body(teacher, student, x)

    return step, ()


GLOBAL_MODELS: list = []


def _global_step(x):
    teacher, student, body = GLOBAL_MODELS
    return body(teacher, student, x)


def _global(body, teacher, student):
    GLOBAL_MODELS[:] = [teacher, student, body]
    return _global_step, ()


def _argument(body, teacher, student):
    models = types.SimpleNamespace(teacher=teacher, student=student)

    def step(x, models):
        return body(models.teacher, models.student, x)

    return step, (models,)


class _Distiller(torch.nn.Module):
    def __init__(self, body, teacher, student):
        super().__init__()
        self.body, self.teacher, self.student = body, teacher, student

    def forward(self, x):
        return self.body(self.teacher, self.student, x)


def _module(body, teacher, student):
    return _Distiller(body, teacher, student), ()


HOLDERS = {"closure": _closure, "global": _global, "argument": _argument, "module": _module}


def _compiled(fn, backend: str):
    return thunder_rs.jit(fn) if backend == "jit" else torch.compile(fn, backend="thunder_rs")


def _same_state(expected, got) -> None:
    for (name, a), b in zip(expected.named_modules(), got.modules()):
        assert a.training == b.training, name
    for (name, a), b in zip(expected.named_buffers(), got.buffers()):
        assert torch.allclose(a, b), name


def _run(body: str, holder: str, backend: str, start: bool, between=None):
    """Runs the step ``CALLS`` times eagerly and compiled (``between(teacher)`` before each call)
    on models in mode ``start``; returns the compiled function."""
    (te, se), (tj, sj) = _models(), _models()
    te.train(start), tj.train(start)
    # (eagerly through a closure where the global holds the compiled step's models)
    eager, extra_e = HOLDERS["closure" if holder == "global" else holder](BODIES[body], te, se)
    fn, extra_j = HOLDERS[holder](BODIES[body], tj, sj)
    jfn = _compiled(fn, backend)
    for i in range(CALLS):
        if between is not None:
            between(te), between(tj)
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(i))
        torch.manual_seed(10 + i)
        e = eager(x, *extra_e)
        torch.manual_seed(10 + i)
        j = jfn(x, *extra_j)
        for a, b in zip(e, j):
            assert torch.allclose(a, b, atol=1e-6), (i, a, b)
        e[0].sum().backward(), j[0].sum().backward()
        assert torch.allclose(se.weight.grad, sj.weight.grad, atol=1e-6)
        _same_state(te, tj)
    return jfn


def _misses(jfn, backend: str):
    """The compiles of ``jfn``: its cache misses, or the frames Dynamo compiled since ``_reset``."""
    return thunder_rs.compile_stats(jfn).cache_misses if backend == "jit" else counters["frames"]["ok"]


def _reset() -> None:
    torch._dynamo.reset()
    counters.clear()


@pytest.mark.parametrize("holder", sorted(HOLDERS))
@pytest.mark.parametrize("start", [True, False])
def test_toggle_around_the_teacher_computes_as_eager_compiled_once(holder, start):
    jfn = _run("toggle", holder, "jit", start)
    # (The mode the program reads is the one it set. A jitted module's cache is keyed by its
    # modules' modes: the second call finds the teacher in train mode, as the first left it.)
    assert _misses(jfn, "jit") == (2 if holder == "module" and not start else 1)


@pytest.mark.parametrize("holder", ["closure", "global", "argument"])
def test_toggle_under_torch_compile_computes_as_eager(holder):
    _reset()
    jfn = _run("toggle", holder, "compile", True, between=lambda t: t.eval())
    assert _misses(jfn, "compile") == 1


@pytest.mark.parametrize("holder", ["closure", "module"])
def test_toggle_with_the_caller_setting_eval_between_calls(holder):
    """The caller's ``teacher.eval()`` before each call: eager's call ends with the teacher in
    train mode (its last ``teacher.train()``), and nothing the program reads changed."""
    jfn = _run("toggle", holder, "jit", True, between=lambda t: t.eval())
    assert _misses(jfn, "jit") == 1


@pytest.mark.parametrize("holder", ["closure", "argument"])
def test_eval_once_with_the_caller_setting_train_between_calls(holder):
    """``teacher.eval()`` only, in a loop that sets ``teacher.train()`` before each call: the mode
    the program reads is the one it set, so it compiles once (it compiled on every call)."""
    jfn = _run("eval_once", holder, "jit", True, between=lambda t: t.train())
    assert _misses(jfn, "jit") == 1


@pytest.mark.parametrize("start", [True, False])
def test_train_mode_call_then_eval_updates_running_stats_as_eager(start):
    """The teacher run in the mode the call found (read before the program sets it: guarded), then
    in eval mode: running stats and dropout as eager's; a call finding the other mode compiles
    once more."""
    jfn = _run("train_then_eval", "closure", "jit", start)
    assert _misses(jfn, "jit") == (1 if start else 2)


def test_train_mode_call_then_eval_under_torch_compile():
    _reset()
    jfn = _run("train_then_eval", "global", "compile", False)
    assert _misses(jfn, "compile") == 2  # (Dynamo guards the mode the call found: eval, then train)


def test_eval_once_under_torch_compile_with_the_caller_setting_train():
    _reset()
    jfn = _run("eval_once", "closure", "compile", True, between=lambda t: t.train())
    assert _misses(jfn, "compile") == 1
