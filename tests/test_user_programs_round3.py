"""Training and inference programs as users write them, round 3, each next to eager
(``user_training.trains_as_eager``: losses, outputs, every gradient, parameters, buffers, optimizer
state and random state, bit for bit on one CPU thread, and the compile count): a contrastive loss
with a learnt temperature, a LoRA adapter switched between calls, optional inputs and ``**kwargs``,
gradient accumulation, recurrent layers over variable lengths. The models sit in ``user_models_round3.py``."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

import thunder_rs
from user_models_round3 import (
    ContrastWithProbabilities,
    LearntTemperatureContrast,
    MaskedActionPolicy,
    ScaledClip,
    TiedLanguageModel,
)
from user_training import EXACT, trains_as_eager

pytestmark = pytest.mark.usefixtures("one_thread")


def two_views(model, step):
    x = torch.randn(5, 6)
    loss, logits = model(x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x))
    return loss, [logits]


@pytest.mark.parametrize(
    "make", [LearntTemperatureContrast, ContrastWithProbabilities], ids=["logits", "probabilities"]
)
def test_a_contrastive_loss_with_a_learnt_temperature_returning_its_logits_trains_as_eager(make):
    """The call returns the loss and the logits (or their softmax), and the backward reaches the
    loss only: the second output's cotangent is absent. The first step's backward took zeros for
    it, added row-major to the logits' gradient, which eager lays out as its transposed term
    (``logits.t()``): the temperature's gradient, a sum over it, was an ulp off eager's (and the
    bias's every step through the softmax, whose backward of zeros the compiled backward kept)."""
    trains_as_eager(make, two_views)


def masked_actions(model, step):
    invalid = torch.zeros(6, 5, dtype=torch.bool)
    invalid[:, 0], invalid[::2, 3] = True, True
    loss, log_probs = model(torch.randn(6, 4), invalid, torch.randn(6, 5))
    return loss, [log_probs]


def test_a_policy_returning_log_probabilities_of_masked_actions_trains_as_eager():
    """The log-probabilities the call returns get no cotangent: given zeros, the backward of their
    ``log`` divided them by the probabilities, 0 / 0 for the masked actions, and every gradient
    was NaN where eager's, which never runs that backward, are finite."""
    trains_as_eager(MaskedActionPolicy, masked_actions)


@pytest.mark.parametrize(
    "names", [("embed.weight",), ("head.weight",), ("embed.weight", "norm.weight")], ids=["embed", "head", "and_norm"]
)
def test_functional_call_untying_a_jitted_models_tied_weights_is_eagers(names):
    """``functional_call(..., tie_weights=False)`` gives one slot of a tied pair a tensor of the
    dict and leaves the other its parameter, writing the slot's store directly (no module write
    that would recheck the slots): the compiled call kept reading the pair's tensor once, and ran
    the other layer on the dict's tensor too (or failed with a KeyError where it compiled)."""
    torch.manual_seed(0)
    model, tokens = TiedLanguageModel(), torch.randint(0, 10, (2, 3))
    jitted = thunder_rs.jit(model)
    torch.testing.assert_close(jitted(tokens), model(tokens), **EXACT)
    for tie_weights in (True, False, True):
        params = {name: torch.randn_like(model.get_parameter(name), requires_grad=True) for name in names}
        out = functional_call(jitted, params, (tokens,), tie_weights=tie_weights)
        expected = functional_call(model, params, (tokens,), tie_weights=tie_weights)
        torch.testing.assert_close(out, expected, **EXACT)
        grads = torch.autograd.grad(out.square().sum(), [*params.values(), model.embed.weight], allow_unused=True)
        expected_grads = torch.autograd.grad(
            expected.square().sum(), [*params.values(), model.embed.weight], allow_unused=True
        )
        torch.testing.assert_close(grads, expected_grads, **EXACT)
    torch.testing.assert_close(jitted(tokens), model(tokens), **EXACT)


def test_a_conversion_overwriting_parameters_unties_a_jitted_models_weights_as_eagers():
    """With ``set_overwrite_module_params_on_conversion(True)``, ``model.double()`` gives each slot
    of a tied pair a new parameter of its own, written into the stores directly: the next call
    compiled for the tensors the pair's first slot holds and failed with a KeyError."""
    torch.manual_seed(0)
    model, tokens = TiedLanguageModel(), torch.randint(0, 10, (2, 3))
    jitted = thunder_rs.jit(model)
    jitted(tokens)
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model.double()
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    assert model.head.weight is not model.embed.weight
    with torch.no_grad():
        model.head.weight.mul_(2)
    torch.testing.assert_close(jitted(tokens), model(tokens), **EXACT)


def image_text_pairs_under_autocast(model, step):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, logits = model(torch.randn(5, 6), torch.randint(0, 10, (5, 3)))
    return loss, [logits]


def test_clip_with_its_logit_scale_first_under_bfloat16_autocast_trains_as_eager():
    """``scale * features`` of a float32 0-d scale and bfloat16 features: eager's forward rounds
    the scale to bfloat16, but the features' gradient ``grad * scale`` takes the scale second,
    at its float32 value (its CPU kernel's ``original_scalar_value``); the trace's gradient used
    the rounded scale, up to 3% off in the image projection's gradient."""
    trains_as_eager(ScaledClip, image_text_pairs_under_autocast)


class ScaledClipScaleSecond(ScaledClip):
    """``ScaledClip`` with the logit scale second (``logits_per_text * logit_scale.exp()``, as
    transformers 5's CLIPModel writes it)."""

    def forward(self, images, tokens):
        image = F.normalize(self.image(images), dim=-1)
        text = F.normalize(self.text(tokens).mean(1), dim=-1)
        logits = image @ text.t() * self.logit_scale.exp()
        labels = torch.arange(images.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2, logits


def test_clip_with_its_logit_scale_second_under_bfloat16_autocast_trains_as_eager():
    """``features * scale`` of bfloat16 features and a float32 0-d scale: eager's gradient of the
    scale is ``grad * features`` in bfloat16, summed in bfloat16, then made float32; the trace
    differentiated the product computed in float32 and summed there (the scale's gradient 0.1%
    off: transformers' CLIPModel under bfloat16 autocast). ``ltorch.cpu_times_scalar``."""
    trains_as_eager(ScaledClipScaleSecond, image_text_pairs_under_autocast)


class Tempered(torch.nn.Module):
    """Logits over a learnt temperature (``logits / self.log_temperature.exp()``)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 4)
        self.log_temperature = torch.nn.Parameter(torch.tensor(0.7))

    def forward(self, x, labels):
        logits = self.linear(x) / self.log_temperature.exp()
        return F.cross_entropy(logits.float(), labels), logits


def tempered_under_autocast(model, step):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, logits = model(torch.randn(5, 6), torch.randint(0, 4, (5,)))
    return loss, [logits]


def test_a_learnt_temperature_under_bfloat16_autocast_trains_as_eager():
    """``features / temperature`` of bfloat16 features and a float32 0-d temperature: eager's
    gradient of the temperature is ``-grad * ((features / t) / t)`` in bfloat16, summed in
    bfloat16, then made float32; the trace differentiated the float32 quotient and summed there."""
    trains_as_eager(Tempered, tempered_under_autocast)
