"""Training and generation loops as users write them, round 10, next to eager step by step from one
seed (harness in ``user_loops_round6.py``, loop maker in ``user_loops_round7.py``, programs in
``user_loops_round10.py``): the model jitted with the loop eager, and the model (or the whole step)
under ``torch.compile(backend="thunder_rs")``, compile counts read. Replicas synchronised by
gradient hooks outside ``no_sync``, a ``GradScaler`` over two optimizers one of which skips, bf16
autocast with master weights, averaged models of a parametrized model, SWA with per-group SWA
learning rates, distillation of hints, multi-crop DINO, masked language modelling, CLIP with its
temperature clamped in place, margin ranking over mined negatives, CTC, ``nn.Transformer``
translation and translations sampled by hand, whole steps compiled, and the transposing properties
as Dynamo's graphs read them (``aten.numpy_T``: a head tied by ``h @ W.T``). The rest of the round
is in ``test_user_loops_round10_more.py``."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler, swa_utils


from user_loops_round6 import trains_as_eager, wrap
from user_loops_round7 import batch, call_step, classify, loop, mlp
from user_loops_round9 import optimized
from user_loops_round10 import (
    ClipPair,
    CtcTagger,
    MaskedLM,
    Replicated,
    Translator,
    greedy_translate,
    mask_tokens,
    nucleus_translate,
)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # (Dynamo's graph breaks, at backward())
]
SLOW = pytest.mark.slow
MODES = ["jit", pytest.param("compile", marks=SLOW)]


def misses(mode, n):
    return None if mode == "compile" else n


def fit(world, loss, optimizer="optimizer"):
    loss.backward()
    world[optimizer].step()
    world[optimizer].zero_grad()
    return loss.detach()


# ------------------------------------------------------------------ accumulation, scaling, precision


def replicas_body(world, shards):
    """Two replicas (one a copy of the other), each its micro-batches, the loss divided by their
    number; all but the last inside ``no_sync``; after the last the ready gradients averaged over
    the replicas by hand (``_foreach_add_``, ``_foreach_div_``) and both optimizers stepped."""
    calls, replicas = (world["forward"].a, world["forward"].b), (world["a"], world["b"])
    losses = []
    for call, replica, micro in zip(calls, replicas, shards):
        for j, (x, y) in enumerate(micro):
            context = replica.no_sync() if j < len(micro) - 1 else torch.enable_grad()
            with context:
                loss = F.cross_entropy(call(x), y) / len(micro)
                loss.backward()
            losses.append(loss.detach())
    ready = [sorted(r.ready) for r in replicas]  # (their order: test_autograd_nodes' strict xfail)
    grads = [[p.grad for p in r.parameters()] for r in replicas]
    with torch.no_grad():
        summed = torch._foreach_add(grads[0], grads[1])
        torch._foreach_div_(summed, 2)
        for g in grads:
            torch._foreach_copy_(g, summed)
    for name in ("opt_a", "opt_b"):
        world[name].step()
        world[name].zero_grad()
    for r in replicas:
        r.ready.clear()
    return torch.stack(losses), ready


@pytest.mark.parametrize("mode", MODES)
def test_replicas_accumulating_in_no_sync_and_averaged_by_their_gradient_hooks_are_eagers(mode):
    def build():
        a, b = Replicated(mlp()), Replicated(mlp())
        b.load_state_dict(a.state_dict())
        return {
            "a": a,
            "b": b,
            "opt_a": torch.optim.SGD(a.parameters(), 0.1, momentum=0.9),
            "opt_b": torch.optim.SGD(b.parameters(), 0.1, momentum=0.9),
        }

    def step(world, i):
        return world["step"]([[batch(3) for _ in range(3)] for _ in range(2)])

    make = loop(build, replicas_body, whole=False, forwards=("a", "b"))
    worlds = trains_as_eager(make, step, modes=(mode,), misses=misses(mode, 2))
    assert all(torch.equal(p, q) for p, q in zip(worlds[mode]["a"].parameters(), worlds[mode]["b"].parameters()))


def two_scaled_body(world, x, y, i):
    """One ``GradScaler`` over two models and their optimizers: an infinite input to the second
    at step 1, so its gradients are not finite and only its step is skipped (the first's
    unscaled and clipped beforehand is taken), the scale backed off."""
    scaler, xb = world["scaler"], x.index_fill(0, torch.tensor([1]), float("inf")) if i == 1 else x
    loss = F.cross_entropy(world["forward"].first(x), y) + F.cross_entropy(world["forward"].second(xb), y)
    scaler.scale(loss).backward()
    scaler.unscale_(world["opt_first"])
    norm = nn.utils.clip_grad_norm_(world["first"].parameters(), 0.5)
    scaler.step(world["opt_first"])
    scaler.step(world["opt_second"])
    scaler.update()
    world["opt_first"].zero_grad()
    world["opt_second"].zero_grad()
    return loss.detach(), norm, scaler.get_scale()


@pytest.mark.parametrize("mode", MODES)
def test_a_grad_scaler_over_two_optimizers_skipping_only_the_one_with_an_inf_is_eagers(mode):
    def build():
        first, second = mlp(), mlp()
        return {
            "first": first,
            "second": second,
            "scaler": torch.amp.GradScaler("cpu", init_scale=256.0),
            "opt_first": torch.optim.Adam(first.parameters(), 1e-2),
            "opt_second": torch.optim.Adam(second.parameters(), 1e-2),
        }

    make = loop(build, two_scaled_body, whole=False, forwards=("first", "second"))
    step = lambda world, i: world["step"](*batch(), i)  # noqa: E731
    trains_as_eager(make, step, modes=(mode,), steps=4, misses=misses(mode, 2))


def master_body(world, x, y):
    """A bf16 copy of the model under bf16 autocast (a batch norm kept in float32 by autocast), its
    gradients cast into the float32 master's ``.grad``, AdamW on the master, the master copied back
    with ``torch._foreach_copy_`` under ``no_grad``, the batch norm's statistics copied too."""
    with torch.autocast("cpu", torch.bfloat16):
        logits = world["forward"].model(x)
    loss = F.cross_entropy(logits.float(), y)
    loss.backward()
    model, master = world["model"], world["master"]
    for p, m in zip(model.parameters(), master.parameters()):
        m.grad = p.grad.float()
        p.grad = None
    world["optimizer"].step()
    world["optimizer"].zero_grad()
    with torch.no_grad():
        torch._foreach_copy_(list(model.parameters()), list(master.parameters()))
        torch._foreach_copy_(list(master.buffers()), list(model.buffers()))
    return loss.detach(), str(logits.dtype)


