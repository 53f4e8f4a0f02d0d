"""``torch.compile(model, backend="thunder_rs")`` over changing sizes: each dynamic Dynamo graph
compiles once in thunder_rs and Dynamo compiles each frame once per regime of sizes (static, then
dynamic), with outputs and gradients equal to eager's."""

import copy

import pytest
import torch

from torch._dynamo.utils import counters

import thunder_rs
from thunder_rs.dynamo import compiled_graphs
from test_dynamo_backend import train_compiled_like_eager
from test_hf_models import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = dict(rtol=1e-4, atol=1e-5)


#: The graphs alive before the running test (another test's, still referenced somewhere), held so
#: that none dies and leaves its id to a graph of the test.
_earlier: set = set()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts with Dynamo's caches and counters empty, so that it compiles its own graphs."""
    torch._dynamo.reset()
    counters.clear()
    _earlier.clear()
    _earlier.update(compiled_graphs())
    yield
    torch._dynamo.reset()


def compiles() -> list[int]:
    """thunder_rs's compiles of each graph the backend ran during the test, in no particular order."""
    graphs = [g for g in compiled_graphs() if g not in _earlier and g.jitted is not None]
    return sorted(thunder_rs.cache_misses(g.jitted) for g in graphs)


class WritesAnAttribute(torch.nn.Module):
    """Writes module attributes in forward, as Hugging Face models do (``setattr`` on a model
    marking its output-capturing hooks installed)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.scale = 2.0
        setattr(self, "seen", True)
        return self.lin(x).relu() * self.scale


def test_module_attribute_writes_in_forward_neither_break_the_graph_nor_recompile():
    # thunder_rs counts module writes (to revalidate thunder_rs.jit's guards on module attributes
    # only after one): Dynamo traced the count, guarded on its value and recompiled the frame at
    # every call; and a wrapper's code shared with register_buffer's made `self.x = ...` a graph break.
    torch.manual_seed(0)
    model = WritesAnAttribute()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="thunder_rs")
    for n in (2, 3, 4, 5, 6, 3):
        x = torch.randn(n, 4)
        out, ref = compiled(x), eager(x)
        torch.testing.assert_close(out, ref, **TOL)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(model.lin.weight.grad, eager.lin.weight.grad, **TOL)
    assert model.seen is True and model.scale == 2.0
    # One graph for the first size, one dynamic graph for all the others: no break, no recompile.
    assert not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] == 2
    assert compiles() == [1, 1]


def test_llama_training_over_padded_lengths_compiles_the_model_once_per_regime():
    # Llama's forward writes a module attribute (transformers' output capturing): Dynamo guarded
    # on thunder_rs's count of module writes and compiled the whole model again at every call.
    train_compiled_like_eager(tiny_model("llama"), [8, 12, 16, 9, 21])
    assert counters["stats"]["unique_graphs"] == 2
    assert compiles() == [1, 1]


def test_a_graph_summing_sizes_with_sym_sum_stays_symbolic():
    # Dynamo adds a KV cache's length and the new tokens' with torch.sym_sum (HF generate), which
    # asked a SymNode that thunder_rs's sizes have not: each length compiled again.
    def step(cache, x):
        joined = torch.cat([cache, x], 1)
        return joined.softmax(-1) * sum([1, cache.shape[1]])

    compiled = torch.compile(step, backend="thunder_rs")
    for n in (3, 4, 5, 6, 7, 9):
        cache = torch.randn(2, n, requires_grad=True)
        x = torch.randn(2, 1)
        out, ref = compiled(cache, x), step(cache, x)
        torch.testing.assert_close(out, ref, **TOL)
        grad = torch.randn_like(ref)
        torch.testing.assert_close(torch.autograd.grad(out, cache, grad), torch.autograd.grad(ref, cache, grad), **TOL)
    assert any(n.target is torch.sym_sum for g in compiled_graphs() for n in g.gm.graph.nodes)
    assert compiles() == [1, 1]


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 1.0

    def forward(self, x):
        return x * self.scale


def test_a_module_attribute_a_compiled_frame_writes_reaches_thunder_rs_jit():
    # Module writes are not counted while Dynamo traces (a guard on the count recompiled every
    # call); the compiled frame's replay of the write counts it, so jit's guards see it.
    module = Scaled()
    jitted = thunder_rs.jit(module)
    x = torch.ones(2)
    torch.testing.assert_close(jitted(x), x)

    @torch.compile(backend="thunder_rs")
    def rescale(y):
        module.scale = 3.0
        return y.cos()

    rescale(x)
    assert module.scale == 3.0
    torch.testing.assert_close(jitted(x), 3 * x)


def _zero_a_column(x):
    return x[:, 0].zero_()


def _halve_the_tail(x):
    return x[x.shape[0] // 2 :].mul_(0.5)


@pytest.mark.parametrize("program", [_zero_a_column, _halve_the_tail])
def test_a_write_through_a_view_of_a_symbolic_input_returns_that_view_of_it(program):
    # The returned view of a written input is taken again of the caller's tensor after the
    # write-back; its steps' symbolic sizes reached the slice as thunder_rs's SymInts, which torch
    # asked `node.is_int` of: every call after the sizes turned symbolic failed (jit's too).
    compiled = torch.compile(program, backend="thunder_rs")
    jitted = thunder_rs.jit(program)
    for n in (2, 3, 5, 7):
        x = torch.randn(n, 4)
        expected_x = x.clone()
        expected = program(expected_x)
        for call in (compiled, jitted):
            y = x.clone()
            out = call(y)
            torch.testing.assert_close(y, expected_x)
            torch.testing.assert_close(out, expected)
            # a view of the caller's tensor, as eager's
            assert out.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
            assert (out.stride(), out.storage_offset()) == (expected.stride(), expected.storage_offset())
    assert compiles() == [1, 1]
    assert thunder_rs.compile_stats(jitted).cache_misses == 2


@pytest.mark.parametrize("name", ["batch_norm_2d", "group_norm", "cross_entropy", "kl_div_batchmean", "attention"])
def test_layers_train_under_the_backend_as_eager_in_one_compile_per_graph(name):
    # A representative of the sweep of test_dynamic_layers' CASES under the backend (all 21, in
    # bf16, CPU autocast and eval under no_grad: each Dynamo graph compiled once in thunder_rs).
    from test_dynamic_layers import CASES

    make, sample = CASES[name]
    torch.manual_seed(0)
    model = make()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="thunder_rs")
    for n in (2, 3, 5):
        x = sample(n)
        out, expected = compiled(x), eager(x)
        torch.testing.assert_close(out, expected, **TOL)
        assert (out.dtype, out.stride()) == (expected.dtype, expected.stride())
        out.sum().backward()
        expected.sum().backward()
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, **TOL)
        for b, c in zip(model.buffers(), eager.buffers(), strict=True):
            torch.testing.assert_close(b, c, **TOL)
    assert compiles() == [1, 1]


def test_a_changing_float_is_one_compile_of_its_graph():
    """Dynamo passes a float that changed as a 0-d float64 tensor the graph reads with ``.item()``:
    the graph takes the float itself, as a float input from its first compile, so every value is
    served by one compile with eager's results (a wrapped number: bfloat16 stays bfloat16), and the
    backward reads the call's float."""
    x = torch.randn(8, dtype=torch.bfloat16)
    w = torch.randn(8, requires_grad=True)

    def fn(x, w, s):
        return x * s + s, (w * s).sum() * s

    compiled = torch.compile(fn, backend="thunder_rs")
    for s in (0.1, 0.2, 0.3, -0.0, 2.5, 0.7):
        w1, w2 = (w.detach().clone().requires_grad_() for _ in range(2))
        expected, got = fn(x, w1, s), compiled(x, w2, s)
        expected[1].backward()
        got[1].backward()
        assert all(torch.equal(e, g) and e.dtype == g.dtype for e, g in zip(expected, got)), s
        assert torch.equal(w1.grad, w2.grad), s
    assert compiles() == [1, 1]  # the graph of the first value, then the graph taking the float
