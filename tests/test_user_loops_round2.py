"""What training programs do around a jitted model, and transforms and generation over one, next
to eager: gradient clipping after a jitted backward, an EMA of the weights in a jitted function,
SWA's averaged model with its BatchNorm statistics recomputed, loss scaling by hand with the AMP
kernels, ``torch.func`` and forward-mode AD inside and around a jitted function, and Hugging Face
``generate`` with sampling and beams, and checkpointed training with dropout (slow)."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch import nn
from torch.optim import swa_utils

import thunder_rs
from user_training import EXACT, rows, trains_as_eager

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    # (torch.autograd.forward_ad, which torch.func.jvp imports, scripts a function at its first import)
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated"),
]


# ---------------------------------------------------------------- around the call: clipping, EMA, loss scaling


@pytest.mark.parametrize(
    "clip",
    [
        lambda ps: nn.utils.clip_grad_norm_(ps, 0.1, norm_type=float("inf")),
        lambda ps: nn.utils.clip_grad_norm_(ps, 0.1, norm_type=1.0, foreach=True),
        lambda ps: nn.utils.clip_grad_norm_(ps, 0.1, foreach=False, error_if_nonfinite=True),
    ],
    ids=["inf_norm", "l1_foreach", "checked"],
)
def test_gradients_of_a_jitted_backward_clip_as_eagers(clip):
    make = lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # noqa: E731
    trains_as_eager(make, rows(4), after_backward=lambda model: clip(model.parameters()))


def ema_update(ema: nn.Module, model: nn.Module, decay: float):
    """timm's ModelEmaV2: every float entry of the state dict moves towards the model's; the
    others (BatchNorm's ``num_batches_tracked``) are copied."""
    with torch.no_grad():
        for averaged, current in zip(ema.state_dict().values(), model.state_dict().values()):
            if averaged.dtype.is_floating_point:
                averaged.copy_(averaged * decay + (1.0 - decay) * current)
            else:
                averaged.copy_(current)


def test_a_jitted_ema_of_a_models_state_dict_is_eagers():
    torch.manual_seed(0)
    make = lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))  # noqa: E731
    model, ema, expected = make(), make(), make()
    ema.load_state_dict(model.state_dict())
    expected.load_state_dict(model.state_dict())
    jitted = thunder_rs.jit(ema_update)
    for _ in range(3):
        model(torch.randn(5, 4)).square().mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        jitted(ema, model, 0.9)
        ema_update(expected, model, 0.9)
        torch.testing.assert_close(ema.state_dict(), expected.state_dict(), **EXACT)
    assert thunder_rs.compile_stats(jitted).cache_misses == 1


def test_batch_norm_with_a_cumulative_average_trains_as_eager():
    """``momentum=None`` averages the batches seen: eager passes ``1 / float(num_batches_tracked)``
    to its kernel, which the trace computes as a 0-d tensor. Only the decomposition took a tensor
    momentum, normalising and updating in float32 where eager's kernel updates in double: outputs,
    gradients and running statistics differed by ulps. The kernel takes it now, read as eager's number."""
    make = lambda: nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, momentum=None), nn.ReLU(), nn.Linear(6, 2))  # noqa: E731
    trains_as_eager(make, rows(4), steps=4)


def test_an_averaged_model_with_recomputed_batch_norm_statistics_is_eagers():
    """SWA's recipe: an EMA of the weights (``AveragedModel``), then ``update_bn`` recomputing the
    averaged model's BatchNorm statistics (``momentum=None``) over the data, the averaged model jitted."""

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))

    results = []
    for jit in (True, False):
        model = make()
        averaged = swa_utils.AveragedModel(model, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.9))
        call, averaged_call = (thunder_rs.jit(model), thunder_rs.jit(averaged)) if jit else (model, averaged)
        optimizer = torch.optim.SGD(model.parameters(), 0.1)
        torch.manual_seed(1)
        for _ in range(3):
            call(torch.randn(5, 4)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            averaged.update_parameters(model)
        swa_utils.update_bn([torch.randn(5, 4) for _ in range(3)], averaged_call)
        with torch.no_grad():
            out = averaged_call.eval()(torch.ones(2, 4))
        results.append((out, dict(averaged.named_buffers()), dict(averaged.named_parameters())))
    torch.testing.assert_close(results[0], results[1], **EXACT)


def unscale_and_update(grads: list, scale, growth_tracker):
    """A hand-written GradScaler step: unscale the gradients, note an inf or a NaN among them, then
    back the scale off or grow it."""
    found_inf = torch.zeros(1)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, scale.double().reciprocal().float())
    torch._amp_update_scale_(scale, growth_tracker, found_inf, 1.7, 0.3, 2)
    return found_inf


