"""Layers and losses trained over changing sizes compile at most twice (static, then symbolic),
with the torch executor and with nvFuser's (the stand-in ``nvfuser_direct``: its regions take the
decompositions, which the torch executor leaves to torch's kernels), and compute eager's values and
gradients. A decomposition that turned a size into a Python float (a mean's ``float(numel)``, batch
norm's ``n / (n - 1)``) specialised the symbolic variant: a compile per batch size."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from twin_training import misses, train_like_eager

C = 6


class Fn(nn.Module):
    """``f`` of its input scaled by a parameter (so that the call trains)."""

    def __init__(self, f):
        super().__init__()
        self.f = f
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.f(x * self.w if x.is_floating_point() else x)


def _targets(x):
    return x.detach().argmax(1)


#: name -> (module maker, input of a size); each trained at sizes 2, 3, 5, 7.
CASES = {
    "batch_norm_2d": (lambda: nn.BatchNorm2d(C), lambda n: torch.randn(n, C, 5, 5)),
    "batch_norm_1d": (lambda: nn.BatchNorm1d(C), lambda n: torch.randn(n, C)),
    "batch_norm_1d_length": (lambda: nn.BatchNorm1d(C), lambda n: torch.randn(2, C, n)),
    "layer_norm": (lambda: nn.LayerNorm(C), lambda n: torch.randn(n, 7, C)),
    "group_norm": (lambda: nn.GroupNorm(2, C), lambda n: torch.randn(2, C, n, 4)),
    "instance_norm": (lambda: nn.InstanceNorm2d(C, affine=True), lambda n: torch.randn(2, C, n, 4)),
    "rms_norm": (lambda: nn.RMSNorm(C), lambda n: torch.randn(n, C)),
    "adaptive_avg_pool": (lambda: Fn(nn.AdaptiveAvgPool2d(3)), lambda n: torch.randn(2, C, n + 3, 4)),
    "log_softmax": (lambda: Fn(nn.LogSoftmax(1)), lambda n: torch.randn(n, 5)),
    "var_std": (lambda: Fn(lambda x: x.mean(0) + x.var(0) + x.std(1).sum()), lambda n: torch.randn(n, C)),
    "interpolate": (
        lambda: Fn(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")),
        lambda n: torch.randn(2, C, n, 4),
    ),
    "cross_entropy": (lambda: Fn(lambda x: F.cross_entropy(x, _targets(x))), lambda n: torch.randn(n, 5)),
    "cross_entropy_smoothed": (
        lambda: Fn(lambda x: F.cross_entropy(x, _targets(x), label_smoothing=0.1)),
        lambda n: torch.randn(n, 5),
    ),
    "cross_entropy_probabilities": (
        lambda: Fn(lambda x: F.cross_entropy(x, x.detach().softmax(1))),
        lambda n: torch.randn(n, 5),
    ),
    "mse_loss": (lambda: Fn(lambda x: F.mse_loss(x, x.detach() * 0.5)), lambda n: torch.randn(n, 5)),
    "smooth_l1_loss": (lambda: Fn(lambda x: F.smooth_l1_loss(x, x.detach() * 0.5)), lambda n: torch.randn(n, 5)),
    "bce_with_logits": (
        lambda: Fn(lambda x: F.binary_cross_entropy_with_logits(x, (x.detach() > 0).float())),
        lambda n: torch.randn(n, 5),
    ),
    "kl_div_batchmean": (
        lambda: Fn(lambda x: F.kl_div(x.log_softmax(1), x.detach().softmax(1), reduction="batchmean")),
        lambda n: torch.randn(n, 5),
    ),
    "triplet_margin_loss": (
        lambda: Fn(lambda x: F.triplet_margin_loss(x, x.detach().flip(0), x.detach() * 2)),
        lambda n: torch.randn(n, 5),
    ),
    "gaussian_nll_loss": (
        lambda: Fn(lambda x: F.gaussian_nll_loss(x, x.detach() * 0.5, torch.ones_like(x))),
        lambda n: torch.randn(n, 5),
    ),
    "attention": (
        lambda: Fn(lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True)),
        lambda n: torch.randn(2, 2, n, 8),
    ),
}


@pytest.fixture(params=["torch", "nvfuser"])
def executors(request, fake_ex):
    return [] if request.param == "torch" else [fake_ex]


@pytest.mark.parametrize("name", list(CASES))
def test_trains_over_sizes_in_two_compiles(name, executors):
    make, sample = CASES[name]
    torch.manual_seed(0)
    jmodel = train_like_eager(make(), [sample(n) for n in (2, 3, 5, 7)], executors=executors)
    assert misses(jmodel) == 2
