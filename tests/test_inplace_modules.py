"""Modules that write their state in forward (buffer counters, BatchNorm's running statistics,
weights clamped under no_grad), ``inplace=True`` activations, a small CNN trained with AdamW, and
gradients at ties: all against eager PyTorch, over several steps so that state carries over."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thunder_rs
from test_inplace import DTYPES, assert_same, check_against_eager, execution_source


# ----------------------------------------------------------------------------- modules


def check_module_against_eager(module, make_inputs, steps: int = 3, train: bool = True, lr: float = 1e-3):
    """Runs ``module`` under thunder_rs.jit and a deep copy eagerly for ``steps`` steps (forward,
    backward of a loss, AdamW step when ``train``): outputs, input gradients, parameter values and
    gradients, and buffers must match after each step. (The loss gives no parameter a gradient of
    exactly zero, which AdamW would turn into steps of +-lr from rounding noise.)"""
    eager = copy.deepcopy(module)
    jmodule = thunder_rs.jit(module)
    sides = [(jmodule, module), (eager, eager)]
    train = train and any(True for _ in module.parameters())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=lr) for _, m in sides] if train else None
    for step in range(steps):
        inputs = make_inputs(step)
        results = []
        for i, (call, owner) in enumerate(sides):
            args = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
            out = call(*args)
            if train:
                optimizers[i].zero_grad(set_to_none=True)
            if out.requires_grad:
                out.float().sin().mean().backward()
            results.append((out, args))
        (out_jit, args_jit), (out_eager, args_eager) = results
        torch.testing.assert_close(out_jit, out_eager, rtol=1e-4, atol=1e-5)
        for a, b in zip(args_jit, args_eager):
            if b.grad is not None:
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
        for (name, p), q in zip(module.named_parameters(), eager.parameters()):
            if train:
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
        for (name, b), c in zip(module.named_buffers(), eager.buffers()):
            torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
        if train:
            for opt in optimizers:
                opt.step()
    return jmodule


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("n", torch.zeros((), dtype=torch.long))
        self.register_buffer("total", torch.zeros(4))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.n += 1
        self.total.add_(x.detach().sum(0))
        self.calls = self.calls + 1  # nn.Module.__setattr__ stores it in _buffers
        return self.lin(x) * self.n + self.calls


def test_buffer_counters():
    jmodule = check_module_against_eager(Counter(), lambda step: [torch.randn(3, 4)])
    assert thunder_rs.cache_misses(jmodule) == 1


def test_buffer_counter_forward_only():
    module = Counter()
    eager = copy.deepcopy(module)
    jmodule = thunder_rs.jit(module)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, 4)
            assert_same(jmodule(x), eager(x))
    for b, c in zip(module.buffers(), eager.buffers()):
        assert_same(b, c)


class Clipped(nn.Module):
    """Clamps its weight in forward under no_grad (as weight clipping does)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.clamp_(-0.2, 0.2)
        return self.lin(x)


def test_parameter_written_under_no_grad_in_forward():
    check_module_against_eager(Clipped(), lambda step: [torch.randn(5, 4)])


