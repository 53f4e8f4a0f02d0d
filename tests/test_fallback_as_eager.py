"""Eager fallbacks (calls thunder_rs runs as torch calls inside the trace, ``core.lang.fallback``)
whose values and gradients are eager's bit for bit, compared with eager:

- The RNNs (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) run under the grad mode they were traced in, on
  tensors requiring grad as eager's did: the CPU kernels choose by both (oneDNN's training
  primitive, products folded by whether an operand requires grad), and the compiled forward runs
  without grad on tensors most of which require none.
- Calls eager has no derivative for, given an argument requiring grad (``special.zeta``'s ``x``,
  ``igamma``'s and ``igammac``'s ``a``, ``_chunk_cat``, ``remainder`` of a number, ``scatter`` with
  ``reduce=``, ``bernoulli`` of a float ``p``), run as eager's: their forward runs and requires
  grad, and their backward raises eager's error (type and message) when it runs, never at the call,
  and only where the gradient of that argument is asked for (``autograd.grad(zeta(x, q).sum(), q)``
  gives ``q``'s, as eager's backward, which computes none for ``x``).
- A fallback op whose backward gives an input no gradient (eager's None) leaves None to the leaves
  that gradient alone reaches through other ops (add, mul, view, a sum, a linear layer, another
  fallback's backward, but a custom autograd.Function's, which eager gives zeros for it by
  default): ``.grad`` stays None, ``autograd.grad(..., allow_unused=True)`` gives None
  and without ``allow_unused`` raises eager's error; a leaf another gradient reaches too gets it.
"""

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import thunder_rs
from custom_ops import scaled_pair

RNNS = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}
CONFIGS = {
    "plain": {},
    "batch_first bidirectional 2 layers": {"batch_first": True, "bidirectional": True, "num_layers": 2},
    "2 layers dropout 0": {"num_layers": 2, "dropout": 0.0},
}


def _outputs_and_grads(module, x, grad: bool):
    """The outputs (flattened) and the gradients of the input and the parameters, or None without grad."""
    with torch.set_grad_enabled(grad):
        out, state = module(x)
    out = out.data if hasattr(out, "batch_sizes") else out
    flat = [out, *(state if isinstance(state, tuple) else (state,))]
    if not grad:
        return flat, None
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape)).sum() for o in flat)
    return flat, torch.autograd.grad(loss, [x, *module.parameters()])


def _assert_equal_to_eager(module, make_input, grad: bool = True):
    eager = _outputs_and_grads(module, make_input(), grad)
    compiled = _outputs_and_grads(thunder_rs.jit(module), make_input(), grad)
    for c, e in zip(compiled[0], eager[0]):
        assert torch.equal(c, e), (c - e).abs().max()
    for c, e in zip(compiled[1] or (), eager[1] or ()):
        assert torch.equal(c, e), (c - e).abs().max()


def _rnn(kind: str, dtype, **config):
    torch.manual_seed(0)
    return RNNS[kind](5, 7, **config).to(dtype)


#: float64 under the slow marker: float32 (oneDNN's kernels) is the representative case.
DTYPES = [torch.float32, pytest.param(torch.float64, marks=pytest.mark.slow)]


def _sequence(dtype, batch_first: bool = False):
    torch.manual_seed(1)
    return torch.randn((3, 6, 5) if batch_first else (6, 3, 5), dtype=dtype).requires_grad_()


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("kind", list(RNNS))
def test_rnn_outputs_and_gradients_are_eagers_bit_for_bit(kind, dtype, config):
    module = _rnn(kind, dtype, **CONFIGS[config])
    _assert_equal_to_eager(module, lambda: _sequence(dtype, CONFIGS[config].get("batch_first", False)))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("kind", list(RNNS))
def test_rnn_without_grad_is_eagers_bit_for_bit(kind, dtype):
    module = _rnn(kind, dtype, bidirectional=True, num_layers=2)
    _assert_equal_to_eager(module, lambda: _sequence(dtype), grad=False)


