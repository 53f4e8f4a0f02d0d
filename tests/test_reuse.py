"""Buffer reuse (``passes::reuse``): generated code writes the result of an elementwise call or
of a write at indices (``index_add``, ``scatter``, ...) into its receiver when that is a fresh
intermediate dying at the call. Everything a program can observe must stay eager's: outputs
(values, dtypes, shapes, strides), inputs, values it returned or viewed, gradients, random draws."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thunder_rs
from test_data_dependent import train_moe_like_eager
from test_inplace import DTYPES, assert_same, check_against_eager, execution_source
from test_inplace_modules import assert_in_place_only_on_dying_intermediates


def in_place_calls(source: str) -> list[str]:
    return re.findall(r"\.(\w+_)\(", source.replace("__", ""))


def chain(a, b):
    return torch.exp(torch.sin((a + b) * a) - b).tanh()


def grows(a, b):
    """A fresh intermediate of ``a``'s shape and dtype meets ``b``: broadcasting or promotion
    makes the result bigger or wider than the receiver, which then must not be written."""
    return ((a * 1.5).exp() * b + 1).sin()


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_elementwise_chain_reuses_its_intermediates_and_leaves_its_inputs_alone(dtype):
    a, b = torch.randn(4, 5, dtype=dtype), torch.randn(4, 5, dtype=dtype)
    jfn = check_against_eager(chain, a, b, calls=3)
    source = execution_source(jfn)
    # The first call allocates (its operands are the inputs); each later one writes into it but
    # the last, whose result is returned (new memory, at eager's version 0).
    assert in_place_calls(source) == ["mul_", "sin_", "sub_", "exp_"], source
    assert_in_place_only_on_dying_intermediates(source)
    out = jfn(a, b)
    assert out.stride() == chain(a, b).stride()
    assert out._version == chain(a, b)._version


@pytest.mark.parametrize(
    "make",
    [
        lambda: (torch.randn(5, 4).t(), torch.randn(4, 5)),  # non-contiguous receiver source
        lambda: (torch.randn(4, 5), torch.randn(5)),  # broadcast second operand
        lambda: (torch.randn(1, 5), torch.randn(4, 1)),  # both broadcast: the first call grows
        lambda: (torch.randn(()), torch.randn(())),  # 0-d
        lambda: (torch.randn(0, 5), torch.randn(0, 5)),  # empty
        lambda: (torch.randn(4, 5), torch.randn(4, 5, dtype=torch.float64)),  # promotion to float64
        lambda: (torch.randn(4, 5), torch.tensor(2.0, dtype=torch.float64)),  # 0-d tensors do not promote
    ],
    ids=["noncontiguous", "broadcast", "outer", "zero_dim", "empty", "promotion", "zero_dim_f64"],
)
@pytest.mark.parametrize("fn", [chain, grows], ids=["chain", "grows"])
def test_layouts_broadcasts_and_promotion_match_eager(make, fn):
    a, b = make()
    jfn = check_against_eager(fn, a, b)
    out, expected = jfn(a, b), fn(a, b)
    assert out.stride() == expected.stride() and out.dtype == expected.dtype


def test_integer_and_boolean_chains_keep_their_dtypes():
    def fn(i, j):
        k = (i * j + 3) // 2  # int64 throughout: reused
        q = k / 4  # true division makes floats: allocates
        m = (k > 2) & (j < 5)  # bools
        return q.sqrt().neg(), m.logical_not(), (k - 1).abs()

    i, j = torch.arange(12).reshape(3, 4), torch.arange(12, 0, -1).reshape(3, 4)
    check_against_eager(fn, i, j)


def test_values_returned_viewed_or_read_later_are_not_overwritten():
    def fn(x):
        a = x.exp()
        v = a.view(-1)  # a is viewed: never reused
        b = a.sin()
        c = b.cos()  # b is returned: never reused
        d = (c * 2).tanh()
        e = d.neg()
        f = d.sigmoid()  # d read after e: e's call must not reuse it
        return v, b, e + f

    check_against_eager(fn, torch.randn(3, 4))


def test_user_in_place_ops_and_aliases_keep_eager_meaning():
    def fn(x, y):
        a = x.exp()
        a.mul_(2)  # the program's own in-place op on a local
        b = a + 1
        c = b.t()  # a view of b, then b's last use
        d = b.sin()
        return c * 3, d, a

    check_against_eager(fn, torch.randn(4, 4), torch.randn(4, 4))


def test_random_draws_are_eagers():
    def fn(x):
        p = torch.sigmoid(x * 2)
        draws = torch.bernoulli(p)  # Tensor.bernoulli_ means something else: never picked
        return draws * 3 + F.dropout(p.exp(), 0.5)

    x = torch.randn(6, 6)
    jfn = thunder_rs.jit(fn)
    for seed in (0, 1):
        torch.manual_seed(seed)
        expected = fn(x)
        torch.manual_seed(seed)
        assert_same(jfn(x), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_through_reused_forward_and_backward_equal_eager(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8)).to(dtype)

    def fn(x, w):
        h = model(x) * w
        return ((h.sin() + 1) * h.exp()).tanh().sum()

    x = torch.randn(5, 8, dtype=dtype, requires_grad=True)
    w = torch.randn(8, dtype=dtype, requires_grad=True)
    jfn = thunder_rs.jit(fn)
    for _ in range(2):
        grads = torch.autograd.grad(jfn(x, w), [x, w, *model.parameters()])
        expected = torch.autograd.grad(fn(x, w), [x, w, *model.parameters()])
        for g, e in zip(grads, expected):
            torch.testing.assert_close(g, e)
    backward = str(thunder_rs.last_backward_traces(jfn)[-1])
    assert in_place_calls(backward), backward
    assert_in_place_only_on_dying_intermediates(execution_source(jfn) + backward)


def test_grad_mode_on_without_differentiable_outputs_runs_without_autograd_errors():
    """The program path may run with grad on while intermediates require grad (nothing returned
    does): those intermediates are never written in place, so autograd has nothing to refuse."""
    w = torch.randn(4, requires_grad=True)

    def fn(x):
        return ((x * w).exp().sin() > 0.5).sum(), (x + 1).exp().cos()

    check_against_eager(fn, torch.randn(3, 4))


def test_a_module_with_buffers_and_residual_adds_trains_as_eager():
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc = nn.BatchNorm1d(6), nn.Linear(6, 6)

        def forward(self, x):
            return x + F.gelu(self.fc(self.norm(x))) * 0.5

    model, eager = Block(), Block()
    eager.load_state_dict(model.state_dict())
    jmodel = thunder_rs.jit(model)
    for _ in range(3):
        x = torch.randn(8, 6)
        out, expected = jmodel(x), eager(x)
        assert_same(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    torch.testing.assert_close(model.norm.running_mean, eager.norm.running_mean)
    torch.testing.assert_close(model.norm.running_var, eager.norm.running_var)


# -- writes at indices into a buffer ------------------------------------------------------------


def rows_added(h, y, rows):
    """A buffer of zeros with ``y``'s rows added at ``rows`` (cast to the buffer's dtype, as
    eager's ``index_add_`` needs), then its rows doubled and added again in reverse order."""
    out = torch.zeros_like(h)
    out.index_add_(0, rows, y.to(h.dtype))
    out.index_add_(0, rows.flip(0), y.to(h.dtype), alpha=2)
    return out * 1.5


