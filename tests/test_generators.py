"""``torch.Generator`` arguments are inputs of each call: against eager PyTorch.

A generator passed to a jitted function is keyed by its kind and device, not its identity, so a
fresh generator per call (``torch.Generator().manual_seed(seed)`` per sample) compiles once; each
call draws from the caller's generator what eager draws and leaves it in eager's state
(``core.acquisition.generator_inputs``). Every test compares outputs, gradients and the
generators' states after the calls with eager's, bit for bit, and counts the compiles.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def generators_in(args) -> list:
    return [x for x in tree_leaves(args) if isinstance(x, torch.Generator)]


def assert_same(actual, expected) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def assert_calls_match(fn, make_args, calls: int = 3, misses: int = 1):
    """Calls ``fn`` eagerly and compiled ``calls`` times, each with the arguments ``make_args(i)``
    makes (fresh generators, seeded alike for both), from the same global seed: the outputs, the
    generators' states after each call and the global generator's state match eager's, and the
    compiled function compiled ``misses`` times. Returns the jitted function."""
    jfn = thunder_rs.jit(fn)
    for i in range(calls):
        eager_args, jit_args = make_args(i), make_args(i)
        torch.manual_seed(100 + i)
        expected = fn(*eager_args)
        eager_state = torch.get_rng_state()
        torch.manual_seed(100 + i)
        actual = jfn(*jit_args)
        assert_same(actual, expected)
        assert torch.equal(torch.get_rng_state(), eager_state)
        for a, e in zip(generators_in(jit_args), generators_in(eager_args), strict=True):
            assert torch.equal(a.get_state(), e.get_state())
    assert thunder_rs.compile_stats(jfn).cache_misses == misses, thunder_rs.compile_stats(jfn).miss_reasons
    return jfn


X = torch.linspace(-2.0, 2.0, 12)
P = torch.linspace(0.05, 0.95, 12)

#: Each sampler that takes ``generator=``, drawing from the generator ``g``.
SAMPLERS = {
    "rand": lambda x, g: x + torch.rand(x.shape, generator=g),
    "randn": lambda x, g: x + torch.randn(12, generator=g),
    "rand_like": lambda x, g: torch.rand_like(x, generator=g),
    "randn_like": lambda x, g: torch.randn_like(x, generator=g),
    "randint": lambda x, g: torch.randint(3, 17, (12,), generator=g),
    "randint_like": lambda x, g: torch.randint_like(x, 9, generator=g),
    "randperm": lambda x, g: x[torch.randperm(12, generator=g)],
    "normal_tensor": lambda x, g: torch.normal(x, 0.5, generator=g),
    "normal_floats": lambda x, g: torch.normal(1.0, 2.0, (12,), generator=g),
    "bernoulli": lambda x, g: torch.bernoulli(P, generator=g),
    "bernoulli_p": lambda x, g: x.bernoulli(0.3, generator=g),
    "multinomial": lambda x, g: torch.multinomial(P, 5, generator=g),
    "poisson": lambda x, g: torch.poisson(P * 4, generator=g),
    "uniform_": lambda x, g: x.clone().uniform_(-1, 1, generator=g),
    "normal_": lambda x, g: x.clone().normal_(generator=g),
    "exponential_": lambda x, g: x.clone().exponential_(generator=g),
    "random_": lambda x, g: x.clone().random_(0, 9, generator=g),
    "rrelu": lambda x, g: torch.rrelu(x, 0.1, 0.3, True, g),
    # Several draws from one generator, in order.
    "in_sequence": lambda x, g: (
        torch.rand(12, generator=g) * torch.randn(12, generator=g) + torch.randint(0, 5, (12,), generator=g),
        torch.randperm(5, generator=g),
    ),
}


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_fresh_generator_per_call_compiles_once_and_draws_as_eager(sampler):
    assert_calls_match(SAMPLERS[sampler], lambda i: (X, gen(i)))


@pytest.mark.parametrize("sampler", ["rand", "randn", "randint"])
def test_a_fresh_generator_per_call_and_sizes_that_change(sampler):
    """Sized by the input's symbolic shape (``torch.rand(x.shape, generator=g)``), the draw is
    compiled once for every size (its shape reached torch's meta run as a ``SymbolicSize``, which
    failed the symbolic compile: one compile per size)."""
    draw = {
        "rand": lambda x, g: torch.rand(x.shape, generator=g),
        "randn": lambda x, g: torch.randn(x.shape, generator=g),
        "randint": lambda x, g: torch.randint(0, 5, x.shape, generator=g),
    }[sampler]

    def fn(x, g):
        return x * draw(x, g)

    assert_calls_match(fn, lambda i: (torch.linspace(-1.0, 1.0, 8 + i), gen(i)), calls=4, misses=2)


def test_the_miss_of_a_generator_object_names_no_identity():
    def fn(x, g):
        return x + torch.rand(x.shape, generator=g)

    jfn = assert_calls_match(fn, lambda i: (X, None if i % 2 else gen(i)), calls=4, misses=2)
    assert thunder_rs.compile_stats(jfn).miss_reasons == ["first call", "g: a torch.Generator on cpu -> None"]


def test_generators_in_keyword_arguments_dicts_and_lists():
    def fn(x, batch, *, g):
        return (
            x * torch.rand(12, generator=batch["g"])
            + torch.randn(12, generator=batch["more"][1])
            - torch.rand(12, generator=g)
        )

    jfn = thunder_rs.jit(fn)
    for i in range(3):
        eager_gens, jit_gens = (
            [gen(i), gen(i + 10), gen(i + 20), gen(i + 30)],
            [gen(i), gen(i + 10), gen(i + 20), gen(i + 30)],
        )
        expected = fn(X, {"g": eager_gens[0], "more": [eager_gens[1], eager_gens[2]]}, g=eager_gens[3])
        actual = jfn(X, {"g": jit_gens[0], "more": [jit_gens[1], jit_gens[2]]}, g=jit_gens[3])
        assert_same(actual, expected)
        for a, e in zip(jit_gens, eager_gens):
            assert torch.equal(a.get_state(), e.get_state())
    assert thunder_rs.compile_stats(jfn).cache_misses == 1


def test_one_generator_passed_twice_draws_in_order_and_keys_apart_from_two():
    """Passed twice, one generator's second draw continues from its first, as in eager; two
    generators each draw from their own start. Which arguments are one generator is keyed."""

    def fn(x, g1, g2):
        return torch.rand(12, generator=g1) - torch.rand(12, generator=g2) + x

    def args(i):
        if i % 2:
            return (X, gen(i), gen(i + 1))
        g = gen(i)
        return (X, g, g)

    assert_calls_match(fn, args, calls=4, misses=2)


GLOBAL_GENERATOR = gen(7)


def test_a_generator_argument_the_program_also_reads_as_a_global():
    """Passed the generator it also reads as a global, the program draws from one generator; passed
    another, from two."""

    def fn(x, g):
        return torch.rand(12, generator=g) + 2 * torch.rand(12, generator=GLOBAL_GENERATOR) + x

    jfn = thunder_rs.jit(fn)
    for i in range(4):
        outs, states = [], []
        for run in (fn, jfn):
            GLOBAL_GENERATOR.manual_seed(7)
            g = GLOBAL_GENERATOR if i % 2 == 0 else gen(i)
            outs.append(run(X, g))
            states.append((g.get_state(), GLOBAL_GENERATOR.get_state()))
        assert_same(outs[1], outs[0])
        assert_same(states[1], states[0])
    assert thunder_rs.compile_stats(jfn).cache_misses == 2


def test_a_value_drawn_from_the_generator_argument_decides_the_program():
    """The call traced returns the outputs its reads computed, from the stand-in's draws: the
    generator ends where eager's does; later calls take their branches by their own draws."""

    def fn(x, g):
        k = int(torch.randint(1, 4, (1,), generator=g).item())
        return x[:k] + torch.rand(k, generator=g)

    jfn = thunder_rs.jit(fn)
    for i in range(6):
        eager_gen, jit_gen = gen(i), gen(i)
        assert_same(jfn(X, jit_gen), fn(X, eager_gen))
        assert torch.equal(jit_gen.get_state(), eager_gen.get_state())
    assert thunder_rs.compile_stats(jfn).cache_misses < 6


