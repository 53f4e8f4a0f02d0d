"""Calls with keyword or non-tensor arguments are keyed by a function of their structure
(``core.run.call_keys``): the key and leaves the general path's flatten gives, for every structure
users and Hugging Face models pass, and the same hits and misses through jit."""

import collections
import dataclasses

import pytest
import torch
from torch.utils import _pytree as pytree

import thunder_rs
from thunder_rs.core.acquisition.cache import global_key, leaf_key, tensor_aliases
from thunder_rs.core.run import call_keys, call_paths, callflat
from thunder_rs.core.run import jit as jit_module
from thunder_rs.errors import ThunderNotImplementedError

NT = collections.namedtuple("NT", "a b")


@dataclasses.dataclass
class Config:
    """Read through attributes only: keyed by its type."""

    scale: float = 2.0


class Box:
    def __init__(self, t):
        self.t = t


def _general_key(args, kwargs, extra=None):
    flat, spec = callflat.flatten_call(args, kwargs)
    return (global_key(extra, tensor_aliases(flat)), tuple(map(leaf_key, flat)), spec), flat


def _inference(*shape):
    with torch.inference_mode():
        return torch.randn(*shape)


def _calls() -> dict:
    """``(args, kwargs)`` of calls of many structures, made anew on each use."""
    x, y = torch.randn(3), torch.randn(2, 3)
    w = torch.randn(3, requires_grad=True)
    g = torch.Generator().manual_seed(0)
    return {
        "keywords": ((x,), {"mask": y, "use_cache": False}),
        "int": ((x, 3), {}),
        "bool, float, str": ((x, True, 0.5, "mean"), {}),
        "None": ((x, None), {"attention_mask": None}),
        "nan": ((x,), {"eps": float("nan")}),
        "tuple of tuples": ((x,), {"past": ((x, y), (y, w))}),
        "list and dict": ((), {"d": {"z": y, "a": [x, 2.0]}, "l": [w, None]}),
        "dict order": ((), {"d": {"a": x, "b": y}}),
        "dict other order": ((), {"d": {"b": y, "a": x}}),
        "dict equal leaves": ((), {"d": {"b": None, "a": None}}),
        "same tensor twice": ((x, 1), {"k": x}),
        "same tensor nested": ((x,), {"t": (y, [x, y])}),
        "views": ((x, x[:2]), {"v": x.view(3)}),
        "inference": ((_inference(3), 2), {}),
        "inference keyword": ((x,), {"cache": _inference(2, 3)}),
        "requires grad": ((w,), {"scale": 2}),
        "transposed": ((y.t(), 0), {}),
        "generator": ((x,), {"generator": g}),
        "generator twice": ((x, g), {"generator": g}),
        "config object": ((x,), {"config": Config()}),
        "module": ((x,), {"layer": torch.nn.Linear(3, 3)}),
        "empty containers": ((), {"t": (), "d": {}, "l": [], "n": ((), [])}),
        "parameter": ((torch.nn.Parameter(torch.randn(2)), 1), {}),
        "twelve tensors": ((x,), {"many": tuple(torch.randn(2) for _ in range(11))}),
        "twelve with one twice": ((x,), {"many": (*(torch.randn(2) for _ in range(10)), x)}),
        "a dtype and a device": ((x, torch.float16), {"device": torch.device("cpu")}),
        "namedtuple": ((NT(x, y),), {"k": 1}),
        "OrderedDict": ((x,), {"od": collections.OrderedDict(q=y, p=x)}),
        "nested namedtuple": ((x,), {"t": (1, NT(x, None))}),
    }


#: Structures with a node type other than tuple, list and dict: keyed by the general path.
GENERAL = {"namedtuple", "OrderedDict", "nested namedtuple"}


def _assert_same_key(args, kwargs, extra=None):
    keyed = call_keys.call_key(args, kwargs, extra)
    want_key, want_flat = _general_key(args, kwargs, extra)
    assert keyed is not None
    key, flat = keyed
    assert key == want_key and hash(key) == hash(want_key)
    assert len(flat) == len(want_flat) and all(a is b for a, b in zip(flat, want_flat))


@pytest.mark.parametrize("name", sorted(_calls()))
def test_the_key_of_a_structure_is_the_general_paths(name):
    for _ in range(2):  # made by the first call, reused by the second (on other objects)
        args, kwargs = _calls()[name]
        if name in GENERAL:
            assert call_keys.call_key(args, kwargs, None) is None
            continue
        for state in (None, (True, ("params",))):
            _assert_same_key(args, kwargs, state)
        with torch.no_grad():
            _assert_same_key(args, kwargs)
        with torch.inference_mode():
            _assert_same_key(args, kwargs)


