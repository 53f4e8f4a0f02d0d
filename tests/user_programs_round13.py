"""The programs of ``test_user_programs_round13.py`` branching on tensor values in model code and
keeping a key-value cache by hand: ``if mask.any()`` per layer, ``torch.equal`` and ``allclose``
branches, a ``while`` loop to a tolerance counting its steps, a layer picked by ``argmax().item()``,
``tolist`` values as dictionary keys, boolean-mask writes with gradients, ``nonzero`` feeding
``index_add_``, ``torch.unique`` counts routing experts, top-p filtering and a repetition penalty,
``searchsorted`` turned into a Python int, a cache written by slice assignment at a position read
from a tensor, a cache cropped and reordered between calls. Each takes how to compile, runs it over
several calls as the data change, and returns what the calls gave and left."""

import torch
import torch.nn.functional as F
from torch import nn

from user_programs_round8 import _backward_steps
from user_programs_round9 import _raised


class MaskedPerLayer(nn.Module):
    """Each layer applies the padding mask only where one is padded (``if mask.any()``)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x, pad):
        for layer in self.layers:
            x = layer(x)
            if pad.any():
                x = x.masked_fill(pad[..., None], 0.0)
            if (x == 0).all():
                return x + 1
        return x


def mask_any_per_layer(compile_it) -> list:
    torch.manual_seed(0)
    model = MaskedPerLayer()
    run, seen = compile_it(model), []
    for pads in ([0, 0, 0], [0, 1, 0], [1, 1, 1], [0, 0, 0]):
        pad = torch.tensor(pads, dtype=torch.bool)
        seen += _backward_steps(model, run, [(torch.randn(3, 4), pad)])
    return seen


def _same_or_blend(a, b):
    if torch.equal(a, b):
        return a * 2
    if torch.allclose(a, b, atol=0.5):
        return (a + b) / 2
    return a - b


def equal_and_allclose(compile_it) -> list:
    run, x = compile_it(_same_or_blend), torch.arange(3.0)
    return [run(x, x + d) for d in (0.0, 0.1, 1.0, 0.0, 0.3)]


def _fixed_point(x, tol: float):
    y, steps = x, 0
    err = torch.tensor(float("inf"))
    while err > tol:
        nxt = torch.cos(y)
        err = (nxt - y).abs().max()
        y, steps = nxt, steps + 1
    return y, steps


def while_to_tolerance(compile_it) -> list:
    run = compile_it(_fixed_point)
    return [run(torch.full((2,), v), tol) for v, tol in ((0.5, 1e-2), (2.0, 1e-2), (0.5, 1e-4), (0.74, 1e-2))]


class ArgmaxRouted(nn.Module):
    """The batch goes to the expert its mean logit picks (``argmax().item()`` indexing a list)."""

    def __init__(self):
        super().__init__()
        self.router, self.experts = nn.Linear(3, 3), nn.ModuleList(nn.Linear(3, 3) for _ in range(3))

    def forward(self, x):
        choice = self.router(x).mean(0).argmax().item()
        return self.experts[choice](x) * (choice + 1)


def argmax_item_picks_a_layer(compile_it) -> list:
    torch.manual_seed(0)
    model = ArgmaxRouted()
    run = compile_it(model)
    return _backward_steps(model, run, [(torch.randn(2, 3) * 3,) for _ in range(5)])


def _by_label(x, labels):
    scales = {0: 1.0, 1: -1.0, 2: 0.5}
    rows = [x[i] * scales[label] for i, label in enumerate(labels.tolist())]
    return torch.stack(rows)


def tolist_as_keys(compile_it) -> list:
    torch.manual_seed(0)
    run, x = compile_it(_by_label), torch.randn(3, 2)
    return [run(x, torch.tensor(labels)) for labels in ([0, 1, 2], [2, 2, 2], [0, 1, 2], [1, 0, 0])]


def _clamped_in_place(x, w):
    y = x @ w
    y[y > 1.0] = 1.0
    y[y.isnan()] = 0.0
    return y.sum(0)


def boolean_mask_write_with_grad(compile_it) -> list:
    torch.manual_seed(0)
    run, seen = compile_it(_clamped_in_place), []
    for scale in (0.1, 2.0, 0.1):
        w = torch.randn(3, 3, requires_grad=True)
        out = run(torch.randn(4, 3) * scale, w)
        out.sum().backward()
        seen += [out, w.grad]
    return seen


def _scattered_hits(x, hits):
    rows = torch.nonzero(hits.sum(-1) > 0).squeeze(-1)
    out = torch.zeros_like(x).index_add_(0, rows, x[rows] * 2)
    return out, rows.numel()


def nonzero_feeds_index_add(compile_it) -> list:
    torch.manual_seed(0)
    run, seen = compile_it(_scattered_hits), []
    for rows in ([1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0]):
        x = torch.randn(4, 2, requires_grad=True)
        out, count = run(x, torch.tensor(rows)[:, None].repeat(1, 2))
        out.sum().backward()
        seen += [out, count, x.grad]
    return seen


class UniqueExperts(nn.Module):
    """Tokens routed to experts; only experts with tokens (``torch.unique`` counts) run."""

    def __init__(self):
        super().__init__()
        self.gate, self.experts = nn.Linear(4, 3), nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        choice = self.gate(x).argmax(-1)
        experts, counts = torch.unique(choice, return_counts=True)
        out = torch.zeros_like(x)
        for e, c in zip(experts.tolist(), counts.tolist()):
            idx = torch.where(choice == e)[0]
            out = out.index_add(0, idx, self.experts[e](x[idx]) / c)
        return out


def unique_counts_route_experts(compile_it) -> list:
    torch.manual_seed(0)
    model = UniqueExperts()
    run = compile_it(model)
    return _backward_steps(model, run, [(torch.randn(5, 4) * s,) for s in (1.0, 4.0, 0.1, 1.0)])


def _top_p_penalised(logits, generated, top_p: float):
    logits = logits.clone()
    picked = logits.gather(-1, generated)
    logits.scatter_(-1, generated, torch.where(picked > 0, picked / 1.3, picked * 1.3))
    ordered, order = logits.sort(-1, descending=True)
    remove = ordered.softmax(-1).cumsum(-1) > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf")).argmax(-1)


def top_p_and_repetition_penalty(compile_it) -> list:
    torch.manual_seed(0)
    run, seen = compile_it(_top_p_penalised), []
    for top_p in (0.9, 0.5, 0.9):
        seen.append(run(torch.randn(2, 8) * 2, torch.randint(0, 8, (2, 3)), top_p))
    return seen


def _bucketed(x, edges):
    bucket = int(torch.searchsorted(edges, x.mean()).item())
    return x[:, : bucket + 1].sum(-1) * bucket


def searchsorted_to_an_int(compile_it) -> list:
    torch.manual_seed(0)
    run, edges = compile_it(_bucketed), torch.tensor([-0.5, 0.0, 0.5])
    return [run(torch.randn(2, 4) + shift, edges) for shift in (0.0, 2.0, -2.0, 0.0, 0.3)]


class SlicedCache(nn.Module):
    """A cache written by slice assignment at a position read from a tensor (``pos.item()``)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.register_buffer("keys", torch.zeros(1, 6, 4))
        self.register_buffer("values", torch.zeros(1, 6, 4))

    def forward(self, x, pos):
        k, v = self.proj(x).chunk(2, -1)
        start = pos.item()
        self.keys[:, start : start + x.shape[1]] = k.detach()
        self.values[:, start : start + x.shape[1]] = v.detach()
        end = start + x.shape[1]
        att = (k @ self.keys[:, :end].transpose(1, 2)).softmax(-1)
        return att @ self.values[:, :end] + v


