"""Small training programs as users write them, trained for a few steps under thunder_rs.jit next to
an eager copy: losses, outputs, every gradient, the parameters, the optimizer's state and the buffers
equal eager's bit for bit (float32 and float64 on the CPU, one thread, where the same kernels run),
and so does the random state after the steps (the program draws what eager draws).

The models sit in ``user_models.py``; each program here is the step a user writes around one.
"""

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError
from torch.nn.utils.rnn import pack_padded_sequence
from user_diffusion import Diffusion
from user_models import (
    VAE,
    Clip,
    GraphNet,
    MaskedLM,
    MultiLabelTagger,
    Policy,
    Seq2Seq,
    Siamese,
    SpectralMask,
    TextClassifier,
    gan,
    padded_tokens,
)

pytestmark = pytest.mark.usefixtures("one_thread")

FLOATS = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])

#: One step: ``program(model, step, dtype) -> (loss, outputs)``, ``model`` jitted or eager.
Program = Callable[[Callable, int, torch.dtype], tuple[torch.Tensor, list]]


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-2)


def run_steps(model, call, program: Program, steps: int, dtype, make_optimizer) -> dict:
    """``steps`` steps of ``program`` on ``call`` (``model`` or its jitted form) from one seed;
    what each step computed, and the state after."""
    optimizer = make_optimizer(model.parameters())
    torch.manual_seed(1)
    record: dict = {}
    for step in range(steps):
        optimizer.zero_grad()
        loss, outputs = program(call, step, dtype)
        loss.backward()
        record[f"step {step} loss"] = loss.detach()
        record.update({f"step {step} output {i}": out.detach() for i, out in enumerate(outputs)})
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        record.update({f"step {step} grad of {n}": g for n, g in grads.items()})
        optimizer.step()
    record.update({f"parameter {n}": p.detach().clone() for n, p in model.named_parameters()})
    record.update({f"buffer {n}": b.clone() for n, b in model.named_buffers()})
    for i, state in optimizer.state_dict()["state"].items():
        record.update({f"optimizer state {i} {k}": v for k, v in state.items()})
    record["the next random numbers"] = torch.rand(4)
    return record


def trains_as_eager(make, program: Program, dtype, *, steps=3, make_optimizer=adamw, **options):
    """Trains ``make()`` jitted next to an eager copy; every recorded tensor equals eager's."""
    torch.manual_seed(0)
    eager = make().to(dtype)
    model = copy.deepcopy(eager)
    jmodel = thunder_rs.jit(model, **options)
    expected = run_steps(eager, eager, program, steps, dtype, make_optimizer)
    actual = run_steps(model, jmodel, program, steps, dtype, make_optimizer)
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{name}: {m}")
    assert thunder_rs.compile_stats(jmodel).cache_misses == 1
    return jmodel


# ----------------------------------------------------------------------------- the programs


def vae_step(vae, step, dtype):
    x = torch.rand(5, 12, dtype=dtype)
    loss, recon = vae(x)
    return loss, [recon]


def graph_step(net, step, dtype):
    x = torch.randn(10, 6, dtype=dtype)
    edges = torch.randint(0, 10, (2, 30))
    loss, logits = net(x, edges, torch.randint(0, 3, (10,)))
    return loss, [logits]


def clip_step(clip, step, dtype):
    images, tokens = torch.randn(6, 10, dtype=dtype), torch.randint(0, 20, (6, 5))
    loss, logits = clip(images, tokens)
    return loss, [logits]


def policy_step(policy, step, dtype):
    obs, returns = torch.randn(7, 4, dtype=dtype), torch.randn(7, dtype=dtype)
    actions, controls = torch.randint(0, 3, (7,)), torch.randn(7, 2, dtype=dtype)
    loss, sampled, reparametrized = policy(obs, actions, controls, returns)
    return loss, [sampled, reparametrized]


@FLOATS
def test_a_vae_with_the_reparametrisation_trick_trains_as_eager(dtype):
    trains_as_eager(VAE, vae_step, dtype)


@FLOATS
def test_a_graph_network_passing_messages_over_an_edge_list_trains_as_eager(dtype):
    trains_as_eager(GraphNet, graph_step, dtype)


@FLOATS
def test_a_clip_contrastive_step_with_a_clamped_logit_scale_trains_as_eager(dtype):
    trains_as_eager(Clip, clip_step, dtype)


