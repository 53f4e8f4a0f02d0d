"""What a compile does once however often the program repeats it (the costs profiled in
benchmarks/compile_times.py): each guard the observer keys is made at the first read of its key,
not once per read. The guards, and the outputs against eager, are the same."""

import importlib.util
import os
import pathlib
import py_compile
import sys
import types

import pytest
import torch
import torch.nn as nn

import thunder_rs
from thunder_rs.core.state import guards as guards_module
from thunder_rs.core.state import state as state_module


class Configured(nn.Module):
    """Reads its config's attributes, and calls its own helper method, many times over (as
    transformers' configs and layers are read in every block)."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(scale=2.0, shift=0.5, power=2, eps=1e-5, width=4)

    def helper(self, y):
        return y * self.config.scale + self.config.shift

    def forward(self, x):
        for _ in range(4):
            x = self.helper(x) + self.config.eps * self.config.width
        return x.pow(self.config.power)


def _counting(monkeypatch, cls) -> list:
    made = []
    init = cls.__init__

    def counted(self, *args, **kwargs):
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", counted)
    return made


def test_each_object_and_method_guard_is_made_once(monkeypatch):
    dict_guards = _counting(monkeypatch, guards_module.DictGuard)
    method_guards = _counting(monkeypatch, state_module.MethodGuard)
    model = Configured()
    x = torch.randn(3, 4)
    jm = thunder_rs.jit(model)
    torch.testing.assert_close(jm(x), model(x), rtol=0, atol=0)
    # One whole guard of the config (read 18 times), one method guard of ``helper`` (called 4 times).
    assert len(dict_guards) == 1
    assert len(method_guards) == 1
    # The guards still hold and still fail as before: a changed attribute recompiles.
    torch.testing.assert_close(jm(x), model(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jm).cache_misses == 1
    model.config.shift = -1.0
    torch.testing.assert_close(jm(x), model(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jm).cache_misses == 2
    Configured.helper, helper = (lambda self, y: y - 1.0), Configured.helper
    try:
        torch.testing.assert_close(jm(x), model(x), rtol=0, atol=0)
        assert thunder_rs.compile_stats(jm).cache_misses == 3
    finally:
        Configured.helper = helper


def test_the_proxy_metadata_helpers_answer_as_its_torch_function_does():
    # The recorder and the grad rules read ``requires_grad`` and ``numel()`` of every operand through
    # ``requires_grad_of``/``numel_of``, which skip the trip through ``__torch_function__``.
    from thunder_rs.core.base.proxies import TensorProxy, numel_of, requires_grad_of

    for shape in ((2, 3, 4), (), (0, 5)):
        for requires_grad in (False, True):
            proxy = TensorProxy(0, shape, torch.float32, torch.device("cpu"), requires_grad)
            assert requires_grad_of(proxy) is proxy.requires_grad is requires_grad
            assert numel_of(proxy) == proxy.numel()
    t = torch.ones(2, 3, requires_grad=True)
    assert requires_grad_of(t) and numel_of(t) == 6


class _Held(nn.Module):
    def __init__(self):
        super().__init__()
        self._cfg = types.SimpleNamespace(scale=2.0)
        self.calls = 0

    @property
    def cfg(self):
        return self._cfg

    def forward(self, x):
        self.calls += 1
        for _ in range(6):
            x = x * self.cfg.scale
        return x


def test_a_getter_is_walked_once_per_code(monkeypatch):
    # ``self.cfg.scale``, read through a getter (``return self._cfg``): the getter's bytecode is
    # walked when first met, not again at each compile that reads through it; the reads are
    # guarded through it as before.
    from thunder_rs.core.state import code_reads

    walked = []
    instructions = code_reads.instructions

    def counted(code):
        walked.append(code)
        return instructions(code)

    monkeypatch.setattr(code_reads, "instructions", counted)
    model, eager = _Held(), _Held()
    x = torch.randn(3)
    jm = thunder_rs.jit(model)
    for _ in range(2):
        torch.testing.assert_close(jm(x), eager(x), rtol=0, atol=0)
    assert model.calls == eager.calls == 2
    misses, walks = thunder_rs.compile_stats(jm).cache_misses, walked.count(_Held.cfg.fget.__code__)
    model._cfg = eager._cfg = types.SimpleNamespace(scale=3.0)  # (read through the getter: recompiles)
    torch.testing.assert_close(jm(x), eager(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jm).cache_misses == misses + 1
    assert walked.count(_Held.cfg.fget.__code__) == walks > 0


def test_module_writes_are_looked_for_among_changed_attributes(monkeypatch):
    # After tracing, the clones' attributes are compared with the modules' by identity in C: the
    # per-attribute check runs for the one the forward wrote (``calls``), not for each of the
    # some 20 attributes of each module; the write is replayed on every call, as eager makes it.
    from thunder_rs.core.state import modules

    checked = []
    stood_in_for = modules.stood_in_for

    def counted(value):
        checked.append(value)
        return stood_in_for(value)

    monkeypatch.setattr(modules, "stood_in_for", counted)
    model, eager = nn.Sequential(_Held(), _Held(), nn.Linear(3, 3)), nn.Sequential(_Held(), _Held(), nn.Linear(3, 3))
    eager.load_state_dict(model.state_dict())
    x = torch.randn(2, 3)
    jm = thunder_rs.jit(model)
    for _ in range(3):
        torch.testing.assert_close(jm(x), eager(x), rtol=0, atol=0)
    assert [m.calls for m in model[:2]] == [m.calls for m in eager[:2]] == [3, 3]
    # (two checks per module that wrote, per compile: ``calls`` is a guarded int, compiled again once)
    assert 0 < len(checked) <= 4 * thunder_rs.compile_stats(jm).cache_misses


def _viewing(k: int):
    def program(x):
        shape, out = [2, 12], []
        for i in range(k):
            out.append(x.view(shape)[:, i:].transpose(0, 1).unflatten(0, (-1, 1)))
        shape[0] = 3  # (after the views: their replays take the list as it was)
        return out

    return program


def test_view_ops_copy_their_arguments_without_torchs_pytree(monkeypatch):
    # Each view op of the trace keeps a copy of its arguments for its replay on real tensors
    # (``PrimStep.call``): made directly, not by torch's ``tree_map`` (some 250 Python lines a
    # view op, a tenth of a warm GPT-2 compile's). The views and their grads are eager's.
    from torch.utils import _pytree

    flattened = []  # (a count: the trees hold the trace's proxies, which must not outlive it)
    flatten = _pytree.tree_flatten

    def counted(tree, is_leaf=None):
        flattened.append(None)
        return flatten(tree, is_leaf=is_leaf)

    monkeypatch.setattr(_pytree, "tree_flatten", counted)
    counts = []
    for k in (1, 6):
        x = torch.randn(4, 6, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        before = len(flattened)
        got, want = thunder_rs.jit(_viewing(k))(x), _viewing(k)(xe)
        counts.append(len(flattened) - before)
        assert [type(g.grad_fn).__name__ for g in got] == [type(w.grad_fn).__name__ for w in want]
        for g, w in zip(got, want):
            assert torch.equal(g, w) and g.stride() == w.stride()
        torch.autograd.backward(got, [torch.ones_like(w) for w in want])
        torch.autograd.backward(want, [torch.ones_like(w) for w in want])
        assert torch.equal(x.grad, xe.grad)
    assert counts[0] == counts[1]


def test_the_tree_walks_are_torchs():
    # ``core.base.trees``' tree_map and tree_leaves (view ops' argument copies, fallbacks, the
    # acquisition's walks) answer as torch's: the same leaves in order, the same containers made
    # anew by each node's own unflatten (a torch.Size becomes a tuple), is_leaf asked first.
    import collections

    from torch.utils import _pytree
    from transformers.modeling_outputs import BaseModelOutput

    from thunder_rs.core.base import trees
    from thunder_rs.core.base.proxies import SymbolicSize

    Pair = collections.namedtuple("Pair", "a b")
    leaf = torch.ones(2)
    cases = [
        ((2, 3), {"dim": -1}),
        ([1, [2, (3,)]], {"size": torch.Size([4, 5]), "dtype": torch.float16, "z": None}),
        (slice(1, None), Ellipsis, None, "x", 2.5, True, leaf, torch.device("cpu"), torch.contiguous_format),
        (Pair(1, [2]), collections.OrderedDict(a=[1]), collections.defaultdict(list, b=(2,))),
        (torch.max(torch.ones(2, 2), 0), collections.deque([1, (2,)]), SymbolicSize([3, 4])),
        ({"b": 1, "a": [leaf]}, BaseModelOutput(last_hidden_state=leaf, hidden_states=(leaf,))),
        ([], (), {}, nn.Parameter(torch.ones(1))),
    ]

    def same(a, b):
        assert type(a) is type(b)
        if isinstance(a, (tuple, list, collections.deque)) and type(a) is not SymbolicSize:
            assert len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        elif isinstance(a, dict):
            assert list(a) == list(b) and all(same(a[k], b[k]) for k in a)
            assert getattr(a, "default_factory", None) is getattr(b, "default_factory", None)
        else:
            assert a is b
        return True

    seen: list = []

    def mark(x):
        seen.append(x)
        return ("leaf", x) if isinstance(x, int) else x

    is_size = lambda x: type(x) is torch.Size  # noqa: E731
    for tree in cases:
        for is_leaf in (None, is_size):
            ours, theirs = trees.tree_leaves(tree, is_leaf), _pytree.tree_leaves(tree, is_leaf=is_leaf)
            assert len(ours) == len(theirs) and all(x is y for x, y in zip(ours, theirs))
            seen.clear()
            mapped = trees.tree_map(mark, tree, is_leaf)
            order, seen[:] = list(seen), []
            assert same(mapped, _pytree.tree_map(mark, tree, is_leaf=is_leaf))
            assert len(order) == len(seen) and all(x is y for x, y in zip(order, seen))
        copied = trees.tree_map(lambda x: x, tree)
        assert copied is not tree and all(c is not t for c, t in zip(copied, tree) if isinstance(t, (list, dict)))


def _held_in_a_tuple(x):
    return x * _SCALES[0] + _SCALES[1]


_SCALES = (2.0, 0.5)


def test_a_tuple_of_state_holding_no_objects_of_the_users_classes_parses_no_source(monkeypatch):
    # A tuple of state read by the program is looked at for objects of the user's classes, which
    # are guarded whole with the line that read the tuple (``userframe.read_site``: it parses the
    # reading function's whole file, 7% of an HF GPT-2 compile). A tuple of numbers holds none:
    # the file is not parsed. The outputs, and the guard on the tuple's items, are eager's.
    from thunder_rs.core.state import containers

    sites = []
    read_site = containers.read_site
    monkeypatch.setattr(containers, "read_site", lambda *a: sites.append(a) or read_site(*a))
    jfn = thunder_rs.jit(_held_in_a_tuple)
    x = torch.randn(3)
    assert torch.equal(jfn(x), _held_in_a_tuple(x))
    assert sites == []
    monkeypatch.setattr(sys.modules[__name__], "_SCALES", (3.0, 0.5))
    assert torch.equal(jfn(x), _held_in_a_tuple(x))


_READS_THE_CLASS = """
def is_float(v):
    return type(v) is float


