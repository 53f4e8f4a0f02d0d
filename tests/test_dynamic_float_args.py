"""Float arguments that change between calls (a learning rate, a temperature, a loss weight) are
inputs of the trace after the first change (``core.acquisition.float_args``): two compiles for any
number of values, the caller's float passed to torch as eager passes it (bit-equal outputs and
gradients, eager's type promotion). Where the program needs the value itself (a branch, ``int()``,
``math.*``, text, a dropout probability) the float stays a constant, a compile per value, and the
miss reason names the argument and the line."""

import math

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")

VALUES = (0.05, 0.15, 0.25, 1e-3, 3.7, -2.5)


def _equal(a, b) -> bool:
    """Bit-equal tensors: dtype, values, NaNs where eager's are and the signs of zeros."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return (
        torch.equal(a.isnan(), b.isnan())
        and torch.equal(a.nan_to_num(), b.nan_to_num())
        and torch.equal(a.signbit(), b.signbit())
    )


def _check(fn, calls, **options):
    """Calls ``jit(fn)`` with each of ``calls`` and checks its outputs against eager's; returns
    its compile stats."""
    jfn = thunder_rs.jit(fn, **options)
    for args in calls:
        expected, got = fn(*args), jfn(*args)
        for e, g in zip(*(o if isinstance(o, tuple) else (o,) for o in (expected, got))):
            assert _equal(e, g) if isinstance(e, torch.Tensor) else (e == g and type(e) is type(g)), (args, e, g)
    return thunder_rs.compile_stats(jfn)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_changing_float_compiles_twice_bit_equal_to_eager(dtype):
    x = torch.randn(16, dtype=dtype)
    stats = _check(lambda x, s: x * s + s, [(x, v) for v in VALUES])
    assert stats.cache_misses == 2
    assert stats.miss_reasons[1] == "s: 0.05 -> a float input; compiled with symbolic floats s"
    assert stats.cache_hits == len(VALUES) - 2


def test_type_promotion_with_a_float_input_is_eager_s():
    """A float is a wrapped number: it never promotes a half tensor, and an int tensor times a
    float is of the default dtype."""
    ints, half = torch.arange(8), torch.randn(8, dtype=torch.float16)
    stats = _check(lambda i, h, s: (i * s, h * s, i + s * 2, (i * s).dtype), [(ints, half, v) for v in VALUES])
    assert stats.cache_misses == 2


def test_python_arithmetic_on_the_float_is_eager_s():
    """What the program computes from the float in Python is computed again on each call with the
    same float operations, in the program's order."""
    x = torch.randn(4, 4)
    stats = _check(lambda x, s: x * (s * 3 + 1) / (s - 7) - s**2, [(x, v) for v in VALUES])
    assert stats.cache_misses == 2


def test_negative_zero_nan_and_infinities_go_to_torch_as_given():
    x = torch.randn(8)
    values = (0.5, 0.25, -0.0, 0.0, float("nan"), float("inf"), float("-inf"))
    stats = _check(lambda x, s: (x * s, torch.full((2,), s)), [(x, v) for v in values])
    assert stats.cache_misses == 2


def test_decisions_on_negative_zero_and_nan_are_eager_s():
    """A comparison on the float is guarded on its answer: -0.0 == 0.0 takes the branch 0.0 took
    (``x * s`` gets the sign of zero as given), NaN the one ``s != s`` chose."""
    x = torch.randn(8)
    values = (0.0, -0.0, 0.0, float("nan"), float("nan"), 1.0, 2.0)
    stats = _check(lambda x, s: x * s if s == 0.0 or s != s else x, [(x, v) for v in values])
    assert stats.cache_misses == 4
    assert stats.miss_reasons[2].startswith("s == 0.0 was True when traced (decided at ")


def test_a_branch_on_the_float_is_guarded_on_its_outcome():
    """``if s > 0.5`` keeps ``s`` symbolic: each side of the branch compiles once, with a guard on
    the answer, as torch.compile's guards on a SymFloat."""
    x = torch.randn(8)

    def fn(x, s):
        if s > 0.5:
            return x * s
        return x - s

    stats = _check(fn, [(x, v) for v in (0.1, 0.7, 0.9, 0.2, 0.7, 0.3, 0.5, 0.50001)])
    assert stats.cache_misses == 3
    site = f"{__file__}:{fn.__code__.co_firstlineno + 1}"
    reason = f"s > 0.5 was True when traced (decided at {site}), not now; compiled with symbolic floats s"
    assert stats.miss_reasons[2] == reason


