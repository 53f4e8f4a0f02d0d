"""Op fidelity, stop 65 (the OpInfo sweep's fifth round: complex values with gradients, natively):
what ``benchmarks/op_fidelity.py --dtypes complex64,complex128`` found running eager's op as an
opaque fallback, or an ulp apart (benchmarks/results/op_fidelity_stop65.md).

- Complex ``var``/``std``/``var_mean``/``std_mean``, ``bmm``/``baddbmm``/``mv``/``dot``,
  ``cumsum``, ``prod`` (contiguous inputs), vector norms (``linalg.vector_norm``, ``linalg.norm``,
  ``torch.norm``, Frobenius ``matrix_norm``) and ``pow`` with gradients are traced by grad rules
  that are eager's formulas conjugated (``derivatives.yaml``), values, gradients and strides
  eager's bit for bit.
- Complex ``tanh``'s gradient is eager's ``tanh_backward`` kernel (``g * conj(1 - y*y)``): the
  unary prim's VJP was an ulp apart in some elements (silently).
- ``cumsum(dtype=...)`` of a narrower floating input: eager casts the cotangent to the input's
  dtype before the reversed sum; the prim's VJP summed in the wider dtype and cast after, ulps
  apart (silently, real dtypes too).
"""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten

import thunder_rs

COMPLEX = [torch.complex64, torch.complex128]


def _tensors(value) -> list:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _same(actual, expected) -> bool:
    """Equal bit for bit (NaN where eager has NaN), same dtype, and the same strides."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    try:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    except AssertionError:
        return False
    return actual.numel() <= 1 or actual.stride() == expected.stride()


def _outputs_and_grads(fn, leaves, *args, **kwargs):
    """``fn``'s tensor outputs and the gradients of ``leaves`` from a fixed cotangent per output."""
    outs = _tensors(fn(*args, **kwargs))
    diff = [o for o in outs if o.requires_grad]
    grads = []
    if diff:
        gen = torch.Generator().manual_seed(7)
        cotangents = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in diff]
        grads = torch.autograd.grad(diff, leaves, cotangents, allow_unused=True)
    return [o.detach() for o in outs], list(grads)


def assert_matches_eager(fn, leaves, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _outputs_and_grads(fn, leaves, *args, **kwargs)
        actual = _outputs_and_grads(thunder_rs.jit(fn), leaves, *args, **kwargs)
    for e, a in zip(expected[0] + expected[1], actual[0] + actual[1]):
        assert (a is None) == (e is None)
        assert a is None or _same(a, e), (a, e)


# -- the OpInfo samples ------------------------------------------------------------------------------

#: OpInfos made native: (name, variant) -> how many of their samples run by default (all with --slow).
NATIVE_OPINFOS = {
    ("var", ""): 6,
    ("std", "unbiased"): 2,
    ("var_mean", ""): 6,
    ("std_mean", ""): 6,
    ("bmm", ""): 1,
    ("mv", ""): 1,
    ("dot", ""): 2,
    ("cumsum", ""): 4,
    ("prod", ""): 10,
    ("linalg.vector_norm", ""): 12,
    ("linalg.norm", ""): 8,
    ("norm", ""): 8,
    ("norm", "fro"): 3,
    ("pow", ""): 9,
    ("tanh", ""): 1,
    ("addcmul", ""): 6,
    ("lerp", ""): 6,
    ("nn.functional.tanhshrink", ""): 3,
}
_OPS = {(op.name, op.variant_test_name): op for op in op_db if (op.name, op.variant_test_name) in NATIVE_OPINFOS}


def _samples(key, dtype, every: bool):
    op = _OPS[key]
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=True))
    return op, samples if every else samples[: NATIVE_OPINFOS[key]]


