"""Tensors a program computes and keeps in module state or a global for later calls (timm's
LeViT and EfficientFormer cache their attention biases in eval mode): the first compiled call
stores the tensor it returns after running, a later call finds it there (the container is state
the trace read), compiles once more and reads it, as eager does, where it is on each call (a
refilled cache compiles nothing). Gradients flow through the
stored tensor as through eager's; a compile that fails leaves the state as it was; what no
compiled call can store again is refused naming the line, and so is a cache keyed by the module's
identity (``id(self)``, ``hash``, weak references, ``is``, ``functools.lru_cache``, ``d[self]``,
``self in seen``, ``{self: ...}``): the trace runs on a copy of the module. The bytecode scan that
finds those is checked on the instructions Python 3.12 to 3.14 write as well."""

import copy
import dataclasses
import dis
import functools
import inspect
import sys
import types
import weakref

import pytest
import torch
from torch import nn

import thunder_rs
from thunder_rs.core.state import code_reads, identity
from thunder_rs.core.state.identity import uses_in
from thunder_rs.errors import ThunderNotImplementedError


class _CachedBias(nn.Module):
    """As LeViT: a tensor gathered from a parameter, cached by a key (LeViT's is the device), the
    cache cleared when the module goes back to training."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(3, dtype=torch.float64))
        self.cache = {}

    def forward(self, x):
        key = str(x.dtype)
        if key not in self.cache:
            self.cache[key] = self.bias.to(x.dtype) * 2
        return x + self.cache[key]

    def train(self, mode=True):
        super().train(mode)
        if mode and self.cache:
            self.cache = {}
        return self


def _twins(make=_CachedBias):
    torch.manual_seed(0)
    model = make().eval()
    return model, copy.deepcopy(model), thunder_rs.jit(model)


def _assert_same_cache(cache, expected) -> None:
    assert cache.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(cache[key], value, rtol=0, atol=0)
        assert type(cache[key]) is torch.Tensor and cache[key].requires_grad == value.requires_grad


def _misses(jfn) -> int:
    return thunder_rs.compile_stats(jfn).cache_misses


def test_a_tensor_cached_in_a_module_dict_is_stored_by_the_first_call_and_read_by_later_ones():
    model, eager, jmodel = _twins()
    x = torch.randn(2, 3, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(jmodel(x), eager(x), rtol=0, atol=0)
            _assert_same_cache(model.cache, eager.cache)
            if _misses(jmodel) == 1:
                stored = model.cache["torch.float64"]
    assert model.cache["torch.float64"] is stored  # read by later calls, not stored again
    assert _misses(jmodel) == 2
    assert thunder_rs.compile_stats(jmodel).miss_reasons[1].startswith("the contents of _CachedBias.cache changed")


def test_gradients_flow_through_a_cached_tensor_as_through_eagers():
    # Eager's cached tensor carries the graph of the call that made it: a later call's backward
    # reaches the parameter through it (the first graph kept with retain_graph).
    model, eager, jmodel = _twins()
    for _ in range(3):
        x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
        out, expected = jmodel(x), eager(x)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        out.square().sum().backward(retain_graph=True)
        expected.square().sum().backward(retain_graph=True)
        torch.testing.assert_close(model.bias.grad, eager.bias.grad)
        _assert_same_cache(model.cache, eager.cache)
        assert model.cache["torch.float64"].grad_fn is not None
    assert _misses(jmodel) == 2


def test_a_tensor_cached_under_inference_mode_is_read_by_a_call_under_grad():
    # Eager's cached tensor is an inference tensor (which keeps no version counter), and a later
    # call that differentiates reads it as any other tensor.
    model, eager, jmodel = _twins()
    x = torch.randn(2, 3, dtype=torch.float64)
    with torch.inference_mode():
        jmodel(x), eager(x)
    assert model.cache["torch.float64"].is_inference()
    xs = [x.clone().requires_grad_() for _ in range(2)]
    out, expected = jmodel(xs[0]), eager(xs[1])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.square().sum().backward(), expected.square().sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad)
    assert model.bias.grad is None and eager.bias.grad is None


class _CachedByName(_CachedBias):
    def forward(self, x):
        if "bias" not in self.cache:
            self.cache["bias"] = self.bias.to(x.dtype) * 2
        return x + self.cache["bias"]  # read by a constant key


class _CachedByDtype(_CachedBias):
    def forward(self, x):
        if (3, x.dtype) not in self.cache:  # a key whose repr is no code
            self.cache[(3, x.dtype)] = self.bias.to(x.dtype) * 2
        return x + self.cache[(3, x.dtype)]


@pytest.mark.parametrize("make", [_CachedBias, _CachedByName, _CachedByDtype])
@pytest.mark.parametrize(
    "clear",
    [lambda m: m.train().eval(), lambda m: m.cache.clear()],
    ids=["train_replaces_the_dict", "cleared_in_place"],
)
def test_a_cache_the_user_clears_is_filled_again(clear, make):
    model, eager, jmodel = _twins(make)
    x = torch.randn(2, 3, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(2):
            for _ in range(2):
                torch.testing.assert_close(jmodel(x), eager(x), rtol=0, atol=0)
                _assert_same_cache(model.cache, eager.cache)
            clear(model), clear(eager)
            assert model.cache == {}
    # The first compile serves the empty cache again; the second reads the tensor it then stores
    # where it is, as any tensor of its metadata.
    assert _misses(jmodel) == 2


def test_a_tensor_the_user_puts_in_the_cache_is_read_by_the_next_call():
    model, eager, jmodel = _twins()
    x = torch.randn(2, 3, dtype=torch.float64)
    with torch.no_grad():
        for value in (None, torch.ones(3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64)):
            if value is not None:
                model.cache["torch.float64"], eager.cache["torch.float64"] = value, value.clone()
            for _ in range(2):
                torch.testing.assert_close(jmodel(x), eager(x), rtol=0, atol=0)
                _assert_same_cache(model.cache, eager.cache)
    # One tensor for another of its metadata: no compile; of another shape: one.
    assert _misses(jmodel) == 3
    reason = thunder_rs.compile_stats(jmodel).miss_reasons[-1]
    assert reason.startswith("_CachedBias.cache['torch.float64'] changed from a float64 tensor of shape [3]")


class _ReturnsHeld(_CachedBias):
    """Returns what its state holds as it is: the cached tensor and a plain tensor attribute."""

    def __init__(self):
        super().__init__()
        self.scale = torch.full((3,), 2.0, dtype=torch.float64)

    def forward(self, x):
        return super().forward(x) * self.scale, self.cache["torch.float64"], self.scale


def test_a_tensor_of_state_returned_as_it_is_is_the_one_there_now():
    # The user puts other tensors of the same metadata there: eager returns those. The cache's was
    # read per call for the sum but returned as the tensor the trace saw (stale values).
    model, eager, jmodel = _twins(_ReturnsHeld)
    x = torch.randn(3, dtype=torch.float64)
    with torch.no_grad():
        for k in range(5):
            if k == 2:
                model.cache["torch.float64"] = eager.cache["torch.float64"] = torch.ones(3, dtype=torch.float64)
            if k == 3:
                model.scale = eager.scale = torch.full((3,), 3.0, dtype=torch.float64)
            (out, cached, scale), (expected, _, _) = jmodel(x), eager(x)
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
            assert cached is model.cache["torch.float64"] and scale is model.scale
    # The first call stores, the second reads; a tensor returned as it is is guarded as that tensor
    # (the trace's constant): each one put there compiles once more.
    assert _misses(jmodel) == 4


def test_two_keys_are_cached_side_by_side():
    model, eager, jmodel = _twins()
    with torch.no_grad():
        for dtype in (torch.float64, torch.float32, torch.float64, torch.float32):
            x = torch.randn(2, 3, dtype=dtype)
            torch.testing.assert_close(jmodel(x), eager(x), rtol=0, atol=0)
            _assert_same_cache(model.cache, eager.cache)
    assert model.cache.keys() == {"torch.float64", "torch.float32"}


def test_eager_calls_and_jitted_calls_share_the_cache():
    model, eager, jmodel = _twins()
    x = torch.randn(2, 3, dtype=torch.float64)
    with torch.no_grad():
        jmodel(x), eager(x)
        stored = model.cache["torch.float64"]
        torch.testing.assert_close(model(x), eager(x), rtol=0, atol=0)  # the module's own call reads it
        assert model.cache == {"torch.float64": stored}
        # Filled by an eager call first, the cache is read by the first compile.
        filled, jfilled = copy.deepcopy(eager), thunder_rs.jit(eager)
        torch.testing.assert_close(jfilled(x), filled(x), rtol=0, atol=0)
    assert _misses(jfilled) == 1


class _FailsAfterCaching(_CachedBias):
    def __init__(self):
        super().__init__()
        self.scales = []

    def forward(self, x):
        self.scales.append(self.bias.exp())
        out = super().forward(x)
        return out if x.grad is None else out * 2  # refused: a compiled call cannot read .grad


def test_a_failed_compile_leaves_the_caches_as_they_were():
    model = _FailsAfterCaching()
    x = torch.randn(2, 3, dtype=torch.float64)
    with pytest.raises(ThunderNotImplementedError, match="reads the .grad"):
        thunder_rs.jit(model)(x)
    assert model.cache == {} and model.scales == []
    torch.testing.assert_close(model(x), x + model.bias * 2)


class _LazyState:
    """As a Mamba cache layer: the state tensor is made in the first call, into a dict."""

    def __init__(self):
        self.conv_states = {0: None}


def _fills_its_argument(x, state):
    if state.conv_states[0] is None:
        state.conv_states[0] = torch.zeros(x.shape[0], 2)
    return x @ torch.ones(3, 2) + state.conv_states[0]


def test_a_failed_compile_leaves_the_arguments_dicts_as_they_were():
    # A trace that fails (here the program's own error; in Mamba's generate a symbolic compile
    # that fell back to a static one) left its stand-in in the cache it was given: the next
    # trace found a proxy there ("symbols can only be called while thunder_rs traces").
    jf, state = thunder_rs.jit(_fills_its_argument), _LazyState()
    with pytest.raises(RuntimeError):
        _fills_its_argument(torch.ones(4, 5), _LazyState())
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        jf(torch.ones(4, 5), state)
    assert state.conv_states == {0: None}
    x, expected = torch.randn(4, 3), _LazyState()
    torch.testing.assert_close(jf(x, state), _fills_its_argument(x, expected))
    torch.testing.assert_close(state.conv_states[0], expected.conv_states[0])


class _Box:
    def __init__(self, value):
        self.value = value


class _CachedBox(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3))
        self.cache = {}

    def forward(self, x):
        if "w" not in self.cache:
            self.cache["w"] = _Box(self.weight * 2)  # the store
        return x + self.cache["w"].value


def _line_of(marker: str, path: str = __file__) -> int:
    with open(path) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(marker))


def test_an_object_no_call_can_store_again_is_refused_naming_the_line():
    model = _CachedBox()
    with pytest.raises(
        ThunderNotImplementedError,
        match=rf"at .*test_state_caches\.py:{_line_of('# the store')} put an object of type _Box under the key "
        r"'w' in _CachedBox\.cache",
    ):
        thunder_rs.jit(model)(torch.randn(3))
    assert model.cache == {}


def test_a_closure_list_a_program_appends_to_grows_as_in_eager():
    # A hook's list of activations, in a closure cell: every call appends its own tensor, as a
    # global list (each call finds the list changed and compiles again).
    def make():
        feats = []

        def program(x):
            y = x * 2
            feats.append(y)
            return y

        return program, feats

    (program, feats), (eager, expected) = make(), make()
    jprogram = thunder_rs.jit(program)
    for i in range(3):
        x = torch.full((3,), float(i))
        torch.testing.assert_close(jprogram(x), eager(x), rtol=0, atol=0)
        torch.testing.assert_close(feats, expected, rtol=0, atol=0)
        assert all(type(f) is torch.Tensor for f in feats)


def _closure_cache():
    cache = {}

    def program(x):
        if "mask" not in cache:
            cache["mask"] = torch.ones(x.shape[-1], x.shape[-1], dtype=x.dtype).triu()
        return x @ cache["mask"]

    return program, cache


def test_a_tensor_cached_in_a_closure_dict_is_stored_and_read_as_eager():
    (program, cache), (eager, expected) = _closure_cache(), _closure_cache()
    jprogram = thunder_rs.jit(program)
    for _ in range(3):
        x = torch.randn(2, 3)
        torch.testing.assert_close(jprogram(x), eager(x), rtol=0, atol=0)
        _assert_same_cache(cache, expected)
    assert _misses(jprogram) == 2  # one stores the mask, one reads it
    assert thunder_rs.compile_stats(jprogram).miss_reasons[1].startswith("the contents of closure variable 'cache'")


_MASKS: dict = {}


def _masked(x):
    n = x.shape[-1]
    if n not in _MASKS:
        _MASKS[n] = torch.ones(n, n, dtype=x.dtype).triu()
    return x @ _MASKS[n]


def test_a_tensor_cached_in_a_global_dict_is_stored_and_read_as_eager():
    jf = thunder_rs.jit(_masked)
    for n in (3, 3, 4, 4):
        x = torch.randn(2, n)
        torch.testing.assert_close(jf(x), x @ torch.ones(n, n).triu())
        assert type(_MASKS[n]) is torch.Tensor
    assert sorted(_MASKS) == [3, 4]
    # Each size: a compile that stores its mask, one that reads it.
    assert _misses(jf) == 4
    _MASKS.clear()


class _Collector:
    def __init__(self):
        self.outputs = None

    def current(self):
        return self.outputs


_COLLECTOR = _Collector()


def _record(hidden):
    outputs = _COLLECTOR.current()
    outputs["hidden"].append(hidden)


def _collecting(x):
    # As transformers' output capturing: a dict of lists made for the call, set on a global object
    # for hooks to fill, and taken off again. Not a cache: nothing of it outlives the call.
    _COLLECTOR.outputs = collected = {"hidden": []}
    _record(x * 2)
    collected["hidden"] = tuple(collected["hidden"])
    _COLLECTOR.outputs = None
    return collected["hidden"][0] + 1


def test_containers_made_for_the_call_and_set_on_state_are_not_kept():
    jf = thunder_rs.jit(_collecting)
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(jf(x), x * 2 + 1)
        assert _COLLECTOR.outputs is None
    assert _misses(jf) == 1


class _Rotary(nn.Module):
    """Kinds of cache: a tuple in a dict, a dict in a dict, a list, a class attribute shared by
    the instances, a dict of a config object the module holds, and a submodule's cache."""

    shared: dict = {}

    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.freq = kind, nn.Parameter(torch.randn(3, dtype=torch.float64))
        self.cache, self.caches, self.scales = {}, {"rope": {}}, []
        self.config = types.SimpleNamespace(cache={})
        self.inner = _CachedBias()
        self.tag = "jitted"  # its key in the class's cache (``id(self)`` would be the traced clone's)

    def forward(self, x):
        if self.kind == "tuple":
            if 3 not in self.cache:
                self.cache[3] = (self.freq.cos(), self.freq.sin())
            cos, sin = self.cache[3]
            return x * cos + x * sin
        if self.kind == "nested":
            if 3 not in self.caches["rope"]:
                self.caches["rope"][3] = self.freq.cos()
            return x * self.caches["rope"][3]
        if self.kind == "list":
            if not self.scales:
                self.scales.append(self.freq.exp())
            return x * self.scales[0]
        if self.kind == "class":
            if self.tag not in self.shared:
                self.shared[self.tag] = self.freq.tanh()
            return x * self.shared[self.tag]
        if self.kind == "config":
            if "f" not in self.config.cache:
                self.config.cache["f"] = self.freq.sigmoid()
            return x * self.config.cache["f"]
        return self.inner(x)


