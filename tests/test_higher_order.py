"""Higher-order differentiation through compiled calls, against eager: double backward
(gradient penalties, meta-learning), torch.func transforms over jitted functions and modules,
and complex values forward and backward (RoPE, FFT features)."""

import copy

import pytest
import torch
import torch.nn as nn
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, vjp, vmap

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def assert_grads_close(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert (g is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)


# -- double backward -------------------------------------------------------------------------------


class StraightThrough(torch.autograd.Function):
    """Rounds, passing the gradient straight through: its own backward, not round's zero."""

    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, g):
        return g


class QuantizedCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = nn.Linear(108, 8), nn.Linear(8, 1)

    def forward(self, x):
        return self.out(torch.tanh(StraightThrough.apply(self.hidden(x.flatten(1)) * 3)))


class NoGradScale(nn.Module):
    """Scales by a norm computed under no_grad: no gradient flows through the scale, in eager."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(108, 8)

    def forward(self, x):
        h = self.hidden(x.flatten(1))
        with torch.no_grad():
            scale = h.norm()
        return (torch.tanh(h) * h / scale).sum(1)


CRITICS = {
    # R1 / WGAN-GP on a small conv critic.
    "conv": lambda: nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.LeakyReLU(0.2),
        nn.Conv2d(4, 4, 3, stride=2),
        nn.LeakyReLU(0.2),
        nn.Flatten(),
        nn.Linear(4, 1),
    ),
    "mlp_layernorm_gelu": lambda: nn.Sequential(
        nn.Flatten(), nn.Linear(108, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 1)
    ),
    # Running statistics written once per call, as eager writes them.
    "batchnorm": lambda: nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 1)
    ),
    # Its cumulative average (momentum=None): the factor read from num_batches_tracked, written too.
    "batchnorm_cumulative": lambda: nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=None), nn.ReLU(), nn.Flatten(), nn.Linear(64, 1)
    ),
    # A power iteration under no_grad from a vector the call overwrites.
    "spectral_norm": lambda: nn.Sequential(
        nn.Flatten(), nn.utils.parametrizations.spectral_norm(nn.Linear(108, 16)), nn.Tanh(), nn.Linear(16, 1)
    ),
    "dropout": lambda: nn.Sequential(nn.Flatten(), nn.Linear(108, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1)),
    "custom_function": QuantizedCritic,
    "no_grad_scale": NoGradScale,
}


def gradient_penalty_grads(critic, x):
    """WGAN-GP's penalty on the critic's input gradient, differentiated to the critic's parameters
    and the input after another call of the critic (which writes running statistics again); then
    a draw, which shows the generator's state after."""
    (g,) = torch.autograd.grad(critic(x).sum(), x, create_graph=True)
    penalty = (g.flatten(1).norm(2, dim=1) - 1).pow(2).mean()
    other = critic(x.detach() * 2).mean()
    grads = torch.autograd.grad(penalty + other, [*critic.parameters(), x], allow_unused=True)
    return (*grads, torch.rand(3))


@pytest.mark.parametrize("name", CRITICS)
def test_a_gradient_penalty_through_a_compiled_critic_is_eagers(name):
    torch.manual_seed(0)
    critic = CRITICS[name]()
    compiled = thunder_rs.jit(copy.deepcopy(critic))
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    for step in range(3):
        torch.manual_seed(step)
        expected = gradient_penalty_grads(critic, x)
        torch.manual_seed(step)
        assert_grads_close(gradient_penalty_grads(compiled, x), expected)
        for mine, eagers in zip(compiled.buffers(), critic.buffers()):
            torch.testing.assert_close(mine, eagers)


def test_after_a_double_backward_the_entry_runs_under_autograd_as_eager():
    # Its first double backward computes the call again; later calls of the entry (a gradient
    # penalty's every step) run the program under autograd at once, as eager does.
    jf = thunder_rs.jit(lambda x: x.sin().exp().sum())
    x = torch.randn(4, requires_grad=True)
    assert type(jf(x).grad_fn).__name__ == "CompiledFunctionBackward"
    for _ in range(2):
        (g,) = torch.autograd.grad(jf(x), x, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), x)
        (expected,) = torch.autograd.grad(x.sin().exp().sum(), x, create_graph=True)
        torch.testing.assert_close(gg, torch.autograd.grad(expected.sum(), x)[0])
    assert type(jf(x).grad_fn).__name__ == "SumBackward0"
    assert thunder_rs.compile_stats(jf).cache_misses == 1