@pytest.mark.parametrize("between", ["second_call", "optimizer_step"])
def test_a_weight_written_in_forward_and_written_again_before_the_backward_raises_as_eager(between):
    """The clamped weight a call saves for its backward (the input's gradient reads it) is the
    parameter itself in eager: written again before the backward (by another call's clamp, by an
    optimizer step), eager's backward raises, and so does the compiled call's."""
    torch.manual_seed(0)
    module = Clipped()
    eager = copy.deepcopy(module)
    errors = []
    for call, owner in ((thunder_rs.jit(module), module), (eager, eager)):
        x = torch.randn(5, 4, requires_grad=True)
        out = call(x)
        if between == "second_call":
            call(x)
        else:
            owner.lin.weight.grad = torch.ones_like(owner.lin.weight)  # (a previous step's)
            torch.optim.SGD(owner.parameters(), lr=0.1).step()
        with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
            out.sum().backward()
        errors.append(info.value)
    assert len(errors) == 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.BatchNorm1d(3),
        lambda: nn.BatchNorm1d(3, momentum=None),
        lambda: nn.BatchNorm2d(3),
        lambda: nn.BatchNorm2d(3, affine=False),
        lambda: nn.BatchNorm2d(3, track_running_stats=False),
        lambda: nn.BatchNorm2d(3, momentum=None),
        lambda: nn.BatchNorm3d(2, momentum=0.3),
    ],
    ids=["1d", "1d_cumulative", "2d", "2d_no_affine", "2d_no_running_stats", "2d_cumulative", "3d"],
)
def test_batch_norm_train_and_eval(make, dtype):
    module = make().to(dtype)
    shape = {nn.BatchNorm1d: (8, 3), nn.BatchNorm2d: (4, 3, 5, 5), nn.BatchNorm3d: (2, 2, 3, 4, 5)}[type(module)]

    def inputs(step):
        return [(torch.randn(shape, dtype=dtype) * (step + 1) + step).requires_grad_()]

    jmodule = check_module_against_eager(module, inputs)
    module.eval()
    check_module_against_eager(module, inputs, steps=2)
    eager = copy.deepcopy(module)
    with torch.no_grad():
        x = torch.randn(shape, dtype=dtype)
        torch.testing.assert_close(jmodule(x), eager(x))
    if module.track_running_stats:
        assert int(module.num_batches_tracked) == 3


@pytest.mark.parametrize("params", [torch.bfloat16, torch.float32], ids=["bf16_module", "mixed"])
@pytest.mark.parametrize("momentum", [None, 0.1], ids=["cumulative", "momentum"])
def test_bfloat16_batch_norm_trains_as_eager_on_the_cpu(momentum, params):
    """A bfloat16 batch norm's saved statistics are bfloat16 on the CPU (float32 with float32
    parameters), as its backward kernel requires: the cumulative average (a tensor momentum, which
    runs the decomposition) failed in the backward with float32 statistics."""
    torch.manual_seed(0)
    module = nn.BatchNorm2d(3, momentum=momentum).to(params)
    eager = copy.deepcopy(module)
    jmodule = thunder_rs.jit(module)
    for n in (4, 5, 6):
        x = torch.randn(n, 3, 4, 4, dtype=torch.bfloat16)
        out, expected = jmodule(x), eager(x)
        torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
        g = torch.randn(x.shape)  # (a loss whose gradients do not cancel to bfloat16's noise)
        (out.float() * g).sum().backward()
        (expected.float() * g).sum().backward()
        for p, q in zip(module.parameters(), eager.parameters()):
            assert p.grad.dtype == q.grad.dtype
            torch.testing.assert_close(p.grad, q.grad, atol=5e-2, rtol=2e-2)
        for b, c in zip(module.buffers(), eager.buffers()):
            assert b.dtype == c.dtype
            torch.testing.assert_close(b, c, atol=2e-2, rtol=2e-2)


def test_batch_norm_functional_forms():
    def fn(x, mean, var, weight, bias):
        a = F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.2)
        b = F.batch_norm(x, mean, var, training=False)
        c = F.batch_norm(x, None, None, weight, training=True)
        return a, b, c

    check_against_eager(fn, torch.randn(6, 3, 4), torch.zeros(3), torch.ones(3), torch.rand(3), torch.randn(3))


