"""The Inductor executor with float inputs (``executors.inductor_floats``): a region takes the
caller's float as an input of its graph, one compile for every value, bit-equal to eager where
Inductor's kernels are eager's (float32 elementwise ops); the Python arithmetic on the float is
computed outside the graph, in doubles, in the program's order. A half-precision region meeting a
float input runs as its eager torch calls (Inductor reads a symbolic number otherwise than eager)."""

import math
import warnings

import pytest
import torch

import thunder_rs

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

VALUES = (0.05, 0.15, 0.25, 1e-3, 3.7, -2.5, 0.1 + 0.2)


def _compiles():
    from thunder_rs.executors import inductor_ex

    return len(inductor_ex.stats().compile_s)


def test_an_inductor_region_takes_a_float_input_once_for_all_values():
    def fn(x, s):
        return (
            x * s + s,
            x - s,
            s - x,
            x / s,
            x * math.sqrt(s * s + 1.0),
            x - 1 / s,
            x * (s * 0.1 * 3.0),  # (as Python computes it: (s * 0.1) * 3.0, not s * 0.3)
            (x - s) * (s * 3 + 1) / (s - 7),
        )

    jfn = thunder_rs.jit(fn, executors=["inductor", "torch"])
    x = torch.randn(64, 33)
    jfn(x, 0.5)
    jfn(x, 0.75)  # the compile taking s as an input
    compiled = _compiles()
    for s in VALUES:
        for e, g in zip(fn(x, s), jfn(x, s)):
            assert torch.equal(e, g), s
    assert _compiles() == compiled
    assert thunder_rs.compile_stats(jfn).cache_misses == 2
    assert "inductor_fusion0(l_x, l_s)" in str(thunder_rs.last_traces(jfn)[-1])


def test_a_float_input_promotes_as_a_python_number():
    """The graph reads the float as a number: an int tensor times it is float32, as in eager (a 0-d
    double tensor operand would make it float64)."""
    jfn = thunder_rs.jit(lambda i, s: (i * s + s) / s, executors=["inductor", "torch"])
    i = torch.arange(12)
    for s in (0.5, 0.25, 1.5, -0.75, 0.3):
        e, g = (i * s + s) / s, jfn(i, s)
        assert g.dtype == torch.float32 and torch.equal(e, g), s
    assert "inductor_fusion0(l_i, l_s)" in str(thunder_rs.last_traces(jfn)[-1])


def test_a_half_precision_region_with_a_float_input_runs_eagerly():
    def fn(x, s):
        return x * s + s, s - x

    jfn = thunder_rs.jit(fn, executors=["inductor", "torch"])
    x = torch.randn(64, dtype=torch.bfloat16)
    jfn(x, 0.5)
    with pytest.warns(UserWarning, match="half-precision tensor with a float input"):
        jfn(x, 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s in VALUES:
            for e, g in zip(fn(x, s), jfn(x, s)):
                assert torch.equal(e, g), s


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, s: (x * math.exp(s)) * x,
        lambda x, s: (x * math.log(s)) * x,
        lambda x, s: (x * s**2.5) * x,
    ],
    ids=["exp", "log", "pow"],
)
def test_python_math_on_a_float_input_runs_the_regions_eager_calls(fn):
    """``math.exp(s)``, ``math.log(s)`` and ``s ** 2.5`` of a float input have no symbolic form that
    Inductor's graph computes from the float: the region runs its eager torch calls, with a warning
    saying why (it was Inductor's ``GuardOnDataDependentSymNode: ... zuf0``), bit-equal to eager."""
    jfn = thunder_rs.jit(fn, executors=["inductor", "torch"])
    x = torch.randn(64, 33)
    jfn(x, 0.5)
    with pytest.warns(UserWarning, match="computes on a float input with Python's math"):
        jfn(x, 0.75)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s in (0.05, 0.3, 1.7, 3.7):
            assert torch.equal(jfn(x, s), fn(x, s)), s
    assert thunder_rs.compile_stats(jfn).cache_misses == 2
