"""CNN training with BatchNorm under thunder_rs.jit, equal to eager: a ResNet-18 written with
``nn.Conv2d``, ``nn.BatchNorm2d``, ``nn.ReLU(inplace=True)``, ``nn.MaxPool2d`` and
``nn.AdaptiveAvgPool2d``, and torchvision's own ``resnet18(weights=None)``.

A train-mode step compares the loss, the logits, every parameter's gradient, the BatchNorm running
statistics and ``num_batches_tracked``, and the parameters after an AdamW step. Inputs are small
(2x3x32x32) so the tests stay fast.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thunder_rs

torchvision = pytest.importorskip("torchvision")

TOL = dict(rtol=1e-4, atol=1e-5)
LR = 1e-3


pytestmark = pytest.mark.usefixtures("one_thread")


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, inplace: bool = True, track_running_stats: bool = True):
        super().__init__()
        norm = lambda c: nn.BatchNorm2d(c, track_running_stats=track_running_stats)  # noqa: E731
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = norm(cout)
        self.relu = nn.ReLU(inplace=inplace)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = norm(cout)
        self.inplace = inplace
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.inplace:
            out += identity
        else:
            out = out + identity
        return self.relu(out)


class ResNet18(nn.Module):
    """torchvision's ResNet-18 layout (four stages of two basic blocks), ``width`` channels in the
    first stage."""

    def __init__(self, width: int = 16, num_classes: int = 10, inplace: bool = True, track_running_stats: bool = True):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width, track_running_stats=track_running_stats)
        self.relu = nn.ReLU(inplace=inplace)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], width
        for i, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
            stride = 1 if i == 0 else 2
            stages.append(
                nn.Sequential(
                    BasicBlock(cin, cout, stride, inplace, track_running_stats),
                    BasicBlock(cout, cout, 1, inplace, track_running_stats),
                )
            )
            cin = cout
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.avgpool(self.layers(x)), 1))


def images(seed: int, dtype: torch.dtype = torch.float32, batch: int = 2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, 32, 32, generator=g).to(dtype), torch.randint(0, 10, (batch,), generator=g)


def train_steps(model: nn.Module, steps: int, batch: int = 2, **options) -> nn.Module:
    """``steps`` AdamW steps of ``model`` under thunder_rs.jit next to an eager copy; compares
    logits, loss, gradients, buffers (running statistics) and parameters after each."""
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model, **options)
    dtype = next(model.parameters()).dtype
    optimizers = [torch.optim.AdamW(m.parameters(), lr=LR) for m in (model, eager)]
    for step in range(steps):
        x, target = images(step, dtype, batch)
        outs = []
        for fn, m, opt in ((jmodel, model, optimizers[0]), (eager, eager, optimizers[1])):
            opt.zero_grad(set_to_none=True)
            logits = fn(x)
            loss = F.cross_entropy(logits, target)
            loss.backward()
            outs.append((logits.detach(), loss.detach()))
        torch.testing.assert_close(outs[0], outs[1], **TOL)
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m: f"step {step} grad of {name}: {m}")
        for (name, b), c in zip(model.named_buffers(), eager.buffers(), strict=True):
            torch.testing.assert_close(b, c, **TOL, msg=lambda m: f"step {step} buffer {name}: {m}")
        for opt in optimizers:
            opt.step()
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p, q, **TOL, msg=lambda m: f"step {step} {name}: {m}")
    return jmodel


def test_resnet18_train_steps_match_eager_including_running_stats():
    torch.manual_seed(0)
    train_steps(ResNet18().train(), steps=2)


def test_torchvision_resnet18_train_step_matches_eager():
    torch.manual_seed(0)
    train_steps(torchvision.models.resnet18(weights=None, num_classes=10).train(), steps=1)


@pytest.mark.slow
@pytest.mark.inductor
def test_torchvision_resnet18_train_steps_with_inductor_match_eager_in_float64():
    """Inductor's batch norm sums in another order than aten's. Over a batch of two, the deepest
    layers' statistics cover 2 x 1 x 1 values, and their backward scales gradients by up to
    1/sqrt(eps): the first layer's gradient reaches 3e3, and float32's rounding becomes
    differences of 1e-3 in the logits, as under torch.compile. A batch of eight in float64 is
    well conditioned: gradients agree with eager to 1e-13, as torch.compile's do."""
    torch.manual_seed(0)
    train_steps(
        torchvision.models.resnet18(weights=None, num_classes=10).double().train(),
        steps=2,
        batch=8,
        executors=["inductor"],
    )


