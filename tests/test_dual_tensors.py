"""Forward-mode differentiation through dual tensors (``torch.autograd.forward_ad``) inside a
jitted program (``core.lang.dual_tensors``): primals and tangents against eager's (bit-equal where
the backward of the backward runs eager's forward formula's kernels), the program's gradients
through them, and eager's errors. (Was refused: ``torch._make_dual ... a traced tensor carries
no tangent``.)"""

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.utils._pytree import tree_flatten

import thunder_rs

torch.manual_seed(0)
W = torch.randn(4, 4)


def _unpacked(y):
    p, t = fwAD.unpack_dual(y)
    return p, t


def elementwise(x, t):
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        return _unpacked((d.sin() * d).exp())


def matmul_and_reduction(x, t):
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        return _unpacked((d @ W).relu().sum(1))


def views(x, t):
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        return _unpacked(d.t()[1:].reshape(-1) * 2)


def in_place(x, t):
    """A write to a dual (its tangent follows, written into the tangent tensor as eager writes it),
    and a dual written into a plain tensor (which then carries its tangent); the primal an earlier
    unpack gave carries none, nor the tensor the dual views."""
    x = x.clone()
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        d.mul_(2)
        z = torch.zeros(3, 4).add_(d[0])
        p, tangent = fwAD.unpack_dual(z)
        base = fwAD.unpack_dual(x * 3)  # (written through the dual: no tangent, as eager's)
        return p, tangent, fwAD.unpack_dual(p * d).tangent, x, base.tangent is None


def without_tangents(x, t):
    """A tensor that is no dual, detach(), an integer result, a zero tangent, the dual itself."""
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        plain = fwAD.unpack_dual(x)
        return (
            plain.tangent is None,
            plain.primal,
            fwAD.unpack_dual(d.detach()).tangent is None,
            fwAD.unpack_dual(d.argmax()).tangent is None,
            fwAD.unpack_dual(d * 0).tangent,
            fwAD.unpack_dual(d).tangent,
        )


def under_no_grad(x, t):
    """Forward mode ignores grad mode."""
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        with torch.no_grad():
            y = d.exp()
        return _unpacked(y * d)


def after_the_level(x, t):
    with fwAD.dual_level():
        y = fwAD.make_dual(x, t).sin()
    with fwAD.dual_level():
        return fwAD.unpack_dual(y).tangent is None, fwAD.unpack_dual(y).primal


PROGRAMS = [elementwise, matmul_and_reduction, views, in_place, without_tangents, under_no_grad, after_the_level]


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.__name__ for p in PROGRAMS])
def test_dual_tensors_give_eagers_primals_and_tangents(program):
    jitted = thunder_rs.jit(program)
    for _ in range(2):  # (the second call runs the compiled program)
        x, t = torch.randn(3, 4), torch.randn(3, 4)
        eagers, ours = t.clone(), t.clone()  # (a write to a dual writes its tangent tensor too)
        expected, actual = program(x, eagers), jitted(x, ours)
        assert torch.equal(ours, eagers)
        flat_expected, flat_actual = tree_flatten(expected)[0], tree_flatten(actual)[0]
        assert len(flat_expected) == len(flat_actual)
        for e, a in zip(flat_expected, flat_actual):
            if isinstance(e, torch.Tensor):
                assert torch.equal(a, e)
            else:
                assert a == e
    assert thunder_rs.cache_hits(jitted) == 1


MODEL = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.GELU(), torch.nn.LayerNorm(5))


def modules(x, t):
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        return _unpacked(torch.softmax(MODEL(d), -1))


def functional_call(x, t):
    """Duals of the parameters (forward-mode directional derivative in parameter space)."""
    with fwAD.dual_level():
        params = {k: fwAD.make_dual(v.detach(), torch.ones_like(v) * t.mean()) for k, v in MODEL.named_parameters()}
        return _unpacked(torch.func.functional_call(MODEL, params, (x,)))