#: Uses of the float whose answer a trace cannot keep symbolic: a constant per value.
VALUE_USES = {
    "round": lambda x, s: x * round(s, 1),
    "int": lambda x, s: x[: int(s * 4)],
    "float.__format__": lambda x, s: (x * s, f"{s:.2f}"),
    "returned": lambda x, s: (x * s, s * 2),
}


@pytest.mark.parametrize("use", VALUE_USES)
def test_uses_of_the_value_keep_it_constant(use):
    x = torch.rand(8) + 0.5
    stats = _check(VALUE_USES[use], [(x, v) for v in (0.3, 0.7, 0.9, 0.3)])
    assert stats.cache_misses == 3
    assert "s kept constant" in stats.miss_reasons[1]


#: Python arithmetic on the float that stays symbolic: computed again in doubles on each call, in
#: the program's order, guarded only where a value decides (a divisor nonzero, a domain).
SYMBOLIC_USES = {
    "math.exp": lambda x, s: x * math.exp(s),
    "math.sqrt": lambda x, s: x * math.sqrt(s),
    "math.log": lambda x, s: x * math.log(s) + math.log(s, 3),
    "reciprocal": lambda x, s: x * (1 / s) + 2 / (s - 7),
    "powers": lambda x, s: x * s**0.5 + s**2 + (-s) ** 3 + 2**s,
    "max": lambda x, s: x / max(s, 1e-8),
    "bool": lambda x, s: x * s if s else x,
    "dropout p": lambda x, s: F.dropout(x, s / 4, training=False) * s,
    "chained": lambda x, s: x * (math.sqrt(s * 3 + 1) / (s - 7) - s**2 * math.exp(-s)),
}


@pytest.mark.parametrize("use", SYMBOLIC_USES)
def test_python_arithmetic_on_the_float_stays_symbolic(use):
    x = torch.rand(8, dtype=torch.float64) + 0.5
    stats = _check(SYMBOLIC_USES[use], [(x, v) for v in (0.3, 0.7, 0.9, 0.3, 1e-3, 2.5, 0.55)])
    assert stats.cache_misses == 2, stats.miss_reasons


def test_a_comparison_as_a_value_compiles_per_answer():
    x = torch.rand(8)
    stats = _check(lambda x, s: x * (s < 0.6), [(x, v) for v in (0.3, 0.7, 0.9, 0.3, 0.1, 0.8)])
    assert stats.cache_misses == 3


def test_a_division_by_a_zero_float_raises_as_eager():
    """``1 / s`` keeps ``s`` symbolic with the guard ``s != 0``: a call with 0.0 compiles again and
    raises eager's ZeroDivisionError from the program's line; the calls after it keep ``s``
    symbolic."""

    def fn(x, s):
        return x * (1 / s)

    jfn, x = thunder_rs.jit(fn), torch.randn(4)
    for v in (0.5, 0.25, 0.125):
        assert _equal(jfn(x, v), fn(x, v))
    for call in (fn, jfn):
        with pytest.raises(ZeroDivisionError, match="float division by zero") as raised:
            call(x, 0.0)
        assert raised.traceback[-1].lineno == fn.__code__.co_firstlineno  # (0-based: the return line)
    for v in (0.2, -0.0, 3.0):
        if v:
            assert _equal(jfn(x, v), fn(x, v))
    assert thunder_rs.compile_stats(jfn).cache_misses == 2


def test_a_math_domain_error_raises_as_eager():
    jfn, x = thunder_rs.jit(lambda x, s: x * math.sqrt(s)), torch.randn(4)
    for v in (0.5, 0.25):
        jfn(x, v)
    with pytest.raises(ValueError, match="math domain error"):
        jfn(x, -1.0)
    assert _equal(jfn(x, 4.0), x * 2.0)
    assert thunder_rs.compile_stats(jfn).cache_misses == 2


