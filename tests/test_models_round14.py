"""Model families trained next to eager under ``thunder_rs.jit`` and under
``torch.compile(backend="thunder_rs")`` (families in ``models_round14``), as ``test_models_round9``
trains its own: from the same seed, three AdamW steps with ``clip_grad_norm_`` in train mode,
comparing the loss and every output, the clipped norm, every gradient, AdamW's moments, the
parameters and buffers after each step, bit for bit (float32, one thread); evaluation under
``no_grad``; one step under ``torch.autocast("cpu", dtype=torch.bfloat16)`` next to eager's
autocast step. Compile counts: one per mode (train, eval) but where ``TRAIN_COMPILES`` and
``EVAL_COMPILES`` say; Dynamo's graphs compile once each and none runs eagerly.

The families: recent decoders (GLM's partial rotary, CWM's and Ministral3's sliding windows,
Mistral4's latent attention with experts, MiniMax-M2, LongCat-Flash's zero experts, DeepSeek-V3.2's
sparse-attention indexer), GPT-1, MRA's multi-resolution attention, FSMT, detectors trained
through a matcher-free loss (DETR, Conditional DETR, Table Transformer, DAB-DETR, Deformable DETR,
RT-DETR), DINOv3's ViT (2D rotary with jittered coordinates) and ConvNeXt, ViTPose, vision-language
models (PaliGemma's prefix attention, Qwen2-VL's and Qwen2.5-VL's 3D rotary positions and windowed
vision blocks, Idefics3's and SmolVLM's pixel shuffle, BLIP-2's Q-Former), MusicGen's codebooks and
UnivNet's vocoder."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import thunder_rs
import thunder_rs.dynamo

transformers = pytest.importorskip("transformers")
from models_round14 import FAMILIES  # noqa: E402
from test_models_round9 import MODES, _assert_equal, _compiled  # noqa: E402
from test_models_round9 import _train_and_evaluate as train_and_evaluate  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::UserWarning")]
#: the default run's families (``jit``): latent attention with experts, a sparse-attention indexer,
#: an encoder-decoder, prefix attention over image tokens, 3D rotary positions, a Q-Former, a
#: detector's decoder with anchor boxes, codebook rows
QUICK = {"mistral4", "deepseek_v32", "fsmt", "paligemma", "qwen2_vl", "blip_2", "dab_detr", "musicgen"}
QUICK_AUTOCAST = {"qwen2_vl", "univnet"}
#: ``jit``'s training compiles other than one. MiniMax-M2's router logits are captured by hooks its
#: first call installs (``_output_capturing_hooks_installed``, as in round 9). Qwen2-VL and
#: Qwen2.5-VL keep their rotary deltas (``rope_deltas``) on the model on their first call.
#: LongCat-Flash routes tokens to its experts by ``torch.nonzero``: a variant per count seen.
TRAIN_COMPILES = {"minimax_m2": 2, "qwen2_vl": 2, "qwen2_5_vl": 2, "longcat_flash": 2}
EVAL_COMPILES = {"longcat_flash": 2}
#: Qwen2.5-VL under Dynamo (``jit``'s run is eager's bit for bit): the gradients of its first vision
#: block (windowed attention over ``cu_seqlens`` chunks; the second attends fully) and of the patch
#: embedding are an ulp apart, every later one equal: the gradient reaching block 0's output is
#: summed otherwise across the graphs Dynamo splits the vision tower into (root cause not found).
WINDOW_GRADS = pytest.mark.xfail(
    raises=AssertionError, strict=True, reason="Qwen2.5-VL's first vision block's gradients an ulp apart under Dynamo"
)
COMPILE_XFAILS = {"qwen2_5_vl": WINDOW_GRADS}


def _train_and_evaluate(name: str, mode: str, autocast: bool) -> None:
    """Round 9's run (``test_models_round9``) over this round's families and expectations."""
    train_and_evaluate(
        name, mode, autocast, FAMILIES, _assert_equal, train_compiles=TRAIN_COMPILES, eval_compiles=EVAL_COMPILES
    )


def _params(names, quick, xfails=None):
    return [
        pytest.param(
            n,
            mode,
            marks=[
                *(() if n in quick and mode == "jit" else [pytest.mark.slow]),
                *([xfails[n]] if xfails and mode == "compile" and n in xfails else []),
            ],
        )
        for n in names
        for mode in MODES
    ]


@pytest.mark.parametrize("name,mode", _params(FAMILIES, QUICK, COMPILE_XFAILS))
def test_family_trains_and_evaluates_as_eager(name, mode):
    _train_and_evaluate(name, mode, autocast=False)


@pytest.mark.parametrize("name,mode", _params(FAMILIES, QUICK_AUTOCAST))
def test_family_takes_an_autocast_step_as_eager(name, mode):
    _train_and_evaluate(name, mode, autocast=True)


# -- what differed -------------------------------------------------------------------------------


def _position_deltas(x, ids):
    """Qwen2-VL's rotary deltas (``get_rope_index``): ``torch.tensor`` of a list of 0-d tensors."""
    deltas = [row.max() + 1 - len(row) for row in ids]
    return torch.matmul(x, x.mT) * torch.tensor(deltas, device=x.device).unsqueeze(1)


