"""Training and generation loops as users write them, round 9, next to eager step by step from one
seed (harness in ``user_loops_round6.py``, loop maker in ``user_loops_round7.py``, programs in
``user_loops_round9.py``): the model jitted with the loop eager, and the model (or the whole step)
under ``torch.compile(backend="thunder_rs")``, compile counts read. Optimizers with options not yet
covered (nesterov with gradients kept, RMSprop centered with momentum, Adagrad's initial
accumulator, RAdam past its rectification, LBFGS with a strong Wolfe line search), schedulers
(warm restarts at fractional epochs, a one-cycle cycling Adam's betas, a plateau on a maximized
metric, lambdas over the loop's state), clipping that raises on a non-finite norm, a WGAN-GP
alternating with its generator, a non-saturating GAN, MoCo with its queue as buffers, mixup or
CutMix per step, curriculum lengths, learned task uncertainties, a rollback to a saved state,
evaluation between micro-batches, dropout reseeded per epoch, anomaly detection, scheduled
sampling per token, REINFORCE over a Python environment, sampling and beam search by hand."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

from user_loops_round6 import trains_as_eager, wrap
from user_loops_round7 import batch, call_step, classify, loop, mlp
from user_loops_round9 import (
    Adversaries,
    Corridor,
    KeyedEncoders,
    MultiTask,
    RecurrentLM,
    Seq2Seq,
    TinyLM,
    beam_search_by_hand,
    discounted,
    optimized,
    sample_by_hand,
)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # (Dynamo's graph breaks, at backward())
]
SLOW = pytest.mark.slow


def keeping_grads(world, x, y):
    """``classify`` with the gradients zeroed in place (the base class's ``zero_grad``)."""
    loss = F.cross_entropy(world["forward"].model(x), y)
    loss.backward()
    world["optimizer"].step()
    torch.optim.Optimizer.zero_grad(world["optimizer"], set_to_none=False)
    return loss.detach()


# ---------------------------------------------------------------------------------- optimizers

OPTIMIZERS = {
    "sgd_nesterov_for_loop": lambda ps: torch.optim.SGD(
        ps, 0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=False
    ),
    "rmsprop_centered_momentum": lambda ps: torch.optim.RMSprop(
        ps, 1e-2, centered=True, momentum=0.5, weight_decay=0.01, foreach=False
    ),
    "adagrad_initial_accumulator": lambda ps: torch.optim.Adagrad(
        ps, 0.1, lr_decay=0.01, initial_accumulator_value=0.1, foreach=True
    ),
    "adamax_maximize_for_loop": lambda ps: torch.optim.Adamax(ps, 1e-2, weight_decay=0.1, maximize=True, foreach=False),
    "nadam_momentum_decay": lambda ps: torch.optim.NAdam(
        ps, 1e-2, momentum_decay=0.01, weight_decay=0.1, decoupled_weight_decay=True, foreach=True
    ),
    "adam_amsgrad_for_loop": lambda ps: torch.optim.Adam(ps, 1e-2, amsgrad=True, weight_decay=0.1, foreach=False),
    "sgd_dampened_fused_off": lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.8, dampening=0.3, fused=False),
}
DEFAULT_OPTIMIZERS = ("sgd_nesterov_for_loop", "rmsprop_centered_momentum", "nadam_momentum_decay")


@pytest.mark.parametrize("name", [n if n in DEFAULT_OPTIMIZERS else pytest.param(n, marks=SLOW) for n in OPTIMIZERS])
def test_optimizers_with_gradients_zeroed_in_place_step_the_jitted_and_compiled_models_as_eager(name):
    """The gradients kept as tensors zeroed in place (``set_to_none=False``): the jitted call's
    backward accumulates into them as eager's does."""
    trains_as_eager(loop(optimized(OPTIMIZERS[name]), keeping_grads, whole=False), call_step, misses=1)


def test_radam_past_its_rectification_threshold_is_eagers():
    """RAdam's variance rectification starts at its sixth step (``rho_t > 5``)."""
    build = optimized(lambda ps: torch.optim.RAdam(ps, 1e-2, foreach=False))
    trains_as_eager(loop(build, classify, whole=False), call_step, steps=7, misses=1)


