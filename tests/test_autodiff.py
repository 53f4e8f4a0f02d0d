"""The autodiff runtime: fallbacks differentiated by torch.autograd, grad-rule errors, the
forward-only path, the residuals the split saves, and their freeing by the backward."""

import gc
import weakref

import pytest
import torch

import thunder_rs
from custom_ops import running_sum
from thunder_rs import ltorch
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError, ThunderValueError


def _grads(fn, *inputs):
    leaves = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    out = fn(*leaves)
    out.sum().backward()
    return out.detach(), [x.grad for x in leaves]


def _both_differentiated(fn, inputs, generator=None):
    """``fn`` eagerly and jitted on copies of ``inputs`` that require grad, each output
    backpropagated with one cotangent (random from ``generator``, else ones): (eager's output
    and gradients, ours)."""
    results = []
    cotangent = None
    for call in (fn, thunder_rs.jit(fn)):
        leaves = [x.clone().requires_grad_() for x in inputs]
        out = call(*leaves)
        if cotangent is None:
            cotangent = (
                torch.ones_like(out)
                if generator is None
                else torch.randn(out.shape, dtype=out.dtype, generator=generator)
            )
        out.backward(cotangent)
        results.append((out.detach(), [x.grad for x in leaves]))
    return results


def test_fallback_ops_are_differentiated_through_torch_autograd():
    # The custom op runs eagerly, and its backward re-runs it under torch.autograd on the saved
    # inputs.
    def fn(x, w):
        return running_sum(x * w).sin()

    x, w = (
        torch.randn(3, 5, dtype=torch.float64, requires_grad=True),
        torch.randn(5, dtype=torch.float64, requires_grad=True),
    )
    jfn = thunder_rs.jit(fn)
    out, grads = _grads(jfn, x, w)
    expected_out, expected = _grads(fn, x, w)
    torch.testing.assert_close(out, expected_out)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)
    backward = str(thunder_rs.last_backward_traces(jfn)[-1])
    assert "running_sum_default_vjp" in backward


def test_fallbacks_returning_one_tensor_in_a_sequence_keep_the_sequence():
    # torch.gradient of a 1-d tensor returns a tuple of one tensor (its op_db sample was "wrong").
    x = torch.randn(6, dtype=torch.float64)
    fn = lambda a: torch.gradient(a, spacing=2.0)  # noqa: E731
    actual, expected = thunder_rs.jit(fn)(x), fn(x)
    assert type(actual) is tuple and len(actual) == 1 and isinstance(actual[0], torch.Tensor)
    torch.testing.assert_close(actual[0], expected[0])


def test_forward_only_under_no_grad_and_without_grad_inputs():
    jfn = thunder_rs.jit(lambda x: x.exp().sum())
    x = torch.randn(4, requires_grad=True)
    with torch.no_grad():
        out = jfn(x)
    assert not out.requires_grad and thunder_rs.last_backward_traces(jfn) == []
    jfn(x.detach())
    assert thunder_rs.last_backward_traces(jfn) == []
    out = jfn(x)
    assert out.requires_grad and thunder_rs.last_backward_traces(jfn)
    assert thunder_rs.cache_misses(jfn) == 3


def test_integer_outputs_are_not_differentiable():
    jfn = thunder_rs.jit(lambda x: (x * 2, x.argmax()))
    x = torch.randn(5, requires_grad=True)
    y, i = jfn(x)
    assert y.requires_grad and not i.requires_grad
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((5,), 2.0))


def test_residuals_are_freed_by_the_backward():
    # The residuals live only in the call's autograd node until the backward, which empties the
    # list as it unpacks it and deletes each after its last use.
    jfn = thunder_rs.jit(lambda x, w: (x.matmul(w).tanh() * 2).sum())
    x, w = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    out = jfn(x, w)
    assert "saved.clear()" in str(thunder_rs.last_backward_traces(jfn)[-1])
    residuals = out.grad_fn.residuals
    intermediates = [weakref.ref(t) for t in residuals if t is not x and t is not w]
    assert intermediates, "tanh's input or output should be saved"
    del residuals
    out.backward()
    gc.collect()
    assert out.grad_fn.residuals is None
    assert all(r() is None for r in intermediates)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()


