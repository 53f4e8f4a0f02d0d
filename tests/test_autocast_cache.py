"""Autocast's cache of casts, against eager PyTorch.

Inside ``torch.autocast`` eager casts a float32 leaf that requires grad (a parameter, an input leaf;
not a view) to the autocast dtype once per autocast region (``at::autocast::cached_cast``), while
``cache_enabled``: every op of the region reads that one cast, so the backward sums the uses'
gradients in the autocast dtype and casts the sum to float32 once. The cache is cleared as the
outermost region is left. Each test runs a program eagerly and compiled from the same state and
compares outputs, gradients and the bytes saved for the backward, bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import thunder_rs

BF16 = torch.bfloat16


def _saved_bytes_of(fn, *args):
    """``fn(*args)`` and the bytes of the distinct tensors its backward saves."""
    seen: set = set()

    def pack(t):
        seen.add((t.untyped_storage().data_ptr(), t.dtype, t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, sum(n for _, _, n in seen)


def _run(program, module, make_inputs, around: bool):
    """Outputs, gradients of the module's parameters and of the inputs, and saved bytes."""
    inputs = make_inputs()
    call = program
    if around:

        def call(*args):
            with torch.autocast("cpu", dtype=BF16):
                return program(*args)

    out, saved = _saved_bytes_of(call, *inputs)
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.float().sum() for o in outs if o.requires_grad).backward()
    leaves = list(module.parameters()) + [x for x in inputs if x.is_leaf and x.requires_grad]
    return outs, [p.grad for p in leaves], saved


def assert_matches_eager(make_module, forward, make_inputs, around=True):
    """``forward(module, *inputs)`` eager and compiled: outputs and gradients equal, and the compiled
    call saves no more bytes for the backward."""
    torch.manual_seed(0)
    module = make_module()
    twin = copy.deepcopy(module)
    eager = _run(lambda *a: forward(module, *a), module, make_inputs, around)
    compiled = _run(thunder_rs.jit(lambda *a: forward(twin, *a)), twin, make_inputs, around)
    for a, e in zip(compiled[0], eager[0], strict=True):
        assert a.dtype == e.dtype and torch.equal(a, e)
    for a, e in zip(compiled[1], eager[1], strict=True):
        assert (a is None) == (e is None)
        assert e is None or (a.dtype == e.dtype and torch.equal(a, e))
    assert compiled[2] <= eager[2]  # (fewer where its casts that eager does not cache are one value)


def _inputs(*shapes, requires_grad=False):
    def make():
        torch.manual_seed(1)
        return [torch.randn(s).requires_grad_(requires_grad) for s in shapes]

    return make


class _Weight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.lin = nn.Linear(8, 8)


def _loop(m, x):  # an RNN cell, or one block applied again and again
    for _ in range(3):
        x = torch.tanh(m.lin(x))
    return x


def _tied(m, x):  # one weight in two matmuls (tied embeddings, ALBERT's shared layers)
    return F.linear(torch.tanh(F.linear(x, m.w)), m.w)


def _two_linears(m, x):  # an input leaf that requires grad, cast once for both
    return m.lin(x) * F.linear(x, m.w)


@pytest.mark.parametrize("around", [True, False], ids=["around", "inside"])
@pytest.mark.parametrize("forward", [_loop, _tied, _two_linears], ids=["loop", "tied", "input_leaf"])
def test_a_leaf_is_cast_once_per_region(forward, around):
    def program(m, x):
        if around:
            return forward(m, x)
        with torch.autocast("cpu", dtype=BF16):
            return forward(m, x)

    assert_matches_eager(_Weight, program, _inputs((4, 8), requires_grad=True), around)


def test_a_module_applied_in_a_loop_matches_eager():
    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return _loop(self, x)

    assert_matches_eager(Cell, lambda m, x: m(x), _inputs((4, 8)))


def _not_a_leaf(m, a):  # eager caches no cast of a tensor that is not a leaf
    x = a * 2
    return F.linear(F.linear(x, m.w), x)


def _no_cache(m, x):
    with torch.autocast("cpu", dtype=BF16, cache_enabled=False):
        return F.linear(torch.tanh(F.linear(x, m.w)), m.w)


def _two_regions(m, x):  # the outermost region left clears the cache
    with torch.autocast("cpu", dtype=BF16):
        h = F.linear(x, m.w)
    with torch.autocast("cpu", dtype=BF16):
        return F.linear(h.float(), m.w)


def _nested(m, x):  # nested regions share the outer region's cache; one without caching does not
    with torch.autocast("cpu", dtype=BF16):
        h = F.linear(x, m.w)
        with torch.autocast("cpu", enabled=False):
            h = torch.tanh(h.float())
            with torch.autocast("cpu", dtype=BF16):
                h = F.linear(h, m.w)
        with torch.autocast("cpu", dtype=BF16, cache_enabled=False):
            h = F.linear(h, m.w)
        return F.linear(h, m.w)


def _view(m, x):  # a view of a leaf is no leaf: its casts are not cached
    w = m.w[:, :]
    return F.linear(F.linear(x, w), w)


def _no_grad_first(m, x):  # cast under no_grad, cached with its gradient for the uses after it
    with torch.no_grad():
        F.linear(x, m.w)
    return F.linear(F.linear(x, m.w), m.w)


