"""Objects a jitted callable carries besides its arguments are program state like a module's
attributes: the instance of a bound method or of a callable object, a ``functools.partial``'s
arguments and objects among the default arguments; and objects whose class has ``__slots__``.
Changing them between calls recompiles."""

import dataclasses
import functools

import pytest
import torch

import thunder_rs


class Scaler:
    def __init__(self):
        self.scale, self.shift = 2.0, torch.zeros(3)

    def apply(self, x):
        return x * self.scale + self.shift

    def __call__(self, x):
        return x * self.scale + self.shift


def _scaled(x, cfg):
    return x * cfg.scale + cfg.shift


DEFAULT = Scaler()


def _with_default(x, cfg=DEFAULT):
    return x * cfg.scale + cfg.shift


@pytest.mark.parametrize(
    "make",
    [lambda s: s.apply, lambda s: s, lambda s: functools.partial(_scaled, cfg=s)],
    ids=["bound_method", "callable_object", "partial"],
)
def test_changes_to_bound_objects_recompile(make):
    scaler = Scaler()
    fn = make(scaler)
    jfn = thunder_rs.jit(fn)
    x = torch.ones(3)
    torch.testing.assert_close(jfn(x), fn(x))
    scaler.scale = 5.0
    torch.testing.assert_close(jfn(x), fn(x))
    scaler.shift = torch.ones(3)
    torch.testing.assert_close(jfn(x), fn(x))


def test_changes_to_an_object_among_the_defaults_recompile():
    jfn = thunder_rs.jit(_with_default)
    x = torch.ones(3)
    saved = DEFAULT.scale
    try:
        torch.testing.assert_close(jfn(x), _with_default(x))
        DEFAULT.scale = 7.0
        torch.testing.assert_close(jfn(x), _with_default(x))
    finally:
        DEFAULT.scale = saved


@dataclasses.dataclass(slots=True)
class SlotsConfig:
    scale: float
    use_bias: bool
    calls: int = 0


SLOTS_GLOBAL = SlotsConfig(2.0, False)


def _reads_a_slots_global(x):
    return x * SLOTS_GLOBAL.scale


class _HoldsSlots(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = SlotsConfig(2.0, False)

    def forward(self, x):
        self.cfg.calls += 1
        return x * self.cfg.scale + (1 if self.cfg.use_bias else 0)


def test_objects_with_slots_are_guarded_as_arguments_globals_and_module_attributes():
    # @dataclass(slots=True) configs have no instance dict: their slots are their attributes.
    def program(x, cfg):
        return x * cfg.scale + (1 if cfg.use_bias else 0)

    x, cfg = torch.ones(2), SlotsConfig(2.0, False)
    jprogram = thunder_rs.jit(program)
    torch.testing.assert_close(jprogram(x, cfg), program(x, cfg))
    cfg.scale, cfg.use_bias = 3.0, True
    torch.testing.assert_close(jprogram(x, cfg), program(x, cfg))

    jglobal = thunder_rs.jit(_reads_a_slots_global)
    try:
        torch.testing.assert_close(jglobal(x), _reads_a_slots_global(x))
        SLOTS_GLOBAL.scale = 6.0
        torch.testing.assert_close(jglobal(x), _reads_a_slots_global(x))
    finally:
        SLOTS_GLOBAL.scale = 2.0

    model = _HoldsSlots()
    jmodel = thunder_rs.jit(model)
    jmodel(x)
    model.cfg.scale = 7.0
    torch.testing.assert_close(jmodel(x), x * 7.0)
    assert model.cfg.calls == 2  # the program's write to a slot is repeated by every call


def test_a_slots_object_inside_an_argument_is_guarded_as_either_kind_of_object():
    # The per-call check reads instance dicts directly and slots through their view: an object on
    # the path changing from one kind to the other recompiles rather than misreading.
    import types

    def program(x, cfg):
        return x * cfg.sub.scale

    jprogram, x = thunder_rs.jit(program), torch.ones(2)
    cfg = types.SimpleNamespace(sub=SlotsConfig(2.0, False))
    for change in (
        lambda: setattr(cfg.sub, "scale", 5.0),
        lambda: setattr(cfg, "sub", types.SimpleNamespace(scale=7.0)),
        lambda: setattr(cfg, "sub", SlotsConfig(9.0, False)),
    ):
        torch.testing.assert_close(jprogram(x, cfg), program(x, cfg))
        change()
    torch.testing.assert_close(jprogram(x, cfg), program(x, cfg))


class _Activated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def act(self, y):
        return y.relu()

    @classmethod
    def factor(cls):
        return cls.scale

    scale = 2.0

    def forward(self, x):
        return self.act(self.linear(x)) * self.factor()


@pytest.mark.parametrize(
    "change",
    [
        lambda m: setattr(m, "act", lambda y: y.tanh()),
        lambda m: setattr(_Activated, "act", lambda self, y: y.sigmoid()),
        lambda m: setattr(_Activated, "scale", 3.0),
    ],
    ids=["method set on the instance", "method rebound on the class", "class attribute read by a classmethod"],
)
def test_methods_patched_between_calls_recompile(change):
    # The observer did not follow self.act to the class's function, nor cls.scale in a classmethod:
    # the patched module kept running the traced method.
    saved = dict(vars(_Activated))
    model = _Activated()
    jm, x = thunder_rs.jit(model), torch.randn(2, 3)
    try:
        torch.testing.assert_close(jm(x), model(x))
        change(model)
        torch.testing.assert_close(jm(x), model(x))
    finally:
        _Activated.act, _Activated.scale = saved["act"], saved["scale"]
    assert thunder_rs.compile_stats(jm).cache_misses == 2


class _LeakyAct(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.1)

    def forward(self, x):
        return self.act(x)


LEAKY = functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.1)


def _global_leaky(x):
    return LEAKY(x)


@pytest.mark.parametrize(
    "make",
    [
        lambda: (lambda m: (m, m.act))(_LeakyAct()),
        lambda: (_global_leaky, LEAKY),
        lambda: (lambda p: (p, p))(functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.1)),
    ],
    ids=["module attribute", "global", "jitted partial"],
)
def test_keywords_of_a_partial_changed_in_place_recompile(make):
    # p.keywords is a dict changed in place: the compiled call kept slope 0.1 while eager used 2.0.
    program, partial = make()
    saved = dict(partial.keywords)
    jprogram, x = thunder_rs.jit(program), torch.randn(8)
    try:
        assert torch.equal(jprogram(x), program(x))
        partial.keywords["negative_slope"] = 2.0
        assert torch.equal(jprogram(x), program(x))
        partial.keywords["inplace"] = False  # a keyword added
        assert torch.equal(jprogram(x), program(x))
        assert torch.equal(jprogram(x), program(x))
    finally:
        partial.keywords.clear()
        partial.keywords.update(saved)
    stats = thunder_rs.compile_stats(jprogram)
    assert stats.cache_misses == 3
    assert "keywords['negative_slope'] changed from 0.1 to 2.0" in stats.miss_reasons[1]
