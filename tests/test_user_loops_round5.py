"""Training loops as users write them, round 5, next to eager step by step (harness in
``user_loops_round5.py``): whole steps (``backward``, ``optimizer.step()``, ``zero_grad``, a
scheduler, clipping, a ``GradScaler``) under ``torch.compile(backend="thunder_rs")`` and refused
with their line under ``thunder_rs.jit``; EMAs, weight decay and SGD by hand in jitted functions;
parametrizations trained; ``functional_call`` with a parameter dict per step and MAML's inner
step; training and evaluation alternating; losses with every target ignored; ``retain_graph``,
``inputs=`` and gradient penalties; ``detach_`` of an activation, tensor and module hooks; ``checkpoint_sequential``;
parameter groups added and layers frozen mid-training; accumulation with a sync flag; a teacher
switched to evaluation inside the forward; tied weights.

What differed from eager before: a WGAN-GP critic's gradients (LayerNorm, GELU, dropout) in the
last bits at the first step: the double backward's recomputation summed, through one alias per
argument, every gradient it sends a parameter before the parameter's other gradients (the
critic's loss on real and fake samples) were added, where eager adds each as it comes. And
``detach_`` of an activation (a stop-gradient in the forward) was refused.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations
from torch.optim import swa_utils

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError
from user_loops_round5 import DYNAMO_OPTIMIZER_TOL, assert_same, run, trains_as_eager, wrap

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # (Dynamo's graph breaks, at backward())
]


def mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def batch(rows: int = 5):
    return torch.randn(rows, 4), torch.randint(0, 3, (rows,))


def optimize(world: dict, loss: torch.Tensor) -> torch.Tensor:
    loss.backward()
    world["optimizer"].step()
    world["optimizer"].zero_grad()
    return loss.detach()


def forward_step(make_model, make_optimizer):
    """A program whose forward is ``make_model()`` (jitted or compiled) and whose step is eager."""

    def make(mode):
        model = make_model()
        forward = model if mode == "eager" else wrap(mode, model)
        return {"model": model, "optimizer": make_optimizer(model.parameters()), "step": forward}

    return make


def whole_step(make_optimizer, *, set_to_none=True, after_step=None, before_step=None, model=mlp):
    """A program whose whole step (loss, backward, optimizer step, ``after_step``, zero_grad) is
    compiled, or under ``jit`` runs eagerly around the jitted model."""

    def make(mode):
        net = model()
        optimizer = make_optimizer(net.parameters())
        forward = thunder_rs.jit(net) if mode == "jit" else net
        extras = before_step(optimizer) if before_step else {}

        def train_step(x, y):
            loss = F.cross_entropy(forward(x), y)
            loss.backward()
            optimizer.step()
            if after_step is not None:
                after_step(extras)
            optimizer.zero_grad(set_to_none=set_to_none)
            return loss.detach()

        step = train_step if mode in ("eager", "jit") else wrap(mode, train_step)
        return {"model": net, "optimizer": optimizer, "step": step, **extras}

    return make


def call_step(world, i):
    return world["step"](*batch())


# ------------------------------------------------------------------- whole steps, optimizers inside


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_compiled_whole_step_with_nesterov_momentum_and_weight_decay_is_eagers(set_to_none):
    sgd = lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9, nesterov=True, weight_decay=1e-2)  # noqa: E731
    trains_as_eager(whole_step(sgd, set_to_none=set_to_none), call_step)


def test_a_jitted_whole_step_is_refused_at_its_backward():
    model, optimizer = mlp(), None

    def train_step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    with pytest.raises(ThunderNotImplementedError, match=r"backward: the program differentiates at .*round5.py:\d+"):
        thunder_rs.jit(train_step)(*batch())


OPTIMIZERS = {
    "adam_amsgrad": lambda ps: torch.optim.Adam(ps, 1e-2, amsgrad=True),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, 1e-2, foreach=True),
    "adamw_fused": lambda ps: torch.optim.AdamW(ps, 1e-2, fused=True),
    "rmsprop_centered": lambda ps: torch.optim.RMSprop(ps, 1e-2, momentum=0.5, centered=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, 1e-1),
}


@pytest.mark.parametrize(
    "name",
    [
        "adam_amsgrad",
        "adamw_fused",
        pytest.param("adamw_foreach", marks=pytest.mark.slow),
        pytest.param("rmsprop_centered", marks=pytest.mark.slow),
        pytest.param("adagrad", marks=pytest.mark.slow),
    ],
)
def test_compiled_whole_steps_with_adaptive_optimizers_are_dynamos(name):
    """Bit for bit what Dynamo computes without a backend, which is eager's within a rounding
    (``DYNAMO_OPTIMIZER_TOL``; fused AdamW, one kernel either way, is eager's exactly); the jitted
    model with the step eager is eager's exactly."""
    make = whole_step(OPTIMIZERS[name], set_to_none=name != "adagrad")
    trains_as_eager(make, call_step, modes=("jit",))
    torch._dynamo.reset()
    compiled = run(make, call_step, "compile")
    torch._dynamo.reset()
    assert_same(compiled, run(make, call_step, "dynamo_eager"))
    assert_same(compiled, run(make, call_step, "eager"), **({} if name == "adamw_fused" else DYNAMO_OPTIMIZER_TOL))


def one_cycle(optimizer):
    return {"scheduler": torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.5, total_steps=10)}