def test_bf16_autocast_over_a_bf16_copy_with_float32_master_weights_and_batch_norm_is_eagers():
    def build():
        master = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
        model = copy.deepcopy(master).to(torch.bfloat16)
        return {"model": model, "master": master, "optimizer": torch.optim.AdamW(master.parameters(), 1e-2)}

    trains_as_eager(loop(build, master_body, whole=False), call_step, steps=4, misses=1)


# ---------------------------------------------------------------------------- averaging, SWA


def test_an_ema_of_a_weight_normed_model_evaluated_jitted_each_step_is_eagers():
    """``AveragedModel(multi_avg_fn=get_ema_multi_avg_fn)`` of a model with a ``weight_norm``
    parametrization (its ``original0``/``original1`` averaged), the average evaluated jitted."""
    x_val = torch.randn(5, 4)

    def build():
        net = mlp()
        nn.utils.parametrizations.weight_norm(net[0])
        ema = swa_utils.AveragedModel(net, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.8))
        return {"model": net, "ema": ema, "optimizer": torch.optim.SGD(net.parameters(), 0.2, momentum=0.9)}

    def body(world, x, y):
        loss = classify(world, x, y)
        world["ema"].update_parameters(world["model"])
        with torch.no_grad():
            return loss, world["forward"].ema(x_val)

    trains_as_eager(loop(build, body, whole=False, forwards=("model", "ema")), call_step, steps=4, misses=2)