@pytest.mark.parametrize("kind", ["tuple", "nested", "list", "class", "config", "submodule"])
def test_each_kind_of_cache_in_module_state_is_stored_and_read_as_eager(kind):
    model, eager, jmodel = _twins(lambda: _Rotary(kind))
    eager.tag = "eager"
    x = torch.randn(2, 3, dtype=torch.float64)
    state = lambda m: (m.cache, m.caches, m.scales, m.config.cache, m.inner.cache, _Rotary.shared.get(m.tag))  # noqa: E731
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(jmodel(x), eager(x), rtol=0, atol=0)
            torch.testing.assert_close(state(model), state(eager), rtol=0, atol=0)
    assert _misses(jmodel) == 2
    _Rotary.shared.clear()


# -- caches keyed by the module's identity ---------------------------------------------------------

_BY_IDENTITY: dict = {}
_HELD_ELSEWHERE: list = []


class _Identity(nn.Module):
    """A forward that uses its module's identity (``use``), which the traced copy of the module
    does not have: refused naming the line, where eager and compiled calls would key, compare
    and cache apart."""

    def __init__(self, use):
        super().__init__()
        self.lin = nn.Linear(3, 3, dtype=torch.float64)
        self.use = use

    def forward(self, x):
        if self.use == "id":
            _BY_IDENTITY.setdefault(id(self), 2.0)
        elif self.use == "hash":
            _BY_IDENTITY.setdefault(hash(self), 2.0)
        elif self.use == "weakref":
            if weakref.ref(self)() is None:
                return x
        elif self.use == "is":
            return self.lin(x) * (2 if _HELD_ELSEWHERE and _HELD_ELSEWHERE[0] is self else 1)
        elif self.use == "lru_cache":
            return self.lin(x) * self.scale()
        elif self.use == "subscript":
            _BY_IDENTITY[self] = 2.0
        elif self.use == "in":
            return self.lin(x) * (2 if self in _HELD_ELSEWHERE else 1)
        elif self.use == "dict":
            _BY_IDENTITY.update({self: 2.0})
        return self.lin(x)

    @functools.lru_cache  # noqa: B019 (the construct under test)
    def scale(self):
        return 2.0