def test_batch_norm_updates_strided_running_stats_as_eager(one_thread):
    """Running statistics every other element of a buffer: eager's CPU kernel normalises them by
    another path (rounding otherwise than for contiguous ones); outputs, gradients and the
    buffer, its other elements untouched, are eager's to the bit."""

    def fn(x, weight, bias, buffer):
        return F.batch_norm(x, buffer[0::2], buffer[1::2], weight, bias, training=True, momentum=0.3)

    torch.manual_seed(0)
    x, weight, bias = torch.randn(8, 5, 7) * 3 + 1, torch.randn(5), torch.randn(5)
    sides = []
    for call in (fn, thunder_rs.jit(fn)):
        args = [t.clone().requires_grad_() for t in (x, weight, bias)]
        buffer = torch.stack([torch.randn(5, generator=torch.Generator().manual_seed(1)), torch.ones(5)], 1).view(-1)
        out = call(*args, buffer)
        out.sin().sum().backward()
        sides.append((out, buffer, [a.grad for a in args]))
    (out, buffer, grads), (jout, jbuffer, jgrads) = sides
    assert torch.equal(out, jout) and torch.equal(buffer, jbuffer)
    for g, jg in zip(grads, jgrads):
        torch.testing.assert_close(jg, g)


def test_batch_norm_with_expanded_running_stats():
    """``zeros(1).expand(C)`` as running statistics: normalising by them (eval) is eager's; in
    training eager updates every channel into the one element in turn (in an order that depends
    on its threads), which is refused naming the argument and the line, before any state changes."""

    def fn(x, mean, var, training):
        return F.batch_norm(x, mean, var, training=training)

    x, mean, var = torch.randn(4, 3, 5), torch.full((1,), 0.5).expand(3), torch.full((1,), 2.0).expand(3)
    assert torch.equal(thunder_rs.jit(fn)(x, mean, var, False), fn(x, mean, var, False))
    with pytest.raises(NotImplementedError, match=r"running_mean, whose channels share memory .*test_inplace_modules"):
        thunder_rs.jit(fn)(x, mean, var, True)
    assert mean.tolist() == [0.5] * 3 and var.tolist() == [2.0] * 3


@pytest.mark.parametrize("write", [lambda t: t.fill_(2.0), lambda t: t.__setitem__(0, 5.0), lambda t: t.add_(1)])
def test_a_write_into_an_expanded_input_is_refused_before_anything_is_written(write):
    """eager writes some (``fill_``, ``t[0] = v``: the one element) and refuses others (``add_``);
    the trace's value of the input has an element per index, which cannot be copied back into the
    shared element as eager wrote it: refused while tracing, the other input not yet written."""

    def fn(other, t):
        other.add_(1)
        write(t)
        return t * 2

    other, t = torch.zeros(2), torch.ones(1).expand(3)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        thunder_rs.jit(fn)(other, t)
    assert other.tolist() == [0.0, 0.0] and t.tolist() == [1.0] * 3