def test_swa_with_per_group_swa_learning_rates_after_a_cosine_phase_and_update_bn_is_eagers():
    """Cosine annealing for two steps, then SWALR (a linear anneal to a learning rate per group),
    the average updated each step and its batch norm recomputed by ``update_bn`` over a loader
    of the jitted averaged model's inputs."""
    loader = [torch.randn(4, 4) for _ in range(2)]

    def build():
        net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
        optimizer = torch.optim.SGD([{"params": net[0].parameters()}, {"params": net[3].parameters(), "lr": 0.05}], 0.1)
        return {
            "model": net,
            "swa": swa_utils.AveragedModel(net),
            "optimizer": optimizer,
            "cosine": lr_scheduler.CosineAnnealingLR(optimizer, 2),
            "swalr": swa_utils.SWALR(optimizer, [0.02, 0.01], anneal_epochs=2, anneal_strategy="linear"),
        }

    def body(world, x, y, i):
        loss = classify(world, x, y)
        if i < 2:
            world["cosine"].step()
            return loss, torch.zeros(3, 3)
        world["swa"].update_parameters(world["model"])
        world["swalr"].step()
        swa_utils.update_bn(loader, world["swa"])
        world["swa"].eval()
        with torch.no_grad():
            out = world["forward"].swa(loader[0][:3])
        world["swa"].train()
        return loss, out

    make = loop(build, body, whole=False, forwards=("model", "swa"))
    trains_as_eager(make, lambda world, i: world["step"](*batch(), i), steps=5, misses=2)


# ------------------------------------------------------------------------------ distillation