def program(x):
    s = float(x.shape[0])
    return x * s, is_float(0.5)
"""


def _imported(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_int_and_float_scan_reads_a_modules_code_from_its_bytecode_cache(tmp_path, monkeypatch):
    # The modules whose code only calls ``int`` and ``float`` are found by reading all their code
    # (``program_builtins._scan``): from the bytecode cache where it holds the source as it is now
    # (48 ms of compiling transformers' modeling_utils.py again, 6 ms read), else compiled.
    from thunder_rs.core.lang import program_builtins

    path = tmp_path / "compile_costs_cached.py"
    path.write_text(_READS_THE_CLASS)
    py_compile.compile(str(path), cfile=importlib.util.cache_from_source(str(path)), doraise=True)
    module = _imported(path)
    compiled = []
    counted = lambda *a, **k: compiled.append(a) or compile(*a, **k)  # noqa: E731
    monkeypatch.setattr(program_builtins, "compile", counted, raising=False)
    cached = program_builtins._scan(vars(module))
    assert cached is not None and compiled == []
    path.write_text(_READS_THE_CLASS + "\n")  # (the cache is stale now: the source is compiled)
    assert program_builtins._scan(vars(module)) == cached and len(compiled) == 1


@pytest.mark.parametrize("changed", ["mtime", "size"])
def test_a_stale_bytecode_cache_is_not_read_by_the_int_and_float_scan(tmp_path, changed):
    # The bytecode cache of an earlier source, where ``is_float`` read the class ``int`` (the same
    # bytecode, another name), differs from the source now in its modification time or its size:
    # it is not read (as ``import`` does not). Read, it would have the module only call ``float``,
    # and ``is_float(0.5)`` would see a stand-in for it: False, where eager's is True.
    path = tmp_path / f"compile_costs_stale_{changed}.py"
    earlier = _READS_THE_CLASS.replace("is float", "is int  " if changed == "mtime" else "is int")
    path.write_text(earlier)
    os.utime(path, (1_000_000_000, 1_000_000_000))
    py_compile.compile(str(path), cfile=importlib.util.cache_from_source(str(path)), doraise=True)
    cached = pathlib.Path(importlib.util.cache_from_source(str(path))).read_bytes()
    path.write_text(_READS_THE_CLASS)
    os.utime(path, (1_000_000_000 + (changed == "mtime") * 10,) * 2)
    module = _imported(path)
    pathlib.Path(importlib.util.cache_from_source(str(path))).write_bytes(cached)  # (the import may write its own)
    jfn = thunder_rs.jit(module.program)
    for T in (3, 5, 7):
        x = torch.randn(T, 2)
        got, want = jfn(x), module.program(x)
        assert torch.equal(got[0], want[0]) and got[1] is want[1] is True
    assert "float" not in vars(module)
