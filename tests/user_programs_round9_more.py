"""More programs of ``test_user_programs_round9.py`` (see ``user_programs_round9.py``): prints of
tensors requiring grad, errors caught or raised, recursion through a function, ``next`` of a
module's parameters, ``self.apply`` in a forward, grad mode set by a call or a decorator."""

import contextlib
import dataclasses
import functools
import io

import torch
import torch.nn.functional as F
from torch import nn

from user_programs_round9 import _raised


def _prints_with_grad(x, w):
    y = x @ w
    print(y, y.requires_grad, y.shape)
    return y


def prints_a_tensor_requiring_grad(compile_it) -> list:
    torch.manual_seed(0)
    run, w, seen = compile_it(_prints_with_grad), torch.randn(3, 2, requires_grad=True), []
    for _ in range(2):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            seen.append(run(torch.randn(2, 3), w))
        seen.append(out.getvalue())
    return seen


def _matmul_either_way(x, w):
    try:
        return x @ w
    except RuntimeError:
        return x @ w.T


def runtime_error_fallback(compile_it) -> list:
    torch.manual_seed(0)
    run = compile_it(_matmul_either_way)
    return [run(torch.randn(2, 3), w) for w in (torch.randn(3, 4), torch.randn(4, 3), torch.randn(3, 4))]


def _checked(x):
    if x.shape[-1] % 2:
        raise ValueError(f"expected an even last dim, got {tuple(x.shape)}")
    assert x.dim() == 2, f"expected 2 dims, got {x.dim()}"
    return x.view(x.shape[0], -1, 2).sum(-1)


def raises_on_shapes(compile_it) -> list:
    run = compile_it(_checked)
    return [_raised(run, torch.ones(*shape)) for shape in ((2, 4), (2, 3), (2, 2, 2), (3, 6), (2, 3))]


class FirstParameter(nn.Module):
    """Reads its dtype from its first parameter, as many models do."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        p = next(self.parameters())
        return self.lin(x.to(p.dtype)), p.dtype


def next_of_parameters(compile_it) -> list:
    torch.manual_seed(0)
    model = FirstParameter()
    run, seen = compile_it(model), []
    for dtype in (torch.float32, torch.float64, torch.float32):
        model.to(dtype)
        seen.append(run(torch.ones(2, 4)))
    return seen


def _pyramid(x, levels):
    if levels == 0:
        return x.mean()
    return x.mean() + _pyramid(F.avg_pool2d(x, 2), levels - 1)


def recursive_function(compile_it) -> list:
    torch.manual_seed(0)
    run, seen = compile_it(_pyramid), []
    for levels in (2, 3, 2):
        x = torch.randn(1, 1, 8, 8, requires_grad=True)
        out = run(x, levels)
        out.backward()
        seen += [out, x.grad]
    return seen


class Temperature(nn.Module):
    def __init__(self):
        super().__init__()
        self.t = 1.0

    def forward(self, x):
        return x / self.t


class AppliesTemperature(nn.Module):
    """Sets every ``Temperature`` submodule's ``t`` from its argument with ``self.apply``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.first, self.second = Temperature(), Temperature()

    def forward(self, x, t):
        self.apply(lambda m: setattr(m, "t", t) if isinstance(m, Temperature) else None)
        return self.second(self.lin(self.first(x)))


def apply_inside_forward(compile_it) -> list:
    torch.manual_seed(0)
    model = AppliesTemperature()
    run, seen = compile_it(model), []
    for t in (1.0, 2.0, 0.5):
        seen += [run(torch.ones(2, 4), t), model.first.t, model.second.t]
    return seen


@torch.enable_grad()
def _energy_grad(x):
    x = x.detach().requires_grad_()
    (g,) = torch.autograd.grad((x**3).sum(), x)
    return g


def enable_grad_decorated_helper(compile_it) -> list:
    run = compile_it(lambda x: _energy_grad(x) * 2)
    seen = []
    for v in (1.0, 2.0):
        with torch.no_grad():
            seen.append(run(torch.full((2,), v)))
    return seen


def _toggles_grad_mode(x, w):
    previous = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    frozen = x @ w
    torch.set_grad_enabled(previous)
    return frozen + x @ w, frozen.requires_grad