@pytest.mark.parametrize("use", ["id", "hash", "weakref", "is", "lru_cache", "subscript", "in", "dict"])
def test_a_forward_using_its_modules_identity_is_refused_naming_the_line(use):
    model = _Identity(use)
    _HELD_ELSEWHERE[:] = [model]
    x = torch.randn(2, 3, dtype=torch.float64)
    expected = model(x)  # eager keys, compares and caches by the module itself
    _BY_IDENTITY.clear()
    with pytest.raises(ThunderNotImplementedError, match=r"test_state_caches.py:\d+ uses the identity of the module"):
        thunder_rs.jit(model)(x)
    assert not _BY_IDENTITY  # nothing stored under the traced copy's key
    torch.testing.assert_close(model(x), expected)


class _ComparesWithoutIdentity(nn.Module):
    """``is`` with a constant, and submodules compared with the module they came from (as Hugging
    Face's ``get_input_embeddings`` compares ``getattr(self, "language_model", None)``, BLIP-2's
    and LLaVA's: refused, where the copy's submodules are copies too): the traced copy answers
    as the module does."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3, dtype=torch.float64)
        self.scale = 2.0

    def forward(self, x, mask=None):
        others = sum(1 for m in self.modules() if m is not self)
        language_model = getattr(self, "lin", None)
        if language_model is not None and language_model is not self and self.scale is not self:
            others += 1
        if mask is None and self is not None:
            return self.lin(x) * others
        return self.lin(x)


def test_comparisons_that_do_not_need_the_modules_identity_match_eager():
    model = _ComparesWithoutIdentity()
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(thunder_rs.jit(model)(x), model(x))


class _KeyedByValue(nn.Module):
    """A module whose class hashes and compares by a value it holds: keying by it and testing
    membership are the copy's as the module's."""

    def __init__(self):
        super().__init__()
        self.lin, self.name = nn.Linear(3, 3, dtype=torch.float64), "block"

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, _KeyedByValue) and other.name == self.name

    def forward(self, x):
        scale = {self: 2.0}[self] if self in [self] else 1.0
        return self.lin(x) * scale


def test_keying_by_a_module_that_hashes_by_value_matches_eager():
    model = _KeyedByValue()
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(thunder_rs.jit(model)(x), model(x))


def _ins(opname, argval=None, arg=None, argrepr=""):
    return types.SimpleNamespace(opname=opname, argval=argval, arg=arg, argrepr=argrepr, positions=None)


#: Method bodies as Python 3.12-3.14 compile them (``dis``), and the uses of ``self`` found.
_BYTECODE = {
    "3.13 d[self]": ([_ins("LOAD_FAST_LOAD_FAST", ("d", "self")), _ins("BINARY_SUBSCR")], ["key"]),
    "3.13 self[i]": ([_ins("LOAD_FAST_LOAD_FAST", ("self", "i")), _ins("BINARY_SUBSCR")], []),
    "3.14 d[self]": (
        [_ins("LOAD_FAST_BORROW_LOAD_FAST_BORROW", ("d", "self")), _ins("BINARY_OP", 26, 26, "[]")],
        ["key"],
    ),
    "3.14 d[self] = v": (
        [_ins("LOAD_FAST_BORROW", "v"), _ins("LOAD_FAST_BORROW_LOAD_FAST_BORROW", ("d", "self")), _ins("STORE_SUBSCR")],
        ["key"],
    ),
    "3.13 x is self": ([_ins("LOAD_FAST_LOAD_FAST", ("x", "self")), _ins("IS_OP", 0, 0)], ["is"]),
    "3.13 self is x": ([_ins("LOAD_FAST_LOAD_FAST", ("self", "x")), _ins("IS_OP", 0, 0)], ["is"]),
    "3.12 self is None": ([_ins("LOAD_FAST", "self"), _ins("LOAD_CONST", None), _ins("IS_OP", 1, 1)], []),
    "3.13 self in seen": ([_ins("LOAD_FAST_LOAD_FAST", ("self", "seen")), _ins("CONTAINS_OP", 0, 0)], ["key"]),
    "3.13 x in self": ([_ins("LOAD_FAST_LOAD_FAST", ("x", "self")), _ins("CONTAINS_OP", 0, 0)], []),
    "3.12 self in self.seen": (
        [_ins("LOAD_FAST", "self"), _ins("LOAD_FAST", "self"), _ins("LOAD_ATTR", "seen", 0), _ins("CONTAINS_OP", 0, 0)],
        ["method", "key"],
    ),
    "3.14 {self: 1}": (
        [_ins("LOAD_FAST_BORROW", "self"), _ins("LOAD_SMALL_INT", 1, 1), _ins("BUILD_MAP", 1, 1)],
        ["key"],
    ),
    "3.12 {1: self}": ([_ins("LOAD_CONST", 1), _ins("LOAD_FAST", "self"), _ins("BUILD_MAP", 1, 1)], []),
    "3.12 {self}": ([_ins("LOAD_FAST", "self"), _ins("BUILD_SET", 1, 1)], ["key"]),
    "3.12 id(self)": (
        [_ins("LOAD_GLOBAL", "id", 1, "NULL + id"), _ins("LOAD_FAST", "self"), _ins("CALL", 1, 1)],
        ["call"],
    ),
    "3.12 hash(self), self a cell": (
        [_ins("LOAD_GLOBAL", "hash", 1, "NULL + hash"), _ins("LOAD_DEREF", "self"), _ins("CALL", 1, 1)],
        ["call"],
    ),
    "3.12 x = getattr(self, 'a', None); x is self": (
        [
            *(_ins("LOAD_GLOBAL", "getattr", 1), _ins("LOAD_FAST", "self"), _ins("LOAD_CONST", "a")),
            *(_ins("LOAD_CONST", None), _ins("CALL", 3, 3), _ins("STORE_FAST", "x")),
            *(_ins("LOAD_FAST", "x"), _ins("LOAD_FAST", "self"), _ins("IS_OP", 0, 0)),
        ],
        ["is"],
    ),
    "3.13 x = y; self is x": (
        [_ins("LOAD_FAST", "y"), _ins("STORE_FAST_LOAD_FAST", ("x", "self")), _ins("LOAD_FAST", "x"), _ins("IS_OP", 0)],
        ["is"],
    ),
}


@pytest.mark.parametrize("case", list(_BYTECODE))
def test_the_identity_scan_reads_each_versions_bytecode(case):
    instructions, kinds = _BYTECODE[case]
    uses = uses_in(instructions, "self")
    assert [kind for kind, _, _ in uses] == kinds
    if "getattr" in case:  # the attribute compared, which is checked on the traced copy
        assert uses[0][1] == "a"
    elif "x = y" in case:
        assert uses[0][1] is None


_STORES = {
    "3.12 self.levels = x": ([_ins("LOAD_FAST", "x"), _ins("LOAD_FAST", "self"), _ins("STORE_ATTR", "levels")], True),
    "3.13 self.levels = x": ([_ins("LOAD_FAST_LOAD_FAST", ("x", "self")), _ins("STORE_ATTR", "levels")], True),
    "3.14 self.levels = []": (
        [_ins("BUILD_LIST", 0), _ins("LOAD_FAST_BORROW", "self"), _ins("STORE_ATTR", "levels")],
        True,
    ),
    "3.12 self.inner.levels = x": (
        [_ins("LOAD_FAST", "x"), _ins("LOAD_FAST", "self"), _ins("LOAD_ATTR", "inner"), _ins("STORE_ATTR", "levels")],
        False,
    ),
    "3.13 self = other after the store": (
        [_ins("LOAD_FAST_LOAD_FAST", ("x", "self")), _ins("STORE_ATTR", "levels"), _ins("LOAD_FAST", "other"),
         _ins("STORE_FAST_LOAD_FAST", ("self", "y"))],
        False,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(_STORES))
def test_the_stores_a_method_makes_before_its_reads_are_read_in_each_versions_bytecode(case):
    listed, stored = _STORES[case]
    after = frozenset()
    for i in range(len(listed)):
        after = code_reads._store_effect(listed, i, after)
    assert (("self", "levels") in after) == stored


class _Pyramid(nn.Module):
    """As RAFT's correlation block: a method sets a new list of tensors on the module and appends
    to it, another reads it; the list the last call left there is not read."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, dtype=torch.float64))
        self.levels = [torch.tensor(0)]

    def build(self, x):
        self.levels = [x * self.weight]
        for _ in range(2):
            self.levels.append(self.levels[-1].cumsum(0))

    def index(self):
        return sum(level.sum() for level in self.levels)

    def forward(self, x):
        self.build(x)
        return self.index()