class _Augment(nn.Module):
    def __init__(self):
        super().__init__()
        self.gen, self.lin = gen(0), nn.Linear(12, 12)

    def forward(self, x, g):
        return self.lin(x + torch.rand(12, generator=g)) + torch.randn(12, generator=self.gen)


def test_a_generator_argument_next_to_one_held_by_the_module():
    """The module's generator stays its own (keyed by identity: replacing it compiles again); the
    argument is each call's. Passed the module's own generator, the program draws from one."""
    torch.manual_seed(0)
    eager = _Augment()
    model = copy.deepcopy(eager)
    jmodel = thunder_rs.jit(model)
    for i in range(4):
        if i == 2:
            eager.gen, model.gen = gen(5), gen(5)
        results = []
        for run, m in ((eager, eager), (jmodel, model)):
            g = m.gen if i == 3 else gen(i)
            results.append((run(X, g), g.get_state(), m.gen.get_state()))
        assert_same(results[1], results[0])
    assert thunder_rs.compile_stats(jmodel).cache_misses == 3, thunder_rs.compile_stats(jmodel).miss_reasons


class _Box:
    pass


def test_a_generator_the_program_stores_is_the_calls_own():
    """``box.g = g`` is repeated by every call with that call's generator (not the one traced); a
    returned generator is the call's too."""

    def fn(x, g, box):
        box.g = g
        return x + torch.rand(12, generator=g), g

    jfn = thunder_rs.jit(fn)
    for i in range(3):
        g, box = gen(i), _Box()
        out, returned = jfn(X, g, box)
        assert box.g is g and returned is g
        assert_same(out, X + torch.rand(12, generator=gen(i)))
    # Stored, a generator is an object of the program's state: keyed by identity, as before.
    assert thunder_rs.compile_stats(jfn).cache_misses == 3


