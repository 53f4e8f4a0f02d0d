"""Objects passed as arguments, new each call (a config, a KV cache): keyed by their type where
the program reads them only through attributes and Python methods the observer sees, by identity
otherwise; what the program read from them is guarded, through their paths for objects they hold
in lists and dicts. Each test runs compiled and eagerly side by side."""

import collections.abc
import re

import torch

import thunder_rs


def test_arguments_read_other_than_by_attributes_are_keyed_by_identity():
    # A set or a NumPy array is read by membership or conversion, which no attribute guard sees:
    # a different object must not reuse the first call's trace.
    import numpy as np

    def member(x, s):
        return x + (1.0 if 3 in s else 0.0)

    def from_array(x, a):
        return x + torch.from_numpy(a)

    jm, ja, x = thunder_rs.jit(member), thunder_rs.jit(from_array), torch.zeros(2)
    for s in ({3}, {4}, {3}):
        torch.testing.assert_close(jm(x, s), member(x, s))
    for a in (np.ones(2, dtype=np.float32), np.full(2, 5, dtype=np.float32)):
        torch.testing.assert_close(ja(x, a), from_array(x, a))


class Scales:
    """A container whose protocols are Python methods reading its attributes (as a KV cache's
    ``__getitem__`` and ``__len__`` are): a call of them is seen with its reads."""

    def __init__(self, *values):
        self.values = list(values)

    def __getitem__(self, i):
        return self.values[i]

    def __len__(self):
        return len(self.values)


class ScaleMap(collections.abc.Mapping):
    """``__contains__`` and ``get`` are ``collections.abc``'s, which read through ``__getitem__``
    in the standard library, where the observer does not look."""

    def __init__(self, **values):
        self.data = values

    def __getitem__(self, key):
        return self.data[key]

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)


def test_a_fresh_argument_read_through_its_own_python_methods_each_call():
    # Keyed by its type (a new object each call, as generate's new KV cache, reuses the trace);
    # the reads its methods make are guarded, so other values compile again.
    def f(x, s):
        return x * s[0] + len(s)

    def g(x, m):
        return x + (m["a"] if "a" in m else 0.0)

    jf, jg, x = thunder_rs.jit(f), thunder_rs.jit(g), torch.ones(3)
    for values in ((2.0, 1.0), (2.0, 1.0), (3.0, 1.0), (3.0, 1.0, 4.0), (3.0, 1.0, 4.0)):
        torch.testing.assert_close(jf(x, Scales(*values)), f(x, Scales(*values)))
    assert thunder_rs.cache_misses(jf) == 3
    for values in ({"a": 1.0}, {"b": 1.0}, {"a": 2.0}, {"b": 3.0}):
        torch.testing.assert_close(jg(x, ScaleMap(**values)), g(x, ScaleMap(**values)))
    assert thunder_rs.cache_misses(jg) == 4  # by identity: the mixin's reads are not seen


class Layer:
    def __init__(self, scale, keys):
        self.scale, self.keys = scale, keys


class ShiftedLayer(Layer):
    pass


class Layers:
    def __init__(self, *layers):
        self.layers = list(layers)


def test_a_fresh_argument_holding_its_objects_in_a_list_each_call():
    # A new holder each call (a new KV cache): its list of layers is compared by type and length,
    # each layer guarded whole through its path (``h.layers[1].scale``): the same values reuse the
    # trace, another value, another length or another layer type compiles again.
    def f(x, h):
        for layer in h.layers:
            x = x * layer.scale + layer.keys.sum()
            if isinstance(layer, ShiftedLayer):
                x = x - 1
        return x

    jf, x = thunder_rs.jit(f), torch.ones(3)

    def holder(scales, kinds=None):
        kinds = kinds or [Layer] * len(scales)
        return Layers(*(kind(s, torch.full((2,), s)) for kind, s in zip(kinds, scales)))

    calls = [
        holder([2.0, 3.0]),
        holder([2.0, 3.0]),
        holder([2.0, 4.0]),
        holder([2.0, 4.0, 5.0]),
        holder([2.0, 4.0], [Layer, ShiftedLayer]),
        holder([2.0, 4.0]),
    ]
    for h in calls:
        torch.testing.assert_close(jf(x, h), f(x, h))
    stats = thunder_rs.compile_stats(jf)
    assert (stats.cache_misses, stats.cache_hits) == (4, 2)
    assert "h.layers[1].scale changed from 3.0 to 4.0" in stats.miss_reasons[1]


class Box:
    def __init__(self, t):
        self.t = t


class Keeps(torch.nn.Module):
    def forward(self, x, box):
        self.last = box.t  # stored as it is
        return x * box.t, box.t  # returned as it is


def test_an_argument_s_tensor_returned_or_stored_as_it_is_is_that_call_s():
    # Each call's box holds another tensor: eager returns and stores that one. The compiled call
    # returned and stored the first call's tensor (its values too) on every later call.
    model, eager = Keeps(), Keeps()
    jmodel = thunder_rs.jit(model)
    for k in range(3):
        box, x = Box(torch.full((3,), float(k))), torch.randn(3)
        (out, held), (expected, expected_held) = jmodel(x, box), eager(x, box)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        assert held is expected_held is box.t and model.last is eager.last is box.t
    assert thunder_rs.cache_misses(jmodel) == 1


class Count:
    def __init__(self, n):
        self.n = n


class OtherCount(Count):
    pass


class Pair:
    def __init__(self, first, second):
        self.first, self.second = first, second


def test_a_fresh_argument_holding_its_objects_as_attributes_each_call():
    # A new holder each call holding new objects as attributes (an EncoderDecoderCache's two
    # DynamicCaches, which generate makes anew): each is guarded through its path, so new ones of
    # the same type and values reuse the trace (they were guarded by identity: every call compiled).
    # One object at both paths, written through one and read through the other, compiles again:
    # eager reads what it wrote.
    def f(x, p):
        p.first.n = p.first.n + 1
        return x * p.first.n + p.second.n

    jf, x = thunder_rs.jit(f), torch.ones(3)
    shared = [Count(1), Count(1)]
    calls = [
        (Pair(Count(1), Count(1)), Pair(Count(1), Count(1))),
        (Pair(Count(1), Count(1)), Pair(Count(1), Count(1))),
        (Pair(shared[0], shared[0]), Pair(shared[1], shared[1])),
        (Pair(Count(1), OtherCount(1)), Pair(Count(1), OtherCount(1))),
    ]
    for p, q in calls:
        torch.testing.assert_close(jf(x, p), f(x, q))
        assert (p.first.n, p.second.n) == (q.first.n, q.second.n)
    stats = thunder_rs.compile_stats(jf)
    assert (stats.cache_misses, stats.cache_hits) == (3, 1), stats.miss_reasons
    assert "are now one object" in stats.miss_reasons[1]
    assert re.search(r"p\.second changed from .*Count.* to <OtherCount object", stats.miss_reasons[2])
