"""The programs of ``test_user_programs_round14.py`` whose module state changes between calls:
global forward hooks (``register_module_forward_hook`` and its pre-hook) registered after the first
call and removed, a pre-hook ``with_kwargs`` rewriting the keyword arguments, a parameter replaced
by a new ``nn.Parameter``, ``requires_grad_`` toggled, a submodule swapped for another activation,
the model moved to ``float64``, a parametrization registered after compiling and removed,
``load_state_dict(assign=True)``, one submodule put in ``eval()`` while the rest trains. Each takes
how to compile, runs it over several calls, and returns what the calls gave and left."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from user_programs_round8 import _backward_steps, grads


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.act, self.out = nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)

    def forward(self, x, scale: float = 1.0):
        return self.out(self.act(self.lin(x)) * scale)


def global_forward_hook_added_and_removed(compile_it) -> list:
    """``register_module_forward_hook`` (every module's output scaled) after the first call."""
    torch.manual_seed(0)
    model = Block()
    run, seen, calls = compile_it(model), [], []

    def doubled(module, args, output):
        calls.append(type(module).__name__)
        return output * 2 if isinstance(module, nn.Linear) else None

    for step in range(4):
        handle = nn.modules.module.register_module_forward_hook(doubled) if step in (1, 2) else None
        try:
            seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
        finally:
            if handle is not None:
                handle.remove()
    return seen + [calls]


def global_forward_pre_hook_added_and_removed(compile_it) -> list:
    """``register_module_forward_pre_hook`` rewriting every Linear's input, added then removed."""
    torch.manual_seed(0)
    model = Block()
    run, seen = compile_it(model), []

    def clamped(module, args):
        return (args[0].clamp(-0.5, 0.5),) if isinstance(module, nn.Linear) else None

    for step in range(4):
        handle = nn.modules.module.register_module_forward_pre_hook(clamped) if step in (1, 2) else None
        try:
            seen += _backward_steps(model, run, [(torch.randn(3, 4) * 2,)])
        finally:
            if handle is not None:
                handle.remove()
    return seen


def pre_hook_with_kwargs_added_later(compile_it) -> list:
    """A pre-hook ``with_kwargs=True`` that rewrites ``scale``, registered after the first call."""
    torch.manual_seed(0)
    model = Block()
    run, seen = compile_it(model), []

    def rescaled(module, args, kwargs):
        return args, {**kwargs, "scale": kwargs.get("scale", 1.0) * 3}

    handle = None
    for step in range(4):
        if step == 1:
            handle = model.register_forward_pre_hook(rescaled, with_kwargs=True)
        if step == 3:
            handle.remove()
        seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
        out = run(torch.ones(1, 4), scale=0.5)
        seen.append(out)
    return seen


def parameter_replaced_between_calls(compile_it) -> list:
    """``model.lin.weight = nn.Parameter(...)``: the new parameter is used and gets the gradient."""
    torch.manual_seed(0)
    model = Block()
    run, seen = compile_it(model), []
    for step in range(3):
        if step == 1:
            model.lin.weight = nn.Parameter(torch.randn(4, 4))
        if step == 2:
            model.lin.bias = nn.Parameter(torch.zeros(4), requires_grad=False)
        seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
    return seen


def requires_grad_toggled(compile_it) -> list:
    """``requires_grad_(False)`` on a layer (frozen), then back: gradients as eager's."""
    torch.manual_seed(0)
    model = Block()
    run, seen = compile_it(model), []
    for frozen in (False, True, True, False):
        model.lin.requires_grad_(not frozen)
        seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
    return seen


def submodule_swapped(compile_it) -> list:
    """``model.act = nn.GELU()`` then ``nn.SiLU()`` then a ``functools.partial`` of leaky_relu."""
    import functools

    torch.manual_seed(0)
    model = Block()
    run, seen = compile_it(model), []
    for act in (None, nn.GELU(), nn.SiLU(), nn.GELU(approximate="tanh")):
        if act is not None:
            model.act = act
        seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
    del model.act
    model.act = functools.partial(F.leaky_relu, negative_slope=0.3)  # (a plain attribute now)
    seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
    model.act.keywords["negative_slope"] = 0.01
    return seen + _backward_steps(model, run, [(torch.randn(3, 4),)])


def moved_to_other_dtypes(compile_it) -> list:
    """``model.to(dtype)`` between calls: ``float64``, ``half``, ``bfloat16`` and back."""
    torch.manual_seed(0)
    model = Block()
    run, seen = compile_it(model), []
    for dtype in (torch.float32, torch.float64, torch.float64, torch.float16, torch.bfloat16, torch.float32):
        model.to(dtype)
        seen += _backward_steps(model, run, [(torch.randn(3, 4, dtype=dtype),)])
    return seen


class Symmetric(nn.Module):
    def forward(self, w):
        return w.triu() + w.triu(1).transpose(-1, -2)


def parametrization_registered_after_compile(compile_it) -> list:
    """``parametrize.register_parametrization`` after the first call, removed after the third."""
    torch.manual_seed(0)
    model = Block()
    run, seen = compile_it(model), []
    for step in range(4):
        if step == 1:
            parametrize.register_parametrization(model.lin, "weight", Symmetric())
        if step == 3:
            parametrize.remove_parametrizations(model.lin, "weight", leave_parametrized=True)
        seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
    return seen + [model.lin.weight.detach().clone()]


def load_state_dict_assigned(compile_it) -> list:
    """``load_state_dict(..., assign=True)`` (the module takes the given tensors) between calls."""
    torch.manual_seed(0)
    model = Block()
    run, seen = compile_it(model), []
    seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
    other = Block()
    model.load_state_dict(other.state_dict(), assign=True)
    seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
    with torch.no_grad():
        other.lin.weight.mul_(2)  # (the module holds other's tensors now)
    seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
    return seen + [model.lin.weight is other.lin.weight]


class NormedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.bn, self.drop = nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.0)

    def forward(self, x):
        y = self.bn(self.lin(x))
        return self.drop(y) * (2.0 if self.bn.training else 1.0)