def test_nestings_that_change_are_keyed_as_the_general_path_keys_them():
    x = torch.randn(2)
    for n in (1, 2, 1, 3, 4, 5, 6, 2, 7):
        args, kwargs = (x,), {"images": [torch.randn(2) for _ in range(n)], "d": {"a": 1} if n % 2 else {"b": 1}}
        keyed = call_keys.call_key(args, kwargs, None)
        if keyed is None:  # past MAX_NESTINGS nestings of one structure
            assert n not in (1, 2, 3)
        else:
            assert keyed[0] == _general_key(args, kwargs)[0]


def test_a_nesting_the_general_path_keys_is_written_once():
    """A namedtuple inside (a node type not opened) leaves the structure's other nestings theirs."""
    x, y = torch.randn(2), torch.randn(3)
    for _ in range(call_keys.MAX_NESTINGS + 1):
        assert call_keys.call_key((x,), {"pair": [1, NT(x, None)]}, None) is None
    _assert_same_key((x,), {"pair": [y, [x, y]]})


def test_a_switch_of_flatten_and_a_new_node_type_make_the_keys_again(monkeypatch):
    x = torch.randn(2)
    args, kwargs = (x,), {"box": Box(x), "k": 1}
    _assert_same_key(args, kwargs)
    monkeypatch.setattr(callflat, "_flatten", [pytree.tree_flatten])
    _assert_same_key(args, kwargs)
    pytree._private_register_pytree_node(Box, lambda b: ([b.t], None), lambda xs, _: Box(xs[0]))
    try:
        keyed = call_keys.call_key(args, kwargs, None)  # a node now: the general path keys it
        assert keyed is None or keyed[0] == _general_key(args, kwargs)[0]
        assert len(_general_key(args, kwargs)[1]) == 3
    finally:
        pytree.SUPPORTED_NODES.pop(Box, None)


def _program(x, n=1, *, mask=None, flag=True, past=(), config=None):
    out = x * n if flag else x - n
    if mask is not None:
        out = out + mask
    for a, b in past:
        out = out + a * b
    if config is not None:
        out = out * config.scale
    return out


def _sequence():
    """Calls of ``_program``, each a function of nothing (tensors made anew each time)."""
    x, m = torch.randn(3), torch.randn(3)
    w = torch.randn(3, requires_grad=True)
    return [
        lambda: ((x,), {"mask": m}),
        lambda: ((x,), {"mask": m}),
        lambda: ((torch.randn(3),), {"mask": torch.randn(3)}),
        lambda: ((x, 2), {"mask": m}),
        lambda: ((x, 3), {"mask": m}),
        lambda: ((x,), {"mask": None, "flag": False}),
        lambda: ((x,), {"flag": False, "mask": None}),
        lambda: ((x,), {"mask": x}),
        lambda: ((x,), {"mask": m}),
        lambda: ((_inference(3),), {"mask": m}),
        lambda: ((w,), {"mask": m}),
        lambda: ((x,), {"past": ((m, m), (x, m))}),
        lambda: ((x,), {"past": ((m, m), (x, m), (m, x))}),
        lambda: ((x,), {"past": ((m, m), (x, m))}),
        lambda: ((x,), {"past": [(m, m)], "config": Config(3.0)}),
        lambda: ((x,), {"past": [(m, m)], "config": Config(3.0)}),
        lambda: ((x,), {"past": [(m, m)], "config": Config(4.0)}),
        lambda: ((x, 2.5), {"mask": torch.randn(2, 3)}),
        lambda: ((x, 1.5), {"mask": m}),  # a float that changes: an input of the trace (float_args)
        lambda: ((x, 0.5), {"mask": m}),
        lambda: ((x,), {"mask": m, "config": Config(0.25)}),
        lambda: ((x,), {"past": (NT(m, m),)}),
        lambda: ((x,), {"past": (NT(m, m),)}),
    ]


def _run_sequence(grad: bool):
    jfn, counts = thunder_rs.jit(_program), []
    with torch.set_grad_enabled(grad):
        for call in _sequence():
            for _ in range(2):
                args, kwargs = call()
                torch.testing.assert_close(jfn(*args, **kwargs), _program(*args, **kwargs))
                stats = thunder_rs.compile_stats(jfn)
                counts.append((stats.cache_hits, stats.cache_misses))
    return counts


