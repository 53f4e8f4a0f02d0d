"""torch.func's differentiating transforms inside a jitted program (``core.lang.functorch_calls``):
per-sample gradients (``vmap(grad(loss))`` of an MLP and a CNN with cross_entropy) traced through
thunder_rs's VJP and batching rules (``core.lang.traced_grads``; more in test_traced_grads.py), and
``jacrev``, ``jacfwd``, ``hessian`` and ``jvp`` traced as torch's vmap over vjp/jvp; those whose
function cannot be traced run as one eager call each, equal to eager bit for bit, with gradients
through them as eager's; closures over traced values are inputs of the call; what the call cannot
carry (gradients into tensors it reads itself) is refused naming the line."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunder_rs
from thunder_rs.errors import ThunderRuntimeError
from test_vmap_rules import CNN, MLP, trained_statistics

torch.manual_seed(0)


def exactly(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def per_sample_grads(model):
    def loss_fn(params, buffers, x, y):
        out = torch.func.functional_call(model, (params, buffers), (x.unsqueeze(0),))
        return F.cross_entropy(out, y.unsqueeze(0))

    def program(params, buffers, x, y):
        return torch.vmap(torch.func.grad(loss_fn), in_dims=(None, None, 0, 0))(params, buffers, x, y)

    return program


@pytest.mark.parametrize("model, shape", [(MLP, (6, 8)), (CNN, (6, 1, 8, 8))], ids=["mlp", "cnn"])
def test_per_sample_gradients_equal_eagers(model, shape):
    model = trained_statistics(model())
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    program, jitted = per_sample_grads(model), thunder_rs.jit(per_sample_grads(model))
    for _ in range(2):  # (the second call runs the compiled program on new values)
        x, y = torch.randn(shape), torch.randint(0, 4, (shape[0],))
        # (batched matmuls and convolutions: eager's vmap runs other kernels, equal within float32's tolerance)
        torch.testing.assert_close(jitted(params, buffers, x, y), program(params, buffers, x, y))
    assert thunder_rs.examine(program, params, buffers, x, y).fallbacks == {}  # traced, not an eager call


def test_per_sample_gradients_of_a_cnn_over_new_batch_sizes_compile_once_more():
    # The gradients are per example, so each example's convolution weights are a group of one
    # grouped convolution (groups = the batch size): symbolic with the batch size, not a guard
    # that compiled every new batch size again.
    model = trained_statistics(CNN())
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    program, jitted = per_sample_grads(model), thunder_rs.jit(per_sample_grads(model))
    for batch in (4, 6, 8, 5):
        x, y = torch.randn(batch, 1, 8, 8), torch.randint(0, 4, (batch,))
        torch.testing.assert_close(jitted(params, buffers, x, y), program(params, buffers, x, y))
    assert thunder_rs.compile_stats(jitted).cache_misses == 2, thunder_rs.compile_stats(jitted).miss_reasons


def test_a_grad_of_values_a_vmap_batched_is_traced_in_that_vmap():
    # The tutorial's other spelling: the grad is taken inside the vmapped function, over a closure.
    def loss(w, x, y):
        return F.cross_entropy((x @ w).unsqueeze(0), y.unsqueeze(0))

    def program(w, x, y):
        return torch.vmap(lambda x, y: torch.func.grad(lambda w: loss(w, x, y))(w))(x, y)

    w, x, y = torch.randn(5, 3), torch.randn(4, 5), torch.randint(0, 3, (4,))
    torch.testing.assert_close(thunder_rs.jit(program)(w, x, y), program(w, x, y))
    assert thunder_rs.examine(program, w, x, y).fallbacks == {}


def det_of(w, x):
    """A function whose gradient thunder_rs cannot trace (det's backward is an eager fallback)."""
    return torch.linalg.det(torch.outer(w, x) + torch.eye(w.shape[0]))


def test_a_transform_of_values_a_vmap_batched_runs_that_vmap_eagerly():
    def program(w, x):
        return torch.vmap(lambda x: torch.func.grad(lambda w: det_of(w, x))(w))(x)

    w, x = torch.randn(3), torch.randn(4, 3)
    exactly(thunder_rs.jit(program)(w, x), program(w, x))
    assert thunder_rs.examine(program, w, x).fallbacks == {"torch.func.vmap": 1}


def f(x):
    return x.sin() * x.cos().sum()


@pytest.mark.parametrize(
    "transform",
    [
        lambda x: torch.func.jacrev(f)(x),
        lambda x: torch.func.jacfwd(f)(x),
        lambda x: torch.func.hessian(lambda x: (x.sin() * x).sum())(x),
        lambda x: torch.func.jvp(f, (x,), (x.cos(),)),
        lambda x: torch.func.grad_and_value(lambda x: (x.exp() * x).sum())(x),
    ],
    ids=["jacrev", "jacfwd", "hessian", "jvp", "grad_and_value"],
)
def test_jacobians_and_hessians_equal_eagers(transform):
    x = torch.randn(4)
    exactly(thunder_rs.jit(transform)(x), transform(x))


def test_gradients_flow_through_a_transform_and_its_closure_as_eager():
    def helper(x, w):
        return (x * w).sin().sum()

    def program(x, w):
        return torch.func.grad(lambda x: helper(x, w))(x).pow(2).sum()  # w: a traced value in the closure

    x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    thunder_rs.jit(program)(x, w).backward()
    program(x2, w2).backward()
    exactly((x.grad, w.grad), (x2.grad, w2.grad))


def test_a_grad_bound_before_tracing_runs_as_eager():
    from torch.func import grad

    g = grad(lambda a: (a * a.sin()).sum())
    x = torch.randn(3)
    exactly(thunder_rs.jit(lambda x: g(x) * 2)(x), g(x) * 2)


def test_transforms_imported_before_tracing_are_traced_with_eagers_values():
    # The tutorials' spelling: ``from torch.func import jacrev`` at the top, the transform made
    # inside the program (jacrev/jacfwd wrap what they return through torch's
    # _wraps_without_dynamo_attrs, which is thunder_rs's while tracing): torch's own jacobians,
    # their vmap over vjp/jvp traced.
    from torch.func import hessian, jacfwd, jacrev, jvp, vmap

    def predict(weight, bias, x):
        return F.linear(x, weight, bias).tanh()

    def reverse(weight, bias, x):
        return (
            jacrev(predict, argnums=2)(weight, bias, x),
            hessian(predict, argnums=2)(weight, bias, x),
            vmap(jacrev(predict, argnums=2), in_dims=(None, None, 0))(weight, bias, x.expand(3, -1)),
        )

    def forward(weight, bias, x):
        jacobian = jacfwd(predict, argnums=(0, 2))(weight, bias, x)
        return jacobian, jvp(lambda x: predict(weight, bias, x), (x,), (x.cos(),))

    weight, bias, x = torch.randn(5, 5), torch.randn(5), torch.randn(5)
    # (eager's vmap runs batched matmuls, and forward mode its dual numbers, where the trace runs
    # reverse mode (twice for forward mode) on the basis: other kernels, equal within float32's tolerance)
    for program in (reverse, forward):
        torch.testing.assert_close(thunder_rs.jit(program)(weight, bias, x), program(weight, bias, x))
        assert thunder_rs.examine(program, weight, bias, x).fallbacks == {}


def test_a_vmap_of_a_jacobian_made_inside_the_program_is_traced():
    # torch.vmap(torch.func.jacrev(f)) ran the whole vmap as one eager call.
    def program(x, w):
        f = lambda x: (x @ w).tanh()  # noqa: E731
        return torch.vmap(torch.func.jacrev(f))(x), torch.vmap(torch.func.hessian(lambda x: f(x).sum()))(x)

    def untraceable(x, w):
        return torch.vmap(torch.func.jacrev(lambda x: det_of(x, x @ w)))(x)

    x, w = torch.randn(5, 3), torch.randn(3, 3)
    torch.testing.assert_close(thunder_rs.jit(program)(x, w), program(x, w))
    assert thunder_rs.examine(program, x, w).fallbacks == {}
    exactly(thunder_rs.jit(untraceable)(x, w), untraceable(x, w))
    assert thunder_rs.examine(untraceable, x, w).fallbacks == {"torch.func.vmap(jacrev)": 1}


def test_reading_tensors_that_require_grad_besides_the_arguments_is_refused_with_the_line():
    layer = nn.Linear(3, 3)  # its parameters require grad: eager's result carries gradients to them

    def program(x):  # (det's backward is an eager fallback: the jvp runs as one eager call)
        return torch.func.jvp(lambda x: det_of(layer(x).tanh(), x), (x,), (x.cos(),))

    refusal = r"torch\.func\.jvp at .*test_func_transforms\.py:\d+: .*require grad"
    with pytest.raises(NotImplementedError, match=refusal):
        thunder_rs.jit(program)(torch.randn(3))
    with torch.no_grad():  # without gradients, the parameters are read on each call as eager reads them
        jitted = thunder_rs.jit(program)
        x = torch.randn(3)
        exactly(jitted(x), program(x))
        layer.weight.mul_(2)
        exactly(jitted(x), program(x))


def test_a_traced_jacobian_of_a_module_carries_gradients_to_its_parameters_as_eager():
    # jacrev/jacfwd/hessian made inside the program ran as one eager call, which refused a function
    # reading parameters that require grad; traced, the program's backward reaches them.
    layer, twin = nn.Linear(3, 3), nn.Linear(3, 3)
    twin.load_state_dict(layer.state_dict())

    def of(module, transform):
        return lambda x: transform(lambda x: module(x).tanh())(x).pow(2).sum()

    x = torch.randn(3)
    for transform in (torch.func.jacrev, torch.func.jacfwd, torch.func.hessian):
        program, expected = of(layer, transform), of(twin, transform)
        assert thunder_rs.examine(program, x).fallbacks == {}
        actual = thunder_rs.jit(program)(x)
        actual.backward()
        expected(x).backward()
        torch.testing.assert_close(actual, expected(x))
        torch.testing.assert_close((layer.weight.grad, layer.bias.grad), (twin.weight.grad, twin.bias.grad))
        for p in (*layer.parameters(), *twin.parameters()):
            p.grad = None


def test_floats_and_sizes_the_transformed_function_reads_are_each_calls():
    # A float argument that changes between calls is an input of the trace (a stand-in): in the
    # closure or the arguments the eager call must see each call's, not the traced one's.
    def scaled(x, s):
        return torch.func.grad(lambda x: (x * s).sin().sum())(x) + torch.func.grad(lambda x, s: (x * s).sum())(x, s)

    def sized(x):
        n = x.shape
        return torch.func.grad(lambda x: (x * n[0]).sin().sum())(x)

    jitted, x = thunder_rs.jit(scaled), torch.randn(3)
    for s in (2.0, 3.0, 5.0):
        exactly(jitted(x, s), scaled(x, s))
    jitted = thunder_rs.jit(sized)
    for n in (3, 4, 5):
        x = torch.randn(n)
        exactly(jitted(x), sized(x))


def test_a_vmap_that_runs_eagerly_draws_as_eager_and_is_refused_after_a_traced_draw():
    # randomness="same": one draw for every example. A body that transforms its batched values
    # runs whole as an eager call, its draws inside it; draws traced before it would be drawn twice.
    # (A grad thunder_rs traces draws once where eager does: ``traced``.)
    def transform_first(w, x):
        body = lambda x: torch.func.grad(lambda w: det_of(w, x) * torch.rand(()))(w) + torch.rand(3)  # noqa: E731
        return torch.vmap(body, randomness="same")(x)

    def draw_first(w, x):
        return torch.vmap(lambda x: torch.rand(()) * torch.func.grad(lambda w: det_of(w, x))(w), randomness="same")(x)

    def traced(w, x):
        body = lambda x: torch.rand(()) * torch.func.grad(lambda w: (w * x * torch.rand(())).sum())(w)  # noqa: E731
        return torch.vmap(body, randomness="same")(x)

    w, x = torch.randn(3), torch.randn(4, 3)
    for program in (transform_first, traced):
        torch.manual_seed(3)
        expected = program(w, x)
        torch.manual_seed(3)
        exactly(thunder_rs.jit(program)(w, x), expected)
    draw_first(w, x)
    with pytest.raises(NotImplementedError, match=r"torch\.vmap at .*test_func_transforms\.py:\d+: .*draws random"):
        thunder_rs.jit(draw_first)(w, x)


def test_a_transform_of_untraced_arguments_over_a_traced_closure_is_an_eager_call():
    # The point x0 is a captured tensor (read on each call), the function closes over a traced w.
    x0 = torch.randn(3)

    def program(w):
        return torch.func.jacrev(lambda x: (x * w).sin())(x0)

    jitted, w = thunder_rs.jit(program), torch.randn(3)
    exactly(jitted(w), program(w))
    x0.mul_(2)
    exactly(jitted(w), program(w))


def test_repeated_compiles_of_a_transform_share_one_fallback_symbol():
    # Each compile recorded a new symbol holding a copy of the function: the registry grew with
    # every compile (new shapes, cache evictions). One symbol per transform, the function held by
    # the trace (freed with it).
    from thunder_rs.core.lang import fallback

    def program(x):
        return torch.func.jacrev(lambda x: x.sin() * x.sum())(x)

    thunder_rs.jit(program)(torch.randn(2))
    registered = len(fallback.FALLBACK_IMPLS)
    for n in range(3, 9):
        x = torch.randn(n)
        exactly(thunder_rs.jit(program)(x), program(x))
    assert len(fallback.FALLBACK_IMPLS) == registered


def test_a_transformed_function_with_python_side_effects_is_refused_with_the_line():
    # The eager call runs the function once more than eager while compiling (on fake tensors)
    # and again in a backward: a counter, a list append or a print would happen more often.
    calls = []
    count = 0

    def appends(x):
        calls.append(1)
        return (x.sin() * x).sum()

    def counts(x):
        nonlocal count
        count += 1
        return (x.sin() * x).sum()

    def prints(x):
        print("called")
        return (x.sin() * x).sum()

    stats = {"n": 0}

    def item(x):
        stats["n"] += 1
        return (x.sin() * x).sum()

    def assigns_global(x):
        global _last_size
        _last_size = x.shape[0]
        return (x.sin() * x).sum()

    x = torch.randn(3)
    cases = {
        appends: "calls calls.append",
        counts: "assigns the nonlocal count",
        prints: "calls print",
        item: "writes into stats",
        assigns_global: "assigns the global _last_size",
    }
    for fn, what in cases.items():
        torch.func.grad(fn)(x)  # eager: once per call
        where = rf"{fn.__name__} at .*:\d+ {what}"
        with pytest.raises(
            NotImplementedError, match=rf"torch\.func\.grad at .*_transforms\.py:\d+: .*effect \(.*{where}\)"
        ):
            thunder_rs.jit(lambda x: torch.func.grad(fn)(x))(x)
        with pytest.raises(NotImplementedError, match=r"torch\.func\.jacrev at .*side effect"):
            thunder_rs.jit(lambda x: torch.func.jacrev(fn)(x))(x)
    assert (len(calls), count, stats["n"]) == (1, 1, 1)  # (refused before running it)


def test_functions_that_only_compute_with_local_state_are_not_refused():
    scale = {"s": 2.0}  # read, never written

    def local_state(x):
        parts = []
        parts.append(x.sin())
        out = {}
        out["y"] = parts[0] * scale["s"]
        return out["y"].sum()

    x = torch.randn(3)
    exactly(thunder_rs.jit(lambda x: torch.func.grad(local_state)(x))(x), torch.func.grad(local_state)(x))


_ROWS = 3


def test_outputs_whose_sizes_follow_python_state_the_function_reads_are_refused_not_misread():
    """The transform runs eagerly on each call, reading the global then; the program after it was
    traced for the first call's sizes (its mean divided by 15 where eager's divides by 10)."""
    global _ROWS

    def program(x):  # (strict: eager's check of each output's tangent, run as one eager call)
        return torch.func.jvp(lambda y: (y[:_ROWS] * 2).sin(), (x,), (x.cos(),), strict=True)[1].mean()

    def traced(x):  # (a traced jacobian reads the global as the program's own code: guarded)
        return torch.func.jacrev(lambda y: (y[:_ROWS] * 2).sin())(x).mean()

    jitted, x = thunder_rs.jit(program), torch.randn(5)
    torch.testing.assert_close(jitted(x), program(x), rtol=0, atol=0)
    jitted_traced = thunder_rs.jit(traced)
    exactly(jitted_traced(x), traced(x))
    _ROWS = 2
    try:
        with pytest.raises(ThunderRuntimeError, match=r"torch\.func\.jvp at .*test_func_transforms\.py:\d+"):
            jitted(x)
        exactly(jitted_traced(x), traced(x))
    finally:
        _ROWS = 3


def test_a_jacobian_whose_function_writes_an_argument_writes_it_once_as_eager():
    # The traced jacobian's vjp function, called under its vmap, traced the function again and
    # wrote the argument again (the program then failed to compile: a value used before it was
    # defined). Made inside the program, the jacobian runs as one eager call instead.
    def writes(x, b):
        b.add_(1)
        return (x * b).sin()

    def program(x, b):
        return torch.func.jacrev(writes)(x, b), torch.func.jacfwd(writes)(x, b), b

    x, b1, b2 = torch.randn(3), torch.zeros(3), torch.zeros(3)
    exactly(thunder_rs.jit(program)(x, b1), program(x, b2))
    exactly(b1, torch.full((3,), 2.0))

    # Made before tracing, its vjp is traced: the forward once (writing once, as eager), the
    # backward batched over the basis (it was refused: the vjp function traced the forward again).
    made_before = torch.func.jacrev(writes)
    b1, b2 = torch.zeros(3), torch.zeros(3)
    exactly(thunder_rs.jit(lambda x, b: (made_before(x, b), b))(x, b1), (made_before(x, b2), b2))
    # Refused where the backward has no batching rule (cumsum's), so that the forward would be traced again.
    cumulative = torch.func.jacrev(lambda x, b: writes(x, b).cumsum(0))
    with pytest.raises(NotImplementedError, match=r"torch\.func\.vjp at .*test_func_transforms\.py:\d+: .*writes"):
        thunder_rs.jit(lambda x, b: cumulative(x, b))(x, torch.zeros(3))