def _saved_bytes(call, x, held):
    """Bytes of the distinct storages ``call(x)`` saves for its backward under autocast, those in
    ``held`` (the caller's own tensors) left out, and the output."""
    saved = {}

    def pack(t):
        if (ptr := t.untyped_storage().data_ptr()) not in held:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        out = call(x)
    return sum(saved.values()), out


def test_autocast_weight_casts_are_saved_for_the_backward_as_eager_saves_them():
    # Eager's autocast casts each float32 weight to bfloat16 once and its matmul backward reuses
    # that copy; recomputing the casts would run one extra conversion kernel per weight and step.
    import copy  # noqa: PLC0415
    import sys  # noqa: PLC0415 (only this test imports the example)
    from pathlib import Path  # noqa: PLC0415

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from gpt import Block, GPTConfig  # noqa: PLC0415

    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=32, n_head=2, block_size=8, dropout=0.0))
    x, g = torch.randn(2, 8, 32), torch.randn(2, 8, 32, dtype=torch.bfloat16)
    results = []
    for wrap in (lambda m: m, thunder_rs.jit):
        model = copy.deepcopy(block)
        call, leaf = wrap(model), x.clone().requires_grad_()
        held = {t.untyped_storage().data_ptr() for t in (leaf, *model.parameters())}
        nbytes, out = _saved_bytes(call, leaf, held)
        out.backward(g)
        results.append((nbytes, out.detach(), leaf.grad, [p.grad for p in model.parameters()]))
    (eager_bytes, *expected), (our_bytes, *actual) = results
    torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2)
    assert our_bytes <= eager_bytes
    weights = [tuple(m.weight.shape) for m in block.modules() if isinstance(m, torch.nn.Linear)]
    backward = str(thunder_rs.last_backward_traces(call)[-1])
    casts = [line for line in backward.splitlines() if "convert_element_type" in line]
    assert not [c for c in casts if any(f"bf16[{', '.join(map(str, s))}]" in c for s in weights)], backward


def test_grad_rule_api_errors_name_the_argument():
    with pytest.raises(ThunderTypeError, match="argument symbol"):
        thunder_rs.register_grad(torch.softmax, lambda a: a)
    with pytest.raises(ThunderRuntimeError, match="recorder"):
        thunder_rs.get_grad(torch.ones(2))


def test_a_registered_rule_replaces_the_decomposition_and_is_checked():
    from thunder_rs.core.lang.recorder import GRAD_RULES

    calls = []
    builtin = GRAD_RULES.get(ltorch.silu.symbol_id)  # silu has a rule of its own: put back after

    @thunder_rs.register_grad(ltorch.silu)
    def silu_grad(input, inplace=False):
        calls.append(1)
        out = ltorch.silu(input)
        g = thunder_rs.get_grad(out)
        s = ltorch.sigmoid(input)
        thunder_rs.put_grad(input, g * s * (1 + input * (1 - s)))
        return out

    try:
        x = torch.randn(6, dtype=torch.float64, requires_grad=True)
        fn = lambda a: torch.nn.functional.silu(a * 3)  # noqa: E731
        out, (g,) = _grads(thunder_rs.jit(fn), x)
        _, (expected,) = _grads(fn, x)
        torch.testing.assert_close(g, expected)
        assert calls

        @thunder_rs.register_grad(ltorch.silu)
        def wrong_shape(input, inplace=False):
            out = ltorch.silu(input)
            thunder_rs.get_grad(out)
            thunder_rs.put_grad(input, out.sum())
            return out

        with pytest.raises(ThunderValueError, match="argument grad"):
            thunder_rs.jit(fn)(x)
    finally:
        GRAD_RULES[ltorch.silu.symbol_id] = builtin


