"""A jitted module's slots read once calls repeat: after two calls found the same tensors in its
parameter and buffer slots, a generated identity check tells the next calls whether they still
hold them (``core.state.slot_reads``). Each change below is made after that check was built,
directly to the stores where it can be (no module write that would make the call re-read the
slots), and the calls compute as eager."""

import copy
import gc
import weakref

import pytest
import torch
import torch.nn as nn
from torch.func import functional_call

import thunder_rs
from thunder_rs._core import SlotIdentity, same_objects
from thunder_rs.core.state.slot_reads import MAX_CHECKS, SlotReads
from test_parameter_metadata import Net
from user_models_round3 import TiedLanguageModel


def _store_write(m):
    m.fc._parameters["weight"] = nn.Parameter(torch.full((3, 4), 0.5))


def _buffer_store_write(m):
    m._buffers["scale"] = torch.tensor(7.0)


def _set_data(m):
    with torch.no_grad():
        m.fc.weight.data = torch.ones(3, 4)


def _resize(m):
    with torch.no_grad():
        m.scale.resize_(1).fill_(3.0)


def _set(m):
    with torch.no_grad():
        m.fc2.bias.set_(torch.tensor([5.0, 6.0, 7.0])[:2])


def _load_state_dict(m):
    m.load_state_dict({k: v + 1 for k, v in m.state_dict().items()}, assign=True)


def _swapped_double(m):
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        m.double()
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)


CHANGES = [_store_write, _buffer_store_write, _set_data, _resize, _set, _load_state_dict, _swapped_double]


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__.strip("_") for c in CHANGES])
def test_a_change_after_the_identity_check_was_built_computes_as_eager(change):
    torch.manual_seed(0)
    model = Net()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    x = torch.linspace(-1.0, 1.0, 20).reshape(5, 4)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(jmodel(x), eager(x), rtol=0, atol=0)
        for m in (model, eager):
            change(m)
        x = x.to(model.fc.weight.dtype)
        for _ in range(2):
            torch.testing.assert_close(jmodel(x), eager(x), rtol=0, atol=0)


def test_a_tied_slot_written_after_the_identity_check_was_built_unties_as_eager():
    torch.manual_seed(0)
    model, tokens = TiedLanguageModel(), torch.randint(0, 10, (2, 3))
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for _ in range(3):
        torch.testing.assert_close(jmodel(tokens), eager(tokens), rtol=0, atol=0)
    head = torch.randn(10, 4)
    for m in (model, eager):
        m.head._parameters["weight"] = nn.Parameter(head.clone())  # (the store written: no module write)
    for _ in range(2):
        torch.testing.assert_close(jmodel(tokens), eager(tokens), rtol=0, atol=0)
    params = {"head.weight": torch.randn(10, 4)}
    for tie_weights in (False, True):
        out = functional_call(jmodel, params, (tokens,), tie_weights=tie_weights)
        torch.testing.assert_close(out, functional_call(eager, params, (tokens,), tie_weights=tie_weights))


def _slots(model):
    unique = tuple((d, n) for m in model.modules() for d in (m._parameters, m._buffers) for n in d)
    bias = next(i for i, (d, n) in enumerate(unique) if d is model.fc._parameters and n == "bias")
    return SlotReads(unique, ()), bias


def test_the_identity_check_is_built_when_calls_repeat_and_never_for_new_tensors():
    model = Net()
    slots, bias = _slots(model)
    first = slots.read()
    second = slots.read()
    assert second is not first and second == first  # (the same tensors twice: the check is built)
    assert slots.read() is second and slots.read() is second  # (checked by identity, not read)
    model.fc._parameters["bias"] = nn.Parameter(torch.zeros(3))
    third = slots.read()
    assert third is not second and third[bias] is model.fc.bias
    for _ in range(3):  # (new tensors on every call: each call reads the slots)
        model.fc._parameters["bias"] = nn.Parameter(torch.zeros(3))
        assert slots.read()[bias] is model.fc.bias


def test_a_failed_identity_check_holds_no_tensor_and_checks_stop_after_max_checks():
    model = Net()
    slots, bias = _slots(model)
    old = weakref.ref(model.fc.bias)
    slots.read(), slots.read()
    model.fc._parameters["bias"] = nn.Parameter(torch.zeros(3))
    assert slots.read()[bias] is model.fc.bias
    gc.collect()
    assert old() is None
    for _ in range(MAX_CHECKS + 2):  # (alternating tensors: each pair of equal reads builds a check)
        model.fc._parameters["bias"] = nn.Parameter(torch.zeros(3))
        for _ in range(3):
            assert slots.read()[bias] is model.fc.bias
    assert slots._made == MAX_CHECKS and slots._check is None


def test_the_identity_check_of_dict_stores_is_one_c_call_that_tells_each_change():
    """Dict stores are checked by ``_core.SlotIdentity`` (C-level lookups, no Python frame): a slot
    given another tensor or emptied fails it, and a read then finds the slots as they are."""
    model = Net()
    slots, bias = _slots(model)
    slots.read(), slots.read()
    check = slots._check[0]
    assert type(check.__self__) is SlotIdentity and check()
    old = model.fc._parameters["bias"]
    model.fc._parameters["bias"] = nn.Parameter(torch.zeros(3))
    assert not check()
    model.fc._parameters["bias"] = old
    assert check()
    del model.fc._parameters["bias"]
    assert not check()
    with pytest.raises(KeyError):
        slots.read()


def test_same_objects_compares_by_identity_within_bounds():
    a, b, c = torch.zeros(1), torch.zeros(1), torch.zeros(1)
    assert same_objects((a, b, c), 1, [b, c]) and same_objects((a, b, c), 0, [])
    assert not same_objects((a, b, c), 1, [b, torch.zeros(1)])  # (equal values, another tensor)
    assert not same_objects((a, b, c), 2, [c, a]) and not same_objects((a,), 5, [])