@FLOATS
def test_a_policy_gradient_step_with_torch_distributions_trains_as_eager(dtype):
    # Categorical(logits=...) normalises by logsumexp: its gradient is eager's g * exp(x - lse).
    trains_as_eager(Policy, policy_step, dtype)


def classifier_step(classifier, step, dtype):
    tokens, padding = padded_tokens([7, 5, 7, 2])
    logits = classifier(tokens, padding)
    return F.cross_entropy(logits, torch.randint(0, 3, (4,))), [logits]


@FLOATS
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_a_transformer_encoder_with_padding_and_dropout_trains_as_eager(norm_first, dtype):
    # Attention with dropout is eager's math path on the CPU: query and key scaled by sqrt(scale)
    # before their product (the product scaled after it was an ulp off), its gradients op by op.
    trains_as_eager(lambda: TextClassifier(norm_first), classifier_step, dtype)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_a_transformer_encoder_in_evaluation_pads_with_eagers_zeros_where_eager_nests_the_batch():
    """Without grad, eager's encoder packs a batch with a left-aligned padding mask into a nested
    tensor and pads the result with zeros (its final norm's bias after the norm); with another
    mask it runs the layers as in training. One trace gives both, chosen by the mask's values.
    The kept tokens are eager's within the rounding of its fused layer kernels."""
    torch.manual_seed(0)
    encoder = TextClassifier(norm_first=False, nested=True).encoder.eval()
    jitted = thunder_rs.jit(encoder)
    x = torch.randn(4, 7, 16)
    right_padded = padded_tokens([7, 5, 0, 2])[1]
    # (no row of padding only here: eager's fused layers give it NaN, the trace's attention zeros)
    left_padded = padded_tokens([7, 5, 1, 2])[1].flip(-1)
    with torch.no_grad():
        for padding in (right_padded, left_padded, right_padded):
            out, expected = jitted(x, src_key_padding_mask=padding), encoder(x, src_key_padding_mask=padding)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        assert torch.equal(out[right_padded], expected[right_padded])
    assert thunder_rs.compile_stats(jitted).cache_misses == 1


def test_an_encoder_nesting_without_checking_the_mask_in_evaluation_is_refused_naming_the_line():
    encoder = TextClassifier(norm_first=False, nested=True).encoder.eval()
    encoder.mask_check = False
    with torch.no_grad(), pytest.raises(ThunderNotImplementedError, match=r"mask_check=False\) at .*programs\.py:\d+"):
        thunder_rs.jit(encoder)(torch.randn(2, 3, 16), src_key_padding_mask=padded_tokens([3, 1], 3)[1])


# ----------------------------------------------------------------------------- more programs


def diffusion_step(diffusion, step, dtype):
    loss = diffusion(torch.randn(3, 1, 8, 8, dtype=dtype))
    return loss, []


class MaskedLMSteps:
    """The steps of a masked-language model, masking with one generator seeded at the first."""

    def __call__(self, model, step, dtype):
        if step == 0:
            self.generator = torch.Generator().manual_seed(5)
        tokens = torch.randint(0, 29, (3, 8))
        loss, masked = model(tokens, self.generator)
        return loss, [masked, torch.rand(2, generator=self.generator)]


def seq2seq_step(model, step, dtype):
    lengths = torch.tensor([6, 3, 5, 2])
    source = torch.randint(1, 12, (4, 6)).masked_fill(torch.arange(6) >= lengths[:, None], 0)
    packed = pack_padded_sequence(source, lengths, batch_first=True, enforce_sorted=False)
    loss, encoded = model(packed, torch.randint(1, 12, (4, 5)))
    return loss, [encoded]


def enhancement_step(model, step, dtype):
    loss, magnitude = model(torch.randn(3, 160, dtype=dtype))
    return loss, [magnitude]


@FLOATS
def test_a_ddpm_step_with_a_small_unet_trains_as_eager(dtype):
    # Its attention block's einsum("bij,bcj->bci") is eager's product v @ attn^T (operands swapped).
    trains_as_eager(Diffusion, diffusion_step, dtype)


@FLOATS
def test_a_masked_language_model_masking_with_a_generator_trains_as_eager(dtype):
    trains_as_eager(MaskedLM, MaskedLMSteps(), dtype)


@FLOATS
@pytest.mark.parametrize("cell", ["GRU", "LSTM"])
def test_a_seq2seq_model_over_a_packed_batch_with_teacher_forcing_trains_as_eager(cell, dtype):
    trains_as_eager(lambda: Seq2Seq(cell), seq2seq_step, dtype)


