"""Model families trained next to eager under ``thunder_rs.jit`` and under
``torch.compile(backend="thunder_rs")`` (families in ``models_round12``), as ``test_models_round9``
trains its own: from the same seed, three AdamW steps with ``clip_grad_norm_`` in train mode
(dropout, drop path and LayerDrop drawing from the seeded global generator), comparing the loss and
every output, the clipped norm, every gradient, AdamW's moments, the parameters and buffers after
each step, bit for bit (float32, one thread); evaluation under ``no_grad``; one step under
``torch.autocast("cpu", dtype=torch.bfloat16)`` next to eager's autocast step. Compile counts: one
per mode (train, eval) but where ``TRAIN_COMPILES`` says; Dynamo's graphs compile once each and
none runs eagerly.

The families: hybrid state-space stacks (Zamba's per-head selective scan, Zamba2's and
Nemotron-H's and Granite-MoE-Hybrid's Mamba2 chunked scans with shared blocks, LoRA adapters,
experts), xLSTM's chunkwise mLSTM, routed experts with group-limited routing, shared experts and
expert biases (GLM-4-MoE, ERNIE-4.5-MoE, LFM2-MoE, Granite-MoE-Shared), T5Gemma's encoder-decoder,
BigBird-Pegasus's block sparse attention with random blocks, RoFormer's rotary values, audio
front-ends (the Audio Spectrogram Transformer, SpeechT5's speech-to-text with relative positions,
Moonshine's raw-waveform convolutions), PoolFormer, UperNet's pyramid pooling on a ConvNeXt
backbone with an auxiliary head, time series (Autoformer's FFT autocorrelation and series
decomposition, PatchTSMixer, TimesFM), vision-language (GroupViT's Gumbel group assignment with a
contrastive loss, BLIP's captioning, ViLT's sampled image patches, Pix2Struct's flattened patches),
and Perceiver's latent cross-attention over bytes."""

import copy
import functools

import pytest
import torch

import thunder_rs

transformers = pytest.importorskip("transformers")
from models_round12 import FAMILIES  # noqa: E402
from test_models_round9 import MODES, _assert_equal, _compiled  # noqa: E402
from test_models_round9 import _train_and_evaluate as train_and_evaluate  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::UserWarning")]
#: the default run's families (``jit``): a block each of a Mamba2 hybrid with experts, an mLSTM,
#: group-limited routing, a pyramid pooling head (a module list held in a plain list), an FFT
#: autocorrelation, a Gumbel grouping with a contrastive loss, sampled image patches, an audio
#: spectrogram encoder
QUICK = {
    "nemotron_h",
    "xlstm",
    "glm4_moe",
    "upernet",
    "autoformer",
    "groupvit",
    "vilt",
    "audio_spectrogram_transformer",
}
QUICK_AUTOCAST = {"granitemoeshared", "poolformer"}
#: ``jit``'s training compiles other than one. The MoE families' router logits are captured by
#: hooks their first call installs (``_output_capturing_hooks_installed``, as in round 9).
#: SpeechT5's LayerDrop skips a layer where ``torch.rand([]) < layerdrop``: a variant per outcome
#: seen. Autoformer's training aggregation rolls the values by each of the top-k delays, read by
#: ``int(top_k_delays_index[i])``: a variant per set of delays not seen before (evaluation gathers).
TRAIN_COMPILES = {"granitemoehybrid": 2, "ernie4_5_moe": 2, "speecht5": 2, "autoformer": 3}
#: Families ``jit`` refuses, at the line that draws from NumPy's global generator: BigBird's
#: random blocks (``np.random.permutation``) in training.
NUMPY_RANDOM = {"bigbird_pegasus"}


def _train_and_evaluate(name: str, mode: str, autocast: bool) -> None:
    """Round 9's run (``test_models_round9``) over this round's families and expectations."""
    train_and_evaluate(name, mode, autocast, FAMILIES, _assert_equal, train_compiles=TRAIN_COMPILES)