class Hinted(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body, self.head = nn.Sequential(nn.Linear(4, width), nn.ReLU()), nn.Linear(width, 3)

    def forward(self, x):
        h = self.body(x)
        return self.head(h), h


def hints_body(world, x, y, temperature=3.0):
    """FitNets: the teacher under ``no_grad`` in ``eval()``; the student's hidden features
    regressed onto the teacher's through a learned projection, and the KL between tempered
    log-probabilities (``log_target=True``) times ``T**2``, with the hard cross-entropy."""
    with torch.no_grad():
        t_logits, t_hidden = world["forward"].teacher(x)
    s_logits, s_hidden = world["forward"].model(x)
    hint = F.mse_loss(world["projection"](s_hidden), t_hidden)
    kl = F.kl_div(
        F.log_softmax(s_logits / temperature, -1),
        F.log_softmax(t_logits / temperature, -1),
        reduction="batchmean",
        log_target=True,
    )
    loss = 0.5 * F.cross_entropy(s_logits, y) + 0.5 * temperature**2 * kl + hint
    return fit(world, loss), kl.detach()


@pytest.mark.parametrize("mode", MODES)
def test_distillation_of_hints_through_a_projection_with_a_log_target_kl_is_eagers(mode):
    def build():
        teacher, student, projection = Hinted(12).eval(), Hinted(6), nn.Linear(6, 12)
        teacher.requires_grad_(False)
        params = list(student.parameters()) + list(projection.parameters())
        return {
            "teacher": teacher,
            "model": student,
            "projection": projection,
            "optimizer": torch.optim.Adam(params, 1e-2),
        }

    make = loop(build, hints_body, whole=False, forwards=("model", "teacher"))
    trains_as_eager(make, call_step, modes=(mode,), steps=3, misses=misses(mode, 2))


def crops(x, sizes=(6, 6, 3, 3)):
    """Multi-crop views: a random window of ``size`` features per view, noise added."""
    views = []
    for size in sizes:
        start = int(torch.randint(0, x.shape[1] - size + 1, ()))
        views.append(
            F.pad(x[:, start : start + size], (0, x.shape[1] - size)) + 0.1 * torch.randn(x.shape[0], x.shape[1])
        )
    return views


def multi_crop_body(world, x, epoch):
    """DINO over two global and two local crops: the teacher sees the global ones, its temperature
    warmed up by epoch, the centre a buffer moved in place by ``mul_``/``add_``; the teacher's
    weights moved towards the student by ``_foreach_mul_``/``_foreach_add_`` under ``no_grad``."""
    views, center = crops(x), world["center"]
    t_temp = 0.04 + min(epoch, 2) * 0.01
    with torch.no_grad():
        t_out = [world["forward"].teacher(v) for v in views[:2]]
        t_probs = [F.softmax((t - center) / t_temp, -1) for t in t_out]
    s_logs = [F.log_softmax(world["forward"].model(v) / 0.1, -1) for v in views]
    pairs = [(a, b) for a in range(2) for b in range(4) if a != b]
    loss = sum(-(t_probs[a] * s_logs[b]).sum(-1).mean() for a, b in pairs) / len(pairs)
    loss = fit(world, loss)
    with torch.no_grad():
        center.mul_(0.9).add_(torch.cat(t_out).mean(0, keepdim=True), alpha=0.1)
        teacher, student = list(world["teacher"].parameters()), list(world["model"].parameters())
        torch._foreach_mul_(teacher, 0.95)
        torch._foreach_add_(teacher, student, alpha=0.05)
    return loss


@pytest.mark.parametrize("mode", MODES)
def test_multi_crop_dino_with_a_warming_teacher_temperature_and_a_centre_buffer_is_eagers(mode):
    def build():
        student = mlp(6, 8, 5)
        teacher = copy.deepcopy(student).requires_grad_(False)
        return {
            "model": student,
            "teacher": teacher,
            "center": torch.zeros(1, 5),
            "optimizer": torch.optim.SGD(student.parameters(), 0.1, momentum=0.9),
        }

    make = loop(build, multi_crop_body, whole=False, forwards=("model", "teacher"))
    trains_as_eager(
        make, lambda world, i: world["step"](torch.randn(4, 6), i), modes=(mode,), steps=4, misses=misses(mode, 2)
    )


# ------------------------------------------------------------------------ self-supervised, metric


def mlm_body(world, ids):
    masked, labels = mask_tokens(ids)
    loss = fit(world, world["forward"].model(masked, labels))
    world["scheduler"].step()
    return loss, masked, labels


@pytest.mark.parametrize("mode", MODES)
def test_masked_language_modelling_with_masks_drawn_per_step_is_eagers(mode):
    """BERT's 80/10/10 masking drawn in the loop each step, the labels of unmasked tokens ignored,
    a head tied to the embedding, dropout, AdamW with a linear warmup."""
    build = optimized(
        lambda ps: torch.optim.AdamW(ps, 1e-2, weight_decay=0.01),
        MaskedLM,
        scheduler=lambda o: lr_scheduler.LinearLR(o, 0.1, 1.0, total_iters=3),
    )
    step = lambda world, i: world["step"](torch.randint(2, 12, (3, 7)))  # noqa: E731
    trains_as_eager(loop(build, mlm_body, whole=False), step, modes=(mode,), steps=3, misses=misses(mode, 1))


def clip_body(world, images, tokens):
    """CLIP's symmetric loss, then the learned temperature clamped in place under ``no_grad``
    (``clamp_(0, log 100)``), as open_clip does after each step."""
    loss = fit(world, world["forward"].model(images, tokens))
    with torch.no_grad():
        world["model"].logit_scale.clamp_(0, 4.6052)
    return loss, world["model"].logit_scale.detach().clone()


@pytest.mark.parametrize("mode", MODES)
def test_clip_with_its_learned_temperature_clamped_in_place_is_eagers(mode):
    build = optimized(lambda ps: torch.optim.AdamW(ps, 0.5), ClipPair)  # (large: the clamp bites)
    step = lambda world, i: world["step"](torch.randn(4, 6), torch.randint(0, 10, (4, 3)))  # noqa: E731
    trains_as_eager(loop(build, clip_body, whole=False), step, modes=(mode,), steps=4, misses=misses(mode, 1))


def ranking_body(world, x, labels):
    """Batch-hard mining: the distances by ``cdist``, the hardest positive by ``argmax`` over the
    same-label distances, the hardest negative by ``argmin`` over the others;
    ``MarginRankingLoss`` of the pairs, and ``triplet_margin_with_distance_loss`` with a cosine
    distance and ``swap`` over the mined triplets."""
    z = world["forward"].model(x)
    d = torch.cdist(z, z)
    same = labels[:, None] == labels[None]
    positive = d.masked_fill(~same, float("-inf")).argmax(1)
    negative = d.masked_fill(same, float("inf")).argmin(1)
    rows = torch.arange(x.shape[0])
    ranking = nn.MarginRankingLoss(0.3)(d[rows, negative], d[rows, positive], torch.ones(x.shape[0]))
    cosine = lambda a, b: 1 - F.cosine_similarity(a, b)  # noqa: E731
    triplet = F.triplet_margin_with_distance_loss(
        z, z[positive], z[negative], distance_function=cosine, margin=0.2, swap=True
    )
    return fit(world, ranking + triplet), positive, negative


def test_margin_ranking_and_swapped_triplets_over_batch_hard_mined_pairs_are_eagers():
    build = optimized(lambda ps: torch.optim.SGD(ps, 0.1), lambda: mlp(4, 8, 3))
    step = lambda world, i: world["step"](torch.randn(8, 4), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))  # noqa: E731
    trains_as_eager(loop(build, ranking_body, whole=False), step, steps=4, misses=1)


