"""Grad mode, autocast and the random number generator are trace state: against eager PyTorch.

Each test runs a program eagerly and compiled, from the same starting state (inputs, seed,
modes), and compares outputs, gradients, parameters and the generator's state afterwards.
"""

from __future__ import annotations

import copy
import sys
import threading
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError

FLOATS = (torch.float32, torch.float64)
LOW = (torch.bfloat16, torch.float16)


def leaf(shape, dtype, requires_grad=True, seed=0):
    torch.manual_seed(seed)
    return torch.randn(shape, dtype=dtype).requires_grad_(requires_grad)


def grads_of(fn, *inputs):
    """``fn(*inputs)``'s outputs and the gradients of the sum of its first output."""
    for x in inputs:
        x.grad = None
    out = fn(*inputs)
    first = out[0] if isinstance(out, tuple) else out
    first.sum().backward()
    return out, [None if x.grad is None else x.grad.clone() for x in inputs]


def assert_grads_match(fn, *inputs):
    expected, expected_grads = grads_of(fn, *inputs)
    actual, actual_grads = grads_of(thunder_rs.jit(fn), *inputs)
    torch.testing.assert_close(actual, expected)
    for a, e in zip(actual_grads, expected_grads, strict=True):
        assert (a is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(a, e)
    return actual


# -- grad mode -------------------------------------------------------------------------------------

NO_GRAD_CONTEXTS = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "set_grad_enabled": lambda: torch.set_grad_enabled(False),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("context", NO_GRAD_CONTEXTS)
def test_no_grad_block_stops_gradients(context, dtype):
    def fn(x):
        with NO_GRAD_CONTEXTS[context]():
            y = x * 3
        return x * 2 + y

    x = leaf((4,), dtype)
    assert_grads_match(fn, x)
    torch.testing.assert_close(x.grad, torch.full((4,), 2.0, dtype=dtype))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("context", NO_GRAD_CONTEXTS)
def test_no_grad_decorator_on_a_helper(context, dtype):
    @NO_GRAD_CONTEXTS[context]()
    def frozen(x):
        return x.sin() * x

    def fn(x, w):
        return (frozen(x) + x * w).sum(), frozen(w)

    x, w = leaf((3, 4), dtype), leaf((3, 4), dtype, seed=1)
    out = assert_grads_match(fn, x, w)
    assert not out[1].requires_grad


@pytest.mark.parametrize("dtype", FLOATS)
def test_outputs_computed_under_no_grad_are_not_differentiable(dtype):
    def fn(x):
        with torch.no_grad():
            frozen = x * 3
        return x * 2, frozen, frozen + 1

    x = leaf((2, 3), dtype)
    out = thunder_rs.jit(fn)(x)
    expected = fn(x)
    assert [o.requires_grad for o in out] == [o.requires_grad for o in expected] == [True, False, False]
    assert out[1].grad_fn is None


@pytest.mark.parametrize("dtype", FLOATS)
def test_no_grad_only_program_returns_tensors_that_require_no_grad(dtype):
    def fn(x):
        with torch.no_grad():
            return x.exp() * 2

    x = leaf((3,), dtype)
    out = thunder_rs.jit(fn)(x)
    assert not out.requires_grad and out.grad_fn is None
    torch.testing.assert_close(out, fn(x))
    assert thunder_rs.last_backward_traces(thunder_rs.jit(fn)) == []


@pytest.mark.parametrize("dtype", FLOATS)
def test_enable_grad_inside_a_call_under_no_grad(dtype):
    def fn(x, w):
        with torch.enable_grad():
            y = (x * w).sin()
        return y, x * 2

    x, w = leaf((3,), dtype), leaf((3,), dtype, seed=1)
    jfn = thunder_rs.jit(fn)
    with torch.no_grad():
        expected, actual = fn(x, w), jfn(x, w)
    assert [o.requires_grad for o in actual] == [o.requires_grad for o in expected] == [True, False]
    torch.testing.assert_close(actual, expected)
    expected[0].sum().backward()
    expected_grads = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    actual[0].sum().backward()
    torch.testing.assert_close((x.grad, w.grad), expected_grads)


@pytest.mark.parametrize("dtype", FLOATS)
def test_nested_grad_contexts(dtype):
    def fn(x):
        with torch.no_grad():
            a = x * 2
            with torch.enable_grad():
                b = x * a
                with torch.set_grad_enabled(False):
                    c = b * 5
            d = b + c
        return x * a + b * c + d

    assert_grads_match(fn, leaf((5,), dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_cse_keeps_a_no_grad_call_apart_from_the_same_call_with_grad(dtype):
    def fn(x):
        with torch.no_grad():
            frozen = x * 3
        live = x * 3
        return frozen + live

    x = leaf((4,), dtype)
    assert_grads_match(fn, x)
    torch.testing.assert_close(x.grad, torch.full((4,), 3.0, dtype=dtype))


def test_grad_rules_do_not_run_under_no_grad():
    def fn(x):
        with torch.no_grad():
            return F.gelu(x).softmax(-1)

    jfn = thunder_rs.jit(fn)
    jfn(leaf((2, 3), torch.float32))
    names = thunder_rs.last_traces(jfn)[0].all_symbol_names()
    assert "ltorch.gelu" in names and not any("backward" in n for n in names)


class _Teacher(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4)).to(dtype)

    def forward(self, x):
        return self.net(x)


class _Distill(nn.Module):
    """A student trained against a teacher called under no_grad (its parameters require grad)."""

    def __init__(self, dtype):
        super().__init__()
        self.teacher = _Teacher(dtype)
        self.student = nn.Sequential(nn.Linear(6, 4)).to(dtype)

    def forward(self, x):
        with torch.no_grad():
            target = self.teacher(x).softmax(-1)
        return F.mse_loss(self.student(x).softmax(-1), target)


@pytest.mark.parametrize("dtype", FLOATS)
def test_frozen_teacher_under_no_grad_gets_no_gradient_and_does_not_drift(dtype):
    torch.manual_seed(0)
    eager = _Distill(dtype)
    model = copy.deepcopy(eager)
    jmodel = thunder_rs.jit(model)
    x = torch.randn(5, 6, dtype=dtype)
    teacher_before = [p.detach().clone() for p in model.teacher.parameters()]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (eager, model)]
    for _ in range(3):
        for run, opt in zip((eager, jmodel), optimizers):
            opt.zero_grad()
            run(x).backward()
            opt.step()
    assert all(p.grad is None for p in model.teacher.parameters())
    for p, before in zip(model.teacher.parameters(), teacher_before):
        assert torch.equal(p, before)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("dtype", FLOATS)
def test_detach_and_requires_grad_on_proxies(dtype):
    def fn(x):
        y = x.detach() * 2
        z = (x * 3).detach()
        w = torch.ones(3, dtype=dtype).requires_grad_()
        v = torch.zeros(3, dtype=dtype)
        v.requires_grad = True
        return x * y + z + w * x + v, y, x.data * 4

    x = leaf((3,), dtype)
    out = assert_grads_match(fn, x)
    assert [o.requires_grad for o in out] == [True, False, False]


def test_requires_grad_errors_match_eager():
    def non_leaf(x):
        y = x * 2
        y.requires_grad_(False)
        return y

    x = leaf((3,), torch.float32)
    with pytest.raises(RuntimeError, match="leaf variables"):
        non_leaf(x)
    with pytest.raises(ThunderRuntimeError, match="leaf variables.*test_contexts.py"):
        thunder_rs.jit(non_leaf)(x)

    def on_input(x):
        x.requires_grad_()
        return x * 2

    with pytest.raises(ThunderNotImplementedError, match="caller's tensor.*test_contexts.py"):
        thunder_rs.jit(on_input)(torch.randn(3))


# -- autocast --------------------------------------------------------------------------------------


def assert_autocast_matches(fn, *inputs, device="cpu", dtype=torch.bfloat16, grads=False):
    """``fn`` under autocast around the call, compiled against eager: dtypes exactly, values (and
    gradients when ``grads``) as close as the low precision allows."""
    jfn = thunder_rs.jit(fn)
    results = []
    for run in (fn, jfn):
        for x in inputs:
            x.grad = None
        with torch.autocast(device, dtype=dtype):
            out = run(*inputs)
        if grads:
            (out[0] if isinstance(out, tuple) else out).float().sum().backward()
        results.append((out, [x.grad for x in inputs]))
    (expected, expected_grads), (actual, actual_grads) = results
    for a, e in zip(tree_flatten(actual)[0], tree_flatten(expected)[0], strict=True):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2)
    for a, e in zip(actual_grads, expected_grads, strict=True):
        assert (a is None) == (e is None)
        if e is not None:
            assert a.dtype == e.dtype
            torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2)
    return jfn