@pytest.mark.parametrize("program", [modules, functional_call], ids=["modules", "functional_call"])
def test_dual_tensors_through_modules_equal_eagers(program):
    """(layer_norm's decomposition: within float32's tolerance)"""
    x, t = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(thunder_rs.jit(program)(x, t), program(x, t))


def tanh_of_linear(x, t):
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        return _unpacked((d @ MODEL[0].weight.T).tanh() * MODEL[0].bias)


def test_the_programs_gradients_through_primals_and_tangents_equal_eagers():
    x, t = torch.randn(3, 4), torch.randn(3, 4)
    grads = []
    for program in (tanh_of_linear, thunder_rs.jit(tanh_of_linear)):
        MODEL.zero_grad()
        xs, ts = x.clone().requires_grad_(), t.clone().requires_grad_()
        p, tangent = program(xs, ts)
        assert p.requires_grad and tangent.requires_grad
        (p.sum() + tangent.pow(2).sum()).backward()
        grads.append([xs.grad, ts.grad, MODEL[0].weight.grad.clone(), MODEL[0].bias.grad.clone()])
    torch.testing.assert_close(grads[1], grads[0])


def nested(x):
    with fwAD.dual_level(), fwAD.dual_level():
        return x


def made_twice(x, t):
    with fwAD.dual_level():
        return fwAD.make_dual(fwAD.make_dual(x, t) * 2, t)


def tangent_of_another_size(x, t):
    with fwAD.dual_level():
        return fwAD.make_dual(x, t[:2])


@pytest.mark.parametrize(
    "program, message",
    [
        (nested, "Nested forward mode AD is not supported"),
        (made_twice, "already has a forward gradient at the same level 0"),
        (tangent_of_another_size, "different size than that of the original Tensor"),
    ],
    ids=["nested_levels", "made_twice", "tangent_size"],
)
def test_eagers_errors(program, message):
    x, t = torch.randn(3), torch.randn(3)
    args = (x,) if program is nested else (x, t)
    with pytest.raises(RuntimeError, match=message):
        program(*args)
    with pytest.raises(RuntimeError, match=message):
        thunder_rs.jit(program)(*args)


def test_what_is_not_traced_is_refused_naming_the_construct_and_the_line():
    def other_dtype(x, t):
        with fwAD.dual_level():
            return fwAD.unpack_dual(fwAD.make_dual(x, t).sin()).tangent

    def det(x, t):  # (det's backward is an eager fallback: no backward of it to differentiate)
        with fwAD.dual_level():
            return fwAD.unpack_dual(torch.linalg.det(fwAD.make_dual(x, t))).tangent

    x = torch.randn(3, 3)
    with pytest.raises(NotImplementedError, match=r"make_dual: a tangent of dtype torch.float64 .*test_dual_tensors"):
        thunder_rs.jit(other_dtype)(x, x.double())
    with pytest.raises(NotImplementedError, match=r"unpack_dual: .*eager fallback.* at .*test_dual_tensors\.py:\d+"):
        thunder_rs.jit(det)(x, x.cos())


def test_a_dual_made_outside_the_jitted_call_is_refused_where_the_program_unpacks_duals():
    """Its tangent would not reach the trace: the tangent the program unpacks would be None. (A
    program that does not, under ``torch.func.jvp``, runs eager kernels that carry it.)"""

    def tangent(d):
        return fwAD.unpack_dual(d.sin()).tangent

    with fwAD.dual_level():
        d = fwAD.make_dual(torch.randn(3), torch.randn(3))
        assert tangent(d) is not None
        match = r"forward_ad at .*test_dual_tensors\.py:\d+: an input .* is a dual tensor"
        with pytest.raises(NotImplementedError, match=match):
            thunder_rs.jit(tangent)(d)


def _tangent_of(op):
    def program(x, t):
        with fwAD.dual_level():
            return fwAD.unpack_dual(op(fwAD.make_dual(x, t))).tangent

    return program


