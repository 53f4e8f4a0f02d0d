"""The programs of ``test_user_programs_round11.py`` (KV caches and HF-style branches): each takes how
to compile (``thunder_rs.jit``, ``torch.compile(backend="thunder_rs")`` or nothing, for eager), runs
it over several calls while the Python state or the input data change between them, and returns
what the calls gave and left behind (outputs, gradients, errors raised, the caches and counters)."""

import torch
from torch import nn

from user_programs_round8 import _backward_steps, grads
from user_programs_round9 import _raised

# -- (a) KV caches written by hand ----------------------------------------------------------------


def _attend(q, k, v):
    return (q @ k.transpose(-1, -2) / k.shape[-1] ** 0.5).softmax(-1) @ v


class DictCache(nn.Module):
    """A cache dict on the module grown with ``torch.cat``, ``self.pos`` advanced per call, reset
    between prompts."""

    def __init__(self, dim=4):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.cache: dict = {"k": None, "v": None}
        self.pos = 0

    def reset(self):
        self.cache = {"k": None, "v": None}
        self.pos = 0

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        if self.cache["k"] is not None:
            k = torch.cat([self.cache["k"], k], 1)
            v = torch.cat([self.cache["v"], v], 1)
        self.cache["k"], self.cache["v"] = k.detach(), v.detach()
        self.pos += x.shape[1]
        return _attend(q, k, v), self.pos


def _decode(model, run, prompts, steps: int) -> list:
    seen = []
    for prompt in prompts:
        model.reset()
        x = prompt
        for _ in range(steps):
            out = run(x)
            y = out[0] if isinstance(out, tuple) else out
            y.square().sum().backward()
            seen += [out, grads(model)]
            model.zero_grad()
            x = y[:, -1:].detach()
        seen += [getattr(model, "pos", None)]
    return seen


def dict_cache_cat(compile_it) -> list:
    torch.manual_seed(0)
    model = DictCache()
    prompts = [torch.randn(1, 3, 4), torch.randn(2, 2, 4)]  # (the batch changes between prompts)
    seen = _decode(model, compile_it(model), prompts, 3)
    return seen + [model.cache["k"], model.cache["v"]]


class IndexCopyCache(nn.Module):
    """A preallocated cache (a plain tensor attribute) written with ``index_copy_`` at
    ``self.pos``; attention over the filled part."""

    def __init__(self, dim=4, length=8):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.dim, self.length = dim, length
        self.reset()

    def reset(self, batch=1):
        self.k = torch.zeros(batch, self.length, self.dim)
        self.v = torch.zeros(batch, self.length, self.dim)
        self.pos = 0

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        where = torch.arange(self.pos, self.pos + x.shape[1])
        with torch.no_grad():
            self.k.index_copy_(1, where, k)
            self.v.index_copy_(1, where, v)
        self.pos += x.shape[1]
        return _attend(q, self.k[:, : self.pos], self.v[:, : self.pos])


def index_copy_cache(compile_it) -> list:
    torch.manual_seed(0)
    model = IndexCopyCache()
    seen = _decode(model, compile_it(model), [torch.randn(1, 3, 4), torch.randn(1, 1, 4)], 3)
    return seen + [model.k, model.v]


class RollingCache(nn.Module):
    """A sliding window as ``torch.roll`` and a write into the last slot."""

    def __init__(self, dim=4, window=3):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.dim, self.window = dim, window
        self.reset()

    def reset(self):
        self.k = torch.zeros(1, self.window, self.dim)
        self.v = torch.zeros(1, self.window, self.dim)
        self.filled = 0

    def forward(self, x):  # one token
        q, k, v = self.qkv(x).chunk(3, -1)
        self.k = torch.roll(self.k, -1, dims=1)
        self.v = torch.roll(self.v, -1, dims=1)
        self.k[:, -1:] = k.detach()
        self.v[:, -1:] = v.detach()
        self.filled = min(self.filled + 1, self.window)
        return _attend(q, self.k[:, -self.filled :], self.v[:, -self.filled :])