@pytest.mark.parametrize("low", LOW)
@pytest.mark.parametrize("dtype", FLOATS)
def test_autocast_inside_the_function(low, dtype):
    def fn(x, w):
        with torch.autocast("cpu", dtype=low):
            y = x @ w
            z = F.linear(x, w).relu()
        return y, z, y.float() + 1

    x, w = leaf((4, 4), dtype, False), leaf((4, 4), dtype, False, seed=1)
    actual, expected = thunder_rs.jit(fn)(x, w), fn(x, w)
    assert [a.dtype for a in actual] == [e.dtype for e in expected]
    assert actual[0].dtype == (low if dtype == torch.float32 else torch.float64)
    torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("low", LOW)
def test_autocast_around_the_call_keeps_float_upcasts(low):
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)

    def fn(x):
        return F.gelu(lin(x)).float().pow(2).mean()

    jfn = assert_autocast_matches(fn, torch.randn(4, 8), dtype=low)
    with torch.autocast("cpu", dtype=low):
        assert jfn(torch.randn(4, 8)).dtype == torch.float32


def test_autocast_disabled_region_and_decorator():
    @torch.autocast("cpu", dtype=torch.bfloat16)
    def low(x, w):
        return x @ w

    def fn(x, w):
        with torch.autocast("cpu", enabled=False):
            exact = x @ w
        return exact, low(x, w), x @ w

    x, w = leaf((4, 4), torch.float32, False), leaf((4, 4), torch.float32, False, seed=1)
    actual, expected = thunder_rs.jit(fn)(x, w), fn(x, w)
    assert [a.dtype for a in actual] == [e.dtype for e in expected] == [torch.float32, torch.bfloat16, torch.float32]
    torch.testing.assert_close(actual, expected)
    assert_autocast_matches(fn, x, w)


