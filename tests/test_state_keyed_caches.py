"""Python state that caches tensors by a size, under shapes that change between calls: a dict
keyed by a symbolic size (``core.state.keyed``) is filled by one compile and read where it is on
each call; a function cached by ``functools`` that misses while traced is refused naming the line
(its cache would keep the trace's stand-in), and one whose cache is cleared or evicts between calls
is called again as eager calls it; a rotary embedding that grows its tables as older
HF Llama, GPT-NeoX and Falcon do matches eager; a tensor attribute the forward sets on each call
(transformers' dynamic RoPE) is read per call, and a module int counting the tokens seen is a size
input. Each is compared with eager PyTorch: outputs, the caches' contents and identity, the
module's buffers and attributes, and the compile counts."""

import copy
import functools

import pytest
import torch
from torch import nn

import thunder_rs
from test_state_caches import _assert_same_cache, _line_of, _misses
from thunder_rs.errors import ThunderNotImplementedError


# -- caches keyed by a symbolic size (``core.state.keyed``) -----------------------------------------


def _by_size(use: str = "keyed"):
    """A cache of masks by sequence length in a closure dict, and the program using it; ``use``:
    only by the size (``keyed``) or also in a way no check on the key covers."""
    masks: dict = {}

    def keyed(x):
        n = x.shape[-1]
        if n not in masks:
            masks[n] = torch.ones(n, n, dtype=x.dtype).triu()
        return x @ masks[n]

    def by_length(x):
        n = x.shape[-1]
        if len(masks) >= 3:
            masks.clear()
        if n not in masks:
            masks[n] = torch.ones(n, n, dtype=x.dtype).triu()
        return x @ masks[n]

    def mask(n, dtype):
        if n not in masks:
            masks[n] = torch.ones(n, n, dtype=dtype).triu()
        return masks[n]

    def helper(x):
        return x @ mask(x.shape[-1], x.dtype) + mask(9, x.dtype).sum()  # also by a plain int

    def looped(x):
        for n in (9, x.shape[-1]):  # a plain int, then the size, in one variable
            if n not in masks:
                masks[n] = torch.ones(n, n, dtype=x.dtype).triu()
        return x @ masks[n]

    def by_size(x):
        n = x.shape[-1]
        if n not in masks:
            masks[n] = torch.ones(n, n, dtype=x.dtype).triu()
        return x @ masks[n]

    def by_int(x):
        if 9 not in masks:
            masks[9] = torch.ones(9, 9, dtype=x.dtype).triu()
        return masks[9].sum()

    def two_functions(x):
        return by_size(x) + by_int(x)  # one closure cell, read by two functions: each one's use is seen

    programs = {"keyed": keyed, "len": by_length, "helper": helper, "loop": looped, "two": two_functions}
    return programs[use], masks


def _run_like_eager(use: str, sizes, dynamic=None) -> tuple:
    (program, masks), (eager, expected) = _by_size(use), _by_size(use)
    jprogram, stored = thunder_rs.jit(program, dynamic=dynamic), {}
    for n in sizes:
        x = torch.randn(2, n)
        torch.testing.assert_close(jprogram(x), eager(x), rtol=0, atol=0)
        _assert_same_cache(masks, expected)
        for k, t in masks.items():  # stored once, read by later calls, as eager's
            assert stored.setdefault(k, t) is t or use == "len"
    return jprogram, masks


def test_a_cache_keyed_by_a_symbolic_size_is_filled_by_one_compile():
    # New sizes: one compile stores each (it checks that its size is not a key); a size found
    # in the cache compiles once for that size, and growing the cache does not undo that.
    jprogram, masks = _run_like_eager("keyed", (3, 4, 5, 6, 3, 7, 3, 4, 8, 4, 5))
    assert sorted(masks) == [3, 4, 5, 6, 7, 8]
    stats = thunder_rs.compile_stats(jprogram)
    assert stats.cache_misses == 5  # 3 as the first call; 4 on; then 3, 4 and 5 found
    assert stats.miss_reasons[-1].startswith("t0 not in closure variable 'masks'")