def set_grad_enabled_as_a_call(compile_it) -> list:
    torch.manual_seed(0)
    run, w, seen = compile_it(_toggles_grad_mode), torch.randn(3, 3, requires_grad=True), []
    for _ in range(2):
        out, frozen = run(torch.randn(2, 3), w)
        out.sum().backward()
        seen += [out, frozen, w.grad.clone(), torch.is_grad_enabled()]
        w.grad = None
    return seen


class ScaledKeywords(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x, scale=1.0):
        return self.lin(x) * scale


def keyword_pre_hook(compile_it) -> list:
    """A pre-hook registered with ``with_kwargs=True`` between calls, changing a keyword argument."""
    torch.manual_seed(0)
    model = ScaledKeywords()
    run = compile_it(model)
    seen = [run(torch.ones(1, 2), scale=2.0)]
    handle = model.register_forward_pre_hook(
        lambda m, args, kwargs: (args, {**kwargs, "scale": kwargs.get("scale", 1.0) * 10}), with_kwargs=True
    )
    seen += [run(torch.ones(1, 2), scale=2.0), run(torch.ones(1, 2))]
    handle.remove()
    return [*seen, run(torch.ones(1, 2), scale=2.0)]


def nested_batch_norm(compile_it) -> list:
    """A compiled BatchNorm called inside another compiled function and alone: its statistics."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(3)
    inner = compile_it(bn)
    outer = compile_it(lambda x: inner(x).relu().sum(0))
    seen = []
    for _ in range(2):
        x = torch.randn(4, 3)
        seen += [outer(x), inner(x * 2), bn.running_mean.clone(), bn.num_batches_tracked.clone()]
    return seen


class CountsLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, 2), nn.ReLU())

    def forward(self, x):
        return self.body(x) * sum(isinstance(m, nn.Linear) for m in self.modules())


def modules_changed_between_calls(compile_it) -> list:
    torch.manual_seed(0)
    model = CountsLinears()
    run = compile_it(model)
    seen = [run(torch.ones(1, 2))]
    model.body.append(nn.Linear(2, 2))
    seen.append(run(torch.ones(1, 2)))
    model.body[0] = nn.Identity()
    return [*seen, run(torch.ones(1, 2))]


def leaky(x):
    return torch.where(x > 0, x, x * leaky.slope)


leaky.slope = 0.1


class HoldsAFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = leaky

    def forward(self, x):
        return self.act(x) + self.act.slope


def function_attribute_through_a_module(compile_it) -> list:
    run, seen = compile_it(HoldsAFunction()), []
    for slope in (0.1, 0.2, 0.1):
        leaky.slope = slope
        seen.append(run(torch.linspace(-1, 1, 4)))
    return seen


def _prints_the_loss(x):
    loss = (x**2).mean()
    print(f"loss={loss.item():.3f} n={x.numel()}")
    return loss


def prints_an_item(compile_it) -> list:
    """A loss printed through ``.item()`` in an f-string: the text each call makes of its value."""
    run, seen = compile_it(_prints_the_loss), []
    for v in (1.0, 2.0, 1.0):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            seen.append(run(torch.full((3,), v)))
        seen.append(out.getvalue())
    return seen


def _doubled_in_inference_mode(x):
    with torch.inference_mode():
        y = x * 2
    return y


def returns_an_inference_tensor(compile_it) -> list:
    run = compile_it(_doubled_in_inference_mode)
    y = run(torch.ones(2, requires_grad=True))
    return [y, y.is_inference(), y.requires_grad]


@dataclasses.dataclass(frozen=True)
class FrozenConfig:
    scale: float = 1.0
    shift: float = 0.0


class ReplacesItsConfig(nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = FrozenConfig()

    def forward(self, x, shift):
        cfg = dataclasses.replace(self.cfg, shift=shift)
        return x * cfg.scale + cfg.shift


def dataclass_replaced_inside(compile_it) -> list:
    model = ReplacesItsConfig()
    run, seen = compile_it(model), []
    for scale, shift in ((1.0, 0.0), (2.0, 1.0), (2.0, 3.0)):
        model.cfg = dataclasses.replace(model.cfg, scale=scale)
        seen.append(run(torch.ones(2), shift))
    return seen


TABLE: dict = {}


def _table_by_size(x):
    if x.shape not in TABLE:
        TABLE[x.shape] = torch.randn(x.shape[-1])
    return x + TABLE[x.shape]


def table_keyed_by_torch_size(compile_it) -> list:
    TABLE.clear()
    torch.manual_seed(0)
    run = compile_it(_table_by_size)
    seen = [run(torch.ones(2, n)) for n in (3, 4, 3)]
    return [*seen, sorted(tuple(k) for k in TABLE), torch.rand(2)]


def _sum_of_steps(x, n):
    def steps():
        yield from range(n)

    it, total = steps(), x
    while True:
        try:
            i = next(it)
        except StopIteration:
            break
        total = total + i
    return total


def stop_iteration_of_own_generator(compile_it) -> list:
    run = compile_it(_sum_of_steps)
    return [run(torch.ones(1), n) for n in (0, 3, 2)]


def _scaled_by_mean(x, flag):
    @torch.no_grad()
    def mean_of(t):
        return t.mean()

    with torch.set_grad_enabled(flag):
        return x * mean_of(x), torch.is_grad_enabled()


def no_grad_inner_function_under_a_flag(compile_it) -> list:
    run, seen = compile_it(_scaled_by_mean), []
    for flag in (True, False, True):
        y, enabled = run(torch.ones(2, requires_grad=True), flag)
        seen += [y, enabled, y.requires_grad]
    return seen


class CountsByShape(nn.Module):
    """Counts its calls per shape in a dict on the class, keyed by an f-string of the shape."""

    calls: dict = {}

    def forward(self, x):
        key = f"{x.shape[0]}x{x.shape[1]}"
        CountsByShape.calls[key] = CountsByShape.calls.get(key, 0) + 1
        return x * CountsByShape.calls[key]


def class_dict_counter(compile_it) -> list:
    CountsByShape.calls = {}
    run = compile_it(CountsByShape())
    seen = [run(torch.ones(n, 2)) for n in (2, 3, 2, 2)]
    return [*seen, dict(CountsByShape.calls)]


def _with_options(x, opts=None):
    opts = opts or {}
    return x * opts.get("scale", 1.0) + opts.get("shift", 0.0)


def optional_options_dict(compile_it) -> list:
    run = compile_it(_with_options)
    return [run(torch.ones(1)), run(torch.ones(1), {"scale": 2.0}), run(torch.ones(1), opts={"shift": 1.0})]


def _rows_of_three(x):
    try:
        return x.view(-1, 3)
    except RuntimeError:
        return x.reshape(-1, 3) + 1


def view_error_fallback(compile_it) -> list:
    run = compile_it(_rows_of_three)
    return [run(torch.ones(2, 3)), run(torch.ones(3, 2).t()), run(torch.ones(6))]


# -- attributes of functions reached in other ways ------------------------------------------------


def gained(module, args, out):
    return out * gained.gain


def sloped(x, slope):
    return x * slope * sloped.extra


def _by_the_hook(compile_it, value):
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    model.register_forward_hook(gained)
    run = compile_it(model)

    def call():
        gained.gain = value()
        return run(torch.ones(1, 2))

    return call


def _by_a_partial(compile_it, value):
    scaled = functools.partial(sloped, slope=2.0)
    run = compile_it(lambda x: scaled(x))

    def call():
        sloped.extra = value()
        return run(torch.ones(1))

    return call


ACTIVATIONS = {"sloped": sloped}


def _from_a_dict(compile_it, value):
    run = compile_it(lambda x: ACTIVATIONS["sloped"](x, 1.0))

    def call():
        sloped.extra = value()
        return run(torch.ones(1))

    return call


def _from_a_list_by_index(compile_it, value):
    listed = [sloped]
    run = compile_it(lambda x, i: listed[i](x, 1.0))

    def call():
        sloped.extra = value()
        return run(torch.ones(1), 0)

    return call


FUNCTION_HOLDERS = [_by_the_hook, _by_a_partial, _from_a_dict, _from_a_list_by_index]


def function_attribute_changed(compile_it, holder) -> list:
    """A function's attribute (a hook's gain, a scale) changed between calls, the function reached
    through ``holder``."""
    values = iter((1.0, 2.0, 3.0, 1.0))
    call = holder(compile_it, lambda: next(values))
    return [call() for _ in range(4)]