def rolling_window_cache(compile_it) -> list:
    torch.manual_seed(0)
    model = RollingCache()
    seen = _decode(model, compile_it(model), [torch.randn(1, 1, 4), torch.randn(1, 1, 4)], 5)
    return seen + [model.k, model.v, model.filled]


class SlicedWindowCache(nn.Module):
    """A sliding window kept by slicing what ``torch.cat`` grew: ``cat(...)[:, -window:]``; lazily
    created on the first call (``if self.k is None``), the gradient flowing into the new keys."""

    def __init__(self, dim=4, window=4):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.window = window
        self.reset()

    def reset(self):
        self.k = self.v = None

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        if self.k is None:
            self.k, self.v = k.new_zeros(k.shape[0], 0, k.shape[2]), v.new_zeros(v.shape[0], 0, v.shape[2])
        keys = torch.cat([self.k, k], 1)
        values = torch.cat([self.v, v], 1)
        self.k, self.v = keys[:, -self.window :].detach(), values[:, -self.window :].detach()
        return _attend(q, keys, values)


def sliced_window_lazy_cache(compile_it) -> list:
    torch.manual_seed(0)
    model = SlicedWindowCache()
    prompts = [torch.randn(1, 3, 4), torch.randn(3, 2, 4)]
    seen = _decode(model, compile_it(model), prompts, 4)
    return seen + [model.k, model.v]


class HalfCache(nn.Module):
    """A cache kept in another dtype than the model (``self.cache_dtype``, changed between prompts),
    read back as float32."""

    def __init__(self, dim=4):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.cache_dtype = torch.bfloat16
        self.reset()

    def reset(self):
        self.k = self.v = None

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        k, v = k.to(self.cache_dtype), v.to(self.cache_dtype)
        if self.k is not None:
            k, v = torch.cat([self.k, k], 1), torch.cat([self.v, v], 1)
        self.k, self.v = k.detach(), v.detach()
        return _attend(q, k.float(), v.float())


def cache_of_another_dtype(compile_it) -> list:
    torch.manual_seed(0)
    model = HalfCache()
    run = compile_it(model)
    seen = _decode(model, run, [torch.randn(1, 2, 4)], 3)
    model.cache_dtype = torch.float16
    seen += _decode(model, run, [torch.randn(1, 2, 4)], 3)
    return seen + [model.k, model.v]


class LayeredCache(nn.Module):
    """A list of per-layer ``(k, v)`` tuples on the module, replaced per call; a position id from
    ``self.pos`` for a learned position embedding."""

    def __init__(self, dim=4, layers=2):
        super().__init__()
        self.pos_emb = nn.Embedding(16, dim)
        self.layers = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.reset()

    def reset(self):
        self.past: list = []
        self.pos = 0

    def forward(self, x):
        positions = torch.arange(self.pos, self.pos + x.shape[1])
        h = x + self.pos_emb(positions)
        new_past = []
        for i, layer in enumerate(self.layers):
            q, k, v = layer(h).chunk(3, -1)
            if self.past:
                k = torch.cat([self.past[i][0], k], 1)
                v = torch.cat([self.past[i][1], v], 1)
            new_past.append((k.detach(), v.detach()))
            h = h + _attend(q, k, v)
        self.past = new_past
        self.pos += x.shape[1]
        return h


def per_layer_cache_list(compile_it) -> list:
    torch.manual_seed(0)
    model = LayeredCache()
    seen = _decode(model, compile_it(model), [torch.randn(1, 3, 4), torch.randn(2, 1, 4)], 3)
    return seen + [t for kv in model.past for t in kv]


class ResetsItself(nn.Module):
    """The cache reset inside the forward when ``start_pos == 0`` (a new prompt), as llama's
    reference code keys it: the argument decides, the buffer is written with ``[:, a:b] =``."""

    def __init__(self, dim=4, length=8):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.register_buffer("k_cache", torch.zeros(1, length, dim), persistent=False)
        self.register_buffer("v_cache", torch.zeros(1, length, dim), persistent=False)
        self.resets = 0

    def forward(self, x, start_pos: int):
        if start_pos == 0:
            self.k_cache.zero_()
            self.v_cache.zero_()
            self.resets += 1
        q, k, v = self.qkv(x).chunk(3, -1)
        end = start_pos + x.shape[1]
        self.k_cache[:, start_pos:end] = k.detach()
        self.v_cache[:, start_pos:end] = v.detach()
        return _attend(q, self.k_cache[:, :end], self.v_cache[:, :end])


