"""A custom ``torch.autograd.Function``'s backward reads its cotangents through a marker call
(``fallback.materialized``) at which a compiled backward's absent fallback gradients stop (eager
gives such a backward zeros for an undefined gradient). Where the backward holds no opaque backward
that can give absent gradients (the common case), the marker is dropped: the backward runs no
extra call per cotangent, and a fusion executor fuses across it. Values and gradients are eager's."""

import torch
from custom_ops import scaled_pair

import thunder_rs
from thunder_rs.core.lang import fallback


class _Squared(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x


class _Pair(torch.autograd.Function):
    """Two outputs; its backward returns one cotangent as it is."""

    @staticmethod
    def forward(ctx, x):
        return x * 3, x.exp()

    @staticmethod
    def backward(ctx, g1, g2):
        return g1 + g2


def _through_a_function(x):
    return _Squared.apply(x.sin()).cos()


def _pair_program(x):
    a, b = _Pair.apply(x * 2)
    return a.tanh() + b


def _the_marker() -> str:
    return fallback.qualified_name(fallback._materialize)


def _grads_as_eager(program, x, executors=None):
    xe = x.detach().clone().requires_grad_()
    jfn = thunder_rs.jit(program) if executors is None else thunder_rs.jit(program, executors=executors)
    out, ref = jfn(x), program(xe)
    g = torch.linspace(-1, 1, ref.numel(), dtype=ref.dtype).reshape(ref.shape)
    out.backward(g)
    ref.backward(g)
    assert torch.equal(out, ref)
    torch.testing.assert_close(x.grad, xe.grad, rtol=0, atol=1e-6)
    return jfn


def test_a_custom_functions_backward_holds_no_marker_without_absent_gradients():
    for program in (_through_a_function, _pair_program):
        jfn = _grads_as_eager(program, torch.linspace(-2, 2, 12).reshape(3, 4).requires_grad_())
        backward = thunder_rs.last_backward_traces(jfn)
        labels = [t.label for t in backward]
        assert any(name.startswith(_the_marker()) for name in backward[0].all_symbol_names())  # (as split)
        for trace in backward[labels.index("materialized") :]:  # each stage from the one dropping it
            assert not any(name.startswith(_the_marker()) for name in trace.all_symbol_names()), trace
        assert "eager_" not in str(backward[-1]), backward[-1]  # no opaque call at all


def test_a_custom_functions_backward_between_fusible_ops_is_one_region(fake_ex):
    x = torch.linspace(-2, 2, 12).reshape(3, 4).requires_grad_()
    jfn = _grads_as_eager(_through_a_function, x, executors=[fake_ex])
    backward = thunder_rs.last_backward_traces(jfn)[-1]
    assert [r.name for r in backward.regions()] == ["nvfuser_fake_fusion0"], backward
    assert fake_ex.stats["failures"] == 0


def _absent_reaching_a_function(x, y):
    # (a fallback whose backward gives ``_Squared``'s output no gradient: the loss reads its first output)
    return scaled_pair(x, _Squared.apply(y))[0]


def test_the_marker_stays_where_an_absent_gradient_can_reach_it():
    """Eager gives the Function's backward zeros for the absent gradient: ``y`` gets zeros."""
    torch.manual_seed(0)
    args = [torch.randn(3, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    eargs = [a.detach().clone().requires_grad_() for a in args]
    jfn = thunder_rs.jit(_absent_reaching_a_function)
    jfn(*args).sum().backward()
    _absent_reaching_a_function(*eargs).sum().backward()
    for a, e in zip(args, eargs):
        assert torch.equal(a.grad, e.grad)
    names = thunder_rs.last_backward_traces(jfn)[-1].all_symbol_names()
    assert any(name.startswith(_the_marker()) for name in names)
