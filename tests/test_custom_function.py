"""Custom torch.autograd.Functions inside jitted programs: their own backward, not the gradient
of their forward, gives the gradients, as in eager."""

import copy

import pytest
import torch
from torch.autograd.function import once_differentiable

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError


class ScaledSquare(torch.autograd.Function):
    """A backward that is not the forward's derivative (3·x instead of 2·x) times a scale."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * ctx.scale * g * x, None


class GradientReversal(torch.autograd.Function):
    @staticmethod
    def forward(x, alpha):
        return x.view_as(x) * 1.0

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.alpha = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return -ctx.alpha * g, None


class StraightThroughRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        return g


class MulAdd(torch.autograd.Function):
    """Two inputs (one may not need a gradient), two outputs, an intermediate saved."""

    @staticmethod
    def forward(ctx, a, b):
        e = a.exp()
        ctx.save_for_backward(e, b)
        return e * b, a + b

    @staticmethod
    def backward(ctx, g_prod, g_sum):
        e, b = ctx.saved_tensors
        grad_a = g_prod * e * b + g_sum if ctx.needs_input_grad[0] else None
        grad_b = g_prod * e + g_sum if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


class MaxWithIndex(torch.autograd.Function):
    """A non-differentiable integer output next to a differentiable one."""

    @staticmethod
    def forward(ctx, x):
        values, index = x.max(dim=-1)
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(index)
        ctx.shape = x.shape
        return values, index

    @staticmethod
    def backward(ctx, g, g_index):
        (index,) = ctx.saved_tensors
        return torch.zeros(ctx.shape, dtype=g.dtype).scatter(-1, index.unsqueeze(-1), g.unsqueeze(-1))


class BroadcastGrad(torch.autograd.Function):
    """A backward returning a gradient that broadcasts to the input: autograd sums it down."""

    @staticmethod
    def forward(ctx, bias, x):
        return x + bias

    @staticmethod
    def backward(ctx, g):
        return 2 * g, g


def _programs():
    return {
        "own_backward_with_attributes": (lambda x, y: ScaledSquare.apply(x, 0.5).sin() + y, 2),
        "setup_context_style": (lambda x, y: (GradientReversal.apply(x.tanh(), 0.3) * y).sum(-1), 2),
        "once_differentiable_straight_through": (lambda x, y: StraightThroughRound.apply(x * 4) * y, 2),
        "two_inputs_two_outputs": (lambda x, y: sum(t.sum() for t in MulAdd.apply(x, y)), 2),
        "non_differentiable_output": (lambda x, y: MaxWithIndex.apply(x * y)[0] * 2, 2),
        "gradient_summed_to_the_input_shape": (lambda x, y: BroadcastGrad.apply(y[0], x).cos(), 2),
    }


@pytest.mark.parametrize("name", list(_programs()))
@pytest.mark.parametrize("needs", ["both", "first", "second"])
def test_gradients_come_from_the_functions_backward(name, needs):
    fn, _ = _programs()[name]
    torch.manual_seed(0)
    x, y = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    inputs = [t.requires_grad_(needs in ("both", which)) for t, which in ((x, "first"), (y, "second"))]
    reference = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    jfn = thunder_rs.jit(fn)
    for _ in range(2):
        out, expected = jfn(*inputs), fn(*reference)
        torch.testing.assert_close(out, expected)
        cotangent = torch.randn_like(expected)
        out.backward(cotangent)
        expected.backward(cotangent)
        for t, r in zip(inputs, reference):
            torch.testing.assert_close(t.grad, r.grad)


def test_without_grad_only_the_forward_runs():
    fn = lambda x: ScaledSquare.apply(x, 2.0) + 1  # noqa: E731
    x = torch.randn(5, requires_grad=True)
    with torch.no_grad():
        out = thunder_rs.jit(fn)(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, x.detach() ** 2 + 1)


def test_a_module_using_a_function_trains_as_eager():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(6, 8), torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.b(GradientReversal.apply(self.a(x).relu(), 0.7)).square().mean()

    torch.manual_seed(0)
    model, reference = Model(), Model()
    reference.load_state_dict(model.state_dict())
    jmodel = thunder_rs.jit(model)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference))
    for step in range(3):
        x = torch.randn(4, 6)
        for m, o in ((jmodel, opt), (reference, ref_opt)):
            o.zero_grad()
            m(x).backward()
            o.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


class ThroughLayers(torch.autograd.Function):
    """Reformer's ``_ReversibleFunction``, in small: the forward runs the layers it is given (a
    module, not a tensor), whose parameters get no gradient through the Function; its backward
    scales the cotangent by the output."""

    @staticmethod
    def forward(ctx, x, layers):
        for layer in layers:
            x = layer(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y, None


class Reversible(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.LayerNorm(4), torch.nn.Linear(4, 4)])
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(ThroughLayers.apply(x, self.layers))


@pytest.mark.parametrize("grad", [True, False], ids=["train", "no_grad"])
def test_a_function_given_a_module_runs_its_layers_as_eager(grad):
    # Raised "stored a tensor it computed (input t1) in entry 'weight' of a dict (attribute
    # '_parameters' of a LayerNorm)": the call records the module's clone, whose slots hold the
    # parameters' stand-ins; then the compiled call was given None for the parameters the
    # Function's forward reads (read inside the call, not among its arguments).
    torch.manual_seed(0)
    model = Reversible()
    reference = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for _ in range(2):
        x = torch.randn(3, 4, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        with torch.set_grad_enabled(grad):
            out, expected = jmodel(x), reference(x2)
        torch.testing.assert_close(out, expected)
        if grad:
            out.square().sum().backward()
            expected.square().sum().backward()
            torch.testing.assert_close(x.grad, x2.grad)
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                assert (p.grad is None) == (q.grad is None), name
                if q.grad is not None:
                    torch.testing.assert_close(p.grad, q.grad)
        with torch.no_grad():
            for p, q in zip(model.parameters(), reference.parameters()):
                p.add_(0.1), q.add_(0.1)
            model.zero_grad(), reference.zero_grad()


class Dirty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x.mul_(2)

    @staticmethod
    def backward(ctx, g):
        return 2 * g


class TooFewGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return x * y

    @staticmethod
    def backward(ctx, g):
        return g


def test_what_a_trace_cannot_keep_is_refused_naming_the_function():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(ThunderNotImplementedError, match="Dirty.forward marks its inputs dirty"):
        thunder_rs.jit(lambda t: Dirty.apply(t * 1))(x)
    with pytest.raises(ThunderRuntimeError, match="TooFewGradients.backward returned an incorrect number"):
        thunder_rs.jit(lambda t: TooFewGradients.apply(t, t))(x)


class _GradReverse(GradientReversal):
    """The gradient reversal layer as domain-adversarial training writes it: its forward returns
    its input as it is (``GradientReversal``'s multiplies it by 1)."""

    @staticmethod
    def forward(x, alpha):
        return x.view_as(x)


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 3


@pytest.mark.parametrize(
    "program",
    [
        lambda x: _GradReverse.apply(x.sin(), 0.5).cos().sum(),
        lambda x: _GradReverse.apply(x, 2.0).sum(),
        lambda x: _Identity.apply(x * 2).sum(),
    ],
)
def test_a_function_that_returns_its_input_is_differentiated_by_its_backward(program):
    x = torch.randn(3, requires_grad=True)
    program(x).backward()
    expected, x.grad = x.grad, None
    jprogram = thunder_rs.jit(program)
    torch.testing.assert_close(jprogram(x), program(x))
    jprogram(x).backward()
    torch.testing.assert_close(x.grad, expected)


class _SignStraightThrough(torch.autograd.Function):
    """Binarised weights (BinaryConnect): sign forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        return x.sign()

    @staticmethod
    def backward(ctx, g):
        return g


class _ScaledUnderNoGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        with torch.no_grad():
            return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class _GradModeInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * (1.0 if torch.is_grad_enabled() else 3.0)

    @staticmethod
    def backward(ctx, g):
        return g


@pytest.mark.parametrize(
    "fn",
    [_SignStraightThrough, _ScaledUnderNoGrad, _GradModeInForward],
    ids=["sign_ste", "no_grad_forward", "grad_mode_read"],
)
def test_a_functions_outputs_require_grad_and_its_forward_runs_without_grad_as_in_eager(fn):
    def program(x):
        y = fn.apply(x)
        return (y * x).sum()

    x = torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64, requires_grad=True)
    eager_x = x.detach().clone().requires_grad_()
    out, expected = thunder_rs.jit(program)(x), program(eager_x)
    torch.testing.assert_close(out, expected)
    out.backward()
    expected.backward()
    torch.testing.assert_close(x.grad, eager_x.grad)


class _Sorted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        values, indices = x.sort()
        doubled = values * 2
        ctx.mark_non_differentiable(indices, doubled)
        return values, indices, doubled

    @staticmethod
    def backward(ctx, g, g_indices, g_doubled):
        return g


def test_outputs_marked_non_differentiable_do_not_require_grad():
    x = torch.randn(4, requires_grad=True)
    values, indices, doubled = thunder_rs.jit(lambda x: _Sorted.apply(x))(x)
    assert values.requires_grad and not indices.requires_grad and not doubled.requires_grad


class _AmpMatmul(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.T, a.T @ g


class _Fp32Matmul(_AmpMatmul):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b


@pytest.mark.parametrize("fn", [_AmpMatmul, _Fp32Matmul], ids=["autocast_forward", "cast_inputs"])
def test_autocast_applies_inside_a_functions_forward_as_in_eager(fn):
    def program(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn.apply(x, w)

    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 2, requires_grad=True)
    ex, ew = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    out, expected = thunder_rs.jit(program)(x, w), program(ex, ew)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close((x.grad, w.grad), (ex.grad, ew.grad))


class _ScaledProduct(torch.autograd.Function):
    @staticmethod
    def forward(x, w, scale=2.0):
        return x @ w * scale

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, scale = inputs  # eager binds the default into the inputs
        ctx.save_for_backward(x, w)
        ctx.scale = scale

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w.T * ctx.scale, x.T @ g * ctx.scale, None, None  # a trailing None more than inputs


@pytest.mark.parametrize(
    "call",
    [lambda x, w: _ScaledProduct.apply(x, w), lambda x, w: _ScaledProduct.apply(x, w, scale=3.0)],
    ids=["default", "keyword"],
)
def test_setup_context_sees_bound_defaults_and_trailing_none_gradients_are_accepted(call):
    x, w = torch.randn(2, 3, requires_grad=True), torch.randn(3, 2, requires_grad=True)
    ex, ew = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    out, expected = thunder_rs.jit(call)(x, w), call(ex, ew)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close((x.grad, w.grad), (ex.grad, ew.grad))


class _SetupMatmul(torch.autograd.Function):
    """``x @ w`` with a backward of its own, in the ``setup_context`` style."""

    @staticmethod
    def forward(x, w):
        return x @ w

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w.t() * 2, x.t() @ grad


def _mul_add_loss(layer, held, x):
    product, total = MulAdd.apply(layer(x), held)
    return product.pow(2).sum() + total.sum()


def _setup_matmul_loss(layer, held, x):
    return _SetupMatmul.apply(layer(x), held).pow(2).sum()


@pytest.mark.parametrize(
    "loss_of, held_shape", [(_mul_add_loss, (4,)), (_setup_matmul_loss, (4, 4))], ids=["forward(ctx)", "setup_context"]
)
def test_a_parameter_the_program_holds_gets_its_gradient_from_the_functions_backward(loss_of, held_shape):
    # A parameter read through a closure (a model the jitted loss function calls, not the jitted
    # module) went into the Function as a constant: it got no gradient (grad None), where eager's
    # backward gives it one.
    torch.manual_seed(0)
    layer, held = torch.nn.Linear(4, 4), torch.nn.Parameter(torch.randn(held_shape))

    def loss(x):
        return loss_of(layer, held, x)

    x = torch.randn(3, 4)
    loss(x).backward()
    params = [layer.weight, layer.bias, held]
    expected = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    thunder_rs.jit(loss)(x).backward()
    for p, grad in zip(params, expected):
        assert p.grad is not None
        torch.testing.assert_close(p.grad, grad)


class _QuantizedLinear(torch.nn.Linear):
    """Quantisation-aware training: the weight rounded to quarters, straight through."""

    def forward(self, x):
        return torch.nn.functional.linear(x, StraightThroughRound.apply(self.weight), self.bias)


def test_a_function_of_a_held_parameter_alone_is_traced_with_its_backward():
    # Given no traced tensor, the Function ran eagerly inside the trace: the weight of a model the
    # jitted loss function calls got no gradient.
    torch.manual_seed(0)
    layer = _QuantizedLinear(4, 4)

    def loss(x):
        return layer(x).pow(2).sum()

    jloss = thunder_rs.jit(loss)
    for step in range(2):
        x = torch.randn(3, 4)
        expected = loss(x)
        expected.backward()
        grads = [p.grad for p in layer.parameters()]
        layer.zero_grad(set_to_none=True)
        out = jloss(x)
        out.backward()
        torch.testing.assert_close(out, expected)
        for p, grad in zip(layer.parameters(), grads):
            torch.testing.assert_close(p.grad, grad)
        with torch.no_grad():
            layer.weight.add_(0.3)
        layer.zero_grad(set_to_none=True)