def test_a_meta_learning_inner_step_through_a_compiled_model_is_eagers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    compiled = thunder_rs.jit(model)
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))

    def meta_grads(m):
        params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
        inner = nn.functional.cross_entropy(functional_call(m, params, (x[:4],)), y[:4])
        steps = torch.autograd.grad(inner, list(params.values()), create_graph=True)
        fast = {k: v - 0.1 * s for (k, v), s in zip(params.items(), steps)}
        outer = nn.functional.cross_entropy(functional_call(m, fast, (x[4:],)), y[4:])
        return torch.autograd.grad(outer, list(params.values()))

    assert_grads_close(meta_grads(compiled), meta_grads(model))


def test_an_input_passed_twice_gets_the_gradient_of_both_uses():
    def f(a, b):
        return (a.sin() * b.exp()).sum()

    x = torch.randn(4, requires_grad=True)
    jf = thunder_rs.jit(f)

    def second(fn):
        (g,) = torch.autograd.grad(fn(x, x), x, create_graph=True)
        return torch.autograd.grad(g.sum(), x)

    assert_grads_close(second(jf), second(f))


def test_outputs_and_cotangents_of_several_outputs_are_eagers():
    def f(x, w):
        return x @ w, [(x * w.sum()).tanh(), x.sum(0)]

    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    jf = thunder_rs.jit(f)

    def second(fn):
        a, (b, c) = fn(x, w)
        gx, gw = torch.autograd.grad((a.sin().sum() + b.pow(3).sum() + c.sum()), (x, w), create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum() + gw.sum(), (x, w))

    assert_grads_close(second(jf), second(f))


def test_a_double_backward_after_the_graph_was_freed_raises_as_eager():
    x = torch.randn(3, requires_grad=True)
    out = thunder_rs.jit(lambda x: x.sin().sum())(x)
    out.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(out, x, create_graph=True)


def test_an_input_written_in_place_before_the_double_backward_raises():
    # x is not saved for the first-order backward (exp saves its result), but computing the
    # call again reads it: a changed value would give other gradients, so it is eager's error.
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    out = thunder_rs.jit(lambda x, w: (x + w).exp().sum())(x, w)
    x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, w, create_graph=True)


def test_a_double_backward_under_saved_tensor_hooks_is_refused_clearly():
    x = torch.randn(3, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        out = thunder_rs.jit(lambda x: x.sin().sum())(x)
    with pytest.raises(ThunderNotImplementedError, match="create_graph=True.*saved_tensors_hooks"):
        torch.autograd.grad(out, x, create_graph=True)
    (g,) = torch.autograd.grad(out, x)  # the first-order backward still runs
    torch.testing.assert_close(g, x.cos())


def test_a_double_backward_under_autocast_is_eagers():
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    compiled = thunder_rs.jit(model)
    x = torch.randn(4, 6, requires_grad=True)

    def penalty(m):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (g,) = torch.autograd.grad(m(x).float().sum(), x, create_graph=True)
            return torch.autograd.grad(g.float().pow(2).sum(), list(model.parameters()), allow_unused=True)

    got, expected = penalty(compiled), penalty(model)
    assert [g is None for g in got] == [e is None for e in expected]
    for g, e in zip(got, expected):
        if e is not None:
            torch.testing.assert_close(g, e, atol=2e-2, rtol=2e-2)


# -- torch.func transforms -------------------------------------------------------------------------


def sin_times(x):
    return (x.sin() * x).sum()


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, x: grad(f)(x),
        lambda f, x: vjp(f, x)[1](torch.tensor(1.0)),
        lambda f, x: jacrev(f)(x),
        lambda f, x: jacfwd(f)(x),
        lambda f, x: hessian(f)(x),
        lambda f, x: vmap(grad(f))(torch.stack([x, 2 * x])),
    ],
    ids=["grad", "vjp", "jacrev", "jacfwd", "hessian", "vmap_grad"],
)
def test_torch_func_over_a_jitted_function_is_eagers(transform):
    x = torch.randn(3)
    jf = thunder_rs.jit(sin_times)
    torch.testing.assert_close(transform(jf, x), transform(sin_times, x))


def test_per_sample_gradients_of_a_jitted_module_are_eagers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    compiled = thunder_rs.jit(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))

    def per_sample(m):
        def loss(p, xb, yb):
            return nn.functional.cross_entropy(functional_call(m, p, (xb.unsqueeze(0),)), yb.unsqueeze(0))

        return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)

    got, expected = per_sample(compiled), per_sample(model)
    assert got.keys() == expected.keys()
    for k in expected:
        torch.testing.assert_close(got[k], expected[k])


def test_vmap_of_a_jitted_module_with_trainable_parameters_is_eagers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))
    twin = copy.deepcopy(model)
    x = torch.randn(3, 6, 4)
    vmap(model)(x).pow(2).sum().backward()
    vmap(thunder_rs.jit(twin))(x).pow(2).sum().backward()
    for mine, eagers in zip(twin.parameters(), model.parameters()):
        torch.testing.assert_close(mine.grad, eagers.grad)


