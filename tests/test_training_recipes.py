"""Training recipes around a language model next to eager: the loss users write with label
smoothing and class weights over padded tokens, every value bit for bit.

What differed: a label-smoothed cross entropy with class weights and a mean divides its smoothing
term by the weights of the targets it kept. Eager sums them compacted
(``weight.gather(0, target.masked_select(~ignored)).sum()``); the trace summed them with zeros in
place of the ignored targets, which rounds otherwise: the float32 loss 1-2 ulps off and every
gradient with it, for some batches (``ltorch.kept_weight_total`` runs eager's expression)."""

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")
EXACT = dict(rtol=0, atol=0)
CLASSES = 7


def _tokens(seed: int, shape: tuple, ignore_index: int) -> tuple:
    """Logits (class dim 1), targets with a few ignored, and class weights, from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(shape[0], CLASSES, *shape[1:], generator=generator, requires_grad=True)
    target = torch.randint(0, CLASSES, shape, generator=generator)
    target.view(-1)[:: max(2, target.numel() // 4)] = ignore_index
    return logits, target, torch.rand(CLASSES, generator=generator)


@pytest.mark.parametrize("ignore_index", [-100, 3], ids=["padding", "a_class"])
@pytest.mark.parametrize("shape", [(29,), (3, 11)], ids=["tokens", "batch_by_position"])
def test_label_smoothing_with_class_weights_averages_over_eagers_weight_total(shape, ignore_index):
    def loss(logits, target, weight):
        return F.cross_entropy(logits, target, weight=weight, ignore_index=ignore_index, label_smoothing=0.3)

    jloss = thunder_rs.jit(loss)
    for seed in range(12):
        logits, target, weight = _tokens(seed, shape, ignore_index)
        expected = loss(logits, target, weight)
        (expected_grad,) = torch.autograd.grad(expected, logits)
        actual = jloss(logits, target, weight)
        (actual_grad,) = torch.autograd.grad(actual, logits)
        torch.testing.assert_close(actual, expected, **EXACT, msg=lambda m, s=seed: f"seed {s}: {m}")
        torch.testing.assert_close(actual_grad, expected_grad, **EXACT, msg=lambda m, s=seed: f"seed {s}: {m}")
    assert thunder_rs.compile_stats(jloss).cache_misses == 1  # the kept targets' count is no size


def test_label_smoothing_with_class_weights_and_every_target_ignored_is_eagers_nan():
    logits, target, weight = _tokens(0, (5,), -100)
    target[:] = -100

    def loss(x, t, w):
        return F.cross_entropy(x, t, weight=w, label_smoothing=0.1)

    assert thunder_rs.jit(loss)(logits, target, weight).isnan() and loss(logits, target, weight).isnan()