def test_torchvision_mobilenet_v3_gradients_match_eager_in_float64():
    """Squeeze-excitation gates (hardsigmoid), hardswish, depthwise convolutions, batch norm with
    eps 1e-3 and dropout: float64 gradients as eager's to 1e-10 (hardsigmoid's once differed by
    3e-8, eager multiplying by a float32 1/6)."""
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(num_classes=10).double().train()
    eager = copy.deepcopy(model)
    x, target = images(0, torch.float64, batch=4)
    losses = []
    for fn in (thunder_rs.jit(model), eager):
        torch.manual_seed(1)  # the classifier's dropout draws the same mask
        losses.append(F.cross_entropy(fn(x), target))
        losses[-1].backward()
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-12, atol=0)
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=lambda m: f"grad of {name}: {m}")


def test_resnet18_eval_matches_eager():
    torch.manual_seed(0)
    model = ResNet18().eval()
    x, _ = images(0)
    with torch.no_grad():
        torch.testing.assert_close(thunder_rs.jit(model)(x), model(x), **TOL)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_resnet18_without_inplace_ops_matches_eager(mode):
    """The same network with out-of-place residual adds and ReLUs; BatchNorm normalises with the
    batch's statistics in train mode (no running statistics, so nothing is updated in place) and
    with its running statistics in eval mode. Convolutions, batch norm and pooling are native
    symbols: nothing falls back to eager."""
    torch.manual_seed(0)
    model = ResNet18(inplace=False, track_running_stats=mode == "eval")
    getattr(model, mode)()
    jmodel = train_steps(model, steps=2)
    assert (thunder_rs.cache_misses(jmodel), thunder_rs.cache_hits(jmodel)) == (1, 1)
    assert thunder_rs.examine(model, images(0)[0]).fallbacks == {}


def test_batch_norm_updates_running_stats_once():
    def f(x, mean, var, weight):
        return F.batch_norm(x, mean, var, weight, None, training=True, momentum=0.1)

    x = torch.randn(4, 3, 5, 5)
    weight = torch.ones(3, requires_grad=True)
    stats = [torch.zeros(3), torch.ones(3)]
    eager_stats = [t.clone() for t in stats]
    thunder_rs.jit(f)(x, *stats, weight).sum().backward()
    f(x, *eager_stats, weight.detach().clone().requires_grad_()).sum().backward()
    torch.testing.assert_close(stats, eager_stats)


def _bn_pair(**kwargs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, **kwargs), nn.ReLU(), nn.BatchNorm2d(4, **kwargs))
    return model, copy.deepcopy(model)


@pytest.mark.parametrize("grad_mode", ["grad", "no_grad", "inference_mode"])
@pytest.mark.parametrize(
    "kwargs, train",
    [({}, True), ({"momentum": None}, True), ({"track_running_stats": False}, True), ({}, False)],
    ids=["momentum", "cumulative", "untracked", "eval"],
)
def test_batch_norm_write_backs_are_eagers_values_and_versions(kwargs, train, grad_mode):
    """The running statistics and batch counts a call writes back (one ``_foreach_copy_`` per dtype,
    or a ``copy_`` each where a buffer has no version counter: made under inference_mode) are
    eager's, bit for bit, and so are their version counters: eager's kernel updates the statistics
    without a bump, its ``num_batches_tracked.add_(1)`` bumps the count."""
    model, twin = _bn_pair(**kwargs)
    mode = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[grad_mode]
    if grad_mode == "inference_mode":  # (buffers made there: written there only, without counters)
        with torch.inference_mode():
            for m in (model, twin):
                for name, b in list(m.named_buffers()):
                    m.get_submodule(name.rpartition(".")[0]).register_buffer(name.rpartition(".")[2], b.clone())
    model.train(train), twin.train(train)
    jtwin = thunder_rs.jit(twin)
    for step in range(3):
        x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(step))
        with mode():
            assert torch.equal(jtwin(x), model(x))
        for b, c in zip(model.buffers(), twin.buffers(), strict=True):
            assert torch.equal(c, b)
            assert c.is_inference() or c._version == b._version
