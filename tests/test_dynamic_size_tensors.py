"""Sizes made into tensors (``torch.tensor(x.shape[0])``, ``torch.full((B,), T)``, ``torch.tensor([T, 2])``)
stay symbolic: the trace computes the tensor from the size on each call, so one symbolic compile
serves every size, with eager's values, dtypes and devices; constant sizes keep their constant
traces. Every call is checked against eager."""

import gc
import warnings

import pytest
import torch

import thunder_rs
from thunder_rs.dynamo import compiled_graphs
from test_nvfuser_symbolic import _check_against_eager, _has_symbolic, _recording

pytestmark = pytest.mark.usefixtures("one_thread")

#: (rows, cols) of the input at each call: both change, never equal, never 0 or 1.
SHAPES = [(3, 5), (4, 6), (5, 7), (6, 8), (7, 9), (4, 6)]

#: Programs returning the tensor they make from sizes and a use of it with the input.
PATTERNS = {
    "tensor": lambda x: torch.tensor(x.shape[0]),
    "tensor_float32": lambda x: torch.tensor(x.shape[0], dtype=torch.float32),
    "tensor_float64": lambda x: torch.tensor(x.shape[1], dtype=torch.float64),
    "scalar_tensor": lambda x: torch.scalar_tensor(x.shape[0]),
    "scalar_tensor_int32": lambda x: torch.scalar_tensor(x.shape[1], dtype=torch.int32),
    "as_tensor": lambda x: torch.as_tensor(x.shape[0]),
    "new_tensor": lambda x: x.new_tensor(x.shape[0]),
    "new_tensor_list": lambda x: x.new_tensor([x.shape[0], x.shape[1]], dtype=torch.int64),
    "full_0d": lambda x: torch.full((), x.shape[0]),
    "full_sized": lambda x: torch.full((x.shape[1],), x.shape[0]),
    "full_float": lambda x: torch.full((2,), x.shape[0], dtype=torch.float32),
    "full_like": lambda x: torch.full_like(x, x.shape[1]),
    "new_full": lambda x: x.new_full((2, x.shape[1]), x.shape[0]),
    "list_mixed": lambda x: torch.tensor([x.shape[0], 2]),
    "list_floats": lambda x: torch.tensor([[x.shape[0], 2.5], [1, x.shape[1]]]),
    "true_divide": lambda x: torch.tensor(x.shape[0]) / 2,
    "arange_over_size": lambda x: torch.arange(x.shape[0]).float() / x.shape[0],
    "loss_normaliser": lambda x: x.sum() / torch.tensor(x.shape[1]),
}


def _equal(actual, expected):
    assert actual.dtype == expected.dtype and actual.device == expected.device
    assert actual.requires_grad == expected.requires_grad
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", PATTERNS)
def test_a_size_made_into_a_tensor_compiles_once_symbolic(name):
    made = PATTERNS[name]

    def fn(x):
        t = made(x)
        return t, x * t.sum()

    jf = thunder_rs.jit(fn)
    for shape in SHAPES:
        x = torch.randn(*shape)
        for actual, expected in zip(jf(x), fn(x)):
            _equal(actual, expected)
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_misses == 2, stats.miss_reasons  # static, then symbolic
    assert jf._dynamic_off is None
    assert "symbolic" in stats.miss_reasons[1]


def scaled(x, w):
    """A float tensor made from sizes scales a differentiable input."""
    n = torch.tensor(x.shape[0], dtype=torch.float32)
    return (x * n / torch.scalar_tensor(x.shape[1]) + torch.full((x.shape[1],), x.shape[0])) @ w


def test_gradients_through_a_product_with_a_size_tensor_equal_eager():
    jf = thunder_rs.jit(scaled)
    for rows, cols in SHAPES:
        w = torch.randn(cols, 3, requires_grad=True)
        x = torch.randn(rows, cols, requires_grad=True)
        expected = scaled(x, w)
        grads = torch.autograd.grad(expected.square().sum(), (x, w))
        actual = jf(x, w)
        _equal(actual, expected)
        torch.testing.assert_close(torch.autograd.grad(actual.square().sum(), (x, w)), grads)
    assert thunder_rs.cache_misses(jf) == 2
    assert jf._dynamic_off is None