def test_autocast_training_gradients_have_eager_dtypes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    jmodel = thunder_rs.jit(copy.deepcopy(model))
    x, target = torch.randn(5, 8), torch.randint(0, 4, (5,))
    losses = []
    for run in (model, jmodel):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(run(x), target)
        loss.backward()
        losses.append(loss)
    assert losses[0].dtype == losses[1].dtype == torch.float32
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-2, atol=1e-2)
    for p, q in zip(jmodel._model.parameters(), model.parameters()):
        assert p.grad.dtype == q.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, q.grad, rtol=5e-2, atol=5e-2)


def test_autocast_change_recompiles_and_says_why():
    def fn(x, w):
        return x @ w

    jfn = thunder_rs.jit(fn)
    x, w = torch.randn(3, 3), torch.randn(3, 3)
    assert jfn(x, w).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert jfn(x, w).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.float16):
        assert jfn(x, w).dtype == torch.float16
    assert jfn(x, w).dtype == torch.float32
    stats = thunder_rs.compile_stats(jfn)
    assert stats.cache_misses == 3 and stats.cache_hits == 1
    assert "AutocastState(cpu=torch.bfloat16" in stats.miss_reasons[1]


@pytest.mark.parametrize("grads", [False, True])
def test_autocast_fallbacks_run_under_the_traced_autocast(grads):
    def fn(x, w):
        mixed = torch.chain_matmul(x, w)  # no decomposition: torch's autocast casts inside it
        with torch.autocast("cpu", enabled=False):
            exact = torch.chain_matmul(x, w)
        return mixed.float() + exact, mixed

    x, w = leaf((3, 4), torch.float32, grads), leaf((4, 5), torch.float32, grads, seed=1)
    assert thunder_rs.examine(fn, x, w).fallbacks
    assert_autocast_matches(fn, x, w, grads=grads)


