"""Parameters and buffers given other tensors between calls (reloaded, swapped, re-pruned, moved
to another dtype) are read from their slots on every call, and a recompile binds each slot to the
tensor it holds then."""

import copy

import torch
import torch.nn as nn
import torch.nn.utils.prune as prune

import thunder_rs


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.full((3,), 1.0))
        self.b = nn.Parameter(torch.full((3,), 10.0))
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return x * self.a * self.scale + 2 * self.b


def _check(jmodel, model, x):
    model.zero_grad(set_to_none=True)
    expected = model(x)
    expected.sum().backward()
    grads = [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    out = jmodel(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g)


def test_swapped_parameters_and_a_replaced_buffer_then_a_recompile():
    model = Two()
    jmodel = thunder_rs.jit(model)
    _check(jmodel, model, torch.ones(3))
    model.a, model.b = model.b, model.a
    model.scale = torch.tensor(3.0, dtype=torch.float64)
    _check(jmodel, model, torch.ones(3))
    _check(jmodel, model, torch.ones(2, 3))  # a new shape recompiles with the slots' tensors now


def test_a_reloaded_weight_then_a_new_batch_size():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    jmodel = thunder_rs.jit(model)
    _check(jmodel, model, torch.randn(4, 3))
    model.weight = nn.Parameter(torch.randn(2, 3))
    _check(jmodel, model, torch.randn(4, 3))
    _check(jmodel, model, torch.randn(5, 3))


def test_iterative_pruning_and_a_dtype_change():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3))
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    jmodel = thunder_rs.jit(model)
    x = torch.randn(5, 4)
    _check(jmodel, model, x)
    prune.l1_unstructured(model[0], "weight", amount=0.3)  # a new mask buffer
    _check(jmodel, model, x)
    model.double()
    _check(jmodel, model, x.double())


def test_attributes_set_and_deleted_on_the_jitted_module_reach_the_wrapped_module():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 2.0
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            out = self.lin(x) * self.scale
            return out + self.shift if hasattr(self, "shift") else out

    torch.manual_seed(0)
    model = Scaled()
    jmodel = thunder_rs.jit(model)
    x = torch.ones(1, 2)
    _check(jmodel, model, x)
    jmodel.scale = 5.0
    jmodel.lin = nn.Linear(2, 2)
    jmodel.shift = 1.0
    assert (model.scale, model.lin, model.shift) == (5.0, jmodel.lin, 1.0)
    _check(jmodel, model, x)
    del jmodel.shift
    assert not hasattr(model, "shift")
    _check(jmodel, model, x)
    jmodel.eval()
    assert not model.training and not jmodel.training


def test_a_forward_patched_on_an_instance_after_the_first_call_runs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    jmodel = thunder_rs.jit(model)
    x = torch.randn(3, 4)
    _check(jmodel, model, x)
    inner = model[1].forward
    model[1].forward = lambda t: inner(t) * 2 + 1  # as Accelerate's hooks wrap a submodule
    _check(jmodel, model, x)
    outer = model.forward
    model.forward = lambda t: outer(t) - 3
    _check(jmodel, model, x)


def test_unfreezing_a_parameter_the_program_reaches_from_outside_recompiles():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    eager = copy.deepcopy(model)
    model.weight.requires_grad_(False)
    eager.weight.requires_grad_(False)
    scale = torch.ones(2)  # a captured global-like tensor, frozen at first
    jloss = thunder_rs.jit(lambda x: (model(x) * scale).sum())
    x = torch.randn(4, 3)
    jloss(x).backward()
    assert model.weight.grad is None
    for m in (model, eager):
        m.weight.requires_grad_(True)
    scale.requires_grad_(True)
    jloss(x).backward()
    (eager(x) * scale.detach()).sum().backward()
    torch.testing.assert_close(model.weight.grad, eager.weight.grad)
    torch.testing.assert_close(scale.grad, eager(x).detach().sum(0))
    assert "requires_grad False -> True" in thunder_rs.compile_stats(jloss).miss_reasons[-1]


def test_a_deep_copy_or_a_pickle_of_a_jitted_module_is_a_jit_of_a_copy():
    import pickle

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    jmodel = thunder_rs.jit(model)
    x = torch.randn(5, 3)
    expected = jmodel(x)
    for other in (copy.deepcopy(jmodel), pickle.loads(pickle.dumps(jmodel))):
        assert isinstance(other, type(jmodel)) and other._model is not model
        torch.testing.assert_close(other(x), expected)
        with torch.no_grad():
            other._model[0].weight.zero_()
        torch.testing.assert_close(jmodel(x), expected)
    ema = torch.optim.swa_utils.AveragedModel(jmodel, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    ema.update_parameters(jmodel)
    torch.testing.assert_close(ema(x), expected)