def slice_assigned_cache_at_a_tensor_position(compile_it) -> list:
    torch.manual_seed(0)
    model = SlicedCache()
    run, seen, pos = compile_it(model), [], 0
    for n in (3, 1, 1, 1):
        seen += _backward_steps(model, run, [(torch.randn(1, n, 4), torch.tensor(pos))])
        pos += n
    return seen + [model.keys.clone(), model.values.clone()]


class ListCache:
    def __init__(self):
        self.keys: list = []

    def crop(self, n: int):
        self.keys = [k[:, :n] for k in self.keys]

    def reorder(self, beams):
        self.keys = [k.index_select(0, beams) for k in self.keys]


class CachedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x, cache: ListCache):
        for i, layer in enumerate(self.layers):
            k = layer(x)
            if len(cache.keys) <= i:
                cache.keys.append(k)
            else:
                cache.keys[i] = torch.cat([cache.keys[i], k], 1)
            x = x + (k @ cache.keys[i].transpose(1, 2)).softmax(-1) @ cache.keys[i]
        return x


def cache_cropped_and_reordered_between_calls(compile_it) -> list:
    """A speculative decoder crops rejected positions, a beam search reorders rows, between calls."""
    torch.manual_seed(0)
    model, cache = CachedBlock(), ListCache()
    run, seen = compile_it(model), []
    steps = (None, None, lambda: cache.crop(3), None, lambda: cache.reorder(torch.tensor([1, 1])), None)
    with torch.no_grad():
        for n, change in zip((3, 1, 1, 1, 1, 1), steps):
            if change is not None:
                change()
            seen += [run(torch.randn(2, n, 4), cache), [k.clone() for k in cache.keys]]
    return seen


def _finite_checked(x, w):
    y = x @ w
    assert torch.isfinite(y).all(), "non-finite activations"
    return y.relu()


def assert_isfinite_all(compile_it) -> list:
    torch.manual_seed(0)
    run, w = compile_it(_finite_checked), torch.randn(3, 3)
    inputs = (torch.randn(2, 3), torch.full((2, 3), float("inf")), torch.randn(2, 3))
    return [_raised(run, x, w) for x in inputs]


def _softmax_if_peaked(x, thr: float):
    if x.max() > thr:
        return F.softmax(x, -1)
    return x / x.sum(-1, keepdim=True)


def max_above_threshold(compile_it) -> list:
    torch.manual_seed(0)
    run = compile_it(_softmax_if_peaked)
    return [run(torch.rand(2, 3) * s, thr) for s, thr in ((1.0, 0.5), (0.1, 0.5), (1.0, 2.0), (1.0, 0.5))]