def test_a_one_cycle_schedule_stepped_inside_the_step_is_eagers():
    sgd = lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9)  # noqa: E731
    trains_as_eager(whole_step(sgd, before_step=one_cycle, after_step=lambda e: e["scheduler"].step()), call_step)


def test_a_plateau_schedule_stepped_with_the_loss_inside_the_step_is_eagers():
    def plateau(optimizer):
        return {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)}

    def make(mode):
        world = whole_step(lambda ps: torch.optim.SGD(ps, 0.5), before_step=plateau)(mode)
        step = world["step"]

        def train_step(x, y):
            loss = step(x, y)
            world["scheduler"].step(loss)
            return loss

        world["step"] = train_step if mode in ("eager", "jit") else wrap(mode, train_step)
        return world

    trains_as_eager(make, call_step, steps=4)


def clip(world):
    norm = nn.utils.clip_grad_norm_(world["model"].parameters(), 0.5, error_if_nonfinite=True)
    nn.utils.clip_grad_value_(world["model"].parameters(), 0.05)
    return norm


def test_clipping_that_raises_on_a_non_finite_norm_inside_the_step_is_eagers():
    """An inf in the batch of step 2: the clipping raises eager's error, the parameters keep
    their values and the gradients stay for the next step to add to."""

    def make(mode):
        model = mlp()
        optimizer = torch.optim.SGD(model.parameters(), 0.1)
        forward = thunder_rs.jit(model) if mode == "jit" else model
        world = {"model": model, "optimizer": optimizer}

        def train_step(x, y):
            loss = F.cross_entropy(forward(x), y)
            loss.backward()
            norm = clip(world)
            optimizer.step()
            optimizer.zero_grad()
            return loss.detach(), norm

        world["step"] = train_step if mode == "jit" else wrap(mode, train_step)
        return world

    def step(world, i):
        x, y = batch()
        x[0, 0] = float("inf") if i == 2 else x[0, 0]
        return world["step"](x, y)

    trains_as_eager(make, step, steps=4)