@pytest.mark.parametrize("use", ["len", "helper", "loop", "two"])
def test_a_cache_used_otherwise_than_by_its_symbolic_key_is_guarded_whole(use):
    # Cleared by its length; read by a plain int too, in another function or in a loop (stored by
    # the first call, then found).
    _run_like_eager(use, (3, 4, 5, 6, 4, 7, 5), dynamic=True)


@functools.lru_cache
def _causal(n):
    return torch.ones(n, n).tril()


@functools.cache
def _causal_unbounded(n):
    return torch.ones(n, n).tril()


@functools.cache
def _scale():
    return 2.0


def _uses_causal(x):
    return x @ _causal(x.shape[-1])  # the cached call


def _uses_unbounded(x):
    return x @ _causal_unbounded(x.shape[-1]) * _scale()  # the cached call


@functools.lru_cache
def _count_of(shape):
    return shape.numel()


def _uses_count(x):
    return x * _count_of(x.shape)


def test_a_function_cached_by_functools_called_with_a_symbolic_shape_keeps_no_stand_in():
    # A shape with a symbolic size went into the cache's key as the trace's (torch.Size([t0, 3])):
    # the later calls, eager ones too, failed comparing it. It is a stand-in as a size is: the
    # symbolic compile is refused, and each size compiles with its shape an int key.
    _count_of.cache_clear()
    jprogram = thunder_rs.jit(_uses_count)
    for n in (2, 3, 4, 3):
        x = torch.randn(n, 3)
        torch.testing.assert_close(jprogram(x), _uses_count(x), rtol=0, atol=0)
    assert _count_of(torch.Size([7, 3])) == 21 and _count_of(torch.Size([3, 3])) == 9


@pytest.mark.parametrize(
    "program, cached",
    [(_uses_causal, _causal), pytest.param(_uses_unbounded, _causal_unbounded, marks=pytest.mark.slow)],
    ids=["lru_cache", "cache"],
)
def test_a_function_cached_by_functools_that_misses_while_traced_runs_as_in_eager(program, cached):
    # Refused on the first call (its cache cleared): the miss ran in the trace and its cache would
    # have kept the trace's stand-in. It runs eagerly now, and the cache keeps the tensor eager does,
    # returned again to the later calls of that size (a new size compiles again: a symbolic one too).
    cached.cache_clear(), _scale.cache_clear()
    jprogram, seen = thunder_rs.jit(program), {}
    for n in (3, 4, 3, 5):
        x = torch.randn(2, n)
        torch.testing.assert_close(jprogram(x), program(x), rtol=0, atol=0)
        assert seen.setdefault(n, cached(n)) is cached(n)  # (one tensor, computed once)
        assert torch.equal(cached(n), torch.ones(n, n).tril())
    assert cached.cache_info().currsize == 3
    assert _scale.cache_info().currsize == (program is _uses_unbounded)  # a float, kept as eager keeps it
    cached.cache_clear()


_CONFIG = {"scale": 2.0, "length": 3}


@functools.lru_cache
def _config_scale(k):
    return _CONFIG["scale"] * k


@functools.lru_cache(maxsize=1)
def _table(n):
    return torch.arange(n, dtype=torch.float32) * _CONFIG["scale"]


def _scaled(x):
    return x * _config_scale(3) + _table(3)


