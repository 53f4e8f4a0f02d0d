"""Programs as users write them, round 7, each next to eager over several calls while the Python
state they read changes between calls: data-dependent branches and early exits, mixture-of-experts
routing, configs and context variables, hand-written KV caches, gradient accumulation, activation
checkpointing, EMA updates, hooks and optimizer steps inside the compiled function.

What differed: a reentrant checkpoint (``use_reentrant=True``) in a jitted function that reads the
checkpointed module through a global or closure left the module's parameters without gradients,
silently: each parameter becomes an input of the trace where the region first reads it, numbered
among the values the region defined, so the VJP pass took it for one of the region's own values and
dropped its gradient (``passes::reentrant``, ``Sums::defined_in``). Under ``torch.compile``, a graph
that sets ``p.data = value`` (a momentum encoder) ran eagerly: Dynamo writes it as
``aten.shallow_copy_data_``, which thunder_rs had no form for; it is traced as ``t.data = value`` is
under ``jit`` (``dynamo._data_writes``). A ``torch.Generator`` the program creates and draws from
was refused without naming the line that draws (``rng.note_draw``), and a refusal inside a Dynamo
graph named Dynamo's generated code (``<eval_with_key>.3:12``), not the user's line
(``userframe._graph_source``). A function under ``@torch.no_grad()`` or ``@torch.inference_mode()``
(an EMA update, a scorer) read and wrote its closure cells once, while traced: the decorator's
wrapper calls it from torch's code, which the observer does not follow (``counter[0] += 1`` ran on
the first call only; the EMA's warmup decay stayed the first call's); the observer follows
``__wrapped__``. ``torch.cond`` of a traced predicate failed inside thunder_rs with Dynamo's error
(``CallObserver.pause``); without grad it runs the branch the predicate picks, under grad mode
it is refused naming the line (eager gives the untaken branch's parameters zero gradients), as is
``while_loop``.

Dynamo itself neither guards hooks added between calls nor ``os.environ`` reads (so does
``backend="eager"``): those are left to it.

What the program reads that a compiled call cannot see again (``random.random()``, an
``itertools.count`` argument, the clock, ``.grad`` in an optimizer step, a backward inside the
function) is refused naming the user's line."""

import contextlib
import contextvars
import copy
import dataclasses
import enum
import inspect
import itertools
import random
import time
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import thunder_rs
from test_dynamo_backend import compiled_by_thunder_rs, fresh_dynamo  # noqa: F401 (a fixture)
from thunder_rs.errors import ThunderNotImplementedError

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = dict(rtol=1e-5, atol=1e-6)


def _eager(fn):
    return fn


def _compile(fn):
    return torch.compile(fn, backend="thunder_rs")


COMPILERS = pytest.mark.parametrize("compile_it", [thunder_rs.jit, _compile], ids=["jit", "torch_compile"])


def _assert_same(got, expected, path="out") -> None:
    """Tensors equal within ``TOL`` (dtype and shape exact), other values equal, nested alike."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == expected.dtype, path
        torch.testing.assert_close(got, expected, **TOL, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), path
        for i, (a, b) in enumerate(zip(got, expected)):
            _assert_same(a, b, f"{path}[{i}]")
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


def _line_of(fn, marker: str) -> str:
    lines, first = inspect.getsourcelines(fn)
    return f"{__file__}:{first + next(i for i, line in enumerate(lines) if marker in line)}"


def _grads(module: nn.Module) -> list:
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


def _params(module: nn.Module) -> list:
    return [p.detach().clone() for p in module.parameters()]


class AdaptiveDepth(nn.Module):
    """Layers applied until the activations settle (an early exit), then a branch on their sign."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(5))

    def forward(self, x):
        steps = 0
        for layer in self.layers:
            x = torch.tanh(layer(x))
            steps += 1
            if x.abs().mean() < 0.3:
                break
        x = x * 2 if x.sum() > 0 else x - 1
        return x, steps


def _adaptive_depth(compile_it) -> list:
    torch.manual_seed(0)
    model = AdaptiveDepth()
    run, seen = compile_it(model), []
    for scale in (0.2, 1.2, 2.2, 3.2):
        out, steps = run(torch.randn(3, 4) * scale)
        out.sum().backward()
        seen += [out, steps, _grads(model)]
        model.zero_grad()
    return seen


