"""Model families trained next to eager under ``thunder_rs.jit`` and under
``torch.compile(backend="thunder_rs")`` (families in ``models_round15``), as ``test_models_round9``
trains its own: from the same seed, three AdamW steps with ``clip_grad_norm_`` in train mode,
comparing the loss and every output, the clipped norm, every gradient, AdamW's moments, the
parameters and buffers after each step, bit for bit (float32, one thread); evaluation under
``no_grad``; one step under ``torch.autocast("cpu", dtype=torch.bfloat16)`` next to eager's
autocast step. Compile counts: one per mode (train, eval) but where ``TRAIN_COMPILES`` and
``EVAL_COMPILES`` say; Dynamo's graphs compile once each and none runs eagerly.

The families: vision encoder-decoders (TrOCR's ViT and decoder, Donut's Swin and MBart), a speech
encoder-decoder (wav2vec2 and BERT, a padded waveform), ViViT's tubelets, segmentation decoders
(Mask2Former's masked attention over a deformable pixel decoder, MaskFormer), X-CLIP's video-text
towers, Pop2Piano's T5, MVP's prompts, the Decision Transformer, LayoutLMv3's 2D positions,
Qwen3.5-MoE (linear attention, experts), Bark's semantic GPT, SuperPoint's keypoints, detectors
(RT-DETR v2, D-FINE's distribution refinement, OWLv2's open vocabulary), FastSpeech2's Conformer
with a length regulator, a diffusion UNet written with ``torch.nn`` (noise drawn inside the step),
InstructBLIP, Kosmos-2, ZoeDepth's metric bins, ViTMatte and VITS (durations drawn from noise set
the waveform's length).

Below them, what differed: a cached function's code run past its cache (DETR's sine position
embedding, which transformers calls so while compiling) was refused as a miss of the cache."""

import functools

import pytest
import torch

import thunder_rs
import thunder_rs.dynamo

transformers = pytest.importorskip("transformers")
from models_round15 import FAMILIES  # noqa: E402
from test_models_round9 import MODES, _assert_equal  # noqa: E402
from test_models_round9 import _train_and_evaluate as train_and_evaluate  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::UserWarning")]
#: the default run's families (``jit``): a vision and a speech encoder-decoder, a video-text model,
#: a MoE decoder with linear attention, a segmentation decoder, an open-vocabulary detector, a
#: diffusion UNet, a Decision Transformer over trajectories
QUICK = {
    "trocr",
    "speech_encoder_decoder",
    "x_clip",
    "qwen3_5_moe",
    "maskformer",
    "owlv2",
    "unet",
    "decision_transformer",
}
QUICK_AUTOCAST = {"vivit", "unet"}
#: ``jit``'s compiles other than one: SuperPoint's keypoints are picked by ``torch.nonzero`` of
#: scores over a threshold, VITS's waveform length and FastSpeech2's frames in evaluation are the
#: sum of durations it predicts (read by ``item()``): the second count seen compiles a variant with
#: that size symbolic, which serves every later one.
TRAIN_COMPILES = {"superpoint": 2, "vits": 2}
EVAL_COMPILES = {"fastspeech2_conformer": 2, "vits": 2}
#: VITS under Dynamo: one of its graphs compiles twice (its sizes come from the predicted
#: durations' values, as ``jit``'s two compiles), where this harness counts one per graph; its
#: values and gradients are eager's (checked before the count).
GRAPH_COMPILES = pytest.mark.xfail(raises=AssertionError, strict=True, reason="a VITS graph compiles twice")
#: FastSpeech2 under Dynamo with thunder_rs (``backend="eager"`` gives eager's): its phoneme
#: embedding's gradient differs from eager's in the last bits (20% of elements, 3e-9 at most).
EMBEDDING_GRAD = pytest.mark.xfail(
    raises=AssertionError, strict=True, reason="FastSpeech2's embedding gradient an ulp apart under Dynamo"
)
#: Dynamo's own: the UNet's evaluation under ``backend="eager"`` differs from eager's too (its
#: predicted noise an ulp apart; the cause not looked into).
DYNAMO_EVAL = pytest.mark.xfail(raises=AssertionError, strict=True, reason="Dynamo's: backend='eager' differs too")
#: Dynamo's own too: Idefics2's autocast step under ``backend="eager"`` gives other gradients than
#: eager's (its outputs equal; under thunder_rs its patch embedding's gradient is the first that differs).
DYNAMO_AUTOCAST = pytest.mark.xfail(raises=AssertionError, strict=True, reason="Dynamo's: backend='eager' differs too")
COMPILE_XFAILS = {"fastspeech2_conformer": EMBEDDING_GRAD}
AUTOCAST_XFAILS = {**COMPILE_XFAILS, "idefics2": DYNAMO_AUTOCAST}


def _train_and_evaluate(name: str, mode: str, autocast: bool) -> None:
    """Round 9's run (``test_models_round9``) over this round's families and expectations."""
    train_and_evaluate(
        name, mode, autocast, FAMILIES, _assert_equal, train_compiles=TRAIN_COMPILES, eval_compiles=EVAL_COMPILES
    )