def test_torch_func_over_a_complex_program_is_eagers():
    q = torch.randn(2, 5, 8)
    jf = thunder_rs.jit(lambda q: rope(q, FREQS).sin().sum())
    torch.testing.assert_close(grad(jf)(q), grad(lambda q: rope(q, FREQS).sin().sum())(q))


def test_random_draws_under_a_transform_are_eagers():
    def f(x):
        return nn.functional.dropout(x.exp(), 0.5).sum()

    x = torch.randn(16)
    jf = thunder_rs.jit(f)
    torch.manual_seed(3)
    expected = grad(f)(x)
    torch.manual_seed(3)
    torch.testing.assert_close(grad(jf)(x), expected)


def test_a_module_writing_its_buffers_under_a_transform_is_refused_clearly():
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 1))
    compiled = thunder_rs.jit(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(5, 4)
    with pytest.raises(ThunderNotImplementedError, match="torch.func.*writes its inputs in place.*eval mode"):
        grad(lambda p: functional_call(compiled, p, (x,)).sum())(params)
    model.eval()  # no running statistics written: eager's gradients
    expected = grad(lambda p: functional_call(model, p, (x,)).sum())(params)
    got = grad(lambda p: functional_call(compiled, p, (x,)).sum())(params)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k])


# -- complex values --------------------------------------------------------------------------------


def rope(q, freqs):
    """Llama's rotary embedding: pairs of features as complex numbers, rotated by ``freqs``."""
    qc = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
    return torch.view_as_real(qc * freqs).flatten(-2).type_as(q)


FREQS = torch.polar(torch.ones(5, 4), torch.arange(5.0)[:, None] * torch.linspace(0.1, 1, 4))


def real(*shape):
    return torch.randn(*shape, requires_grad=True)


def cplx(*shape):
    return torch.randn(*shape, dtype=torch.complex64, requires_grad=True)


#: name -> (program, its inputs)
COMPLEX_PROGRAMS = {
    "polar": (
        lambda r, t: torch.polar(r, t).real.sum() + torch.polar(r, t).imag.pow(2).sum(),
        lambda: (torch.rand(4, 3, requires_grad=True), real(4, 3)),
    ),
    "view_as_complex": (lambda a: (torch.view_as_complex(a.reshape(4, 3, 2)) ** 2).abs().sum(), lambda: (real(4, 6),)),
    "mul_abs_angle_conj": (
        lambda z, w: (z * w).abs().sum() + z.angle().sum() + (z * z.conj()).real.sum() + (w.conj() * z).imag.sum(),
        lambda: (cplx(4, 3), cplx(4, 3)),
    ),
    "complex_matmul": (
        lambda z: (z @ z.mH).real.sum() + torch.exp(z).imag.sum() + z[1:, 0].abs().sum(),
        lambda: (cplx(3, 3),),
    ),
    "real_times_imaginary_unit": (lambda x: (x * 1j + x.exp()).abs().sum(), lambda: (real(4, 3),)),
    "torch_complex": (lambda x: torch.complex(x, x.exp()).abs().sum(), lambda: (real(4, 3),)),
    "rfft_magnitude": (lambda x: torch.fft.rfft(x).abs().log1p().sum(), lambda: (real(4, 16),)),
    "rfft_irfft": (
        lambda x: torch.fft.irfft(torch.fft.rfft(x) * torch.linspace(0, 1, 9), n=16).pow(2).sum(),
        lambda: (real(4, 16),),
    ),
    "rope": (lambda q: rope(q, FREQS).pow(2).sum() + rope(q, FREQS)[..., 0].sum(), lambda: (real(2, 5, 8),)),
}


@pytest.mark.parametrize("name", COMPLEX_PROGRAMS)
def test_complex_programs_have_eagers_values_and_gradients(name):
    fn, make_inputs = COMPLEX_PROGRAMS[name]
    torch.manual_seed(0)
    inputs = make_inputs()
    jf = thunder_rs.jit(fn)
    expected, got = fn(*inputs), jf(*inputs)
    torch.testing.assert_close(got, expected)
    assert_grads_close(torch.autograd.grad(got, inputs), torch.autograd.grad(expected, inputs))
    with torch.no_grad():
        torch.testing.assert_close(thunder_rs.jit(fn)(*inputs), fn(*inputs))


def test_a_complex_output_gets_eagers_gradient_from_its_cotangent():
    z = torch.randn(3, dtype=torch.complex64, requires_grad=True)
    w = torch.randn(3, dtype=torch.complex64)
    jf = thunder_rs.jit(lambda z: z * z * w)
    got, expected = jf(z), z * z * w
    torch.testing.assert_close(got, expected)
    cotangent = torch.randn(3, dtype=torch.complex64)
    assert_grads_close(torch.autograd.grad(got, z, cotangent), torch.autograd.grad(expected, z, cotangent))