class MixtureOfExperts(nn.Module):
    """Top-2 routing: each expert runs on the tokens sent to it (``nonzero``), its outputs added at
    their rows by ``index_add``; the positive outputs picked by ``masked_select``."""

    def __init__(self, experts=4, dim=6):
        super().__init__()
        self.gate = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))

    def forward(self, x):
        weights, chosen = self.gate(x).softmax(-1).topk(2, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel() == 0:
                continue
            out = out.index_add(0, token, expert(x[token]) * weights[token, slot, None])
        return out, torch.masked_select(out, out > 0).sum()


def _mixture_of_experts(compile_it) -> list:
    torch.manual_seed(0)
    model = MixtureOfExperts()
    run, seen = compile_it(model), []
    for _ in range(3):
        out, positive = run(torch.randn(5, 6))
        (out.sum() + positive).backward()
        seen += [out, positive, _grads(model)]
        model.zero_grad()
    return seen


class Act(enum.Enum):
    RELU = "relu"
    GELU = "gelu"


@dataclasses.dataclass
class HeadConfig:
    act: Act = Act.RELU
    scale: float = 1.0


SCALE: contextvars.ContextVar = contextvars.ContextVar("SCALE", default=1.0)


def _configured(x, config):
    y = F.relu(x) if config.act is Act.RELU else F.gelu(x)
    return y * config.scale * SCALE.get()


def _config_changes(compile_it) -> list:
    torch.manual_seed(0)
    config, x = HeadConfig(), torch.randn(4)
    run = compile_it(_configured)
    seen = [run(x, config)]
    config.act = Act.GELU
    seen.append(run(x, config))
    token = SCALE.set(3.0)
    seen.append(run(x, config))
    SCALE.reset(token)
    config.scale = 0.5
    seen += [run(x, config), run(x, HeadConfig())]
    if compile_it is thunder_rs.jit:  # one entry per configuration; the last is the first's again
        assert (thunder_rs.cache_misses(run), thunder_rs.cache_hits(run)) == (4, 1)
    return seen


class StaticCacheDecoder(nn.Module):
    """Attention over a preallocated cache written at the positions decoded (``index_copy_``)."""

    def __init__(self, dim=8, length=16):
        super().__init__()
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.register_buffer("k", torch.zeros(1, length, dim))
        self.register_buffer("v", torch.zeros(1, length, dim))

    def forward(self, x, pos: int):
        q, k, v = self.qkv(x).chunk(3, -1)
        at = torch.arange(pos, pos + x.shape[1])
        self.k.index_copy_(1, at, k)
        self.v.index_copy_(1, at, v)
        mask = torch.arange(self.k.shape[1]) <= at[:, None]
        return self.out(F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask))


def _static_cache(compile_it) -> list:
    torch.manual_seed(0)
    model = StaticCacheDecoder()
    run = compile_it(model)
    with torch.no_grad():
        seen = [run(torch.randn(1, 3, 8), 0)]
        for pos in range(3, 7):
            seen.append(run(seen[-1][:, -1:], pos))
    if compile_it is thunder_rs.jit:  # the prompt's length, then one token at any position
        assert thunder_rs.cache_misses(run) == 2
    return [*seen, model.k.clone(), model.v.clone()]


class GrowingCache(nn.Module):
    """A cache of keys kept on the module, grown by ``torch.cat`` at each step."""

    def __init__(self, dim=4):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.cache = None

    def forward(self, x):
        k = self.proj(x)
        self.cache = k if self.cache is None else torch.cat([self.cache, k])
        return (x @ self.cache.T).softmax(-1) @ self.cache


def _growing_cache(compile_it) -> list:
    torch.manual_seed(0)
    model = GrowingCache()
    run, x, seen = compile_it(model), torch.randn(1, 4), []
    with torch.no_grad():
        for _ in range(4):
            x = run(x)
            seen.append(x)
    return [*seen, model.cache]


def _past_in_a_dict(compile_it) -> list:
    torch.manual_seed(0)
    proj = nn.Linear(4, 8)

    def step(x, past):
        k, v = proj(x).chunk(2, -1)
        if "k" in past:
            k, v = torch.cat([past["k"], k]), torch.cat([past["v"], v])
        past["k"], past["v"] = k, v
        return (x @ k.T).softmax(-1) @ v

    run, past, x, seen = compile_it(step), {}, torch.randn(1, 4), []
    with torch.no_grad():
        for _ in range(4):
            x = run(x, past)
            seen.append(x)
    return [*seen, past["k"], past["v"]]