def test_floats_in_keywords_lists_and_dicts():
    x = torch.randn(8)

    def fn(x, pair, cfg, *, scale):
        return x * pair[0] + pair[1] * cfg["lr"] - scale

    jfn = thunder_rs.jit(fn)
    for v in VALUES:
        args, kwargs = (x, [v, v * 2], {"lr": v / 3}), {"scale": v + 1}
        assert _equal(jfn(*args, **kwargs), fn(*args, **kwargs))
    stats = thunder_rs.compile_stats(jfn)
    assert stats.cache_misses == 2
    assert stats.miss_reasons[1].endswith("compiled with symbolic floats pair[0], pair[1], cfg['lr'], scale")


def test_floats_with_symbolic_sizes_and_ints():
    stats = _check(lambda x, n, s: x[:n] * s, [(torch.randn(n + 3, 2), n, n / 10) for n in range(2, 8)])
    assert stats.cache_misses == 3


def test_a_program_reading_tensor_values_takes_the_float_too():
    x = torch.randn(8)
    stats = _check(lambda x, s: x * s if x.sum().item() > 0 else x / s, [(x, v) for v in VALUES])
    assert stats.cache_misses == 2


def test_dynamic_false_keeps_floats_constant():
    x = torch.randn(8)
    assert _check(lambda x, s: x * s, [(x, v) for v in VALUES], dynamic=False).cache_misses == len(VALUES)
    assert _check(lambda x, s: x * s, [(x, v) for v in VALUES], dynamic=True).cache_misses == 2


def test_gradients_through_a_float_input():
    """The backward of ``x * s`` reads ``s``: the forward saves the call's float for it."""
    x = torch.randn(3, 4)

    def fn(x, w, s):
        return ((x @ w) * s).sum() * s + s

    jfn = thunder_rs.jit(fn)
    for v in VALUES:
        w1, w2 = (torch.randn(4, 5, generator=torch.Generator().manual_seed(0)).requires_grad_() for _ in range(2))
        expected, got = fn(x, w1, v), jfn(x, w2, v)
        expected.backward()
        got.backward()
        assert _equal(expected, got) and _equal(w1.grad, w2.grad)
    assert thunder_rs.compile_stats(jfn).cache_misses == 2


def test_training_with_a_scheduled_loss_weight():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model.load_state_dict(eager.state_dict())
    jmodel = thunder_rs.jit(model)

    def step_loss(m, x, y, weight):
        return F.mse_loss(m(x), y) * weight

    jloss = thunder_rs.jit(lambda x, y, weight: step_loss(jmodel, x, y, weight))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for step in range(8):
        x, y = torch.randn(16, 4), torch.randn(16, 2)
        weight = 0.5 * (1 + math.cos(math.pi * step / 8))
        for loss, opt in ((step_loss(eager, x, y, weight), opts[0]), (jloss(x, y, weight), opts[1])):
            loss.backward()
            opt.step()
            opt.zero_grad()
        assert all(torch.equal(a, b) for a, b in zip(eager.parameters(), model.parameters())), step
    assert thunder_rs.compile_stats(jloss).cache_misses == 2


def test_a_module_taking_a_float():
    torch.manual_seed(0)

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x, temperature):
            return torch.softmax(self.linear(x) / temperature, -1)

    module, x = Scaled(), torch.randn(2, 4)
    jmodule = thunder_rs.jit(module)
    for t in (1.0, 0.7, 0.5, 2.0):
        assert _equal(jmodule(x, t), module(x, t))
    assert thunder_rs.compile_stats(jmodule).cache_misses == 2


class Tempered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.temperature = 1.0

    def forward(self, x):
        return torch.softmax(self.linear(x) / self.temperature, -1)


def test_a_module_s_float_attribute_changed_between_calls():
    """A module's float that a call finds changed is a float input of the next compile, read from
    the module on every call, as a module's int is a size input (``dynamic.HeldInt``)."""
    torch.manual_seed(0)
    module, x = Tempered(), torch.randn(2, 4)
    jmodule = thunder_rs.jit(module)
    for t in (1.0, 0.7, 0.5, 2.0, 0.3):
        module.temperature = t
        expected, got = module(x), jmodule(x)
        assert _equal(expected, got), t
        expected.sum().backward()
        grad = module.linear.weight.grad.clone()
        module.zero_grad()
        got.sum().backward()
        assert _equal(grad, module.linear.weight.grad), t
        module.zero_grad()
    stats = thunder_rs.compile_stats(jmodule)
    assert stats.cache_misses == 2
    assert stats.miss_reasons[1].endswith("; compiled with symbolic floats Tempered.temperature")


