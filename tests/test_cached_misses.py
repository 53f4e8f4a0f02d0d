"""Functions cached by ``functools.lru_cache`` that miss their cache while a program is traced
(``core.state.cached_reads``): causal masks, rotary tables and position ids keyed by a length.

Eager runs the function on a miss and keeps the real tensor in the cache; later calls with that
length get the same tensor object. The traced call runs it the same way, outside the trace (a
symbolic length specialised first), and holds the result as it holds one found in the cache. Each
test compares with eager PyTorch: outputs, gradients, the caches' contents, their identity and
their ``cache_info()`` counts, after ``cache_clear()`` and evictions too."""

import functools

import pytest
import torch
from torch import nn

import thunder_rs
from test_state_caches import _line_of
from thunder_rs.errors import ThunderNotImplementedError


def _masks():
    """A cached causal mask and a program using it by the input's length, and by a constant one."""

    @functools.lru_cache
    def mask(n):
        return torch.ones(n, n).tril()

    def program(x):
        return x @ mask(x.shape[-1]) + mask(2).sum()

    return mask, program


def _run_like_eager(sizes, make=_masks, dynamic=None, between=None):
    """Runs ``make()``'s program jitted and a second one eagerly on inputs of ``sizes`` (``between``:
    a step run on both caches where a size is None), comparing outputs, caches and their counts."""
    (jcached, jprogram), (cached, program) = make(), make()
    jfn = thunder_rs.jit(jprogram, dynamic=dynamic)
    for n in sizes:
        if n is None:
            between(jcached), between(cached)
            continue
        x = torch.randn(2, n)
        torch.testing.assert_close(jfn(x), program(x), rtol=0, atol=0)
        assert jcached.cache_info() == cached.cache_info()
        kept = jcached(n)
        assert torch.equal(kept, cached(n)) and jcached(n) is kept and cached(n) is not kept
        assert jcached.cache_info() == cached.cache_info()  # (both were called again)
    return jfn, jcached


@pytest.mark.parametrize("dynamic", [None, pytest.param(True, marks=pytest.mark.slow), False])
def test_a_cached_mask_that_misses_on_each_new_length_is_computed_as_in_eager(dynamic):
    # Refused on the first call (its cache cleared): the miss ran in the trace, and the cache would
    # have kept the trace's stand-in. Each new length now compiles once (a symbolic length is
    # specialised, as torch.compile does for a value it passes to a function it cannot trace).
    jfn, _ = _run_like_eager((3, 4, 5, 3, 6, 4, 5), dynamic=dynamic)
    assert thunder_rs.compile_stats(jfn).cache_misses == 4


def test_the_tensor_a_miss_stores_is_the_one_later_calls_use():
    mask, program = _masks()
    jfn = thunder_rs.jit(program)
    x = torch.randn(2, 3)
    jfn(x)
    first = mask(3)
    assert type(first) is torch.Tensor and torch.equal(first, torch.ones(3, 3).tril())
    first.mul_(2)  # (eager's later calls read the tensor kept: so do the compiled ones)
    torch.testing.assert_close(jfn(x), program(x), rtol=0, atol=0)
    assert mask(3) is first


@pytest.mark.parametrize("step", ["cache_clear", "eviction"])
def test_a_cleared_or_evicted_cache_is_filled_again_as_in_eager(step):
    def bounded():
        @functools.lru_cache(maxsize=2)
        def mask(n):
            return torch.ones(n, n).tril()

        return mask, lambda x: x @ mask(x.shape[-1])

    between = (lambda m: m.cache_clear()) if step == "cache_clear" else (lambda m: (m(7), m(8)))
    jfn, mask = _run_like_eager((3, 4, None, 4, 3, None, 3, 4), bounded, between=between)
    assert mask.cache_info().currsize == 2


class _Rotary(nn.Module):
    """A rotary embedding whose tables come from cached helpers: a staticmethod of the class keyed
    by the length and the device, and a module-level one."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    @staticmethod
    @functools.lru_cache
    def freqs(seq_len, device):
        inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, device=device).float() / 8))
        return torch.outer(torch.arange(seq_len, device=device).float(), inv)

    def forward(self, x):
        f = self.freqs(x.shape[1], x.device)
        cos, sin = torch.cat([f.cos(), f.cos()], -1), torch.cat([f.sin(), f.sin()], -1)
        h = self.proj(x)
        rotated = torch.cat([-h[..., 4:], h[..., :4]], -1)
        return (h * cos + rotated * sin) * _positions(x.shape[1]).to(x.device).float().unsqueeze(-1)


@functools.lru_cache
def _positions(n):
    return torch.arange(n)


def _train(model, inputs) -> tuple:
    """Losses and gradients of each step, and the helpers' ``cache_info()`` after each."""
    _Rotary.freqs.cache_clear(), _positions.cache_clear()
    found = []
    for x in inputs:
        model.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        found.append((loss.detach(), grads, _Rotary.freqs.cache_info(), _positions.cache_info()))
    return found


def test_training_with_cached_tables_matches_eager_gradients():
    torch.manual_seed(0)
    model, reference = _Rotary(), _Rotary()
    reference.load_state_dict(model.state_dict())
    inputs = [torch.randn(2, n, 8) for n in (3, 5, 4, 5, 3)]
    jitted = _train(thunder_rs.jit(model), inputs)
    for (loss, grads, *counts), (expected, eager_grads, *eager_counts) in zip(jitted, _train(reference, inputs)):
        torch.testing.assert_close(loss, expected, rtol=0, atol=0)
        for grad, eager_grad in zip(grads, eager_grads):
            torch.testing.assert_close(grad, eager_grad, rtol=0, atol=0)
        assert counts == eager_counts


