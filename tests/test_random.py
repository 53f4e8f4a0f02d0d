"""Random ops under thunder_rs.jit draw what eager draws under the same seed: values, gradients,
consecutive calls, ``torch.manual_seed`` inside the program, ``generator=``; and they are known
symbols (``examine`` lists no fallback), which no pass drops, merges or recomputes."""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

GEN = torch.Generator().manual_seed(11)


def _x(*shape, dtype=torch.float32, grad=False, positive=False):
    g = torch.Generator().manual_seed(sum(shape) + 3)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    x = x.abs() + 0.1 if positive else x
    return x.requires_grad_(grad)


def _probs(*shape, grad=False):
    return (torch.rand(*shape, generator=torch.Generator().manual_seed(5)) * 0.8 + 0.1).requires_grad_(grad)


#: name -> (program, inputs factory). Each program returns tensors; float outputs that require
#: grad are differentiated through their sum.
CASES = {
    "rand": (lambda x: x + torch.rand(2, 3), lambda: (_x(2, 3),)),
    "rand_gen_dtype": (lambda x: torch.rand((2, 3), generator=GEN, dtype=torch.float64), lambda: (_x(1),)),
    "randn": (lambda x: x + torch.randn(2, 3), lambda: (_x(2, 3),)),
    "randn_big": (lambda x: x + torch.randn(5, 17), lambda: (_x(5, 17),)),
    "randn_gen": (lambda x: torch.randn(4, 5, generator=GEN), lambda: (_x(1),)),
    "rand_like": (lambda x: torch.rand_like(x) * x, lambda: (_x(3, 4, grad=True),)),
    "rand_like_gen": (lambda x: torch.rand_like(x, generator=GEN, dtype=torch.float64), lambda: (_x(3, 4),)),
    "randn_like": (lambda x: torch.randn_like(x) * x, lambda: (_x(20, grad=True),)),
    "randn_like_gen": (lambda x: torch.randn_like(x, generator=GEN), lambda: (_x(20),)),
    "randint": (lambda x: torch.randint(3, 10, (4, 5)), lambda: (_x(1),)),
    "randint_high": (lambda x: torch.randint(10, (7,), generator=GEN, dtype=torch.int32), lambda: (_x(1),)),
    "randint_like": (lambda x: torch.randint_like(x, 7) + x, lambda: (_x(3, 4),)),
    "randint_like_low": (lambda x: torch.randint_like(x, 2, 9, generator=GEN), lambda: (_x(3, 4),)),
    "randperm": (lambda x: torch.randperm(9), lambda: (_x(1),)),
    "randperm_gen": (lambda x: torch.randperm(30, generator=GEN, dtype=torch.int32), lambda: (_x(1),)),
    "normal_tt": (lambda m, s: torch.normal(m, s), lambda: (_x(3, 4, grad=True), _x(4, grad=True, positive=True))),
    "normal_tf": (lambda m: torch.normal(m, 2.0) * m, lambda: (_x(3, 4, grad=True),)),
    "normal_ft": (lambda s: torch.normal(1.0, s, generator=GEN), lambda: (_x(17, grad=True, positive=True),)),
    "normal_ff": (lambda x: torch.normal(0.5, 2.0, (3, 5)) + x, lambda: (_x(3, 5, grad=True),)),
    "normal_ff_gen": (
        lambda x: torch.normal(0.5, 2.0, size=(3, 5), generator=GEN, dtype=torch.float64),
        lambda: (_x(1),),
    ),
    "bernoulli": (lambda p: torch.bernoulli(p), lambda: (_probs(4, 5, grad=True),)),
    "bernoulli_gen": (lambda p: torch.bernoulli(p, generator=GEN), lambda: (_probs(4, 5),)),
    "bernoulli_float": (lambda x: torch.bernoulli(x, 0.3), lambda: (_x(4, 5),)),
    "bernoulli_method": (lambda p: p.bernoulli() + p.bernoulli(0.7), lambda: (_probs(6),)),
    "poisson": (lambda r: torch.poisson(r) * r, lambda: (_x(4, 5, grad=True, positive=True),)),
    "poisson_gen": (lambda r: torch.poisson(r, generator=GEN), lambda: (_x(4, 5, positive=True),)),
    "multinomial": (lambda p: torch.multinomial(p, 3), lambda: (_probs(2, 5),)),
    "multinomial_replacement": (lambda p: torch.multinomial(p, 8, True, generator=GEN), lambda: (_probs(5),)),
    "multinomial_method": (lambda p: p.multinomial(2), lambda: (_probs(5),)),
    "dropout": (lambda x: F.dropout(x, 0.3), lambda: (_x(4, 5, grad=True),)),
    "dropout_eval": (lambda x: F.dropout(x, 0.3, training=False), lambda: (_x(4, 5, grad=True),)),
    "dropout1d": (lambda x: F.dropout1d(x, 0.4), lambda: (_x(2, 5, 3, grad=True),)),
    "dropout1d_unbatched": (lambda x: F.dropout1d(x, 0.4), lambda: (_x(5, 3, grad=True),)),
    "dropout2d": (lambda x: F.dropout2d(x, 0.5) * 2, lambda: (_x(2, 6, 3, 3, grad=True),)),
    "dropout3d": (lambda x: F.dropout3d(x, 0.25), lambda: (_x(2, 4, 2, 2, 2, grad=True),)),
    "dropout3d_unbatched": (lambda x: F.dropout3d(x, 0.25), lambda: (_x(4, 2, 2, 2, grad=True),)),
    "alpha_dropout": (lambda x: F.alpha_dropout(x, 0.3, training=True), lambda: (_x(4, 5, grad=True),)),
    "alpha_dropout_eval": (lambda x: F.alpha_dropout(x, 0.3), lambda: (_x(4, 5, grad=True),)),
    "feature_alpha_dropout": (lambda x: F.feature_alpha_dropout(x, 0.4, True), lambda: (_x(2, 5, 3, 3, grad=True),)),
    "rrelu": (lambda x: F.rrelu(x, training=True), lambda: (_x(4, 6, grad=True),)),
    "rrelu_bounds": (lambda x: F.rrelu(x, 0.1, 0.6, True), lambda: (_x(30, grad=True),)),
    "rrelu_eval": (lambda x: F.rrelu(x, 0.1, 0.6), lambda: (_x(30, grad=True),)),
    "uniform_": (lambda x: (x * 1).uniform_(-2, 3), lambda: (_x(4, 5, grad=True),)),
    "uniform_gen": (lambda x: x.clone().uniform_(generator=GEN), lambda: (_x(4, 5),)),
    "normal_": (lambda x: (x * 1).normal_(1.0, 3.0), lambda: (_x(4, 5, grad=True),)),
    "exponential_": (lambda x: x.clone().exponential_(2.0), lambda: (_x(4, 5),)),
    "geometric_": (lambda x: x.clone().geometric_(0.3, generator=GEN), lambda: (_x(4, 5),)),
    "cauchy_": (lambda x: x.clone().cauchy_(0.5, 2.0), lambda: (_x(4, 5),)),
    "log_normal_": (lambda x: x.clone().log_normal_(0.2, 0.5), lambda: (_x(4, 5),)),
    "random_": (lambda x: x.clone().random_(), lambda: (_x(4, 5),)),
    "random_to": (lambda x: x.clone().random_(7), lambda: (_x(4, 5),)),
    "random_from_to": (lambda x: x.clone().random_(-3, 7, generator=GEN), lambda: (_x(4, 5),)),
    "random_int": (lambda x: x.to(torch.int32).random_(0, 100), lambda: (_x(4, 5),)),
    "bernoulli_": (lambda x: x.clone().bernoulli_(0.3), lambda: (_x(4, 5),)),
    "bernoulli_tensor_": (lambda x, p: x.clone().bernoulli_(p), lambda: (_x(4, 5), _probs(4, 5))),
    "input_written": (lambda x: x.uniform_(), lambda: (_x(4, 5),)),
    "alpha_dropout_transposed": (lambda x: F.alpha_dropout(x, 0.3, True), lambda: (_x(4, 3, grad=True).mT,)),
    "dropout2d_bf16": (lambda x: F.dropout2d(x, 0.3), lambda: (_x(2, 3, 4, 4, dtype=torch.bfloat16, grad=True),)),
    "alpha_dropout_f16": (lambda x: F.alpha_dropout(x, 0.3, True), lambda: (_x(4, 5, dtype=torch.float16, grad=True),)),
    "feature_alpha_dropout_f64": (
        lambda x: F.feature_alpha_dropout(x, 0.6, True),
        lambda: (_x(3, 4, 2, dtype=torch.float64, grad=True),),
    ),
    "rrelu_bf16": (lambda x: F.rrelu(x, training=True), lambda: (_x(40, dtype=torch.bfloat16, grad=True),)),
    "dropout_inplace": (lambda x: F.dropout2d(x * 1, 0.5, inplace=True), lambda: (_x(2, 3, 4, grad=True),)),
    "gumbel_softmax": (lambda x: F.gumbel_softmax(x, 0.5) * torch.arange(6.0), lambda: (_x(4, 6, grad=True),)),
    "gumbel_softmax_hard": (
        lambda x: F.gumbel_softmax(x, hard=True, dim=1) * torch.arange(5.0)[:, None],
        lambda: (_x(3, 5, 2, grad=True).mT.mT,),
    ),
    "mixed_program": (
        lambda x, m: (
            (F.dropout(x, 0.2) * F.rrelu(x, training=True) + torch.normal(m, 0.5)).sum()
            + F.dropout3d(x.unsqueeze(0), 0.5).sum()
            + torch.rand_like(m).sum()
        ),
        lambda: (_x(2, 3, 4, 4, grad=True), _x(2, 3, 4, 4, grad=True)),
    ),
}