#: Families one of whose Dynamo graphs runs eagerly (their values still eager's): BigBird's random
#: blocks are NumPy calls, which Dynamo's graph holds as ``torch._numpy`` operators run under
#: ``DisableTorchFunction`` (as PEGASUS-X's in round 10): a subtraction reaches torch's dispatch
#: with a traced tensor.
EAGER_GRAPH = pytest.mark.xfail(raises=AssertionError, strict=True, reason="a graph of NumPy operators runs eagerly")
EAGER_GRAPHS = {"bigbird_pegasus"}
#: Families whose Dynamo run is not eager's bit for bit (``jit``'s is), not root-caused: the first
#: step's gradient of the first parameter is a few ulps apart (Autoformer's value projection,
#: SpeechT5's first parameter with a gradient; Autoformer's autocast step in another). Both break Dynamo's graph in
#: the middle of a layer (Autoformer at ``int(top_k_delays_index[i])``, SpeechT5 at its LayerDrop
#: ``torch.rand([]) < layerdrop``), as NLLB-MoE's ``nonzero`` does in round 11, where gradients
#: added across graphs are summed in another association: the likely cause, unconfirmed here
#: (under ``backend="eager"``, node by node, both are eager's bit for bit).
DYNAMO_ULPS = pytest.mark.xfail(
    raises=AssertionError, strict=True, reason="gradients an ulp apart under Dynamo's broken graphs"
)
DYNAMO_ULPS_TRAINING = {"autoformer", "speecht5"}
DYNAMO_ULPS_AUTOCAST = {"autoformer", "speecht5"}
#: Pix2Struct's autocast step under Dynamo (``jit``'s is eager's bit for bit): the gradient of the
#: decoder's relative attention bias table (``relative_attention_bias.weight``, 8 buckets x 2
#: heads) is up to 3% apart (2.5e-5) in 9 of its 16 entries. Dynamo's own: under
#: ``torch.compile(backend="eager")`` it is the same gradient as under ``backend="thunder_rs"``.
BIAS_TABLE = pytest.mark.xfail(
    raises=AssertionError, strict=True, reason="Dynamo's capture (backend='eager' too) of Pix2Struct's autocast step"
)


def _params(names, quick, ulps=frozenset()):
    return [
        pytest.param(
            n,
            mode,
            marks=[
                *(() if n in quick and mode == "jit" else [pytest.mark.slow]),
                *([EAGER_GRAPH] if mode == "compile" and n in EAGER_GRAPHS else []),
                *([DYNAMO_ULPS] if mode == "compile" and n in ulps else []),
                *([BIAS_TABLE] if mode == "compile" and n == "pix2struct" and ulps is DYNAMO_ULPS_AUTOCAST else []),
            ],
        )
        for n in names
        for mode in MODES
        if not (mode == "jit" and n in NUMPY_RANDOM)
    ]


@pytest.mark.parametrize("name,mode", _params(FAMILIES, QUICK, DYNAMO_ULPS_TRAINING))
def test_family_trains_and_evaluates_as_eager(name, mode):
    _train_and_evaluate(name, mode, autocast=False)


@pytest.mark.parametrize("name,mode", _params(FAMILIES, QUICK_AUTOCAST, DYNAMO_ULPS_AUTOCAST))
def test_family_takes_an_autocast_step_as_eager(name, mode):
    _train_and_evaluate(name, mode, autocast=True)


def test_jit_refuses_bigbirds_numpy_random_blocks_naming_the_line():
    torch.manual_seed(0)
    model = thunder_rs.jit(FAMILIES["bigbird_pegasus"].build().train())
    with pytest.raises(
        thunder_rs.errors.ThunderNotImplementedError,
        match=r"numpy\.random\.permutation.*modeling_bigbird_pegasus\.py:\d+",
    ):
        model(**FAMILIES["bigbird_pegasus"].batch(0))


# -- what differed -------------------------------------------------------------------------------


class _PlainListOfBlocks(torch.nn.Module):
    """UperNet's pyramid pooling: its blocks registered (``add_module``) and kept in a plain list,
    through which its forward reaches them."""

    def __init__(self):
        super().__init__()
        self.blocks = []
        for i in range(2):
            block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
            self.blocks.append(block)
            self.add_module(str(i), block)

    def forward(self, x):
        return sum(block(x) for block in self.blocks)


