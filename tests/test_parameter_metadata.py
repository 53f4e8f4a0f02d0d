"""A jitted module's parameters' dtype, device, requires_grad and sizes, with its train/eval mode, decide
its cache entry: each change below hits or recompiles with the reason it has, whether torch's
``TensorGuards`` checks them per call or (where it is missing) the attributes are read, and
computes as eager."""

import copy

import pytest
import torch
import torch.nn as nn

import thunder_rs
from thunder_rs.core.state import param_metadata


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.fc2 = nn.Linear(3, 2)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc(x))) * self.scale


def _each(fn):
    return lambda models: [fn(m) for m in models]


def _set_data(name, make):
    """``p.data = make(p)`` on the parameter ``name`` (a dotted path) of each model."""

    def change(model):
        p = model.get_parameter(name)
        with torch.no_grad():
            p.data = make(p)

    return change


def _to_float64(model):
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.double()


def _store_write(model):
    # as ``torch.func.functional_call`` swaps a tensor into its slot: no module write is counted
    model.fc._parameters["weight"] = nn.Parameter(torch.full((3, 4), 0.5))


_X = torch.linspace(-1.0, 1.0, 20).reshape(5, 4)
_CHANGED = "of the module's parameters and buffers changed"

#: (what changes, on both models; the context of the call; its input; None for a hit, else a
#: part of the miss reason)
STEPS = [
    (None, torch.enable_grad, _X, "first call"),
    (None, torch.enable_grad, _X, None),
    (None, torch.no_grad, _X, "grad mode True -> False"),
    (None, torch.inference_mode, _X, "inference mode False -> True"),
    (_each(lambda m: m.fc.weight.requires_grad_(False)), torch.enable_grad, _X, _CHANGED),
    (_each(lambda m: m.fc2.bias.requires_grad_(False)), torch.no_grad, _X, _CHANGED),
    (_each(lambda m: m.requires_grad_(False)), torch.no_grad, _X, _CHANGED),
    # under no_grad torch 2.9's TensorGuards take every requires_grad as False (checked with grad mode on)
    (_each(lambda m: m.fc.weight.requires_grad_(True)), torch.no_grad, _X, _CHANGED),
    (_each(lambda m: m.requires_grad_(True)), torch.no_grad, _X, None),
    (None, torch.enable_grad, _X, None),
    (_each(lambda m: m.eval()), torch.enable_grad, _X, "module training True -> False"),
    (_each(lambda m: m.train()), torch.enable_grad, _X, None),
    (_each(lambda m: m.half()), torch.no_grad, _X.half(), "(torch.float16, device(type='cpu'), False, torch.Size([]))"),
    (_each(lambda m: m.float()), torch.no_grad, _X, None),
    (_each(lambda m: setattr(m.fc, "weight", nn.Parameter(torch.ones(3, 4)))), torch.enable_grad, _X, None),
    (_each(_store_write), torch.enable_grad, _X, None),
    (_each(_to_float64), torch.enable_grad, _X.double(), _CHANGED),
    (_each(lambda m: m.float()), torch.enable_grad, _X, None),
    # a trace holds its inputs' sizes (a bias's gradient is summed to its shape)
    (_each(_set_data("fc2.bias", lambda p: p.data[:1].clone())), torch.enable_grad, _X, _CHANGED),
    (_each(_set_data("fc.weight", lambda p: p.data.t().contiguous().t())), torch.enable_grad, _X, None),
]


@pytest.mark.parametrize("guards", [True, False], ids=["tensor_guards", "attribute_reads"])
def test_parameter_changes_hit_or_recompile_with_their_reason_and_compute_as_eager(monkeypatch, guards):
    if not guards:
        monkeypatch.setattr(param_metadata, "TensorGuards", None)
    torch.manual_seed(0)
    model = Net()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for i, (change, context, x, reason) in enumerate(STEPS):
        if change is not None:
            change([model, eager])
        misses = thunder_rs.compile_stats(jmodel).cache_misses
        with context():
            for _ in range(2):  # the second call checks the guards the first built
                torch.testing.assert_close(jmodel(x), eager(x), msg=lambda m: f"step {i}: {m}")
            assert torch.is_grad_enabled() is (context is torch.enable_grad)
        stats = thunder_rs.compile_stats(jmodel)
        assert stats.cache_misses == misses + (reason is not None), (i, stats.miss_reasons[-1])
        if reason is not None:
            assert reason in stats.miss_reasons[-1], (i, stats.miss_reasons[-1])


def test_training_steps_as_eager_after_freezing_a_layer():
    torch.manual_seed(0)
    model = Net()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    x = torch.randn(6, 4)
    for step in range(4):
        if step == 2:
            for m in (model, eager):
                m.fc.requires_grad_(False)
        for m in (jmodel, eager):
            m.zero_grad(set_to_none=True)
            m(x).sum().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            assert (p.grad is None) == (q.grad is None)
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad)
    assert thunder_rs.compile_stats(jmodel).cache_misses == 2


def test_slots_given_tensors_the_guards_cannot_read_take_the_attribute_reads():
    """A nested, sparse or subclass tensor in a slot the guards were built for is compared by
    identity first (``TensorGuards`` would abort the process reading a nested tensor's strides)."""
    check = param_metadata.MetadataCheck()
    plain = [nn.Parameter(torch.randn(3)), torch.randn(2, 2)]
    first = check(plain)
    assert check(plain) is first and check(list(plain)) is first
    others = [
        torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]),
        torch.randn(2, 2).to_sparse(),
        nn.Buffer(torch.randn(2, 2)) if hasattr(nn, "Buffer") else torch.randn(2, 2).to_sparse_csr(),
    ]
    for other in others:
        for _ in range(3):
            metadata = check([plain[0], other])
            sizes = None if other.is_nested else other.shape
            assert metadata.per_tensor == (
                (torch.float32, plain[0].device, True, plain[0].shape),
                (other.dtype, other.device, False, sizes),
            )
    assert check(plain) is first


def test_tensors_new_on_every_call_build_no_guards():
    check = param_metadata.MetadataCheck()
    for _ in range(3):
        metadata = check([torch.randn(2, requires_grad=True)])
        assert check._last[1] is None
    assert metadata is check([torch.randn(2, requires_grad=True)])
    assert metadata is not check([torch.randn(5, requires_grad=True)])  # (sizes are in the key)


@pytest.mark.parametrize("mode_free", [True, False], ids=["checked_in_no_grad", "checked_with_grad_mode_on"])
def test_requires_grad_toggled_under_no_grad_misses_the_guards(monkeypatch, mode_free):
    """Under ``no_grad`` the guards are checked as they are where this torch's read requires_grad
    in any grad mode (``_mode_free``), else with grad mode turned on for the check."""
    check = param_metadata.MetadataCheck()
    tensors = [nn.Parameter(torch.randn(3)), torch.randn(2)]
    first = check(tensors)
    assert check(tensors) is first and check._last[1] not in (None, param_metadata._UNGUARDABLE)
    monkeypatch.setattr(param_metadata, "_mode_free", [mode_free])
    with torch.no_grad():
        assert check(tensors) is first
        tensors[0].requires_grad_(False)
        frozen = check(tensors)
        assert frozen is not first and frozen.per_tensor[0][2] is False
        tensors[1].requires_grad_(True)
        assert check(tensors).per_tensor[1][2] is True
        assert torch.is_grad_enabled() is False