def test_symbols_a_rules_backward_calls_take_no_rules_of_their_own():
    # linear's backward calls matmul with the weight, which requires grad; nothing differentiates
    # a backward, so that matmul records its plain decomposition, not matmul's rule.
    jfn = thunder_rs.jit(lambda x, w: torch.nn.functional.linear(x, w))
    x, w = torch.randn(2, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    out, grads = _grads(jfn, x, w)
    acquired = str(thunder_rs.last_traces(jfn)[0])
    assert acquired.count("# grad rule:") == 1 and "ltorch.matmul(" in acquired
    _, expected = _grads(torch.nn.functional.linear, x, w)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


def test_unfreezing_or_retyping_parameters_recompiles():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    model[0].weight.requires_grad_(False)
    jm = thunder_rs.jit(model)
    x = torch.randn(8, 4)
    jm(x).sum().backward()
    assert model[0].weight.grad is None
    model[0].weight.requires_grad_(True)
    jm(x).sum().backward()
    assert model[0].weight.grad is not None and thunder_rs.cache_misses(jm) == 2
    model.double()
    out = jm(x.double())
    out.sum().backward()
    assert out.dtype == torch.float64 and thunder_rs.cache_misses(jm) == 3


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: torch.unbind(a),
        lambda a: a.unbind(0),
        lambda a: torch.split(a, 1),
        lambda a: a.chunk(1),
        lambda a: torch.tensor_split(a, 1),
        lambda a: torch.broadcast_tensors(a),
        lambda a: torch.unbind_copy(a),
    ],
    ids=["unbind", "unbind_method", "split", "chunk", "tensor_split", "broadcast_tensors", "unbind_copy"],
)
def test_ops_returning_one_tensor_in_a_sequence_keep_the_sequence(fn):
    # Run whole by the torch executor, a sequence of one tensor is bound to the single output:
    # it must not come back wrapped twice.
    a = torch.randn(1, 3)
    actual, expected = thunder_rs.jit(fn)(a), fn(a)
    assert type(actual) is type(expected) and len(actual) == len(expected) == 1
    torch.testing.assert_close(actual[0], expected[0])


def test_scatter_with_reduce_is_not_differentiated_where_eager_has_no_derivative():
    """Eager's backward raises (no derivative): the call runs as eager's, its backward raising."""
    index = torch.tensor([0, 1, 0])
    fn = lambda x, s: torch.scatter(x, 0, index, s, reduce="add")  # noqa: E731
    x, s = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(thunder_rs.jit(fn)(x, s), fn(x, s))
    out = thunder_rs.jit(fn)(x.requires_grad_(), s)
    assert torch.equal(out, fn(x, s))
    with pytest.raises(RuntimeError, match="derivative for aten::scatter is not implemented"):
        out.sum().backward()


def test_requires_grad_on_an_input_changed_in_place_is_refused():
    # Eager sets the flag on the caller's tensor; thunder_rs cannot, and says so rather than
    # flagging a copy (the proxy stands for a new value after add_, but the tensor is the caller's).
    def fn(x):
        x.add_(1)
        x.requires_grad_()
        return x * 2

    with pytest.raises(NotImplementedError, match="caller's tensor"):
        thunder_rs.jit(fn)(torch.zeros(3))


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: torch.max(t, 1).values,
        lambda t: t.min(0, keepdim=True).values,
        lambda t: torch.relu(t).max(-1)[0],
        lambda t: t.max(1)[0] * t.min(1)[0],
    ],
    ids=["max", "min_keepdim", "relu_then_max", "both"],
)
def test_max_and_min_along_a_dim_give_the_gradient_to_the_returned_index_alone(fn):
    """Eager's backward scatters the gradient to the index it returns; differentiating amax
    split it among ties (zeros after a ReLU, equal logits)."""
    x = torch.tensor(
        [[1.0, 3.0, 3.0, 2.0, 0.0], [0.0, 0.0, 0.0, -1.0, -2.0], [-1.0, -1.0, 5.0, 5.0, 5.0]], dtype=torch.float64
    )
    ours, theirs = _grads(thunder_rs.jit(fn), x.requires_grad_()), _grads(fn, x)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1][0], theirs[1][0])


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: t.prod(),
        lambda t: t.prod(1),
        lambda t: t.prod(0, keepdim=True),
    ],
    ids=["all", "dim", "keepdim"],
)
def test_prod_gradient_at_zeros_is_the_product_of_the_others(fn):
    """prod / x gave NaN at zeros; eager gives each element the product of the others: at a
    lone zero the product of the nonzero elements, 0 everywhere else once a zero is present."""
    x = torch.tensor([[1.5, 0.0, 2.0], [0.0, 3.0, 0.0], [2.0, -1.0, 4.0], [0.0, 0.0, 5.0]], dtype=torch.float64)
    ours, theirs = _grads(thunder_rs.jit(fn), x.requires_grad_()), _grads(fn, x)
    torch.testing.assert_close(ours[0], theirs[0], rtol=0, atol=0)
    torch.testing.assert_close(ours[1][0], theirs[1][0], rtol=1e-15, atol=0)