NO_FORWARD_FORMULA = {
    "cdist": (lambda d: torch.cdist(d, d), "_cdist_forward"),
    "cdist_by_matmul": (lambda d: torch.cdist(d.repeat(8, 1), d), "_euclidean_dist"),
    "pdist": (lambda d: torch.nn.functional.pdist(d), "_pdist_forward"),
    "unique": (lambda d: d.unique(), "_unique2"),
    "embedding_bag": (
        lambda d: torch.nn.functional.embedding_bag(torch.tensor([0, 1, 2]), d, torch.tensor([0])),
        "_embedding_bag",
    ),
    "attention": (
        lambda d: torch.nn.functional.scaled_dot_product_attention(*[d.view(1, 2, 2, 4)] * 3),
        "_scaled_dot_product_flash_attention_for_cpu",
    ),
}


@pytest.mark.parametrize("name", list(NO_FORWARD_FORMULA))
def test_a_kernel_without_a_forward_formula_raises_eagers_error(name):
    """(was a tangent computed by reverse mode twice where eager has none)"""
    op, kernel = NO_FORWARD_FORMULA[name]
    x, t = torch.randn(4, 4), torch.randn(4, 4)
    message = f"Trying to use forward AD with {kernel} that does not support it"
    with pytest.raises(NotImplementedError, match=message):
        _tangent_of(op)(x, t)
    with pytest.raises(NotImplementedError, match=message):
        thunder_rs.jit(_tangent_of(op))(x, t)
    plain = _tangent_of(lambda d: torch.cdist(x, x) + d)  # (no dual reaches it: eager computes it)
    assert torch.equal(thunder_rs.jit(plain)(x, t), plain(x, t))


@pytest.mark.parametrize("name", ["cdist", "attention"])
def test_a_kernel_without_a_forward_formula_under_func_jvp_raises_eagers_error(name):
    """(was a tangent computed by reverse mode twice where eager has none; attention's math path,
    which eager takes under sdpa_kernel(MATH), has one)"""
    op, kernel = NO_FORWARD_FORMULA[name]

    def program(x, t):
        return torch.func.jvp(op, (x,), (t,))[1]

    def math_path(x, t):
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            return torch.func.jvp(NO_FORWARD_FORMULA["attention"][0], (x,), (t,))[1]

    x, t = torch.randn(4, 4), torch.randn(4, 4)
    message = f"Trying to use forward AD with {kernel} that does not support it"
    with pytest.raises(NotImplementedError, match=message):
        program(x, t)
    with pytest.raises(NotImplementedError, match=message):
        thunder_rs.jit(program)(x, t)
    torch.testing.assert_close(thunder_rs.jit(math_path)(x, t), math_path(x, t))


def test_a_call_at_another_forward_ad_level_compiles_again():
    """The program's ``make_dual`` is traced at the caller's level: outside any level eager raises
    (was the cached entry's tangent)."""

    def at_the_callers_level(x, t):
        return fwAD.unpack_dual(fwAD.make_dual(x, t).sin()).tangent

    jitted, x, t = thunder_rs.jit(at_the_callers_level), torch.randn(3), torch.randn(3)
    with fwAD.dual_level():
        assert torch.equal(jitted(x, t), at_the_callers_level(x, t))
    with pytest.raises(RuntimeError, match="no level exists"):
        at_the_callers_level(x, t)
    with pytest.raises(RuntimeError, match="no level exists"):
        jitted(x, t)


def test_a_dual_of_values_vmap_batches_raises_eagers_error():
    def program(xs, ts):
        return torch.vmap(_tangent_of(torch.sin))(xs, ts)

    xs, ts = torch.randn(2, 3), torch.randn(2, 3)
    message = "Batching rule not implemented for aten::_make_dual"
    with pytest.raises(RuntimeError, match=message):
        program(xs, ts)
    with pytest.raises(RuntimeError, match=message + r".*test_dual_tensors\.py:\d+"):
        thunder_rs.jit(program)(xs, ts)