#: (h, y, rows) by case: rows that repeat; a noncontiguous buffer, source and index; a broadcast
#: source; no rows at all; a float64 source cast to the float32 buffer.
ROWS = {
    "repeats": lambda: (torch.randn(6, 4), torch.randn(3, 4), torch.tensor([0, 2, 2])),
    "noncontiguous": lambda: (torch.randn(4, 6).t(), torch.randn(4, 3).t(), torch.arange(6)[1::2]),
    "broadcast": lambda: (torch.randn(6, 4), torch.randn(4).expand(3, 4), torch.tensor([5, 0, 1])),
    "empty": lambda: (torch.randn(6, 4), torch.randn(0, 4), torch.zeros(0, dtype=torch.int64)),
    "cast": lambda: (torch.randn(6, 4), torch.randn(3, 4, dtype=torch.float64), torch.tensor([3, 1, 4])),
}


@pytest.mark.parametrize("case", ROWS)
def test_index_adds_into_a_buffer_of_zeros_run_in_place_with_eagers_values_and_gradients(case):
    h, y, rows = ROWS[case]()
    jfn = check_against_eager(rows_added, h, y, rows)
    source = execution_source(jfn)
    # The product is returned: new memory, at eager's version 0.
    assert in_place_calls(source) == ["index_add_", "index_add_"], source
    assert_in_place_only_on_dying_intermediates(source)
    assert jfn(h, y, rows).stride() == rows_added(h, y, rows).stride()
    assert jfn(h, y, rows)._version == rows_added(h, y, rows)._version
    y = y.detach().requires_grad_()
    weights = torch.randn(h.shape)
    (grad,) = torch.autograd.grad((jfn(h, y, rows) * weights).sum(), y)
    (expected,) = torch.autograd.grad((rows_added(h, y, rows) * weights).sum(), y)
    torch.testing.assert_close(grad, expected)
    assert "index_add_(" in execution_source(jfn)


