"""KV caches over changing lengths (issue 26): sizes read from tensors that argument objects hold
(a Hugging Face cache, user objects, lists and dicts of tensors) are traced as symbolic once seen
changing, each call reads the cache as it is, and outputs, gradients and the cache equal eager's.
The shapes of arguments themselves are ``test_dynamic_shapes.py``'s.
"""

import copy
import inspect
import math
import re

import pytest
import torch

import thunder_rs

from test_dynamic_shapes import misses, symbolic


# -- a KV cache: sizes read from tensors that argument objects hold ---------------------------------


def test_hf_gpt2_greedy_decode_with_a_growing_cache_compiles_three_times():
    # The cache's tensors (``cache.layers[i].keys``) are not in the key: the second cache length
    # makes their length symbolic, read per call from the cache, and that entry serves every later
    # step (position ids from ``cache.get_seq_length()`` included).
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers.DynamicCache(), "layers"):
        pytest.skip("transformers 5's cache layers (Cache.layers)")
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=100)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    jm = thunder_rs.jit(model)
    ids = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(0))
    runs = {}
    for name, call in (("eager", model), ("jit", jm)):
        steps, tokens = [], []
        with torch.no_grad():
            out = call(input_ids=ids, use_cache=True)
            for _ in range(24):
                steps.append(out.logits)
                tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
                cache = out[keyword] if keyword in out else out["past_key_values"]
                out = call(input_ids=tokens[-1], use_cache=True, **{keyword: cache})
        runs[name] = (torch.cat(tokens, 1), steps, out[keyword] if keyword in out else out["past_key_values"])
    (tokens, steps, cache), (want_tokens, want_steps, want_cache) = runs["jit"], runs["eager"]
    assert torch.equal(tokens, want_tokens)
    for got, want in zip(steps, want_steps, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for layer, want in zip(cache.layers, want_cache.layers, strict=True):
        assert type(layer.keys) is torch.Tensor and layer.keys.shape == want.keys.shape == (1, 4, 30, 16)
        torch.testing.assert_close((layer.keys, layer.values), (want.keys, want.values))
    stats = thunder_rs.compile_stats(jm)
    assert (stats.cache_misses, stats.cache_hits) == (3, 22), stats.miss_reasons
    assert re.match(rf"{keyword}\.layers\[0\]\.keys changed from .*\[1, 4, 7, 16\]", stats.miss_reasons[2])
    (entry,) = symbolic(jm)
    assert "+ 1, 16]" in entry.entry.source  # torch.cat of the cache and one new token: a symbolic length


class Layer:
    def __init__(self, n: int, width: int = 8):
        self.k, self.v = torch.randn(2, n, width), torch.randn(2, n, width)


class Cache:
    def __init__(self, n: int, layers: int = 2):
        self.layers = [Layer(n) for _ in range(layers)]

    def twin(self) -> "Cache":
        """A cache of the same tensors' copies, for eager to grow beside this one."""
        other = Cache(1, 0)
        other.layers = [Layer(1) for _ in self.layers]
        for mine, theirs in zip(other.layers, self.layers):
            mine.k, mine.v = theirs.k.clone(), theirs.v.clone()
        return other


class CachedAttention(torch.nn.Module):
    """Attention over a cache of user objects that every call grows by ``torch.cat`` (and stores
    detached), with the cache's length used as a value and in a branch."""

    def __init__(self, layers: int = 2, width: int = 8):
        super().__init__()
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(width, 3 * width) for _ in range(layers))

    def forward(self, x, cache):
        for lin, layer in zip(self.qkv, cache.layers):
            q, k, v = lin(x).chunk(3, -1)
            keys, values = torch.cat([layer.k, k.to(layer.k.dtype)], 1), torch.cat([layer.v, v.to(layer.v.dtype)], 1)
            layer.k, layer.v = keys.detach(), values.detach()
            n = keys.shape[1]
            scores = (q @ keys.to(q.dtype).transpose(1, 2)) / math.sqrt(q.shape[-1]) + torch.arange(n) / n
            if n > 7:
                scores = scores * 0.5
            x = scores.softmax(-1) @ values.to(q.dtype)
        return x


def same_caches(a: Cache, b: Cache) -> None:
    for x, y in zip(a.layers, b.layers, strict=True):
        assert vars(x).keys() == vars(y).keys() and all(type(t) is torch.Tensor for t in vars(x).values())
        torch.testing.assert_close((x.k, x.v), (y.k, y.v))


