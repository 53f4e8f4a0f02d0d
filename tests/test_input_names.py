"""Traces name the program's inputs after the user's arguments and the module's parameters."""

import re

import torch
from torch import nn
from torch.utils import _pytree as pytree

import thunder_rs


def _signature(trace) -> str:
    return re.search(r"def computation\((.*)\):", str(trace)).group(1)


def test_arguments_keywords_and_containers_are_named_after_the_user():
    def f(x, batch, *rest, scale, **extra):
        return x * scale + batch["input_ids"] + rest[0] + extra["mask"]

    jf = thunder_rs.jit(f)
    x = torch.randn(3)
    out = jf(x, {"input_ids": x + 1}, x + 2, scale=2.0, mask=x + 3)
    torch.testing.assert_close(out, f(x, {"input_ids": x + 1}, x + 2, scale=2.0, mask=x + 3))
    for trace in (thunder_rs.last_traces(jf)[0], thunder_rs.last_traces(jf)[-1]):
        assert _signature(trace) == "l_x, l_batch_input_ids, l_args_2, l_mask"
    assert "t0" not in str(thunder_rs.last_traces(jf)[-1])


def test_module_parameters_are_named_by_their_qualified_names():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4, bias=False)])
            self.head = nn.Sequential(nn.LayerNorm(4))

        def forward(self, hidden):
            for layer in self.layers:
                hidden = layer(hidden).relu()
            return self.head(hidden)

    model = Block()
    jm = thunder_rs.jit(model)
    x = torch.randn(2, 4, requires_grad=True)
    out = jm(x)
    out.sum().backward()
    assert _signature(thunder_rs.last_traces(jm)[-1]) == (
        "l_hidden, layers_0_weight, layers_0_bias, layers_1_weight, head_0_weight, head_0_bias"
    )
    torch.testing.assert_close(out, model(x))
    assert model.layers[0].weight.grad is not None


def test_names_never_shadow_generated_names_builtins_or_each_other():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.torch = nn.Parameter(torch.ones(3))
            self.t0 = nn.Parameter(torch.ones(3) * 2)
            self.seq = nn.Sequential(nn.Identity())
            self.register_buffer("l_x", torch.ones(3) * 3)

        def forward(self, x, t1, größe):
            return x * self.torch + self.t0 * t1 + self.l_x * größe

    model = Odd()
    jm = thunder_rs.jit(model)
    args = [torch.randn(3) for _ in range(3)]
    torch.testing.assert_close(jm(*args), model(*args))
    names = _signature(thunder_rs.last_traces(jm)[-1]).split(", ")
    assert names == ["l_x", "l_t1", "l_größe", "torch_1", "t0_", "l_x_1"]


def test_sequential_children_and_positional_inputs():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    jm = thunder_rs.jit(model)
    jm(torch.randn(2, 4))
    assert _signature(thunder_rs.last_traces(jm)[-1]) == "l_input, m_0_weight, m_0_bias"


class _Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b


pytree.register_pytree_node(_Pair, lambda p: ([p.a, p.b], None), lambda leaves, _: _Pair(*leaves))


def test_a_pytree_node_without_key_paths_gets_positional_names():
    """A node registered without ``flatten_with_keys_fn`` cannot name its children."""

    def f(pair):
        return pair.a * pair.b

    jf = thunder_rs.jit(f)
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(jf(_Pair(a, b)), a * b)
    assert _signature(thunder_rs.last_traces(jf)[-1]) == "l_args_0, l_args_1"