def _params(names, quick, xfails):
    return [
        pytest.param(
            n,
            mode,
            marks=[
                *(() if n in quick and mode == "jit" else [pytest.mark.slow]),
                *([xfails[n]] if mode == "compile" and n in xfails else []),
            ],
        )
        for n in names
        for mode in MODES
    ]


@pytest.mark.parametrize(
    "name,mode", _params(FAMILIES, QUICK, {**COMPILE_XFAILS, "unet": DYNAMO_EVAL, "vits": GRAPH_COMPILES})
)
def test_family_trains_and_evaluates_as_eager(name, mode):
    _train_and_evaluate(name, mode, autocast=False)


@pytest.mark.parametrize(
    "name,mode", _params(FAMILIES, QUICK_AUTOCAST, {**COMPILE_XFAILS, "idefics2": DYNAMO_AUTOCAST})
)
def test_family_takes_an_autocast_step_as_eager(name, mode):
    _train_and_evaluate(name, mode, autocast=True)


# -- what differed -------------------------------------------------------------------------------


class _SinePositions(torch.nn.Module):
    """DETR's position embedding of a mask the program makes (as DETR's backbone interpolates the
    pixel mask): ``compile_compatible_method_lru_cache`` calls the function past its cache while
    ``torch.compiler.is_compiling()`` (as under Dynamo), else through an ``lru_cache`` keyed by the mask."""

    def __init__(self):
        super().__init__()
        detr = pytest.importorskip("transformers.models.detr.modeling_detr")
        self.embedding = detr.DetrSinePositionEmbedding(4, normalize=True)

    def forward(self, x):
        mask = x[:, 0] > -0.5
        return x + self.embedding(shape=x.shape, device=x.device, dtype=x.dtype, mask=mask) * x.sum()


def test_detr_position_embedding_of_a_made_mask_runs_every_call_as_eager():
    """DETR, Conditional DETR and Deformable DETR were refused under ``jit``: the observer took
    the embedding's code run past its cache (transformers calls it so while compiling) for a miss
    of the cache, whose key would hold the traced mask. Eager misses on every call too (the mask is
    a new tensor each call, hashed by identity), so the value is each call's own."""
    model = _SinePositions()
    jitted = thunder_rs.jit(model)
    for step in range(3):
        x = torch.randn(2, 8, 4, 5, generator=torch.Generator().manual_seed(step))
        seen = []
        for call in (jitted, model):
            leaf = x.clone().requires_grad_()
            out = call(leaf)
            seen.append([out, *torch.autograd.grad(out.square().sum(), leaf)])
        _assert_equal(*seen, f"step {step}")
    assert thunder_rs.compile_stats(jitted).cache_misses == 1


@functools.lru_cache(maxsize=4)
def _cumulative(mask):
    return mask.float().cumsum(-1)


def _past_the_cache(x):
    return x * _cumulative.__wrapped__(x > 0)


@functools.lru_cache(maxsize=4)
def _scale(n):
    return n / 4


def _past_the_cache_with_a_number(x):
    return x * _scale.__wrapped__(3)


def _past_then_through_the_cache(x):
    return _cumulative.__wrapped__(x > 0) + _cumulative(x > 0)


def test_a_cached_functions_wrapped_called_on_a_made_tensor_is_traced_as_eager():
    """``f.__wrapped__`` (which the refusal of a traced key suggests) caches nothing: it was refused
    as a miss of ``f``'s cache once the program had read ``f``."""
    _cumulative.cache_clear()
    jitted = thunder_rs.jit(_past_the_cache)
    for step in range(3):
        x = torch.randn(3, 5, generator=torch.Generator().manual_seed(step))
        _assert_equal([jitted(x)], [_past_the_cache(x)], f"step {step}")
    assert _cumulative.cache_info().misses == 0 and _cumulative.cache_info().currsize == 0


def test_a_cached_functions_wrapped_is_the_function_past_its_cache_as_eagers():
    """While traced, the name of a cached function holds a reader, whose ``__wrapped__`` was the
    cached function itself (``functools.update_wrapper``), not the function past the cache: the
    program's ``f.__wrapped__(3)`` went through the cache, which eager's call does not touch."""
    _scale.cache_clear()
    x = torch.randn(3, 5)
    expected = _past_the_cache_with_a_number(x)
    _assert_equal([thunder_rs.jit(_past_the_cache_with_a_number)(x)], [expected], "output")
    assert _scale.cache_info() == functools._CacheInfo(0, 0, 4, 0)


def test_a_made_tensor_through_the_cache_after_a_call_past_it_is_still_refused():
    _cumulative.cache_clear()
    with pytest.raises(thunder_rs.errors.ThunderNotImplementedError, match=r"_cumulative, cached by functools"):
        thunder_rs.jit(_past_then_through_the_cache)(torch.randn(3, 5))
    assert _cumulative.cache_info().currsize == 0
