"""Floats made from sizes that change between calls (issue 26): ``T ** -0.5``, ``1.0 / T``,
``T / 10``, ``T * 0.5`` of a symbolic size are symbolic floats (``core.lang.symfloat``), which the
compiled program computes on each call with eager's own float operations: one symbolic compile
serves every size, values bit-equal to eager in float64, float32 and bfloat16. A comparison of
such a float is the relation of the sizes it is (``T / 4 > 2``: ``T > 8``) where that is exact,
else the sizes it reads are specialised (a compile per value, never a wrong answer)."""

import math
import traceback

import numpy
import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from thunder_rs.core.lang.symfloat import SymFloat

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = (5, 6, 7, 9, 12)


def _width(x):
    return x.shape[-1]


#: name -> program of a tensor whose last size changes; differentiable ones are checked with grads.
PROGRAMS = {
    "pow -0.5": lambda x: x * _width(x) ** -0.5,
    "pow 0.5": lambda x: x * _width(x) ** 0.5,
    "1.0 / T": lambda x: x * (1.0 / _width(x)),
    "T * 0.5": lambda x: x * (_width(x) * 0.5),
    "float chain": lambda x: x * ((_width(x) / 3 + 0.25) * 2.0 + 1.0 / _width(x)) ** 1.5 - 1.0 / _width(x),
    "reflected": lambda x: _width(x) ** -0.5 * x - (2 + _width(x) / 7),
    "clamp T / 10": lambda x: x.clamp(max=_width(x) / 10),
    "mul_ scale": lambda x: x.clone().mul_(_width(x) ** -0.5),
    "add alpha": lambda x: x.add(x.flip(-1), alpha=_width(x) / 4),
    "addcmul value": lambda x: x.addcmul(x, x.flip(-1), value=_width(x) / 4),
    "fill_": lambda x: x.clone().fill_(_width(x) / 2) * x,
    "where": lambda x: torch.where(x > 0, x, _width(x) / 2),
    "masked_fill": lambda x: x.masked_fill(x > 0, _width(x) / 2),
    "divided by a tensor": lambda x: (_width(x) / 3) / (x.abs() + 1),
    "unbiased": lambda x: x.var(-1, correction=0) * (_width(x) / (_width(x) - 1)),
    "full T / 2": lambda x: x + torch.full((1,), _width(x) / 2, dtype=x.dtype),
    "tensor(T / 2)": lambda x: x * torch.tensor(_width(x) / 2, dtype=x.dtype),
    "interpolate nearest": lambda x: F.interpolate(x[None, None], scale_factor=_width(x) / 4),
    "interpolate bilinear": lambda x: F.interpolate(x[None, None], scale_factor=_width(x) * 0.75, mode="bilinear"),
    "sdpa": lambda x: F.scaled_dot_product_attention(x[None], x[None], x[None]),
    "sdpa scale": lambda x: F.scaled_dot_product_attention(x[None], x[None], x[None], scale=_width(x) ** -0.25),
    "math.sqrt": lambda x: (x @ x.mT / math.sqrt(_width(x))).softmax(-1) @ x,
    "math.log": lambda x: x * (math.log(_width(x) / 4) / math.log(128 / 4)),
}
NOT_DIFFERENTIABLE = {"full T / 2"}
#: Ops that run eager's kernel with the float as its parameter (``linalg_vector_norm``'s ``ord``): a
#: compile per value (the size specialised, as torch.compile's for a kernel's constant).
OP_KERNEL_PARAMETERS = {"normalize"}
#: Backward formulas that round otherwise than eager's autograd, with constant floats too (1 ulp).
ROUNDED_GRADS = {"sdpa", "sdpa scale", "addcmul value", "divided by a tensor", "unbiased"}


def _inputs(dtype, T, requires_grad=False):
    torch.manual_seed(T)
    return torch.randn(3, T, dtype=dtype, requires_grad=requires_grad)