def test_loss_scaling_by_hand_with_the_amp_kernels_is_eagers():
    """``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_`` write their
    arguments in place and were refused; they are eager's CPU kernels now, computed from the
    gradients each call gets (an inf at step 2 skips the step and backs the scale off)."""
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    jitted = thunder_rs.jit(unscale_and_update)
    runs = [(jitted, models[0], torch.full((1,), 2.0**10), torch.zeros(1, dtype=torch.int32))]
    runs.append((unscale_and_update, models[1], torch.full((1,), 2.0**10), torch.zeros(1, dtype=torch.int32)))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    for step in range(5):
        x = torch.randn(3, 4)
        if step == 2:
            x[0, 0] = float("inf")
        found = []
        for (update, model, scale, tracker), optimizer in zip(runs, optimizers):
            (model(x).square().mean() * scale).backward()
            found.append(update([p.grad for p in model.parameters()], scale, tracker))
            if not found[-1].item():
                optimizer.step()
            optimizer.zero_grad()
        torch.testing.assert_close(found[0], found[1], **EXACT)
        torch.testing.assert_close(runs[0][2:], runs[1][2:], **EXACT)  # the scales and the counts
        torch.testing.assert_close(dict(models[0].named_parameters()), dict(models[1].named_parameters()), **EXACT)
    assert thunder_rs.compile_stats(jitted).cache_misses == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_unscaling_gradients_of_other_dtypes_is_eagers(dtype):
    """Half and bfloat16 gradients times the float inverse scale in float, rounded once."""
    grads = [torch.randn(5, 3).to(dtype) * 1000, torch.tensor(3.0, dtype=dtype)]
    expected, found, found_expected = [g.clone() for g in grads], torch.zeros(1), torch.zeros(1)
    inv_scale = torch.tensor([1 / 3])
    thunder_rs.jit(torch._amp_foreach_non_finite_check_and_unscale_)(grads, found, inv_scale)
    torch._amp_foreach_non_finite_check_and_unscale_(expected, found_expected, inv_scale)
    torch.testing.assert_close((grads, found), (expected, found_expected), **EXACT)


def test_a_scale_growing_past_float_keeps_its_value_as_eager():
    scale, tracker = torch.tensor([3e38]), torch.tensor([1], dtype=torch.int32)
    expected = (scale.clone(), tracker.clone())
    thunder_rs.jit(torch._amp_update_scale_)(scale, tracker, torch.zeros(1), 2.0, 0.5, 2)
    torch._amp_update_scale_(*expected, torch.zeros(1), 2.0, 0.5, 2)
    torch.testing.assert_close((scale, tracker), expected, **EXACT)


# ----------------------------------------------------------------------------- torch.func and forward-mode AD


def tangent_by_forward_ad(x):
    with fwAD.dual_level():
        y = fwAD.make_dual(x, torch.ones_like(x)).sin()
        return fwAD.unpack_dual(y).tangent


def jvp_of_sine(x):
    return torch.func.jvp(torch.sin, (x,), (torch.ones_like(x),))


def test_forward_mode_differentiation_inside_the_program_equals_eagers():
    """The traced tensor carried no tangent (was refused); now ``unpack_dual(y).tangent`` is eager's cos(x)."""
    x = torch.randn(3)
    assert torch.equal(thunder_rs.jit(tangent_by_forward_ad)(x), tangent_by_forward_ad(x))


def grad_of_product(x):
    return torch.func.grad(lambda y: (y.sin() * y).sum())(x)


@pytest.mark.parametrize("program", [jvp_of_sine, grad_of_product], ids=["jvp", "grad"])
def test_torch_func_transforms_inside_the_program_are_eagers(program):
    """``jvp`` failed at run time on the forward-AD level recorded while tracing and ``grad`` was
    refused; both now run as one eager call of the transform (``functorch_calls``)."""
    x = torch.randn(3)
    torch.testing.assert_close(thunder_rs.jit(program)(x), program(x), **EXACT)


