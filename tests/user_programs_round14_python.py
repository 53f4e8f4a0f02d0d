"""The programs of ``test_user_programs_round14.py`` built of Python control constructs and data-
dependent model code: a ``try``/``except`` around a factorisation that fails on some inputs, a
generator driven by ``send``, closures and ``functools.partial`` whose captured values change,
``match`` statements on a config, an ``ExitStack`` of context managers with side effects, a
parameter of an ``nn.Parameter`` subclass, a forward replaced by ``types.MethodType``, inputs that
are ``NamedTuple``s and dicts whose keys change, top-k / top-p sampling by ``torch.multinomial``
from a ``torch.Generator`` passed in, ``torch.unique`` and ``histc`` counts used as sizes,
``repeat_interleave`` by a tensor, ragged batches split by ``lengths.tolist()``. Each takes how to
compile, runs it over several calls, and returns what the calls gave and left."""

import contextlib
import dataclasses
import functools
import types
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from user_programs_round8 import _backward_steps


def _whitened(a, b):
    try:
        low = torch.linalg.cholesky(a)
        route = 0
    except torch.linalg.LinAlgError:
        low = torch.linalg.cholesky(a + 4 * torch.eye(a.shape[-1], dtype=a.dtype))
        route = 1
    return torch.cholesky_solve(b, low), route


def cholesky_failure_falls_back(compile_it) -> list:
    """``except torch.linalg.LinAlgError`` on the inputs that are not positive definite."""
    torch.manual_seed(0)
    run, seen = compile_it(_whitened), []
    for shift in (3.0, -3.0, 3.0, -3.0):
        m = torch.randn(3, 3, dtype=torch.float64)
        a = (m @ m.T + shift * torch.eye(3, dtype=torch.float64)).requires_grad_()
        b = torch.randn(3, 2, dtype=torch.float64)
        out, route = run(a, b)
        out.sum().backward()
        seen += [out, route, a.grad]
    return seen


class OutOfVocabulary(nn.Module):
    """Ids past the vocabulary caught (``except IndexError``) and mapped to the last row."""

    def __init__(self):
        super().__init__()
        self.emb, self.lin = nn.Embedding(5, 3), nn.Linear(3, 3)

    def forward(self, ids):
        try:
            e, clamped = self.emb(ids), False
        except IndexError:
            e, clamped = self.emb(ids.clamp(max=self.emb.num_embeddings - 1)), True
        return self.lin(e), clamped


def embedding_out_of_vocabulary_falls_back(compile_it) -> list:
    torch.manual_seed(0)
    model = OutOfVocabulary()
    run = compile_it(model)
    return _backward_steps(model, run, [(torch.tensor(ids),) for ids in ([1, 2], [1, 7], [0, 4], [9, 9])])


class SteppedByASend(nn.Module):
    """A coroutine-style generator: each layer's output is sent back to choose the next scale."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(3))

    def _schedule(self):
        scale = 1.0
        for layer in self.layers:
            width = yield layer, scale
            scale = 1.0 / (1 + width)

    def forward(self, x):
        steps = self._schedule()
        layer, scale = next(steps)
        while True:
            x = torch.tanh(layer(x)) * scale
            try:
                layer, scale = steps.send(x.shape[-1] + len(self.layers))
            except StopIteration:
                return x


def generator_driven_by_send(compile_it) -> list:
    torch.manual_seed(0)
    model = SteppedByASend()
    run, seen = compile_it(model), []
    for layers in (3, 2, 3):
        del model.layers[layers:]
        while len(model.layers) < layers:
            model.layers.append(nn.Linear(3, 3))
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


def _make_gate():
    state = {"slope": 0.1}
    bias = 0.0

    def gate(x):
        return F.leaky_relu(x, state["slope"]) + bias

    def set_bias(value):
        nonlocal bias
        bias = value

    return gate, state, set_bias


def closures_and_partials_changed(compile_it) -> list:
    """A closure over a dict and a ``nonlocal`` cell, and a partial passed in, changed per call."""
    gate, state, set_bias = _make_gate()
    run, seen = compile_it(lambda x, act: act(gate(x))), []
    act = functools.partial(torch.clamp, min=-0.5)
    for step in range(5):
        if step == 1:
            state["slope"] = 0.5
        if step == 2:
            set_bias(1.0)
        if step == 3:
            act = functools.partial(torch.clamp, min=-0.5, max=0.25)
        seen.append(run(torch.linspace(-2, 2, 5), act))
    return seen


@dataclasses.dataclass
class HeadConfig:
    kind: str
    width: int = 3
    scale: float = 1.0


class MatchedHead(nn.Module):
    """A head chosen by a ``match`` on its config (class patterns, guards, a mapping pattern)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg, self.lin = cfg, nn.Linear(3, 3)

    def forward(self, x, extra: dict):
        match self.cfg:
            case HeadConfig(kind="gelu", scale=s):
                y = F.gelu(self.lin(x)) * s
            case HeadConfig(kind="relu", width=w) if w > 2:
                y = F.relu(self.lin(x))[..., :w]
            case _:
                y = self.lin(x)
        match extra:
            case {"shift": float(shift)}:
                y = y + shift
            case {"mask": mask}:
                y = y * mask
        return y