def focal_body(world, x, targets, gamma=2.0, alpha=0.25):
    """torchvision's sigmoid focal loss by hand over multi-label targets, with ``alpha``."""
    logits = world["forward"].model(x)
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * (1 - p_t) ** gamma * (alpha * targets + (1 - alpha) * (1 - targets))
    return fit(world, loss.sum() / targets.sum().clamp(min=1))


@pytest.mark.slow
def test_a_sigmoid_focal_loss_over_multi_label_targets_is_eagers():
    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), lambda: mlp(4, 8, 5))
    step = lambda world, i: world["step"](torch.randn(6, 4), (torch.rand(6, 5) < 0.3).float())  # noqa: E731
    trains_as_eager(loop(build, focal_body, whole=False), step, steps=3, misses=1)


# ---------------------------------------------------------------------------------- sequences


def ctc_body(world, frames, input_lengths, targets, target_lengths):
    """CTC with inputs and targets of variable lengths (the targets concatenated), ``zero_infinity``
    for an input too short for its target, and the greedy decoding of the frames."""
    log_probs = world["forward"].model(frames)
    loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=True)
    return fit(world, loss), log_probs.argmax(-1)


@pytest.mark.parametrize("mode", MODES)
def test_ctc_training_with_variable_input_and_target_lengths_is_eagers(mode):
    def step(world, i):
        target_lengths = torch.randint(1, 4, (3,))
        input_lengths = torch.tensor([7, 5, 2 + i % 2])
        targets = torch.randint(1, 7, (int(target_lengths.sum()),))
        return world["step"](torch.randn(7, 3, 5), input_lengths, targets, target_lengths)

    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), CtcTagger)
    trains_as_eager(loop(build, ctc_body, whole=False), step, modes=(mode,), steps=3, misses=misses(mode, 1))


def translate_body(world, src, tgt, src_padding, i):
    """Teacher-forced training of ``nn.Transformer`` with label smoothing, and every other step a
    greedy translation in ``eval()`` under ``no_grad``."""
    logits = world["forward"].model(src, tgt[:, :-1], src_padding)
    loss = fit(world, F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), label_smoothing=0.1))
    translated = torch.zeros(1, dtype=torch.long)
    if i % 2 == 1:
        world["model"].eval()
        with torch.no_grad():
            translated = greedy_translate(world["forward"].model, src, src_padding)
        world["model"].train()
    return loss, translated


@pytest.mark.parametrize("mode", MODES)
def test_nn_transformer_translation_with_causal_and_padding_masks_and_greedy_decoding_is_eagers(mode):
    def step(world, i):
        src_padding = torch.arange(5) >= torch.tensor([[5], [3], [4]])
        return world["step"](torch.randint(2, 10, (3, 5)), torch.randint(2, 10, (3, 5)), src_padding, i)

    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), Translator)
    trains_as_eager(loop(build, translate_body, whole=False), step, modes=(mode,), steps=2)


# ------------------------------------------------------------------ properties in Dynamo's graphs


def transposed_heads(h, w, c):
    """A head tied to a weight through each transposing property (Dynamo writes them as
    ``aten.numpy_T``, ``aten.mT``, ``aten.matrix_H``, ``aten.mH``), one written through in place."""
    v = w.detach().clone()
    v.T.mul_(2)  # (through the view: v's own elements)
    out = h @ w.T + h @ w.mT + h @ w.H + h @ w.mH
    return out, v, (c.mH @ c).real.sum() + (c.H @ c).imag.sum()


@pytest.mark.parametrize("mode", ["jit", "compile"])
def test_a_head_tied_through_transposing_properties_gets_eagers_gradients_bit_for_bit(mode):
    """The MLM's head ``h @ embed.weight.T`` compiled for thunder_rs gave a gradient differing from
    eager's in the last bits: Dynamo's ``aten.numpy_T`` ran as an opaque eager call, and the
    matmul's vjp computed ``h.T @ g`` where eager (its operand a transposed layout) computes
    ``(g.T @ h).T``. The properties are now the symbols ``jit`` traces."""
    generator = torch.Generator().manual_seed(3)
    h, g = torch.randn(3, 7, 8, generator=generator), torch.randn(3, 7, 12, generator=generator)
    c0 = torch.randn(4, 3, dtype=torch.complex64, generator=generator)
    results = {}
    for m in ("eager", mode):
        torch._dynamo.reset()
        w = torch.randn(12, 8, generator=torch.Generator().manual_seed(4)).requires_grad_()
        c = c0.clone().requires_grad_()
        out, v, z = wrap(m, transposed_heads)(h, w, c)
        torch.autograd.backward([out, z], [g, torch.ones(())])
        results[m] = out, v, z, w.grad, c.grad
    torch.testing.assert_close(results[mode], results["eager"], rtol=0, atol=0)