@pytest.mark.parametrize("rows", [4, 30], ids=["direct", "matmul_form"])
def test_euclidean_cdist_gradient_at_zero_distance_is_zero_as_eagers(rows):
    """Eager's cdist backward gives 0 where two points coincide (cdist(x, x), k-means); the
    matmul form's sqrt (more than 25 rows) gave NaN there."""
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(-2, 3, (rows, 3), generator=g).double()
    x2 = torch.cat([x1[:3], torch.randint(-2, 3, (5, 3), generator=g).double()])
    (expected, eager_grads), (out, grads) = _both_differentiated(torch.cdist, (x1, x2), g)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grads, eager_grads)


@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_rounded_division_has_eagers_zero_gradients_even_by_zero(mode):
    """Differentiating the rounding gave zeros, but NaN where the divisor is 0."""

    def fn(a, b):
        return torch.div(a, b, rounding_mode=mode) + a * b

    inputs = torch.tensor([0.0, 1.0, -3.0, 2.5]), torch.tensor([0.0, 0.0, 2.0, -1.0])
    (_, eager_grads), (_, grads) = _both_differentiated(fn, inputs)
    assert all(torch.equal(x, y) for x, y in zip(grads, eager_grads, strict=True))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_atan2_gradient_is_eagers_to_the_bit_and_zero_at_the_origin(dtype):
    """Eager multiplies by the reciprocal of a^2 + b^2, 0 at the origin, where dividing by it
    rounded otherwise and gave NaN at (0, 0) (the angle of a zero vector)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(256, dtype=dtype, generator=g) for _ in range(2))
    a[:3], b[:3], b[5], a[6] = 0, 0, 0, 0
    (_, eager_grads), (_, grads) = _both_differentiated(torch.atan2, (a, b), g)
    assert all(torch.equal(x, y) for x, y in zip(grads, eager_grads, strict=True))


@pytest.mark.parametrize("padding_mode", ["border", "reflection"])
def test_grid_sample_of_an_identity_grid_has_eagers_gradients_at_the_edges(padding_mode):
    """A spatial transformer starts at the identity: with align_corners the grid's edges lie
    exactly on the input's border, where eager's clipping passes no gradient; clipping with
    minimum and maximum passed half of it, and the affine parameters' gradient was off by 9."""
    import torch.nn.functional as F  # noqa: PLC0415

    def fn(x, theta):
        grid = F.affine_grid(theta, (2, 3, 4, 7), align_corners=True)
        return F.grid_sample(x, grid, padding_mode=padding_mode, align_corners=True)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, generator=g)
    theta = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]] * 2, dtype=torch.float64)
    (expected, eager_grads), (out, grads) = _both_differentiated(fn, (x, theta), g)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grads, eager_grads)


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: torch.kthvalue(t, 3),
        lambda t: torch.kthvalue(t, 20, 1, True),
        lambda t: torch.median(t, 1),
        lambda t: torch.nanmedian(t, 0, keepdim=True),
    ],
    ids=["kthvalue", "kthvalue_keepdim", "median", "nanmedian"],
)
def test_selections_along_a_dim_return_eagers_indices_when_differentiated(fn):
    """With ties, kthvalue's selection picks another index than a stable sort: differentiated
    through its decomposition, the returned indices (and the gradient) were the sort's."""
    x = torch.randint(0, 3, (4, 37), generator=torch.Generator().manual_seed(15)).double()
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = thunder_rs.jit(fn)(ours), fn(theirs)
    assert torch.equal(out.indices, expected.indices) and torch.equal(out.values, expected.values)
    out.values.sum().backward()
    expected.values.sum().backward()
    assert torch.equal(ours.grad, theirs.grad)


@pytest.mark.parametrize("fn", [torch.special.bessel_j1, torch.special.modified_bessel_i1], ids=["j1", "i1"])
def test_first_order_bessel_gradients_at_zero_are_a_half_as_eagers(fn):
    """j0 - j1 / x (i0 - i1 / x) is 0 / 0 at x = 0, where the derivative is 1/2."""
    (_, eager_grads), (_, grads) = _both_differentiated(fn, (torch.tensor([0.0, -0.0, 1.0], dtype=torch.float64),))
    torch.testing.assert_close(grads, eager_grads)


