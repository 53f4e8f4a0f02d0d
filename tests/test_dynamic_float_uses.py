"""What a program does with a float argument that changes between calls, once it is a float input
of the trace (``core.acquisition.float_args``), against eager with the value changing over the
calls: every use answers as eager's float does, symbolic where it can stay so, else the float a
constant per value (a miss reason naming it). The same for the symbolic sizes a program reads
where they stand in for an int in the same way."""

import copy
import math
import numbers

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")

VALUES = (0.3, 0.7, 0.9, 0.3, 0.5)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _check(fn, values=VALUES):
    """``jit(fn)`` called as ``fn(x, v)`` for each of ``values``, each result checked against
    eager's; returns its compile stats."""
    jfn, x = thunder_rs.jit(fn), torch.rand(8) + 0.5
    for v in values:
        expected, got = fn(x, v), jfn(x, v)
        assert _same(expected, got), (v, expected, got)
    return thunder_rs.compile_stats(jfn)


#: Text the program makes of the float with ``repr``: the value (it specialises), never the trace's
#: stand-in for it (``SymFloat(t1, hint=0.7)`` before).
REPRS = {
    "repr": lambda x, s: (x * s, repr(s)),
    "!r": lambda x, s: (x * s, f"{s!r}"),
    "a list's text": lambda x, s: (x * s, str([s, 1.0])),
}


@pytest.mark.parametrize("use", REPRS)
def test_repr_of_a_float_input_is_its_value(use):
    stats = _check(REPRS[use])
    assert stats.cache_misses == len(set(VALUES))
    assert "s kept constant" in stats.miss_reasons[1]


def test_repr_of_a_symbolic_size_is_its_value():
    def fn(x):
        n = x.shape[0]
        return x * 2, repr(n), str([n]), f"{n!r}"

    jfn = thunder_rs.jit(fn)
    for n in (3, 4, 5, 4):
        x = torch.randn(n)
        assert _same(jfn(x), fn(x)), n


def _is_float(v) -> bool:
    return type(v) is float


def _scaled(x, values):
    for v in values:
        x = x * v if type(v) is float else x + 1
    return x


#: ``type()`` of the float: eager's is ``float``; the trace's stand-in's class is not, so each of
#: these took the other path on every call after the float changed, silently. The read is found
#: in the program's bytecode as it runs, and the float is a constant per value (``type_reads``).
TYPE_READS = {
    "is": lambda x, s: x * s if type(s) is float else x - s,
    "==": lambda x, s: x * s if type(s) == float else x - s,  # noqa: E721 (the program's comparison)
    "in": lambda x, s: x * s if type(s) in (int, float) else x - s,
    "a table keyed by type": lambda x, s: x * {float: 2.0, int: 3.0}.get(type(s), 5.0),
    "its name": lambda x, s: (x * s, type(s).__name__),
    "in a function it calls": lambda x, s: x * s if _is_float(s) else x - s,
    "of an expression": lambda x, s: x * s if type(s * 2) is float else x - s,
    "an item of a dict": lambda x, s: (lambda cfg: x * s if type(cfg["lr"]) is float else x - s)({"lr": s}),
    "a loop's variable": lambda x, s: _scaled(x, [s, 0.5]),
    "in a comprehension": lambda x, s: x * s if all([type(v) is float for v in (s, 0.5)]) else x - s,
    "in a generator": lambda x, s: x * s if all(type(v) is float for v in {"a": s, "b": 0.5}.values()) else x,
}


@pytest.mark.parametrize("use", TYPE_READS)
def test_type_of_a_float_input_is_float(use):
    stats = _check(TYPE_READS[use])
    assert stats.cache_misses == len(set(VALUES))
    assert "s kept constant" in stats.miss_reasons[1], stats.miss_reasons


def test_type_of_a_float_argument_s_item_and_of_a_module_s_float():
    x = torch.rand(4)

    def fn(x, cfg):
        return x * cfg["lr"] if type(cfg["lr"]) is float else x

    jfn = thunder_rs.jit(fn)
    for v in VALUES:
        assert _same(jfn(x, {"lr": v}), fn(x, {"lr": v})), v
    site = f"{__file__}:{fn.__code__.co_firstlineno + 1}"
    reason = thunder_rs.compile_stats(jfn).miss_reasons[1]
    assert reason.endswith(f"cfg['lr'] kept constant: its value is needed at {site}"), reason

    class Gate(torch.nn.Module):
        p = 0.1

        def forward(self, x):
            return x * self.p if type(self.p) is float else x

    module = Gate()
    jmodule = thunder_rs.jit(module)
    for v in VALUES:
        module.p = v
        assert _same(jmodule(x), module(x)), v
    assert "Gate.p kept constant" in thunder_rs.compile_stats(jmodule).miss_reasons[1]


def test_type_of_other_values_keeps_the_float_symbolic():
    stats = _check(lambda x, s, opts={"a": 1}: x * s if type(opts) is dict and type(x.shape) is torch.Size else x)
    assert stats.cache_misses == 2


