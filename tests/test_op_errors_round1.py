"""PyTorch's own error inputs (op_db's ``error_inputs``) that ``benchmarks/op_fidelity.py --errors``
found compiled differently from eager: each must raise eager's exception type, with a message that
eager's ``error_regex`` matches or that names the op (``ThunderError``: thunder_rs's own check).

Round 1: ``out=`` arguments eager's kernels refuse, where the trace wrote a result
(``thunder_rs.torch.out_checks``): an ``out`` of another dtype than a reduction's, ``gather``'s,
``torch.complex``'s or ``torch.multinomial``'s result; ``torch.cat`` into one of its inputs;
``torch.aminmax`` with one tensor for ``min`` and ``max``. And eager's exception types: a
convolution's negative padding or non-positive stride or dilation (RuntimeError), an adaptive
pool's listed ``output_size`` of as many sizes as the input has dims (ValueError), ``narrow``'s
``start`` tensor of more than 0 dims, ``narrow_copy``'s dim past the last, ``gradient``'s spacing
on another device (RuntimeError).
"""

from __future__ import annotations

import re

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderError

#: (op_db name, index of the error input): the inputs fixed, which each gave a result before
SILENT = [
    ("amax", 6),
    ("amin", 6),
    ("aminmax", 3),
    ("aminmax", 4),
    ("gather", 1),
    ("complex", 2),
    ("multinomial", 2),
    ("cat", 7),
]
#: the inputs fixed that raised another exception type than eager's before
OTHER_TYPE = [
    *[(f"nn.functional.conv{n}d", i) for n in (1, 2, 3) for i in (2, 3, 4)],
    *[(f"nn.functional.adaptive_{kind}_pool{n}d", 0) for kind in ("avg", "max") for n in (2, 3)],
    ("narrow", 7),
    ("narrow_copy", 1),
    *[("gradient", i) for i in (3, 10, 17)],
]
FIXED = SILENT + OTHER_TYPE


def _error_input(name: str, index: int):
    from torch.testing._internal.common_methods_invocations import op_db

    (op,) = [op for op in op_db if op.name == name and not op.variant_test_name]
    torch.manual_seed(0)
    return op, list(op.error_inputs("cpu"))[index]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("name", "index"), FIXED, ids=[f"{n}-error{i}" for n, i in FIXED])
def test_error_input_raises_eagers_error(name: str, index: int) -> None:
    op, error = _error_input(name, index)
    sample = error.sample_input
    with pytest.raises(Exception) as eager:
        op.op(sample.input, *sample.args, **sample.kwargs)
    op, error = _error_input(name, index)  # (a fresh one: eager's call must not have changed it)
    sample = error.sample_input
    with pytest.raises(Exception) as compiled:
        thunder_rs.jit(lambda *a, **k: op.op(*a, **k))(sample.input, *sample.args, **sample.kwargs)
    assert isinstance(compiled.value, type(eager.value)), f"{compiled.value!r}; eager raised {eager.value!r}"
    assert isinstance(compiled.value, ThunderError), repr(compiled.value)
    text = str(compiled.value)
    assert re.search(error.error_regex, text) or name.split(".")[-1] in text, f"{text!r}; eager: {eager.value}"


def _jit_equal(fn, *args) -> None:
    """``fn(*args)`` (whose last argument is ``out``) compiled writes into ``out`` what eager does."""
    expected_out = args[-1].clone()
    expected = fn(*args[:-1], expected_out)
    actual_out = args[-1].clone()
    actual = thunder_rs.jit(fn)(*args[:-1], actual_out)
    assert torch.equal(actual_out, expected_out) and actual_out.dtype == expected_out.dtype
    assert actual is actual_out if expected is expected_out else torch.equal(actual, expected)