def test_a_cpu_grad_scaler_skipping_a_step_with_a_nan_is_eagers():
    def make(mode):
        model = mlp()
        optimizer = torch.optim.SGD(model.parameters(), 0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=1)
        forward = thunder_rs.jit(model) if mode == "jit" else model

        def train_step(x, y):
            loss = F.cross_entropy(forward(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            return loss.detach(), norm

        step = train_step if mode == "jit" else wrap(mode, train_step)
        return {"model": model, "optimizer": optimizer, "scaler": scaler, "step": step}

    def step(world, i):
        x, y = batch()
        x[0, 0] = float("nan") if i == 1 else x[0, 0]
        return world["step"](x, y)

    trains_as_eager(make, step, steps=4)


def test_an_averaged_model_and_cumulative_batch_norm_inside_the_step_are_eagers():
    """``momentum=None`` (the mean of every batch so far), SWA's EMA of the weights updated after
    the optimizer's step and an evaluation forward under ``no_grad``, all in the step."""

    def make(mode):
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, momentum=None), nn.ReLU(), nn.Linear(8, 3))
        optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
        averaged = swa_utils.AveragedModel(model, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.9))
        forward = thunder_rs.jit(model) if mode == "jit" else model

        def train_step(x, y):
            model.train()
            loss = F.cross_entropy(forward(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            averaged.update_parameters(model)
            model.eval()
            with torch.no_grad():
                return loss.detach(), forward(x)

        step = train_step if mode == "jit" else wrap(mode, train_step)
        return {"model": model, "optimizer": optimizer, "averaged": averaged, "step": step}

    trains_as_eager(make, call_step)


# ------------------------------------------------------------------- state updated by hand, jitted


def test_an_ema_by_foreach_lerp_and_one_warmed_up_by_the_step_number_are_eagers():
    """``torch._foreach_lerp_`` towards the model; ``mul_``/``add_`` with a decay computed from the
    step number (a Python int, another each call)."""

    def make(mode):
        model, ema, warm = mlp(), mlp(), mlp()
        ema.load_state_dict(model.state_dict())
        warm.load_state_dict(model.state_dict())

        def update(n):
            with torch.no_grad():
                torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.1)
                decay = min(0.999, (1 + n) / (10 + n))
                for averaged, p in zip(warm.parameters(), model.parameters()):
                    averaged.mul_(decay).add_(p, alpha=1 - decay)

        optimizer = torch.optim.SGD(model.parameters(), 0.1)
        return {"model": model, "ema": ema, "warm": warm, "optimizer": optimizer, "step": wrap(mode, update)}

    def step(world, i):
        x, y = batch()
        loss = optimize(world, F.cross_entropy(world["model"](x), y))
        world["step"](i)
        return loss

    trains_as_eager(make, step)


def test_weight_decay_and_momentum_sgd_by_hand_with_the_gradients_as_arguments_are_eagers():
    """A jitted update under ``no_grad`` given the gradients (it cannot read ``.grad``) and a
    learning rate that changes every step; decay of the matrices only."""

    def make(mode):
        model = mlp()
        velocity = [torch.zeros_like(p) for p in model.parameters()]

        def update(params, grads, lr, first):
            with torch.no_grad():
                for p in params:
                    if p.ndim > 1:
                        p.mul_(1 - lr * 0.01)
                if first:
                    torch._foreach_copy_(velocity, grads)
                else:
                    torch._foreach_mul_(velocity, 0.9)
                    torch._foreach_add_(velocity, grads)
                torch._foreach_add_(params, velocity, alpha=-lr)

        return {"model": model, "step": wrap(mode, update), "velocity": velocity}

    def step(world, i):
        x, y = batch()
        loss = F.cross_entropy(world["model"](x), y)
        loss.backward()
        params = list(world["model"].parameters())
        world["step"](params, [p.grad for p in params], 0.1 / (i + 1), i == 0)
        world["model"].zero_grad()
        return loss.detach(), [v.clone() for v in world["velocity"]]

    trains_as_eager(make, step)


def test_a_jitted_optimizer_step_is_refused_at_its_read_of_grad():
    model = mlp()
    model(torch.randn(2, 4)).sum().backward()
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    with pytest.raises(ThunderNotImplementedError, match=r"Tensor.grad: the program reads the .grad of a tensor at"):
        thunder_rs.jit(optimizer.step)()


# ---------------------------------------------------------------------- parametrizations and hooks


def classify(world, i):
    x, y = batch()
    return optimize(world, F.cross_entropy(world["step"](x), y))


def test_orthogonal_and_weight_norm_parametrizations_train_as_eager():
    def model():
        net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3))
        parametrizations.orthogonal(net[0])
        parametrizations.weight_norm(net[2])
        return net

    trains_as_eager(forward_step(model, lambda ps: torch.optim.Adam(ps, 1e-2)), classify)


def test_hook_based_weight_and_spectral_norm_alternating_train_and_eval_are_eagers():
    """The old ``nn.utils.weight_norm``/``spectral_norm``: forward pre-hooks that set the weight
    as an attribute (and, training, run a power iteration)."""

    def model():
        net = mlp()
        nn.utils.weight_norm(net[0])
        nn.utils.spectral_norm(net[2])
        return net

    def step(world, i):
        world["model"].train(i != 1)
        return classify(world, i)

    trains_as_eager(forward_step(model, lambda ps: torch.optim.SGD(ps, 0.1)), step)