def _check(fn, dtype, grads=False, grad_tol=0.0, compiles=2):
    jf = thunder_rs.jit(fn)
    for T in SIZES:
        x = _inputs(dtype, T, requires_grad=grads)
        expected, actual = fn(x), jf(x)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        assert actual.dtype == expected.dtype and actual.stride() == expected.stride()
        if grads:
            cot = torch.randn_like(expected)
            torch.testing.assert_close(
                torch.autograd.grad(actual, x, cot)[0],
                torch.autograd.grad(expected, x, cot)[0],
                rtol=grad_tol,
                atol=grad_tol,
            )
    assert thunder_rs.compile_stats(jf).cache_misses <= compiles, thunder_rs.compile_stats(jf).miss_reasons
    return jf


#: Ops whose decomposition read the float (a check, a branch, a fill, an end point): name ->
#: (program, differentiable). The default run takes a representative few.
OP_PROGRAMS = {
    "lerp": (lambda x: torch.lerp(x, x.flip(-1), _width(x) / 10), True),
    "hardtanh": (lambda x: F.hardtanh(x, -_width(x) / 4, _width(x) / 4), True),
    "xlogy": (lambda x: torch.xlogy(_width(x) / 3, x.abs()), True),
    "dropout": (lambda x: (torch.manual_seed(0), F.dropout(x, p=1 / _width(x)))[1], True),
    "smooth_l1_loss": (lambda x: F.smooth_l1_loss(x, x.flip(-1) * 0.5, beta=_width(x) / 8), True),
    # (with grads F.normalize's p-norm is 1 ulp off eager's with a constant p too)
    "normalize": (lambda x: F.normalize(x, p=_width(x) / 4), False),
    "histc": (lambda x: torch.histc(x, bins=4, min=0, max=_width(x) / 2), False),
    "linspace": (lambda x: x.sum() + torch.linspace(0.0, _width(x) / 2, 7, dtype=x.dtype), True),
    "max": (lambda x: x * max(_width(x) / 4, 1.0), True),
    # a length ceil((T / 2 - 0.0) / 0.5) whose float operations are exact: the int T
    "arange": (lambda x: x.sum() + torch.arange(0.0, _width(x) / 2, 0.5, dtype=x.dtype), True),
    "pow": (lambda x: (x.abs() + 0.5).pow(_width(x) / 8 - 1), True),  # (two roundings: no relation)
}
#: Ops that run eager's kernel with the float as its parameter (``linalg_vector_norm``'s ``ord``): a
#: compile per value (the size specialised, as torch.compile's for a kernel's constant).
OP_KERNEL_PARAMETERS = {"normalize"}
#: Backward formulas that round otherwise than eager's autograd, with constant floats too (1 ulp).
OP_ROUNDED_GRADS = {"lerp", "smooth_l1_loss"}
REPRESENTATIVE = {"lerp", "hardtanh", "xlogy", "dropout", "pow"}


@pytest.mark.parametrize(
    "name", [n if n in REPRESENTATIVE else pytest.param(n, marks=pytest.mark.slow) for n in OP_PROGRAMS]
)
def test_ops_reading_a_float_of_sizes_float64(name):
    fn, differentiable = OP_PROGRAMS[name]
    tol = 1e-12 if name in OP_ROUNDED_GRADS else 0.0
    _check(fn, torch.float64, differentiable, tol, len(SIZES) if name in OP_KERNEL_PARAMETERS else 2)


def test_the_gradient_of_a_power_of_sizes_that_is_zero():
    # eager's pow_backward gives zeros for a zero exponent (here at T == 8), not 0 * x ** -1
    def fn(x):
        return x.abs().pow(_width(x) / 8 - 1)

    jf = thunder_rs.jit(fn)
    for T in (5, 8, 9, 8):
        x = _inputs(torch.float64, T, requires_grad=True)
        with torch.no_grad():
            x[0, 0] = 0.0
        expected, actual = fn(x), jf(x)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        cot = torch.ones_like(expected)
        grads = torch.autograd.grad(actual, x, cot)[0], torch.autograd.grad(expected, x, cot)[0]
        torch.testing.assert_close(*grads, rtol=0, atol=0, equal_nan=True)
    assert thunder_rs.compile_stats(jf).cache_misses == 2, thunder_rs.compile_stats(jf).miss_reasons


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", OP_PROGRAMS)
def test_ops_reading_a_float_of_sizes_low_precision(name, dtype):
    _check(OP_PROGRAMS[name][0], dtype, compiles=len(SIZES) if name in OP_KERNEL_PARAMETERS else 2)