def test_transforms_over_a_jitted_function_are_eagers():
    def f(x):
        return (x.exp() * x.cos()).sum()

    jitted, x = thunder_rs.jit(f), torch.randn(4, 3)
    torch.testing.assert_close(torch.func.grad(jitted)(x), torch.func.grad(f)(x), **EXACT)
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(jitted))(x), torch.func.vmap(torch.func.grad(f))(x))
    primal, tangent = torch.func.jvp(thunder_rs.jit(torch.sin), (x,), (torch.ones_like(x),))
    torch.testing.assert_close((primal, tangent), (x.sin(), x.cos()), **EXACT)


def test_functional_call_with_computed_parameters_inside_the_program_is_eagers():
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)

    def doubled(x):
        return torch.func.functional_call(layer, {"weight": layer.weight * 2, "bias": layer.bias}, (x,))

    x = torch.randn(4, 3)
    out, expected = thunder_rs.jit(doubled)(x), doubled(x)
    torch.testing.assert_close(out, expected, **EXACT)
    out.sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    expected.sum().backward()
    torch.testing.assert_close(grads, [p.grad for p in layer.parameters()], **EXACT)


# ---------------------------------------------------------------- Hugging Face: sampling, beams, checkpointing

HF_COMMON = dict(vocab_size=99, pad_token_id=0, bos_token_id=1, eos_token_id=2)
HF_LLAMA = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=64)


def hf_model(family: str, **config):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        settings = dict(n_layer=2, n_head=2, n_embd=32, n_positions=64, **HF_COMMON, **config)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(**settings))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_LLAMA, **HF_COMMON, **config))


def left_padded_prompt() -> dict:
    ids = torch.randint(3, 99, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0
    return dict(input_ids=ids, attention_mask=mask, pad_token_id=0)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")
@pytest.mark.parametrize(
    "family, options",
    [
        ("llama", dict(do_sample=True, top_k=10, temperature=0.7)),
        ("llama", dict(do_sample=True, top_p=0.9, repetition_penalty=1.3)),
        ("llama", dict(num_beams=3, num_return_sequences=2, output_scores=True, return_dict_in_generate=True)),
        ("gpt2", dict(num_beams=2, do_sample=True, no_repeat_ngram_size=2)),
        ("gpt2", dict(do_sample=True, min_p=0.05, output_logits=True, return_dict_in_generate=True)),
    ],
    ids=["top_k_temperature", "top_p_repetition_penalty", "beam_search", "beam_sample", "min_p"],
)
def test_generate_with_sampling_and_beams_on_a_jitted_model_is_eagers(family, options):
    """The logits processors and the draws run in ``generate``, eagerly, on the jitted forwards' logits."""
    model = hf_model(family).eval()
    eager = hf_model(family).eval()
    jmodel = thunder_rs.jit(model)
    results = []
    for call in (jmodel, eager):
        torch.manual_seed(7)
        results.append((call.generate(**left_padded_prompt(), max_new_tokens=5, **options), torch.get_rng_state()))
    (out, state), (expected, expected_state) = results
    if options.get("return_dict_in_generate"):
        torch.testing.assert_close(out.sequences, expected.sequences, **EXACT)
        scores = "scores" if "output_scores" in options else "logits"
        torch.testing.assert_close(getattr(out, scores), getattr(expected, scores), rtol=1e-4, atol=1e-5)
    else:
        torch.testing.assert_close(out, expected, **EXACT)
    assert torch.equal(state, expected_state)
    assert thunder_rs.compile_stats(jmodel).cache_misses == 3  # the prompt, the first step, the later steps


class LanguageModelLoss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")
@pytest.mark.parametrize(
    "family, dropout, use_reentrant",
    [
        ("gpt2", dict(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1), False),
        ("llama", dict(attention_dropout=0.1), True),
    ],
    ids=["gpt2", "llama_reentrant"],
)
def test_a_language_model_with_gradient_checkpointing_and_dropout_trains_as_eager(family, dropout, use_reentrant):
    def make():
        model = hf_model(family, **dropout).train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
        return LanguageModelLoss(model)

    def program(model, step):
        ids = torch.randint(3, 99, (2, 6))
        mask = torch.ones_like(ids)
        mask[1, 4:] = 0
        return model(ids, mask), []

    trains_as_eager(make, program)