class ScaledActivations(nn.Module):
    """Halves the gradient of its hidden activations by a tensor hook registered in the forward,
    which also logs what it saw."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)
        self.seen: list = []

    def forward(self, x):
        h = self.a(x).relu()
        if h.requires_grad:
            h.register_hook(lambda g: self.seen.append(g.sum()) or g * 0.5)
        return self.b(h)


def test_a_tensor_hook_registered_in_the_forward_that_scales_and_logs_is_eagers():
    def step(world, i):
        return classify(world, i), list(world["model"].seen)

    trains_as_eager(forward_step(ScaledActivations, lambda ps: torch.optim.SGD(ps, 0.1)), step)


def clamped():
    model = mlp()
    for p in model.parameters():
        p.register_hook(lambda g: g.clamp(-0.01, 0.01))
    return model


def test_parameter_hooks_clamping_gradients_are_eagers():
    trains_as_eager(forward_step(clamped, lambda ps: torch.optim.SGD(ps, 0.1)), classify)


def test_module_backward_hooks_on_a_layer_the_jitted_model_calls_are_refused_naming_the_call():
    """(Registered on the jitted module itself they run, as in eager: ``test_python_state.py``.)"""
    model = mlp()
    model[2].register_full_backward_hook(lambda m, grad_in, grad_out: None)
    model[0].register_full_backward_pre_hook(lambda m, grad_out: (grad_out[0] * 2,))
    with pytest.raises(ThunderNotImplementedError, match=r"register_full_backward_hook: a module called at .*round5"):
        thunder_rs.jit(model)(torch.randn(2, 4))


class Detaching(nn.Module):
    """Stop-gradients: an activation detached in place, and a copy made a leaf of its own."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = self.a(x).relu()
        stopped = h * 2
        stopped.detach_()
        leaf = h.detach().requires_grad_()
        return self.b(stopped + leaf) + self.b(h), stopped.requires_grad


def test_an_activation_detached_in_place_trains_as_eager():
    """``detach_`` was refused as changing a tensor's autograd state; on a tensor the program
    computed that no view shares, the proxy now stands for its ``detach()``."""

    def step(world, i):
        x, y = batch()
        out, stopped_requires_grad = world["step"](x)
        return optimize(world, F.cross_entropy(out, y)), torch.tensor(stopped_requires_grad)

    trains_as_eager(forward_step(Detaching, lambda ps: torch.optim.SGD(ps, 0.1)), step)


def saved_then_detached(x, w):
    h = x @ w
    y = h * w  # (eager's mul saves h: its backward raises on h detached in place)
    h.detach_()
    return (y + h).sum()


def test_detaching_in_place_an_input_a_view_or_a_tensor_a_call_read_is_refused_naming_the_line():
    with pytest.raises(ThunderNotImplementedError, match=r"detach_: of a tensor the program's calls read .*round5"):
        thunder_rs.jit(saved_then_detached)(torch.randn(3, 3), torch.randn(3, 3, requires_grad=True))
    with pytest.raises(ThunderNotImplementedError, match=r"detach_: .* \(at .*round5.py:\d+\)"):
        thunder_rs.jit(lambda x: x.detach_() * 2)(torch.randn(3, requires_grad=True))
    with pytest.raises(ThunderNotImplementedError, match=r"detach_: .* \(at .*round5.py:\d+\)"):
        thunder_rs.jit(lambda x: (x * 2)[1:].detach_())(torch.randn(3, requires_grad=True))


def test_checkpoint_sequential_with_dropout_trains_as_eager():
    """(Dynamo runs ``checkpoint_sequential`` eagerly: nothing for the backend to compile.)"""

    def make(mode):
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))

        def forward(x):
            return torch.utils.checkpoint.checkpoint_sequential(model, 2, x, use_reentrant=False)

        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), 0.1), "step": wrap(mode, forward)}

    trains_as_eager(make, classify, modes=("jit",))


# ------------------------------------------------------------- functional calls and gradient graphs


def test_functional_call_with_a_parameter_and_buffer_dict_per_step_is_eagers():
    """Parameters as a dict made anew every step from the last one's update; BatchNorm's running
    statistics written into the buffer dict passed, as eager writes them."""

    def make(mode):
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
        params = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
        buffers = {n: b.clone() for n, b in model.named_buffers()}

        def loss_of(params, buffers, x, y):
            return F.cross_entropy(torch.func.functional_call(model, (params, buffers), (x,)), y)

        return {"params": params, "buffers": buffers, "step": wrap(mode, loss_of)}

    def step(world, i):
        params = world["params"]
        loss = world["step"](params, world["buffers"], *batch())
        grads = torch.autograd.grad(loss, list(params.values()))
        world["params"] = {n: (p - 0.1 * g).detach().requires_grad_() for (n, p), g in zip(params.items(), grads)}
        return loss.detach(), grads, dict(world["buffers"])

    trains_as_eager(make, step)