def test_batch_norm_with_one_value_per_channel_is_eagers_error():
    bn = nn.BatchNorm1d(3)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn(torch.randn(1, 3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        thunder_rs.jit(bn)(torch.randn(1, 3))


ACTIVATIONS = [
    lambda: nn.ReLU(inplace=True),
    lambda: nn.ReLU6(inplace=True),
    lambda: nn.SiLU(inplace=True),
    lambda: nn.Hardtanh(-0.3, 0.4, inplace=True),
    lambda: nn.ELU(inplace=True),
    lambda: nn.LeakyReLU(0.1, inplace=True),
    lambda: nn.Threshold(0.1, -1.0, inplace=True),
    lambda: nn.Dropout(0.0, inplace=True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "make", ACTIVATIONS, ids=["relu", "relu6", "silu", "hardtanh", "elu", "leaky_relu", "threshold", "dropout"]
)
def test_inplace_activation_after_linear(make, dtype):
    """The activation's input is the Linear's output, which its backward needs: computed out of
    place, the gradients are eager's (overwriting it in place gave gradients off by up to 0.6)."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 8), make(), nn.Linear(8, 3)).to(dtype)
    jmodule = check_module_against_eager(module, lambda step: [torch.randn(5, 6, dtype=dtype).requires_grad_()])
    source = execution_source(jmodule) + str(thunder_rs.last_backward_traces(jmodule)[-1])
    assert "inplace=True" not in source
    assert_in_place_only_on_dying_intermediates(source)


_IN_PLACE_CALL = re.compile(r"^  (t\d+) = (t\d+)\.\w+_\(", re.M)


def assert_in_place_only_on_dying_intermediates(source: str) -> None:
    """The only in-place calls in generated code are the buffer reuse of intermediates (which the
    trace computed itself and deletes right after): never on a function's parameters (inputs,
    parameters, saved residuals) or on values read later."""
    params = set(re.findall(r"\b(t\d+)\b", " ".join(re.findall(r"^def \w+\((.*)\):$", source, re.M))))
    params |= set(re.findall(r"\b(t\d+)\b", " ".join(re.findall(r"^  (.*) = saved$", source, re.M))))
    lines = source.splitlines()
    for i, line in enumerate(lines):
        match = _IN_PLACE_CALL.match(line)
        if match is None:
            continue
        receiver = match.group(2)
        assert receiver not in params, line
        assert re.match(rf"^  del .*\b{receiver}\b", lines[i + 1]), (line, lines[i + 1])


def test_no_executor_call_is_in_place():
    def fn(x):
        y = F.relu(x, inplace=True)
        y.mul_(2)
        y[0] = 1
        torch.sigmoid_(y)
        return y

    jfn = check_against_eager(fn, torch.randn(3, 4))
    for trace in thunder_rs.last_traces(jfn)[:-1]:
        text = str(trace)
        assert "inplace=True" not in text
        assert not re.search(r"\w_\(", text.replace("__", "")), text
    assert_in_place_only_on_dying_intermediates(str(thunder_rs.last_traces(jfn)[-1]))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def test_small_cnn_trains_like_eager():
    torch.manual_seed(0)
    module = SmallCNN()
    jmodule = check_module_against_eager(module, lambda step: [torch.randn(4, 3, 16, 16)], steps=4)
    assert thunder_rs.cache_misses(jmodule) == 1
    module.eval()
    eager = copy.deepcopy(module)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(jmodule(x), eager(x))


# ----------------------------------------------------------------------------- gradients at ties

#: Values at and around the thresholds of the activations below (0, +-1, 0.5, 6), no NaN: eager's
#: own gradient at NaN differs between float32 and float64 for hardtanh, relu6 and elu.
TIES = [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 6.0, 7.0, 0.0]
TIE_OPS = [
    ("relu", F.relu),
    ("relu6", F.relu6),
    ("hardtanh", lambda x: F.hardtanh(x, -1.0, 1.0)),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2)),
    ("elu", F.elu),
    ("threshold", lambda x: F.threshold(x, 0.5, -3.0)),
    ("clamp", lambda x: x.clamp(-1.0, 1.0)),
    ("clamp_min", lambda x: x.clamp_min(0.5)),
    ("clamp_max", lambda x: torch.clamp_max(x, 0.5)),
    ("clamp_int_bounds", lambda x: x.clamp(0, 6)),
    ("clamp_tensor", lambda x: x.clamp(torch.full_like(x, -1.0), torch.full_like(x, 1.0))),
    ("clamp_min_tensor", lambda x: x.clamp(min=torch.zeros_like(x))),
    ("maximum", lambda x: torch.maximum(x, torch.zeros_like(x))),
    ("minimum", lambda x: torch.minimum(x, torch.ones_like(x))),
    ("relu_inplace", lambda x: F.relu(x * 1, inplace=True)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", [f for _, f in TIE_OPS], ids=[n for n, _ in TIE_OPS])
def test_gradient_at_ties_is_eagers(op, dtype):
    grads = []
    for fn in (op, thunder_rs.jit(op)):
        x = torch.tensor(TIES, dtype=dtype, requires_grad=True)
        (fn(x) * torch.arange(1.0, 11.0, dtype=dtype)).sum().backward()
        grads.append(x.grad)
    assert_same(grads[1], grads[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_clamp_bound_gradients_with_ties_and_nan(dtype):
    """Tensor bounds get eager's gradients too: ties split, NaN operands, min > max."""
    nan = float("nan")
    x = torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.0, nan, 0.5, 3.0, nan], dtype=dtype)
    low = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, nan, 0.5], dtype=dtype)
    high = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5], dtype=dtype)
    cotangent = torch.arange(1.0, 10.0, dtype=dtype)
    results = []
    for fn in (torch.clamp, thunder_rs.jit(torch.clamp)):
        leaves = [t.clone().requires_grad_() for t in (x, low, high)]
        out = fn(*leaves)
        (out * cotangent).sum().backward()
        results.append((out, *[t.grad for t in leaves]))
    assert_same(results[1], results[0])
    for fn in (torch.maximum, torch.minimum):
        results = []
        for f in (fn, thunder_rs.jit(fn)):
            leaves = [t.clone().requires_grad_() for t in (x, low)]
            (f(*leaves) * cotangent).sum().backward()
            results.append([t.grad for t in leaves])
        assert_same(results[1], results[0])