def test_a_float_attribute_the_program_branches_on_is_guarded():
    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = 0.1

        def forward(self, x):
            return x * 2 if self.p > 0.5 else x - self.p

    module, x = Gate(), torch.randn(4)
    jmodule = thunder_rs.jit(module)
    for p in (0.1, 0.7, 0.9, 0.2, 0.3, 0.8):
        module.p = p
        assert _equal(jmodule(x), module(x)), p
    stats = thunder_rs.compile_stats(jmodule)
    assert stats.cache_misses == 3
    assert stats.miss_reasons[2].startswith("Gate.p > 0.5 was True when traced"), stats.miss_reasons


def test_a_float_an_argument_object_holds():
    class Config:
        scale = 1.0

    x = torch.randn(4)
    jfn = thunder_rs.jit(lambda x, cfg: x * cfg.scale + 1)
    for s in VALUES:
        cfg = Config()
        cfg.scale = s
        assert _equal(jfn(x, cfg), x * s + 1), s
    assert thunder_rs.compile_stats(jfn).cache_misses == 2


def test_the_nvfuser_stand_in_takes_a_float_input(fake_ex):
    """A float input is a Double input of the region's definition, read from the region's inputs
    on each call: one definition serves every value (the first call's has the float constant)."""

    def fn(x, s):
        return (x.cos() * s + s).sin()

    jfn = thunder_rs.jit(fn, executors=[fake_ex, "torch"])
    x = torch.randn(3, 5)
    for s in VALUES:
        assert _equal(jfn(x, s), fn(x, s)), s
    assert thunder_rs.compile_stats(jfn).cache_misses == 2
    assert fake_ex.stats["failures"] == 0, fake_ex.fallbacks
    assert fake_ex.stats["definitions"] == 2


def test_the_trace_names_a_float_input_as_the_user_does():
    jfn = thunder_rs.jit(lambda x, s: x * s)
    for s in (0.5, 0.25):
        jfn(torch.randn(4), s)
    trace = str(thunder_rs.last_traces(jfn)[-1])
    assert "def computation(l_x, l_s):" in trace and 'l_s: "float 0.25"' in trace, trace


def test_gradients_through_guarded_arithmetic():
    """The backward reads the floats the forward computed from the call's ``s`` (``math.sqrt(s) /
    max(s, 1e-3)``, ``1 / s``): bit-equal gradients, one entry per side of ``max``'s decision."""

    def fn(x, w, s):
        return ((x @ w) * math.sqrt(s) / max(s, 1e-3)).sum() * (1 / s)

    jfn, x = thunder_rs.jit(fn), torch.randn(3, 4)
    for v in (0.5, 0.3, 2.0, 1e-4, 0.7, 1e-5):
        w1, w2 = (torch.randn(4, 5, generator=torch.Generator().manual_seed(0)).requires_grad_() for _ in range(2))
        expected, got = fn(x, w1, v), jfn(x, w2, v)
        expected.backward()
        got.backward()
        assert _equal(expected, got) and _equal(w1.grad, w2.grad), v
    assert thunder_rs.compile_stats(jfn).cache_misses == 3


def test_the_nvfuser_stand_in_takes_arithmetic_on_a_float_input(fake_ex):
    def fn(x, s):
        return (x.cos() * math.sqrt(s) + 1 / s).sin() * math.exp(-s)

    jfn = thunder_rs.jit(fn, executors=[fake_ex, "torch"])
    x = torch.randn(3, 5)
    for s in (0.5, 0.25, 3.7, 1e-3):
        assert _equal(jfn(x, s), fn(x, s)), s
    assert thunder_rs.compile_stats(jfn).cache_misses == 2
    assert fake_ex.stats["failures"] == 0, fake_ex.fallbacks
    assert fake_ex.stats["definitions"] == 2