class NoSyncWrapper(nn.Module):
    """A DDP-like wrapper: ``no_sync()`` turns off a flag the forward reads (counting syncs)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)
        self.sync, self.synced = True, 0

    @contextlib.contextmanager
    def no_sync(self):
        before, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = before

    def forward(self, x):
        if self.sync:
            self.synced += 1
        return self.net(x)


def _accumulation(compile_it) -> list:
    torch.manual_seed(0)
    model = NoSyncWrapper()
    run, seen = compile_it(model), []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        for micro in range(3):
            with model.no_sync() if micro < 2 else contextlib.nullcontext():
                loss = run(torch.randn(2, 4)).square().mean() / 3
                loss.backward()
            seen.append(loss)
        seen.append(_grads(model))
        optimizer.step()
        optimizer.zero_grad()
    return [*seen, model.synced, _params(model)]


class CheckpointedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Dropout(0.2), nn.Linear(8, 4))

    def forward(self, x):
        return checkpoint(self.body, x, use_reentrant=False) + x


def _non_reentrant_checkpoint(compile_it) -> list:
    torch.manual_seed(0)
    model = CheckpointedBlock()
    run, seen = compile_it(model), []
    for step in range(3):
        torch.manual_seed(10 + step)  # the dropout's draws, recomputed in the backward
        x = torch.randn(3, 4, requires_grad=True)
        out = run(x)
        out.sum().backward()
        seen += [out, x.grad, _grads(model)]
        model.zero_grad()
    return seen


BODY = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))


def _reentrant_through_a_global(x):
    return checkpoint(BODY, x, use_reentrant=True).square().sum()


def _reentrant_checkpoint(compile_it) -> list:
    torch.manual_seed(0)
    for p, q in zip(BODY.parameters(), nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4)).parameters()):
        p.data.copy_(q)
    BODY.zero_grad()
    run, seen = compile_it(_reentrant_through_a_global), []
    for _ in range(3):  # micro-batches: the gradients accumulate
        x = torch.randn(2, 4, requires_grad=True)
        out = run(x)
        out.backward()
        seen += [out, x.grad, _grads(BODY)]
    return seen


def _ema_of_an_optimized_model(compile_it) -> list:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    shadow = [p.detach().clone() for p in net.parameters()]
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    updates = [0]

    @torch.no_grad()
    def update(model):
        updates[0] += 1
        decay = min(0.99, (1 + updates[0]) / (10 + updates[0]))
        torch._foreach_lerp_(shadow, [p.detach() for p in model.parameters()], 1 - decay)

    run, seen = compile_it(update), []
    for _ in range(3):
        net(torch.randn(2, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        run(net)
        seen.append([s.clone() for s in shadow])
    return [*seen, updates[0]]


def _momentum_encoder(compile_it) -> list:
    torch.manual_seed(0)
    query = nn.Linear(4, 3)
    key = copy.deepcopy(query)

    def step(x):
        out = query(x).sum() + key(x).sum().detach()
        for pk, pq in zip(key.parameters(), query.parameters()):
            pk.data = pk.data * 0.9 + pq.data * 0.1
        return out

    run, seen = compile_it(step), []
    optimizer = torch.optim.SGD(query.parameters(), lr=0.1)
    for i in range(3):
        out = run(torch.ones(2, 4) * i)
        out.backward()
        optimizer.step()
        optimizer.zero_grad()
        seen += [out, _params(key), _params(query)]
    if compile_it is thunder_rs.jit:  # the parameters written through .data are the same tensors
        assert thunder_rs.cache_misses(run) == 1
    return seen


def _hooks_between_calls(compile_it) -> list:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    run, x, seen, kept = compile_it(model), torch.randn(2, 4), [], []
    shift = [3.0]
    seen.append(run(x))
    handle = model[0].register_forward_pre_hook(lambda m, args: (args[0] + shift[0],))
    recorder = model[1].register_forward_hook(lambda m, args, out: kept.append(out.detach()))
    seen.append(run(x))
    shift[0] = -1.0
    seen.append(run(x))
    handle.remove()
    recorder.remove()
    return [*seen, run(x), kept]


class ActNorm(nn.Module):
    """Glow's ActNorm: its first call sets its parameters from the batch (a branch on a buffer)."""

    def __init__(self, channels=3):
        super().__init__()
        self.loc, self.logs = nn.Parameter(torch.zeros(channels)), nn.Parameter(torch.zeros(channels))
        self.register_buffer("initialized", torch.tensor(0, dtype=torch.uint8))

    def forward(self, x):
        if self.initialized.item() == 0:
            with torch.no_grad():
                self.loc.data.copy_(-x.mean(0))
                self.logs.data.copy_(-torch.log(x.std(0) + 1e-6))
                self.initialized.fill_(1)
        return (x + self.loc) * self.logs.exp()