@pytest.mark.parametrize("kind", list(RNNS))
def test_rnn_of_an_input_requiring_no_grad_is_eagers_bit_for_bit(kind):
    """Only the parameters require grad: eager's kernel folds by them alone."""
    module = _rnn(kind, torch.float32, bidirectional=True, num_layers=2)
    eager = module(_sequence(torch.float32).detach())[0]
    compiled = thunder_rs.jit(module)(_sequence(torch.float32).detach())[0]
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("kind", list(RNNS))
def test_rnn_of_packed_sequences_is_eagers_bit_for_bit(kind, dtype):
    """A packed sequence (packed outside the program) given to the RNN."""
    module = _rnn(kind, dtype, bidirectional=True, num_layers=2)
    results = []
    for rnn in (module, thunder_rs.jit(module)):
        x = _sequence(dtype)
        out, state = rnn(pack_padded_sequence(x, torch.tensor([6, 4, 2])))
        flat = [out.data, *(state if isinstance(state, tuple) else (state,))]
        loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=dtype).view(o.shape)).sum() for o in flat)
        results.append([*flat, *torch.autograd.grad(loss, [x, *module.parameters()])])
    for c, e in zip(results[1], results[0]):
        assert torch.equal(c, e), (c - e).abs().max()


def _positive(*shape):
    return (torch.rand(*shape, dtype=torch.float64) + 1).requires_grad_()


UNDERIVED = {
    "zeta x": (lambda x, q: torch.special.zeta(x, q.detach()), lambda: (_positive(4), _positive(4))),
    "zeta x and q": (lambda x, q: torch.special.zeta(x * 2, q), lambda: (_positive(4), _positive(4))),
    "igamma a": (lambda a, x: torch.igamma(a, x), lambda: (_positive(4), _positive(4))),
    "igammac a method": (lambda a, x: a.igammac(x.detach()), lambda: (_positive(4), _positive(4))),
    "gammainc a": (lambda a, x: torch.special.gammainc(a + 1, x), lambda: (_positive(4), _positive(4))),
    "chunk_cat": (lambda a, b: torch._chunk_cat([a, b.view(2, 2)], 1, 2), lambda: (_positive(2, 3), _positive(4))),
    "remainder of a number": (lambda a, b: torch.remainder(2.5, a) + b, lambda: (_positive(4), _positive(4))),
    "number % tensor": (lambda a, b: 2.5 % (a * b), lambda: (_positive(4), _positive(4))),
    "bernoulli of a float p": (lambda a, b: torch.bernoulli(a / 3, 0.5) * b, lambda: (_positive(4), _positive(4))),
    "scatter reduce=": (
        lambda a, b: torch.scatter(a, 0, torch.tensor([0, 1, 0]), b, reduce="add"),
        lambda: (_positive(4), _positive(3)),
    ),
}


def _run(program, args, backward: bool):
    """The output (and its ``requires_grad``), then the backward's error (type and message) or
    the gradients."""
    out = program(*args)
    if not backward:
        return out, out.requires_grad
    try:
        return out, torch.autograd.grad(out.sum(), args, allow_unused=True)
    except (RuntimeError, NotImplementedError) as e:
        return out, (type(e), str(e))


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("case", list(UNDERIVED))
def test_a_call_eager_has_no_derivative_for_raises_at_the_backward_as_eager(case, backward):
    program, make_args = UNDERIVED[case]
    torch.manual_seed(0)
    eager = _run(program, make_args(), backward)
    torch.manual_seed(0)
    compiled = _run(thunder_rs.jit(program), make_args(), backward)
    assert torch.equal(compiled[0], eager[0])
    assert compiled[1] == eager[1]
    assert not backward or isinstance(eager[1][0], type)  # (the case the test is about: eager raises)


def test_a_loss_of_other_outputs_runs_past_a_call_eager_has_no_derivative_for():
    """Eager's backward never runs zeta's node: no error."""
    program = lambda x, q: (torch.special.zeta(x, q), x * q)  # noqa: E731
    grads = []
    for fn in (program, thunder_rs.jit(program)):
        torch.manual_seed(0)
        x, q = _positive(4), _positive(4)
        grads.append(torch.autograd.grad(fn(x, q)[1].sum(), (x, q)))
    assert all(torch.equal(c, e) for c, e in zip(*grads))