def cache_reset_inside(compile_it) -> list:
    torch.manual_seed(0)
    model = ResetsItself()
    calls = [(torch.randn(1, 3, 4), 0), (torch.randn(1, 1, 4), 3), (torch.randn(1, 1, 4), 4), (torch.randn(1, 2, 4), 0)]
    calls += [(torch.randn(1, 1, 4), 2)]
    seen = _backward_steps(model, compile_it(model), calls)
    return seen + [model.k_cache, model.v_cache, model.resets]


def _greedy_generate(model, prompt, max_new: int, eos: int):
    """A whole generation loop as one function: a Python list of tokens, ``.item()`` and a break at
    the end token."""
    tokens = prompt.tolist()
    for _ in range(max_new):
        logits = model(torch.tensor([tokens]))
        token = int(logits[0, -1].argmax().item())
        tokens.append(token)
        if token == eos:
            break
    return tokens


class TinyLM(nn.Module):
    def __init__(self, vocab=6, dim=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, ids):
        h = self.emb(ids).cumsum(1)
        return self.out(torch.tanh(h))


class SpeculativeCache(nn.Module):
    """A cache grown by a draft of tokens, then cut back to the accepted ones (a count from
    ``.item()``): ``self.k = self.k[:, : self.pos]``."""

    def __init__(self, dim=4):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.reset()

    def reset(self):
        self.k = self.v = None
        self.pos = 0

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        if self.k is not None:
            k, v = torch.cat([self.k, k], 1), torch.cat([self.v, v], 1)
        out = _attend(q, k, v)
        accepted = int((out[0, :, 0] > 0).sum().item())  # the draft's tokens kept
        self.pos += accepted
        self.k, self.v = k[:, : self.pos].detach(), v[:, : self.pos].detach()
        return out, accepted


def speculative_rewind(compile_it) -> list:
    torch.manual_seed(0)
    model = SpeculativeCache()
    seen = _decode(model, compile_it(model), [torch.randn(1, 3, 4), torch.randn(1, 2, 4)], 4)
    return seen + [model.k, model.v]


class BeamCache(nn.Module):
    """Beam search as written by hand: the cache reordered by the beams kept each step
    (``index_select`` by indices from ``topk``), the beams' scores in a Python list."""

    def __init__(self, dim=4, vocab=5):
        super().__init__()
        self.emb, self.qkv, self.out = nn.Embedding(vocab, dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, vocab)
        self.reset()

    def reset(self):
        self.k = self.v = None
        self.scores: list = []

    def forward(self, tokens):
        q, k, v = self.qkv(self.emb(tokens)).chunk(3, -1)
        if self.k is not None:
            k, v = torch.cat([self.k, k], 1), torch.cat([self.v, v], 1)
        logp = self.out(_attend(q, k, v)[:, -1]).log_softmax(-1)
        total = logp + torch.tensor(self.scores or [0.0] * logp.shape[0])[:, None]
        best, flat = total.flatten().topk(logp.shape[0])
        beams = flat // logp.shape[1]
        self.k, self.v = k.index_select(0, beams).detach(), v.index_select(0, beams).detach()
        self.scores = best.tolist()
        return (flat % logp.shape[1])[:, None], beams


def beam_reordered_cache(compile_it) -> list:
    torch.manual_seed(0)
    model = BeamCache()
    run, seen = compile_it(model), []
    for prompt in ([[1, 2], [1, 2]], [[3], [4], [0]]):
        model.reset()
        tokens = torch.tensor(prompt)
        for _ in range(3):
            tokens, beams = run(tokens)
            seen += [tokens, beams, list(model.scores)]
    return seen + [model.k, model.v]


def whole_generation_loop(compile_it) -> list:
    torch.manual_seed(0)
    model = TinyLM()
    run = compile_it(_greedy_generate)
    return [run(model, torch.tensor(p), n, eos) for p, n, eos in (([1, 2], 4, 0), ([3], 5, 5), ([1, 2], 4, 3))]


