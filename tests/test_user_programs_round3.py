"""Training and inference programs as users write them, round 3, each next to eager
(``user_training.trains_as_eager``: losses, outputs, every gradient, parameters, buffers, optimizer
state and random state, bit for bit on one CPU thread, and the compile count): a contrastive loss
with a learnt temperature, a LoRA adapter switched between calls, optional inputs and ``**kwargs``,
gradient accumulation, recurrent layers over variable lengths. The models sit in ``user_models_round3.py``."""

import pytest
import torch

from user_models_round3 import LearntTemperatureContrast
from user_training import trains_as_eager

pytestmark = pytest.mark.usefixtures("one_thread")


def two_views(model, step):
    x = torch.randn(5, 6)
    loss, logits = model(x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x))
    return loss, [logits]


def test_a_contrastive_loss_with_a_learnt_temperature_returning_its_logits_trains_as_eager():
    """The call returns the loss and the logits, and the backward reaches the loss only: the
    logits' cotangent is absent, zeros added to the logits' gradient on the first step (a compiled
    backward without them from the second). Row-major zeros added first laid the gradient, which
    eager lays out as its transposed term (``logits.t()``), row-major, and the temperature's
    gradient, a sum over it, was an ulp off eager's."""
    trains_as_eager(LearntTemperatureContrast, two_views)
