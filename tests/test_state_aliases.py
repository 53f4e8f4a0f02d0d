"""One object at two places of a program's state (a KV cache's list holding one layer at two
indices, ``cache = [t, t]``) on one call and distinct objects on another, against eager: a
compiled entry reads and sets each argument object through one path, so one traced with the
object shared must not run where the objects are distinct, nor the reverse where the program's
writes through one place are visible through the other (``core/state/aliases.py``: ``SameGuard``,
``DistinctGuard``), nor where an argument object is, or is not, one the module or a global holds
(``FixedGuard``). A tensor at two places of each call's cache is read at the first (one compile).
Lists and dicts of module attributes and globals are guarded by the identity of their items, so a
changed sharing recompiles there; a tensor written in place that another argument shares is
refused, naming it."""

import copy

import pytest
import torch
from torch import nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


class _Layer:
    def __init__(self, n: float = 1.0):
        self.keys = torch.full((3,), n)


class _Cache:
    def __init__(self, layers):
        self.layers = layers


def _shared(n: int = 2):
    layer = _Layer()
    return [layer] * n


def _distinct(n: int = 2):
    return [_Layer(10.0**i) for i in range(n)]


def _twin(args):
    """``args`` copied with their sharing: eager's own objects."""
    return copy.deepcopy(args)


def _misses(jf) -> list:
    return thunder_rs.compile_stats(jf).miss_reasons


def _grows_then_reads(cache, x):
    cache.layers[0].keys = cache.layers[0].keys + x
    return cache.layers[1].keys * 2


def _grows_then_reads_dict(layers, x):
    layers["a"].keys = layers["a"].keys + x
    return layers["b"].keys * 2


def _grows_then_reads_two(a, b, x):
    a.keys = a.keys + x
    return b.keys * 2


_PROGRAMS = {
    "cache_list": (_grows_then_reads, lambda layers: (_Cache(layers),)),
    "dict_argument": (_grows_then_reads_dict, lambda layers: (dict(zip("ab", layers)),)),
    "two_arguments": (_grows_then_reads_two, lambda layers: tuple(layers)),
    "list_argument": (lambda layers, x: _grows_then_reads(_Cache(layers), x), lambda layers: (layers,)),
}


def _run(program, wrap, jf, layers):
    x = torch.ones(3)
    args = (*wrap(layers), x)
    expected_args = _twin(args)
    out = jf(*args)
    expected = program(*expected_args)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    got = [layer.keys for layer in _layers_of(args)]
    torch.testing.assert_close(got, [layer.keys for layer in _layers_of(expected_args)], rtol=0, atol=0)


def _layers_of(args) -> list:
    found = []
    for a in args:
        if isinstance(a, _Cache):
            found += a.layers
        elif isinstance(a, dict):
            found += a.values()
        elif isinstance(a, list):
            found += a
        elif isinstance(a, _Layer):
            found.append(a)
    return found


@pytest.mark.parametrize("name", list(_PROGRAMS))
@pytest.mark.parametrize("first", ["shared", "distinct"])
def test_an_argument_object_at_two_places_then_two_objects_matches_eager(name, first):
    program, wrap = _PROGRAMS[name]
    jf = thunder_rs.jit(program)
    order = [_shared, _distinct, _shared] if first == "shared" else [_distinct, _shared, _distinct]
    for make in order:
        _run(program, wrap, jf, make())
    assert len(_misses(jf)) == 2
    reason = _misses(jf)[1]
    assert ("now distinct" in reason) if first == "shared" else ("now one object" in reason)


def _reads_both(cache, x):
    return cache.layers[0].keys + cache.layers[1].keys * 2 + x


def test_an_object_shared_when_traced_is_read_through_each_place_when_no_longer_shared():
    # Nothing written: what the program read through the second index was guarded through the first.
    jf = thunder_rs.jit(_reads_both)
    x = torch.ones(3)
    for layers in (_shared(), _distinct(), _distinct()):
        cache = _Cache(layers)
        torch.testing.assert_close(jf(cache, x), _reads_both(cache, x), rtol=0, atol=0)
    assert len(_misses(jf)) == 2