def _check_opinfo(key, dtype, every: bool):
    op, samples = _samples(key, dtype, every)
    traced = 0
    for sample in samples:
        leaves = [t for t in _tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
        assert_matches_eager(op.op, leaves, sample.input, *sample.args, **sample.kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fallbacks = thunder_rs.examine(op.op, sample.input, *sample.args, **sample.kwargs).fallbacks
        traced += fallbacks == {}
    # (some samples pass complex numbers, a dtype= or a non-contiguous prod: eager's op runs those)
    assert traced > 0


@pytest.mark.parametrize("key", NATIVE_OPINFOS, ids=lambda k: ".".join(filter(None, k)))
def test_complex64_opinfo_samples_with_gradients_are_traced_as_eager(key):
    _check_opinfo(key, torch.complex64, every=False)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("key", NATIVE_OPINFOS, ids=lambda k: ".".join(filter(None, k)))
def test_every_opinfo_sample_with_gradients_is_eagers(key, dtype):
    _check_opinfo(key, dtype, every=True)


# -- scalars, empty, non-contiguous and broadcast operands -------------------------------------------


def _column_major(t):
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _with_zero(t, at=(1,)):
    t = t.clone()
    t.view(-1)[list(at)] = 0
    return t


#: Programs of complex leaves made native: (program, leaf shapes, layout of the first leaf).
PROGRAMS = {
    "var_scalar": (lambda z: z.var(correction=0), [()], None),
    "std_dim_keepdim": (lambda z: torch.std(z, 0, keepdim=True), [(5, 7)], None),
    "var_noncontiguous": (lambda z: z.var(1), [(5, 7)], _column_major),
    "var_mean_empty_dim": (lambda z: torch.var_mean(z, 1), [(3, 0)], None),
    "std_mean": (lambda z: torch.std_mean(z, -1), [(2, 3, 17)], None),
    "bmm": (torch.bmm, [(3, 7, 9), (3, 9, 5)], None),
    "bmm_noncontiguous": (torch.bmm, [(3, 7, 9), (3, 9, 5)], _column_major),
    "bmm_empty": (torch.bmm, [(2, 0, 3), (2, 3, 4)], None),
    "bmm_blas": (torch.bmm, [(4, 17, 33), (4, 33, 20)], None),
    "baddbmm_broadcast": (
        lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2),
        [(5,), (3, 4, 6), (3, 6, 5)],
        None,
    ),
    "mv_noncontiguous": (torch.mv, [(5, 7), (7,)], _column_major),
    "dot": (lambda a, b: a.dot(b) * 2, [(9,), (9,)], None),
    "cumsum": (lambda z: z.cumsum(0), [(5, 7)], None),
    "cumsum_scalar": (lambda z: z.cumsum(0), [()], None),
    "cumsum_noncontiguous": (lambda z: torch.cumsum(z, -1), [(5, 7)], _column_major),
    "cumsum_widened": (lambda z: z.cumsum(1, dtype=torch.complex128), [(4, 3)], None),
    "cumulative_trapezoid": (lambda z: torch.cumulative_trapezoid(z, dx=0.3, dim=0), [(5, 7)], None),
    "cumulative_trapezoid_noncontiguous": (torch.cumulative_trapezoid, [(5, 7)], _column_major),
    "prod": (lambda z: z.prod(), [(5, 7)], None),
    "prod_dim_one_zero": (lambda z: z.prod(1), [(5, 7)], _with_zero),
    "prod_one_zero": (lambda z: torch.prod(z), [(4, 3)], _with_zero),
    "prod_two_zeros": (lambda z: torch.prod(z, 0, keepdim=True), [(4, 3)], lambda t: _with_zero(t, (1, 4))),
    "prod_scalar": (lambda z: z.prod(), [()], None),
    "prod_empty": (lambda z: z.prod(0), [(0, 3)], None),
    "vector_norm": (lambda z: torch.linalg.vector_norm(z), [(5, 7)], None),
    "vector_norm_scalar": (lambda z: torch.linalg.vector_norm(z, 3), [()], None),
    "vector_norm_inf_ties": (lambda z: torch.linalg.vector_norm(z, math.inf, -1), [(3, 4)], lambda t: t * 0 + 1j),
    "vector_norm_zero_row": (lambda z: torch.linalg.vector_norm(z, 1.5, 1, keepdim=True), [(3, 4)], lambda t: t * 0),
    "vector_norm_noncontiguous": (lambda z: torch.linalg.vector_norm(z, 0.5, 0), [(5, 7)], _column_major),
    "norm": (lambda z: z.norm(), [(5, 7)], None),
    "frobenius": (lambda z: torch.linalg.matrix_norm(z), [(2, 5, 7)], None),
    "pow_number": (lambda z: z.pow(3) + z**0.5 + z**-2, [(5, 7)], None),
    "pow_zero": (lambda z: z.pow(0), [(5, 7)], None),
    "pow_broadcast": (torch.pow, [(5, 7), (7,)], None),
    "pow_scalar_exponent": (torch.pow, [(5, 7), ()], _with_zero),
    "addcmul_broadcast": (lambda a, b, c: torch.addcmul(a, b, c, value=0.5), [(5, 7), (7,), (5, 1)], None),
    "addcmul_noncontiguous": (torch.addcmul, [(5, 7), (5, 7), (5, 7)], _column_major),
    "lerp_tensor_weight": (torch.lerp, [(5, 7), (5, 7), (7,)], _column_major),
    "lerp_number_weight": (lambda a, b: torch.lerp(a, b, 0.3), [(5, 7), (1, 7)], None),
    "tanh_noncontiguous": (torch.tanh, [(4, 3)], _column_major),
    "tanh_scalar": (torch.tanh, [()], None),
}


def _leaves(shapes, layout, dtype):
    gen = torch.Generator().manual_seed(3)
    leaves = [torch.randn(s, dtype=dtype, generator=gen) for s in shapes]
    if layout is not None:
        leaves[0] = layout(leaves[0])
    return [t.requires_grad_() for t in leaves]


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("name", PROGRAMS)
def test_a_complex_op_with_gradients_is_traced_as_eager(name, dtype):
    program, shapes, layout = PROGRAMS[name]
    leaves = _leaves(shapes, layout, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert thunder_rs.examine(program, *leaves).fallbacks == {}  # (traced, not eager's op)
    assert_matches_eager(program, leaves, *leaves)


#: Where the trace cannot give eager's gradient it still runs eager's op.
EAGERS_OP = {
    # (with a zero eager's gradient is a new contiguous tensor, without one laid out as the input)
    "prod_noncontiguous": (lambda z: z.prod(1), [(5, 7)], _column_major),
    "prod_dtype": (lambda z: z.prod(0, dtype=torch.complex128), [(5, 7)], None),
    "vector_norm_dtype": (lambda z: torch.linalg.vector_norm(z, dtype=torch.complex128), [(5, 7)], None),
    "nuclear_norm": (lambda z: torch.norm(z, "nuc"), [(5, 7)], None),
    "cumulative_trapezoid_x": (lambda z, x: torch.cumulative_trapezoid(z, x), [(5, 7), (7,)], None),
    "baddbmm_complex_beta": (
        lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5j),
        [(3, 4, 5), (3, 4, 6), (3, 6, 5)],
        None,
    ),
}


@pytest.mark.parametrize("name", EAGERS_OP)
def test_what_the_trace_cannot_differentiate_is_eagers_op(name):
    program, shapes, layout = EAGERS_OP[name]
    leaves = _leaves(shapes, layout, torch.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert thunder_rs.examine(program, *leaves).fallbacks != {}
    assert_matches_eager(program, leaves, *leaves)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64], ids=str)