@pytest.mark.gpu
def test_on_cuda_training_with_cached_tables_matches_eager_gradients():
    """The GPU twin: the tables a miss makes on the input's CUDA device (run eagerly in the middle
    of the trace), held by the trace and checked per call, with the default executors; the module
    level positions made on the CPU and moved. nvFuser's regions round as its kernels do."""
    torch.manual_seed(0)
    model, reference = _Rotary().cuda(), _Rotary().cuda()
    reference.load_state_dict(model.state_dict())
    inputs = [torch.randn(2, n, 8, device="cuda") for n in (3, 5, 4, 5, 3)]
    jitted = _train(thunder_rs.jit(model), inputs)
    for (loss, grads, *counts), (expected, eager_grads, *eager_counts) in zip(jitted, _train(reference, inputs)):
        torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
        for grad, eager_grad in zip(grads, eager_grads):
            torch.testing.assert_close(grad, eager_grad, rtol=1e-5, atol=1e-6)
        assert counts == eager_counts


def _mutating():
    @functools.lru_cache
    def table(n):
        return torch.ones(n)

    def program(x):
        t = table(x.shape[-1])
        t.mul_(2)  # eager doubles the tensor it keeps on each call
        return x * t

    return table, program


def test_a_cached_tensor_the_program_changes_in_place_changes_as_in_eager():
    _run_like_eager((3, 3, 4, 3, 4), _mutating)


@functools.lru_cache
def _noise(n):
    return torch.randn(n)


_WEIGHT = torch.randn(3, requires_grad=True)


@functools.lru_cache
def _scaled_weight(k):
    return _WEIGHT * k


def _draws(x):
    return x + _noise(x.shape[-1])  # the noise


def _graph(x):
    return x + _scaled_weight(2)  # the weight


@pytest.mark.parametrize("program", [_draws, _graph], ids=["draws", "autograd_history"])
def test_a_miss_whose_result_a_trace_cannot_hold_is_refused_naming_the_line(program):
    # A draw would shift the trace's own; a result with an autograd history would be held as a
    # leaf where eager's backward reaches the tensors it came from.
    cached, marker = (_noise, "# the noise") if program is _draws else (_scaled_weight, "# the weight")
    cached.cache_clear()
    x = torch.randn(3)
    state = torch.get_rng_state()
    with pytest.raises(
        ThunderNotImplementedError, match=rf"{cached.__name__}, cached by .* called at .*:{_line_of(marker, __file__)} "
    ):
        thunder_rs.jit(program)(x)
    assert cached.cache_info().currsize == 0 and torch.equal(torch.get_rng_state(), state)


@functools.lru_cache
def _doubled(t):
    return t * 2


def test_a_miss_keyed_by_a_traced_tensor_is_still_refused():
    # (Its key would keep the trace's stand-in.)
    _doubled.cache_clear()
    with pytest.raises(ThunderNotImplementedError, match="_doubled, cached by functools.lru_cache, is called at"):
        thunder_rs.jit(lambda x: _doubled(x) + 1)(torch.randn(3))
    assert _doubled.cache_info().currsize == 0


@functools.lru_cache
def _fib(n):
    return torch.ones(1) if n < 2 else _fib(n - 1) + _fib(n - 2)


def test_a_cached_function_calling_itself_on_a_miss_counts_as_in_eager():
    # Its inner calls run as eager runs them; the compiled calls make the outer call only.
    def program(x):
        return x * _fib(x.shape[-1])

    _fib.cache_clear()
    jfn = thunder_rs.jit(program)
    for n in (5, 5, 6):
        jfn(torch.ones(n))
    jitted = _fib.cache_info()
    _fib.cache_clear()
    for n in (5, 5, 6):
        program(torch.ones(n))
    assert jitted == _fib.cache_info()


class _RopeTables:
    """A helper object a module holds, whose method is cached by functools (keyed by the object)."""

    def __init__(self, base):
        self.base = base

    @functools.lru_cache  # noqa: B019 (the construct under test)
    def table(self, n):
        return torch.arange(n, dtype=torch.float32) / self.base


class _WithTables(nn.Module):
    def __init__(self):
        super().__init__()
        self.tables = _RopeTables(10.0)

    def forward(self, x):
        return x * self.tables.table(x.shape[0])


def test_a_cached_method_of_an_object_the_module_holds_misses_as_in_eager():
    # Its miss ran in the trace (refused, at "an unknown line"); keyed by the object the module
    # holds, it runs as eager runs it, and its class's method is the cached function again after.
    _RopeTables.table.cache_clear()
    model = _WithTables()
    jmodel, counts = thunder_rs.jit(model), []
    for n in (3, 4, 3, 5):
        x = torch.randn(n)
        torch.testing.assert_close(jmodel(x), model(x), rtol=0, atol=0)
        counts.append(_RopeTables.table.cache_info()[:2])
    assert counts == [(1, 1), (2, 2), (4, 2), (5, 3)]  # (each size missed once, by the jitted call)
    assert type(vars(_RopeTables)["table"]) is functools._lru_cache_wrapper


def test_a_miss_under_a_fake_tensor_mode_runs_as_in_eager():
    """A program run under the caller's ``FakeTensorMode`` (shapes and dtypes without data; HF's
    loss function is such a cached function): a miss ran eagerly, then compared the random
    generators' real states under that mode, which refuses real tensors (AssertionError)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: PLC0415

    (jcached, jprogram), (cached, program) = _masks(), _masks()
    with FakeTensorMode():
        x = torch.randn(3, 4)
        actual, expected = thunder_rs.jit(jprogram)(x), program(x)
    assert isinstance(actual, FakeTensor)
    assert (actual.dtype, actual.shape, actual.stride()) == (expected.dtype, expected.shape, expected.stride())
    assert jcached.cache_info() == cached.cache_info()
