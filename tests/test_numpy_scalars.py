"""NumPy scalars as arguments of a jitted function, against eager: torch reads one where it takes
a number as the Python number of its value (``core.lang.numpy_scalars``), so results and dtypes
match eager's (``bf16 * np.float32(0.5)`` stays bfloat16, ``int32 * np.float16(2)`` is float32),
and a call is keyed by the scalar's type and value: a new object of a value seen before hits. An
``np.float64`` seen to change is a float input, as a Python float is: two compiles for every value.
"""

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import thunder_rs

SCALARS = (np.float64(0.5), np.float32(0.25), np.float16(1.5), np.int64(3), np.int32(2), np.uint8(4), np.bool_(True))

PROGRAMS = {
    "torch.mul": lambda x, s: torch.mul(x, s),
    "x * s": lambda x, s: x * s,
    "s * x": lambda x, s: s * x,
    "x + s": lambda x, s: x + s,
    "full": lambda x, s: torch.full((2,), s) + x[:2],
    "add alpha": lambda x, s: x.add(x.flip(0), alpha=s),
    "clamp": lambda x, s: x.clamp(max=s),
    "mul_": lambda x, s: x.clone().mul_(s),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_numpy_scalar_values_and_dtypes(name, dtype):
    fn = PROGRAMS[name]
    x = (torch.randn(4) * 4).to(dtype)
    for s in SCALARS:
        try:
            expected = fn(x, s)
        except Exception as e:
            with pytest.raises(type(e)):
                thunder_rs.jit(fn)(x, s)
            continue
        got = thunder_rs.jit(fn)(x, s)
        assert got.dtype == expected.dtype, (type(s), got.dtype, expected.dtype)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_numpy_scalar_sizes():
    x = torch.randn(6)
    fn = lambda x: x.view(np.int64(2), -1).sum(np.int32(1))  # noqa: E731
    torch.testing.assert_close(thunder_rs.jit(fn)(x), fn(x), rtol=0, atol=0)
    g = lambda x: x.reshape((np.int64(3), np.int64(2))) * 2  # noqa: E731
    torch.testing.assert_close(thunder_rs.jit(g)(x), g(x), rtol=0, atol=0)


def test_numpy_scalar_tensor_keeps_its_dtype():
    fn = lambda x, s: torch.tensor(s) + x  # noqa: E731
    x = torch.ones(2, dtype=torch.float16)
    for s in (np.float64(0.5), np.float32(0.5), np.int64(2)):
        expected = fn(x, s)
        got = thunder_rs.jit(fn)(x, s)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_numpy_scalar_dropout_p():
    x = torch.ones(1000)
    fn = lambda x, p: F.dropout(x, p=p, training=False) * 2  # noqa: E731
    jfn = thunder_rs.jit(fn)
    torch.testing.assert_close(jfn(x, np.float64(0.1)), fn(x, np.float64(0.1)), rtol=0, atol=0)


@pytest.mark.parametrize("kind", [np.float32, np.float16, np.int64])
def test_numpy_scalar_keyed_by_type_and_value(kind):
    x = torch.randn(4)
    jfn = thunder_rs.jit(lambda x, s: x * s)
    for _ in range(3):  # a new object each call, of the same value: one compile
        torch.testing.assert_close(jfn(x, kind(3)), x * kind(3), rtol=0, atol=0)
    assert thunder_rs.cache_misses(jfn) == 1
    torch.testing.assert_close(jfn(x, kind(5)), x * kind(5), rtol=0, atol=0)
    assert thunder_rs.cache_misses(jfn) == 2
    torch.testing.assert_close(jfn(x, kind(3)), x * kind(3), rtol=0, atol=0)
    assert thunder_rs.cache_misses(jfn) == 2
    jfn(x, 3.0 if kind is not np.int64 else 3)  # a Python number of the same value is another key
    assert thunder_rs.cache_misses(jfn) == 3


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = np.float32(0.5)

    def forward(self, x):
        return x * (self.scale * np.float32(3))  # NumPy's float32 product, as eager computes it


def test_numpy_scalar_module_attribute():
    m = _Scaled()
    jm = thunder_rs.jit(m)
    x = torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(jm(x), m(x), rtol=0, atol=0)
    m.scale = np.float32(0.5)  # a new object of the same value: the same entry
    torch.testing.assert_close(jm(x), m(x), rtol=0, atol=0)
    assert thunder_rs.cache_misses(jm) == 1
    m.scale = np.float32(0.1)
    torch.testing.assert_close(jm(x), m(x), rtol=0, atol=0)
    assert thunder_rs.cache_misses(jm) == 2


MORE = {
    "where": lambda x: torch.where(x > 0, x, np.float32(1)),
    "new_full": lambda x: x.new_full((2,), np.float16(2)),
    "pow": lambda x: torch.pow(x, np.int64(2)),
    "masked_fill": lambda x: x.masked_fill(x > 0, np.float64(3)),
    "linspace": lambda x: torch.linspace(0, np.float32(1), np.int64(5)) + x[:5],
    "index": lambda x: x.reshape(np.int64(10), -1)[:, np.int64(2)],
}


@pytest.mark.parametrize("name", list(MORE))
def test_numpy_scalars_in_other_calls(name):
    x = torch.randn(100)
    fn = MORE[name]
    got, expected = thunder_rs.jit(fn)(x), fn(x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


FLOAT64_PROGRAMS = {
    "arithmetic": lambda x, s: x * s + s**2 - x / (1 - s),
    "bfloat16 stays": lambda x, s: x.bfloat16() * s + s * x.bfloat16(),
    "full": lambda x, s: torch.full((4,), s) + x,
    "alpha": lambda x, s: x.add(x.flip(0), alpha=-s),
    "math": lambda x, s: x * math.sqrt(s) + math.log(s),
    "its class": lambda x, s: x * 2 if isinstance(s, np.floating) and s.__class__ is np.float64 else x,
    "tensor of it": lambda x, s: torch.tensor(s) + x,
    "negated": lambda x, s: x.clamp(min=-s, max=s),
}


@pytest.mark.parametrize("name", list(FLOAT64_PROGRAMS))
def test_a_changing_numpy_float64_is_a_float_input_as_a_python_float(name):
    # Keyed by value, each np.float64 compiled again (5 compiles here); as a float input, two.
    fn = FLOAT64_PROGRAMS[name]
    jfn, x = thunder_rs.jit(fn), torch.randn(4)
    for value in (0.25, 0.5, 0.75, 2.0, 0.3):
        got, expected = jfn(x, np.float64(value)), fn(x, np.float64(value))
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert thunder_rs.cache_misses(jfn) == 2, thunder_rs.compile_stats(jfn).miss_reasons
    assert "compiled with symbolic floats s" in thunder_rs.compile_stats(jfn).miss_reasons[1]


NUMPY_SEMANTICS = {
    "divided by zero": lambda x, s: x * (1 / s),  # inf (a RuntimeWarning), not ZeroDivisionError
    "overflowing": lambda x, s: x * (s * 1e308),
    "fractional power of a negative": lambda x, s: x * (s**0.5),  # nan, not complex
    "item": lambda x, s: x * s.item(),
    "floor division": lambda x, s: x * (s // 0.25),
    "repr": lambda x, s: (x * s, repr(s), f"{s}"),
}


@pytest.mark.parametrize("name", list(NUMPY_SEMANTICS))
def test_a_numpy_float64_input_computes_as_numpy_does(name):
    fn = NUMPY_SEMANTICS[name]
    jfn, x = thunder_rs.jit(fn), torch.randn(4)
    for value in (0.5, 0.25, 0.0, -1.0, 10.0, 0.75):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got, expected = jfn(x, np.float64(value)), fn(x, np.float64(value))
        if type(expected) is tuple:  # (with NumPy's texts: "np.float64(0.5)")
            assert got[1:] == expected[1:]
            got, expected = got[0], expected[0]
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


def test_a_numpy_float64_and_a_python_float_are_keys_of_their_own():
    jfn, x = thunder_rs.jit(lambda x, s: x * s), torch.randn(4)
    for value in (0.25, 0.5, 0.75):
        jfn(x, np.float64(value))
    assert thunder_rs.cache_misses(jfn) == 2
    jfn(x, 0.75)  # a float where the entry takes a np.float64: another key, symbolic at once
    jfn(x, 0.5)
    jfn(x, np.float64(0.1))
    stats = thunder_rs.compile_stats(jfn)
    assert stats.cache_misses == 3, stats.miss_reasons
    assert stats.miss_reasons[2].startswith("s: a float64 input -> a float input; compiled with symbolic floats s")


@pytest.mark.parametrize("kind", [np.float64, np.float32, np.int64, np.bool_])
def test_a_returned_numpy_scalar_is_the_scalar(kind):
    # The trace returned its value as a constant of Python's type (a float for np.float64).
    fns = {
        "in a tuple": lambda x, s: (x * 2, s),
        "in a list": lambda x, s: [x * 2, s],
        "alone": lambda x, s: s,
    }
    for fn in fns.values():
        jfn = thunder_rs.jit(fn)
        for value in (1, 2, 3):
            s = kind(value)
            got, expected = jfn(torch.ones(2), s), fn(torch.ones(2), s)
            got_s, expected_s = (got, expected) if type(expected) is kind else (got[1], expected[1])
            assert type(got_s) is type(expected_s) and got_s == expected_s


NARROW_READ_BY_TORCH = {
    "product": lambda x, s: x * s + s,
    "bfloat16 stays": lambda x, s: x.bfloat16() * s + s * x.bfloat16(),
    "double": lambda x, s: x.double() / s,
    "full": lambda x, s: torch.full((4,), s) + x,
    "where": lambda x, s: torch.where(x > 0, x, s),
    "alpha": lambda x, s: torch.add(x, x.flip(0), alpha=s),
}


@pytest.mark.parametrize("kind", [np.float32, np.float16])
@pytest.mark.parametrize("name", list(NARROW_READ_BY_TORCH))
def test_a_changing_numpy_float32_or_float16_that_torch_reads_is_a_float_input(name, kind):
    # Keyed by value, each np.float32 or np.float16 compiled again (5 compiles here); torch reads it
    # as the float it is, so the trace takes it as a float input: two.
    fn = NARROW_READ_BY_TORCH[name]
    jfn, x = thunder_rs.jit(fn), torch.randn(4)
    for value in (0.1, 0.25, 0.3, 2.0, 0.7):
        got, expected = jfn(x, kind(value)), fn(x, kind(value))
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert thunder_rs.cache_misses(jfn) == 2, thunder_rs.compile_stats(jfn).miss_reasons


NARROW_SEMANTICS = {
    "product": lambda x, s: x * (s * 3),  # NumPy's float32 product, rounded: not the double one
    "compared": lambda x, s: x * 2 if s == 0.1 else x,  # True for np.float32(0.1): compared in float32
    "sum": lambda x, s: x + (s + 0.2),
    "negated": lambda x, s: x.clamp(min=-s, max=s),
    "its class": lambda x, s: (x * 2, type(s * 1).__name__, s.dtype.name, repr(s)),
}


@pytest.mark.parametrize("kind", [np.float32, np.float16])
@pytest.mark.parametrize("name", list(NARROW_SEMANTICS))
def test_a_numpy_float32_or_float16_input_computes_as_numpy_does(name, kind):
    fn = NARROW_SEMANTICS[name]
    jfn, x = thunder_rs.jit(fn), torch.randn(4)
    for value in (0.1, 0.25, 0.1, 0.3, 0.7):
        got, expected = jfn(x, kind(value)), fn(x, kind(value))
        if type(expected) is tuple:
            assert got[1:] == expected[1:]
            got, expected = got[0], expected[0]
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