def test_objects_only_read_may_become_one_object_without_a_compile():
    jf = thunder_rs.jit(_reads_both)
    x = torch.ones(3)
    for layers in (_distinct(), _shared(), _distinct()):
        cache = _Cache(layers)
        torch.testing.assert_close(jf(cache, x), _reads_both(cache, x), rtol=0, atol=0)
    assert _misses(jf) == ["first call"]


class _Pair:
    def __init__(self, first, second):
        self.first, self.second = first, second


def _sets_an_item_then_reads(pair, x):
    pair.first[0] = pair.first[0] + x
    return pair.second[0] * 2


@pytest.mark.parametrize("first", ["shared", "distinct"])
def test_a_list_at_two_attributes_then_two_lists_matches_eager(first):
    def make(shared):
        items = [torch.ones(3)]
        return _Pair(items, items if shared else [torch.full((3,), 5.0)])

    jf = thunder_rs.jit(_sets_an_item_then_reads)
    x = torch.ones(3)
    for shared in (True, False, True) if first == "shared" else (False, True, False):
        pair = make(shared)
        twin = _twin(pair)
        torch.testing.assert_close(jf(pair, x), _sets_an_item_then_reads(twin, x), rtol=0, atol=0)
        torch.testing.assert_close(pair.first, twin.first, rtol=0, atol=0)
        torch.testing.assert_close(pair.second, twin.second, rtol=0, atol=0)
    assert len(_misses(jf)) == 2


def _writes_in_place(cache, x):
    cache[0].add_(x)
    return cache[1] * 2


def _eager_or_refused(jf, program, make) -> None:
    """A tensor written in place that another place shares: eager's result, or a refusal naming it."""
    args = make()
    twin = _twin(args)
    try:
        out = jf(*args)
    except ThunderNotImplementedError as e:
        assert "shares its memory" in str(e)
        return
    torch.testing.assert_close(out, program(*twin), rtol=0, atol=0)
    torch.testing.assert_close(args[0], twin[0], rtol=0, atol=0)


@pytest.mark.parametrize("first", ["shared", "distinct"])
def test_a_tensor_at_two_indices_of_an_argument_list_written_in_place_is_eagers_or_refused(first):
    def make(shared):
        t = torch.ones(3)
        return lambda: ([t, t] if shared else [t, torch.ones(3)], torch.ones(3))

    jf = thunder_rs.jit(_writes_in_place)
    for shared in (True, False, True) if first == "shared" else (False, True, False):
        _eager_or_refused(jf, _writes_in_place, make(shared))


class _TensorCache(nn.Module):
    def __init__(self, shared: bool):
        super().__init__()
        t = torch.ones(3)
        self.cache = [t, t] if shared else [t, torch.ones(3)]

    def forward(self, x):
        self.cache[0].add_(x)
        return self.cache[1] * 2


@pytest.mark.parametrize("first", [True, False], ids=["shared", "distinct"])
def test_a_tensor_at_two_indices_of_a_module_list_written_in_place_is_eagers_or_refused(first):
    model = _TensorCache(first)
    eager = copy.deepcopy(model)
    jm = thunder_rs.jit(model)
    x = torch.ones(3)
    for step in range(4):
        if step == 2:  # the other sharing, in both
            for m in (model, eager):
                m.cache[1] = torch.ones(3) if m.cache[0] is m.cache[1] else m.cache[0]
        try:
            out = jm(x)
        except ThunderNotImplementedError as e:
            assert "shares its memory" in str(e)
            return
        torch.testing.assert_close(out, eager(x), rtol=0, atol=0)
        torch.testing.assert_close(model.cache, eager.cache, rtol=0, atol=0)


