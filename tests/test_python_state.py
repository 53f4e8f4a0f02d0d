"""Python state a traced program reads or writes gives eager's results, or a clear error.

Each test is a program that was silently different from eager before guards: it is run compiled
and eagerly side by side, with the state changed between calls.
"""

import dataclasses
import threading
import warnings

import pytest
import torch
from torch import nn

import thunder_rs
from thunder_rs.errors import ThunderError

DTYPES = [torch.float32, torch.float64]

SCALE = 2.0
SETTINGS = {"shift": 1.0}


def scaled(x):
    return x * SCALE


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_global_float_changed_between_calls(dtype):
    global SCALE
    jf, x = thunder_rs.jit(scaled), torch.randn(3, dtype=dtype)
    try:
        for value in (2.0, 3.0, 3.0, 2.0):
            SCALE = value
            torch.testing.assert_close(jf(x), scaled(x))
    finally:
        SCALE = 2.0
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_misses == 2 and stats.cache_hits == 2
    assert "global 'SCALE'" in stats.miss_reasons[1] and "2.0 to 3.0" in stats.miss_reasons[1]


def test_a_closure_cell_changed_between_calls():
    factor = 2

    def f(x):
        return x + factor

    jf, x = thunder_rs.jit(f), torch.zeros(2)
    torch.testing.assert_close(jf(x), f(x))
    factor = 5
    torch.testing.assert_close(jf(x), f(x))
    assert "closure variable 'factor'" in thunder_rs.compile_stats(jf).miss_reasons[-1]


def test_int_float_and_bool_values_are_told_apart():
    def f(x, s):
        return x * s if not isinstance(s, bool) else x + s

    jf, x = thunder_rs.jit(f), torch.ones(2, dtype=torch.float64)
    for s in (1, 1.0, True, 2, 2.0):
        out = jf(x, s)
        torch.testing.assert_close(out, f(x, s))
        assert out.dtype == f(x, s).dtype


def test_nan_and_negative_zero_arguments():
    jf, x = thunder_rs.jit(lambda x, s: torch.copysign(x, torch.tensor(s)) * (s == s)), torch.ones(2)
    for s in (float("nan"), float("nan"), 0.0, -0.0, -0.0):
        torch.testing.assert_close(jf(x, s), torch.copysign(x, torch.tensor(s)) * (s == s))
    # (nan a constant; from 0.0 on a float input, ``s == s`` guarded on its answer: -0.0 answers as
    # 0.0 does, and its sign reaches copysign through the input)
    assert thunder_rs.cache_misses(jf) == 2


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.temperature = 1.0

    def forward(self, x):
        return self.linear(x) / self.temperature


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_module_attribute_changed_between_calls(dtype):
    model = Scaled().to(dtype)
    jm, x = thunder_rs.jit(model), torch.randn(2, 4, dtype=dtype)
    for t in (1.0, 0.5, 0.5, 2.0):
        model.temperature = t
        torch.testing.assert_close(jm(x), model(x))
    # (the float seen changing is a float input of the second compile, which serves 2.0 too)
    assert thunder_rs.cache_misses(jm) == 2
    assert "temperature" in thunder_rs.compile_stats(jm).miss_reasons[-1]


def test_dropout_probability_and_a_submodule_mode_are_guarded():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    jm, x = thunder_rs.jit(model), torch.randn(16, 8)
    model.eval()
    torch.testing.assert_close(jm(x), model(x))
    model[1].train()  # only the dropout layer back in training mode
    model[1].p = 1.0  # drops everything: deterministic
    torch.testing.assert_close(jm(x), model(x))
    model[1].p = 0.0
    torch.testing.assert_close(jm(x), model(x))


@dataclasses.dataclass
class Config:
    scale: float = 1.0
    bias: float = 0.0


def test_a_fresh_dataclass_config_each_call():
    # A fresh object each call: the key holds its type, its fields read are guarded.
    def f(x, cfg):
        return x * cfg.scale + cfg.bias

    jf, x = thunder_rs.jit(f), torch.ones(3)
    for scale in (1.0, 2.0, 3.0, 3.0):
        cfg = Config(scale=scale)
        torch.testing.assert_close(jf(x, cfg), f(x, cfg))
    assert thunder_rs.cache_misses(jf) == 2  # (cfg.scale seen changing: a float input from then on)