@pytest.mark.parametrize("between", ["cache_clear", "eviction"])
def test_a_cached_helper_recomputed_after_its_config_changed_is_called_again_as_in_eager(between):
    # The trace held what the cached call returned as a constant: once the cache was cleared or the
    # entry evicted, eager computed the new configuration's value and every compiled call kept the
    # first one (x * 6 + [0, 2, 4] after the scale became 5).
    _config_scale.cache_clear(), _table.cache_clear()
    _CONFIG["scale"] = 2.0
    _table(3)  # (a tensor made while traced would be refused: filled first)
    jprogram = thunder_rs.jit(_scaled)
    for scale, recompute in ((2.0, False), (5.0, False), (5.0, True), (5.0, False), (7.0, True)):
        _CONFIG["scale"] = scale
        if recompute and between == "cache_clear":
            _config_scale.cache_clear(), _table.cache_clear()
        elif recompute:
            _table(4), _config_scale.cache_clear()  # (maxsize 1: evicts the table of 3)
        x = torch.ones(3)
        out = jprogram(x)  # first: its call of the helpers computes what eager's then finds
        torch.testing.assert_close(out, _scaled(x), rtol=0, atol=0)
    reasons = [r for r in thunder_rs.compile_stats(jprogram).miss_reasons if "cached by functools" in r]
    assert reasons and all(r.endswith("when traced changed from none to _config_scale(3), _table(3)") for r in reasons)
    _CONFIG["scale"] = 2.0


class _Helpers:
    """An object holding a cached helper as an attribute (``helpers.scale(3)``)."""

    scale = None


_HELPERS = _Helpers()
_HELPERS.scale = _config_scale


def test_a_cached_helper_held_by_an_objects_attribute_is_called_again_as_in_eager():
    _config_scale.cache_clear()
    jprogram = thunder_rs.jit(lambda x: x * _HELPERS.scale(3))
    for scale, clear in ((2.0, False), (5.0, False), (5.0, True), (7.0, True)):
        _CONFIG["scale"] = scale
        if clear:
            _config_scale.cache_clear()
        x = torch.ones(2)
        torch.testing.assert_close(jprogram(x), x * _HELPERS.scale(3), rtol=0, atol=0)
    assert _HELPERS.scale is _config_scale and "scale" in vars(_HELPERS)
    _CONFIG["scale"] = 2.0


def _config_shift(k):
    return _CONFIG["scale"] * k + 1


class _HoldsACachedHelper(nn.Module):
    """A module holding a cached helper as its own attribute (``self.f``, set in ``__init__``)."""

    def __init__(self):
        super().__init__()
        self.f = functools.lru_cache(maxsize=None)(_config_shift)

    def forward(self, x):
        return x * self.f(3)


class _CachedStatics(nn.Module):
    """A module whose class holds cached functions as a staticmethod and a classmethod."""

    @staticmethod
    @functools.lru_cache
    def scale(k):
        return _CONFIG["scale"] * k

    @classmethod
    @functools.cache
    def shift(cls, k):
        return _CONFIG["scale"] * k + 1

    def forward(self, x):
        return x * self.scale(3) + self.shift(2) + _CachedStatics.scale(1)


def _clear_statics():
    _CachedStatics.scale.cache_clear(), _CachedStatics.shift.cache_clear()


@pytest.mark.parametrize("held", ["attribute", "submodule", "statics"])
def test_a_cached_helper_the_module_holds_is_called_again_as_in_eager(held):
    # Held by the jitted module (or a submodule) as an attribute, read from its clone while traced,
    # no reader stood in for it: after a cache_clear() every compiled call kept the first result
    # (x * 7 where eager gave x * 16). A cached staticmethod was refused as keyed by self.
    if held == "statics":
        model, clear = _CachedStatics(), _clear_statics
    else:
        inner = _HoldsACachedHelper()
        model, clear = (inner if held == "attribute" else nn.Sequential(inner)), inner.f.cache_clear
    clear()
    jmodel = thunder_rs.jit(model)
    for scale, cleared in ((2.0, False), (5.0, False), (5.0, True), (7.0, True), (7.0, False)):
        _CONFIG["scale"] = scale
        if cleared:
            clear()
        x = torch.ones(2)
        torch.testing.assert_close(jmodel(x), model(x), rtol=0, atol=0)
    if held == "statics":  # (the class's own, put back)
        assert type(vars(_CachedStatics)["scale"].__func__) is functools._lru_cache_wrapper
    else:
        assert type(vars(inner)["f"]) is functools._lru_cache_wrapper
    # The first; 2 clears (a call that misses runs as in eager, outside the trace: what it reads is
    # no guard of the program's, which does not call it again until its cache is cleared).
    assert thunder_rs.compile_stats(jmodel).cache_misses == 3
    _CONFIG["scale"] = 2.0