class _LayerList(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = layers

    def forward(self, x):
        return _grows_then_reads(self, x)


@pytest.mark.parametrize("first", ["shared", "distinct"])
def test_objects_in_a_module_list_shared_then_not_match_eager(first):
    model = _LayerList(_shared() if first == "shared" else _distinct())
    eager = copy.deepcopy(model)
    jm = thunder_rs.jit(model)
    x = torch.ones(3)
    for step in range(4):
        if step == 2:
            for m in (model, eager):
                m.layers[1] = _Layer() if m.layers[0] is m.layers[1] else m.layers[0]
        torch.testing.assert_close(jm(x), eager(x), rtol=0, atol=0)
        torch.testing.assert_close([la.keys for la in model.layers], [la.keys for la in eager.layers])


class _HoldsALayer(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, layer, x):
        layer.keys = layer.keys + x
        return self.layer.keys * 2


@pytest.mark.parametrize("first", ["shared", "distinct"])
def test_an_argument_object_the_module_also_holds_then_another_matches_eager(first):
    held = _Layer()
    model = _HoldsALayer(held)
    jm = thunder_rs.jit(model)
    x = torch.ones(3)
    for shared in (True, False, True, False) if first == "shared" else (False, True, False, True):
        layer = held if shared else _Layer(10.0)
        expected = (layer.keys + x) * 2 if shared else held.keys * 2
        torch.testing.assert_close(jm(layer, x), expected, rtol=0, atol=0)
    assert len(_misses(jm)) == 2


GLOBAL_LAYER = _Layer()


def _grows_the_argument_reads_the_global(layer, x):
    layer.keys = layer.keys + x
    return GLOBAL_LAYER.keys * 2


def test_an_argument_object_that_is_a_global_one_then_another_matches_eager():
    jf = thunder_rs.jit(_grows_the_argument_reads_the_global)
    x = torch.ones(3)
    for shared in (False, True, False, True):
        layer = GLOBAL_LAYER if shared else _Layer(10.0)
        expected = (layer.keys + x) * 2 if shared else GLOBAL_LAYER.keys * 2
        torch.testing.assert_close(jf(layer, x), expected, rtol=0, atol=0)
    assert len(_misses(jf)) == 2


def _rebinds_then_reads(cache, x):
    cache.keys[0] = cache.keys[0] + x
    return cache.keys[1] * 2 + cache.keys[0]


def test_a_tensor_at_two_indices_of_each_calls_cache_compiles_once():
    # It was captured by identity, and each call's new tensor compiled again.
    jf = thunder_rs.jit(_rebinds_then_reads)
    x = torch.ones(3)
    for shared in (True, True, True, False, False, True):
        t = torch.randn(3)
        cache = _Cache(None)
        cache.keys = [t, t] if shared else [t, torch.randn(3)]
        twin = _twin(cache)
        torch.testing.assert_close(jf(cache, x), _rebinds_then_reads(twin, x), rtol=0, atol=0)
        torch.testing.assert_close(cache.keys, twin.keys, rtol=0, atol=0)
    assert len(_misses(jf)) == 2
    assert _misses(jf)[1] == "cache.keys[0] and cache.keys[1], one object when traced, are now distinct objects"


class _Outer:
    def __init__(self, a, b):
        self.cache = _Cache([])
        self.cache.a, self.cache.b = a, b


def _write_both(x, outer):
    outer.cache.a.keys = outer.cache.a.keys + x
    outer.cache.b.keys = outer.cache.b.keys * x
    return x * 2


def test_objects_written_through_their_paths_are_compared_once_and_their_sharing_as_eager():
    jitted = thunder_rs.jit(_write_both)
    x = torch.full((3,), 2.0)
    traced = _Outer(_Layer(), _Layer())
    jitted(x, traced)
    (entry,) = jitted._cache.values()
    distinct = [g for g in entry.guards.per_call if type(g).__name__ == "DistinctGuard"]
    assert len(distinct) == 1 and {"outer.cache.a", "outer.cache.b"} <= set(distinct[0].origin.split(", "))
    for make in (lambda: _Outer(_Layer(), _Layer()), lambda: _Outer(*[_Layer()] * 2)):
        compiled, eager = make(), make()
        jitted(x, compiled), _write_both(x, eager)
        torch.testing.assert_close(compiled.cache.a.keys, eager.cache.a.keys, rtol=0, atol=0)
        torch.testing.assert_close(compiled.cache.b.keys, eager.cache.b.keys, rtol=0, atol=0)