class _NoisyBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad + torch.rand(grad.shape, generator=ctx.g), None


def test_a_backward_that_draws_from_the_generator_argument():
    """A custom Function's backward draws from the call's generator when autograd runs it (here
    after reseeding), as eager's does: that argument is traced as itself."""

    def fn(x, g):
        return _NoisyBackward.apply(x, g).sum()

    jfn = thunder_rs.jit(fn)
    for i in range(3):
        results = []
        for run in (fn, jfn):
            x, g = X.clone().requires_grad_(), gen(i)
            y = run(x, g)
            g.manual_seed(100 + i)
            y.backward()
            results.append((x.grad, g.get_state()))
        assert_same(results[1], results[0])


@pytest.mark.parametrize("where", ["returned", "stored"])
def test_a_sampler_closure_over_the_generator_argument_draws_from_it(where):
    """A function the program returns or stores that draws from its generator draws from the
    call's generator when called later, as eager's does."""

    def fn(x, g, box):
        box.sample = lambda: torch.rand(2, generator=g)
        return (x + 1, box.sample) if where == "returned" else x + 1

    jfn = thunder_rs.jit(fn)
    for i in range(3):
        results = []
        for run in (fn, jfn):
            g, box = gen(i), _Box()
            out = run(X, g, box)
            sample = out[1] if where == "returned" else box.sample
            results.append((sample(), sample(), g.get_state()))
        assert_same(results[1], results[0])


class _Noise:
    def __init__(self, g):
        self.g = g

    def __call__(self, grad):
        return grad + torch.rand(grad.shape, generator=self.g)


@pytest.mark.parametrize("where", ["input", "computed"])
def test_a_tensor_hook_that_draws_from_the_generator_argument(where):
    """A hook runs in the backward, after the call: it draws from the call's generator then, as
    eager's does (a closure on an input's hook, a callable object on a computed tensor's)."""

    def fn(x, g):
        if where == "input":
            x.register_hook(lambda grad: grad * torch.rand(grad.shape, generator=g))
            return (x * 2).sum()
        y = x * 3
        y.register_hook(_Noise(g))
        return y.sum()

    jfn = thunder_rs.jit(fn)
    for i in range(3):
        results = []
        for run in (fn, jfn):
            x, g = X.clone().requires_grad_(), gen(i)
            y = run(x, g)
            g.manual_seed(50 + i)
            y.backward()
            results.append((x.grad, g.get_state()))
        assert_same(results[1], results[0])


class _HeldGenerator(nn.Module):
    def __init__(self):
        super().__init__()
        self.gen = gen(0)

    def forward(self, x):
        return x + self.gen.initial_seed()


def test_reading_a_generators_state_inside_the_program_is_refused():
    """A compiled call would return the seed read while tracing: after ``gen.manual_seed(5)``, eager
    reads 5 where the compiled call read 0."""
    with pytest.raises(ThunderNotImplementedError, match=r"initial_seed.*test_generators.py"):
        thunder_rs.jit(_HeldGenerator())(X)
    with pytest.raises(ThunderNotImplementedError, match="get_state"):
        thunder_rs.jit(lambda x, g: x + g.get_state()[:12])(X, gen(0))


def test_a_random_op_given_its_generator_positionally_differentiates_through_its_draws():
    """``torch.rrelu(x, lower, upper, True, g)``: its backward draws again from ``g``'s state (it
    drew from the default generator's), so the slopes and the gradient are eager's."""

    def fn(x, g):
        return (torch.rrelu(x, 0.1, 0.3, True, g) * 2).sum()

    jfn = thunder_rs.jit(fn)
    for i in range(3):
        grads = []
        for run in (fn, jfn):
            x = X.clone().requires_grad_()
            run(x, gen(i)).backward()
            grads.append(x.grad)
        assert_same(grads[1], grads[0])
    assert thunder_rs.compile_stats(jfn).cache_misses == 1


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 16), nn.Linear(16, 3)

    def forward(self, x, g):
        h = F.dropout(F.relu(self.fc1(x)), 0.3, self.training)
        noise = torch.bernoulli(torch.full_like(h, 0.8), generator=g)  # a mask from the sample's generator
        return self.fc2(h * noise).log_softmax(-1)