@pytest.mark.parametrize(
    "forward, around",
    [(_not_a_leaf, True), (_no_cache, False), (_two_regions, False), (_nested, False), (_view, True)]
    + [(_no_grad_first, True)],
    ids=["not_a_leaf", "cache_disabled", "two_regions", "nested", "view", "no_grad_first"],
)
def test_the_cache_applies_where_eager_s_does(forward, around):
    assert_matches_eager(_Weight, forward, _inputs((4, 8), requires_grad=True), around)


def test_a_leaf_that_is_a_view_is_cast_per_use():
    def make():
        torch.manual_seed(1)
        return [torch.randn(4, 8), torch.randn(8, 16)[:, :8].requires_grad_()]

    def program(m, x, w):
        assert w.is_leaf
        return F.linear(torch.tanh(F.linear(x, w)), w)

    assert_matches_eager(nn.Module, program, make)


def test_a_weight_that_requires_no_grad_is_cast_per_use():
    def make():
        m = _Weight()
        m.w.requires_grad_(False)
        return m

    assert_matches_eager(make, _tied, _inputs((4, 8), requires_grad=True))


def test_an_inner_region_of_another_dtype_reads_the_outer_cast():
    """Eager's cache is keyed by the tensor alone: the float16 region reads the bfloat16 cast."""

    def program(w, x):
        with torch.autocast("cpu", dtype=BF16):
            h = F.linear(x, w)
            with torch.autocast("cpu", dtype=torch.float16):
                return h, torch.mm(w, w)

    w, x = torch.randn(8, 8, requires_grad=True), torch.randn(4, 8)
    expected = program(w, x)
    actual = thunder_rs.jit(program)(w, x)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and torch.equal(a, e)


class _ToCopies(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._to_copy.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("low", [torch.float16, BF16])
def test_cuda_autocast_casts_a_leaf_once(low):
    """CUDA's autocast caches as the CPU's: traced on fake CUDA tensors, the weight tied into two
    matmuls is cast as often as eager casts it."""

    def program(w, x):
        return F.linear(torch.tanh(F.linear(x, w)), w)

    mode = FakeTensorMode()
    with mode:
        w, x = torch.empty(8, 8, device="cuda", requires_grad=True), torch.empty(4, 8, device="cuda", dtype=low)
    jfn = thunder_rs.jit(program)
    was, previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", low)
    torch.autocast_increment_nesting()
    try:
        with _ToCopies() as copies, mode:
            program(w, x)
        torch.clear_autocast_cache()
        with mode:
            jfn(w, x)
    finally:
        torch.autocast_decrement_nesting()
        torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", was)
        torch.set_autocast_dtype("cuda", previous)
    trace = thunder_rs.last_traces(jfn)[0]
    # (inside a region entered before the call, the weight's cast is torch's cached one, an input)
    assert str(trace).count("convert_element_type") + trace.num_inputs - 2 == copies.count


def test_switching_the_cache_recompiles():
    """A trace made with the cache off does not serve a call with it on, nor the other way round:
    the program's own region inherits the caller's ``cache_enabled``."""

    def program(w, x):
        with torch.autocast("cpu", dtype=BF16):
            return F.linear(torch.tanh(F.linear(x, w)), w)

    w, x = torch.randn(8, 8, requires_grad=True), torch.randn(4, 8)
    jfn = thunder_rs.jit(program)
    for cache in (False, True, False):
        grads = []
        for fn in (program, jfn):
            w.grad = None
            with torch.autocast("cpu", dtype=BF16, cache_enabled=cache):
                out = fn(w, x)
            out.float().sum().backward()
            grads.append(w.grad)
        assert torch.equal(grads[1], grads[0])
    assert "torch.is_autocast_cache_enabled() changed from False to True" in thunder_rs.compile_stats(jfn).miss_reasons


def test_autocast_state_key_is_torchs_modes_and_shared_between_calls():
    """The autocast part of a compiled call's cache key (``autocast.state``) is torch's modes in
    every region form (nested, disabled, another dtype) and one object per dtype pair, which the
    calls of a region read without making a new one; a model compiled once hits across regions of
    one dtype and recompiles for another, its outputs and gradients eager's bit for bit."""
    from thunder_rs.core.lang import autocast

    def torchs():
        dtypes = [torch.get_autocast_dtype(d) if torch.is_autocast_enabled(d) else None for d in ("cpu", "cuda")]
        return None if dtypes == [None, None] else tuple(dtypes)

    assert autocast.state() is None
    with torch.autocast("cpu", dtype=BF16):
        first = autocast.state()
        assert first == torchs() == (BF16, None) and autocast.state() is first
        with torch.autocast("cpu", enabled=False):
            assert autocast.state() is None and torchs() is None
        with torch.autocast("cpu", dtype=torch.float16):
            assert autocast.state() == torchs() == (torch.float16, None)
        assert autocast.state() is first
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    twin = copy.deepcopy(model)
    jm = thunder_rs.jit(twin)
    x = torch.randn(4, 8)
    for dtype in (BF16, BF16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            want, got = model(x), jm(x)
        want.float().sum().backward()
        got.float().sum().backward()
        assert got.dtype == want.dtype and torch.equal(got, want)
        for p, q in zip(model.parameters(), twin.parameters()):
            assert torch.equal(p.grad, q.grad)
    assert (thunder_rs.cache_hits(jm), thunder_rs.cache_misses(jm)) == (1, 2)