def match_on_a_config(compile_it) -> list:
    torch.manual_seed(0)
    model = MatchedHead(HeadConfig("gelu"))
    run, seen = compile_it(model), []
    changes = [None, ("scale", 2.0), ("kind", "relu"), ("width", 2), ("kind", "tanh")]
    extras = [{}, {"shift": 1.5}, {"mask": torch.tensor([1.0, 0.0, 1.0])}, {"shift": 2}, {"shift": -1.0}]
    for change, extra in zip(changes, extras):
        if change is not None:
            setattr(model.cfg, *change)
        seen += _backward_steps(model, run, [(torch.randn(2, 3), extra)])
    return seen


class Counting:
    """A context manager with side effects: counts entries and sets a scale while active."""

    active_scale = 1.0

    def __init__(self, log: list, scale: float):
        self.log, self.scale = log, scale

    def __enter__(self):
        self.log.append(("enter", self.scale))
        self.previous, Counting.active_scale = Counting.active_scale, self.scale
        return self

    def __exit__(self, *exc):
        Counting.active_scale = self.previous
        self.log.append(("exit", self.scale))
        return False


def _stacked(x, w, scales: list, log: list, frozen: bool):
    with contextlib.ExitStack() as stack:
        for s in scales:
            stack.enter_context(Counting(log, s))
        if frozen:
            stack.enter_context(torch.no_grad())
        stack.callback(log.append, "callback")
        y = (x @ w) * Counting.active_scale
    return y * Counting.active_scale


def exit_stack_of_side_effects(compile_it) -> list:
    torch.manual_seed(0)
    run, seen, log = compile_it(_stacked), [], []
    for scales, frozen in (([2.0], False), ([2.0, 3.0], False), ([2.0, 3.0], True), ([], False)):
        w = torch.randn(3, 3, requires_grad=True)
        y = run(torch.randn(2, 3), w, scales, log, frozen)
        if y.requires_grad:
            y.sum().backward()
        seen += [y, w.grad, list(log), Counting.active_scale]
    return seen


class ScaledParameter(nn.Parameter):
    """A parameter subclass (as quantisation and sharding libraries write) carrying a scale."""

    def __new__(cls, data, scale: float = 1.0):
        p = super().__new__(cls, data)
        p.scale = scale
        return p


class WithScaledParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = ScaledParameter(torch.randn(3, 3), scale=0.5)

    def forward(self, x):
        return x @ self.weight.T * self.weight.scale


def parameter_subclass(compile_it) -> list:
    torch.manual_seed(0)
    model = WithScaledParameter()
    run, seen = compile_it(model), []
    for scale in (0.5, 2.0, 2.0):
        model.weight.scale = scale
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen + [type(model.weight).__name__]


def _doubled_forward(self, x):
    return self.out(self.act(self.lin(x)) * 2)


def forward_replaced_by_method_type(compile_it) -> list:
    """``model.forward = types.MethodType(f, model)`` between calls, then deleted."""
    from user_programs_round14 import Block

    torch.manual_seed(0)
    model = Block()
    run, seen = compile_it(model), []
    for step in range(4):
        if step == 1:
            model.forward = types.MethodType(_doubled_forward, model)
        if step == 3:
            del model.forward
        seen += _backward_steps(model, run, [(torch.randn(2, 4),)])
    return seen


class Batch(NamedTuple):
    tokens: torch.Tensor
    mask: torch.Tensor | None
    temperature: float = 1.0


def _pooled(batch: Batch, extra: dict):
    x = batch.tokens / batch.temperature
    if batch.mask is not None:
        x = x.masked_fill(~batch.mask, 0.0)
    for key in sorted(extra):
        x = x + extra[key]
    return x.sum(-1), Batch(x, batch.mask, batch.temperature * 2)


