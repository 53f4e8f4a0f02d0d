"""Model families trained next to eager under ``thunder_rs.jit`` and under
``torch.compile(backend="thunder_rs")`` (families in ``models_round11``), as ``test_models_round9``
trains its own: from the same seed, three AdamW steps with ``clip_grad_norm_`` in train mode
(dropout and drop path drawing from the seeded global generator), comparing the loss and every
output, the clipped norm, every gradient, AdamW's moments, the parameters and buffers after each
step, bit for bit (float32, one thread); evaluation under ``no_grad``; one step under
``torch.autocast("cpu", dtype=torch.bfloat16)`` next to eager's autocast step. Compile counts: one
per mode (train, eval) but where ``TRAIN_COMPILES``/``EVAL_COMPILES`` say; Dynamo's graphs compile
once each and none runs eagerly.

The reference paths the families take on a CPU without their kernels' packages: Mamba2's chunked
scan (Bamba, Falcon-H1), the gated delta rule (Qwen3-Next, Kimi Linear), lightning attention
(MiniMax), the short convolution (LFM2), xIELU (Apertus)."""

import copy
import functools

import pytest
import torch

transformers = pytest.importorskip("transformers")
from models_round11 import FAMILIES  # noqa: E402
from test_models_round9 import MODES, _assert_equal, _compiled  # noqa: E402
from test_models_round9 import _train_and_evaluate as train_and_evaluate  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::UserWarning")]
#: the default run's families (``jit``): a block each of latent attention with experts, a hybrid
#: Mamba2 stack, Fourier mixing, a segmentation head with a resized loss, a squeezed audio encoder
QUICK = {"deepseek_v2", "bamba", "fnet", "segformer", "sew"}
QUICK_AUTOCAST = {"glm4", "hiera"}
#: ``jit``'s compiles other than one. The MoE and segmentation families' router logits and hidden
#: states are captured by hooks their first call installs (``_output_capturing_hooks_installed``,
#: as in round 9). DBRX's experts take the tokens ``torch.where(expert_mask[i])`` picks and NLLB-MoE's
#: those under capacity (``nonzero``): a variant per count of tokens an expert was given that was
#: not seen before (from these seeds, one more in training, and DBRX's one in evaluation).
#: NLLB-MoE's router sets its ``expert_capacity`` from the batch's tokens in evaluation.
TRAIN_COMPILES = {"dbrx": 3, "phimoe": 2, "segformer": 2, "nllb_moe": 3}
EVAL_COMPILES = {"dbrx": 2, "nllb_moe": 2}
#: Families whose eager autocast step raises (and so the traced ones, as ``test_eager_errors_under_
#: autocast_are_raised`` checks): DBRX's ``index_add_`` of bfloat16 expert outputs into a float32
#: buffer, X-MOD's adapters' bfloat16 rows put into float32 hidden states.
EAGER_RAISES_UNDER_AUTOCAST = {"dbrx": r"index_add_\(\): self", "xmod": "Index put requires the source"}


#: (family, mode) pairs compared at float32's tolerance. NLLB-MoE under Dynamo: its sparse
#: decoder layer's ``nonzero`` breaks the graph between the decoder's layers, each of whose cross
#: attentions projects the encoder's output twice (keys, values). Eager's autograd adds the four
#: gradients of the encoder's output one by one as they arrive; each graph's backward returns its
#: two already added, so the engine adds two sums: the same terms in another association, an ulp
#: apart in the encoder's gradients (the decoder's are eager's bit for bit; whole under ``jit``,
#: and node by node under Dynamo's ``backend="eager"``, they are eager's).
TOLERANT = {("nllb_moe", "compile")}


def _matches(actual: list, expected: list, what: str, tolerant: bool) -> None:
    if not tolerant:
        return _assert_equal(actual, expected, what)
    assert len(actual) == len(expected), what
    for i, (a, e) in enumerate(zip(actual, expected)):
        torch.testing.assert_close(a, e, msg=lambda m: f"{what} #{i}: {m}")


def _train_and_evaluate(name: str, mode: str, autocast: bool) -> None:
    """Round 9's run (``test_models_round9``) over this round's families and expectations."""
    check = functools.partial(_matches, tolerant=(name, mode) in TOLERANT)
    train_and_evaluate(
        name, mode, autocast, FAMILIES, check, train_compiles=TRAIN_COMPILES, eval_compiles=EVAL_COMPILES
    )


def _params(names, quick):
    return [
        pytest.param(n, mode, marks=() if n in quick and mode == "jit" else pytest.mark.slow)
        for n in names
        for mode in MODES
    ]


@pytest.mark.parametrize("name,mode", _params(FAMILIES, QUICK))
def test_family_trains_and_evaluates_as_eager(name, mode):
    _train_and_evaluate(name, mode, autocast=False)


@pytest.mark.parametrize(
    "name,mode", _params([n for n in FAMILIES if n not in EAGER_RAISES_UNDER_AUTOCAST], QUICK_AUTOCAST)
)
def test_family_takes_an_autocast_step_as_eager(name, mode):
    _train_and_evaluate(name, mode, autocast=True)


@pytest.mark.parametrize(
    "name,mode", [pytest.param(n, m, marks=pytest.mark.slow) for n in EAGER_RAISES_UNDER_AUTOCAST for m in MODES]
)
def test_eager_errors_under_autocast_are_raised(name, mode):
    """Eager's own ``RuntimeError`` (bfloat16 written into float32), raised by the traced call too
    rather than a step taken in some other dtype."""
    torch.manual_seed(0)
    eager = FAMILIES[name].build().train()
    call = _compiled(copy.deepcopy(eager), mode)
    for model in (eager, call):
        with pytest.raises(RuntimeError, match=EAGER_RAISES_UNDER_AUTOCAST[name]):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(**FAMILIES[name].batch(0))