def test_a_cache_of_user_objects_grown_by_cat_compiles_few_times_with_eager_gradients():
    torch.manual_seed(0)
    model = CachedAttention()
    jm = thunder_rs.jit(model)
    cache = Cache(3)
    eager_cache = cache.twin()
    for step in range(9):  # cache lengths 3..11: the branch on n > 7 turns at length 8 (n = 8)
        x = torch.randn(2, 1, 8)
        out, want = jm(x, cache), model(x, eager_cache)
        torch.testing.assert_close(out, want)
        same_caches(cache, eager_cache)
        got = torch.autograd.grad(out.sum(), list(model.parameters()))
        expected = torch.autograd.grad(want.sum(), list(model.parameters()))
        torch.testing.assert_close(got, expected)
    # length 3 (static), 4 (symbolic, n <= 7 guarded: serves 5, 6), 7 (n > 7: symbolic again).
    assert misses(jm) == 3, thunder_rs.compile_stats(jm).miss_reasons
    assert "the sizes read from argument objects fail" in thunder_rs.compile_stats(jm).miss_reasons[2]
    assert all(not e.dims for e in symbolic(jm))  # no size of a flat input: all read from the cache


def test_a_cache_tensor_changed_in_more_than_its_sizes_recompiles():
    torch.manual_seed(0)
    model = CachedAttention()
    jm = thunder_rs.jit(model)
    cache = Cache(3)
    eager_cache = cache.twin()
    with torch.no_grad():
        for step in range(6):
            if step == 4:  # a float64 cache from now on (its length symbolic since step 1)
                for layer in (*cache.layers, *eager_cache.layers):
                    layer.k, layer.v = layer.k.double(), layer.v.double()
            x = torch.randn(2, 1, 8)
            torch.testing.assert_close(jm(x, cache), model(x, eager_cache))
            same_caches(cache, eager_cache)
            assert cache.layers[0].k.dtype == (torch.float64 if step >= 4 else torch.float32)
    reasons = thunder_rs.compile_stats(jm).miss_reasons
    # 3, 4 (symbolic), then the float64 cache (its length still symbolic: the next step hits).
    assert len(reasons) == 3 and "float32 tensor of shape [2, s, 8]" in reasons[2], reasons
    assert "to a float64 tensor of shape [2, s, 8]" in reasons[2], reasons


class ListCache:
    def __init__(self, n: int, layers: int = 2):
        self.keys = [torch.randn(2, n, 8) for _ in range(layers)]
        self.values = {f"layer{i}": torch.randn(2, n, 8) for i in range(layers)}


class ListCachedAttention(torch.nn.Module):
    """Attention over a cache that keeps its tensors in a list and a dict, items that every call
    replaces by a longer ``torch.cat``."""

    def __init__(self, layers: int = 2, width: int = 8):
        super().__init__()
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(width, 3 * width) for _ in range(layers))

    def forward(self, x, cache):
        for i, lin in enumerate(self.qkv):
            q, k, v = lin(x).chunk(3, -1)
            cache.keys[i] = torch.cat([cache.keys[i], k], 1)
            cache.values[f"layer{i}"] = torch.cat([cache.values[f"layer{i}"], v], 1)
            n = cache.keys[i].shape[1]
            scores = q @ cache.keys[i].transpose(1, 2) + torch.arange(n) / n
            x = scores.softmax(-1) @ cache.values[f"layer{i}"]
        return x


def test_a_cache_of_tensors_in_a_list_and_a_dict_is_read_per_call_with_a_symbolic_length():
    torch.manual_seed(0)
    model = ListCachedAttention()
    jm = thunder_rs.jit(model)
    cache = ListCache(3)
    eager = copy.deepcopy(cache)
    with torch.no_grad():
        for _ in range(8):
            x = torch.randn(2, 1, 8)
            torch.testing.assert_close(jm(x, cache), model(x, eager))
            assert all(type(t) is torch.Tensor for t in (*cache.keys, *cache.values.values()))
            torch.testing.assert_close((cache.keys, cache.values), (eager.keys, eager.values))
    reasons = thunder_rs.compile_stats(jm).miss_reasons
    assert len(reasons) == 2 and reasons[1].startswith("cache.keys[0] changed from"), reasons
    # Another tensor in the list's place is read as well: the same entry runs.
    cache.keys[1], eager.keys[1] = cache.keys[1] * 2, eager.keys[1] * 2
    x = torch.randn(2, 1, 8)
    with torch.no_grad():
        torch.testing.assert_close(jm(x, cache), model(x, eager))
    assert misses(jm) == 2


class RefusesSymbolicLengths(CachedAttention):
    def forward(self, x, cache):
        first = cache.layers[0]
        first.k = first.k * 1  # set before the refusal below
        if type(first.k.shape[1]) is not int:
            raise NotImplementedError("this program takes plain ints only")
        return super().forward(x, cache)


def test_a_failed_symbolic_compile_leaves_the_cache_as_it_was_and_compiles_per_length():
    torch.manual_seed(0)
    model = RefusesSymbolicLengths()
    jm = thunder_rs.jit(model)
    cache = Cache(3)
    eager = cache.twin()
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 1, 8)
            torch.testing.assert_close(jm(x, cache), model(x, eager))
            same_caches(cache, eager)
    assert misses(jm) == 4
    # (``type()`` of a size is found as the program runs: the compile with it symbolic fails there)
    assert "type() of the symbolic size" in jm._jfn._dynamic_off