class WithClassScale:
    scale = 2.0  # a class-level default an instance may shadow


class MoreScaled(WithClassScale):
    pass


def test_class_attributes_read_through_an_instance_are_guarded():
    """``obj.scale`` found on the class: shadowing it on the instance, rebinding it on the class
    or on a subclass changes what eager reads, so each recompiles."""

    def f(x, obj):
        return x * obj.scale

    jf, x = thunder_rs.jit(f), torch.ones(3)
    obj = MoreScaled()
    for change in (
        lambda: None,
        lambda: setattr(obj, "scale", 4.0),
        lambda: delattr(obj, "scale"),
        lambda: setattr(WithClassScale, "scale", 8.0),
        lambda: setattr(MoreScaled, "scale", 16.0),
    ):
        change()
        torch.testing.assert_close(jf(x, obj), f(x, obj))
    del MoreScaled.scale
    WithClassScale.scale = 2.0
    torch.testing.assert_close(jf(x, obj), f(x, obj))


def test_a_module_class_attribute_shadowed_or_rebound_is_seen():
    class Model(nn.Module):
        scale = 2.0

        def forward(self, x):
            return x * self.scale

    model = Model()
    jm, x = thunder_rs.jit(model), torch.randn(2, 3)
    torch.testing.assert_close(jm(x), model(x))
    model.scale = 3.0  # an instance attribute now shadows the class's
    torch.testing.assert_close(jm(x), model(x))
    del model.scale
    Model.scale = 5.0
    torch.testing.assert_close(jm(x), model(x))