def test_lbfgs_with_a_strong_wolfe_line_search_calling_the_jitted_model_is_eagers():
    """The closure is called a varying number of times per step by the line search."""

    def body(world, x, y):
        calls = []

        def closure():
            world["optimizer"].zero_grad()
            loss = F.cross_entropy(world["forward"].model(x), y)
            loss.backward()
            calls.append(loss.detach())
            return loss

        loss = world["optimizer"].step(closure)
        return loss.detach(), torch.stack(calls)

    build = optimized(lambda ps: torch.optim.LBFGS(ps, lr=1, max_iter=5, history_size=3, line_search_fn="strong_wolfe"))
    trains_as_eager(loop(build, body, whole=False), call_step, misses=1)


def test_sparse_embedding_gradients_for_sparse_adam_are_refused_naming_the_line():
    """Eager's gradient of ``nn.Embedding(sparse=True)`` is a sparse tensor (SparseAdam refuses a
    dense one): the jitted call refuses, naming the user's line that called the embedding; under
    ``torch.compile`` the graph runs eagerly with a warning naming it, and trains as eager."""

    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(10, 4, sparse=True), nn.Linear(4, 2)

        def forward(self, ids):
            return self.head(self.embed(ids).mean(1))  # the line named

    where = rf"sparse gradients .*test_user_loops_round9\.py:{Bag.forward.__code__.co_firstlineno + 1}"
    with pytest.raises(ThunderNotImplementedError, match=where):
        thunder_rs.jit(Bag())(torch.randint(0, 10, (3, 5)))

    def train(mode):
        torch.manual_seed(0)
        model = Bag()
        call = wrap(mode, model)
        sparse, dense = torch.optim.SparseAdam([model.embed.weight], 1e-2), torch.optim.Adam(model.head.parameters())
        record = []
        for _ in range(3):
            loss = call(torch.randint(0, 10, (3, 5))).square().mean()
            loss.backward()
            record.append((loss.detach(), model.embed.weight.grad.is_sparse, model.embed.weight.grad.to_dense()))
            for optimizer in (sparse, dense):
                optimizer.step()
                optimizer.zero_grad()
        return record, [p.detach().clone() for p in model.parameters()], torch.get_rng_state()

    torch._dynamo.reset()
    with pytest.warns(UserWarning, match=f"runs eagerly: .*{where}"):
        compiled = train("compile")
    torch.testing.assert_close(compiled, train("eager"), rtol=0, atol=0)


# ---------------------------------------------------------------------------------- schedulers


def test_warm_restarts_stepped_at_fractional_epochs_are_eagers():
    """``CosineAnnealingWarmRestarts.step(epoch + i / iters)`` per batch, the period doubling."""

    def body(world, x, y, epoch):
        loss = classify(world, x, y)
        world["scheduler"].step(epoch)
        return loss, world["scheduler"].T_cur, world["scheduler"].T_i

    build = optimized(
        lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9),
        scheduler=lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=1, T_mult=2, eta_min=1e-3),
    )
    trains_as_eager(loop(build, body, whole=False), lambda world, i: world["step"](*batch(), i / 2 + 0.25), steps=6)


def test_a_one_cycle_schedule_cycling_adams_betas_is_eagers():
    """OneCycleLR cycles Adam's first beta inversely to the learning rate (``cycle_momentum``)."""

    def body(world, x, y):
        loss = classify(world, x, y)
        world["scheduler"].step()
        return loss, torch.tensor(world["optimizer"].param_groups[0]["betas"])

    build = optimized(
        lambda ps: torch.optim.Adam(ps, 1e-2),
        scheduler=lambda o: lr_scheduler.OneCycleLR(o, 0.05, total_steps=5, anneal_strategy="linear", base_momentum=0.8),
    )
    trains_as_eager(loop(build, body, whole=False), call_step, steps=5, misses=1)


