"""``torch.compile(backend="thunder_rs")`` against eager where ``thunder_rs.jit`` was made faithful:
grad modes and inference mode around and inside the compiled call, autocast, hooks and buffers
written in forward, requires_grad changing between calls, graph breaks on data-dependent values,
automatic dynamic and ``mark_dynamic`` sizes, activation checkpointing, custom autograd Functions,
and training steps with an optimizer."""

import contextlib
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import thunder_rs
from thunder_rs.dynamo import compiled_graphs
from test_dynamo_backend import _earlier, compiled_by_thunder_rs, fresh_dynamo, padded_to  # noqa: F401 (a fixture)
from test_hf_models import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = dict(rtol=1e-4, atol=1e-5)
EXACT = dict(rtol=0, atol=0)


def matmul_sin(x, w):
    return (x @ w).sin().sum(1)


def made_under_inference_mode_then_saved(x, w):
    with torch.inference_mode():
        y = x * 2
    return y @ w  # eager: "Inference tensors cannot be saved for backward" where w requires grad


def test_eagers_own_error_met_while_tracing_is_eagers_error_and_the_graph_stays_compiled():
    # thunder_rs's trace raises eager's error first (a ThunderRuntimeError): the graph was switched
    # to eager for good with a warning that thunder_rs could not compile it, and eager's error
    # came chained to thunder_rs's.
    compiled = torch.compile(made_under_inference_mode_then_saved, backend="thunder_rs")
    x, w = torch.randn(2, 2), torch.randn(2, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward") as eager_error:
        made_under_inference_mode_then_saved(x, w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward") as error:
            compiled(x, w)
    assert type(error.value) is type(eager_error.value)
    assert not isinstance(error.value.__context__, thunder_rs.errors.ThunderError)
    graphs = [g for g in compiled_graphs() if g not in _earlier]
    assert graphs and all(g.jitted is not None and g.eager_because is None for g in graphs)


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_a_grad_mode_around_the_call_between_calls_under_grad(mode):
    compiled = torch.compile(matmul_sin, backend="thunder_rs")
    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    for context in (contextlib.nullcontext, getattr(torch, mode), contextlib.nullcontext):
        with context():
            out, expected = compiled(x, w), matmul_sin(x, w)
        torch.testing.assert_close(out, expected, **EXACT)
        assert (out.requires_grad, out.is_inference()) == (expected.requires_grad, expected.is_inference())
    grad = torch.autograd.grad(out.sum(), w)
    torch.testing.assert_close(grad, torch.autograd.grad(expected.sum(), w), **EXACT)
    assert len(compiled_by_thunder_rs()) == 2  # Dynamo guards on the mode: one graph per mode


def test_requires_grad_inputs_then_without_then_with():
    compiled = torch.compile(matmul_sin, backend="thunder_rs")
    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    for weight in (w, w.detach(), w):
        out, expected = compiled(x, weight), matmul_sin(x, weight)
        torch.testing.assert_close(out, expected, **EXACT)
        assert (out.requires_grad, out.grad_fn is None) == (expected.requires_grad, expected.grad_fn is None)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), w), torch.autograd.grad(expected.sum(), w), **EXACT)


def test_autocast_bf16_around_the_call_is_eagers_to_the_bit():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)

    def program(x):
        return (lin(x).relu() @ lin.weight).softmax(-1)

    x = torch.randn(4, 8, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, expected = torch.compile(program, backend="thunder_rs")(x), program(x_ref)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, **EXACT)
    out.float().sum().backward()
    expected.float().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, **EXACT)
    assert compiled_by_thunder_rs()