def test_training_with_dropout_a_seed_per_step_and_a_generator_per_sample():
    torch.manual_seed(0)
    eager = _Net()
    model = _Net()
    model.load_state_dict(eager.state_dict())
    jmodel = thunder_rs.jit(model)
    x = torch.randn(4, 12)
    for step in range(3):
        for run, m in ((eager, eager), (jmodel, model)):
            m.zero_grad()
            torch.manual_seed(step)
            run(x, gen(step)).sum().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            assert_same(p.grad, q.grad)
    with torch.random.fork_rng():
        torch.manual_seed(9)
        expected = eager(x, gen(3))
    with torch.random.fork_rng():
        torch.manual_seed(9)
        actual = jmodel(x, gen(3))
    assert_same(actual, expected)
    assert thunder_rs.compile_stats(jmodel).cache_misses == 1


def test_seeding_between_calls_and_inside():
    """``Generator.seed()`` and ``torch.manual_seed`` between calls, ``torch.manual_seed`` inside:
    the generators advance exactly as eager's over several calls."""

    def fn(x, g, k):
        a = torch.rand(12, generator=g) + torch.rand(12)
        torch.manual_seed(k)
        return a + torch.randn(12) + F.dropout(x, 0.5)

    def twin(g: torch.Generator) -> torch.Generator:
        other = torch.Generator()
        other.set_state(g.get_state())
        return other

    jfn = thunder_rs.jit(fn)
    for i in range(3):
        seeded = torch.Generator()
        seeded.seed()
        results = []
        for run in (fn, jfn):
            torch.manual_seed(i)
            g = twin(seeded)
            out = run(X, g, 5)
            results.append((out, g.get_state(), torch.get_rng_state(), torch.rand(2)))
        assert_same(results[1], results[0])
    assert thunder_rs.compile_stats(jfn).cache_misses == 1


def test_calls_from_several_threads_draw_from_their_own_generators():
    def fn(x, g):
        return x + torch.randn(4096, generator=g)

    jfn = thunder_rs.jit(fn)
    x = torch.zeros(4096)
    jfn(x, gen(0))
    failed = []

    def work(t: int) -> None:
        for i in range(8):
            expected_gen, actual_gen = gen(100 * t + i), gen(100 * t + i)
            expected, actual = fn(x, expected_gen), jfn(x, actual_gen)
            if not (torch.equal(actual, expected) and torch.equal(actual_gen.get_state(), expected_gen.get_state())):
                failed.append((t, i))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failed == []
    assert thunder_rs.compile_stats(jfn).cache_misses == 1


class _CudaAugment(nn.Module):
    def __init__(self):
        super().__init__()
        self.gen, self.lin = torch.Generator(device="cuda").manual_seed(0), nn.Linear(12, 12)

    def forward(self, x, g):
        h = F.dropout(self.lin(x + torch.rand(12, device=x.device, generator=g)), 0.3)
        return h + torch.randn(12, device=x.device, generator=self.gen) + torch.rrelu(h, 0.1, 0.3, True, g)


@pytest.mark.gpu
def test_on_cuda_generator_arguments_and_a_module_held_generator_draw_as_eager():
    """The CUDA twin (a CUDA generator cannot be made without a GPU): a fresh CUDA generator per
    call is keyed by its device (``cache.is_runtime_generator``) and drawn from through a CUDA
    stand-in; the module's own is drawn from directly; dropout draws from the default CUDA
    generator under a seed per call, and rrelu's backward replays the argument's draws. Values and
    gradients are eager's, the three generators end where eager leaves them, in one compile."""
    torch.manual_seed(0)
    eager = _CudaAugment().cuda()
    model = copy.deepcopy(eager)
    jmodel = thunder_rs.jit(model)
    x = X.cuda()
    for i in range(3):
        results = []
        for run, m in ((eager, eager), (jmodel, model)):
            torch.cuda.manual_seed(i)
            g = torch.Generator(device="cuda").manual_seed(i)
            leaf = x.clone().requires_grad_()
            out = run(leaf, g)
            (grad,) = torch.autograd.grad(out.sum(), leaf)
            results.append((out, grad, g.get_state(), m.gen.get_state(), torch.cuda.get_rng_state()))
        (out, grad, *states), (expected_out, expected_grad, *expected_states) = results[1], results[0]
        torch.testing.assert_close((out, grad), (expected_out, expected_grad))
        assert all(map(torch.equal, states, expected_states)), i
    assert thunder_rs.compile_stats(jmodel).cache_misses == 1, thunder_rs.compile_stats(jmodel).miss_reasons