INDEX_WRITES = [
    # (in-place method generated code calls, the user's write into a buffer of zeros like h (6, 4)).
    ("index_add_", lambda out, y: out.index_add_(1, torch.tensor([3, 0]), y.reshape(6, 2))),
    ("index_copy_", lambda out, y: out.index_copy_(0, torch.tensor([4, 0, 2]), y)),
    ("index_put_", lambda out, y: out.index_put_((torch.tensor([4, 0, 4]),), y, accumulate=True)),
    ("index_put_", lambda out, y: out.index_put_((torch.tensor([1, 5, 2]),), y)),
    ("scatter_add_", lambda out, y: out.scatter_add_(0, torch.tensor([[0, 1, 2, 3], [5, 1, 0, 0]]), y)),
    ("scatter_", lambda out, y: out.scatter_(1, torch.tensor([[3, 0], [1, 2], [0, 1]]), y)),
    ("scatter_reduce_", lambda out, y: out.scatter_reduce_(0, torch.tensor([[2, 2, 0, 1]]), y, "amax")),
]


@pytest.mark.parametrize(
    "method, write",
    INDEX_WRITES,
    ids=["index_add_dim1", "index_copy", "index_put_accumulate", "index_put", "scatter_add", "scatter", "scatter_amax"],
)
def test_writes_at_indices_into_a_fresh_buffer_run_in_place(method, write):
    def fn(h, y):
        out = torch.zeros_like(h)
        write(out, y.exp())
        return out.sum(0), h

    jfn = check_against_eager(fn, torch.randn(6, 4), torch.randn(3, 4))
    source = execution_source(jfn)
    assert method in in_place_calls(source), source
    assert_in_place_only_on_dying_intermediates(source)


def test_a_buffer_read_after_its_index_add_is_not_written():
    def fn(h, y, rows):
        out = torch.zeros_like(h) + 1
        added = out.index_add(0, rows, y)  # out-of-place: out is still read below
        return added * out, h.index_add(0, rows, y)  # h is an input: never written

    h, y, rows = torch.randn(6, 4), torch.randn(3, 4), torch.tensor([0, 2, 2])
    jfn = check_against_eager(fn, h, y, rows)
    assert "index_add_" not in in_place_calls(execution_source(jfn))


