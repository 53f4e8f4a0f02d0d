"""A jitted module's kept structures (``core.state.structures``) free what eager frees: a module
taken out of the tree for good (a replaced head, a dropped LoRA wrapper, a swapped activation, a
forward set on an instance and removed) is freed once the next call has bound the new structure,
as before structures were kept. The kept structures and their entries had held it, with its
parameters, until four other structures were bound. Every call is checked against eager.
"""

import gc
import weakref

import pytest
import torch
import torch.nn as nn

import thunder_rs
from test_dynamic_round9 import misses
from test_dynamic_round15 import LoRA, _body, _step

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")]


def test_a_replaced_head_is_freed_and_the_new_structure_runs_as_eager():
    model = _body()
    jitted = thunder_rs.jit(model)
    for T in (3, 5):
        _step(model, jitted, T)
    old = weakref.ref(model.head)
    model.head = nn.Linear(6, 3).double()
    _step(model, jitted, 4)
    gc.collect()
    assert old() is None
    for T in (2, 7, 4):
        _step(model, jitted, T)


def test_a_swapped_activation_is_freed():
    model = _body()
    jitted = thunder_rs.jit(model)
    _step(model, jitted, 3)
    old = weakref.ref(model.act)
    model.act = nn.Tanh()
    _step(model, jitted, 3)
    gc.collect()
    assert old() is None
    _step(model, jitted, 6)


def test_a_dropped_lora_wrapper_is_freed_and_the_base_structure_is_found_again():
    """The structure the wrapper was put on is kept while the wrapper is on (its modules all stay in
    the tree): taking the wrapper off compiles nothing. The wrapper's structure is dropped then, so
    the wrapper, no longer referenced, is freed."""
    model = _body()
    jitted = thunder_rs.jit(model)
    base = model.first
    _step(model, jitted, 5)
    wrapper = LoRA(base)
    gone = weakref.ref(wrapper)
    model.first = wrapper
    _step(model, jitted, 5)
    model.first = base
    _step(model, jitted, 5)
    assert misses(jitted) == 2
    del wrapper
    gc.collect()
    assert gone() is None
    for T in (5, 3, 8):
        _step(model, jitted, T)


def test_a_module_the_user_still_holds_stays_alive_and_runs_as_eager_when_put_back():
    """(Eager keeps it: so does the jit, and putting it back runs it as eager.)"""
    model = _body()
    jitted = thunder_rs.jit(model)
    relu = model.act
    _step(model, jitted, 3)
    model.act = nn.Tanh()
    _step(model, jitted, 3)
    gc.collect()
    model.act = relu
    for T in (3, 5):
        _step(model, jitted, T)


def test_a_forward_set_on_an_instance_and_removed_is_freed():
    """(As Accelerate's hooks set one and remove it.) The structure with the forward set held it."""
    model = _body()
    jitted = thunder_rs.jit(model)
    head = model.head
    _step(model, jitted, 3)

    def doubled(x):
        return type(head).forward(head, x) * 2

    head.forward = doubled
    _step(model, jitted, 3)
    gone = weakref.ref(doubled)
    del head.forward, doubled
    _step(model, jitted, 3)
    gc.collect()
    assert gone() is None
    _step(model, jitted, 5)


class _WithExtra(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3).double()

    def forward(self, x):
        y = self.lin(x)
        return y + self.extra if hasattr(self, "extra") else y


def test_a_deleted_buffer_is_freed_though_its_structure_is_kept():
    """The structure with the buffer is kept (its modules are all in the tree) but holds no tensor:
    its binding had held the deleted buffer (the tensors of its last call)."""
    model = _WithExtra()
    jitted = thunder_rs.jit(model)
    x = torch.randn(2, 4, dtype=torch.float64)
    assert torch.equal(jitted(x), model(x))
    model.register_buffer("extra", torch.randn(3, dtype=torch.float64))
    assert torch.equal(jitted(x), model(x))
    gone = weakref.ref(model.extra)
    del model.extra
    assert torch.equal(jitted(x), model(x))
    gc.collect()
    assert gone() is None
    model.register_buffer("extra", torch.randn(3, dtype=torch.float64))
    assert torch.equal(jitted(x), model(x))