class _Scales:
    """A configuration object a cached helper is keyed by (its identity: no __hash__ of its own)."""

    def __init__(self, scale):
        self.scale = scale


@functools.lru_cache
def _scale_of(scales):
    return scales.scale * 2.0


_SCALES = _Scales(1.0)


class _KeyedByItsConfig(nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = _Scales(1.0)

    def forward(self, x):
        return x * _scale_of(self.scales) + _scale_of(_SCALES)


def test_a_cached_helper_keyed_by_an_object_of_lasting_state_is_called_again_as_in_eager():
    # Called with objects it found in its cache (a module's config, a global one): no reader noted
    # such a call, and after a cache_clear() every compiled call kept the first result.
    model, _SCALES.scale = _KeyedByItsConfig(), 1.0
    _scale_of(model.scales), _scale_of(_SCALES)
    jmodel = thunder_rs.jit(model)
    for scale, cleared in ((1.0, False), (3.0, False), (3.0, True), (4.0, True)):
        model.scales.scale = _SCALES.scale = scale
        if cleared:
            _scale_of.cache_clear()
        x = torch.ones(2)
        torch.testing.assert_close(jmodel(x), model(x), rtol=0, atol=0)
    _scale_of.cache_clear()


def _scaled_by(x, scales):
    return x * _scale_of(scales)  # the cached call of an argument


def test_a_cached_helper_that_finds_an_argument_object_in_its_cache_is_refused_naming_the_line():
    # Another object passed on a later call is looked up again by eager: the trace held what the
    # first one returned (x * 2 where eager gave x * 6).
    first, line = _Scales(1.0), _line_of("# the cached call of an argument", __file__)
    _scale_of(first)
    with pytest.raises(ThunderNotImplementedError, match=rf"_scale_of, cached by functools, is called at .*:{line} "):
        thunder_rs.jit(_scaled_by)(torch.ones(2), first)
    assert _scale_of(first) == 2.0 and _scale_of.cache_info().currsize == 1
    _scale_of.cache_clear()


_BY_NAME = {"scale": _config_scale}
_PARTIAL = functools.partial(_config_scale, 3)


def _through_an_item(x):
    return x * _BY_NAME["scale"](3)  # the cached helper read from a dict


@pytest.mark.parametrize("program", [_through_an_item, lambda x: x * _PARTIAL()], ids=["item", "partial"])
def test_a_cached_helper_called_through_a_path_no_reader_stands_in_is_refused(program):
    # Read from a dict or called by a partial, it found its arguments in its cache: the trace held
    # the result, and after a cache_clear() every compiled call kept it (6 where eager gave 15).
    _config_scale.cache_clear(), _config_scale(3)
    where = "_BY_NAME\\['scale'\\], read at" if program is _through_an_item else "held by the partial"
    with pytest.raises(
        ThunderNotImplementedError, match=rf"_config_scale, cached by functools \({where} .*\), is called"
    ):
        thunder_rs.jit(program)(torch.ones(2))
    assert _config_scale.cache_info().currsize == 1
    _config_scale.cache_clear()
    jprogram = thunder_rs.jit(program)  # a miss runs its code in the trace, read as eager reads it
    for scale in (2.0, 5.0):
        _CONFIG["scale"] = scale
        _config_scale.cache_clear()
        torch.testing.assert_close(jprogram(torch.ones(2)), program(torch.ones(2)), rtol=0, atol=0)
    _CONFIG["scale"] = 2.0


# -- a rotary embedding that grows its tables (older HF Llama, GPT-NeoX, Falcon) -----------------


class _GrowingRotary(nn.Module):
    """Tables of cos and sin up to ``max_seq_len_cached``, replaced by longer ones when a longer
    sequence arrives: as buffers (Llama, GPT-NeoX) or as plain attributes (Falcon)."""

    def __init__(self, as_buffers: bool, dim: int = 4):
        super().__init__()
        self.as_buffers = as_buffers
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).double() / dim)), persistent=False)
        self.q = nn.Linear(dim, dim, dtype=torch.float64)
        self._set_cos_sin_cache(4)

    def _set_cos_sin_cache(self, seq_len):
        self.max_seq_len_cached = seq_len
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        if self.as_buffers:
            self.register_buffer("cos_cached", emb.cos(), persistent=False)
            self.register_buffer("sin_cached", emb.sin(), persistent=False)
        else:
            self.cos_cached, self.sin_cached = emb.cos(), emb.sin()

    def forward(self, x):
        seq_len = x.shape[-2]
        if seq_len > self.max_seq_len_cached:
            self._set_cos_sin_cache(seq_len)
        q = self.q(x)
        return q * self.cos_cached[:seq_len] + q.flip(-1) * self.sin_cached[:seq_len]