def test_a_tensor_of_0d_tensors_under_autocast_is_eagers():
    """Under autocast the trace takes a call's output metadata from fake tensors, whose values
    ``torch.tensor`` cannot read ("data is not allocated yet"): the jit raised that error where
    eager gives the tensor (every Qwen2-VL and Qwen2.5-VL autocast step)."""
    x, ids = torch.randn(2, 3), torch.tensor([[1, 5, 2], [7, 0, 3]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        seen = [call(x, ids) for call in (thunder_rs.jit(_position_deltas), _position_deltas)]
    _assert_equal([seen[0]], [seen[1]], "output")


def _sampled(value, grid, weight):
    """Deformable attention's sampling (RT-DETR's and Deformable DETR's): ``grid_sample`` of
    bfloat16 values at bfloat16 locations, both from linear layers."""
    return F.grid_sample(F.linear(value, weight).transpose(1, 3), F.linear(grid, weight[:2, :2]), align_corners=False)


@pytest.mark.parametrize("mode", MODES)
def test_grid_sample_under_autocast_runs_in_float32_as_eager(mode):
    """Eager's CPU autocast casts ``grid_sampler``'s inputs to float32; the jit looked the policy
    up by the Python name (``grid_sample``), found none, and sampled in bfloat16 (RT-DETR's
    autocast gradients differed from its decoder's sampling down to its backbone)."""
    g = torch.Generator().manual_seed(0)
    value, grid = torch.randn(2, 4, 5, 3, generator=g), torch.rand(2, 3, 2, 2, generator=g) * 2 - 1
    weight, cotangent = torch.randn(3, 3, generator=g), torch.randn(2, 3, 3, 2, generator=g)
    seen = []
    for call in (_compiled(_sampled, mode), _sampled):
        leaves = [t.clone().requires_grad_() for t in (value, grid, weight)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = call(*leaves)
        seen.append([out, *torch.autograd.grad(out, leaves, cotangent)])
    _assert_equal(*seen, "output and gradients")


@pytest.mark.parametrize("pad", [(1, 1), (1, 2, 2, 1), (1, 1, 1, 1, 1, 1)])
@pytest.mark.parametrize("padding_mode", ["reflect", "replicate", "circular"])
def test_padding_under_autocast_has_eagers_dtype(padding_mode, pad):
    """Eager's CPU autocast casts ``reflection_pad1d``/``2d`` and ``replication_pad1d``-``3d``
    to float32 (``F.pad``'s modes reach them by the padded dims): the jit padded in bfloat16."""
    if padding_mode == "reflect" and len(pad) == 6:
        pad = (1, 1, 1, 1, 0, 0)  # (reflection_pad3d is not listed: bfloat16 in both)

    def padded(x, w):
        return F.pad(F.linear(x, w), pad, mode=padding_mode) * 3

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 2, *[4] * (len(pad) // 2), generator=g), torch.randn(4, 4, generator=g)
    seen = []
    for call in (thunder_rs.jit(padded), padded):
        leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = call(*leaves)
        seen.append([out, *torch.autograd.grad(out.sum(), leaves)])
    _assert_equal(*seen, "output and gradients")


def _jittered(x, bound):
    return x * torch.empty(3).uniform_(-bound, bound).exp()


@pytest.mark.parametrize("autocast", [False, True])
def test_uniform_between_0d_tensors_draws_as_eager_on_the_compiling_call(autocast):
    """``uniform_`` between 0-d tensors (DINOv3's jittered rotary coordinates under Dynamo, which
    holds ``np.log(r)`` as one): its output metadata came from a run on the values, which drew
    while traced, and the compiling call's draws were the ones after eager's."""
    x, bound = torch.randn(3), torch.tensor(np.log(2.0))
    jitted = thunder_rs.jit(_jittered)
    for _ in range(2):
        seen = []
        for call in (jitted, _jittered):
            torch.manual_seed(1)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                seen.append([call(x, bound), torch.rand(2)])
        _assert_equal(*seen, "output and the generator's next draws")


class _Rescaled(torch.nn.Module):
    rescale = 2.0

    def forward(self, x):
        bound = np.log(self.rescale)
        return x * torch.empty(1).uniform_(-bound, bound).exp()


def test_a_numpy_negation_in_a_dynamo_graph_is_traced():
    """Dynamo writes ``-np.log(r)`` as its ``numpy_operator_wrapper``, which negates with torch
    functions disabled: traced, ``aten.neg`` reached torch dispatch and DINOv3's whole graph ran
    eagerly."""
    torch._dynamo.reset()
    earlier = set(thunder_rs.dynamo.compiled_graphs())
    model, x = _Rescaled(), torch.randn(3)
    compiled = torch.compile(model, backend="thunder_rs")
    seen = []
    for call in (compiled, model):
        torch.manual_seed(1)
        seen.append([call(x), torch.rand(2)])
    _assert_equal(*seen, "output and the generator's next draws")
    graphs = [g for g in thunder_rs.dynamo.compiled_graphs() if g not in earlier]
    assert graphs and all(g.jitted is not None for g in graphs), [g.eager_because for g in graphs]


def _made_to_require_grad(q):
    context = torch.zeros_like(q.float()).requires_grad_()
    return context * 2 + q, context.requires_grad


def test_requires_grad_of_a_new_tensor_in_a_dynamo_graph_is_traced():
    """Dynamo writes ``requires_grad_()`` between functorch's ``set_inplace_requires_grad_allowed``
    calls, which made the graph run eagerly as a transform's state change (MRA's evaluation under
    ``no_grad``: ``torch.zeros_like(query).requires_grad_()``)."""
    torch._dynamo.reset()
    earlier = set(thunder_rs.dynamo.compiled_graphs())
    q = torch.randn(3)
    seen = []
    with torch.no_grad():
        for call in (torch.compile(_made_to_require_grad, backend="thunder_rs"), _made_to_require_grad):
            out, flag = call(q)
            seen.append([out, torch.tensor([flag, out.requires_grad])])
    _assert_equal(*seen, "output and requires_grad")
    graphs = [g for g in thunder_rs.dynamo.compiled_graphs() if g not in earlier]
    assert graphs and all(g.jitted is not None for g in graphs), [g.eager_because for g in graphs]


_RESIZES = [  # (mode, input rank, antialias)
    ("nearest", 3, False),
    ("nearest", 4, False),
    ("nearest-exact", 5, False),
    ("linear", 3, False),
    ("bilinear", 4, False),
    ("bilinear", 4, True),
    ("bicubic", 4, False),
    ("bicubic", 4, True),
    ("trilinear", 5, False),
    ("area", 4, False),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("mode", "rank", "antialias"), _RESIZES)
def test_interpolate_under_cuda_autocast_has_eagers_dtype(fake_cuda, mode, rank, antialias, dtype):
    """CUDA's autocast runs the upsample kernels in float32 (a bfloat16 input gives a float32
    output); the jit looked the policy up as ``interpolate``, found none, and resized in bfloat16.
    ``area`` is an adaptive average pool, not listed: the input's dtype in both."""
    x = torch.randn(2, 3, *[8] * (rank - 2), device="cuda", dtype=dtype)

    def resized(x):
        return F.interpolate(x * 2, scale_factor=2, mode=mode, antialias=antialias) + 1

    with torch.autocast("cuda", dtype=torch.bfloat16):
        expected, got = resized(x), thunder_rs.jit(resized)(x)
    assert (got.dtype, got.shape, got.stride()) == (expected.dtype, expected.shape, expected.stride())


@pytest.mark.parametrize(("mode", "rank"), [("area", 5), ("area", 4), ("bilinear", 4), ("nearest", 5)])
def test_interpolate_under_cpu_autocast_is_eagers(mode, rank):
    """The CPU's autocast lists ``adaptive_avg_pool3d`` (``area`` of a 5-D input) as float32 and no
    upsample: values and gradients bit-equal to eager."""

    def resized(x, w):
        return F.interpolate(F.linear(x, w), size=[6] * (rank - 2), mode=mode) * 3

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 2, *[4] * (rank - 2), generator=g), torch.randn(4, 4, generator=g)
    seen = []
    for call in (thunder_rs.jit(resized), resized):
        leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = call(*leaves)
        seen.append([out, *torch.autograd.grad(out.float().sum(), leaves)])
    _assert_equal(*seen, "output and gradients")