class ExpertsLoop(nn.Module):
    """transformers' eager experts loop: each expert runs on the tokens ``torch.where`` routes to
    it, and its rows are added into a buffer of zeros with ``index_add_``, cast back to the
    hidden dtype (the routing weights are ``routing_dtype``). Expert 3's gate bias keeps every
    token away from it: its index is empty."""

    def __init__(self, routing_dtype: torch.dtype, dim: int = 8, experts: int = 4):
        super().__init__()
        self.routing_dtype = routing_dtype
        self.gate = nn.Linear(dim, experts)
        with torch.no_grad():
            self.gate.bias[3] = -1e4
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 16), nn.SiLU(), nn.Linear(16, dim)) for _ in range(experts)
        )

    def forward(self, x):
        h = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(F.softmax(self.gate(h), dim=-1, dtype=self.routing_dtype), 2, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(h)
        mask = F.one_hot(chosen, num_classes=len(self.experts)).permute(2, 1, 0)
        for e, expert in enumerate(self.experts):
            slot, token = torch.where(mask[e])
            y = expert(h[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(h.dtype))
        return out.reshape(x.shape)


@pytest.mark.parametrize("routing_dtype", [torch.float32, torch.float64], ids=["same_dtype", "cast"])
def test_an_experts_loop_trains_as_eager_adding_each_experts_rows_in_place(routing_dtype):
    torch.manual_seed(0)
    batches = [torch.randn(3, 4, 8).transpose(0, 1) for _ in range(3)]  # noncontiguous inputs
    jmodel = train_moe_like_eager(ExpertsLoop(routing_dtype), batches, lr=0.5)
    source = execution_source(jmodel)
    # Expert 3's, with no rows, too; the last one's result is returned (its version set to eager's).
    assert in_place_calls(source).count("index_add_") == 3, source
    backward = str(thunder_rs.last_backward_traces(jmodel)[-1])
    # The gradients of the gathered rows are added into zeros by the prim, whose method takes dim
    # first: the zeros' last use writes into them.
    assert re.search(r"= t\d+\.index_add_\(0, t\d+, t\d+\)", backward), backward
    assert_in_place_only_on_dying_intermediates(source + backward)


#: Out-of-place writes whose eager results are new row-major tensors (ATen's structured kernels),
#: on a buffer (6, 4) of zeros and a source (3, 4): (the in-place method generated code calls, the write).
ROW_MAJOR_WRITES = {
    "index_add": ("index_add_", lambda b, y: b.index_add(0, torch.tensor([4, 0, 4]), y, alpha=2)),
    "index_copy": ("index_copy_", lambda b, y: b.index_copy(0, torch.tensor([4, 0, 2]), y)),
    "index_reduce": ("index_reduce_", lambda b, y: b.index_reduce(0, torch.tensor([1, 1, 3]), y, "amax")),
    "scatter": ("scatter_", lambda b, y: b.scatter(1, torch.tensor([[3, 0], [1, 2], [0, 1]]), y)),
    "scatter_value": ("scatter_", lambda b, y: b.scatter(0, torch.tensor([[2, 1, 0, 5]]), 1.5)),
    "scatter_add": ("scatter_add_", lambda b, y: b.scatter_add(0, torch.tensor([[0, 1, 2, 3], [5, 1, 0, 0]]), y)),
    "scatter_reduce": ("scatter_reduce_", lambda b, y: b.scatter_reduce(0, torch.tensor([[2, 2, 0, 1]]), y, "sum")),
}


@pytest.mark.parametrize("buffer", ["zeros_like", "product"])
@pytest.mark.parametrize("write", ROW_MAJOR_WRITES)
def test_out_of_place_writes_into_a_transposed_buffer_are_row_major_as_eagers(write, buffer):
    """A fresh buffer laid out transposed (``zeros_like`` of a transpose, a product of one): eager's
    out-of-place write copies it into a new row-major tensor; the trace copies it row-major and
    writes into the copy in place, rather than into the buffer in its layout."""
    method, fn = ROW_MAJOR_WRITES[write]

    def program(x, y):
        b = torch.zeros_like(x.t()) if buffer == "zeros_like" else x.t() * 2
        return fn(b, y.exp()).sin()  # (its layout the write's)

    x, y = torch.randn(4, 6), torch.randn(3, 4)
    jfn = check_against_eager(program, x, y)
    assert jfn(x, y).stride() == program(x, y).stride() == (4, 1)
    source = execution_source(jfn)
    assert method in in_place_calls(source), source
    assert_in_place_only_on_dying_intermediates(source)


def test_an_out_of_place_scatter_into_a_channels_last_buffer_is_row_major_as_eagers():
    def program(img, index):
        return (img * 2).scatter(1, index, 1.0), (img + 1).scatter_add(1, index, img[:, :1])

    img = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    index = torch.randint(0, 3, (2, 1, 4, 5))
    jfn = check_against_eager(program, img, index)
    assert [t.stride() for t in jfn(img, index)] == [t.stride() for t in program(img, index)]
