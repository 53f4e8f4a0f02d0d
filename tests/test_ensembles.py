"""Model ensembling inside a jitted program (torch.func's tutorial: ``stack_module_state``,
``functional_call`` and ``torch.vmap``) over modules with BatchNorm in training mode, whose
running statistics each model updates in its own slice of the stacked buffers, as eager's vmap
does; and in-place writes under ``torch.vmap`` to the tensors it maps."""

import copy

import pytest
import torch
import torch.nn as nn
from torch.func import functional_call, stack_module_state

import thunder_rs

torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self, momentum=0.1):
        super().__init__()
        self.fc, self.bn, self.out = nn.Linear(4, 6), nn.BatchNorm1d(6, momentum=momentum), nn.Linear(6, 2)

    def forward(self, x):
        return self.out(self.bn(self.fc(x)).relu())


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(self.conv(x)).tanh().mean((1, 2, 3))


def ensemble(models, in_dims):
    base = copy.deepcopy(models[0]).to("meta")

    def program(params, buffers, x):
        call = lambda p, b, x: functional_call(base, (p, b), (x,))  # noqa: E731
        return torch.vmap(call, in_dims=in_dims)(params, buffers, x)

    return program


def _state(models):
    params, buffers = stack_module_state(models)
    return {k: v.detach().clone().requires_grad_() for k, v in params.items()}, {
        k: v.clone() for k, v in buffers.items()
    }


CASES = {
    "mlp_one_batch": (MLP, (0, 0, None), (8, 4)),
    "mlp_own_batches": (MLP, (0, 0, 0), (3, 8, 4)),
    "cnn_own_batches": (CNN, (0, 0, 0), (3, 5, 2, 6, 6)),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_an_ensemble_in_training_updates_its_stacked_buffers_as_eager(case):
    """Was refused (batch_norm in training under vmap; ``add_`` had no batching rule)."""
    make, in_dims, shape = case
    models = [make() for _ in range(3)]
    program = ensemble(models, in_dims)
    (ours, our_buffers), (eagers, eager_buffers) = _state(models), _state(models)
    jitted = thunder_rs.jit(program)
    for step in range(2):  # (the second call updates the statistics the first wrote)
        x = torch.randn(shape)
        actual, expected = jitted(ours, our_buffers, x), program(eagers, eager_buffers, x)
        torch.testing.assert_close(actual, expected)
        actual.pow(2).sum().backward()
        expected.pow(2).sum().backward()
        torch.testing.assert_close({k: v.grad for k, v in ours.items()}, {k: v.grad for k, v in eagers.items()})
        torch.testing.assert_close(our_buffers, eager_buffers)
        assert not any(v.requires_grad for v in our_buffers.values())


def test_running_statistics_not_batched_raise_eagers_error():
    models = [MLP() for _ in range(3)]
    params, _ = _state(models)
    buffers = {k: v.clone() for k, v in models[0].named_buffers()}
    program = ensemble(models, (0, None, None))
    x = torch.randn(8, 4)
    with pytest.raises(RuntimeError, match="running_mean or running_var, which will be updated in place, were not"):
        program(params, buffers, x)
    with pytest.raises(RuntimeError, match="running_mean or running_var, which will be updated in place, were not"):
        thunder_rs.jit(program)(params, buffers, x)


WRITES = {
    "add_": lambda a, b: a.add_(b, alpha=2),
    "mul_dim1": lambda a, b: a.mul_(b.sum()),
    "copy_": lambda a, b: a.copy_(b.sin()),
    "iadd": lambda a, b: a.__iadd__(1),
}


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_in_place_writes_to_mapped_arguments_write_them_as_eager(write):
    def program(a, b):
        return torch.vmap(write, in_dims=(1, 0))(a, b) * 2

    a, b = torch.randn(3, 4), torch.randn(4, 3)
    ours, eagers = a.clone(), a.clone()
    torch.testing.assert_close(thunder_rs.jit(program)(ours, b), program(eagers, b), rtol=0, atol=0)
    torch.testing.assert_close(ours, eagers, rtol=0, atol=0)


def test_in_place_writes_vmap_cannot_batch_are_refused():
    def unbatched_self(a, b):
        return torch.vmap(lambda a, b: a.add_(b), in_dims=(None, 0))(a, b)

    def a_view(a, b):
        return torch.vmap(lambda a, b: a[0].add_(b[0]), in_dims=(0, 0))(a, b)

    a, b = torch.randn(3), torch.randn(2, 3)
    with pytest.raises(RuntimeError):
        unbatched_self(a.clone(), b)
    with pytest.raises(RuntimeError, match=r"vmap: add_\(self, \*extra_args\) is not possible"):
        thunder_rs.jit(unbatched_self)(a.clone(), b)
    with pytest.raises(NotImplementedError, match=r"add_ writes a batched tensor that is not an argument .*test_ens"):
        thunder_rs.jit(a_view)(b.clone(), b)


def test_nested_vmaps_write_the_arguments_both_levels_map_as_eager():
    def program(a, b):
        torch.vmap(lambda a, b: torch.vmap(lambda a, b: a.add_(b))(a, b))(a, b)
        return a * 2

    def of_a_result(a, b):  # (the inner level maps a value the outer computed: refused, not misplaced)
        return torch.vmap(lambda a, b: torch.vmap(lambda c, b: c.add_(b))(a * 2, b))(a, b)

    a, b = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    ours, eagers = a.clone(), a.clone()
    torch.testing.assert_close(thunder_rs.jit(program)(ours, b), program(eagers, b), rtol=0, atol=0)
    torch.testing.assert_close(ours, eagers, rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="not an argument the vmap maps"):
        thunder_rs.jit(of_a_result)(a, b)