def test_nextafter_passes_the_gradient_to_its_first_operand_where_they_differ():
    inputs = torch.tensor([1.0, 2.0, 0.0, 5.0, float("nan")]), torch.tensor([1.0, 3.0, 1.0, 5.0, 1.0])
    (_, eager_grads), (_, grads) = _both_differentiated(torch.nextafter, inputs)
    assert all(torch.equal(x, y) for x, y in zip(grads, eager_grads, strict=True))


def test_max_along_a_dim_of_a_bool_scalar_decomposes_as_eager():
    """A one-element max is the element at index 0; its argmax reads bools as numbers."""
    from thunder_rs.executors.torch_ex import decomposing  # noqa: PLC0415

    for x in (torch.tensor(True), torch.tensor(3.0)):
        with decomposing():
            out = thunder_rs.jit(lambda t: torch.max(t, 0))(x)
        expected = torch.max(x, 0)
        assert torch.equal(out.values, expected.values) and torch.equal(out.indices, expected.indices)


_MODIFIED = "one of the variables needed for gradient computation has been modified by an inplace operation"


@pytest.mark.parametrize("case", ["input_refilled", "weight_stepped", "output_post_processed", "input_view_written"])
def test_a_saved_tensor_written_in_place_before_the_backward_raises_as_in_eager(case):
    def matmul_loss(x, w):
        return (x @ w).sum()

    # The weight is saved for the input's gradient: the input requires grad when the weight is stepped.
    x = torch.ones(2, 3, requires_grad=case == "weight_stepped")
    w = torch.ones(3, 1, requires_grad=True)
    if case == "output_post_processed":
        program, args = torch.exp, (w,)
    else:
        program, args = matmul_loss, (x, w)
    for fn in (program, thunder_rs.jit(program)):
        with torch.no_grad():
            x.fill_(1.0)
        out = fn(*args)
        if case == "input_refilled":
            x.mul_(10)
        elif case == "weight_stepped":
            with torch.no_grad():
                w.sub_(0.1)  # an optimizer step between the forward and the backward
        elif case == "output_post_processed":
            out.add_(1)
        else:
            x[0].zero_()  # a view of the saved input shares its version counter
        with pytest.raises(RuntimeError, match=_MODIFIED):
            out.sum().backward()
        w.grad = None


def test_writing_a_saved_tensor_after_the_backward_is_allowed():
    x, w = torch.ones(2, 3), torch.ones(3, 1, requires_grad=True)
    jfn = thunder_rs.jit(lambda x, w: (x @ w).sum())
    for _ in range(2):
        jfn(x, w).backward()
        x.mul_(2)
    torch.testing.assert_close(w.grad, torch.full((3, 1), 6.0))


@pytest.mark.parametrize(
    "program",
    [
        lambda x: torch.fft.rfft(x).abs().sum() + (x**2).sum(),
        lambda x: torch.complex(x, x * 2).abs().sum(),
        lambda x: torch.polar(x.abs(), x).real.sum(),
        lambda x: (torch.view_as_complex(x.reshape(4, 2, 2)) @ torch.ones(2, 2, dtype=torch.complex64)).abs().sum(),
    ],
)
def test_a_complex_value_that_carries_a_gradient_gets_eagers(program):
    # Calls differentiating complex values run as eager's ops (core/lang/complex_calls.py).
    x = torch.randn(4, 4, requires_grad=True)
    jfn = thunder_rs.jit(program)
    torch.testing.assert_close(jfn(x), program(x))
    torch.testing.assert_close(torch.autograd.grad(jfn(x), x), torch.autograd.grad(program(x), x))
    with torch.no_grad():
        torch.testing.assert_close(thunder_rs.jit(program)(x), program(x))