# -- (b) data-dependent branches in HF-style model code -------------------------------------------


class MaskedIfPadded(nn.Module):
    """``if attention_mask is not None and (attention_mask == 0).any()``: the mask applied only when
    something is padded; ``if past_key_values is None`` starts a cache returned to the caller."""

    def __init__(self, dim=4):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, attention_mask=None, past_key_values=None):
        q, k, v = self.qkv(x).chunk(3, -1)
        if past_key_values is None:
            past_key_values = (k, v)
        else:
            past_key_values = (torch.cat([past_key_values[0], k], 1), torch.cat([past_key_values[1], v], 1))
        k, v = past_key_values
        scores = q @ k.transpose(-1, -2)
        if attention_mask is not None and (attention_mask == 0).any():
            scores = scores.masked_fill(attention_mask[:, None, :] == 0, torch.finfo(scores.dtype).min)
        return scores.softmax(-1) @ v, past_key_values


def padding_mask_and_past(compile_it) -> list:
    torch.manual_seed(0)
    model = MaskedIfPadded()
    run, seen = compile_it(model), []
    for mask in ([[1, 1, 1]], [[0, 1, 1]], None, [[1, 1, 1]]):
        mask = None if mask is None else torch.tensor(mask)
        x = torch.randn(1, 3, 4)
        out, past = run(x, mask)
        step_mask = None if mask is None else torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype)], 1)
        out2, past2 = run(torch.randn(1, 1, 4), step_mask, tuple(t.detach() for t in past))
        (out.square().sum() + out2.square().sum()).backward()
        seen += [out, out2, past2, grads(model)]
        model.zero_grad()
    return seen


class TrainingBranch(nn.Module):
    """``if self.training`` adds a deterministic regularizing term and counts training calls."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.train_calls = 0

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            self.train_calls += 1
            y = y + 0.1 * y.detach().mean() * torch.ones_like(y)
        return y


def training_flag_between_calls(compile_it) -> list:
    torch.manual_seed(0)
    model = TrainingBranch()
    run, seen = compile_it(model), []
    for training in (True, False, True, False, False):
        model.train(training)
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return [*seen, model.train_calls]


def _upcast_half(x, w):
    if x.dtype == torch.float16:
        x = x.float()
    y = x @ w
    if y.isinf().any():
        y = y.clamp(-1e4, 1e4)
    return y


def dtype_branch_and_inf_clamp(compile_it) -> list:
    run, seen = compile_it(_upcast_half), []
    w = torch.ones(3, 3, requires_grad=True)
    for x in (torch.ones(2, 3, dtype=torch.float16), torch.ones(2, 3), torch.full((2, 3), 1e38), torch.ones(2, 3)):
        out = run(x, w)
        out.sum().backward()
        seen += [out, w.grad.clone()]
        w.grad = None
    return seen


class T5LikeClamp(nn.Module):
    """HF T5's float16 guard: ``if hidden.dtype == torch.float16 and torch.isinf(hidden).any()``
    clamp to ``finfo.max - 1000``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3).half()

    def forward(self, hidden):
        hidden = self.lin(hidden) * hidden
        if hidden.dtype == torch.float16 and torch.isinf(hidden).any():
            clamp_value = torch.finfo(hidden.dtype).max - 1000
            hidden = torch.clamp(hidden, min=-clamp_value, max=clamp_value)
        return hidden


def t5_like_half_clamp(compile_it) -> list:
    torch.manual_seed(0)
    model = T5LikeClamp()
    with torch.no_grad():
        model.lin.weight.fill_(1.0)
        model.lin.bias.zero_()
    xs = [torch.ones(1, 3, dtype=torch.float16), torch.full((1, 3), 300.0, dtype=torch.float16)]
    xs += [torch.full((1, 3), 2.0, dtype=torch.float16)]
    run, seen = compile_it(model), []
    for x in xs:
        out = run(x)
        out.float().sum().backward()
        seen += [out, grads(model)]
        model.zero_grad()
    return seen