def _run(fn, inputs, calls):
    """``calls`` calls of ``fn``: outputs, then the gradients of the inputs that require grad."""
    results = []
    for _ in range(calls):
        for x in inputs:
            x.grad = None
        outs = fn(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        diff = [o for o in outs if o.requires_grad]
        if diff:
            sum(o.sum() for o in diff).backward()
        results.append(
            ([o.detach() for o in outs], [o.requires_grad for o in outs], [x.grad for x in inputs if x.requires_grad])
        )
    return results


def assert_draws_as_eager(fn, make_inputs, calls=3, seed=0):
    """Calls in a row, eager and compiled from the same seeds (global and ``GEN``), give the same
    values, gradients and requires_grad flags, and leave both generators where eager leaves them."""
    runs = []
    for run in (fn, thunder_rs.jit(fn)):
        inputs = make_inputs()
        torch.manual_seed(seed)
        GEN.manual_seed(seed + 1)
        results = _run(run, inputs, calls)
        runs.append((results, [x.detach() for x in inputs], torch.rand(3), torch.rand(3, generator=GEN)))
    torch.testing.assert_close(runs[1], runs[0], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", CASES)
def test_draws_as_eager(name):
    fn, make_inputs = CASES[name]
    assert_draws_as_eager(fn, make_inputs)


@pytest.mark.parametrize("name", CASES)
def test_random_ops_are_known_symbols(name):
    fn, make_inputs = CASES[name]
    assert not thunder_rs.examine(fn, *make_inputs()).fallbacks


#: ATen's in-place dropouts, which run as eager's op on a copy (a random fallback).
IN_PLACE_DROPOUTS = {
    "dropout_": lambda x: torch.dropout_(x * 1, 0.5, True),
    "feature_dropout_": lambda x: torch.feature_dropout_(x * 1, 0.5, True),
    "alpha_dropout_": lambda x: torch.alpha_dropout_(x * 1, 0.5, True),
    "feature_alpha_dropout_": lambda x: torch.feature_alpha_dropout_(x * 1, 0.5, True),
}


@pytest.mark.parametrize("name", IN_PLACE_DROPOUTS)
def test_in_place_dropouts_differentiate_through_their_own_draws(name):
    """They were no random calls to thunder_rs: the backward ran eager's op again with new draws,
    so the gradient's mask was not the output's, and the generator advanced twice per call."""
    assert_draws_as_eager(IN_PLACE_DROPOUTS[name], lambda: (_x(4, 3, 50, grad=True),))


@pytest.mark.parametrize("name", ["randn", "normal_tf", "dropout2d", "rrelu", "multinomial", "uniform_"])
def test_manual_seed_inside_the_program(name):
    fn, make_inputs = CASES[name]

    def seeded(*args):
        torch.manual_seed(7)
        return fn(*args)

    assert_draws_as_eager(seeded, make_inputs)


def _execution(fn, *inputs) -> str:
    jfn = thunder_rs.jit(fn)
    jfn(*inputs)
    return str(thunder_rs.last_traces(jfn)[-1])


def test_two_dropouts_on_one_input_are_both_kept():
    def fn(x):
        return F.dropout2d(x, 0.5) - F.dropout2d(x, 0.5), F.alpha_dropout(x, 0.5, True) - F.alpha_dropout(x, 0.5, True)

    x = _x(2, 3, 4, 4)
    execution = _execution(fn, x)
    assert (
        execution.count(".bernoulli_(")
        + execution.count("bernoulli_on_fresh")
        + execution.count("torch_dropout2d")
        + execution.count("torch_alpha_dropout")
        == 4
    )
    outs = thunder_rs.jit(fn)(x)
    assert all((o != 0).any() for o in outs)


@pytest.mark.parametrize("name", ["multinomial", "randperm", "normal_tf", "bernoulli", "rrelu", "uniform_", "randint"])
def test_unused_draws_still_advance_the_generator(name):
    fn, make_inputs = CASES[name]

    def unused(*args):
        fn(*args)
        return args[0] * 2

    assert_draws_as_eager(unused, make_inputs)


def test_equal_draws_are_not_merged():
    def fn(p, x):
        return torch.multinomial(p, 3, True) - torch.multinomial(p, 3, True), torch.normal(x, 1.0) - torch.normal(
            x, 1.0
        )

    outs = thunder_rs.jit(fn)(_probs(4), _x(5))
    assert all((o != 0).any() for o in outs)


def test_draws_are_saved_for_the_backward_not_drawn_again():
    fn, make_inputs = CASES["mixed_program"]
    jfn = thunder_rs.jit(fn)
    jfn(*make_inputs()).backward()
    backward = str(thunder_rs.last_backward_traces(jfn)[-1])
    for draw in ("bernoulli", "rrelu_with_noise", "normal", "rand", "uniform", "native_dropout("):
        assert draw not in backward, backward


def test_bernoulli_with_a_float_p_has_no_gradient_as_in_eager():
    """Its forward runs (as eager's call), and its backward raises eager's error."""
    x = _x(3, grad=True)
    for fn in (lambda a: torch.bernoulli(a, 0.5), thunder_rs.jit(lambda a: torch.bernoulli(a, 0.5))):
        with pytest.raises(RuntimeError, match="derivative for aten::bernoulli is not implemented"):
            fn(x).sum().backward()


@pytest.mark.parametrize(
    "factory", [lambda x: torch.rand(3, requires_grad=True), lambda x: torch.randn_like(x, requires_grad=True)]
)
def test_factories_refuse_to_create_leaves(factory):
    with pytest.raises(NotImplementedError, match="requires_grad=True would create a leaf"):
        thunder_rs.jit(factory)(_x(3))


def test_random_ops_are_claimed_whole_by_the_torch_executor():
    fn, make_inputs = CASES["mixed_program"]
    execution = _execution(lambda *a: fn(*a).detach(), *make_inputs())
    assert "eager_" not in execution, execution


def test_examine_counts_generator_state_calls_as_supported():
    def fn(x):
        state = torch.get_rng_state()
        torch.manual_seed(1)
        y = F.dropout(x, 0.5)
        torch.set_rng_state(state)
        return y

    report = thunder_rs.examine(fn, _x(3))
    assert not report.fallbacks
    assert {"torch.random.manual_seed", "torch.random.get_rng_state", "torch.random.set_rng_state"} <= set(
        report.supported
    )


@pytest.mark.gpu
def test_cuda_draws_as_eager():
    def fn(x, p):
        return (
            (
                F.dropout(x, 0.3)
                + F.dropout(x * 1, 0.3, inplace=True)
                + F.dropout2d(x, 0.5)
                + F.alpha_dropout(x, 0.2, True)
                + F.rrelu(x, training=True)
                + torch.normal(x, 1.0)
                + torch.randn_like(x)
                + x.clone().exponential_()
            ).sum(),
            torch.multinomial(p, 2),
            torch.randint(0, 9, (5,), device="cuda"),
            torch.bernoulli(p),
        )

    assert_draws_as_eager(fn, lambda: (_x(2, 3, 4, 4).cuda().requires_grad_(), _probs(3, 4).cuda()))


def _layer_cases():
    torch.manual_seed(0)
    return {
        "multihead_attention_dropout": (
            torch.nn.MultiheadAttention(8, 2, dropout=0.3, batch_first=True),
            lambda m, x: m(x, x, x)[0],
            (2, 5, 8),
        ),
        "transformer_encoder_layer": (
            torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
            lambda m, x: m(x),
            (2, 5, 8),
        ),
        "stacked_lstm_dropout": (
            torch.nn.LSTM(4, 6, num_layers=2, dropout=0.5, batch_first=True),
            lambda m, x: m(x)[0],
            (2, 5, 4),
        ),
        "stacked_gru_dropout": (torch.nn.GRU(4, 6, num_layers=2, dropout=0.5), lambda m, x: m(x)[0], (5, 2, 4)),
        "fractional_max_pool_indices": (
            torch.nn.FractionalMaxPool2d(2, output_size=3, return_indices=True),
            lambda m, x: m(x)[0],
            (1, 2, 7, 7),
        ),
    }


@pytest.mark.parametrize("name", list(_layer_cases()))
def test_layers_that_draw_inside_differentiate_through_their_own_draws(name):
    import copy

    module, call, shape = _layer_cases()[name]
    module = module.double().train()
    eager = copy.deepcopy(module)
    jmodule = thunder_rs.jit(lambda x: call(module, x))
    for step in range(2):
        x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(step), requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        torch.manual_seed(step)
        out = jmodule(x)
        out.sum().backward()
        after = torch.rand(1)  # the backward draws nothing more from the global generator
        torch.manual_seed(step)
        expected = call(eager, xe)
        expected.sum().backward()
        torch.testing.assert_close(torch.rand(1), after)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(x.grad, xe.grad)
        for p, q in zip(module.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)


def test_a_program_using_the_seed_torch_seed_returns_is_refused_naming_the_line():
    # Reformer keeps int(torch.seed() % sys.maxsize): it got None while traced (a TypeError)
    def fn(x):
        return x + int(torch.seed() % 1000)

    fn(torch.zeros(1))  # (eager draws a new seed each call: no value to compare)
    with pytest.raises(
        ThunderNotImplementedError, match=r"torch.random.seed at .*test_random.py:\d+: the program uses"
    ):
        thunder_rs.jit(fn)(torch.zeros(1))


class SeededOps(TorchDispatchMode):
    """The random aten ops run under it, with their arguments' sizes: on CUDA, which philox
    offsets a call consumes (each kernel takes its own count of them)."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.ops.append((str(func), *(a.shape if isinstance(a, torch.Tensor) else a for a in args)))
        return func(*args, **(kwargs or {}))


#: Programs whose draws on CUDA come from kernels of their own: ``dropout`` runs the fused
#: ``native_dropout``, its in-place form ``bernoulli_`` (ATen's Dropout.cpp), the others theirs.
CUDA_DRAWS = {
    "dropout": lambda x: F.dropout(x, 0.3),
    "dropout_inplace": lambda x: F.dropout(x * 1, 0.3, inplace=True),
    "dropout_module_inplace": lambda x: torch.nn.Dropout(0.3, inplace=True)(x * 1),
    "torch_dropout_": lambda x: torch.dropout_(x * 1, 0.3, True),
    "alpha_dropout_inplace": lambda x: F.alpha_dropout(x * 1, 0.3, True, inplace=True),
    "dropout2d_inplace": lambda x: F.dropout2d(x * 1, 0.3, inplace=True),
    "rand_like": lambda x: x + torch.rand_like(x),
    "attention_dropout": lambda x: F.scaled_dot_product_attention(x, x, x, dropout_p=0.3),
}


@pytest.mark.parametrize("nvfuser", [False, True], ids=["torch", "nvfuser_stand_in"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("name", CUDA_DRAWS)
def test_on_fake_cuda_each_draw_runs_eagers_kernel(name, grad, nvfuser, monkeypatch, request):
    """On fake CUDA tensors the compiled call runs eager's random kernels, in order, on the same
    sizes: it consumes the generator's philox offsets as eager does, so the draws after it are
    eager's too; nvFuser (the stand-in) takes no draw into its regions, whose Philox stream is
    not eager's. ``F.dropout(x, inplace=True)`` ran ``native_dropout`` where eager's ``dropout_``
    draws with ``bernoulli_``: other numbers. A CPU generator stands in for the CUDA one, whose
    state a differentiated random call records (none without a GPU)."""
    monkeypatch.setattr(torch.cuda, "default_generators", (torch.Generator(),))
    executors = [request.getfixturevalue("fake_ex")] if nvfuser else ["torch"]
    fn = CUDA_DRAWS[name]
    with FakeTensorMode():
        x = torch.empty(2, 3, 4, 8, device="cuda", requires_grad=grad)
        with SeededOps() as eager:
            fn(x)
        jfn = thunder_rs.jit(lambda x: fn(x) * 2 + 1, executors=executors)
        jfn(x)
        with SeededOps() as compiled:
            jfn(x)
    assert compiled.ops == eager.ops and eager.ops
    if nvfuser:
        assert executors[0].stats["definitions"] > 0  # (the arithmetic around the draws made a region)
