"""``torch.func.functional_call`` inside a jitted program, by where its module and its dict of
tensors come from (``core/acquisition/reparametrize.py``): from the arguments, or a submodule of the
jitted module with a captured dict, eager's outputs, a replaced tensor in the dict read by the next
call; a module reached from a closure or global given a captured dict, refused naming
``functional_call`` and the line (it was refused with a reason about the module's state that named
neither)."""

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def _twins():
    torch.manual_seed(0)
    linear = nn.Linear(3, 2)
    params = {k: torch.randn_like(v) for k, v in linear.named_parameters()}
    return linear, params


def test_a_closure_module_with_a_closure_dict_is_refused_naming_functional_call():
    linear, params = _twins()

    def program(x):
        return functional_call(linear, params, (x,))

    with pytest.raises(ThunderNotImplementedError, match=r"functional_call at .*test_functional_call_state.py:\d+"):
        thunder_rs.jit(program)(torch.randn(4, 3))
    assert all(type(p) is nn.Parameter for p in linear.parameters())  # the module's own put back


def test_an_argument_module_with_a_closure_dict_is_refused_naming_functional_call():
    linear, params = _twins()

    def program(module, x):
        return functional_call(module, params, (x,))

    with pytest.raises(ThunderNotImplementedError, match="'weight' of a dict that is not an argument"):
        thunder_rs.jit(program)(linear, torch.randn(4, 3))


def test_a_closure_module_with_the_dict_passed_in_matches_eager():
    linear, params = _twins()

    def program(p, x):
        return functional_call(linear, p, (x,))

    jf = thunder_rs.jit(program)
    x = torch.randn(4, 3)
    for _ in range(2):
        torch.testing.assert_close(jf(params, x), program(params, x), rtol=0, atol=0)
        params = {k: v * 2 for k, v in params.items()}


def test_a_closure_module_given_its_own_parameters_matches_eager():
    linear, _ = _twins()
    own = dict(linear.named_parameters())

    def program(x):
        return functional_call(linear, own, (x,))

    x = torch.randn(4, 3)
    torch.testing.assert_close(thunder_rs.jit(program)(x), program(x), rtol=0, atol=0)


class _Outer(nn.Module):
    def __init__(self, params: dict):
        super().__init__()
        self.sub = nn.Linear(3, 2)
        self.params = params

    def forward(self, x):
        return functional_call(self.sub, self.params, (x,))


def test_a_submodule_of_the_jitted_module_with_a_kept_dict_reads_each_calls_tensors():
    _, params = _twins()
    model = _Outer(params)
    eager = copy.deepcopy(model)
    jm = thunder_rs.jit(model)
    x = torch.randn(4, 3)
    for _ in range(2):
        torch.testing.assert_close(jm(x), eager(x), rtol=0, atol=0)
        for m in (model, eager):
            m.params["weight"] = m.params["weight"] * 3