class HaltingLayers(nn.Module):
    """Adaptive computation: layers applied until the accumulated halting probability passes a
    threshold read with ``.item()``; the number of layers used kept per call."""

    def __init__(self, dim=4, layers=4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.halt = nn.Linear(dim, 1)
        self.used: list = []

    def forward(self, x, threshold: float):
        total = x.new_zeros(())
        out = torch.zeros_like(x)
        for depth, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            p = torch.sigmoid(self.halt(x)).mean()
            out = out + p * x
            total = total + p
            if total.item() > threshold:
                break
        self.used.append(depth + 1)
        return out / total


def adaptive_halting(compile_it) -> list:
    torch.manual_seed(0)
    model = HaltingLayers()
    x = torch.randn(2, 4)
    batches = [(x, t) for t in (0.5, 1.5, 0.1, 3.0, 1.5)]
    return _backward_steps(model, compile_it(model), batches) + [model.used]


# -- (c) grad modes nested inside the program -----------------------------------------------------


def _nested_modes(x, w):
    with torch.no_grad():
        scale = (x @ w).abs().mean()
        with torch.enable_grad():
            inner = (x @ w).tanh()
    with torch.inference_mode():
        stat = x.std()
    return inner * scale + stat, inner.requires_grad, scale.requires_grad


def nested_grad_modes(compile_it) -> list:
    torch.manual_seed(0)
    run, seen = compile_it(_nested_modes), []
    w = torch.randn(3, 3, requires_grad=True)
    for s in (1.0, 2.0, -1.0):
        out, inner_rg, scale_rg = run(torch.randn(2, 3) * s, w)
        out.sum().backward()
        seen += [out, inner_rg, scale_rg, w.grad.clone()]
        w.grad = None
    return seen


class GradModeByAttribute(nn.Module):
    """``torch.set_grad_enabled(self.track)``: the flag is the module's, changed between calls."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.track = True

    def forward(self, x):
        with torch.set_grad_enabled(self.track):
            y = self.lin(x).relu()
        return y * 2, y.requires_grad


def set_grad_enabled_from_state(compile_it) -> list:
    torch.manual_seed(0)
    model = GradModeByAttribute()
    run, seen = compile_it(model), []
    for track in (True, False, True, False):
        model.track = track
        out, requires = run(torch.randn(2, 3))
        if out.requires_grad:
            out.sum().backward()
        seen += [out, requires, grads(model)]
        model.zero_grad()
    return seen


def _no_grad_then_error(x, w, write: bool):
    with torch.no_grad():
        y = x @ w
        w.mul_(1.0)  # allowed under no_grad
    if write:
        w.add_(0.0)  # a leaf requiring grad written in place under grad mode: eager's RuntimeError
    return y


def error_after_no_grad_writes(compile_it) -> list:
    run, w = compile_it(_no_grad_then_error), torch.ones(2, 2, requires_grad=True)
    return [_raised(run, torch.ones(1, 2), w, c) for c in (False, True, False)] + [w, w._version]


def _cache_in_inference_mode(model, x):
    with torch.inference_mode():
        h = model(x)
    return h.clone() * 2


def inference_mode_around_a_module(compile_it) -> list:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.GELU())
    run = compile_it(_cache_in_inference_mode)
    seen = []
    for _ in range(2):
        out = run(model, torch.randn(2, 3))
        seen += [out, out.requires_grad, out.is_inference()]
    return seen


def _f16_branch_attention(q, k, mask):
    """An attention whose mask dtype and fill follow the inputs' dtype (``finfo(q.dtype).min``)."""
    scores = q @ k.transpose(-1, -2)
    if mask is not None:
        scores = scores + (1.0 - mask[:, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
    return scores.softmax(-1)


def dtype_dependent_mask_fill(compile_it) -> list:
    run, seen = compile_it(_f16_branch_attention), []
    mask = torch.tensor([[1, 1, 0]])
    for dtype, m in ((torch.float32, mask), (torch.bfloat16, mask), (torch.float32, None), (torch.float64, mask)):
        q = torch.linspace(-1, 1, 12, dtype=dtype).view(1, 3, 4)
        seen.append(run(q, q.flip(-1), m))
    return seen