def _data_dependent_init(compile_it) -> list:
    torch.manual_seed(0)
    model = ActNorm()
    run, seen = compile_it(model), []
    for i in range(3):
        out = run(torch.randn(6, 3) * (i + 1) + i)
        out.sum().backward()
        seen += [out, _grads(model), _params(model)]
        model.zero_grad()
    return seen


def _optimizer_in_backward(compile_it) -> list:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    optimizers = {p: torch.optim.SGD([p], lr=0.1) for p in net.parameters()}

    def step_and_clear(p):
        optimizers[p].step()
        optimizers[p].zero_grad()

    for p in net.parameters():
        p.register_post_accumulate_grad_hook(step_and_clear)
    run, seen = compile_it(net), []
    for _ in range(3):
        out = run(torch.randn(2, 4))
        out.sum().backward()
        seen += [out, _params(net)]
    return seen


def _sampled_generation(compile_it) -> list:
    """Sampling by ``torch.multinomial`` at two temperatures, stopping at an end token."""
    torch.manual_seed(0)
    emb, head = nn.Embedding(10, 8), nn.Linear(8, 10)

    def next_token(ids, temperature):
        return torch.multinomial((head(emb(ids).mean(0)) / temperature).softmax(-1), 1)

    run, seen = compile_it(next_token), []
    torch.manual_seed(1)
    with torch.no_grad():
        for temperature in (1.0, 0.7):
            ids = torch.tensor([1, 2])
            for _ in range(6):
                token = run(ids, temperature)
                ids = torch.cat([ids, token])
                if token.item() == 3:
                    break
            seen.append(ids)
    return [*seen, torch.rand(2)]


def _router_load(compile_it) -> list:
    """A router counting the tokens each expert gets (``bincount`` and ``index_add_`` into state)."""
    torch.manual_seed(0)
    gate, load = nn.Linear(4, 3), torch.zeros(3)

    def route(x):
        chosen = gate(x).argmax(-1)
        load.add_(torch.bincount(chosen, minlength=3).float())
        load.index_add_(0, chosen, torch.ones(chosen.shape[0]))
        return gate(x).softmax(-1)

    run = compile_it(route)
    return [run(torch.randn(5, 4)) for _ in range(3)] + [load.clone()]


def _decorated_scorer(compile_it) -> list:
    """A scorer under ``@torch.inference_mode()`` counting its calls in a closure."""
    calls = [0]

    @torch.inference_mode()
    def score(x):
        calls[0] += 1
        return x.sum() * calls[0]

    run = compile_it(score)
    return [run(torch.ones(2)) for _ in range(3)] + [calls[0]]


class GatedResidual(nn.Module):
    """A layer that ``torch.cond`` applies or skips by the sign of its input's mean."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.mean() > 0, lambda t: t + self.lin(t).tanh(), lambda t: t * 0.5, (x,))


def _cond_gate(compile_it) -> list:
    torch.manual_seed(0)
    model = GatedResidual()
    run = compile_it(model)
    with torch.no_grad():
        return [run(torch.randn(3, 4) + shift) for shift in (1.0, -1.0, 2.0, -3.0)]


def _cond_gate_trained(compile_it) -> list:
    torch.manual_seed(0)
    model = GatedResidual()
    run, seen = compile_it(model), []
    for shift in (1.0, -1.0, 2.0):
        x = torch.randn(3, 4) + shift
        out = run(x)
        out.square().sum().backward()
        seen += [out, _grads(model)]  # the branch not taken: zero gradients
        model.zero_grad()
    return seen


def test_torch_cond_under_grad_mode_is_eagers_under_torch_compile_and_refused_by_jit():
    # jit: failed inside thunder_rs's observer with Dynamo's error (CallObserver.pause).
    expected = _cond_gate_trained(_eager)
    _assert_same(_cond_gate_trained(_compile), expected)
    line = _line_of(GatedResidual.forward, "torch.cond")
    with pytest.raises(ThunderNotImplementedError, match=rf"torch.cond at {line} under grad mode"):
        _cond_gate_trained(thunder_rs.jit)


PROGRAMS = [
    _adaptive_depth,
    _mixture_of_experts,
    _config_changes,
    _static_cache,
    _growing_cache,
    _past_in_a_dict,
    _accumulation,
    _non_reentrant_checkpoint,
    _reentrant_checkpoint,
    _ema_of_an_optimized_model,
    _momentum_encoder,
    _hooks_between_calls,
    _data_dependent_init,
    _optimizer_in_backward,
    _sampled_generation,
    _router_load,
    _decorated_scorer,
    _cond_gate,
]


@COMPILERS
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.__name__.strip("_") for p in PROGRAMS])
def test_a_program_over_several_calls_is_eagers(program, compile_it):
    if compile_it is _compile and program is _hooks_between_calls:
        pytest.skip("Dynamo does not guard on hooks added between calls (skip_nnmodule_hook_guards), as with inductor")
    expected = program(_eager)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunder_rs backend")  # no graph runs eagerly
        _assert_same(program(compile_it), expected)


class StochasticDepth(nn.Module):
    """Residual layers each skipped with probability 1/2 in training, by ``random.random()``."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            if self.training and random.random() < 0.5:  # draws
                continue
            x = x + layer(x)
        return x