@pytest.mark.parametrize("name", PROGRAMS)
def test_float_of_sizes_float64_with_grads(name):
    tol = 1e-12 if name in ROUNDED_GRADS else 0.0
    _check(PROGRAMS[name], torch.float64, grads=name not in NOT_DIFFERENTIABLE, grad_tol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", PROGRAMS)
def test_float_of_sizes_low_precision(name, dtype):
    _check(PROGRAMS[name], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_weak_float_scalar_keeps_the_tensor_dtype(dtype):
    # eager passes the double to the kernel: a bfloat16 tensor times T ** -0.5 stays bfloat16
    _check(PROGRAMS["pow -0.5"], dtype)
    _check(PROGRAMS["1.0 / T"], dtype)


def test_an_int_tensor_times_a_float_of_sizes_is_a_float_tensor():
    def f(x):
        return x * (x.shape[0] / 4)

    jf = thunder_rs.jit(f)
    for T in SIZES:
        x = torch.arange(T)
        torch.testing.assert_close(jf(x), f(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses == 2


def test_the_trace_computes_the_float_as_the_program_wrote_it():
    jf = thunder_rs.jit(lambda x: x * (1.0 / _width(x)) + x * _width(x) ** -0.5 + x * (_width(x) * 0.5))
    for T in SIZES[:2]:
        jf(_inputs(torch.float64, T))
    source = str(thunder_rs.last_traces(jf)[-1])
    for text in ("(1.0 / t0)", "(t0 ** (-0.5))", "(t0 * 0.5)"):
        assert text in source, source


def test_user_code_sees_a_float():
    def f(x):
        s = _width(x) ** -0.5
        return x * s if isinstance(s, float) and isinstance(1.0 / _width(x), float) else x

    _check(f, torch.float64)


def branchy(x):
    if _width(x) / 4 > 2:  # a decision on a float of sizes: the relation T > 8, a guard
        return x * _width(x) ** -0.5
    return x - 1.0 / _width(x)


def test_a_decision_on_a_float_of_sizes_is_a_relation_and_is_never_wrong():
    jf = thunder_rs.jit(branchy)
    for T in (5, 6, 7, 9, 12, 6, 9):
        x = _inputs(torch.float64, T)
        torch.testing.assert_close(jf(x), branchy(x), rtol=0, atol=0)
    misses = thunder_rs.compile_stats(jf).cache_misses
    assert misses == 3, thunder_rs.compile_stats(jf).miss_reasons  # T <= 8, then T > 8; hits on the repeats


def test_a_fractional_power_of_a_size_that_turns_negative_is_complex_as_in_eager():
    """``(T - 10) ** 0.5`` is a float for T >= 10 and complex below: the symbolic entry relies on
    ``T - 10 >= 0`` (a guard), so a smaller width compiles for its own value and gets eager's
    complex scale (the compiled program once passed the complex number to a float op)."""

    def program(x):
        return x.cos() * (_width(x) - 10) ** 0.5

    jf = thunder_rs.jit(program)
    for T in (12, 13, 14, 5, 15, 3):
        x = _inputs(torch.float64, T)
        torch.testing.assert_close(jf(x), program(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses == 4  # 12; T >= 10; 5 and 3 each their own


#: name -> (program deciding on a float of sizes, its compiles over DECISION_SIZES): a comparison
#: of single roundings of rationals of sizes is that relation of the sizes, guarded on each call.
DECISIONS = {
    "T / 3 == 2": (lambda x: x * 2 if _width(x) / 3 == 2 else x, 3),  # 5, then T == 6, then T != 6
    "max": (lambda x: x * max(_width(x) / 4, 1.5), 2),  # 5, then T / 4 >= 1.5
    "min of a reciprocal": (lambda x: x * min(1 / _width(x), 0.125), 3),  # 5, T <= 8, T > 8
    "T + 0.5 >= 8": (lambda x: x + 1 if _width(x) + 0.5 >= 8 else x, 3),  # 5, T <= 7, T > 7
    "exact operations": (lambda x: x + 1 if _width(x) * 0.75 + 0.5 >= 6 else x, 3),  # 3T + 2 >= 24
    "-T / 7 < -1": (lambda x: x + 1 if -_width(x) / 7 < -1 else x, 3),  # 5, T <= 7, T > 7
    "two floats of sizes": (lambda x: x + 1 if _width(x) / 3 < 12 / _width(x) else x, 2),  # 5, T * T >= 36
    # no single rounding of a rational: the value itself, the sizes specialised (a compile a size)
    "sqrt": (lambda x: x + 1 if _width(x) ** 0.5 > 2.5 else x, 5),
    "0.1": (lambda x: x + 1 if _width(x) / 4 > 0.1 else x, 5),
    "two roundings": (lambda x: x + 1 if _width(x) / 3 + 0.5 >= 3 else x, 5),
}
DECISION_SIZES = (5, 6, 7, 6, 9, 12)


@pytest.mark.parametrize("name", DECISIONS)
def test_decisions_on_floats_of_sizes(name):
    fn, compiles = DECISIONS[name]
    jf = thunder_rs.jit(fn)
    for T in DECISION_SIZES:
        x = _inputs(torch.float64, T)
        torch.testing.assert_close(jf(x), fn(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses == compiles, thunder_rs.compile_stats(jf).miss_reasons


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x[:, : int(_width(x) * 0.5)],
        lambda x: x * numpy.sqrt(_width(x)),
        lambda x: x * float(_width(x) / 3),
        lambda x: x + round(_width(x) / 3, 2),
        lambda x: x * hash(_width(x) / 2) + len(f"{_width(x) / 3}"),
    ],
    ids=["int", "numpy.sqrt", "float", "round", "hash and text"],
)
def test_plain_answers_specialise_and_equal_eager(fn):
    jf = thunder_rs.jit(fn)
    for T in SIZES:
        x = _inputs(torch.float64, T)
        torch.testing.assert_close(jf(x), fn(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses <= len(SIZES)


def test_an_int_argument_as_a_float_scale():
    def f(x, n):
        return x * n**-0.5 + x / n

    jf = thunder_rs.jit(f)
    x = _inputs(torch.float32, 8)
    for n in (3, 5, 7, 11, 13):
        torch.testing.assert_close(jf(x, n), f(x, n), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses == 2


@pytest.mark.parametrize("name", ["pow -0.5", "float chain", "clamp T / 10", "where", "full T / 2", "math.log"])
def test_the_nvfuser_stand_in_takes_floats_of_sizes_as_inputs(fake_ex, name):
    # The float is a Double input of the region, computed on the host as the program computes it
    # (tests/test_nvfuser_symbolic.py checks the definitions and dtypes).
    def fn(x):
        return PROGRAMS[name](x.cos()).sin()

    fused, fuse = [], fake_ex.fuse
    fake_ex.fuse = lambda region: fused.append(region) or fuse(region)
    jf = thunder_rs.jit(fn, executors=[fake_ex, "torch"])
    for T in SIZES:
        x = _inputs(torch.float32, T)
        torch.testing.assert_close(jf(x), fn(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses <= 2
    assert fake_ex.stats["failures"] == 0, fake_ex.fallbacks
    assert any(type(a) is SymFloat for region in fused for call in region.calls for a in call.args)


@pytest.mark.slow
def test_inductor_takes_floats_of_sizes():
    fn = PROGRAMS["float chain"]
    jf = thunder_rs.jit(lambda x: fn(x).sin() + 1, executors=["inductor", "torch"])
    for T in SIZES:
        x = _inputs(torch.float64, T)
        torch.testing.assert_close(jf(x), fn(x).sin() + 1)
    assert thunder_rs.compile_stats(jf).cache_misses <= 2


class HalfWidth(torch.nn.Module):
    def forward(self, x):
        self.scale = _width(x) / 2  # module state: the float itself after each call, as in eager
        return x * self.scale, _width(x) ** -0.5


def test_a_float_of_sizes_leaving_the_program_is_a_float():
    m, eager = HalfWidth(), HalfWidth()
    jm = thunder_rs.jit(m)
    for T in SIZES[:3]:
        x = _inputs(torch.float64, T)
        (out, s), (expected, es) = jm(x), eager(x)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        assert type(s) is float and s == es
        assert type(m.scale) is float and m.scale == eager.scale


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x[:, : math.floor(_width(x) * 0.75)] * 2,
        lambda x: x[:, : math.ceil(_width(x) / 4)] * 2,
        lambda x: x.new_zeros(math.trunc(1.5 * _width(x))) + 1,
    ],
    ids=["floor", "ceil", "trunc"],
)
def test_rounding_a_size_times_a_dyadic_is_a_symbolic_int(fn):
    # T * 0.75 is exact in double: floor is (3*T) // 4 for every T >= 0, one compile
    jf = thunder_rs.jit(fn)
    for T in SIZES:
        x = _inputs(torch.float64, T)
        torch.testing.assert_close(jf(x), fn(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses == 2, thunder_rs.compile_stats(jf).miss_reasons


def test_arange_to_a_float_of_sizes():
    # exact operations give a symbolic length; T / 3 rounds, so its length specialises the size
    for end, compiles in ((lambda T: T * 0.75 - 1, 2), (lambda T: T / 3, len(SIZES))):

        def fn(x):
            return torch.arange(0.5, end(_width(x)), 0.25, dtype=x.dtype) + x.sum()

        jf = thunder_rs.jit(fn)
        for T in SIZES:
            x = _inputs(torch.float32, T)
            torch.testing.assert_close(jf(x), fn(x), rtol=0, atol=0)
        assert thunder_rs.compile_stats(jf).cache_misses == compiles, thunder_rs.compile_stats(jf).miss_reasons


def test_rounding_another_float_of_sizes_specialises():
    def fn(x):
        return x[:, : math.floor(_width(x) * 0.3)] * 2  # 0.3 is no dyadic: T * 0.3 rounds

    jf = thunder_rs.jit(fn)
    for T in SIZES:
        x = _inputs(torch.float64, T)
        torch.testing.assert_close(jf(x), fn(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses == len(SIZES)


# -- functions of math, rounding and draws of floats of sizes ---------------------------------------

#: name -> (program, its compiles over SIZES): ``math``'s functions of a size or a float of sizes are
#: symbolic (the compiled program calls ``math``'s own on the same double), as are ``floor``,
#: ``ceil`` and ``round`` of a single rounding of a rational of sizes; others specialise.
FUNCTIONS = {
    "math.sqrt": (lambda x: x / math.sqrt(_width(x)), 2),
    "math.sqrt of a float": (lambda x: x / math.sqrt(_width(x) / 3), 2),
    "torch.sym_sqrt": (lambda x: x / torch.sym_sqrt(_width(x)), 2),
    "math.log": (lambda x: x * math.log(_width(x)), 2),
    "math.log of a base": (lambda x: x * math.log(_width(x), 2) + math.log(10, _width(x)), 2),
    "log2 and log10": (lambda x: x * (math.log2(_width(x)) - math.log10(_width(x) * 3)), 2),
    "math.exp": (lambda x: x * math.exp(-_width(x) / 8) + math.expm1(_width(x) * 0.25), 2),
    "math.log1p": (lambda x: x * math.log1p(_width(x) / 16), 2),
    "log of a root": (lambda x: x * math.log(math.sqrt(_width(x)) + 1), 2),
    "floor T / 3": (lambda x: x[:, : math.floor(_width(x) / 3)] * 2, 2),
    "ceil T / 3": (lambda x: x[:, : math.ceil(_width(x) / 3)] * 2, 2),
    "round T / 3": (lambda x: x[:, : round(_width(x) / 3)] * 2, 2),
    # ties (odd T) round to even: (T + 1) // 2 for even T, 2 * ((T + 2) // 4) for odd T
    "round T * 0.5": (lambda x: x[:, : round(_width(x) * 0.5)] * 2, 3),
    # int() of the program's module is T * 1 // 2 (``core.lang.program_builtins``: this module only
    # calls ``int``), symbolic with ``T >= 0`` guarded
    "int(T * 0.5)": (lambda x: x[:, : int(_width(x) * 0.5)] * 2, 2),
    "int of a negative float": (lambda x: x * int(1 - _width(x) / 4), 4),  # towards 0: 0, 0, 0, -1, -2
    # a plain float is needed (this module reads the class ``float``: ``isinstance(s, float)``, so
    # ``program_builtins`` leaves its ``float`` the builtin): a compile per size
    "float(T)": (lambda x: x * float(_width(x)), len(SIZES)),
    "round T * 0.9": (lambda x: x[:, : round(_width(x) * 0.9)] * 2, len(SIZES)),  # 0.9 rounds T * 0.9
    "numpy.sqrt": (lambda x: x / numpy.sqrt(_width(x)), len(SIZES)),
    "exp of a log": (lambda x: x * math.exp(math.log(_width(x)) / 2), len(SIZES)),  # (no bound on the log)
}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_functions_of_math_and_roundings_of_floats_of_sizes(name):
    fn, compiles = FUNCTIONS[name]
    jf = thunder_rs.jit(fn)
    for T in SIZES:
        x = _inputs(torch.float64, T)
        expected, actual = fn(x), jf(x)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        assert actual.shape == expected.shape
    assert thunder_rs.compile_stats(jf).cache_misses == compiles, thunder_rs.compile_stats(jf).miss_reasons


def test_the_trace_calls_math_on_the_size():
    jf = thunder_rs.jit(FUNCTIONS["math.log of a base"][0])
    for T in SIZES[:2]:
        jf(_inputs(torch.float64, T))
    source = str(thunder_rs.last_traces(jf)[-1])
    assert "(math.log(t0) / 0.6931471805599453)" in source and "(2.302585092994046 / math.log(t0))" in source, source


def _outcome(fn, x):
    """``fn(x)``, or the type of the error it raised, from the program's own line (not from
    the compiled program, which an unguarded float would reach with a size out of the domain)."""
    try:
        return fn(x)
    except (ValueError, OverflowError, ZeroDivisionError) as e:
        files = [frame.filename for frame in traceback.extract_tb(e.__traceback__)]
        assert __file__ in files and not any(f.startswith("<thunder_rs") for f in files), files
        return type(e)


#: name -> (program, sizes up to and across its domain's edge): a function of a float of sizes is
#: guarded to stay in its domain, so a size beyond it is traced again and gets eager's error there
#: (a trace that raised is no compile: two, the first call's and the symbolic one).
EDGES = {
    "sqrt(T - 8)": (lambda x: x * math.sqrt(_width(x) - 8), (10, 11, 8, 9, 7, 12, 6)),  # T >= 8
    "log(T - 8)": (lambda x: x * math.log(_width(x) - 8), (10, 11, 9, 8, 12, 7)),  # T > 8
    "log(T / 4 - 2)": (lambda x: x * math.log(_width(x) / 4 - 2), (12, 13, 9, 8, 16)),  # T > 8
    "exp(T * 100.0)": (lambda x: x * math.exp(_width(x) * 100.0), (5, 6, 7, 8, 6)),  # T <= 7
    "log base T - 4": (lambda x: x * math.log(8, _width(x) - 4), (7, 8, 5, 6)),  # T - 4 != 1
    "1.0 / (T - 5)": (lambda x: x * (1.0 / (_width(x) - 5)), (7, 8, 5, 6, 4)),  # T != 5
    "T / (T / 2 - 2.5)": (lambda x: x * (_width(x) / (_width(x) / 2 - 2.5)), (7, 8, 5, 9, 4)),
    "(T - 5) ** -1": (lambda x: x * (_width(x) - 5) ** -1, (7, 8, 5, 6)),
    "(T - 5) ** -0.5": (lambda x: x * (_width(x) - 5) ** -0.5, (7, 8, 5, 6)),
}


@pytest.mark.parametrize("name", EDGES)
def test_functions_of_math_at_the_edges_of_their_domains(name):
    fn, sizes = EDGES[name]
    jf = thunder_rs.jit(fn)
    for T in sizes:
        x = _inputs(torch.float64, T)
        expected, actual = _outcome(fn, x), _outcome(jf, x)
        if isinstance(expected, type):
            assert actual is expected, (T, actual)
        else:
            torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses == 2, thunder_rs.compile_stats(jf).miss_reasons


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x * (1.0 / _width(x)),
        lambda x: x * (_width(x) / (_width(x) - 1)),
        lambda x: x * _width(x) ** -0.5 / math.sqrt(_width(x) + 1),
        lambda x: x * (_width(x) // 2) * (1 / (_width(x) * 0.5)),
    ],
    ids=["1 / T", "T / (T - 1)", "T ** -0.5 / sqrt(T + 1)", "T // 2 / (T * 0.5)"],
)
def test_a_divisor_of_sizes_their_bounds_keep_nonzero_needs_no_guard(fn):
    jf = thunder_rs.jit(fn)
    for T in SIZES:
        x = _inputs(torch.float64, T)
        torch.testing.assert_close(jf(x), fn(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses == 2, thunder_rs.compile_stats(jf).miss_reasons
    assert "guard" not in str(thunder_rs.last_traces(jf)[-1])


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x + 1 if math.sqrt(_width(x)) >= 3 else x - 1,  # 9 is the edge
        lambda x: x + 1 if math.log2(_width(x)) > 3 else x - 1,  # 8
        lambda x: x[:, : round(_width(x) * 0.5)] + 1,  # ties at odd T
        lambda x: x[:, : math.ceil(_width(x) / 4)] + 1,  # 8 is a multiple of 4
        lambda x: x[:, : int(_width(x) / 4 - 1.5)] + 1,  # 10 gives exactly 1.0
    ],
    ids=["sqrt >= 3", "log2 > 3", "round", "ceil", "int"],
)
def test_decisions_on_functions_of_sizes_at_their_boundary(fn):
    jf = thunder_rs.jit(fn)
    for T in (7, 8, 9, 10, 8, 9):
        x = _inputs(torch.float64, T)
        expected, actual = fn(x), jf(x)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        assert actual.shape == expected.shape


#: Draws whose parameters are floats of sizes: the fallback calls eager's sampler with the float
#: computed on each call (one compile), drawing the same numbers.
DRAWS = {
    "bernoulli_": lambda x: x * torch.empty_like(x).bernoulli_(1 - 1 / _width(x)) / (1 - 1 / _width(x)),
    "uniform_": lambda x: x + torch.empty_like(x).uniform_(-1 / _width(x), _width(x) ** -0.5),
    "normal_": lambda x: x + torch.empty_like(x).normal_(1 / _width(x), math.sqrt(_width(x))),
}


@pytest.mark.parametrize("name", DRAWS)
def test_draws_with_floats_of_sizes(name):
    def fn(x):
        torch.manual_seed(0)
        return DRAWS[name](x)

    _check(fn, torch.float64, grads=True)
    jf = thunder_rs.jit(fn)
    for T in SIZES:
        jf(_inputs(torch.float64, T))
    assert thunder_rs.compile_stats(jf).cache_misses == 2, thunder_rs.compile_stats(jf).miss_reasons