def eval_of_one_submodule(compile_it) -> list:
    """``model.bn.eval()`` while the rest trains; then ``model.train()`` again."""
    torch.manual_seed(0)
    model = NormedBlock()
    run, seen = compile_it(model), []
    for change in (None, "bn_eval", None, "train"):
        if change == "bn_eval":
            model.bn.eval()
        if change == "train":
            model.train()
        seen += _backward_steps(model, run, [(torch.randn(5, 4),)])
        seen += [model.bn.running_mean.clone(), model.bn.num_batches_tracked.clone(), model.bn.training]
    return seen + [grads(model)]


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        y = self.lin(x)
        return y if self.scale is None else y * self.scale


def buffer_replaced_between_calls(compile_it) -> list:
    """A buffer re-registered (another tensor, then not persistent, then None) between calls."""
    torch.manual_seed(0)
    model = Scaled()
    run, seen = compile_it(model), []
    for change in (None, torch.tensor(3.0), torch.tensor([1.0, 2.0, 3.0, 4.0]), "none"):
        if change is not None:
            model.register_buffer("scale", None if change == "none" else change, persistent=change is None)
        seen += _backward_steps(model, run, [(torch.randn(2, 4),)])
        seen.append(sorted(model.state_dict()))
    return seen


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(6, 4), nn.Linear(4, 6, bias=False)

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


def weights_tied_after_the_first_call(compile_it) -> list:
    """``model.head.weight = model.emb.weight`` after the first call: one parameter, both uses."""
    torch.manual_seed(0)
    model = Tied()
    run, seen = compile_it(model), []
    for step in range(3):
        if step == 1:
            model.head.weight = model.emb.weight
        seen += _backward_steps(model, run, [(torch.tensor([[1, 2, 5]]),)])
        seen.append(len(list(model.parameters())))
    return seen