def test_a_widened_cumsums_gradient_is_cast_before_it_is_summed(dtype):
    """Eager's ``cumsum_backward(grad.to(input.dtype), dim)``: the prim's VJP summed the float64
    cotangent and cast after (float32 and bfloat16 gradients ulps apart, silently)."""
    wide = torch.complex128 if dtype.is_complex else torch.float64
    leaves = _leaves([(5, 7)], None, dtype)
    assert_matches_eager(lambda x: x.cumsum(1, dtype=wide), leaves, *leaves)


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("length", [3, 5, 8, 12, 17, 33])
def test_complex_tanhs_gradient_is_eagers_kernel(length, dtype):
    # (the prim's VJP rounded ``g * conj(1 - y*y)`` otherwise than eager's vector loop: an ulp)
    leaves = _leaves([(length, 3)], None, dtype)
    assert_matches_eager(lambda z: torch.tanh(z) * 2, leaves, *leaves)


def test_a_complex_cumsum_differentiates_twice_as_eager():
    leaves = _leaves([(4, 3)], None, torch.complex64)

    def program(z):
        return (z.cumsum(0) * z).sum()

    results = []
    for fn in (program, thunder_rs.jit(program)):
        (g,) = torch.autograd.grad(fn(*leaves).real, leaves, create_graph=True)
        results.append([g.detach(), *torch.autograd.grad(g.abs().sum(), leaves)])
    assert all(_same(a, e) for a, e in zip(*results))


