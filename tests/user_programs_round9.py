"""The programs of ``test_user_programs_round9.py``: each takes how to compile (``thunder_rs.jit``,
``torch.compile(backend="thunder_rs")`` or nothing, for eager), runs it over several calls while the
Python state or the inputs change between them, and returns what the calls gave and left behind
(outputs, gradients, errors raised, the program's own state)."""

import bisect
import contextlib
import dataclasses
import functools
import heapq
import io
import math
import operator
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def grads(module: nn.Module) -> list:
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


def _raised(run, *args, **kwargs):
    """What ``run`` returns, or the type and text of what it raises."""
    try:
        return run(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (compared with eager's)
        return (type(e).__name__, str(e))


# -- calls of compiled and decorated functions ----------------------------------------------------


def _inner_block(x, w):
    return torch.tanh(x @ w) * 2


def nested_compiled(compile_it) -> list:
    """A compiled function calling another compiled one, the inner one also called alone."""
    torch.manual_seed(0)
    inner = compile_it(_inner_block)

    def outer(x, w):
        return inner(x, w).sum(-1) + inner(x * 2, w).mean()

    run, w, seen = compile_it(outer), torch.randn(4, 4, requires_grad=True), []
    for n in (2, 3, 2):
        x = torch.randn(n, 4)
        out = run(x, w)
        out.sum().backward()
        seen += [out, inner(x, w), w.grad.clone()]
        w.grad = None
    return seen


class Tree(nn.Module):
    """A tree of modules, each node summing its children's outputs: a recursive forward."""

    def __init__(self, depth: int):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.children_ = nn.ModuleList(Tree(depth - 1) for _ in range(2 if depth > 0 else 0))

    def forward(self, x, depth_limit: int):
        y = torch.relu(self.lin(x))
        if depth_limit == 0:
            return y
        for child in self.children_:
            y = y + child(y, depth_limit - 1)
        return y


def recursive_tree(compile_it) -> list:
    torch.manual_seed(0)
    model = Tree(2)
    run, seen = compile_it(model), []
    for limit in (2, 1, 2, 0):
        out = run(torch.randn(2, 4), limit)
        out.sum().backward()
        seen += [out, grads(model)]
        model.zero_grad()
    return seen


def _counted(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        wrapper.calls += 1
        return fn(*args, **kwargs) * wrapper.calls

    wrapper.calls = 0
    return wrapper


@_counted
def _scaled_by_calls(x):
    return x + 1


def wraps_decorator(compile_it) -> list:
    _scaled_by_calls.calls = 0
    run = compile_it(lambda x: _scaled_by_calls(x).sum())
    return [run(torch.ones(2)) for _ in range(3)] + [_scaled_by_calls.calls]


@torch.no_grad()
def _target_of(x):
    return x.softmax(-1)


def no_grad_decorated_helper(compile_it) -> list:
    def distill(x, w):
        logits = x @ w
        return F.kl_div(logits.log_softmax(-1), _target_of(logits * 2), reduction="batchmean")

    torch.manual_seed(0)
    run, w, seen = compile_it(distill), torch.randn(4, 3, requires_grad=True), []
    for _ in range(2):
        out = run(torch.randn(2, 4), w)
        out.backward()
        seen += [out, w.grad.clone()]
        w.grad = None
    return seen


# -- control flow by exceptions -------------------------------------------------------------------


class KeyedScales(nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = {"a": 2.0, "b": 3.0}

    def forward(self, x, key):
        try:
            scale = self.scales[key]
        except KeyError:
            scale = -1.0
        return x * scale


def key_error_fallback(compile_it) -> list:
    model = KeyedScales()
    run, seen = compile_it(model), []
    for key in ("a", "c", "b", "c"):
        seen.append(run(torch.ones(2), key))
    model.scales["c"] = 5.0
    return [*seen, run(torch.ones(2), "c")]


def _layer_or_identity(x, layers, i):
    try:
        w = layers[i]
    except IndexError:
        return x
    return x @ w


def index_error_fallback(compile_it) -> list:
    torch.manual_seed(0)
    layers = [torch.randn(3, 3) for _ in range(2)]
    run = compile_it(_layer_or_identity)
    seen = [run(torch.ones(3), layers, i) for i in (0, 1, 2, 5, 1)]
    layers.append(torch.eye(3) * 4)
    return [*seen, run(torch.ones(3), layers, 2)]


def _first_positive(x, candidates):
    it = iter(candidates)
    try:
        while True:
            c = next(it)
            if c > 0:
                return x * c
    except StopIteration:
        return x * 0


def stop_iteration_loop(compile_it) -> list:
    run = compile_it(_first_positive)
    return [run(torch.ones(2), c) for c in ([-1, 2, 3], [-1, -2], [4], [])]


def _raises_for_bad_key(x, table, key):
    return x + table[key]


def key_error_escapes(compile_it) -> list:
    run, table = compile_it(_raises_for_bad_key), {"a": 1.0}
    return [_raised(run, torch.ones(2), table, k) for k in ("a", "b", "a")]


# -- grad mode ------------------------------------------------------------------------------------


def _set_grad_enabled_by(x, w, flag):
    with torch.set_grad_enabled(flag):
        y = x @ w
    return y, y.requires_grad


def grad_enabled_flag(compile_it) -> list:
    torch.manual_seed(0)
    run, w, seen = compile_it(_set_grad_enabled_by), torch.randn(3, 3, requires_grad=True), []
    for flag in (True, False, True, False):
        y, requires = run(torch.randn(2, 3), w, flag)
        seen += [y, requires, y.requires_grad]
    return seen


def _enable_inside(x, w):
    with torch.enable_grad():
        y = (x @ w).sum()
    z = x @ w
    return y, z, y.requires_grad, z.requires_grad


def enable_grad_under_no_grad(compile_it) -> list:
    torch.manual_seed(0)
    run, w, seen = compile_it(_enable_inside), torch.randn(3, 3, requires_grad=True), []
    for outer in (torch.no_grad, contextlib.nullcontext, torch.no_grad):
        with outer():
            y, z, ry, rz = run(torch.randn(2, 3), w)
        y.backward()
        seen += [y, z, ry, rz, z.requires_grad, w.grad.clone()]
        w.grad = None
    return seen


def _branches_on_grad_mode(x, w):
    if torch.is_grad_enabled():
        return (x @ w).relu()
    return (x @ w).sigmoid()


def is_grad_enabled_branch(compile_it) -> list:
    torch.manual_seed(0)
    run, w, seen = compile_it(_branches_on_grad_mode), torch.randn(3, 3, requires_grad=True), []
    for grad in (True, False, True):
        with torch.set_grad_enabled(grad):
            seen.append(run(torch.randn(2, 3), w))
    return seen


def _inference_target(x, w):
    with torch.inference_mode():
        target = (x @ w).argmax(-1)
    return F.cross_entropy(x @ w, target.clone()), target.is_inference()


def inference_mode_inside(compile_it) -> list:
    torch.manual_seed(0)
    run, w, seen = compile_it(_inference_target), torch.randn(3, 4, requires_grad=True), []
    for _ in range(2):
        loss, inference = run(torch.randn(2, 3), w)
        loss.backward()
        seen += [loss, inference, w.grad.clone()]
        w.grad = None
    return seen


def _autocast_aware(x, w):
    if torch.is_autocast_enabled("cpu"):
        return (x @ w).float() * 2
    return x @ w


def is_autocast_enabled_branch(compile_it) -> list:
    torch.manual_seed(0)
    run, w, seen = compile_it(_autocast_aware), torch.randn(3, 3), []
    for on in (False, True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
            seen.append(run(torch.randn(2, 3), w))
    return seen


def _leaf_or_not(x):
    if x.is_leaf and x.requires_grad:
        return x * 2
    if x.requires_grad:
        return x * 3
    return x * 4


def is_leaf_branch(compile_it) -> list:
    run, seen = compile_it(_leaf_or_not), []
    for make in (lambda: torch.ones(2, requires_grad=True), lambda: torch.ones(2, requires_grad=True) * 1, torch.ones):
        x = make(2) if make is torch.ones else make()
        out = run(x)
        seen += [out, out.requires_grad]
    return seen


class ParameterAware(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def forward(self, x):
        if isinstance(x, nn.Parameter):
            return x * self.w
        return x + self.w


def is_parameter_branch(compile_it) -> list:
    model = ParameterAware()
    run = compile_it(model)
    return [run(torch.full((2,), 3.0)), run(nn.Parameter(torch.full((2,), 3.0))), run(torch.ones(2))]


def _compiling_branch(x):
    if torch.compiler.is_compiling():
        return x * 2
    if torch.jit.is_scripting():
        return x * 3
    return x + 1


def is_compiling_branch(compile_it) -> list:
    run = compile_it(_compiling_branch)
    return [run(torch.full((2,), 3.0)) for _ in range(2)]


# -- checkpoints and function transforms ----------------------------------------------------------


class DropoutCheckpointed(nn.Module):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.reentrant = reentrant
        self.lin = nn.Linear(4, 4)

    def block(self, x, scale):
        return F.dropout(torch.tanh(self.lin(x)), 0.5, self.training) * scale

    def forward(self, x, scale):
        return checkpoint(self.block, x, scale, use_reentrant=self.reentrant)


def _checkpointed_dropout(compile_it, reentrant: bool) -> list:
    torch.manual_seed(0)
    model = DropoutCheckpointed(reentrant)
    run, seen = compile_it(model), []
    for scale in (1.0, 2.0, 1.0):
        x = torch.randn(2, 4, requires_grad=True)
        out = run(x, scale)
        out.sum().backward()
        seen += [out, x.grad, grads(model)]
        model.zero_grad()
    return [*seen, torch.rand(2)]


def checkpoint_dropout_non_reentrant(compile_it) -> list:
    return _checkpointed_dropout(compile_it, False)


def checkpoint_dropout_reentrant(compile_it) -> list:
    return _checkpointed_dropout(compile_it, True)


def _grad_of_energy(x, w):
    energy = lambda y: (y @ w).tanh().sum()  # noqa: E731
    return torch.func.grad(energy)(x)


def func_grad_inside(compile_it) -> list:
    torch.manual_seed(0)
    run, w = compile_it(_grad_of_energy), torch.randn(3, 3)
    return [run(torch.randn(2, 3), w) for _ in range(2)]


def _per_sample_norms(x, w):
    return torch.vmap(lambda row: (row @ w).norm())(x)


def vmap_inside(compile_it) -> list:
    torch.manual_seed(0)
    run, w = compile_it(_per_sample_norms), torch.randn(3, 3)
    return [run(torch.randn(n, 3), w) for n in (2, 4)]


def _jacobian(x, w):
    return torch.func.jacrev(lambda y: torch.sin(y @ w))(x)


def jacrev_inside(compile_it) -> list:
    torch.manual_seed(0)
    run, w = compile_it(_jacobian), torch.randn(3, 2)
    return [run(torch.randn(3), w) for _ in range(2)]


# -- hooks and module walks -----------------------------------------------------------------------


def pre_hook_changes_inputs(compile_it) -> list:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    run, seen, counts = compile_it(model), [], {"calls": 0}

    def clamp_input(module, args):
        counts["calls"] += 1
        return (args[0].clamp(-0.5, 0.5),)

    handle = model[2].register_forward_pre_hook(clamp_input)
    for _ in range(2):
        out = run(torch.randn(2, 4))
        out.sum().backward()
        seen += [out, grads(model), counts["calls"]]
        model.zero_grad()
    handle.remove()
    return [*seen, run(torch.ones(2, 4)), counts["calls"]]


def backward_hook_between_calls(compile_it) -> list:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    run, seen, seen_grads = compile_it(model), [], []

    def scale_grad(module, grad_input, grad_output):
        seen_grads.append(grad_output[0].clone())
        return (grad_input[0] * 0.5,)

    handles = []
    for step in range(4):
        if step == 1:
            handles.append(model[1].register_full_backward_hook(scale_grad))
        if step == 3:
            handles.pop().remove()
        out = run(torch.randn(2, 4))
        out.sum().backward()
        seen += [out, grads(model)]
        model.zero_grad()
    return [*seen, seen_grads]


class NormWalker(nn.Module):
    """A forward that walks its submodules, branching on their type."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 4), nn.Dropout(0.0))

    def forward(self, x):
        penalty = x.new_zeros(())
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                penalty = penalty + m.weight.square().sum() * (2.0 if name.endswith("2") else 1.0)
            elif isinstance(m, nn.LayerNorm):
                penalty = penalty + (m.weight - 1).abs().sum()
        return self.body(x), penalty


def named_modules_walk(compile_it) -> list:
    torch.manual_seed(0)
    model = NormWalker()
    run, seen = compile_it(model), []
    for step in range(3):
        if step == 1:
            model.apply(lambda m: nn.init.constant_(m.weight, 0.5) if isinstance(m, nn.LayerNorm) else None)
        out, penalty = run(torch.randn(2, 4))
        (out.sum() + penalty).backward()
        seen += [out, penalty, grads(model)]
        model.zero_grad()
    return seen


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"cls": nn.Linear(4, 3), "reg": nn.Linear(4, 1)})
        self.bias = nn.ParameterDict({"cls": nn.Parameter(torch.zeros(3)), "reg": nn.Parameter(torch.ones(1))})

    def forward(self, x, task):
        return self.heads[task](x) + self.bias[task]


def module_dict_by_argument(compile_it) -> list:
    torch.manual_seed(0)
    model = Heads()
    run, seen = compile_it(model), []
    for task in ("cls", "reg", "cls", "reg"):
        out = run(torch.randn(2, 4), task)
        out.square().sum().backward()
        seen += [out, grads(model)]
        model.zero_grad()
    return seen


class KeywordBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, *, x, scale=1.0, **extra):
        y = self.lin(x) * scale
        if "bias" in extra:
            y = y + extra["bias"]
        return y


class Forwards(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = KeywordBlock()

    def forward(self, x, **kwargs):
        return self.block(x=x, **kwargs)


def kwargs_forwarding(compile_it) -> list:
    torch.manual_seed(0)
    model = Forwards()
    run, seen = compile_it(model), []
    for kwargs in ({}, {"scale": 2.0}, {"scale": 2.0, "bias": torch.ones(4)}, {"bias": torch.full((4,), 3.0)}):
        out = run(torch.randn(2, 4), **kwargs)
        out.sum().backward()
        seen += [out, grads(model)]
        model.zero_grad()
    return seen


def keyword_only_call(compile_it) -> list:
    torch.manual_seed(0)
    model = KeywordBlock()
    run = compile_it(model)
    return [run(x=torch.ones(2, 4)), run(x=torch.ones(2, 4), scale=3.0), run(scale=0.5, x=torch.ones(2, 4))]


class Delegating(nn.Module):
    """A wrapper forwarding unknown attributes to the module it wraps (as ``DataParallel``'s users write)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, x):
        return self.inner(x) * self.temperature


class Tempered(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.temperature = 1.0

    def forward(self, x):
        return self.lin(x)


def getattr_delegation(compile_it) -> list:
    torch.manual_seed(0)
    model = Delegating(Tempered())
    run, seen = compile_it(model), []
    for t in (1.0, 0.5, 2.0):
        model.inner.temperature = t
        seen.append(run(torch.ones(2, 4)))
    return seen


# -- Python state ---------------------------------------------------------------------------------


def _appends_to_default(x, history=[]):  # noqa: B006 (the user's mutable default)
    history.append(x.shape[0])
    return x * len(history), list(history)


def mutable_default_argument(compile_it) -> list:
    _appends_to_default.__defaults__[0].clear()
    run = compile_it(_appends_to_default)
    return [run(torch.ones(n)) for n in (2, 2, 3)] + [list(_appends_to_default.__defaults__[0])]


CALLS = 0


def _counts_globally(x):
    global CALLS
    CALLS += 1
    return x * CALLS


def global_counter(compile_it) -> list:
    global CALLS
    CALLS = 0
    run = compile_it(_counts_globally)
    return [run(torch.ones(2)) for _ in range(3)] + [CALLS]


class ShapeCached(nn.Module):
    """Positional tables cached on the class, keyed by an f-string of the shape."""

    cache: dict = {}

    def forward(self, x):
        key = f"{tuple(x.shape)}:{x.dtype}"
        if key not in type(self).cache:
            type(self).cache[key] = torch.arange(x.shape[-1], dtype=x.dtype) / x.shape[-1]
        return x + type(self).cache[key]


def class_level_cache(compile_it) -> list:
    ShapeCached.cache = {}
    run = compile_it(ShapeCached())
    seen = [run(torch.ones(2, n)) for n in (3, 4, 3)]
    return [*seen, sorted(ShapeCached.cache)]


@dataclasses.dataclass
class MutableConfig:
    scale: float = 1.0
    act: str = "relu"


def _configured(x, config):
    y = x * config.scale
    return y.relu() if config.act == "relu" else y.tanh()


def mutable_dataclass_config(compile_it) -> list:
    config, run, seen = MutableConfig(), compile_it(_configured), []
    for scale, act in ((1.0, "relu"), (2.0, "relu"), (2.0, "tanh"), (1.0, "relu")):
        config.scale, config.act = scale, act
        seen.append(run(torch.linspace(-1, 1, 4), config))
    return seen


def _bucketed(x, boundaries):
    n = x.shape[-1]
    bucket = bisect.bisect_left(boundaries, n)
    top = heapq.nlargest(2, x.sum(0).tolist())
    spread = statistics.pstdev(top) + math.log2(n)
    return x * bucket + functools.reduce(operator.mul, x.shape) * spread


def stdlib_on_numbers(compile_it) -> list:
    torch.manual_seed(0)
    run, boundaries = compile_it(_bucketed), [2, 4, 8]
    return [run(torch.randn(2, n), boundaries) for n in (3, 5, 3, 9)]


def _heads_of(x, heads):
    new_shape = x.shape[:-1] + (heads, x.shape[-1] // heads)
    y = x.view(new_shape).transpose(-2, -3)
    return y, y.shape, torch.Size([2]) + y.shape[1:], new_shape.numel()


def size_arithmetic(compile_it) -> list:
    torch.manual_seed(0)
    run = compile_it(_heads_of)
    return [run(torch.randn(2, 3, 8), h) for h in (2, 4, 2)]


def _shape_keyed(x, table):
    key = f"{x.shape[0]}x{x.shape[1]}"
    table[key] = table.get(key, 0) + 1
    return x * table[key]


def shape_string_keys(compile_it) -> list:
    run, table = compile_it(_shape_keyed), {}
    seen = [run(torch.ones(n, 2), table) for n in (2, 3, 2)]
    return [*seen, dict(table)]


def _prints(x):
    y = x * 2
    print("y:", y, y.shape)
    return y


def prints_per_call(compile_it) -> list:
    run, seen = compile_it(_prints), []
    for v in (1.0, 2.0, 1.0):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            seen.append(run(torch.full((2,), v)))
        seen.append(out.getvalue())
    return seen
