"""What a compile does once however often the program repeats it (the costs profiled in
benchmarks/compile_times.py): each guard the observer keys is made at the first read of its key,
not once per read. The guards, and the outputs against eager, are the same."""

import types

import torch
import torch.nn as nn

import thunder_rs
from thunder_rs.core.state import guards as guards_module
from thunder_rs.core.state import state as state_module


class Configured(nn.Module):
    """Reads its config's attributes, and calls its own helper method, many times over (as
    transformers' configs and layers are read in every block)."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(scale=2.0, shift=0.5, power=2, eps=1e-5, width=4)

    def helper(self, y):
        return y * self.config.scale + self.config.shift

    def forward(self, x):
        for _ in range(4):
            x = self.helper(x) + self.config.eps * self.config.width
        return x.pow(self.config.power)


def _counting(monkeypatch, cls) -> list:
    made = []
    init = cls.__init__

    def counted(self, *args, **kwargs):
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", counted)
    return made


def test_each_object_and_method_guard_is_made_once(monkeypatch):
    dict_guards = _counting(monkeypatch, guards_module.DictGuard)
    method_guards = _counting(monkeypatch, state_module.MethodGuard)
    model = Configured()
    x = torch.randn(3, 4)
    jm = thunder_rs.jit(model)
    torch.testing.assert_close(jm(x), model(x), rtol=0, atol=0)
    # One whole guard of the config (read 18 times), one method guard of ``helper`` (called 4 times).
    assert len(dict_guards) == 1
    assert len(method_guards) == 1
    # The guards still hold and still fail as before: a changed attribute recompiles.
    torch.testing.assert_close(jm(x), model(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jm).cache_misses == 1
    model.config.shift = -1.0
    torch.testing.assert_close(jm(x), model(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jm).cache_misses == 2
    Configured.helper, helper = (lambda self, y: y - 1.0), Configured.helper
    try:
        torch.testing.assert_close(jm(x), model(x), rtol=0, atol=0)
        assert thunder_rs.compile_stats(jm).cache_misses == 3
    finally:
        Configured.helper = helper


def test_the_proxy_metadata_helpers_answer_as_its_torch_function_does():
    # The recorder and the grad rules read ``requires_grad`` and ``numel()`` of every operand through
    # ``requires_grad_of``/``numel_of``, which skip the trip through ``__torch_function__``.
    from thunder_rs.core.base.proxies import TensorProxy, numel_of, requires_grad_of

    for shape in ((2, 3, 4), (), (0, 5)):
        for requires_grad in (False, True):
            proxy = TensorProxy(0, shape, torch.float32, torch.device("cpu"), requires_grad)
            assert requires_grad_of(proxy) is proxy.requires_grad is requires_grad
            assert numel_of(proxy) == proxy.numel()
    t = torch.ones(2, 3, requires_grad=True)
    assert requires_grad_of(t) and numel_of(t) == 6