# -- errors --------------------------------------------------------------------------------------------


def _raised(fn, *args, **kwargs) -> BaseException | None:
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        return e
    return None


@pytest.mark.parametrize("name", ["dot", "pow"])
def test_opinfo_error_inputs_raise_eagers_errors(name):
    op = _OPS[(name, "")]
    for sample in op.error_inputs("cpu"):
        s = sample.sample_input
        expected = _raised(op.op, s.input, *s.args, **s.kwargs)
        raised = _raised(thunder_rs.jit(op.op), s.input, *s.args, **s.kwargs)
        assert type(raised) is type(expected) or isinstance(raised, type(expected))
        # (eager's message, the OpInfo's pattern, or one naming the op: the sweep's ``matches``)
        message = str(raised)
        assert re.search(sample.error_regex, message) or str(expected) in message or f"ltorch.{name}" in message


#: Complex operands that eager refuses, with gradients: the same errors under the jit.
ERRORS = {
    "bmm_dtypes": (torch.bmm, [(2, 3, 4), (2, 4, 5)], torch.complex128),
    "bmm_batch": (lambda a, b: torch.bmm(a, b[:1]), [(2, 3, 4), (2, 4, 5)], None),
    "mv_sizes": (lambda a, b: torch.mv(a, b[:-1]), [(3, 4), (4,)], None),
    "dot_dtypes": (torch.dot, [(4,), (4,)], torch.complex128),
    "baddbmm_shape": (lambda c, a, b: torch.baddbmm(c, a, b), [(3, 2), (3, 4, 6), (3, 6, 5)], None),
    "cumsum_dim": (lambda z: z.cumsum(2), [(3, 4)], None),
    "prod_dim": (lambda z: z.prod(-3), [(3, 4)], None),
    "var_dim": (lambda z: z.var(5), [(3, 4)], None),
    "vector_norm_empty_inf": (lambda z: torch.linalg.vector_norm(z, math.inf), [(0, 3)], None),
    "vector_norm_real_dtype": (lambda z: torch.linalg.vector_norm(z, dtype=torch.float32), [(3,)], None),
    "pow_shapes": (torch.pow, [(3, 4), (5,)], None),
}


@pytest.mark.parametrize("name", ERRORS)
def test_complex_operands_eager_refuses_raise_its_errors(name):
    program, shapes, other_dtype = ERRORS[name]
    leaves = _leaves(shapes, None, torch.complex64)
    if other_dtype is not None:
        leaves[-1] = leaves[-1].detach().to(other_dtype).requires_grad_()
    expected = _raised(program, *leaves)
    assert expected is not None
    raised = _raised(thunder_rs.jit(program), *leaves)
    assert isinstance(raised, type(expected)) or isinstance(expected, type(raised)), (raised, expected)