class HooksAndBuffers(torch.nn.Module):
    """Registers a tensor hook in forward and writes its buffers there (a count, a running mean)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("mean", torch.zeros(4))

    def forward(self, x):
        y = self.lin(x)
        y.register_hook(lambda g: g * 2)
        self.calls += 1
        self.mean.mul_(0.5).add_(y.detach().mean(0), alpha=0.5)
        return (y.relu() * self.calls).sum()


def test_hooks_registered_and_buffers_written_in_forward_as_eager():
    torch.manual_seed(0)
    model = HooksAndBuffers()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="thunder_rs")
    for step in range(3):
        x = torch.randn(3, 4)
        out, expected = compiled(x), eager(x)
        torch.testing.assert_close(out, expected, **TOL)
        out.backward()
        expected.backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m: f"step {step} grad of {name}: {m}")
        for (name, b), c in zip(model.named_buffers(), eager.buffers(), strict=True):
            torch.testing.assert_close(b, c, **TOL, msg=lambda m: f"step {step} buffer {name}: {m}")
    assert compiled_by_thunder_rs()


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_batch_norm_running_stats_under_a_mode_around_the_call(mode):
    # (momentum=None's cumulative average reads float(num_batches_tracked), which Dynamo runs the
    # whole frame eagerly for, whichever the backend.)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="thunder_rs")
    for step in range(3):
        x = torch.randn(5, 4)
        with getattr(torch, mode)():
            out, expected = compiled(x), eager(x)
        torch.testing.assert_close(out, expected, **EXACT)
        assert out.is_inference() == expected.is_inference()
        for (name, b), c in zip(model.named_buffers(), eager.buffers(), strict=True):
            torch.testing.assert_close(b, c, **EXACT, msg=lambda m: f"step {step} buffer {name}: {m}")
    assert compiled_by_thunder_rs()


def branch_on_item(x, w):
    y = (x @ w).tanh()
    if y.sum().item() > 0:
        return (y * 2).exp()
    return y.sin() * x.sum()


def select_positive(x, w):
    y = x @ w
    return (y[y > 0].exp().sum() + torch.nonzero(y > 0).shape[0]) * w.sum()


@pytest.mark.parametrize("captured", [False, True], ids=["graph_breaks", "captured_in_the_graph"])
@pytest.mark.parametrize("program", [branch_on_item, select_positive])
def test_data_dependent_values_and_sizes_with_gradients_across_the_break(program, captured):
    config = dict(capture_scalar_outputs=captured, capture_dynamic_output_shape_ops=captured)
    with torch._dynamo.config.patch(**config):
        compiled = torch.compile(program, backend="thunder_rs")
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            x, w = torch.randn(3, 4, generator=g), torch.randn(4, 4, generator=g)
            a, b = (x.clone().requires_grad_(), w.clone().requires_grad_()), (x.requires_grad_(), w.requires_grad_())
            out, expected = compiled(*a), program(*b)
            torch.testing.assert_close(out, expected)
            torch.testing.assert_close(torch.autograd.grad(out.sum(), a), torch.autograd.grad(expected.sum(), b))
    assert compiled_by_thunder_rs()


def test_automatic_dynamic_over_five_lengths_is_two_dynamo_graphs_each_compiled_once():
    counters.clear()
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    eager = copy.deepcopy(layer)
    compiled = torch.compile(layer, backend="thunder_rs")
    for length in (4, 6, 9, 12, 5):
        x = torch.randn(2, length, 16)
        out, expected = compiled(x), eager(x)
        torch.testing.assert_close(out, expected, **TOL)
        out.sum().backward()
        expected.sum().backward()
    for (name, p), q in zip(layer.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m: f"grad of {name}: {m}")
    # Dynamo: the first length's static graph, then at the second one dynamic graph for the rest.
    assert counters["stats"]["unique_graphs"] == 2
    assert [thunder_rs.cache_misses(g.jitted) for g in compiled_by_thunder_rs()] == [1, 1]


def test_mark_dynamic_compiles_once_for_every_size():
    def program(x, w):
        return (x @ w).softmax(-1).reshape(-1).cumsum(0)[-1] * x.shape[0]

    compiled = torch.compile(program, backend="thunder_rs")
    w = torch.randn(4, 4, requires_grad=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 4)
        torch._dynamo.mark_dynamic(x, 0)
        out, expected = compiled(x, w), program(x, w)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(torch.autograd.grad(out, w), torch.autograd.grad(expected, w))
    assert [thunder_rs.cache_misses(g.jitted) for g in compiled_by_thunder_rs()] == [1]


def checkpointed_dropout(x, lin1, lin2):
    def block(x):
        return lin2(F.dropout(lin1(x), 0.5, training=True)).sin()

    return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).sum()


def test_a_checkpointed_region_recomputes_eagers_random_draws_and_is_compiled():
    # Dynamo hands the region as tag_activation_checkpoint, whose implementation runs it with
    # preserve_rng_state=False: the backward's dropout mask was another than the forward's (other
    # gradients than eager's; so with backend="eager" too), and thunder_rs refused the graph.
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)
    x = torch.randn(3, 4)
    results = []
    for program in (torch.compile(checkpointed_dropout, backend="thunder_rs"), checkpointed_dropout):
        torch.manual_seed(1)
        out = program(x, lin1, lin2)
        results.append((out, torch.autograd.grad(out, (lin1.weight, lin2.weight))))
    torch.testing.assert_close(results[0], results[1], **EXACT)
    assert len(compiled_by_thunder_rs()) == 1


class ScaledExp(torch.autograd.Function):
    """A forward saving a tensor, stashing another and a number on ctx, with an output marked
    non-differentiable, and a backward other than the true gradient (so that it is the one run)."""

    @staticmethod
    def forward(ctx, x, w, k):
        ctx.k, ctx.x = k, x
        ctx.save_for_backward(w)
        y = x * w * k
        index = y.argmax(-1)
        ctx.mark_non_differentiable(index)
        return y.exp(), index

    @staticmethod
    def backward(ctx, grad, grad_index):
        (w,) = ctx.saved_tensors
        return grad * w * ctx.k * 2, (grad * ctx.x).sum(0), None


class SineWithSetupContext(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.cos() + 1


def with_functions(x, w):
    y, index = ScaledExp.apply(x, w, 1.5)
    return y.sum(1) + index.sum() + SineWithSetupContext.apply(w).sum()


@pytest.mark.parametrize("x_requires_grad", [True, False])
def test_custom_autograd_functions_are_compiled_and_run_their_backward(x_requires_grad):
    # Dynamo hands them as autograd_function_apply, which thunder_rs refused (its saved values are
    # kept in a closure): the whole graph ran eagerly.
    x, w = torch.randn(3, 4, requires_grad=x_requires_grad), torch.randn(4, requires_grad=True)
    inputs = [t for t in (x, w) if t.requires_grad]
    out, expected = torch.compile(with_functions, backend="thunder_rs")(x, w), with_functions(x, w)
    torch.testing.assert_close(out, expected, **EXACT)
    grads = torch.autograd.grad(out.sum(), inputs)
    torch.testing.assert_close(grads, torch.autograd.grad(expected.sum(), inputs), **EXACT)
    assert len(compiled_by_thunder_rs()) == 1


def train_three_steps(model, batches, loss_of, optimizer=torch.optim.AdamW, tol=TOL) -> None:
    """Three optimizer steps of ``model`` compiled and of an eager copy: losses, gradients,
    parameters, optimizer state and buffers equal at every step (dropout seeded alike)."""
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="thunder_rs")
    opt, eager_opt = optimizer(model.parameters(), lr=1e-3), optimizer(eager.parameters(), lr=1e-3)
    for step, batch in enumerate(batches):
        torch.manual_seed(step)
        loss = loss_of(compiled, batch)
        torch.manual_seed(step)
        expected = loss_of(eager, batch)
        torch.testing.assert_close(loss, expected, **tol)
        loss.backward()
        expected.backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda m: f"step {step} grad of {name}: {m}")
        opt.step()
        eager_opt.step()
        opt.zero_grad()
        eager_opt.zero_grad()
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p, q, **tol, msg=lambda m: f"step {step} {name}: {m}")
            for key, value in eager_opt.state[q].items():
                torch.testing.assert_close(opt.state[p][key], value, **tol, msg=lambda m: f"{key} of {name}: {m}")
        for (name, b), c in zip(model.named_buffers(), eager.buffers(), strict=True):
            torch.testing.assert_close(b, c, **tol, msg=lambda m: f"step {step} buffer {name}: {m}")
    assert compiled_by_thunder_rs()


@pytest.mark.slow  # ~30 s each on 2 shared cores, most of it Dynamo; the tests above are the quick ones
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hugging_face_training_three_adamw_steps_equals_eager(name):
    batches = [padded_to(8, seed) for seed in range(3)]
    train_three_steps(tiny_model(name).train(), batches, lambda model, batch: model(**batch).loss)


@pytest.mark.slow  # ~30 s on 2 shared cores
def test_torchvision_resnet_three_sgd_steps_equals_eager_with_running_stats():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).train()
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g)) for _ in range(3)]
    train_three_steps(model, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1]), optimizer=torch.optim.SGD)