def _numbered(x, counter):
    step = next(counter)  # counts
    return x * (1 + step)


def _within_budget(x, deadline):
    for _ in range(4):
        if time.monotonic() > deadline:  # reads the clock
            break
        x = x * 0.5 + 1
    return x


def _noisy(x, seed):
    g = torch.Generator().manual_seed(seed)
    return x + torch.randn(x.shape, generator=g)  # draws from its generator


def _train_step(net, optimizer):
    def step(x):
        loss = net(x).square().mean()
        loss.backward()  # differentiates
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    return step


def _refused_programs():
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    step = _train_step(net, optimizer)
    return [
        (StochasticDepth(), (torch.ones(2, 4),), StochasticDepth.forward, "# draws", "random.random"),
        (_numbered, (torch.ones(2), itertools.count()), _numbered, "# counts", "next"),
        (_within_budget, (torch.ones(2), time.monotonic() + 100), _within_budget, "# reads the clock", "clock"),
        (_noisy, (torch.zeros(3), 1), _noisy, "# draws from its generator", "torch.Generator it creates"),
        (step, (torch.randn(3, 4),), _train_step, "# differentiates", "differentiates"),
    ]


@pytest.mark.parametrize("index", range(5), ids=["random", "count", "clock", "generator", "backward"])
def test_state_a_compiled_call_cannot_see_again_is_refused_naming_the_users_line(index):
    # The generator: refused without the line that draws from it.
    program, args, code, marker, what = _refused_programs()[index]
    line = _line_of(code, marker)
    with pytest.raises(ThunderNotImplementedError, match=rf"(?s)(?=.*{what})(?=.*{line}\b)"):
        thunder_rs.jit(program)(*args)


@pytest.mark.parametrize("index", range(5), ids=["random", "count", "clock", "generator", "backward"])
def test_under_torch_compile_they_run_as_eager_across_the_graph_breaks(index):
    def runs(compile_it) -> list:
        random.seed(1)
        torch.manual_seed(0)
        program, args, *_ = _refused_programs()[index]
        run = compile_it(program)
        return [run(*args) for _ in range(3)] + [random.random(), torch.rand(2)]

    expected = runs(_eager)
    torch._dynamo.reset()
    _assert_same(runs(_compile), expected)


def test_a_momentum_encoders_data_assignment_is_compiled_by_thunder_rs():
    # The graph ran eagerly: Dynamo's shallow_copy_data_ had no form in thunder_rs.
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunder_rs backend")
        expected = _momentum_encoder(_eager)
        _assert_same(_momentum_encoder(_compile), expected)
    assert compiled_by_thunder_rs()


def test_a_data_assignment_refused_under_torch_compile_names_the_users_line():
    # Named the line of Dynamo's generated code (<eval_with_key>.N:12), not the user's.
    # (Tying, ``lin.weight.data = other.weight.data``, is compiled now: test_data_rebinding.py.)
    lin = nn.Linear(4, 3)

    def write_after(x):
        out = lin(x).sum()
        new = lin.weight.data * 2
        lin.weight.data = new  # assigns
        new.add_(1)
        return out, new

    line = _line_of(write_after, "# assigns")
    with pytest.warns(UserWarning, match=rf"runs eagerly: .*Tensor.data = value at {line}\b"):
        out, new = _compile(write_after)(torch.ones(1, 4))
    assert lin.weight.data_ptr() == new.data_ptr() and out.requires_grad


def test_a_while_loop_op_is_refused_naming_the_line():
    # Failed inside thunder_rs's observer with Dynamo's error (CallObserver.pause).
    def halve_until_small(x):
        return torch._higher_order_ops.while_loop(lambda t: t.sum() > 1, lambda t: (t / 2,), (x,))  # loops

    line = _line_of(halve_until_small, "# loops")
    with pytest.raises(ThunderNotImplementedError, match=rf"higher-order op while_loop at {line}\b"):
        thunder_rs.jit(halve_until_small)(torch.ones(3))