def test_a_plateau_schedule_on_a_maximized_accuracy_with_per_group_minimums_is_eagers():
    x_val, y_val = batch(12)

    def build():
        net = mlp()
        groups = [{"params": net[0].parameters()}, {"params": net[2].parameters(), "lr": 0.3}]
        optimizer = torch.optim.SGD(groups, 0.5)
        plateau = lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=0.3, patience=0, threshold=0.01, threshold_mode="abs", min_lr=[0.1, 0.05]
        )
        return {"model": net, "optimizer": optimizer, "scheduler": plateau}

    def body(world, x, y):
        loss = classify(world, x, y)
        with torch.no_grad():
            accuracy = (world["forward"].model(x_val).argmax(-1) == y_val).float().mean()
        world["scheduler"].step(accuracy.item())
        return loss, accuracy, world["scheduler"].best, world["scheduler"].num_bad_epochs

    trains_as_eager(loop(build, body, whole=False), call_step, steps=5, misses=2)


def test_lambda_schedules_over_the_loops_state_in_a_sequence_are_eagers():
    """A LambdaLR whose lambdas (one per group) read a dict the loop writes from the loss, then a
    StepLR, in a SequentialLR."""
    seen = {"worse": 0, "last": float("inf")}

    def build():
        seen.update(worse=0, last=float("inf"))
        net = mlp()
        optimizer = torch.optim.SGD([{"params": net[0].parameters()}, {"params": net[2].parameters()}], 0.2)
        lambdas = [lambda s: 0.5 ** seen["worse"], lambda s: 1 / (1 + s + seen["worse"])]
        first = lr_scheduler.LambdaLR(optimizer, lambdas)
        second = lr_scheduler.StepLR(optimizer, 1, gamma=0.7)
        sequence = lr_scheduler.SequentialLR(optimizer, [first, second], milestones=[3])
        return {"model": net, "optimizer": optimizer, "scheduler": sequence, "first": first, "second": second}

    def body(world, x, y):
        loss = classify(world, x, y)
        seen["worse"] += int(loss.item() > seen["last"])
        seen["last"] = loss.item()
        world["scheduler"].step()
        return loss, seen["worse"]

    trains_as_eager(loop(build, body, whole=False), call_step, steps=5, misses=1)


# ---------------------------------------------------------------------------------- clipping


def test_clipping_raising_on_a_non_finite_norm_skips_the_step_as_eager():
    """An infinite input at the second step: its gradients non-finite, ``clip_grad_norm_(...,
    error_if_nonfinite=True)`` raises, the loop catches it, zeroes the gradients and goes on."""

    def body(world, x, y, i):
        if i == 1:
            x = x.index_fill(0, torch.tensor([2]), float("inf"))
        loss = F.cross_entropy(world["forward"].model(x), y)
        loss.backward()
        try:
            norm = nn.utils.clip_grad_norm_(world["model"].parameters(), 0.5, error_if_nonfinite=True, foreach=False)
        except RuntimeError as e:
            world["optimizer"].zero_grad()
            return loss.detach(), str(e)
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach(), norm

    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2))
    trains_as_eager(loop(build, body, whole=False), lambda world, i: world["step"](*batch(), i), steps=3, misses=1)


def test_total_norms_clipped_by_hand_after_value_clipping_are_eagers():
    """``clip_grad_value_`` (foreach), then ``get_total_norm`` of the gradients (infinity norm) and
    ``clip_grads_with_norm_`` with it."""

    def body(world, x, y):
        loss = F.cross_entropy(world["forward"].model(x), y)
        loss.backward()
        grads = [p.grad for p in world["model"].parameters()]
        nn.utils.clip_grad_value_(world["model"].parameters(), 0.05, foreach=True)
        norm = nn.utils.get_total_norm(grads, norm_type=float("inf"))
        nn.utils.clip_grads_with_norm_(world["model"].parameters(), 0.02, norm)
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach(), norm

    build = optimized(lambda ps: torch.optim.SGD(ps, 0.5, momentum=0.9))
    trains_as_eager(loop(build, body), call_step)
