"""The observer's shortcuts for reads it made before in the same trace give eager's results.

A transformers config answers every attribute read in Python (``__getattribute__``), so the
observer reads its ``__class__`` once per trace for its ``isinstance`` checks
(``attribute_reads.is_a``), and a method read again through the same object (``logger.warning_once``
in that ``__getattribute__``) is done once while its class gives the same function
(``AttributeReads._class_attribute``). Each test changes what such a read finds, between calls or
inside the program between two reads, and compares with eager.
"""

import collections
import copy

import torch
from torch import nn

import thunder_rs
from thunder_rs.core.state import hook


#: The reads of ``__class__`` made while thunder_rs observes the program, counted through a bound
#: method of a ``Counter``: a count the program's code read (``type(self).class_reads += 1``) would
#: be guarded as the class attribute it is, and every count changed between calls would compile again.
_CLASS_READS: collections.Counter = collections.Counter()
_count_class_read = _CLASS_READS.update


class Config:
    """A config whose attribute reads run Python code, as transformers' ``PreTrainedConfig`` does;
    it counts the reads of ``__class__`` made while thunder_rs observes the program."""

    def __init__(self, scale=2.0, shift=0.5):
        self.scale, self.shift = scale, shift

    def __getattribute__(self, key):
        if key == "__class__" and hook.thread_state.inside:
            _count_class_read(("class",))
        return super().__getattribute__(key)

    def bias(self):
        return self.shift


def _helper(cfg, x):
    return x * cfg.scale + cfg.bias()


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = _helper(self.cfg, self.linear(x))
        y = _helper(self.cfg, y) + self.cfg.bias()
        return y * self.cfg.scale


def _pair():
    torch.manual_seed(0)
    eager = Model(Config())
    return eager, copy.deepcopy(eager)


class Repeating(Model):
    """Reads its config through ``_helper`` ``n`` times."""

    def __init__(self, cfg, n: int):
        super().__init__(cfg)
        self.n = n

    def forward(self, x):
        y = self.linear(x)
        for _ in range(self.n):
            y = _helper(self.cfg, y)
        return y


def _class_reads(n: int) -> int:
    torch.manual_seed(0)
    eager = Repeating(Config(scale=1.5), n)
    jm, x = thunder_rs.jit(copy.deepcopy(eager)), torch.randn(2, 4)
    _CLASS_READS.clear()
    torch.testing.assert_close(jm(x), eager(x))
    return _CLASS_READS["class"]


def test_a_config_class_is_read_once_per_trace():
    # (each isinstance of the observer's that failed on its type read it again: 16 more reads of
    # the config read 60 more times)
    assert _class_reads(16) == _class_reads(1)


def test_a_config_attribute_written_between_calls():
    eager, model = _pair()
    jm, x = thunder_rs.jit(model), torch.randn(2, 4)
    for scale, shift in ((2.0, 0.5), (3.0, 0.5), (3.0, -1.0), (3.0, -1.0)):
        for m in (eager, model):
            m.cfg.scale, m.cfg.shift = scale, shift
        torch.testing.assert_close(jm(x), eager(x))
    assert thunder_rs.cache_misses(jm) == 3


class Rescaling(Model):
    """Sets ``cfg.scale`` between two reads of it, and calls ``cfg.bias`` before and after."""

    def forward(self, x):
        y = _helper(self.cfg, self.linear(x))
        self.cfg.scale = self.cfg.scale + 1.0
        return _helper(self.cfg, y) + self.cfg.bias()


def test_a_config_attribute_written_inside_the_program_between_two_reads():
    torch.manual_seed(0)
    eager = Rescaling(Config())
    model = copy.deepcopy(eager)
    jm, x = thunder_rs.jit(model), torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(jm(x), eager(x))
        assert model.cfg.scale == eager.cfg.scale


def _other_bias(self, k=-2.0):
    return k * self.shift


_original_bias = Config.original_bias = Config.bias
Config.other_bias = _other_bias


def test_a_method_rebound_on_the_class_between_calls():
    eager, model = _pair()
    jm, x = thunder_rs.jit(model), torch.randn(2, 4)
    torch.testing.assert_close(jm(x), eager(x))
    try:
        Config.bias = _other_bias
        torch.testing.assert_close(jm(x), eager(x))
    finally:
        Config.bias = _original_bias
    torch.testing.assert_close(jm(x), eager(x))
    assert thunder_rs.cache_misses(jm) == 2  # (the first entry serves the first class again)


class SetsBias(Model):
    """Sets ``bias`` on its config object between two calls of it: the second finds the instance's."""

    def forward(self, x):
        y = _helper(self.cfg, self.linear(x))
        self.cfg.bias = lambda: 3.0
        try:
            return _helper(self.cfg, y) + self.cfg.bias()
        finally:
            del self.cfg.bias


def test_a_method_set_on_the_object_inside_the_program_between_two_reads():
    torch.manual_seed(0)
    eager = SetsBias(Config())
    model = copy.deepcopy(eager)
    jm, x = thunder_rs.jit(model), torch.randn(2, 4)
    for _ in range(2):
        torch.testing.assert_close(jm(x), eager(x))


class Halved(Config):
    def bias(self):
        return self.shift / 2


class Reclassing(Model):
    """Changes its config's class between two calls of ``cfg.bias``."""

    def forward(self, x):
        y = _helper(self.cfg, self.linear(x))
        self.cfg.__class__ = Halved
        try:
            return _helper(self.cfg, y) + self.cfg.bias()
        finally:
            self.cfg.__class__ = Config


def test_a_config_class_changed_inside_the_program_between_two_reads():
    torch.manual_seed(0)
    eager = Reclassing(Config())
    model = copy.deepcopy(eager)
    jm, x = thunder_rs.jit(model), torch.randn(2, 4)
    for _ in range(2):
        torch.testing.assert_close(jm(x), eager(x))


class Rebinding(Model):
    """Rebinds ``Config.bias`` between two calls of ``cfg.bias``, and back (to functions it finds
    on the class: ``_other_bias`` is reached through the second ``cfg.bias`` only)."""

    def forward(self, x):
        y = _helper(self.cfg, self.linear(x))
        Config.bias = Config.other_bias
        try:
            return _helper(self.cfg, y) + self.cfg.bias()
        finally:
            Config.bias = Config.original_bias


def test_a_method_rebound_on_the_class_inside_the_program_between_two_reads():
    torch.manual_seed(0)
    eager = Rebinding(Config())
    model = copy.deepcopy(eager)
    jm, x = thunder_rs.jit(model), torch.randn(2, 4)
    try:
        for k in (-2.0, -2.0, 5.0):
            _other_bias.__defaults__ = (k,)  # (the function the second read finds: its defaults are guarded)
            torch.testing.assert_close(jm(x), eager(x))
    finally:
        _other_bias.__defaults__ = (-2.0,)
    assert "default arguments of _other_bias" in thunder_rs.compile_stats(jm).miss_reasons[-1]