class RotaryAttention(nn.Module):
    """Meta's Llama attention scores with complex rotary frequencies as a buffer."""

    def __init__(self):
        super().__init__()
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)
        self.register_buffer("freqs_cis", FREQS.clone())

    def forward(self, h):
        q, k = rope(self.q(h), self.freqs_cis), rope(self.k(h), self.freqs_cis)
        return torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, -1).sum()


def test_complex_rotary_embedding_in_a_module_trains_and_double_backpropagates_as_eager():
    torch.manual_seed(0)
    model = RotaryAttention()
    compiled = thunder_rs.jit(model)
    h = torch.randn(2, 5, 8, requires_grad=True)
    params = [h, *model.parameters()]
    assert_grads_close(torch.autograd.grad(compiled(h), params), torch.autograd.grad(model(h), params))

    def penalty_grads(m):
        (g,) = torch.autograd.grad(m(h), h, create_graph=True)
        return torch.autograd.grad(g.pow(2).sum(), list(model.parameters()))

    assert_grads_close(penalty_grads(compiled), penalty_grads(model))
    # The complex calls are traced (``torch/complex_values.py``): no eager fallback.
    assert thunder_rs.examine(model, h).fallbacks == {}


def test_in_place_updates_of_complex_values_with_gradients_are_eagers():
    def f(x):
        z = torch.view_as_complex(x.reshape(3, 2)) * 1
        z.mul_(2 + 1j)
        z += x[:3]
        return z.abs().sum()

    x = torch.randn(6, requires_grad=True)
    assert_grads_close(torch.autograd.grad(thunder_rs.jit(f)(x), x), torch.autograd.grad(f(x), x))


def test_a_write_into_part_of_a_complex_tensor_with_gradients_is_eagers():
    def f(x):
        z = torch.view_as_complex(x.reshape(3, 2)) * 1
        z[0] *= 2
        return z.abs().sum()

    x = torch.randn(6, requires_grad=True)
    assert_grads_close(torch.autograd.grad(thunder_rs.jit(f)(x), x), torch.autograd.grad(f(x), x))


@pytest.mark.parametrize(
    "fn",
    [torch.angle, torch.conj, torch.conj_physical, torch.real, lambda z: z.mH @ z, lambda z: torch.sgn(z) * z.abs()],
)
def test_complex_values_without_gradients_are_eagers(fn):
    z = torch.randn(3, 3, dtype=torch.complex64)
    torch.testing.assert_close(thunder_rs.jit(fn)(z), fn(z))


def _shared_residual_read_by_two_nodes(x, w):
    h = x + w
    return h.sin().sum(), h.cos().sum()


@pytest.mark.xfail(
    strict=True,
    reason="the call frees the residuals a backward read (h, read for both SinBackward0 and CosBackward0), so a "
    "second backward from the other output raises eager's 'second time' error, where eager's runs: each node "
    "saved h itself, and AddBackward0 saves nothing. run.saving_nodes tells this case (no node of SAVING both "
    "reach), but only raises from it: SAVING lists the calls known to save (not conv2d, custom ops, opaque "
    "fallbacks), so computing the freed residuals again where it finds no shared node would run a shared "
    "convolution's second backward, where eager raises. Keeping them needs the residuals each backward pattern "
    "reads at the first (a backward compile per entry of loss, logits training)",
    raises=RuntimeError,
)
def test_a_second_backward_from_another_output_reading_a_residual_the_first_read_runs_as_eagers():
    """Eager's ``b.backward()`` after ``a.backward()`` runs CosBackward0 and AddBackward0, neither of
    which ``a.backward()`` freed; the compiled call freed ``h`` after the first backward read it."""
    grads = []
    x0, w0 = torch.randn(3), torch.randn(3)
    for fn in (_shared_residual_read_by_two_nodes, thunder_rs.jit(_shared_residual_read_by_two_nodes)):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        a, b = fn(x, w)
        a.backward()
        b.backward()
        grads.append((x.grad, w.grad))
    assert_grads_close(grads[1], grads[0])


def test_a_second_backward_through_a_shared_node_of_one_call_raises_as_eagers():
    """Two outputs of one call share ``x @ w`` (eager: one ``MmBackward0`` saving ``x`` and ``w``).
    After ``a.backward()``, eager's ``b.backward()`` raises ("backward through the graph a second
    time"): the node's saved tensors were freed. The compiled call frees the residuals a backward
    read but not its inputs (the caller holds them): the second backward ran, accumulating the
    gradients ``retain_graph=True`` would give, until the call's second backward asked which of its
    top-level calls both reach (``run.saving_nodes``)."""

    def f(x, w):
        h = x @ w
        return h.sin().sum(), (h * 2).cos().sum()

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    for fn in (f, thunder_rs.jit(f)):
        a, b = fn(x, w)
        a.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            b.backward()