def test_whether_an_input_is_a_dual_is_part_of_the_cache_key():
    """A program unpacking at the caller's level, called in the caller's level with a plain input
    and then a dual (was the first entry's None tangent), and the other way round (was refused for
    the plain call too); a program using no dual API gives the dual's tangent either way."""

    def at_the_callers_level(x):
        return fwAD.unpack_dual(x.sin()).tangent

    def plain(x):
        return x.exp() * x.cos()

    x, t = torch.randn(3), torch.randn(3)
    first, second = thunder_rs.jit(at_the_callers_level), thunder_rs.jit(plain)
    with fwAD.dual_level():
        assert first(x) is None and at_the_callers_level(x) is None
        with pytest.raises(NotImplementedError, match=r"an input of the jitted call is a dual tensor"):
            first(fwAD.make_dual(x, t))
        assert first(x) is None
        expected = fwAD.unpack_dual(plain(fwAD.make_dual(x, t)))
        for dual in (False, True, False, True):
            out = fwAD.unpack_dual(second(fwAD.make_dual(x, t) if dual else x))
            assert torch.equal(out.primal, expected.primal)
            assert (out.tangent is None) if not dual else torch.equal(out.tangent, expected.tangent)
    assert thunder_rs.cache_hits(first) == 1 and thunder_rs.cache_hits(second) == 2


def test_a_dual_input_to_a_call_recording_a_gradient_gives_eagers_tangent():
    """The parameters require grad: the compiled autograd function has no forward-mode formula
    (was torch's 'You must implement the jvp function'); the program runs as torch calls, whose
    tangent and gradients are eager's."""
    torch.manual_seed(0)
    layer, x, t = torch.nn.Linear(4, 3), torch.randn(2, 4), torch.randn(2, 4)
    results = []
    for program in (layer, thunder_rs.jit(layer)):
        layer.zero_grad()
        with fwAD.dual_level():
            primal, tangent = fwAD.unpack_dual(program(fwAD.make_dual(x, t)).tanh())
            (primal.sum() + tangent.pow(2).sum()).backward()
        results.append([primal, tangent, layer.weight.grad.clone(), layer.bias.grad.clone()])
    torch.testing.assert_close(results[1], results[0])


def test_a_dual_input_runs_on_the_per_op_executors(fake_ex):
    """A fusion's kernel carries no tangent (nvFuser's; the stand-in's torch calls would): the
    entry for a dual input runs the torch executor's calls, that for a plain one the fusion."""

    def program(x):
        return (x.exp() * x.cos()).sum(0)

    jitted, x, t = thunder_rs.jit(program, executors=[fake_ex]), torch.randn(3, 3), torch.randn(3, 3)
    with fwAD.dual_level():
        expected, out = fwAD.unpack_dual(program(fwAD.make_dual(x, t))), fwAD.unpack_dual(jitted(fwAD.make_dual(x, t)))
        assert "fusion" not in str(thunder_rs.last_traces(jitted)[-1])
        torch.testing.assert_close(out, expected)
        jitted(x)
        assert "fusion" in str(thunder_rs.last_traces(jitted)[-1])


def test_a_dual_input_to_a_call_writing_its_inputs_is_refused():
    """BatchNorm's running statistics, written after the call: the program as torch calls does not
    write them (was torch's 'You must implement the jvp function', not naming the construct)."""
    norm = torch.nn.BatchNorm1d(3)
    with fwAD.dual_level():
        dual = fwAD.make_dual(torch.randn(4, 3), torch.randn(4, 3))
        with pytest.raises(NotImplementedError, match=r"forward_ad: .* writes its inputs in place .* dual tensor"):
            thunder_rs.jit(norm)(dual)


