"""What training and inference programs do around and inside a jitted model, round 3, next to
eager: a LoRA adapter switched off and rescaled between steps, optional inputs and ``**kwargs``
that change between calls, gradient accumulation with loss scaling under autocast, recurrent
layers over padded batches of variable lengths, scheduled sampling and CutMix drawing inside the
program, spectral normalisation alternating training and evaluation, layers unfrozen mid-training,
and Hugging Face ``generate`` with a static cache. Models in ``user_models_round3.py``."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError
from user_models_round3 import (
    LoRALinear,
    OptionalInputs,
    RecurrentClassifier,
    ScheduledSampling,
    cutmix,
    cutmix_by_mask,
    lora_mlp,
    small_convnet,
)
from user_training import EXACT, rows, trains_as_eager

pytestmark = pytest.mark.usefixtures("one_thread")


def switch_adapters(step, model):
    for layer in model:
        if isinstance(layer, LoRALinear):
            layer.enabled, layer.scale = step % 2 == 0, 0.5 if step < 3 else 0.25


def test_a_lora_adapter_switched_off_and_rescaled_between_steps_trains_as_eager():
    """Each of (on, off) x (0.5, 0.25) compiles once; the adapter's weights get no gradient while off."""
    trains_as_eager(lora_mlp, rows(4), steps=6, before=switch_adapters, compiles=4)


CALLS = [
    lambda x, mask: {},
    lambda x, mask: {"mask": mask},
    lambda x, mask: {"bias": torch.randn(4)},
    lambda x, mask: {"mask": mask, "gate": torch.randn(3, 4)},
    lambda x, mask: {"scale": 2.0, "mask": None},
    lambda x, mask: {"gate": torch.randn(3, 4), "scale": 3.0},
]


def optional_inputs(model, step):
    x, mask = torch.randn(3, 4), torch.rand(3, 4) > 0.3
    out = model(x, **CALLS[step](x, mask))
    return out.square().mean(), [out]


def test_optional_tensors_and_kwargs_that_change_between_calls_are_eagers():
    trains_as_eager(OptionalInputs, optional_inputs, steps=len(CALLS), compiles=len(CALLS))


def accumulated_with_a_scaler():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)

    def program(model, step):
        for micro in range(2):  # micro-batches of 3 and 4 rows; the step's loss is the last one's
            x, y = torch.randn(3 + micro, 4), torch.randint(0, 3, (3 + micro,))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
                loss = F.cross_entropy(out, y, label_smoothing=0.1) / 2
            if micro == 0:
                scaler.scale(loss).backward()
        return scaler.scale(loss), [out]

    def step_with_the_scaler(model):
        optimizer = step_with_the_scaler.optimizer
        scaler.unscale_(optimizer)
        return nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=True)

    return program, step_with_the_scaler, scaler


def test_gradient_accumulation_with_a_grad_scaler_under_autocast_trains_as_eager():
    """Two micro-batches of other sizes per step, scaled and unscaled by a GradScaler, clipped
    with ``foreach``: the second size compiles once more (symbolic from then on)."""
    results = []
    for jit in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3))
        call = thunder_rs.jit(model) if jit else model
        program, clip, scaler = accumulated_with_a_scaler()
        optimizer = torch.optim.AdamW(model.parameters(), 1e-2)
        clip.optimizer, record = optimizer, []
        for step in range(3):
            torch.manual_seed(10 + step)
            loss, outputs = program(call, step)
            loss.backward()
            record += [loss.detach(), *outputs, clip(model), torch.tensor(scaler.get_scale())]
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        results.append(
            [*record, *(p.detach() for p in model.parameters()), *optimizer.state_dict()["state"][0].values()]
        )
        if jit:
            assert thunder_rs.compile_stats(call).cache_misses == 2
    torch.testing.assert_close(results[0], results[1], **EXACT)


def variable_lengths(model, step):
    length = (7, 5, 6)[step]
    lengths = torch.randint(1, length + 1, (4,))
    tokens = torch.randint(1, 10, (4, length)) * (torch.arange(length)[None] < lengths[:, None])
    out = model(tokens, lengths)
    return F.cross_entropy(out, torch.randint(0, 3, (4,))), [out]


@pytest.mark.parametrize("cell", [nn.RNN, nn.GRU, nn.LSTM], ids=["rnn", "gru", "lstm"])
def test_recurrent_layers_over_padded_batches_of_variable_lengths_train_as_eager(cell):
    """Bidirectional, two layers, dropout between them; lengths 7, 5, 6: the second compiles
    symbolic lengths, which serve the third."""
    trains_as_eager(lambda: RecurrentClassifier(cell), variable_lengths, compiles=2)


def scheduled(model, step):
    targets = torch.randint(0, 8, (3, 5))
    logits = model(targets, 0.5)
    return F.cross_entropy(logits.reshape(-1, 8), targets[:, 1:].reshape(-1)), [logits]


def test_scheduled_sampling_drawing_inside_the_forward_trains_as_eager():
    trains_as_eager(ScheduledSampling, scheduled)