def test_saved_tensor_hooks_around_the_call_pack_and_unpack_what_the_call_saves():
    def program(x, w):
        return (x @ w).tanh().sum()

    grads, counts = [], []
    for fn in (program, thunder_rs.jit(program)):
        calls = [0, 0]

        def pack(t, calls=calls):
            calls[0] += 1
            return t * 2  # a lossy pack changes the gradient, in eager as in the compiled call

        def unpack(t, calls=calls):
            calls[1] += 1
            return t

        x = torch.ones(2, 3, requires_grad=True)
        w = torch.full((3, 3), 0.1, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            loss = fn(x, w)
        loss.backward()
        grads.append((x.grad, w.grad))
        counts.append(calls)
    for jitted, eager in zip(grads[1], grads[0]):
        torch.testing.assert_close(jitted, eager)
    assert counts[1][0] > 0 and counts[1][0] == counts[1][1]


def test_saved_tensor_hooks_entered_inside_a_program_are_refused():
    def program(x):
        with torch.autograd.graph.save_on_cpu():
            return x.sin()

    with pytest.raises(ThunderNotImplementedError, match="save_on_cpu: entered at .*test_autodiff.py"):
        thunder_rs.jit(program)(torch.ones(2, requires_grad=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_addr_half_gradients_accumulate_as_eagers(dtype):
    """addr's vector gradients are matrix-vector products accumulated in float32, as eager's
    ``grad.mv(vec2)``: a decomposition through a broadcast multiplication rounded each product to
    half precision first and was 2.8x (CPU) to 6x (H200) farther from float64 than eager (on
    the OpInfo sample the H200 run found it with)."""
    import test_ops  # noqa: PLC0415
    from opinfos import OPINFOS  # noqa: PLC0415

    op = next(o for o in OPINFOS if o.id == "addr")
    sample = test_ops.sample_at(op, dtype, "cpu", 0)
    ours, eager = test_ops.grads(op, sample, thunder_rs.jit(op.op)), test_ops.grads(op, sample, op.op)
    leaves = [t.detach().double().requires_grad_() for t in sample.args]
    out = op.op(*leaves, **sample.kwargs)
    torch.manual_seed(1)  # test_ops.grads' cotangent, drawn in the sample's dtype
    exact = torch.autograd.grad(out, leaves, torch.randn(out.shape, dtype=dtype).double())
    for a, e, r in zip(ours, eager, exact, strict=True):
        assert (a.double() - r).abs().max() <= (e.double() - r).abs().max() + 1e-6


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_masked_attention_runs_torchs_safe_softmax_with_eagers_gradients(mask_dtype):
    """Attention with a mask and dropout softmaxes through ``aten._safe_softmax`` (one kernel, as
    eager's math path), and a row the mask hides entirely gives zeros and zero gradients, as in
    eager."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, requires_grad=True) for _ in range(3))
    keep = torch.rand(2, 1, 5, 5) > 0.3
    keep[:, :, 2] = False  # query 2 sees no key
    mask = keep if mask_dtype == torch.bool else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))

    def attention(q, k, v):  # with dropout: the decomposition runs, as in training
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.25)

    jf = thunder_rs.jit(attention)
    torch.manual_seed(1)
    out = jf(q, k, v)
    torch.manual_seed(1)
    ref = attention(q, k, v)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(ref)
    got, want = torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)
    for a, e in zip(got, want):
        assert a.isfinite().all()
        torch.testing.assert_close(a, e)
    assert "safe_softmax" in str(thunder_rs.last_traces(jf)[-1])


def _layer_norm_written_twice(h):
    """HF's DebertaLayerNorm: ``h - mean`` computed twice, two nodes of eager's autograd graph."""
    mean = h.mean(-1, keepdim=True)
    variance = (h - mean).pow(2).mean(-1, keepdim=True)
    return (h - mean) / torch.sqrt(variance + 1e-7)


@pytest.mark.usefixtures("one_thread")
def test_an_expression_written_twice_keeps_eagers_gradient_to_the_bit():
    """Equal calls a gradient flows through are merged after the split, not before autodiff:
    merged, the backward reduced the two cotangents of ``mean`` summed where eager reduces each
    (6e-8 apart in float32); the forward computes it once."""
    x, g = torch.randn(4, 16, 32) * 3 + 1, torch.randn(4, 16, 32)
    grads = []
    for fn in (_layer_norm_written_twice, thunder_rs.jit(_layer_norm_written_twice)):
        leaf = x.clone().requires_grad_()
        fn(leaf).backward(g)
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1])
    jfn = thunder_rs.jit(_layer_norm_written_twice)
    jfn(x.clone().requires_grad_())
    assert str(thunder_rs.last_traces(jfn)[-1]).count(".sub(") == 1