class _Scaled(torch.nn.Module):
    """Unpacks at the caller's level what its parameter, buffer and attribute scale."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3), requires_grad=False)
        self.register_buffer("shift", torch.randn(3))
        self.scale = torch.randn(3)

    def forward(self, x):
        return fwAD.unpack_dual((x * self.weight + self.shift) * self.scale).tangent


@pytest.mark.parametrize("where", ["parameter", "buffer", "attribute"])
def test_a_dual_parameter_buffer_or_attribute_is_part_of_the_cache_key(where):
    """A module called at the caller's level with plain tensors, then with a dual in a parameter
    (``functional_call``), a buffer or an attribute: eager's tangent is not None, where the entry of
    the plain call gave None (was that entry's); the program's dual API is refused for it, as for
    a dual argument, and the plain call gives None again."""
    module = _Scaled()
    jitted, x = thunder_rs.jit(module), torch.randn(3)
    name = {"parameter": "weight", "buffer": "shift", "attribute": "scale"}[where]
    with fwAD.dual_level():
        assert jitted(x) is None and module(x) is None
        dual = fwAD.make_dual(torch.randn(3), torch.randn(3))
        if where == "parameter":
            call = lambda program: torch.func.functional_call(program, {name: dual}, (x,))  # noqa: E731
        else:
            plain = getattr(module, name)
            setattr(module, name, dual)
            call = lambda program: program(x)  # noqa: E731
        assert call(module) is not None
        with pytest.raises(NotImplementedError, match=r"an input of the jitted call is a dual tensor"):
            call(jitted)
        if where != "parameter":
            setattr(module, name, plain)
        assert jitted(x) is None


class _Fused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 3))

    def forward(self, x):
        return (x.exp() * self.weight.cos()).sum(0)


def test_a_dual_parameter_or_captured_tensor_runs_on_the_per_op_executors(fake_ex):
    """A fusion's kernel carries no tangent (an Inductor region's drops it): a module called with
    dual parameters (``functional_call``) and a program reading a captured dual, after plain ones,
    run the torch executor's calls (were the fusion of the plain call's entry, or a new one)."""
    captured = [torch.randn(3, 3)]

    def program(x):
        return (x.exp() * captured[0].cos()).sum(0)

    model, x = _Fused(), torch.randn(3, 3)
    jitted_model, jitted = thunder_rs.jit(model, executors=[fake_ex]), thunder_rs.jit(program, executors=[fake_ex])
    with fwAD.dual_level():
        jitted_model(x), jitted(x)
        assert "fusion" in str(thunder_rs.last_traces(jitted_model)[-1])
        params = {k: fwAD.make_dual(v.detach(), torch.randn_like(v)) for k, v in model.named_parameters()}
        out = fwAD.unpack_dual(torch.func.functional_call(jitted_model, params, (x,)))
        torch.testing.assert_close(out, fwAD.unpack_dual(torch.func.functional_call(model, params, (x,))))
        assert "fusion" not in str(thunder_rs.last_traces(jitted_model)[-1])
        captured[0] = fwAD.make_dual(torch.randn(3, 3), torch.randn(3, 3))
        torch.testing.assert_close(fwAD.unpack_dual(jitted(x)), fwAD.unpack_dual(program(x)))
        assert "fusion" not in str(thunder_rs.last_traces(jitted)[-1])
        assert "forward-AD duals changed: () -> (0,)" in thunder_rs.compile_stats(jitted).miss_reasons[-1]


def test_a_value_computed_from_a_dual_of_the_callers_level_returned_is_refused():
    """Eager's output carries its tangent out of the call (was a plain output: the caller's
    unpack_dual gave None); the program's unpacked primal and tangent are eager's."""

    def returned(x, t):
        return (fwAD.make_dual(x, t) * 2).tanh()

    def unpacked(x, t):
        return fwAD.unpack_dual((fwAD.make_dual(x, t) * 2).tanh())

    x, t = torch.randn(3), torch.randn(3)
    with fwAD.dual_level():
        assert fwAD.unpack_dual(returned(x, t)).tangent is not None
        match = r"make_dual at .*test_dual_tensors\.py:\d+: the program returns a tensor computed from a dual"
        with pytest.raises(NotImplementedError, match=match):
            thunder_rs.jit(returned)(x, t)
        torch.testing.assert_close(thunder_rs.jit(unpacked)(x, t), unpacked(x, t))
