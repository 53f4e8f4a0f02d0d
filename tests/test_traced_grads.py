"""``torch.func.grad`` and ``grad_and_value`` inside a jitted program, traced as ops of the program
(``core.lang.traced_grads``: the function's calls, then their backward from thunder_rs's VJP
rules), not run as one eager call: values against eager's torch.func, ``requires_grad`` of the
results as eager's, gradients of the program through the transform (a gradient penalty), nested
grads, and what still runs as an eager call (a backward through an eager fallback) or raises
eager's error."""

import re

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

torch.manual_seed(0)


def exactly(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def traced(program, *args) -> bool:
    """Whether the program's trace holds no eager call (the transform was traced)."""
    return thunder_rs.examine(program, *args).fallbacks == {}


def loss(w, b, x):
    return ((x @ w + b).sin() * x.sum()).pow(2).mean()


CASES = {
    "grad": lambda w, b, x: torch.func.grad(loss)(w, b, x),
    "argnums": lambda w, b, x: torch.func.grad(loss, argnums=(0, 1))(w, b, x),
    "grad_and_value": lambda w, b, x: torch.func.grad_and_value(loss, argnums=1)(w, b, x),
    "has_aux": lambda w, b, x: torch.func.grad(lambda w: (loss(w, b, x), w.cos()), has_aux=True)(w),
    "dict": lambda w, b, x: torch.func.grad(lambda p: loss(p["w"], p["b"], x))({"w": w, "b": b}),
    "unused": lambda w, b, x: torch.func.grad(lambda w, b: (b * 2).sum(), argnums=(0, 1))(w, b),
    "nested": lambda w, b, x: torch.func.grad(torch.func.grad(lambda t: t.sin() * t.exp()))(b[0]),
    "under_no_grad": lambda w, b, x: _under_no_grad(w, b, x),
}


def _under_no_grad(w, b, x):
    with torch.no_grad():  # (torch.func's grad differentiates inside no_grad all the same)
        return torch.func.grad(loss)(w, b, x)


@pytest.mark.parametrize("program", CASES.values(), ids=CASES.keys())
def test_grads_are_traced_with_eagers_values(program):
    w, b, x = torch.randn(4, 3), torch.randn(3), torch.randn(2, 4)
    exactly(thunder_rs.jit(program)(w, b, x), program(w, b, x))
    assert traced(program, w, b, x)


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("no_grad", [False, True])
def test_results_require_grad_as_eagers(requires_grad, no_grad):
    """Traced with its inputs requiring grad, the function's values require grad only where eager's
    outer level gives them gradients."""

    def program(x):
        g, value = torch.func.grad_and_value(lambda x: (x.sin() * x).sum())(x)
        return g, value, g * 2

    x = torch.randn(3, requires_grad=requires_grad)
    with torch.set_grad_enabled(not no_grad):
        actual, expected = thunder_rs.jit(program)(x), program(x)
    assert [t.requires_grad for t in actual] == [t.requires_grad for t in expected]
    exactly([t.detach() for t in actual], [t.detach() for t in expected])


CRITICS = {
    "sin": lambda h: h.sin() * h,
    "tanh": torch.tanh,
    "leaky_relu": lambda h: F.leaky_relu(h, 0.2),
    "gelu": F.gelu,
    "softmax": lambda h: h.softmax(-1) * h,
    "layer_norm": lambda h: F.layer_norm(h, (3,)) * h,
    "batch_norm": lambda h: F.batch_norm(h, None, None, training=True) * h,
}


@pytest.mark.parametrize("critic", CRITICS.values(), ids=CRITICS.keys())
def test_the_programs_gradient_through_a_traced_grad_is_eagers(critic):
    """WGAN-GP's penalty: the program's backward differentiates the grad's backward, which is
    then traced through the composites' decompositions (their grad rules' backward kernels, such
    as tanh_backward, have no gradient of their own)."""

    def gradient_penalty(x, w):
        g = torch.func.grad(lambda x: critic(x @ w).sum())(x)
        return critic(x @ w).mean() + ((g.pow(2).sum(-1).sqrt() - 1) ** 2).mean()

    torch.manual_seed(0)
    x, w = torch.randn(5, 4), torch.randn(4, 3, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()
    jitted = thunder_rs.jit(gradient_penalty)
    for _ in range(2):
        w.grad = w2.grad = None
        out, expected = jitted(x, w), gradient_penalty(x, w2)
        out.backward()
        expected.backward()
        torch.testing.assert_close((out, w.grad), (expected, w2.grad))
    assert not any(name.startswith("torch.func") for name in thunder_rs.last_traces(jitted)[0].symbol_names())


def test_layer_norm_in_a_grad_the_programs_gradient_goes_through_is_traced():
    # layer_norm's grad rule records native_layer_norm whole (its backward kernel has no gradient):
    # where the program's gradient may go through the grad, its kernels are recorded with their
    # decompositions, which the VJP pass differentiates twice (it ran as one eager call).
    def program(x, w):
        g = torch.func.grad(lambda x: F.layer_norm(x @ w, (3,)).pow(3).sum())(x)
        return (g.norm(dim=-1) - 1).pow(2).mean()

    torch.manual_seed(0)
    x, w = torch.randn(5, 4), torch.randn(4, 3, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()
    jitted = thunder_rs.jit(program)
    out, expected = jitted(x, w), program(x, w2)
    out.backward()
    expected.backward()
    # (layer_norm's second derivative over 3 elements is ill-conditioned in float32: eager's and
    # thunder_rs's each differ from float64's by about 1e-5 relative)
    torch.testing.assert_close((out, w.grad), (expected, w2.grad), rtol=1e-4, atol=1e-5)
    assert "torch.func.grad" not in thunder_rs.last_traces(jitted)[0].symbol_names()
    with torch.no_grad():  # without the program's gradient, the grad is traced with the rules' kernels
        exactly(jitted(x, w), program(x, w))
        assert "torch.func.grad" not in thunder_rs.last_traces(jitted)[0].symbol_names()


def test_a_function_whose_backward_is_an_eager_fallback_runs_as_one_eager_call():
    def program(x):
        return torch.func.grad(lambda x: torch.linalg.det(torch.outer(x, x) + torch.eye(3)))(x)

    x = torch.randn(3)
    exactly(thunder_rs.jit(program)(x), program(x))
    assert thunder_rs.examine(program, x).fallbacks == {"torch.func.grad": 1}


def test_what_torch_func_refuses_raises_eagers_error():
    with pytest.raises(RuntimeError, match=r"Expected f\(\*args\) to return a scalar Tensor, got tensor with 1 dims"):
        thunder_rs.jit(lambda x: torch.func.grad(torch.sin)(x))(torch.randn(3))


def test_a_grad_made_before_tracing_is_traced():
    g = torch.func.grad(lambda w, x: F.cross_entropy(x @ w, torch.tensor([0, 2])))

    def program(w, x):
        return g(w, x) * 2

    w, x = torch.randn(4, 3), torch.randn(2, 4)
    exactly(thunder_rs.jit(program)(w, x), program(w, x))
    assert traced(program, w, x)


def test_a_traced_grad_reads_each_calls_sizes():
    def program(x):
        return torch.func.grad(lambda x: (x * x.shape[0]).sin().sum())(x)

    jitted = thunder_rs.jit(program)
    for n in (3, 4, 5):
        x = torch.randn(n)
        exactly(jitted(x), program(x))


def test_autograd_grad_inside_the_program_is_refused_naming_the_line():
    # What a gradient penalty written with torch.autograd.grad(create_graph=True) gets; written
    # with torch.func.grad, it is traced (test_the_programs_gradient_through_a_traced_grad_is_eagers).
    def program(x):
        return torch.autograd.grad(x.sin().sum(), x, create_graph=True)[0]

    with pytest.raises(NotImplementedError, match=r"torch\.autograd\.grad: .* at .*test_traced_grads\.py:\d+"):
        thunder_rs.jit(program)(torch.randn(3, requires_grad=True))


def vjp_program(x, w):
    y, vjp_fn = torch.func.vjp(lambda x, w: (x @ w).sin() * x.sum(), x, w)
    gx, gw = vjp_fn(torch.ones_like(y) * 2)
    return y, gx, gw, vjp_fn(y)[1]  # (called twice: a backward each)


def test_vjp_is_traced_with_eagers_values_and_gradients():
    x, w = torch.randn(2, 4), torch.randn(4, 3, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()
    actual, expected = thunder_rs.jit(vjp_program)(x, w), vjp_program(x, w2)
    exactly(actual, expected)
    assert [t.requires_grad for t in actual] == [t.requires_grad for t in expected]
    sum(t.sum() for t in actual).backward()
    sum(t.sum() for t in expected).backward()
    torch.testing.assert_close(w.grad, w2.grad)
    assert traced(vjp_program, x, w)


def test_vjps_function_reuses_the_forwards_values_as_eager_does():
    # Eager runs the forward once; each call of the vjp function runs only the backward (the
    # forward was traced again per call, which CSE did not merge).
    x, w = torch.randn(2, 4), torch.randn(4, 3)
    names = thunder_rs.last_traces(_jitted_once(vjp_program, x, w))[0].symbol_names()
    assert names.count("ltorch.sin") == 1 and names.count("ltorch.matmul") == 1 + 2 * 2


def test_a_vjp_under_vmap_reuses_its_forward():
    def program(x, w):
        def row(r):
            y, vjp_fn = torch.func.vjp(lambda r: (r @ w).tanh(), r)
            return vjp_fn(y)[0]

        return torch.vmap(row)(x)

    x, w = torch.randn(5, 4), torch.randn(4, 3)
    jitted = thunder_rs.jit(program)
    torch.testing.assert_close(jitted(x, w), program(x, w))
    assert thunder_rs.last_traces(jitted)[0].symbol_names().count("ltorch.tanh") == 1
    assert traced(program, x, w)


def _jitted_once(program, *args):
    jitted = thunder_rs.jit(program)
    exactly(jitted(*args), program(*args))
    return jitted


def test_vjp_with_argnums_and_aux_as_a_jacrev_made_before_tracing_calls_it():
    # jacrev's function calls torch's _vjp_with_argnums, then vmaps the vjp function over a basis.
    # (Was 1 ulp apart with AVX-512 kernels: the vmapped vjp recomputed x @ w as a bmm over the basis.)
    jac = torch.func.jacrev(lambda x, w: ((x @ w).sin(), x.cos()), argnums=1, has_aux=True)
    unfit = torch.func.jacrev(lambda x: torch.linalg.det(torch.outer(x, x) + torch.eye(3)))

    def program(x, w):
        return jac(x, w), unfit(x[0, :3])

    x, w = torch.randn(2, 4), torch.randn(4, 3)
    exactly(thunder_rs.jit(program)(x, w), program(x, w))
    # The jacobian's vmap of the vjp is traced; det's backward is not: its vmap is an eager call.
    assert thunder_rs.examine(program, x, w).fallbacks == {"torch.func.vmap": 1}


#: name -> (program, the forward's nonlinear ops): jacobians whose forward eager computes once.
_JACOBIANS = {
    "jacrev": (lambda x, w: torch.func.jacrev(lambda w: (x @ w).sin())(w), "sin|cos"),
    "jacfwd": (lambda x, w: torch.func.jacfwd(lambda w: (x @ w).sin())(w), "sin|cos"),
    "hessian": (lambda x, w: torch.func.hessian(lambda w: (x @ w).sin().sum())(w), "sin|cos"),
    "jacrev-of-two": (
        lambda x, w: torch.func.jacrev(lambda x, w: (x @ w).sin() * x.sum(), argnums=(0, 1))(x, w),
        "sin|cos",
    ),
    # (relu's backward kernel, recorded whole, batched as an elementwise kernel)
    "jacrev-mlp": (lambda x, w: torch.func.jacrev(lambda w: torch.relu(x @ w) @ w.T)(w), "relu"),
}


def _computed(jitted, ops: str) -> list[str]:
    """The shapes the execution trace computes the calls ``ops`` (a regex alternation) at."""
    lines = str(thunder_rs.last_traces(jitted)[-1]).splitlines()
    found = [ln for ln in lines if re.search(rf"^ *t\d+ = .*[._ ]({ops})_?\(", ln)]
    return [re.search(r'f32\[([\d, ]*)\]"$', ln)[1] for ln in found]


@pytest.mark.parametrize("name", list(_JACOBIANS))
def test_a_jacobians_forward_is_computed_once_unbatched_as_eager(name):
    # functorch computes the forward once, unbatched, and vmaps only the backward (jacrev: the vjp
    # over the basis of cotangents; jacfwd: the jvp over the basis of tangents) against its values.
    # thunder_rs traced the vjp (jvp) again under the vmap, the primals expanded over the basis: x @ w
    # a bmm and sin's cos of a (basis, 2, 3) product, 1 ulp from eager's with AVX-512 kernels.
    program, nonlinear = _JACOBIANS[name]
    x, w = torch.randn(2, 4), torch.randn(4, 3)
    jitted = thunder_rs.jit(program)
    exactly(jitted(x, w), program(x, w))
    assert _computed(jitted, "matmul|mm|bmm").count("2, 3") == 1  # (one x @ w; jacfwd's J t is a product too)
    assert set(_computed(jitted, nonlinear)) == {"2, 3"}  # (of the one product, and its derivative's)
    assert traced(program, x, w)


def test_a_vmapped_jvp_whose_function_reads_a_batched_value_is_traced_under_the_levels():
    # The forward of a jvp of unbatched primals under torch.vmap is traced outside the levels (as
    # jacfwd's, above), but not where the function reads a value the levels batch (its closure's
    # x): outside them the physical (5, 3) x was read as one unbatched value.
    def program(xs, w, ts):
        return torch.vmap(lambda x, t: torch.func.jvp(lambda w: (w * x).sin(), (w,), (t,)))(xs, ts)

    xs, w, ts = torch.randn(5, 3), torch.randn(3), torch.randn(5, 3)
    exactly(thunder_rs.jit(program)(xs, w, ts), program(xs, w, ts))


def test_a_vjp_of_random_draws_is_traced_once_as_eager_draws_them():
    # The vjp function differentiates the forward's own ops (eager runs the forward once): its
    # gradient follows the mask the forward drew (it was refused: a second trace would draw again).
    def program(x):
        y, vjp_fn = torch.func.vjp(lambda x: F.dropout(x, 0.5, training=True), x)
        return y, vjp_fn(torch.ones_like(y))[0]

    x = torch.rand(64) + 1
    torch.manual_seed(1)
    actual = thunder_rs.jit(program)(x)
    torch.manual_seed(1)
    exactly(actual, program(x))
    exactly(actual[1], (actual[0] != 0) * 2.0)
    assert traced(program, x)


def test_a_vjp_function_that_cannot_be_traced_is_refused_naming_the_transform():
    def program(x):
        y, vjp_fn = torch.func.vjp(lambda x: torch.linalg.det(torch.outer(x, x) + torch.eye(3)), x)
        return vjp_fn(torch.ones_like(y))

    with pytest.raises(NotImplementedError, match=r"torch\.func\.vjp at .*test_traced_grads\.py:\d+: .*eager fallback"):
        thunder_rs.jit(program)(torch.randn(3))


def test_forward_mode_ad_through_dual_tensors_equals_eagers():
    """(was refused: ``torch._make_dual``; now traced by ``core.lang.dual_tensors``)"""

    def dual(x):
        with torch.autograd.forward_ad.dual_level():
            made = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
            return torch.autograd.forward_ad.unpack_dual(made.sin()).tangent

    x = torch.randn(3)
    assert torch.equal(thunder_rs.jit(dual)(x), dual(x))


buffer = torch.zeros(3)


def test_in_place_writes_functorch_refuses_are_refused_and_its_arguments_written_as_eager():
    def captured(x):
        buffer.add_(1)  # (a tensor the function captured: functorch refuses to mutate it)
        return (x * x).sum()

    def leaf(x):
        x.mul_(2)  # (the differentiated argument: a leaf that requires grad)
        return x.sin().sum()

    def argument(x, b):
        b.add_(1)  # (an argument not differentiated: functorch writes it)
        return (x * b).sum()

    x = torch.randn(3)
    for program, error in (
        (lambda x: torch.func.grad(captured)(x), "would mutate a captured Tensor"),
        (lambda x: torch.func.grad(leaf)(x), "a leaf Variable that requires grad is being used in an in-place"),
        (lambda x: torch.func.vjp(captured, x)[0], "would mutate a captured Tensor"),
        (lambda x: torch.func.vjp(leaf, x)[0], "a leaf Variable that requires grad is being used in an in-place"),
    ):
        with pytest.raises(RuntimeError, match=error):
            program(x.clone())
        with pytest.raises(RuntimeError, match=error):
            thunder_rs.jit(program)(x.clone())
    assert buffer.eq(0).all()

    def program(x, b):
        return torch.func.grad(argument)(x, b), b

    b1, b2 = torch.zeros(3), torch.zeros(3)
    exactly(thunder_rs.jit(program)(x, b1), program(x, b2))
    assert traced(program, x, torch.zeros(3))


def test_a_grad_that_writes_an_argument_and_then_cannot_be_traced_is_refused_naming_it():
    # Its write was traced (the argument's proxy stands for the written value): an eager call of
    # the transform after it would write the argument twice.
    def writes_then_det(x, b):
        b.add_(1)
        return torch.linalg.det(torch.outer(x, x) + torch.eye(3)) * b.sum()

    def program(x, b):
        return torch.func.grad(writes_then_det)(x, b), b

    program(torch.randn(3), torch.zeros(3))
    with pytest.raises(NotImplementedError, match=r"torch\.func\.grad at .*test_traced_grads\.py:\d+: .*writes"):
        thunder_rs.jit(program)(torch.randn(3), torch.zeros(3))


def test_module_parameters_read_inside_a_traced_grad_get_eagers_gradients():
    # The eager call refuses them (its result would carry no gradient to them); traced, the
    # program's backward differentiates the grad's backward into them.
    layer = torch.nn.Linear(3, 3)
    twin = torch.nn.Linear(3, 3)
    twin.load_state_dict(layer.state_dict())

    def of(module):
        return lambda x: torch.func.grad(lambda x: module(x).sin().sum())(x).pow(2).sum()

    x = torch.randn(2, 3)
    thunder_rs.jit(of(layer))(x).backward()
    of(twin)(x).backward()
    torch.testing.assert_close((layer.weight.grad, layer.bias.grad), (twin.weight.grad, twin.bias.grad))


def close(actual, expected):
    """(forward mode traced as reverse mode twice: other kernels than eager's dual numbers)"""
    torch.testing.assert_close(actual, expected)


JVPS = {
    "jvp": lambda w, b, x: torch.func.jvp(lambda w, b: loss(w, b, x), (w, b), (w.cos(), b.sin())),
    "elementwise": lambda w, b, x: torch.func.jvp(lambda w: (w.tanh() * w.sum()).exp(), (w,), (w.cos(),)),
    "has_aux": lambda w, b, x: torch.func.jvp(lambda w: ((x @ w).sin(), w.cos()), (w,), (w.cos(),), has_aux=True),
    "dict": lambda w, b, x: torch.func.jvp(lambda p: {"y": x @ p["w"] + p["b"]}, (dict(w=w, b=b),), (dict(w=w, b=b),)),
    "constant": lambda w, b, x: torch.func.jvp(lambda w: x.sin(), (w,), (w,)),
    "jacfwd": lambda w, b, x: torch.func.jacfwd(lambda w, b: (x @ w + b).tanh(), argnums=(0, 1))(w, b),
    "hessian": lambda w, b, x: torch.func.hessian(lambda b: loss(w, b, x))(b),
}


@pytest.mark.parametrize("program", JVPS.values(), ids=JVPS.keys())
def test_jvp_jacfwd_and_hessian_are_traced_with_eagers_values_and_gradients(program):
    # They ran as one eager call; traced, the program's backward differentiates them too.
    w, b, x = torch.randn(4, 3), torch.randn(3), torch.randn(2, 4)
    ours = [t.clone().requires_grad_() for t in (w, b, x)]
    eagers = [t.clone().requires_grad_() for t in (w, b, x)]
    actual, expected = thunder_rs.jit(program)(*ours), program(*eagers)
    close(actual, expected)
    outputs = [t for t in torch.utils._pytree.tree_flatten(expected)[0] if t.requires_grad]
    if outputs:
        got = [t for t in torch.utils._pytree.tree_flatten(actual)[0] if t.requires_grad]
        sum(t.pow(2).sum() for t in got).backward()
        sum(t.pow(2).sum() for t in outputs).backward()
        close([t.grad for t in ours], [t.grad for t in eagers])
    assert traced(program, w, b, x)


def test_jvp_of_a_matmul_carries_its_tangent_through_the_backward_of_the_backward():
    # jvp is the backward of vjp's function (linear in its cotangent u) from the tangent: matmul's
    # grad rule recorded its backward with u's placeholder not requiring grad, so its gradient
    # to u was none and the tangent zeros.
    def program(x, w, t):
        return torch.func.jvp(lambda w: x @ w, (w,), (t,))

    x, w, t = torch.randn(2, 4), torch.randn(4, 3), torch.randn(4, 3)
    exactly(thunder_rs.jit(program)(x, w, t), program(x, w, t))
    assert traced(program, x, w, t)


def test_a_jvp_of_random_draws_draws_once_as_eager():
    def program(x):
        return torch.func.jvp(lambda x: F.dropout(x, 0.5, training=True) * x, (x,), (torch.ones_like(x),))

    x = torch.rand(64) + 1
    torch.manual_seed(2)
    actual = thunder_rs.jit(program)(x)
    torch.manual_seed(2)
    exactly(actual, program(x))
    assert traced(program, x)


def test_a_jvp_that_cannot_be_traced_or_writes_its_primals_runs_as_one_eager_call():
    def det(x):  # (det's backward is an eager fallback)
        return torch.linalg.det(torch.outer(x, x) + torch.eye(3))

    def writes(x):  # (eager's jvp writes the primal and, through its dual, the tangent)
        x.mul_(2)
        return x.sin()

    def program(x, t):
        return torch.func.jvp(det, (x,), (t,)), torch.func.jvp(writes, (x.clone(),), (t,)), t

    x, t = torch.randn(3), torch.randn(3)
    exactly(thunder_rs.jit(program)(x, t.clone()), program(x, t.clone()))
    assert thunder_rs.examine(program, x, t).fallbacks == {"torch.func.jvp": 2}


def test_a_jvp_writing_a_captured_tensor_raises_eagers_error():
    def program(x):
        return torch.func.jvp(lambda x: (buffer.add_(1), x.sin())[1], (x,), (x,))

    x = torch.randn(3)
    with pytest.raises(RuntimeError, match="would mutate a captured Tensor"):
        program(x)
    with pytest.raises(RuntimeError, match="would mutate a captured Tensor"):
        thunder_rs.jit(program)(x)
    assert buffer.eq(0).all()


def test_a_jvp_whose_function_turns_grad_mode_off_runs_as_eagers_forward_mode():
    # Eager's forward mode carries tangents through no_grad, where reverse mode (the traced jvp)
    # carries no gradient: its tangent was zeros. It runs as one eager call.
    def no_grad_inside(x):
        with torch.no_grad():
            y = x.sin()
        return y * x

    def program(x, t):
        return torch.func.jvp(no_grad_inside, (x,), (t,)), torch.func.jacfwd(no_grad_inside)(x)

    x, t = torch.randn(3), torch.randn(3)
    exactly(thunder_rs.jit(program)(x, t), program(x, t))


def _det(x):  # (det's backward is an eager fallback: a transform of it runs as one eager call)
    return torch.linalg.det(torch.outer(x, x) + torch.eye(x.shape[0]))


EAGER_CALLS = {
    "jvp": lambda x, t: torch.func.jvp(lambda x: _det(x) * x.sin(), (x,), (t,)),
    "jacfwd": lambda x, t: torch.func.jacfwd(lambda x: _det(x) * x.sin())(x),
    "jacrev": lambda x, t: torch.func.jacrev(lambda x: _det(x) * x.sin())(x),
    "hessian": lambda x, t: torch.func.hessian(lambda x: _det(x) * x.sin().sum())(x),
}


@pytest.mark.parametrize("program", EAGER_CALLS.values(), ids=EAGER_CALLS.keys())
def test_a_transform_that_cannot_be_traced_is_eagers_in_values_gradients_and_draws(program):
    def drawing(x, t):  # (draws before and after the eager call: the program's generator state as eager's)
        return torch.rand(2), program(x, t), torch.rand(2)

    x, t = torch.randn(3), torch.randn(3)
    ours = [v.clone().requires_grad_() for v in (x, t)]
    eagers = [v.clone().requires_grad_() for v in (x, t)]
    torch.manual_seed(4)
    actual = thunder_rs.jit(drawing)(*ours)
    torch.manual_seed(4)
    expected = drawing(*eagers)
    exactly(actual, expected)
    flat = torch.utils._pytree.tree_flatten
    sum(v.sin().sum() for v in flat(actual)[0] if v.requires_grad).backward()
    sum(v.sin().sum() for v in flat(expected)[0] if v.requires_grad).backward()
    exactly([v.grad for v in ours], [v.grad for v in eagers])
    assert not traced(program, x, t)


def test_a_vjp_functions_result_carries_the_gradient_of_its_cotangent_as_eager():
    # matmul's grad rule recorded its backward with the cotangent's placeholder not requiring
    # grad: vjp's function of a cotangent that requires grad returned a result that did not
    # (eager's does: J^T v is linear in v), and the program's gradient to v was none.
    def program(x, w, v):
        y, vjp_fn = torch.func.vjp(lambda w: (x @ w).sin(), w)
        return vjp_fn(v)[0]

    x, w, v = torch.randn(2, 4), torch.randn(4, 3), torch.randn(2, 3)
    ours, eagers = v.clone().requires_grad_(), v.clone().requires_grad_()
    actual, expected = thunder_rs.jit(program)(x, w, ours), program(x, w, eagers)
    exactly(actual, expected)
    assert actual.requires_grad
    actual.sin().sum().backward()
    expected.sin().sum().backward()
    exactly(ours.grad, eagers.grad)
    assert traced(program, x, w, v)