@pytest.mark.parametrize("transform, compiles", [(cutmix_by_mask, 1), (cutmix, 4)], ids=["mask", "box"])
def test_cutmix_inside_the_jitted_step_is_eagers(transform, compiles):
    """The box as a mask compiles once; as Python slices of numbers read from the draws, once per box."""
    results = []
    for jit in (True, False):
        torch.manual_seed(0)
        model = small_convnet()
        step_fn = thunder_rs.jit(transform) if jit else transform
        optimizer, record = torch.optim.SGD(model.parameters(), 0.1), []
        for step in range(4):
            torch.manual_seed(step)
            loss, out = step_fn(model, torch.randn(4, 3, 8, 8), torch.randint(0, 3, (4,)))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            record += [loss.detach(), out.detach(), torch.get_rng_state(), *model.state_dict().values()]
        results.append(record)
        if jit:
            assert thunder_rs.compile_stats(step_fn).cache_misses == compiles
    torch.testing.assert_close(results[0], results[1], **EXACT)


def test_spectral_norm_alternating_training_and_evaluation_is_eagers():
    """Power iterations in training steps, none in evaluation (under ``no_grad``): outputs and
    the ``u``/``v`` buffers after every step are eager's; one compile per mode."""
    results = []
    for jit in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(
            parametrizations.spectral_norm(nn.Linear(4, 6), n_power_iterations=2), nn.LeakyReLU(0.2),
            parametrizations.spectral_norm(nn.Linear(6, 3)),
        )  # fmt: skip
        call, record = thunder_rs.jit(model) if jit else model, []
        optimizer = torch.optim.Adam(model.parameters(), 1e-2)
        for step in range(6):
            torch.manual_seed(step)
            model.train(step not in (2, 4))
            if model.training:
                out = call(torch.randn(3, 4))
                out.square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            else:
                with torch.no_grad():
                    out = call(torch.randn(3, 4))
            record += [out.detach(), *(t.clone() for t in model.state_dict().values())]
        results.append(record)
        if jit:
            assert thunder_rs.compile_stats(call).cache_misses == 2
    torch.testing.assert_close(results[0], results[1], **EXACT)


def unfreeze_at_step_2(step, model):
    if step == 0:
        model[0].requires_grad_(False)
        model[1].eval()
    if step == 2:  # (the optimizer was made with every parameter: frozen ones have no gradient)
        model[0].requires_grad_(True)
        model[1].train()
    if step == 4:
        model[3].weight.requires_grad_(False)


def classify(model, step):
    out = model(torch.randn(5, 4))
    return F.cross_entropy(out, torch.randint(0, 3, (5,))), [out]


def test_layers_frozen_and_unfrozen_between_steps_train_as_eager():
    make = lambda: nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))  # noqa: E731
    trains_as_eager(make, classify, steps=5, before=unfreeze_at_step_2, compiles=3)


@pytest.mark.parametrize(
    "options", [{}, {"do_sample": True, "top_k": 5}, {"num_beams": 2}], ids=["greedy", "sampling", "beams"]
)
def test_generate_with_a_static_cache_on_a_jitted_model_is_eagers(options):
    """``cache_implementation="static"``: the forwards write the preallocated cache in place."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=64,
        vocab_size=99, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    ids = torch.randint(3, 99, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0
    results = []
    for jit in (True, False):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
        call = thunder_rs.jit(model) if jit else model
        torch.manual_seed(7)
        out = call.generate(
            input_ids=ids, attention_mask=mask, pad_token_id=0, max_new_tokens=5, cache_implementation="static",
            **options,
        )  # fmt: skip
        results.append((out, torch.get_rng_state()))
        if jit:
            assert thunder_rs.compile_stats(call).cache_misses == 2  # the prompt, then each step
    torch.testing.assert_close(results[0], results[1], **EXACT)


def numpy_mixup(x, perm):
    lam = np.random.beta(0.4, 0.4)
    return lam * x + (1 - lam) * x[perm]


def test_a_mixing_weight_drawn_with_numpy_inside_the_program_is_refused_naming_its_use():
    """``np.random.beta`` draws one number, as ``np.random.uniform`` does: it is repeated by
    every call, and its use refused (it was refused as if it drew an array)."""
    used = r"numpy.random.beta: the number it drew at .*round3.py:\d+ is used \(in arithmetic\) at .*round3.py:\d+"
    with pytest.raises(ThunderNotImplementedError, match=used):
        thunder_rs.jit(numpy_mixup)(torch.randn(4, 3), torch.randperm(4))


MIXUP_IN_A_FRESH_PROCESS = """
import numpy as np
import sys
import torch
import thunder_rs

assert "numpy.random" not in sys.modules  # (NumPy 2 imports it on the first use of np.random)

def mixup(x, perm):
    lam = np.random.beta(0.4, 0.4)
    return lam * x + (1 - lam) * x[perm]

try:
    thunder_rs.jit(mixup)(torch.randn(4, 3), torch.randperm(4))
except thunder_rs.errors.ThunderNotImplementedError as e:
    print(e)
"""


@pytest.mark.slow  # (a new process: about 5 s)
def test_a_numpy_draw_in_a_process_that_had_not_used_numpy_random_is_refused_naming_the_line():
    """The first use of ``np.random`` imports ``numpy.random``: made while the program was
    traced, it drew unseen (no wrapper on a module not imported yet), and every compiled call
    reused the first call's mixing weight, leaving NumPy's generator as it was."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", MIXUP_IN_A_FRESH_PROCESS], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "numpy.random.beta: the number it drew at <string>:10 is used (in arithmetic) at <string>:11" in run.stdout