@FLOATS
def test_a_spectral_masking_model_with_stft_and_istft_trains_as_eager(dtype):
    trains_as_eager(SpectralMask, enhancement_step, dtype)


def gan_steps(generator, discriminator, g_params, d_params, dtype, steps=3) -> list:
    """A GAN's alternating steps (Adam each): the discriminator on real and detached fake
    samples, then the generator through the discriminator; what each step computed."""
    optimizers = [torch.optim.Adam(p, lr=2e-3, betas=(0.5, 0.999)) for p in (g_params, d_params)]
    torch.manual_seed(1)
    record = []
    for _ in range(steps):
        real, z = torch.randn(8, 6, dtype=dtype).tanh(), torch.randn(8, 4, dtype=dtype)
        ones, zeros = torch.ones(8, 1, dtype=dtype), torch.zeros(8, 1, dtype=dtype)
        fake = generator(z)
        optimizers[1].zero_grad()
        d_loss = F.binary_cross_entropy_with_logits(discriminator(real), ones)
        d_loss = d_loss + F.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros)
        d_loss.backward()
        optimizers[1].step()
        optimizers[0].zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
        g_loss.backward()
        optimizers[0].step()
        record += [d_loss.detach(), g_loss.detach(), fake.detach(), *(p.grad.clone() for p in (*g_params, *d_params))]
    return record + [p.detach().clone() for p in (*g_params, *d_params)] + [torch.rand(4)]


@FLOATS
def test_a_gan_with_two_optimizers_and_a_detached_fake_batch_trains_as_eager(dtype):
    torch.manual_seed(0)
    eager = gan(dtype)
    models = copy.deepcopy(eager)
    params = [list(m.parameters()) for m in models]
    actual = gan_steps(*(thunder_rs.jit(m) for m in models), *params, dtype)
    expected = gan_steps(*eager, *(list(m.parameters()) for m in eager), dtype)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        torch.testing.assert_close(a, e, rtol=0, atol=0, msg=lambda m: f"recorded tensor {i}: {m}")
    torch.testing.assert_close(models[0][1].running_var, eager[0][1].running_var, rtol=0, atol=0)


@pytest.mark.parametrize(
    "masks",
    [
        dict(src_key_padding_mask=torch.tensor([[False] * 5, [True] * 5])),  # a sequence of padding only
        dict(src_mask=torch.zeros(5, 5, dtype=torch.bool).index_fill(0, torch.tensor([2]), True)),
        dict(src_mask=torch.randn(5, 5)),  # additive: eager's fused layer hides every nonzero entry
    ],
    ids=["padding_only", "query_sees_nothing", "float_mask"],
)
def test_an_encoder_layers_fused_kernel_in_evaluation_gives_eagers_nans_and_reads_masks_as_eager(masks):
    """Without grad, eager's layer runs a fused kernel, which reads a float mask as booleans and
    gives NaN to a query that sees no key (the slow path gives it the attention of no values)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        out, expected = thunder_rs.jit(layer)(x, **masks), layer(x, **masks)
    assert torch.equal(out.isnan(), expected.isnan())
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5, equal_nan=True)


def metric_step(model, step, dtype):
    anchor, positive, negative = (torch.randn(6, 8, dtype=dtype) for _ in range(3))
    loss, similarity = model(anchor, positive, negative)
    return loss, [similarity]


@FLOATS
def test_metric_learning_with_triplet_and_cosine_losses_trains_as_eager(dtype):
    # cosine_similarity and pairwise_distance take their norms by the vector norm's kernel, whose
    # gradient x * (g / norm) is eager's (differentiating sqrt(sum(x * x)) was ulps off).
    trains_as_eager(Siamese, metric_step, dtype)


def tagging_step(model, step, dtype):
    labels = (torch.rand(64, 20) < 0.2).to(dtype)
    loss, logits = model(torch.randint(0, 50, (64, 6)), labels)
    return loss, [logits]


@FLOATS
def test_a_multi_label_tagger_trains_as_eager(dtype):
    # logsigmoid's gradient reads the exp(-|x|) eager's forward kernel keeps (aten.log_sigmoid_forward),
    # which past a vector's worth of elements rounds otherwise than torch.exp.
    trains_as_eager(MultiLabelTagger, tagging_step, dtype)