@pytest.mark.parametrize("low", LOW)
def test_autocast_inside_reaches_fallbacks(low):
    def fn(x, w):
        with torch.autocast("cpu", dtype=low):
            mixed = torch.chain_matmul(x, w)
        return mixed, torch.chain_matmul(x, w)

    x, w = leaf((3, 4), torch.float32), leaf((4, 5), torch.float32, seed=1)
    out = assert_grads_match(fn, x, w)
    assert [o.dtype for o in out] == [low, torch.float32]


def test_autocast_leaves_float64_alone():
    def fn(x, w):
        return x @ w, F.linear(x, w)

    assert_autocast_matches(fn, leaf((3, 3), torch.float64, False), leaf((3, 3), torch.float64, False))


sys.path.insert(0, __file__.rsplit("/", 1)[0])
from opinfos import OPINFOS  # noqa: E402

SWEEP_SAMPLES = 3


def _float_ops():
    return [pytest.param(op, id=op.id) for op in OPINFOS if torch.float32 in op.dtypes]


def _same_dtypes(actual, expected, what):
    for a, e in zip(tree_flatten(actual)[0], tree_flatten(expected)[0], strict=True):
        if isinstance(e, torch.Tensor):
            assert a.dtype == e.dtype, f"{what}: dtype {a.dtype} != eager's {e.dtype}"


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("op", _float_ops())
def test_cpu_autocast_policy_matches_eager_for_every_op(op):
    """Every OpInfo's first float32 samples under CPU bfloat16 autocast: the table's policy gives
    the dtypes eager's autocast gives, for ops in the table, composites of them, and all others."""
    torch.manual_seed(0)
    for sample in list(op.sample_inputs(torch.float32, "cpu"))[:SWEEP_SAMPLES]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            try:
                torch.manual_seed(1)
                expected = op.op(*sample.args, **sample.kwargs)
            except Exception:
                continue
            torch.manual_seed(1)
            actual = thunder_rs.jit(op.op)(*sample.args, **sample.kwargs)
        _same_dtypes(actual, expected, sample)
        for a, e in zip(tree_flatten(actual)[0], tree_flatten(expected)[0]):
            if isinstance(e, torch.Tensor) and e.dtype.is_floating_point:
                torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2, equal_nan=True)


def _under_cuda_autocast(fn, dtype):
    """``fn()`` under CUDA autocast, which ``torch.autocast("cuda")`` leaves off without a GPU, so
    it is switched on directly (tracing and fake tensors run no CUDA kernel)."""
    was, previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        return fn()
    finally:
        torch.set_autocast_enabled("cuda", was)
        torch.set_autocast_dtype("cuda", previous)