class DataClipped(nn.Module):
    """Clips its weight through ``.data`` in forward, with grad mode on: autograd does not see it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        self.lin.weight.data.clamp_(-0.2, 0.2)
        self.lin.bias.detach().mul_(0.5)
        return self.lin(x)


def test_parameter_written_through_data_and_detach():
    check_module_against_eager(DataClipped(), lambda step: [torch.randn(5, 4)])


def test_local_written_under_no_grad_keeps_its_history():
    def fn(x):
        h = x * 2
        with torch.no_grad():
            h.add_(1)
            h[0] = 5.0
        return (h * h).sum()

    x_eager = torch.randn(4, requires_grad=True)
    x_jit = x_eager.detach().clone().requires_grad_()
    fn(x_eager).backward()
    thunder_rs.jit(fn)(x_jit).backward()
    assert_same(x_jit.grad, x_eager.grad)


def test_torchvision_resnet18_trains_like_eager():
    """BatchNorm2d and ReLU(inplace=True) throughout: losses, every gradient and every running
    statistic equal eager's over AdamW steps."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    module = torchvision.models.resnet18(num_classes=10)
    targets = torch.randint(0, 10, (2, 2))
    eager = copy.deepcopy(module)
    jmodule = thunder_rs.jit(module)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (module, eager)]
    for step in range(2):
        x = torch.randn(2, 3, 16, 16)
        losses = []
        for fn, opt in zip((jmodule, eager), optimizers):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(fn(x), targets[step])
            loss.backward()
            losses.append(loss)
        torch.testing.assert_close(losses[0], losses[1])
        for (name, p), q in zip(module.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
        for (name, b), c in zip(module.named_buffers(), eager.buffers()):
            torch.testing.assert_close(b, c, msg=lambda m: f"{name}: {m}")
        for opt in optimizers:
            opt.step()
    assert thunder_rs.cache_misses(jmodule) == 1


@pytest.mark.parametrize(
    "overwrite",
    [
        lambda y: y.fill_(2.0),
        lambda y: y.zero_(),
        lambda y: y.copy_(torch.ones(3)),
        lambda y: y.__setitem__(slice(None), 2.0),
        lambda y: y.__setitem__(Ellipsis, 3.0),
    ],
    ids=["fill_", "zero_", "copy_", "full_slice", "ellipsis"],
)
def test_a_tensor_overwritten_whole_keeps_its_history_with_a_zero_gradient(overwrite):
    # Eager's in-place copy leaves the tensor requiring grad; its inputs get a zero gradient,
    # which an optimizer with weight decay treats otherwise than no gradient.
    def program(x):
        y = x * 1
        overwrite(y)
        return y

    x = torch.randn(3, requires_grad=True)
    out, expected = thunder_rs.jit(program)(x), program(x)
    assert out.requires_grad == expected.requires_grad
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x), torch.autograd.grad(expected.sum(), x))
