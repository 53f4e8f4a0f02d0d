"""Op fidelity, round 5: outputs and gradients bit-equal to eager's (``torch.equal``) where
eager's kernels are the ones compiled calls run.

- Hugging Face decoders called without padding (no ``attention_mask``, or one of ones) and without
  a cache: transformers' mask code reads the position ids (packed sequences) and the padding mask
  to leave causality to SDPA's ``is_causal`` unless told it is traced; while tracing it was told
  so, and the general mask it built sent attention to another kernel (Llama's gradients an ulp
  apart). It now reads them as eager does, checked at every call
  (``torch_overrides.EAGER_ANSWERS``).
- ``torch.linspace``'s decomposition (what a fusion executor runs): eager's CPU kernel computes
  each point as one FMA (bfloat16's in float32, float16's a float32 product and sum) and an
  integer dtype's points from its ends truncated; the decomposition multiplied and added in the
  dtype (float32/float64 ulps, bfloat16/float16 ulps) and kept integer ends' fractions (values a
  unit off). ``torch.logspace``'s exponents are float64 sums of ends rounded to the dtype, its
  powers float64's. Inductor regions leave both to the torch executor: its lowerings round
  otherwise (46 of 80 calls tried differed).
- ``torch.inner`` and ``torch.tensordot`` of one element (two vectors, or free dims all 1):
  eager's tensordot takes a dot product there, which rounds otherwise than the matrix product of
  a row and a column the decomposition took (float32 ulps in 2 of 3 sizes tried).
"""

from __future__ import annotations

import copy

import pytest
import torch

import thunder_rs
from thunder_rs.executors.torch_ex import decomposing

from test_op_fidelity_round3 import assert_bit_equal_to_eager

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


_SPANS = [(0, 1), (-1, 1), (0.3, 7.9), (-5.2, 3.3), (1e3, -2.5), (3, -17)]
_STEPS = [1, 2, 7, 8, 15, 16, 33, 100, 1001]
_SPACED_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32]


@pytest.mark.parametrize("dtype", _SPACED_DTYPES)
def test_linspace_decomposition_is_eager_s_kernel(dtype):
    """Each point one FMA from its nearer end, as eager's kernel (the CPU kernel's compiler
    contracts ``start + step * i``)."""
    for start, end in _SPANS:
        for steps in _STEPS:

            def program(start=start, end=end, steps=steps):
                return torch.linspace(start, end, steps, dtype=dtype)

            with decomposing():
                actual = thunder_rs.jit(program)()
            assert torch.equal(actual, program()), (start, end, steps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_logspace_decomposition_is_eager_s_kernel(dtype):
    """Float64 exponents from ends rounded to the dtype, powers in float64. (A float64 logspace of
    more than a few points differs where torch's vectorised pow, which the decomposition's power
    is, rounds otherwise than the kernel's ``std::pow``: an ulp in some points.)"""
    for start, end in [(0, 1), (-1, 1), (0.3, 2.9), (-5.2, 3.3), (2, -2.5)]:
        for steps in (1, 2, 7, 16, 100):
            for base in (10.0, 2.0, 1.5):

                def program(start=start, end=end, steps=steps, base=base):
                    return torch.logspace(start, end, steps, base=base, dtype=dtype)

                with decomposing():
                    actual = thunder_rs.jit(program)()
                assert torch.equal(actual, program()), (start, end, steps, base)


@pytest.mark.slow
@pytest.mark.inductor
def test_linspace_and_logspace_in_an_inductor_region_are_eager_s():
    def program(x):
        return torch.linspace(0.3, 7.9, 33, dtype=x.dtype) * x, torch.logspace(-1, 1.5, 20, dtype=x.dtype) * x

    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        x = torch.ones((), dtype=dtype)
        for actual, expected in zip(thunder_rs.jit(program, executors=["inductor"])(x), program(x), strict=True):
            assert torch.equal(actual, expected), dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(
    ("program", "shapes"),
    [
        (torch.inner, [(5,), (5,)]),
        (torch.inner, [(1, 13), (1, 13)]),
        (torch.inner, [(1, 1, 7), (7,)]),
        (lambda a, b: torch.tensordot(a, b, 1), [(1, 11), (11, 1)]),
        (lambda a, b: torch.tensordot(a, b, ([0, 2], [0, 1])), [(2, 1, 9), (2, 9)]),
        (torch.inner, [(3, 13), (1, 13)]),  # (a matrix product: as before)
    ],
)
def test_a_contraction_to_one_element_is_a_dot_product_as_eager_s(dtype, program, shapes):
    gen = torch.Generator().manual_seed(11)
    for _ in range(3):
        a, b = (torch.randn(shape, generator=gen).to(dtype) for shape in shapes)
        assert_bit_equal_to_eager(program, [a, b])