@pytest.mark.parametrize("as_buffers", [True, False], ids=["buffers", "attributes"])
def test_a_rotary_embedding_growing_its_tables_matches_eager(as_buffers):
    torch.manual_seed(0)
    model = _GrowingRotary(as_buffers)
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    for n in (2, 3, 5, 4, 7, 3, 7):
        x = torch.randn(2, n, 4, dtype=torch.float64)
        out, expected = jmodel(x), eager(x)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        out.sum().backward(), expected.sum().backward()
        torch.testing.assert_close(model.q.weight.grad, eager.q.weight.grad)
        assert type(model.max_seq_len_cached) is int and model.max_seq_len_cached == eager.max_seq_len_cached
        torch.testing.assert_close(model.cos_cached, eager.cos_cached, rtol=0, atol=0)
        torch.testing.assert_close(model.sin_cached, eager.sin_cached, rtol=0, atol=0)
        assert vars(model).keys() == vars(eager).keys() and model._buffers.keys() == eager._buffers.keys()
        assert model.state_dict().keys() == eager.state_dict().keys()
    # Buffers: the length the tables hold is an int attribute of the module, symbolic once it
    # changed, and the buffers' sizes a change of the module's state: a compile per growth (5, 7)
    # and one for the first shorter call after it (4, 3); 2 as the first call, 3 with symbolic
    # sizes. Plain attributes: the first shorter call (4) takes the tables' length symbolic (read
    # per call from the module), so after the growth to 7 the shorter 3 is served (it compiled
    # again while the tables were taken constant).
    assert _misses(jmodel) == (6 if as_buffers else 5), thunder_rs.compile_stats(jmodel).miss_reasons


class _DynamicRope(nn.Module):
    """As transformers' ``dynamic_rope_update``: past the trained length the frequencies are
    recomputed for the longest position seen, kept as a 0-dim tensor attribute
    (``max_seq_len_cached = torch.max(position_ids) + 1``), and reset for a short sequence."""

    def __init__(self, dim: int = 4, trained: int = 4):
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).double() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.original_inv_freq, self.max_seq_len_cached, self.original_max_seq_len = inv_freq, trained, trained
        self.q = nn.Linear(dim, dim, dtype=torch.float64)

    def forward(self, x, position_ids):
        seq_len = torch.max(position_ids) + 1
        if seq_len > self.max_seq_len_cached:  # growth
            self.register_buffer("inv_freq", self.original_inv_freq * (self.original_max_seq_len / seq_len))
            self.max_seq_len_cached = seq_len
        if seq_len < self.original_max_seq_len and self.max_seq_len_cached > self.original_max_seq_len:  # reset
            self.register_buffer("inv_freq", self.original_inv_freq.clone(), persistent=False)
            self.max_seq_len_cached = self.original_max_seq_len
        freqs = position_ids[:, None].double() * self.inv_freq
        q = self.q(x)
        return q * torch.cat((freqs, freqs), -1).cos()


