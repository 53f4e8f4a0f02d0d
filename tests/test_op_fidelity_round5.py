"""Op fidelity, round 5: outputs and gradients bit-equal to eager's (``torch.equal``) where
eager's kernels are the ones compiled calls run.

- Hugging Face decoders called without padding (no ``attention_mask``, or one of ones) and without
  a cache: transformers' mask code reads the position ids (packed sequences) and the padding mask
  to leave causality to SDPA's ``is_causal`` unless told it is traced; while tracing it was told
  so, and the general mask it built sent attention to another kernel (Llama's gradients an ulp
  apart). It now reads them as eager does, checked at every call
  (``torch_overrides.EAGER_ANSWERS``).
"""

from __future__ import annotations

import copy

import pytest
import torch

import thunder_rs

transformers = pytest.importorskip("transformers")
from test_hf_models import padded_batch, tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _step(model, batch: dict) -> list[torch.Tensor]:
    """The logits and every parameter's gradient of one step of ``model`` on ``batch``."""
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return [out.logits.detach()] + [p.grad for p in model.parameters()]


def _unpadded(batch: dict, mask: str) -> dict:
    ids = batch["input_ids"]
    unpadded = dict(input_ids=ids, labels=ids, use_cache=False)
    if mask == "ones":
        unpadded["attention_mask"] = torch.ones_like(ids)
    return unpadded


@pytest.mark.parametrize("mask", ["absent", "ones"])
def test_an_unpadded_llama_batch_trains_with_eager_s_attention(mask):
    """Without padding eager's mask code finds no packed sequences and no padded token, and SDPA
    runs causal (``is_causal``, the flash kernel); the trace read neither and built the general
    mask (the math kernel's gradients, 4e-8 off). A padded batch after it runs the variant that
    builds the mask, and an unpadded one then runs the first again."""
    model = tiny_model("llama")
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    padded = padded_batch("llama", "right")
    for batch in (_unpadded(padded, mask), padded, _unpadded(padded_batch("llama", "left", 1), mask)):
        for actual, expected in zip(_step(jmodel, batch), _step(eager, batch), strict=True):
            assert torch.equal(actual, expected), (actual - expected).abs().max()
    assert thunder_rs.cache_misses(jmodel) == 2