# ------------------------------------------------------------------------ whole steps compiled

WHOLE = {
    "clip": (
        optimized(lambda ps: torch.optim.SGD(ps, 0.5), ClipPair),
        clip_body,
        lambda world, i: world["step"](torch.randn(4, 6), torch.randint(0, 10, (4, 3))),
    ),
    "ranking": (
        optimized(lambda ps: torch.optim.SGD(ps, 0.1), lambda: mlp(4, 8, 3)),
        ranking_body,
        lambda world, i: world["step"](torch.randn(8, 4), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])),
    ),
    "focal": (
        optimized(lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9), lambda: mlp(4, 8, 5)),
        focal_body,
        lambda world, i: world["step"](torch.randn(6, 4), (torch.rand(6, 5) < 0.3).float()),
    ),
    "mlm": (
        optimized(
            lambda ps: torch.optim.SGD(ps, 0.1),
            MaskedLM,
            scheduler=lambda o: lr_scheduler.LinearLR(o, 0.1, 1.0, total_iters=3),
        ),
        mlm_body,
        lambda world, i: world["step"](torch.randint(2, 12, (3, 7))),
    ),
}


@SLOW
@pytest.mark.parametrize("name", WHOLE)
def test_whole_steps_compiled_for_thunder_rs_are_eagers(name):
    """The step with its loss, backward and (plain SGD) optimizer step under one
    ``torch.compile``."""
    build, body, step = WHOLE[name]
    trains_as_eager(loop(build, body), step, modes=("compile",), steps=3)


# --------------------------------------------------------------------------------- generation


@pytest.mark.parametrize("mode", MODES)
def test_nucleus_sampled_translations_after_training_are_eagers(mode):
    """Two training steps, then translations sampled by hand (top-p, EOS ending rows) in
    ``eval()`` under ``no_grad``: the tokens, and the random state after."""

    def body(world, src, tgt, src_padding, i):
        logits = world["forward"].model(src, tgt[:, :-1], src_padding)
        loss = fit(world, F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten()))
        if i < 1:
            return loss, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.bool)
        world["model"].eval()
        with torch.no_grad():
            sampled, done = nucleus_translate(world["forward"].model, src, src_padding)
        world["model"].train()
        return loss, sampled, done

    def step(world, i):
        src_padding = torch.arange(5) >= torch.tensor([[5], [2], [4], [3]])
        return world["step"](torch.randint(1, 10, (4, 5)), torch.randint(0, 10, (4, 4)), src_padding, i)

    build = optimized(lambda ps: torch.optim.Adam(ps, 5e-2), Translator)
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=2)


def rescaled_through_views(w, x):
    with torch.no_grad():
        w.T.mul_(0.5)
        w.mT[0].add_(1)
    return (x @ w.T).sum()


@pytest.mark.parametrize("mode", ["jit", "compile"])
def test_writes_under_no_grad_through_transposing_properties_of_a_parameter_are_eagers(mode):
    """A weight rescaled in place through ``w.T`` and ``w.mT[0]`` under ``no_grad`` (as a norm
    constraint by hand does) then read: compiled for thunder_rs before ``aten.numpy_T``/``aten.mT``
    were the property symbols, the writes were lost (the weight, its version and the loss eager's
    before the writes)."""
    results = {}
    for m in ("eager", mode):
        torch._dynamo.reset()
        w = torch.arange(6.0).reshape(2, 3).requires_grad_()
        loss = wrap(m, rescaled_through_views)(w, torch.ones(4, 3))
        loss.backward()
        results[m] = loss.detach(), w.detach().clone(), w.grad, w._version
    torch.testing.assert_close(results[mode], results["eager"], rtol=0, atol=0)