def test_type_of_a_symbolic_size_is_int():
    """``type()`` of a size (an int argument, a tensor's dim) is ``int`` in eager: the compile with
    it symbolic fails naming the line, and the program compiles for each size, as eager answers."""

    def fn(x, n):
        return x[:n] * 2 if type(n) is int and type(x.shape[0]) is int else x[:n]

    jfn = thunder_rs.jit(fn)
    for n in (2, 3, 4, 5, 3, 6):
        x = torch.randn(n + 1)
        assert _same(jfn(x, n), fn(x, n)), n
    assert thunder_rs.compile_stats(jfn).cache_misses == 5
    assert f"type() of the symbolic size t0 at {__file__}:" in jfn._dynamic_off


def test_a_batch_norm_momentum_scheduled_between_calls_runs_eager_s_kernel():
    """A BatchNorm's ``momentum`` changed between calls is a float input: the kernel eager runs
    takes the call's float (the decomposition it fell back to differed in the output's and the
    gradients' last bits)."""
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    model = copy.deepcopy(eager)
    jmodel = thunder_rs.jit(model)
    for momentum in (0.1, 0.05, 0.02, 0.01):
        eager[1].momentum = model[1].momentum = momentum
        x = torch.randn(2, 3, 8, 8)
        expected, got = eager(x), jmodel(x)
        expected.sum().backward()
        got.sum().backward()
        assert _same(expected, got), momentum
        for a, b in zip((*eager.parameters(), *eager.buffers()), (*model.parameters(), *model.buffers())):
            assert _same(a, b) and (a.grad is None or _same(a.grad, b.grad)), momentum
    reason = thunder_rs.compile_stats(jmodel).miss_reasons[1]
    assert reason.endswith("compiled with symbolic floats BatchNorm2d.momentum"), reason


class _NoInstanceDict:
    a = 1.0

    @property
    def __dict__(self):
        raise RuntimeError("no instance dict")


def test_a_type_read_the_observer_cannot_follow_is_no_error():
    """The operand of ``type`` is read without running the program's code where it can be; an
    object whose ``__dict__`` raises reads as no stand-in (the error was the compile's)."""

    def fn(x, s):
        o = _NoInstanceDict()
        return x * s if type(o.a) is float else x

    _check(fn)


_OPTIMIZER = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)


def _set_lr(x, s):
    _OPTIMIZER.param_groups[0]["lr"] = s
    return x * 2, _OPTIMIZER.param_groups[0]["lr"]


def _dropout(x, s):
    torch.manual_seed(0)
    return F.dropout(x, p=s / 4)


CROSSING = (0.5, 1.0, 1.5, 0.5, 2.0)
#: More uses, each with the compiles it takes over ``CROSSING``: 2 where the float stays symbolic,
#: 3 or 4 where a decision on it is guarded (an entry per answer), 4 (one per value) where the
#: program needs the value itself.
USES = {
    "math.floor": (lambda x, s: x * math.floor(s * 3), 4),
    "math.isclose": (lambda x, s: x * 2 if math.isclose(s, 1.0) else x, 4),
    "is_integer": (lambda x, s: x * 2 if s.is_integer() else x, 4),
    "float.hex": (lambda x, s: (x, float.hex(s), s.hex()), 4),
    "> an int": (lambda x, s: x * s if s > 1 else x - s, 3),
    "== an int": (lambda x, s: x * s if s == 1 else x - s, 3),
    "in a tuple": (lambda x, s: x * s if s in (0.5, 1.0) else x - s, 4),
    "a dict's key": (lambda x, s: x * {0.5: 1.0, 1.0: 2.0}.get(s, 3.0), 4),
    "numbers.Real": (lambda x, s: x * s if isinstance(s, numbers.Real) else x, 2),
    "torch.tensor": (lambda x, s: x * torch.tensor(s), 2),
    "torch.full": (lambda x, s: torch.full((3,), s), 2),
    "new_full": (lambda x, s: x.new_full((3,), s), 2),
    "clamp min": (lambda x, s: torch.clamp(x, min=s), 2),
    "dropout p": (_dropout, 2),
    "leaky_relu": (lambda x, s: F.leaky_relu(x - 1, s), 2),
    "an optimizer's lr": (_set_lr, 4),
    "a size": (lambda x, s: x[: int(4 * s)], 4),
}


@pytest.mark.parametrize("use", USES)
def test_uses_of_a_float_input_against_eager(use):
    fn, compiles = USES[use]
    assert _check(fn, CROSSING).cache_misses == compiles


def test_type_of_a_shape_of_symbolic_sizes_is_torch_size():
    def fn(x):
        return x * 2 if type(x.shape) is torch.Size else x

    jfn = thunder_rs.jit(fn)
    for n in (2, 3, 4, 5):
        x = torch.randn(n)
        assert _same(jfn(x), fn(x)), n
    assert "type() of a shape of symbolic sizes at " in jfn._dynamic_off
