"""Objects a jitted callable carries besides its arguments are program state like a module's
attributes: the instance of a bound method or of a callable object, a ``functools.partial``'s
arguments and objects among the default arguments. Changing them between calls recompiles."""

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


@pytest.mark.parametrize("make", [lambda s: s.apply, lambda s: s, lambda s: functools.partial(_scaled, cfg=s)],
                         ids=["bound_method", "callable_object", "partial"])
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