def namedtuple_and_changing_dict_keys(compile_it) -> list:
    torch.manual_seed(0)
    run, seen = compile_it(_pooled), []
    mask = torch.tensor([[True, False, True]])
    for batch, extra in (
        (Batch(torch.randn(1, 3), None), {}),
        (Batch(torch.randn(1, 3), mask, 2.0), {"a": 1.0}),
        (Batch(torch.randn(1, 3), mask, 2.0), {"a": 1.0, "b": torch.ones(3)}),
        (Batch(torch.randn(1, 3), None, 0.5), {"b": torch.ones(3)}),
    ):
        seen.append(run(batch, extra))
    return seen


def _sample(logits, k: int, p: float, gen: torch.Generator):
    top, idx = logits.topk(k, dim=-1)
    probs = top.softmax(-1)
    cum = probs.cumsum(-1)
    probs = probs.masked_fill(cum - probs > p, 0.0)
    choice = torch.multinomial(probs, 1, generator=gen)
    return idx.gather(-1, choice), probs


def top_k_top_p_sampling_from_a_generator(compile_it) -> list:
    run, seen = compile_it(_sample), []
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 10, generator=torch.Generator().manual_seed(1))
    for k, p in ((5, 0.9), (5, 0.9), (3, 0.5), (5, 0.9)):
        seen.append(run(logits, k, p, gen))
    gen.manual_seed(7)
    seen.append(run(logits, 5, 0.9, gen))
    return seen + [gen.get_state(), _raised_kind(run, logits, 20, 0.9, gen)]