class AnomalyAware(nn.Module):
    """Model code that checks its values only while anomaly detection is on."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        if torch.is_anomaly_enabled():
            y = torch.nan_to_num(y, nan=0.0) * 2
        return y


def anomaly_mode_read_by_the_model(compile_it) -> list:
    torch.manual_seed(0)
    model = AnomalyAware()
    run, seen = compile_it(model), []
    for detect in (False, True, True, False):
        with torch.autograd.set_detect_anomaly(detect):
            seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class FrozenInside(nn.Module):
    """A forward that freezes a layer's parameters for one use (``requires_grad_`` and back)."""

    def __init__(self):
        super().__init__()
        self.lin, self.out = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x, frozen: bool):
        if frozen:
            self.lin.requires_grad_(False)
        try:
            y = self.lin(x)
        finally:
            self.lin.requires_grad_(True)
        return self.out(y.tanh()) + self.lin(x)


def requires_grad_toggled_inside_forward(compile_it) -> list:
    torch.manual_seed(0)
    model = FrozenInside()
    run, seen = compile_it(model), []
    for frozen in (True, False, True):
        seen += _backward_steps(model, run, [(torch.randn(2, 3), frozen)])
        seen.append([p.requires_grad for p in model.parameters()])
    return seen


def apply_changes_submodule_settings(compile_it) -> list:
    """``model.apply(fn)`` between calls setting every LayerNorm's ``eps`` and Dropout's ``p``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Dropout(0.0), nn.Linear(4, 2))
    run, seen = compile_it(model), []

    def settings(eps: float, p: float):
        def apply(m):
            if isinstance(m, nn.LayerNorm):
                m.eps = eps
            if isinstance(m, nn.Dropout):
                m.p = p

        return apply

    for eps, p in ((1e-5, 0.0), (1.0, 0.0), (1.0, 1.0), (1e-5, 0.0)):
        model.apply(settings(eps, p))
        seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
    return seen


def forward_hook_with_kwargs_added_later(compile_it) -> list:
    """A forward hook ``with_kwargs=True`` on a submodule, registered after the first call, removed."""
    torch.manual_seed(0)
    model = Block()
    run, seen = compile_it(model), []

    def doubled(module, args, kwargs, output):
        return output * 2

    for step in range(3):
        handle = model.lin.register_forward_hook(doubled, with_kwargs=True) if step == 1 else None
        seen += _backward_steps(model, run, [(torch.ones(1, 4),)])
        if handle is not None:
            handle.remove()
    return seen


class ConvBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Linear(4, 2)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return y, self.head(y.mean((2, 3)))


def channels_last_then_fused_conv_bn(compile_it) -> list:
    """``model.to(memory_format=torch.channels_last)``, channels-last inputs, then the conv and
    batch norm fused for evaluation (``fuse_conv_bn_eval``, the norm swapped for ``Identity``)."""
    torch.manual_seed(0)
    model = ConvBn()
    run, seen = compile_it(model), []
    for step in range(4):
        if step == 1:
            model.to(memory_format=torch.channels_last)
        x = torch.randn(2, 3, 5, 5)
        if step >= 2:
            x = x.to(memory_format=torch.channels_last)
        if step == 3:
            model.eval()
            model.conv, model.bn = torch.nn.utils.fusion.fuse_conv_bn_eval(model.conv, model.bn), nn.Identity()
        seen += _backward_steps(model, run, [(x,)])
        seen += [model.conv.weight.stride(), model.bn.running_mean.clone() if step < 3 else None]
    return seen


def pruned_after_the_first_call(compile_it) -> list:
    """``prune.l1_unstructured`` (a pre-hook, ``weight_orig`` and a mask buffer) applied twice
    between calls, then made permanent by ``prune.remove``; and the hooks of the old
    ``nn.utils.weight_norm`` added and removed."""
    from torch.nn.utils import prune

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    run, seen = compile_it(model), []
    changes = [
        lambda: None,
        lambda: prune.l1_unstructured(model[0], "weight", amount=0.5),
        lambda: prune.l1_unstructured(model[0], "weight", amount=0.5),
        lambda: prune.remove(model[0], "weight"),
        lambda: nn.utils.weight_norm(model[2]),
        lambda: nn.utils.remove_weight_norm(model[2]),
    ]
    for change in changes:
        change()
        seen += _backward_steps(model, run, [(torch.randn(3, 4),)])
        seen.append(sorted(name for name, _ in model.named_buffers()))
    return seen