def test_a_tensor_attribute_the_forward_sets_on_each_call_is_read_per_call():
    # Every decode step past the trained length sets ``max_seq_len_cached`` to a new 0-dim tensor:
    # guarded as that tensor, each step compiled again (9 compiles for the 10 lengths, as each
    # token of a Llama generate with dynamic RoPE past its max_position_embeddings). Read where it
    # is on each call, guarded on its metadata: 6, the first call, the symbolic one, a variant
    # for each side of the two branches, and the first call finding a tensor there, not the int.
    torch.manual_seed(0)
    model = _DynamicRope()
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    for n in (2, 3, 4, 5, 6, 7, 8, 3, 9, 10):
        x, positions = torch.randn(n, 4, dtype=torch.float64), torch.arange(n)
        out, expected = jmodel(x, positions), eager(x, positions)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        out.sum().backward(), expected.sum().backward()
        torch.testing.assert_close(model.q.weight.grad, eager.q.weight.grad, rtol=0, atol=0)
        assert type(model.max_seq_len_cached) is type(eager.max_seq_len_cached)
        assert model.max_seq_len_cached == eager.max_seq_len_cached
        torch.testing.assert_close(model.inv_freq, eager.inv_freq, rtol=0, atol=0)
        assert model.inv_freq.dtype == eager.inv_freq.dtype and model._buffers.keys() == eager._buffers.keys()
    assert _misses(jmodel) == 6, thunder_rs.compile_stats(jmodel).miss_reasons


class _CountsTokens(nn.Module):
    """Counts the tokens it has seen in an int attribute and places each call's after them (as a
    ``seen_tokens`` counter of a cache or a streaming layer)."""

    def __init__(self, dim: int = 4):
        super().__init__()
        self.seen_tokens = 0
        self.q = nn.Linear(dim, dim, dtype=torch.float64)

    def forward(self, x):
        positions = torch.arange(self.seen_tokens, self.seen_tokens + x.shape[0], dtype=torch.float64)
        self.seen_tokens += x.shape[0]
        return self.q(x) * positions[:, None].cos()


def test_a_module_int_that_counts_the_tokens_seen_is_a_size_input():
    # Guarded as a constant, the count compiled every call (6 of 6). Once seen to change (to 2 or
    # more, as sizes and int arguments), it is read from the module on each call as a size and set
    # to that call's.
    torch.manual_seed(0)
    model = _CountsTokens()
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    for step in range(6):
        x = torch.randn(3 + step % 4, 4, dtype=torch.float64)
        out, expected = jmodel(x), eager(x)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        out.sum().backward(), expected.sum().backward()
        torch.testing.assert_close(model.q.weight.grad, eager.q.weight.grad, rtol=0, atol=0)
        assert type(model.seen_tokens) is int and model.seen_tokens == eager.seen_tokens
    # The first call (0 seen: constant, as 0 and 1 are), then the second (3 seen: the count
    # symbolic). The user resetting the count: 0 again, served by the first call's entry.
    assert _misses(jmodel) == 2, thunder_rs.compile_stats(jmodel).miss_reasons
    assert (
        "compiled with symbolic sizes x.shape[0], _CountsTokens.seen_tokens"
        in thunder_rs.compile_stats(jmodel).miss_reasons[1]
    )
    model.seen_tokens = eager.seen_tokens = 0
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(jmodel(x), eager(x), rtol=0, atol=0)
    assert model.seen_tokens == eager.seen_tokens == 3 and _misses(jmodel) == 2


class _CountsShapes(torch.nn.Module):
    """Counts the input shapes it has seen in a dict keyed by the shape."""

    def __init__(self):
        super().__init__()
        self.seen: dict = {}

    def forward(self, x):
        self.seen[x.shape] = self.seen.get(x.shape, 0) + 1
        return x * 2


def test_a_dict_keyed_by_a_shape_holds_each_calls_shape():
    # Keyed by the trace's torch.Size([t0, 3]) once the size was symbolic: the next call, eager
    # or compiled, failed comparing keys with it. Each call's own shape is the key now.
    module, eager = _CountsShapes(), _CountsShapes()
    jmodule = thunder_rs.jit(module)
    for n in (2, 3, 4, 3, 5):
        x = torch.randn(n, 3)
        torch.testing.assert_close(jmodule(x), eager(x))
        assert module.seen == eager.seen and all(type(k) is torch.Size for k in module.seen)