@pytest.mark.filterwarnings("ignore:thunder_rs. _program recompiled")
@pytest.mark.parametrize("grad", [pytest.param(True, marks=pytest.mark.slow), False])
def test_hits_and_misses_are_the_general_paths(monkeypatch, grad):
    keyed = _run_sequence(grad)
    monkeypatch.setattr(call_paths, "call_key", lambda args, kwargs, extra, structure=None: None)
    assert keyed == _run_sequence(grad)
    assert keyed[-1][0] >= len(_sequence())  # (each call's second hits)


def test_a_hit_with_keywords_flattens_nothing(monkeypatch):
    lin = torch.nn.Linear(3, 3)
    jm = thunder_rs.jit(lin)
    x = torch.randn(2, 3)
    jm(input=x)
    flattened = []
    flatten = callflat.flatten_call
    monkeypatch.setattr(call_paths, "flatten_call", lambda *a: flattened.append(a) or flatten(*a))
    for _ in range(3):
        torch.testing.assert_close(jm(input=x), lin(input=x))
    assert flattened == [] and thunder_rs.compile_stats(jm).cache_hits == 3
    lin.eval()  # the module's state is keyed: a miss flattens and compiles
    torch.testing.assert_close(jm(input=x), lin(input=x))
    assert len(flattened) == 1 and thunder_rs.compile_stats(jm).cache_misses == 2


def test_a_sparse_keyword_argument_is_refused_as_before():
    jfn = thunder_rs.jit(lambda x, *, k: x * k)
    with pytest.raises(ThunderNotImplementedError, match="sparse"):
        jfn(torch.eye(3).to_sparse(), k=2)


def _reads_a_value(x, *, k, scale=1.0):
    return x * k if bool(x.sum() > 0) else x - k * scale


def _run_values():
    jfn, counts = thunder_rs.jit(_reads_a_value), []
    for sign in (1, 1, -1, -1, 1, -1):
        x = torch.rand(3) * sign
        for kwargs in ({"k": 2}, {"k": 2, "scale": 0.5}):
            torch.testing.assert_close(jfn(x, **kwargs), _reads_a_value(x, **kwargs))
            stats = thunder_rs.compile_stats(jfn)
            counts.append((stats.cache_hits, stats.cache_misses))
    return counts


def test_values_read_hand_over_to_their_variant_as_the_general_path_does(monkeypatch):
    keyed = _run_values()
    monkeypatch.setattr(call_paths, "call_key", lambda args, kwargs, extra, structure=None: None)
    assert keyed == _run_values()


def _scaled(a, b):
    return a * b


def test_positional_calls_with_and_without_a_number_keep_one_entry_each(monkeypatch):
    """After a positional call with an int, calls of its argument types go to the general path
    without trying the fast one (``ThunderFunction._general_structure``); calls of the same
    arity with tensors stay on the fast path, whose entries the general path does not key: no
    structure compiles twice, and every call computes as eager."""
    jfn = thunder_rs.jit(_scaled)
    x, y = torch.randn(3), torch.randn(3)
    refused = []
    fast = jit_module.fast_key_fn
    monkeypatch.setattr(jit_module, "fast_key_fn", lambda n: lambda *a: refused.append(n) or fast(n)(*a))
    for b in (3, y, 3, y, 3, y, True, True):
        torch.testing.assert_close(jfn(x, b), _scaled(x, b), rtol=0, atol=0)
    stats = thunder_rs.compile_stats(jfn)
    assert (stats.cache_misses, stats.cache_hits) == (3, 5)
    # The fast path was tried by the tensor calls, and by the first call of each other structure only.
    assert len(refused) == 3 + 1 + 1


#: Which tensor each leaf is (an index), or an int leaf ("n"): ten tensors or more take
#: ``tensor_aliases``, fewer the key function's inline ``is`` pairs (``call_keys.INLINED_ALIASES``).
_ALIAS_PATTERNS = [
    (0, 0),
    (0, 1, 0),
    (0, 1, 1, 0, 2),
    (0, 0, 0, 0),
    (*range(9), 3),
    (*range(10), 0),
    (0, "n", 1, "n", 0),
]


@pytest.mark.parametrize("pattern", _ALIAS_PATTERNS, ids=str)
def test_aliases_of_tensors_passed_again_are_the_general_paths(pattern):
    call_keys._forget()  # (a structure has a few key functions for what it nests: none made before)
    tensors = [torch.randn(2) for _ in range(10)]
    leaves = [3 if i == "n" else tensors[i] for i in pattern]
    for args in (tuple(leaves), (leaves[0], tuple(leaves[1:]))):
        call_keys.call_key(args, {}, None)  # (the first call of a structure makes its key function)
        key, flat = call_keys.call_key(args, {}, None)
        assert (key, flat) == _general_key(args, {}) and key[0][-1] is not None
