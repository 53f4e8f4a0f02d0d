"""Attributes a program reads by name, ``getattr(obj, "name"[, default])`` and ``hasattr(obj,
"name")``, are guarded like ``obj.name``: setting, changing or deleting them between calls
recompiles, so every call computes what eager computes."""

import dataclasses
import operator
import types

import pytest
import torch
import torch.nn as nn

import thunder_rs


class ByName(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0
        self.config = types.SimpleNamespace(shift=1.0)

    def forward(self, x):
        y = x * getattr(self, "scale")
        if getattr(self, "use_bias", False):
            y = y + 100
        if hasattr(self.config, "extra"):
            y = y - self.config.extra
        return y + getattr(self.config, "shift", 0.0)


CHANGES = [
    lambda m: setattr(m, "scale", 3.0),
    lambda m: setattr(m, "use_bias", True),
    lambda m: setattr(m, "use_bias", False),
    lambda m: setattr(m.config, "extra", 5.0),
    lambda m: setattr(m.config, "shift", -2.0),
    lambda m: delattr(m.config, "shift"),
    lambda m: delattr(m.config, "extra"),
    lambda m: setattr(m, "config", types.SimpleNamespace(extra=1.0)),
]


def check_changes_recompile(model, changes, x):
    """Each change to ``model`` between calls gives eager's result, through one recompile each."""
    jmodel = thunder_rs.jit(model)
    torch.testing.assert_close(jmodel(x), model(x))
    for change in changes:
        change(model)
        torch.testing.assert_close(jmodel(x), model(x))
    assert thunder_rs.cache_misses(jmodel) == len(changes) + 1


def test_attributes_read_by_name_are_guarded_on_modules_and_config_objects():
    check_changes_recompile(ByName(), CHANGES, torch.ones(2))


def test_a_lazily_created_counter_counts_every_call():
    class Lazy(nn.Module):
        def forward(self, x):
            self.factor = getattr(self, "factor", 1.0) * 2
            if not hasattr(self, "steps"):
                self.steps = 0
            self.steps += 1
            return x * self.factor

    model, eager = Lazy(), Lazy()
    jmodel = thunder_rs.jit(model)
    for _ in range(3):
        torch.testing.assert_close(jmodel(torch.ones(1)), eager(torch.ones(1)))
    assert (model.factor, model.steps) == (eager.factor, eager.steps) == (8.0, 3)


def test_getattr_of_a_function_argument_and_of_a_hugging_face_config():
    transformers = pytest.importorskip("transformers")

    def program(x, config):
        return x * getattr(config, "scale", 1.0) + getattr(config, "hidden_size")

    config = transformers.PretrainedConfig(hidden_size=4)
    jprogram = thunder_rs.jit(program)
    x = torch.ones(2)
    torch.testing.assert_close(jprogram(x, config), program(x, config))
    config.scale = 3.0
    torch.testing.assert_close(jprogram(x, config), program(x, config))
    config.hidden_size = 8
    torch.testing.assert_close(jprogram(x, config), program(x, config))


class Settings:
    SCALE = 2.0


class _ReadsAClassAttribute(nn.Module):
    def forward(self, x):
        return x * Settings.SCALE


class _CountsOnItsClass(nn.Module):
    calls = 0

    def forward(self, x):
        _CountsOnItsClass.calls += 1
        return x * _CountsOnItsClass.calls


def test_a_class_attribute_read_through_the_class_is_guarded():
    jmodel, x = thunder_rs.jit(_ReadsAClassAttribute()), torch.ones(2)
    try:
        torch.testing.assert_close(jmodel(x), x * 2.0)
        Settings.SCALE = 5.0
        torch.testing.assert_close(jmodel(x), x * 5.0)
    finally:
        Settings.SCALE = 2.0


def test_a_program_writing_a_class_attribute_is_refused():
    with pytest.raises(
        thunder_rs.errors.ThunderNotImplementedError, match="class attribute 'calls' of _CountsOnItsClass"
    ):
        thunder_rs.jit(_CountsOnItsClass())(torch.ones(2))


@dataclasses.dataclass
class _Config:
    scale: float = 1.0
    shift: int = 0


_CONFIG = _Config()


@pytest.mark.parametrize(
    "read",
    [
        lambda: vars(_CONFIG)["scale"],
        lambda: _CONFIG.__dict__["scale"],
        lambda: dataclasses.astuple(_CONFIG)[0],
        lambda: dataclasses.replace(_CONFIG, shift=1).scale,
        lambda: sum(getattr(_CONFIG, f.name) for f in dataclasses.fields(_CONFIG)),
        lambda: operator.attrgetter("scale")(_CONFIG),
    ],
    ids=["vars", "__dict__", "astuple", "replace", "fields", "attrgetter"],
)
def test_attributes_read_through_library_code_are_guarded(read):
    # The observer does not follow vars() or dataclasses' code: the config was kept by identity
    # only, and a changed field kept the first call's value.
    def f(x):
        return x * read()

    jf, x = thunder_rs.jit(f), torch.randn(3)
    try:
        for scale in (1.0, 2.0, 2.0):
            _CONFIG.scale = scale
            torch.testing.assert_close(jf(x), f(x))
    finally:
        _CONFIG.scale = 1.0
    assert thunder_rs.compile_stats(jf).cache_misses == 2


def test_an_argument_object_read_through_library_code_is_guarded():
    def f(x, cfg):
        return x * dataclasses.astuple(cfg)[0] + vars(cfg)["shift"]

    jf, x, cfg = thunder_rs.jit(f), torch.randn(3), _Config()
    for scale, shift in ((1.0, 0), (2.0, 0), (2.0, 1)):
        cfg.scale, cfg.shift = scale, shift
        torch.testing.assert_close(jf(x, cfg), f(x, cfg))
    assert thunder_rs.compile_stats(jf).cache_misses == 3


class _StaticBase:
    act = staticmethod(torch.relu)


class _StaticConfig(_StaticBase):
    pass


_STATIC_CFG = _StaticConfig()


def _calls_a_static_library_function(x):
    return _STATIC_CFG.act(x)


def test_a_static_library_function_rebound_on_a_global_objects_class_recompiles():
    """``act = staticmethod(torch.relu)`` on a global object's class: rebinding it on the class or
    a base between calls gives eager's function (it kept the traced one: torch's function runs no
    Python frame the observer sees)."""
    x = torch.randn(5)
    jf = thunder_rs.jit(_calls_a_static_library_function)
    try:
        torch.testing.assert_close(jf(x), torch.relu(x))
        _StaticConfig.act = staticmethod(torch.tanh)
        torch.testing.assert_close(jf(x), _calls_a_static_library_function(x))
        del _StaticConfig.act
        _StaticBase.act = staticmethod(torch.sigmoid)
        torch.testing.assert_close(jf(x), _calls_a_static_library_function(x))
        assert thunder_rs.cache_misses(jf) == 3
    finally:
        _StaticBase.act = staticmethod(torch.relu)
        if "act" in _StaticConfig.__dict__:
            del _StaticConfig.act