def test_maml_inner_steps_through_functional_call_are_eagers():
    """The outer loss differentiates through the inner step's gradients (``create_graph=True``)."""

    def make(mode):
        model = mlp()

        def loss_of(params, x, y):
            return F.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

        return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), 1e-2), "step": wrap(mode, loss_of)}

    def step(world, i):
        params = dict(world["model"].named_parameters())
        inner = world["step"](params, *batch())
        grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
        fast = {n: p - 0.4 * g for (n, p), g in zip(params.items(), grads)}
        return optimize(world, world["step"](fast, *batch())), inner.detach()

    trains_as_eager(make, step)


def test_training_and_evaluation_alternating_with_dropout_and_cumulative_batch_norm_are_eagers():
    def model():
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, momentum=None), nn.Dropout(0.3), nn.Linear(8, 3))

    def step(world, i):
        world["model"].train()
        loss = classify(world, i)
        world["model"].eval()
        with torch.no_grad():
            return loss, world["step"](torch.ones(2, 4))

    trains_as_eager(forward_step(model, lambda ps: torch.optim.SGD(ps, 0.1)), step)


def test_losses_with_every_target_ignored_or_masked_are_eagers():
    """Step 1 ignores every target: the means are NaN (0 / 0) as eager's, with class weights and
    label smoothing, and a mask of zeros divides by its clamped sum."""

    def make(mode):
        model = mlp()
        weight = torch.tensor([1.0, 2.0, 0.5])

        def losses(x, y, soft, mask):
            out = model(x)
            smoothed = F.cross_entropy(out, y, weight=weight, ignore_index=1, label_smoothing=0.2)
            summed = F.cross_entropy(out, y, weight=weight, ignore_index=1, label_smoothing=0.2, reduction="sum")
            soft = F.cross_entropy(out, soft, label_smoothing=0.1, weight=weight)
            nll = F.nll_loss(out.log_softmax(-1), y, ignore_index=1, weight=weight)
            masked = (F.cross_entropy(out, y, reduction="none") * mask).sum() / mask.sum().clamp(min=1)
            return smoothed, summed, soft, nll, masked

        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), 0.1), "step": wrap(mode, losses)}

    def step(world, i):
        x, y = batch()
        y[:] = 1 if i == 1 else y
        mask = torch.zeros(5) if i == 1 else (torch.rand(5) > 0.5).float()
        losses = world["step"](x, y, torch.rand(5, 3).softmax(-1), mask)
        total = sum(loss.nan_to_num() for loss in losses)
        return optimize(world, total), [loss.detach() for loss in losses]

    trains_as_eager(make, step)


def test_two_backwards_over_a_retained_graph_and_a_stale_one_after_the_step_are_eagers():
    """``retain_graph=True``, ``autograd.grad`` then ``backward(inputs=...)`` of one layer; after
    the optimizer's step the retained graph's backward raises eager's in-place error."""

    def step(world, i):
        out = world["step"](batch()[0])
        first, second = F.cross_entropy(out, batch()[1]), out.square().mean()
        first.backward(retain_graph=True)
        grads = [p.grad.clone() for p in world["model"].parameters()]
        partial = torch.autograd.grad(second, list(world["model"].parameters()), retain_graph=True)
        second.backward(inputs=list(world["model"][2].parameters()))
        world["optimizer"].step()
        try:
            first.backward()
            stale = "ran"
        except RuntimeError as e:
            stale = str(e)[:60]
        world["optimizer"].zero_grad()
        return first.detach(), second.detach(), grads, partial, stale

    trains_as_eager(forward_step(mlp, lambda ps: torch.optim.SGD(ps, 0.1)), step)


def critic_step(world, i):
    """WGAN-GP: the critic on fake and real samples and the penalty on its input gradient."""
    real, fake = torch.randn(5, 4), torch.randn(5, 4)
    mixed = real.clone().requires_grad_()
    (grad,) = torch.autograd.grad(world["step"](mixed).sum(), mixed, create_graph=True)
    penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
    loss = world["step"](fake).mean() - world["step"](real).mean() + 10 * penalty
    return optimize(world, loss), penalty.detach()