def _raised_kind(run, *args):
    """The built-in exception type ``run`` raises (a thunder_rs error subclasses eager's)."""
    try:
        run(*args)
    except Exception as e:  # noqa: BLE001 (compared with eager's)
        return next(c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins")
    return None


def _counts_as_sizes(ids, values):
    uniq, counts = torch.unique(ids, return_counts=True)
    groups = values.split(counts.tolist())
    pooled = torch.stack([g.mean(0) for g in groups])
    hist = torch.histc(values[:, 0], bins=4, min=-2, max=2)
    padding = torch.zeros(int(hist.max().item()), values.shape[-1])
    return pooled, uniq, padding


def unique_and_histc_counts_as_sizes(compile_it) -> list:
    torch.manual_seed(0)
    run, seen = compile_it(_counts_as_sizes), []
    for ids in ([0, 0, 1, 2, 2, 2], [1, 1, 1, 3, 4, 4], [0, 1, 2, 3, 4, 5]):
        values = torch.randn(6, 2, requires_grad=True)
        pooled, uniq, padding = run(torch.tensor(ids), values)
        pooled.sum().backward()
        seen += [pooled, uniq, padding, values.grad]
    return seen


def _expanded(x, repeats, lengths):
    rows = x.repeat_interleave(repeats, dim=0)
    segments = rows.split(lengths.tolist())
    padded = nn.utils.rnn.pad_sequence(list(segments), batch_first=True)
    return padded, torch.stack([s.sum(0) for s in segments])


def repeat_interleave_and_ragged_split(compile_it) -> list:
    torch.manual_seed(0)
    run, seen = compile_it(_expanded), []
    for repeats, lengths in (([1, 2, 3], [2, 4]), ([2, 2, 2], [3, 3]), ([3, 0, 1], [1, 1, 2])):
        x = torch.randn(3, 2, requires_grad=True)
        padded, sums = run(x, torch.tensor(repeats), torch.tensor(lengths))
        (padded.sum() + sums.square().sum()).backward()
        seen += [padded, sums, x.grad]
    return seen


def _in_dict_order(x, extra: dict):
    for value in extra.values():
        x = x * 2 + value
    return x, list(extra)


def dict_keys_changing_order(compile_it) -> list:
    """The same keys in another insertion order (the loop's result depends on it), and tensors."""
    run, one = compile_it(_in_dict_order), torch.ones(2)
    orders = [{"a": 1.0, "b": 2.0}, {"b": 2.0, "a": 1.0}, {"a": one, "b": one * 3}, {"b": one * 3, "a": one}]
    return [run(one, extra) for extra in orders]


@dataclasses.dataclass
class Request:
    x: torch.Tensor
    scale: float
    tags: list


def _served(request: Request, *, n: int = 2, **options):
    y = request.x * request.scale
    for tag in request.tags:
        y = y + len(tag)
    for key in sorted(options):
        y = y + options[key]
    request.scale += 1  # (the caller's object counts its calls)
    return y * n


def dataclass_input_written_and_changing_keywords(compile_it) -> list:
    run, seen = compile_it(_served), []
    request = Request(torch.ones(2), 2.0, ["a"])
    for options in ({}, {"n": 3}, {"z": 1.0}, {"z": 1.0, "a": torch.ones(2)}, {"a": 2.0}):
        seen += [run(request, **options), request.scale]
        request.tags.append("bb")
    return seen


class ClosedEarly(nn.Module):
    """A generator left unfinished by a ``break``: its ``finally`` runs when it is closed."""

    def __init__(self):
        super().__init__()
        self.lin, self.closed = nn.Linear(3, 3), 0

    def _stages(self):
        try:
            yield from range(5)
        finally:
            self.closed += 1

    def forward(self, x, stop: int):
        for i in self._stages():
            x = self.lin(x)
            if i == stop:
                break
        return x


def generator_closed_early(compile_it) -> list:
    torch.manual_seed(0)
    model = ClosedEarly()
    run, seen = compile_it(model), []
    for stop in (1, 1, 3):
        seen += _backward_steps(model, run, [(torch.ones(1, 3), stop)])
        seen.append(model.closed)
    return seen


def _frozen_steps(lin, x):
    with torch.no_grad():
        yield lin(x)
    yield lin(x)


def _held_open(lin, x):
    steps = _frozen_steps(lin, x)
    first = next(steps)
    between = lin(x) * 2  # (grad mode is off here: the generator's with block is still open)
    return first, between, next(steps), torch.is_grad_enabled()


def no_grad_held_open_by_a_suspended_generator(compile_it) -> list:
    torch.manual_seed(0)
    lin, seen = nn.Linear(3, 3), []
    run = compile_it(_held_open)
    for _ in range(2):
        first, between, last, enabled = run(lin, torch.ones(1, 3))
        last.sum().backward()
        seen += [first, between, last, enabled, lin.weight.grad.clone()]
        lin.zero_grad()
    return seen


def _runs_and_buckets(ids, w):
    values, inverse, counts = torch.unique_consecutive(ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(values)).index_add(0, inverse, w)
    buckets = torch.bucketize(w.detach(), torch.tensor([-0.5, 0.0, 0.5]))
    return sums, values, torch.argwhere(ids > 1), torch.repeat_interleave(counts), buckets, torch.bincount(buckets)


def consecutive_runs_and_buckets(compile_it) -> list:
    """``unique_consecutive`` runs summed by ``index_add``, ``argwhere``, ``repeat_interleave`` of
    the counts, ``bucketize`` and ``bincount``: sizes from the values, changing per call."""
    run, seen = compile_it(_runs_and_buckets), []
    for i, ids in enumerate(([1, 1, 2, 2, 2, 3], [0, 0, 0, 1, 5, 5], [4, 3, 3, 3, 3, 3], [1, 2, 3, 4, 5, 6])):
        w = torch.randn(6, generator=torch.Generator().manual_seed(i)).requires_grad_()
        out = run(torch.tensor(ids), w)
        out[0].square().sum().backward()
        seen += [*out, w.grad]
    return seen


def _looked_up(table, idx, classes: int):
    try:
        rows, inside = table[idx], True
    except IndexError:
        rows, inside = table[idx.clamp(max=table.shape[0] - 1)], False
    try:
        hot = F.one_hot(idx, classes)
    except RuntimeError:
        hot = torch.zeros(idx.shape[0], classes, dtype=torch.long)
    try:
        counts = torch.bincount(idx - 1)
    except RuntimeError:
        counts = torch.bincount(idx)
    return rows * 2, inside, hot, counts


def index_one_hot_and_bincount_failing_in_try(compile_it) -> list:
    """Tensor indexing past the end, ``one_hot`` of a class past ``num_classes`` and ``bincount``
    of a negative value, each caught by the program on the calls whose values make it raise."""
    run, seen = compile_it(_looked_up), []
    for idx in ([1, 2], [1, 5], [0, 3], [3, 3]):
        table = torch.randn(4, 2, generator=torch.Generator().manual_seed(sum(idx))).requires_grad_()
        rows, inside, hot, counts = run(table, torch.tensor(idx), 4)
        rows.sum().backward()
        seen += [rows, inside, hot, counts, table.grad]
    return seen