@pytest.mark.parametrize(
    "case",
    ["amax-same-dtype", "add-casts", "cat-apart", "complex-same-dtype", "aminmax-apart"],
)
def test_out_eager_takes_still_compiles(case: str) -> None:
    """The ``out=`` checks refuse only what eager refuses: an ``out`` eager writes is written."""
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    if case == "amax-same-dtype":
        _jit_equal(lambda x, out: torch.amax(x, 0, out=out), x, torch.empty(5))
    elif case == "add-casts":
        _jit_equal(lambda x, y, out: torch.add(x, y, out=out), x, y, torch.empty(4, 5, dtype=torch.float64))
    elif case == "cat-apart":
        _jit_equal(lambda x, y, out: torch.cat((x, y), out=out), x, y, torch.empty(8, 5))
    elif case == "complex-same-dtype":
        _jit_equal(lambda x, y, out: torch.complex(x, y, out=out), x, y, torch.empty(4, 5, dtype=torch.complex64))
    elif case == "aminmax-apart":
        low, high = torch.empty(5), torch.empty(5)
        expected = torch.aminmax(x, dim=0)
        thunder_rs.jit(lambda x, a, b: torch.aminmax(x, dim=0, out=(a, b)))(x, low, high)
        assert torch.equal(low, expected.min) and torch.equal(high, expected.max)


@pytest.mark.parametrize("name", ["sum", "nansum", "mean", "prod", "cumsum", "cumprod"])
def test_out_of_wider_dtype_computes_in_it(name: str) -> None:
    """``torch.sum(x, 0, out=double)`` of a float ``x`` sums in double, as eager's kernel does (it
    takes ``out``'s dtype for ``dtype``), not in float then cast."""
    fn = getattr(torch, name)
    x = torch.randn(1000, 37)
    shape = x.shape if name.startswith("cum") else x.shape[1:]
    _jit_equal(lambda x, out: fn(x, 0, out=out), x, torch.empty(shape, dtype=torch.float64))


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fn", [torch.std, torch.var, torch.logsumexp], ids=lambda f: f.__name__)
def test_out_of_another_float_dtype_computes_as_eagers_kernel(fn, out_dtype, keepdim) -> None:
    """``std``/``var`` read the input in ``out``'s dtype; ``logsumexp`` sums its shifted
    exponentials in it (``logsumexp_out_impl``): not the float result cast. Infinite maxima too."""
    inf = float("inf")
    for x in (torch.randn(5, 7), torch.tensor([[inf, 1.0], [-inf, 2.0], [-inf, -inf]])):
        shape = (x.shape[0], 1) if keepdim else (x.shape[0],)
        expected, got = torch.empty(shape, dtype=out_dtype), torch.empty(shape, dtype=out_dtype)
        fn(x, 1, keepdim=keepdim, out=expected)
        thunder_rs.jit(lambda x, out: fn(x, 1, keepdim=keepdim, out=out))(x, got)
        assert torch.equal(expected.nan_to_num(), got.nan_to_num()), (expected, got)


@pytest.mark.parametrize(
    "fn",
    [torch.softmax, torch.log_softmax, torch.linalg.vector_norm, torch.amax, torch.argmax],
    ids=lambda f: f.__name__,
)
def test_out_of_wider_dtype_refused_where_eager_refuses(fn) -> None:
    """Eager's structured kernels refuse an ``out`` of another dtype than their result's."""
    x = torch.randn(6, 5)
    shape = x.shape if "softmax" in fn.__name__ else x.shape[1:]
    dtype = torch.float64 if fn is not torch.argmax else torch.int32
    with pytest.raises(RuntimeError) as eager:
        fn(x, 0, out=torch.empty(shape, dtype=dtype))
    with pytest.raises(RuntimeError, match="dtype") as compiled:
        thunder_rs.jit(lambda x, out: fn(x, 0, out=out))(x, torch.empty(shape, dtype=dtype))
    assert isinstance(compiled.value, ThunderError) and isinstance(compiled.value, type(eager.value))