def test_a_mutated_config_object_inside_a_module():
    class Model(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.proj = nn.Linear(3, 3)

        def forward(self, x):
            cfg = self.config
            return self.proj(x) * cfg.scale + self.config.bias

    config = Config()
    model = Model(config)
    jm, x = thunder_rs.jit(model), torch.randn(2, 3)
    torch.testing.assert_close(jm(x), model(x))
    config.scale = 4.0  # no module attribute write: a per-call guard sees it
    torch.testing.assert_close(jm(x), model(x))
    config.bias = -1.0
    torch.testing.assert_close(jm(x), model(x))


def test_a_value_derived_from_a_captured_tensor_is_recomputed():
    w = torch.ones(3)

    def f(x):
        return x * w.sum()

    jf, x = thunder_rs.jit(f), torch.ones(2)
    torch.testing.assert_close(jf(x), f(x))
    w.mul_(2)
    torch.testing.assert_close(jf(x), f(x))
    assert thunder_rs.cache_misses(jf) == 1


def test_rebinding_a_global_tensor_is_seen():
    global WEIGHT
    WEIGHT = torch.ones(2)
    jf, x = thunder_rs.jit(lambda x: x * WEIGHT), torch.ones(2)
    torch.testing.assert_close(jf(x), x * WEIGHT)
    WEIGHT = torch.full((2,), 3.0)
    torch.testing.assert_close(jf(x), x * WEIGHT)


def test_forward_hooks_added_after_compiling_run():
    model = nn.Linear(2, 2)
    jm, x = thunder_rs.jit(model), torch.ones(1, 2)
    torch.testing.assert_close(jm(x), model(x))
    handle = model.register_forward_hook(lambda mod, inp, out: out * 2)
    torch.testing.assert_close(jm(x), model(x))
    handle.remove()
    torch.testing.assert_close(jm(x), model(x))
    pre = model.register_forward_pre_hook(lambda mod, inp: (inp[0] + 1,))
    torch.testing.assert_close(jm(x), model(x))
    pre.remove()


def test_hooks_on_the_jitted_module_run_eagerly_around_the_call():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    jm = thunder_rs.jit(model)
    seen = []
    jm.register_forward_pre_hook(lambda mod, inp: seen.append(("pre", mod is jm)))
    jm.register_forward_hook(lambda mod, inp, out: seen.append(("post", type(out).__name__)))
    x = torch.randn(2, 3)
    torch.testing.assert_close(jm(x), model(x))
    jm(x)
    assert seen == [("pre", True), ("post", "Tensor")] * 2


def test_an_activation_capturing_hook_on_an_inner_module_captures_as_in_eager():
    # Its list, in the hook's closure, is state the program changes: each call appends its own
    # activation (and compiles again, finding the list changed), as for a global list.
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    feats = []
    model[0].register_forward_hook(lambda mod, inp, out: feats.append(out))
    jm = thunder_rs.jit(model)
    for _ in range(2):
        x = torch.randn(2, 3)
        torch.testing.assert_close(jm(x), model(x))
        torch.testing.assert_close(feats[-2], feats[-1])
    assert len(feats) == 4 and all(type(f) is torch.Tensor for f in feats)


def test_activation_capture_through_a_hook_on_the_jitted_module_works():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    jm, feats = thunder_rs.jit(model), []
    jm.register_forward_hook(lambda mod, inp, out: feats.append(out))
    for _ in range(2):
        x = torch.randn(2, 3)
        torch.testing.assert_close(jm(x), model(x))
        torch.testing.assert_close(feats[-1], model(x))
    assert all(type(f) is torch.Tensor for f in feats)


class Cached(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = None
        self.calls = 0

    def forward(self, x):
        self.calls = self.calls + 1
        if self.cache is None:
            self.cache = x.sin()
        return x + self.cache


def test_a_tensor_stored_in_module_state_is_written_back():
    eager, model = Cached(), Cached()
    jm = thunder_rs.jit(model)
    for x in (torch.ones(2), torch.full((2,), 2.0), torch.full((2,), 3.0)):
        torch.testing.assert_close(jm(x), eager(x))
        assert type(model.cache) is torch.Tensor
        torch.testing.assert_close(model.cache, eager.cache)
        assert model.calls == eager.calls
    torch.testing.assert_close(model(torch.ones(2)), eager(torch.ones(2)))  # eager calls work too


def test_a_counter_in_module_state_counts_every_call():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.steps = 0

        def forward(self, x):
            self.steps += 1
            return x * 2

    model = Counter()
    jm = thunder_rs.jit(model)
    for _ in range(3):
        jm(torch.ones(1))
    assert model.steps == 3


def test_a_closure_list_mutated_while_traced_is_mutated_as_in_eager():
    calls = []

    def f(x):
        calls.append(1)
        return x * 2

    jf = thunder_rs.jit(f)
    for n in range(1, 3):
        torch.testing.assert_close(jf(torch.ones(2)), torch.ones(2) * 2)
        assert calls == [1] * n


_LAZY_LIBRARY = """
REGISTRY = {}


def register(fn):
    REGISTRY[fn.__name__] = fn  # reads and fills the registry while the library is imported
    return fn


@register
def double(x):
    return x * 2


def lookup(name):
    return REGISTRY[name]
"""


def test_a_library_imported_by_the_first_call_may_fill_its_registries(tmp_path, monkeypatch):
    """A library imported lazily inside the program (torch.utils.checkpoint imports numpy,
    sympy and Dynamo on its first use) changes its own globals while being imported: that is
    not the program's state, so the first call works and later calls reuse the trace."""
    name = f"lazy_library_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(_LAZY_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))

    def f(x):
        library = __import__(name)
        return library.lookup("double")(x) + 1

    jf = thunder_rs.jit(f)
    torch.testing.assert_close(jf(torch.ones(3)), torch.full((3,), 3.0))
    torch.testing.assert_close(jf(torch.ones(3)), torch.full((3,), 3.0))
    assert thunder_rs.compile_stats(jf).cache_misses == 1


def test_activation_checkpointing_inside_the_program_equals_eager():
    from torch.utils.checkpoint import checkpoint

    def f(x, w):
        return checkpoint(lambda y: (y @ w).tanh().sin(), x, use_reentrant=False).sum()

    x, w = torch.randn(4, 5, requires_grad=True), torch.randn(5, 5, requires_grad=True)
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    jf = thunder_rs.jit(f)
    for _ in range(2):
        out, expected = jf(x, w), f(xe, we)
        torch.testing.assert_close(out, expected)
        out.backward()
        expected.backward()
        torch.testing.assert_close((x.grad, w.grad), (xe.grad, we.grad))


def test_attributes_set_on_an_argument_object_are_set_by_every_call():
    def f(x, cfg):
        cfg.scale += 1
        cfg.last_shape = tuple(x.shape)
        return x * cfg.scale

    jf = thunder_rs.jit(f)
    compiled, eager = Config(), Config()
    for n in (2, 2, 3):
        x = torch.ones(n)
        torch.testing.assert_close(jf(x, compiled), f(x, eager))
        assert vars(compiled) == vars(eager)
    fresh_compiled, fresh_eager = Config(), Config()
    torch.testing.assert_close(jf(torch.ones(2), fresh_compiled), f(torch.ones(2), fresh_eager))
    assert vars(fresh_compiled) == vars(fresh_eager)


class Holder:
    pass


HOLDER = Holder()


def test_a_tensor_stored_on_a_global_object_is_stored_by_every_call():
    def f(x):
        HOLDER.last = x * 2
        return x

    jf = thunder_rs.jit(f)
    for value in (1.0, 2.0):
        jf(torch.full((2,), value))
        assert type(HOLDER.last) is torch.Tensor
        torch.testing.assert_close(HOLDER.last, torch.full((2,), 2 * value))


def test_a_config_field_set_lazily_on_the_first_call():
    # Hugging Face's sequence classifiers set config.problem_type on their first call with labels.
    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = Config()
            self.config.problem_type = None
            self.linear = nn.Linear(3, 2)

        def forward(self, x):
            if self.config.problem_type is None:
                self.config.problem_type = "classification"
            return self.linear(x) * (2.0 if self.config.problem_type == "classification" else 1.0)

    torch.manual_seed(0)
    model = Classifier()
    eager = Classifier()
    eager.load_state_dict(model.state_dict())
    jm, x = thunder_rs.jit(model), torch.randn(2, 3)
    for _ in range(3):
        torch.testing.assert_close(jm(x), eager(x))
        assert model.config.problem_type == eager.config.problem_type == "classification"
    assert thunder_rs.cache_misses(jm) == 2


@dataclasses.dataclass
class Output:
    loss: torch.Tensor
    logits: torch.Tensor
    note: str = "ok"


def test_dataclass_outputs_are_rebuilt_every_call():
    def f(x):
        return Output(loss=x.sum(), logits=x * 2)

    jf = thunder_rs.jit(f)
    first, second = jf(torch.ones(2)), jf(torch.full((2,), 3.0))
    assert first is not second and isinstance(second, Output) and second.note == "ok"
    torch.testing.assert_close(second.loss, torch.tensor(6.0))
    torch.testing.assert_close(first.logits, torch.full((2,), 2.0))


def test_generator_functions_are_refused_with_a_clear_error():
    def gen(x):
        yield x * 2

    with pytest.raises(TypeError, match="generator"):
        thunder_rs.jit(gen)

    def returns_generator(x):
        return (x * i for i in range(2))

    with pytest.raises(ThunderError, match="generator"):
        thunder_rs.jit(returns_generator)(torch.ones(1))


def test_the_cache_is_bounded_and_evicts_the_least_recently_used():
    jf = thunder_rs.jit(lambda x, s: x * s, cache=4, dynamic=False)
    x = torch.ones(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in range(10):  # (not dynamic: a float or int seen changing is not an input)
            torch.testing.assert_close(jf(x, float(s)), x * s)
        jf(x, 9.0)  # still cached: a hit
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_misses == 10 and stats.evictions == 6 and stats.cache_hits == 1
    assert len(jf._variants) == 4


def test_cache_size_must_be_positive():
    with pytest.raises(ValueError, match="cache"):
        thunder_rs.jit(lambda x: x, cache=0)


def test_the_recompile_warning_names_the_input_and_the_call_site():
    def f(x, scale):
        return x * scale

    jf = thunder_rs.jit(f, dynamic=False)  # (each float a compile of its own)
    with pytest.warns(UserWarning, match=r"recompiled 8 times; last change: scale: 6.0 -> 7.0") as record:
        for s in range(8):
            jf(torch.ones(1), float(s))
    assert record[0].filename == __file__


def _first_calls_from_threads(jm, x, n: int = 8):
    results, errors = [None] * n, []
    barrier = threading.Barrier(n)

    def run(i):
        try:
            barrier.wait()
            results[i] = jm(x)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


@pytest.mark.parametrize("model_kind", ["mlp", "gpt_block"])
def test_threads_compiling_one_module_concurrently_leave_it_untouched(model_kind):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from gpt import Block, GPTConfig

    torch.manual_seed(0)
    if model_kind == "mlp":
        model, x = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)), torch.randn(3, 8)
    else:  # grad rules run while tracing: their state is per thread
        model, x = Block(GPTConfig(block_size=8, n_embd=16, n_head=2)), torch.randn(2, 8, 16)
    params = dict(model.named_parameters())
    expected = model(x)
    for _ in range(3):
        for r in _first_calls_from_threads(thunder_rs.jit(model), x):
            torch.testing.assert_close(r, expected)
        assert dict(model.named_parameters()) == params
        assert all(type(p) is nn.Parameter for p in model.parameters())


def test_a_module_reading_state_it_wrote_earlier_in_the_call():
    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.child = Child()

        def forward(self, x):
            self.child.flag = True
            return self.child(x)

    class Child(nn.Module):
        def __init__(self):
            super().__init__()
            self.flag = False

        def forward(self, x):
            return x * 2 if self.flag else x

    eager, model = Parent(), Parent()
    jm = thunder_rs.jit(model)
    torch.testing.assert_close(jm(torch.ones(2)), eager(torch.ones(2)))
    assert model.child.flag is True


def test_a_running_profiler_keeps_its_hook_and_globals_are_still_guarded(monkeypatch):
    import cProfile

    from thunder_rs.core.state import hook

    # The warning is once per process: another test of this worker may have had it already.
    monkeypatch.setattr(hook, "_warned", [])
    global SCALE
    profiler = cProfile.Profile()
    jf, x = thunder_rs.jit(scaled), torch.ones(2)
    profiler.enable()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            jf(x)
            SCALE = 5.0
            out = jf(x)
            _called_after_compiling()
    finally:
        profiler.disable()
        SCALE = 2.0
    torch.testing.assert_close(out, x * 5.0)
    assert any("profiler" in str(w.message) for w in caught)
    profiled = {getattr(entry.code, "co_name", entry.code) for entry in profiler.getstats()}
    assert "_called_after_compiling" in profiled


def _called_after_compiling():
    return None


def test_a_jitted_function_called_inside_a_traced_program_is_part_of_its_trace():
    inner = thunder_rs.jit(lambda x: x.sin() * 2)

    def outer(x):
        return inner(x) + 1

    jf, x = thunder_rs.jit(outer), torch.randn(3)
    torch.testing.assert_close(jf(x), x.sin() * 2 + 1)
    assert thunder_rs.cache_misses(inner) == 0
    assert "sin" in str(thunder_rs.last_traces(jf)[-1])


def test_print_runs_on_every_call_with_that_calls_values(capsys):
    def f(x):
        y = x * 2
        print("y is", y, "sum", {"s": y.sum()})
        return y + 1

    jf = thunder_rs.jit(f)
    for value in (1.0, 2.0):
        x = torch.full((2,), value)
        f(x)
        eager = capsys.readouterr().out
        jf(x)
        assert capsys.readouterr().out == eager


def test_print_of_an_f_string_holding_a_traced_tensor_is_refused():
    def f(x):
        print(f"x is {x * 2}")
        return x

    with pytest.raises(ThunderError, match="print: the text printed at .*test_python_state.py"):
        thunder_rs.jit(f)(torch.ones(2))


def test_a_function_calling_a_global_module_sees_it_replaced_parts():
    global MODEL
    MODEL = nn.Sequential(nn.Linear(3, 3), nn.ReLU())

    def f(x):
        return MODEL(x) * 2

    jf, x = thunder_rs.jit(f), torch.randn(2, 3)
    torch.testing.assert_close(jf(x), f(x))
    MODEL[0].weight = nn.Parameter(torch.ones(3, 3))  # a new parameter object
    torch.testing.assert_close(jf(x), f(x))
    MODEL[1] = nn.Tanh()  # a new submodule
    torch.testing.assert_close(jf(x), f(x))
    assert thunder_rs.cache_misses(jf) == 3


def test_reseeding_an_outside_generator_inside_the_program_is_refused():
    gen = torch.Generator().manual_seed(0)

    def f(x):
        gen.manual_seed(1)
        return x + torch.rand(2, generator=gen)

    with pytest.raises(ThunderError, match="torch.Generator.manual_seed: the traced program at .*test_python_state.py"):
        thunder_rs.jit(f)(torch.zeros(2))

    class Sampler(nn.Module):
        def __init__(self):
            super().__init__()
            self.gen = torch.Generator().manual_seed(0)

        def forward(self, x):
            self.gen.set_state(torch.Generator().manual_seed(3).get_state())
            return x + torch.rand(2, generator=self.gen)

    with pytest.raises(ThunderError, match="set_state"):
        thunder_rs.jit(Sampler())(torch.zeros(2))


def test_a_forward_patched_and_restored_during_the_call_is_restored_on_the_users_module():
    # transformers 4.55's check_model_inputs wraps submodules' forward to capture outputs, then
    # assigns the original bound method back (an instance attribute left behind, as in eager).
    class Capturing(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(3, 3)

        def forward(self, x):
            original = self.inner.forward
            self.inner.forward = lambda y: original(y) * 2
            try:
                return self.inner(x)
            finally:
                self.inner.forward = original

    torch.manual_seed(0)
    model, eager = Capturing(), Capturing()
    eager.load_state_dict(model.state_dict())
    jm, x = thunder_rs.jit(model), torch.randn(2, 3)
    for _ in range(2):
        torch.testing.assert_close(jm(x), eager(x))
    assert model.inner.forward.__self__ is model.inner
    torch.testing.assert_close(model(x), eager(x))


def test_a_module_list_attribute_changed_in_place_between_calls():
    # list.append does not go through nn.Module.__setattr__: the list is compared on every call.
    class Skipping(nn.Module):
        def __init__(self):
            super().__init__()
            self.skip = [0]
            self.extra = [nn.Linear(2, 2)]  # a plain list of modules, not a ModuleList
            self.first = nn.Linear(2, 2)

        def forward(self, x):
            x = x if 0 in self.skip else self.first(x)
            for layer in self.extra:
                x = layer(x)
            return x

    torch.manual_seed(0)
    model, x = Skipping(), torch.randn(1, 2)
    jm = thunder_rs.jit(model)
    torch.testing.assert_close(jm(x), model(x))
    model.skip.remove(0)
    torch.testing.assert_close(jm(x), model(x))
    model.extra.append(nn.Linear(2, 2))
    torch.testing.assert_close(jm(x), model(x))
    assert thunder_rs.cache_misses(jm) == 3


ACT = torch.relu


def _helper(x):
    return x * 2


def _activated(x):
    return _helper(ACT(x))


def test_a_global_function_rebound_between_calls():
    global ACT, _helper
    jf, x = thunder_rs.jit(_activated), torch.randn(4)
    saved = (ACT, _helper)
    try:
        torch.testing.assert_close(jf(x), _activated(x))
        ACT = torch.tanh
        torch.testing.assert_close(jf(x), _activated(x))
        _helper = lambda y: y * 3  # noqa: E731 (redefining a helper)
        torch.testing.assert_close(jf(x), _activated(x))
    finally:
        ACT, _helper = saved
    assert thunder_rs.cache_misses(jf) == 3


@pytest.mark.parametrize("method", ["register_post_accumulate_grad_hook", "retain_grad"])
def test_tensor_hooks_inside_the_program_are_refused_naming_the_line(method):
    """Eager would call the hook (or keep .grad) on the autograd node of a tensor the program
    computes; a traced tensor has none, so the call is refused rather than ignored.
    (``register_hook`` runs in the compiled backward: ``test_tensor_hooks.py``.)"""

    def f(x):
        y = x * 2
        getattr(y, method)(*(() if method == "retain_grad" else (lambda g: None,)))
        return y.sin()

    with pytest.raises(ThunderError, match=rf"{method} at .*test_python_state.py:\d+: hooks and retained gradients"):
        thunder_rs.jit(f)(torch.randn(3, requires_grad=True))


def test_module_backward_hooks_are_refused_inside_and_run_on_the_jitted_module():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    inner[0].register_full_backward_hook(lambda module, grad_in, grad_out: None)
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(ThunderError, match="register_full_backward_hook: a module called at"):
        thunder_rs.jit(inner)(x)
    seen = []
    jitted = thunder_rs.jit(model)
    jitted.register_full_backward_hook(
        lambda module, grad_in, grad_out: (seen.append(grad_out[0]), (grad_in[0] * 3,))[1]
    )
    jitted(x).sum().backward()
    xe = x.detach().clone().requires_grad_()
    eager = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    eager.load_state_dict(model.state_dict())
    eager.register_full_backward_hook(lambda module, grad_in, grad_out: (grad_in[0] * 3,))
    eager(xe).sum().backward()
    assert len(seen) == 1
    torch.testing.assert_close(x.grad, xe.grad)