def test_a_list_of_tensors_a_method_sets_on_the_module_each_call_compiles_once():
    """The list a method stores before reading it is no state the call began with: RAFT's
    training compiled on every call (``the contents of CorrBlock.corr_pyramid changed``)."""
    model, eager, jmodel = _twins(_Pyramid)
    for _ in range(3):
        x = torch.randn(4, dtype=torch.float64)
        out, expected = jmodel(x), eager(x)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        out.backward(), expected.backward()
        torch.testing.assert_close(model.weight.grad, eager.weight.grad, rtol=0, atol=0)
        assert len(model.levels) == len(eager.levels) == 3
        for level, want in zip(model.levels, eager.levels, strict=True):
            torch.testing.assert_close(level, want, rtol=0, atol=0)
    assert _misses(jmodel) == 1


class _MaybeStored(nn.Module):
    """Stores a list of scales on one path only: the scales read may be the ones the call
    began with, which the user changes between calls."""

    def __init__(self, how: str):
        super().__init__()
        self.how, self.reset, self.scales = how, False, [2.0]

    def fill(self):
        if self.reset:
            raise ValueError("no scales")
        return 3.0

    def forward(self, x):
        if self.how == "branch":
            if self.reset:
                self.scales = [3.0]
        elif self.how == "try":
            try:
                self.scales = [self.fill()]
            except ValueError:
                pass
        else:  # read, then stored
            x = x * self.scales[-1]
            self.scales = [x.shape[0] * 1.0]
        return x * self.scales[-1]