@pytest.mark.parametrize("mode", MODES)
def test_blocks_reached_through_a_plain_list_train_as_eager(mode):
    """The blocks' parameters and batch norms' running statistics are one tensor each, whichever
    path reaches them: the trace took those reached through the list as captured tensors apart
    from the module's own, and refused (a written tensor sharing memory with another input)."""
    torch.manual_seed(0)
    eager = _PlainListOfBlocks().train()
    model = copy.deepcopy(eager)
    call = _compiled(model, mode)
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        x, cotangent = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
        seen = []
        for m, c in ((model, call), (eager, eager)):
            out = c(x)
            seen.append([out, *torch.autograd.grad(out, list(m.parameters()), cotangent), *m.buffers()])
        _assert_equal(*seen, "output, gradients and running statistics")


def _patch_positions(positions, mask):
    """ViLT's ``visual_embed``: each image's position table resized to its count of patches the
    pixel mask keeps (0-d tensors as sizes), padded back to the full grid."""
    rows, cols = mask.sum(1)[:, 0], mask.sum(2)[:, 0]
    resized = [
        torch.nn.functional.interpolate(positions, size=(h, w), mode="bilinear", align_corners=True)
        for h, w in zip(rows, cols)
    ]
    return torch.cat([torch.nn.functional.pad(r, (0, 4 - w, 0, 4 - h)) for r, h, w in zip(resized, rows, cols)])


def _sizes_given_as_tensors(mode: str, fresh: bool) -> None:
    g = torch.Generator().manual_seed(0)
    positions, cotangent = torch.randn(1, 3, 4, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g)
    call = _compiled(_patch_positions, mode)
    for rows, cols in ((3, 2), (3, 2), (2, 4)):
        mask = torch.ones(2, 4, 4, dtype=torch.long)
        mask[1, rows:], mask[1, :, cols:] = 0, 0
        call = _compiled(_patch_positions, mode) if fresh and (rows, cols) == (2, 4) else call
        seen = []
        for c in (call, _patch_positions):
            leaf = positions.clone().requires_grad_()
            out = c(leaf, mask)
            seen.append([out, *torch.autograd.grad(out, leaf, cotangent)])
        _assert_equal(*seen, "output and gradient")


@pytest.mark.parametrize("mode", MODES)
def test_sizes_given_as_tensors_are_read_as_eager_reads_them(mode):
    """``F.interpolate``'s ``size`` and ``F.pad``'s amounts as 0-d integer tensors: eager's
    argument parser reads their values (``__index__``); the trace refused them (``expected size to
    be ints``)."""
    _sizes_given_as_tensors(mode, fresh=True)


def test_sizes_read_from_tensors_that_change_between_calls():
    """The call after one with other counts traces the reads as symbolic sizes (``value_sizes``):
    each read was its own symbol, so the padded size ``w + (4 - w)`` was not known to be 4 and
    ``torch.cat`` of the images refused the sizes. ``4 - w`` reads as that expression of ``w``'s
    read now (``int_values``; ``test_dynamic_round13`` counts the compiles)."""
    _sizes_given_as_tensors("jit", fresh=False)


def _autocorrelation(q, k):
    """Autoformer's autocorrelation of queries and keys along time."""
    n = q.shape[1]
    return torch.fft.irfft(torch.fft.rfft(q, n=n, dim=1) * torch.conj(torch.fft.rfft(k, n=n, dim=1)), n=n, dim=1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn", [_autocorrelation, functools.partial(torch.fft.irfft, n=8, dim=1)])
def test_an_inverse_real_transforms_gradient_has_eagers_layout(fn, mode):
    """``fft_c2r_backward`` doubles the mirrored entries of an ``_fft_r2c`` of the gradient in
    place, in the layout that kernel gives (the transformed dim innermost); the trace's was dense
    (a ``cat``), and the complex product taking it (the autocorrelation's) took another kernel
    path, rounding otherwise."""
    g = torch.Generator().manual_seed(0)
    if fn is _autocorrelation:
        inputs = [torch.randn(4, 8, 16, generator=g), torch.randn(4, 8, 16, generator=g)]
    else:
        inputs = [torch.randn(4, 5, 16, dtype=torch.complex64, generator=g)]
    cotangent = torch.randn(4, 8, 16, generator=g)
    seen = []
    for c in (_compiled(fn, mode), fn):
        leaves = [x.clone().requires_grad_() for x in inputs]
        grads = torch.autograd.grad(c(*leaves), leaves, cotangent)
        seen.append([*grads, *(torch.tensor(x.stride()) for x in grads)])
    _assert_equal(*seen, "gradients and their strides")