#: Ops that run as an eager fallback under autocast (their decomposition would not cast inside
#: as eager's Python does): the fallback computes its dtypes under ``torch.autocast("cuda")``, which
#: torch turns off without a GPU, so only a GPU checks them (``test_multihead_attention.py``).
#: (``native_self_attention``'s sample is ``nn.MultiheadAttention``, whose fast path CUDA autocast
#: turns off: it runs ``multi_head_attention_forward``.)
_FALLBACK_UNDER_AUTOCAST = {"multi_head_attention_forward", "native_self_attention"}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("op", [p for p in _float_ops() if p.id not in _FALLBACK_UNDER_AUTOCAST])
def test_cuda_autocast_policy_matches_eager_for_every_op(op):
    """The CUDA policy, traced on proxies of fake CUDA tensors (no GPU needed): dtypes equal those
    eager's CUDA autocast gives on the same fake tensors."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            samples = list(op.sample_inputs(torch.float32, "cuda"))[:SWEEP_SAMPLES]
    except Exception:
        pytest.skip("the samples cannot be made on fake CUDA tensors")
    for sample in samples:

        def eager():
            with mode:
                return op.op(*sample.args, **sample.kwargs)

        try:
            expected = _under_cuda_autocast(eager, torch.float16)
        except Exception:
            continue

        def compiled():
            with mode:
                return thunder_rs.jit(op.op)(*sample.args, **sample.kwargs)

        _same_dtypes(_under_cuda_autocast(compiled, torch.float16), expected, sample)


def test_cuda_autocast_policy_on_a_model():
    def fn(x, w, b):
        h = F.linear(x, w, b)
        return h, h.softmax(-1), h.exp(), h.sum(), F.layer_norm(h, (4,)), torch.cat([h, x.float()[:, :4]])

    mode = FakeTensorMode()
    with mode:
        args = (torch.empty(3, 4, device="cuda"), torch.empty(4, 4, device="cuda"), torch.empty(4, device="cuda"))
    expected = _under_cuda_autocast(lambda: [t.dtype for t in fn(*args)], torch.float16)
    jfn = thunder_rs.jit(fn)

    def compiled():
        with mode:
            return [t.dtype for t in jfn(*args)]

    assert _under_cuda_autocast(compiled, torch.float16) == expected
    assert expected[:3] == [torch.float16, torch.float32, torch.float32]


# -- random number generator -----------------------------------------------------------------------


def assert_same_draws(fn, *inputs, calls=3, seed=0):
    """A sequence of calls compiled draws what eager draws, and leaves the generator where eager
    leaves it."""
    jfn = thunder_rs.jit(fn)
    torch.manual_seed(seed)
    expected = [fn(*inputs) for _ in range(calls)]
    expected_next = torch.rand(4)
    torch.manual_seed(seed)
    actual = [jfn(*inputs) for _ in range(calls)]
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert torch.equal(torch.rand(4), expected_next)
    return jfn


@pytest.mark.parametrize("dtype", FLOATS)
def test_manual_seed_inside_runs_on_every_call(dtype):
    def fn(x):
        torch.manual_seed(0)
        return x + torch.rand(3, dtype=dtype)

    jfn = assert_same_draws(fn, torch.zeros(3, dtype=dtype))
    assert "eager_manual_seed" in str(thunder_rs.last_traces(jfn)[-1])


@pytest.mark.parametrize("dtype", FLOATS)
def test_random_ops_draw_as_eager_over_calls(dtype):
    def fn(x, p):
        a = torch.rand(2, 3, dtype=dtype) + torch.randn_like(x) * torch.rand_like(x)
        b = torch.randn(3, dtype=dtype) + torch.normal(x, 1.0) + torch.normal(0.0, 2.0, size=(2, 3), dtype=dtype)
        idx = torch.randint(0, 5, (3,)) + torch.randperm(3) + torch.multinomial(p, 3)
        return a + b, idx, torch.bernoulli(p)

    assert_same_draws(fn, torch.zeros(2, 3, dtype=dtype), torch.tensor([0.2, 0.3, 0.5], dtype=dtype))


def test_unused_random_draws_still_advance_the_generator():
    def fn(x):
        torch.rand(5)
        torch.randint(0, 3, (2,))
        torch.randn_like(x)
        return x + torch.rand(3)

    jfn = assert_same_draws(fn, torch.zeros(3))
    assert str(thunder_rs.last_traces(jfn)[-1]).count("rand") >= 4


def test_equal_random_calls_are_not_merged():
    def fn(x):
        return x + torch.rand(3) - torch.rand(3)

    out = assert_same_draws(fn, torch.zeros(3))
    assert (out(torch.zeros(3)) != 0).all()


@pytest.mark.parametrize("dtype", FLOATS)
def test_generator_arguments(dtype):
    gen = torch.Generator().manual_seed(7)

    def fn(x):
        return x + torch.rand(3, generator=gen, dtype=dtype) + torch.randn(
            3, generator=gen, dtype=dtype
        ), torch.randint(0, 9, (4,), generator=gen)

    jfn = thunder_rs.jit(fn)
    x = torch.zeros(3, dtype=dtype)
    gen.manual_seed(7)
    global_state = torch.get_rng_state()
    expected = [fn(x) for _ in range(3)]
    gen.manual_seed(7)
    actual = [jfn(x) for _ in range(3)]
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert torch.equal(torch.get_rng_state(), global_state)  # the global generator was not touched


def test_rng_state_functions_and_fork_rng():
    def fn(x):
        state = torch.get_rng_state()
        a = torch.rand(3)
        torch.set_rng_state(state)
        b = torch.rand(3)
        with torch.random.fork_rng(devices=[]):
            torch.random.manual_seed(123)
            c = torch.rand(3)
        torch.cuda.manual_seed(5)
        torch.cuda.manual_seed_all(5)
        return x + a - b, c, x + torch.rand(3)

    assert_same_draws(fn, torch.zeros(3))


def test_seed_reseeds_on_every_call():
    def fn(x):
        torch.seed()
        return x + torch.rand(1)

    jfn = thunder_rs.jit(fn)
    draws = {jfn(torch.zeros(1)).item() for _ in range(4)}
    assert len(draws) == 4 and "eager_seed" in str(thunder_rs.last_traces(jfn)[-1])


def test_rng_calls_in_other_threads_are_not_recorded():
    seen = []

    def fn(x):
        thread = threading.Thread(target=lambda: seen.append(torch.manual_seed(11).initial_seed()))
        thread.start()
        thread.join()
        return x + 1

    jfn = thunder_rs.jit(fn)
    jfn(torch.zeros(2))
    assert seen == [11] and "manual_seed" not in str(thunder_rs.last_traces(jfn)[-1])


@pytest.mark.parametrize("dtype", FLOATS)
def test_random_fallbacks_differentiate_through_the_same_draws(dtype):
    """Random ops without a decomposition: the backward draws again from the generator state the
    forward started from, so gradients are eager's, and the generator ends where eager's does."""

    def fn(x, mean):
        a = F.dropout2d(x, 0.5) + F.alpha_dropout(x, 0.3, training=True)
        b = F.rrelu(x, training=True) * torch.normal(mean, 0.5)
        pooled = torch._standard_gamma((x * mean).abs() + 2.0)  # random, with no decomposition
        return (a * b).sum() + pooled.sum(), torch.normal(mean, 2.0, generator=gen)

    gen = torch.Generator().manual_seed(3)
    x, mean = leaf((2, 3, 4, 4), dtype), leaf((2, 3, 4, 4), dtype, seed=1)
    jfn = thunder_rs.jit(fn)
    results = []
    for run in (fn, jfn):
        torch.manual_seed(5)
        gen.manual_seed(3)
        outs, grads = [], []
        for _ in range(3):
            x.grad = mean.grad = None
            out = run(x, mean)
            out[0].backward()
            outs.append([o.detach() for o in out])
            grads.append((x.grad.clone(), mean.grad.clone()))
        results.append((outs, grads, torch.rand(3), torch.rand(3, generator=gen)))
    torch.testing.assert_close(results[1], results[0])
    assert list(thunder_rs.examine(fn, x, mean).fallbacks) == ["torch._standard_gamma.replayable"]


def test_generator_created_inside_the_program_is_refused():
    def fn(x):
        gen = torch.Generator().manual_seed(0)
        return x + torch.rand(3, generator=gen)

    with pytest.raises(ThunderNotImplementedError, match="torch.Generator it creates"):
        thunder_rs.jit(fn)(torch.zeros(3))


class _SeededNoise(nn.Module):
    def __init__(self):
        super().__init__()
        self.gen = torch.Generator().manual_seed(4)

    def forward(self, x):
        return x + torch.randn(x.shape, generator=self.gen)


def test_generator_held_by_a_module_draws_as_eager():
    eager, model = _SeededNoise(), _SeededNoise()
    jmodel = thunder_rs.jit(model)
    x = torch.zeros(3)
    torch.testing.assert_close([jmodel(x) for _ in range(3)], [eager(x) for _ in range(3)], rtol=0, atol=0)


class _DropoutNet(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16).to(dtype), nn.Linear(16, 4).to(dtype)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return self.fc2(self.drop(F.gelu(self.fc1(x)))).softmax(-1) + F.dropout(x[:, :4], 0.5, self.training)


@pytest.mark.parametrize("dtype", FLOATS)
def test_dropout_training_sequence_matches_eager(dtype):
    torch.manual_seed(0)
    eager = _DropoutNet(dtype)
    model = copy.deepcopy(eager)
    jmodel = thunder_rs.jit(model)
    x = torch.randn(6, 8, dtype=dtype)
    runs = []
    for run, params in ((eager, eager), (jmodel, model)):
        opt = torch.optim.SGD(params.parameters(), lr=0.1)
        torch.manual_seed(42)
        losses = []
        for _ in range(4):
            opt.zero_grad()
            loss = run(x).pow(2).sum()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        runs.append((losses, [p.detach().clone() for p in params.parameters()], torch.rand(3)))
    (e_losses, e_params, e_next), (a_losses, a_params, a_next) = runs
    torch.testing.assert_close(a_losses, e_losses)
    torch.testing.assert_close(a_params, e_params)
    assert torch.equal(a_next, e_next)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert thunder_rs.compile_stats(jmodel).cache_misses == 1


@pytest.mark.parametrize("dtype", FLOATS)
def test_random_values_in_training_are_saved_not_drawn_again(dtype):
    def fn(x):
        noise = torch.rand_like(x)
        return (x * noise + torch.randn(x.shape, dtype=dtype) * x.sin()).sum()

    x = leaf((4, 3), dtype)
    jfn = thunder_rs.jit(fn)
    for run in (fn, jfn):
        torch.manual_seed(3)
        for _ in range(3):
            x.grad = None
            run(x).backward()
        if run is fn:
            expected, expected_next = x.grad.clone(), torch.rand(2)
    torch.testing.assert_close(x.grad, expected)
    assert torch.equal(torch.rand(2), expected_next)
    backward = str(thunder_rs.last_backward_traces(jfn)[-1])
    assert "rand" not in backward and "uniform" not in backward


def test_grad_mode_left_changed_by_the_program_is_refused():
    def fn(x):
        torch.set_grad_enabled(False)
        return x * 2

    with pytest.raises(ThunderNotImplementedError, match="changed grad mode or autocast"):
        thunder_rs.jit(fn)(torch.randn(2))
    assert torch.is_grad_enabled()


@pytest.mark.gpu
@pytest.mark.parametrize("low", LOW)
def test_cuda_autocast_training_matches_eager(low):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).cuda()
    jmodel = thunder_rs.jit(copy.deepcopy(model))
    x, target = torch.randn(5, 8, device="cuda"), torch.randint(0, 4, (5,), device="cuda")
    results = []
    for run in (model, jmodel):
        with torch.autocast("cuda", dtype=low):
            logits = run(x)
            loss = F.cross_entropy(logits, target)
        loss.backward()
        results.append((logits, loss))
    for a, e in zip(results[1], results[0]):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2)
    for p, q in zip(jmodel._model.parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=5e-2, atol=5e-2)


@pytest.mark.gpu
def test_cuda_random_ops_draw_as_eager_over_calls():
    def fn(x):
        torch.cuda.manual_seed(1)
        return x + torch.rand(3, device="cuda") + torch.randn_like(x), F.dropout(x + 1, 0.5)

    assert_same_draws(fn, torch.zeros(3, device="cuda"))


@pytest.mark.parametrize("restore", [True, False], ids=["restored", "left_set"])
def test_set_default_dtype_inside_a_program_acts_on_every_call(restore):
    def program(x):
        torch.set_default_dtype(torch.float64)
        y = torch.ones(2) + x  # made in float64
        if restore:
            torch.set_default_dtype(torch.float32)
        return y

    before = torch.get_default_dtype()
    try:
        jprogram = thunder_rs.jit(program)
        for _ in range(2):
            x = torch.full((2,), 0.1)
            torch.set_default_dtype(torch.float32)
            expected, expected_default = program(x), torch.get_default_dtype()
            torch.set_default_dtype(torch.float32)
            out = jprogram(x)
            assert out.dtype == expected.dtype and torch.get_default_dtype() == expected_default
            torch.testing.assert_close(out, expected)
    finally:
        torch.set_default_dtype(before)