@pytest.mark.parametrize("how", ["branch", "try", "read_first"])
def test_a_list_stored_on_some_paths_only_is_still_read_from_the_state(how):
    model, eager, jmodel = _twins(lambda: _MaybeStored(how))
    for reset, scales in [(False, [2.0]), (False, [5.0]), (True, [5.0]), (True, [6.0])]:
        for m in (model, eager):
            m.reset, m.scales = reset, list(scales)
        x = torch.ones(2, dtype=torch.float64)
        torch.testing.assert_close(jmodel(x), eager(x), rtol=0, atol=0)
        assert model.scales == eager.scales


def _code_objects(modules) -> list:
    """The code of every function and class body of ``modules``, nested code included."""
    objects = [*(o for m in modules for o in vars(m).values())]
    objects += [f for cls in objects if isinstance(cls, type) for f in vars(cls).values()]
    found, pending = [], [o.__code__ for o in objects if isinstance(getattr(o, "__code__", None), types.CodeType)]
    while pending:
        code = pending.pop()
        found.append(code)
        pending += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the fast bytecode walk is CPython 3.11's")
def test_the_bytecode_walk_reads_what_dis_reads():
    """``identity._walk_311`` (the observer's walk of each function it sees) against
    ``dis.get_instructions``, over the standard library's and torch's code: every instruction's
    name, argument, argument value and position, and ``BINARY_OP``'s operator."""
    modules = [dis, inspect, functools, dataclasses, torch.nn.functional, torch.nn.modules.module, nn.modules.linear]
    codes = _code_objects(modules)
    assert len(codes) > 500
    for code in codes:
        ours, theirs = identity._walk_311(code), list(dis.get_instructions(code))
        assert len(ours) == len(theirs), code
        for a, b in zip(ours, theirs):
            fields = ("opname", "arg", "positions", "offset", "opcode")
            assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields], (code, b)
            assert a.argval is b.argval or a.argval == b.argval, (code, b)
            assert a.opname != "BINARY_OP" or a.argrepr == b.argrepr, (code, b)