def _gradient_of_the_other(program, args, how: str):
    """The gradient of the second argument alone (``autograd.grad`` or ``backward(inputs=)``), and
    whether the first, which requires grad too, was left with no hook and no ``.grad``."""
    out = program(*args)
    if how == "grad":
        (grad,) = torch.autograd.grad(out.sum(), args[1])
    else:
        out.sum().backward(inputs=[args[1]])
        grad = args[1].grad
    return grad, not (args[0].is_leaf and args[0]._backward_hooks) and args[0].grad is None


#: name -> program of two arguments requiring grad, with no derivative in the first
OTHER_DERIVED = {
    "zeta": lambda x, q: torch.special.zeta(x, q),
    "zeta of a non-leaf": lambda x, q: torch.special.zeta(x, q),
    "igamma": lambda a, x: torch.igamma(a, x),
    "igammac method": lambda a, x: a.igammac(x),
    "remainder of a number": lambda a, b: torch.remainder(2.5, a) + b,
    "bernoulli of a float p": lambda a, b: torch.bernoulli(a, 0.5) * b,
}


@pytest.mark.parametrize("how", ["grad", "backward(inputs=)"])
@pytest.mark.parametrize("case", list(OTHER_DERIVED))
def test_the_gradient_of_an_argument_with_a_derivative_alone_is_eagers(case, how):
    """Eager's backward computes none for the argument with no derivative, which is not asked for:
    no error (``zeta(x, q)``, ``q``'s gradient: the compiled backward computed ``x``'s too, and raised)."""
    program = OTHER_DERIVED[case]
    results = []
    for fn in (program, thunder_rs.jit(program)):
        torch.manual_seed(0)
        first, second = _positive(4), _positive(4)
        first = first * 1 if "non-leaf" in case else first
        results.append(_gradient_of_the_other(fn, (first, second), how))
    assert torch.equal(results[1][0], results[0][0]) and results[1][1] and results[0][1]


def test_the_gradient_of_an_argument_with_no_derivative_raises_as_eager():
    """Asked for together with the other's (a leaf's captured gradient), eager's error."""
    program = OTHER_DERIVED["zeta"]
    errors = []
    for fn in (program, thunder_rs.jit(program)):
        x, q = _positive(4), _positive(4)
        with pytest.raises(NotImplementedError) as error:
            torch.autograd.grad(fn(x, q).sum(), (q, x))
        errors.append(str(error.value))
        assert not x._backward_hooks and torch.autograd.grad(fn(x, q).sum(), q)[0] is not None
    assert errors[1] == errors[0]