def test_a_constant_size_keeps_a_constant_trace():
    def fn(x):
        return x * torch.tensor([x.shape[0], 2]).sum() + torch.full((3,), x.shape[1])

    jf = thunder_rs.jit(fn)
    x = torch.randn(3, 3)
    _equal(jf(x), fn(x))
    trace = str(thunder_rs.last_traces(jf)[-1])
    assert "iota" not in trace and "cat" not in trace, trace


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x * torch.tensor([x.shape[0], x.sum()]).sum(),  # a tensor in the data
        lambda x: x * torch.tensor([[x.shape[0]], [2]]).sum(),
        lambda x: x * torch.tensor(x.shape[0], dtype=torch.float32),
    ],
)
def test_data_the_size_path_does_not_take_equals_eager(fn):
    jf = thunder_rs.jit(fn)
    for shape in SHAPES[:4]:
        x = torch.randn(*shape)
        torch.testing.assert_close(jf(x), fn(x))


def test_a_leaf_made_of_a_size_is_refused_naming_the_line():
    # (eager's output requires grad through the new leaf; the trace keeps torch.tensor's data whole)
    jf = thunder_rs.jit(lambda x: x * torch.tensor(x.shape[0], dtype=torch.float32, requires_grad=True))
    with pytest.raises(NotImplementedError, match=r"torch.tensor: requires_grad=True at .*test_dynamic_size_tensors"):
        jf(torch.randn(3, 4))


#: Sizes written in place into a tensor the program made: the write fills the tensor's memory as
#: eager's does (dense, in the tensor's layout), not a broadcast of the size (strides of 0).
FILLS = {
    "fill_zeros_like": lambda x: torch.zeros_like(x).fill_(x.shape[1]),
    "fill_transposed": lambda x: torch.empty_like(x.t()).fill_(x.shape[0]),
    "fill_factory_bool": lambda x: torch.zeros(x.shape, dtype=torch.bool).fill_(x.shape[1] - 5),
    "fill_factory_read_too": lambda x: (lambda y: (y.fill_(x.shape[1]), y * 2))(torch.zeros(x.shape)),
    "add_into_factory": lambda x: torch.zeros(x.shape).add_(x.shape[0]),
    "fill_a_column": lambda x: (lambda y: (y[:, 1].fill_(x.shape[1]), y))(x.clone())[1],
}


def _outputs(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", FILLS)
def test_a_size_written_in_place_keeps_eagers_layout(name):
    fn = FILLS[name]
    jf = thunder_rs.jit(fn)
    for shape in SHAPES:
        x = torch.randn(*shape)
        for a, e in zip(_outputs(jf(x)), _outputs(fn(x))):
            _equal(a, e)
            assert a.stride() == e.stride(), (shape, a.stride(), e.stride())
    assert thunder_rs.cache_misses(jf) == 2


def normalised(x):
    """Mean by a size tensor made in the program, and a row of the length, in one region."""
    n = torch.tensor(x.shape[0], dtype=torch.float32)
    return (x.tanh() * n + torch.full((x.shape[1],), x.shape[0])).sum(0) / torch.tensor(x.shape[0])


def test_the_nvfuser_stand_in_runs_the_size_tensor_in_a_region(fake_ex):
    fused = _recording(fake_ex)
    jf = _check_against_eager(normalised, [(n, n + 2) for n in (3, 5, 7, 9, 4)], [], fake_ex)
    assert thunder_rs.cache_misses(jf) == 2
    calls = [c for r in fused for c in r.region.calls]
    assert any(c.name == "prims.iota" and _has_symbolic(c.args) for c in calls), [c.name for c in calls]


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches empty; yields a function giving the graphs compiled since (another test's
    compiled module may keep its graphs alive)."""
    torch._dynamo.reset()
    gc.collect()
    before = set(compiled_graphs())
    yield lambda: [g for g in compiled_graphs() if g not in before]
    torch._dynamo.reset()


def test_torch_compile_traces_a_tensor_of_a_size_symbolic(fresh_dynamo):
    def fn(x):
        return x * torch.tensor(x.shape[0]) + torch.tensor([x.shape[0], 2.5]).sum()

    compiled = torch.compile(fn, backend="thunder_rs")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph that runs eagerly warns
        for rows, cols in SHAPES:
            x = torch.randn(rows, 3)
            _equal(compiled(x), fn(x))
    graphs = fresh_dynamo()
    assert [g.eager_because for g in graphs] == [None, None]
    # The static graph and the dynamic one (its size a SymInt input), each compiled once.
    assert sorted(thunder_rs.cache_misses(g.jitted) for g in graphs) == [1, 1]
    dynamic = [g for g in graphs if any(isinstance(a, torch.SymInt) for a in _example_values(g.gm))]
    assert len(dynamic) == 1


def _example_values(gm):
    return [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