@pytest.mark.parametrize(
    "layers",
    [
        lambda: [nn.LayerNorm(8), nn.GELU(), nn.Dropout(0.3)],
        lambda: [nn.BatchNorm1d(8), nn.LeakyReLU(0.2)],
    ],
    ids=["layer_norm_dropout", "batch_norm"],
)
def test_a_wgan_gp_critic_trains_as_eager(layers):
    """The first double backward of a call computes it again (``core.differentiable``), its
    gradients summed through one alias per argument before they reached the parameters; eager adds
    each use's to the other calls' as it comes, and the sums rounded otherwise (LayerNorm's weight)."""

    def critic():
        return nn.Sequential(nn.Linear(4, 8), *layers(), nn.Linear(8, 1))

    trains_as_eager(forward_step(critic, lambda ps: torch.optim.Adam(ps, 1e-3, betas=(0.5, 0.9))), critic_step)


# ------------------------------------------------------------------ what changes between steps


def test_a_head_unfrozen_and_added_as_a_parameter_group_mid_training_trains_as_eager():
    def make(mode):
        model, head = mlp(), nn.Linear(3, 2).requires_grad_(False)
        optimizer = torch.optim.Adam(model.parameters(), 1e-2)

        def forward(x):
            return head(model(x))

        step = forward if mode == "eager" else wrap(mode, forward)
        return {"model": model, "head": head, "optimizer": optimizer, "step": step}

    def step(world, i):
        if i == 1:
            world["head"].requires_grad_(True)
            world["optimizer"].add_param_group({"params": world["head"].parameters(), "lr": 0.1})
        x, y = batch()
        return optimize(world, F.cross_entropy(world["step"](x), y % 2))

    trains_as_eager(make, step)


def test_a_layer_frozen_for_one_step_of_a_compiled_whole_step_trains_as_eager():
    sgd = lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9)  # noqa: E731

    def step(world, i):
        world["model"][0].requires_grad_(i != 1)
        return call_step(world, i)

    trains_as_eager(whole_step(sgd), step)


class Synced(nn.Module):
    """Counts in a buffer the micro-batches that would synchronise gradients (DDP's ``no_sync``
    pattern, the flag an attribute set between calls)."""

    def __init__(self):
        super().__init__()
        self.net = mlp()
        self.sync = True
        self.register_buffer("syncs", torch.zeros(()))

    def forward(self, x):
        if self.sync:
            self.syncs += 1
        return self.net(x)


def test_gradient_accumulation_with_a_sync_flag_set_between_micro_batches_is_eagers():
    def step(world, i):
        losses = []
        for micro in range(3):
            world["model"].sync = micro == 2
            x, y = batch(2 + micro)
            loss = F.cross_entropy(world["step"](x), y) / 3
            loss.backward()
            losses.append(loss.detach())
        world["optimizer"].step()
        world["optimizer"].zero_grad(set_to_none=False)
        return losses

    trains_as_eager(forward_step(Synced, lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9)), step)


class Distillation(nn.Module):
    """A student and a teacher the forward switches to evaluation for its targets and back."""

    def __init__(self):
        super().__init__()
        layers = lambda: [nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.2), nn.Linear(8, 3)]  # noqa: E731
        self.student, self.teacher = nn.Sequential(*layers()), nn.Sequential(*layers())

    def forward(self, x, y):
        self.teacher.eval()
        with torch.no_grad():
            targets = self.teacher(x).log_softmax(-1)
        self.teacher.train()
        out = self.student(x)
        return F.cross_entropy(out, y) + F.kl_div(out.log_softmax(-1), targets, log_target=True, reduction="batchmean")


def test_a_teacher_switched_to_evaluation_inside_the_forward_is_eagers():
    def step(world, i):
        return optimize(world, world["step"](*batch()))

    trains_as_eager(forward_step(Distillation, lambda ps: torch.optim.SGD(ps, 0.1)), step)


class TiedLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding, self.mid = nn.Embedding(10, 6), nn.Linear(6, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, ids):
        return self.head(self.mid(self.embedding(ids)).tanh())


def test_a_language_model_with_tied_embeddings_trains_as_eager():
    def step(world, i):
        ids = torch.randint(0, 10, (3, 4))
        logits = world["step"](ids)
        return optimize(world, F.cross_entropy(logits[:, :-1].reshape(-1, 10), ids[:, 1:].reshape(-1)))

    trains_as_eager(forward_step(TiedLanguageModel, lambda ps: torch.optim.AdamW(ps, 1e-2)), step)