def test_a_fallback_of_an_input_the_call_writes_back_gives_it_its_gradient():
    """A write through a complex view (an eager fallback) into a non-leaf argument: its tensor's
    history changes with the write-back, and the fallback's backward still computes its gradient
    (it took the new history for one the backward does not run, and gave none)."""

    def program(z):
        d = z.diagonal(1)
        d.mul_(2)
        return (z * 1).abs().sum() + d.abs().sum()

    grads = []
    for fn in (program, thunder_rs.jit(program)):
        leaf = torch.randn(5, 6, generator=torch.Generator().manual_seed(0), dtype=torch.complex128)
        leaf.requires_grad_()
        grads.append(torch.autograd.grad(fn(leaf * 1), leaf)[0])
    assert torch.allclose(grads[1], grads[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["zeta x", "chunk_cat", "scatter reduce="])
def test_a_call_eager_has_no_derivative_for_runs_without_grad(case):
    program, make_args = UNDERIVED[case]
    torch.manual_seed(0)
    args = make_args()
    with torch.no_grad():
        compiled = thunder_rs.jit(program)(*args)
        assert torch.equal(compiled, program(*args)) and not compiled.requires_grad


@pytest.mark.parametrize("n", [2, 3])
def test_fractional_max_pool_refuses_random_samples_requiring_grad_with_eagers_error(n):
    """Eager refuses them at the call (``non_differentiable``), with its error's type and words."""
    pool = getattr(torch.nn.functional, f"fractional_max_pool{n}d")
    program = lambda x, s: pool(x, 1, output_size=1, _random_samples=s)  # noqa: E731
    args = (torch.rand((1, 1) + (2,) * n), torch.rand(1, 1, n, requires_grad=True))
    with pytest.raises(RuntimeError) as eager:
        program(*args)
    with pytest.raises(RuntimeError) as compiled:
        thunder_rs.jit(program)(*args)
    assert str(eager.value) in str(compiled.value)


class _Doubled(torch.autograd.Function):
    """``2 y``; its backward is given zeros for an undefined gradient (``materialize_grads``)."""

    @staticmethod
    def forward(ctx, y):
        return y * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class _DoubledUnmaterialized(torch.autograd.Function):
    """``2 y``; its backward is given None for an undefined gradient, and gives None."""

    @staticmethod
    def forward(ctx, y):
        ctx.set_materialize_grads(False)
        return y * 2

    @staticmethod
    def backward(ctx, g):
        return None if g is None else g * 2


_LINEAR = torch.nn.Linear(3, 3).double()
#: Programs whose ``scaled_pair`` gives its second input no gradient (the loss reads its first output).
NO_GRADIENT = {
    "add": lambda x, y: scaled_pair(x, y + 1)[0],
    "mul then view": lambda x, y: scaled_pair(x, (y * 2).view(3))[0],
    "view, mul, add, view": lambda x, y: scaled_pair(x, (y.view(3, 1) * y.view(3, 1) + 1).view(3))[0],
    "exp": lambda x, y: scaled_pair(x, y.exp())[0],
    "sum expanded": lambda x, y: scaled_pair(x, y.sum().expand(3))[0],
    "linear": lambda x, y: scaled_pair(x, _LINEAR(y))[0],
    "another fallback's backward": lambda x, y: scaled_pair(x, scaled_pair(y * 2, y)[0])[0],
    "a custom Function's backward (zeros)": lambda x, y: scaled_pair(x, _Doubled.apply(y).view(3))[0],
    "a custom Function's backward (None)": lambda x, y: scaled_pair(x, _DoubledUnmaterialized.apply(y))[0],
    "reached by another path too": lambda x, y: scaled_pair(x, y * 2)[0] + y.sin(),
    "the other input made from it": lambda x, y: scaled_pair(x * y, y * 2)[0],
}


def _no_gradient_inputs():
    torch.manual_seed(0)
    return [torch.randn(3, dtype=torch.float64, requires_grad=True) for _ in range(2)]


def _gradients(program, how: str):
    """The leaves' gradients (None where absent), the linear layer's, or eager's error."""
    _LINEAR.zero_grad(set_to_none=True)
    args = _no_gradient_inputs()
    loss = (program(*args) * torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)).sum()
    try:
        if how == "backward":
            loss.backward()
            grads = [a.grad for a in args]
        else:
            grads = list(torch.autograd.grad(loss, args, allow_unused=how == "allow_unused"))
    except RuntimeError as e:
        return type(e), str(e)
    return [*grads, _LINEAR.weight.grad, _LINEAR.bias.grad]


@pytest.mark.parametrize("how", ["backward", "allow_unused", "grad"])
@pytest.mark.parametrize("case", list(NO_GRADIENT))
def test_a_leaf_only_an_absent_fallback_gradient_reaches_gets_none_as_eager(case, how):
    eager = _gradients(NO_GRADIENT[case], how)
    compiled = _gradients(thunder_rs.jit(NO_GRADIENT[case]), how)
    if isinstance(eager[0], type):
        assert compiled == eager
        return
    assert [g is None for g in compiled] == [g is None for g in eager], (compiled, eager)
    for c, e in zip(compiled, eager):
        assert e is None or torch.equal(c, e)
