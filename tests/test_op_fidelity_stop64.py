"""Op fidelity, stop 64 (the OpInfo sweep's fourth round of leftovers): what
``benchmarks/op_fidelity.py`` and its leftovers found different from eager
(benchmarks/results/op_fidelity_stop64.md).

- A Python int number argument no Scalar of eager's holds (below int64, past uint64) raises eager's
  ``OverflowError`` whatever the tensor's dtype: an integer or bool tensor's traced op took it as an
  unknown constant (``TypeError: unsupported operand``, ``got PyConst(1)``) and ``x == 2**70``
  answered ``False``. One past int64 but within uint64 (eager's uint64 Scalar) with a bool tensor
  raises eager's promotion error, with an integer tensor a refusal naming the op and the line
  (eager's kernels wrap it, each its own way), a floating one computes as eager's.
"""

from __future__ import annotations

import pytest
import torch

import thunder_rs

#: Programs taking one Python int ``v`` as a number argument of a tensor op.
SCALAR_PROGRAMS = {
    "mul": lambda x, v: x * v,
    "rmul": lambda x, v: v * x,
    "add": lambda x, v: x + v,
    "div": lambda x, v: x / v,
    "floor_divide": lambda x, v: x // v,
    "pow": lambda x, v: x**v,
    "rpow": lambda x, v: v**x,
    "clamp": lambda x, v: x.clamp(max=v),
    "eq": lambda x, v: x == v,
    "remainder": lambda x, v: x % v,
    "fmod": lambda x, v: torch.fmod(x, v),
    "add_alpha": lambda x, v: torch.add(x, x, alpha=v),
    "mul_": lambda x, v: x.clone().mul_(v),
    "fill_": lambda x, v: x.clone().fill_(v),
    "full_like": lambda x, v: torch.full_like(x, v),
    "where": lambda x, v: torch.where(torch.ones(x.shape, dtype=torch.bool), x, v),
    "masked_fill": lambda x, v: x.masked_fill(torch.ones(x.shape, dtype=torch.bool), v),
}
TENSORS = {
    "int64": torch.arange(3),
    "uint8": torch.arange(3, dtype=torch.uint8),
    "bool": torch.tensor([True, False, True]),
    "float32": torch.tensor([0.5, -1.0, 2.0]),
    "complex64": torch.tensor([0.5 + 1j, -1.0, 2j]),
}


def _raised(fn, *args) -> BaseException | None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        return e
    return None


@pytest.mark.parametrize("value", [2**70, 2**64, -(2**63) - 1, -(2**70)], ids=str)
@pytest.mark.parametrize("kind", TENSORS)
@pytest.mark.parametrize("name", SCALAR_PROGRAMS)
def test_an_int_no_scalar_holds_raises_eagers_overflow_error(name, kind, value):
    program, x = SCALAR_PROGRAMS[name], TENSORS[kind]
    expected = _raised(program, x, value)
    assert isinstance(expected, OverflowError)
    with pytest.raises(OverflowError) as raised:
        thunder_rs.jit(program)(x, value)
    assert str(expected) in str(raised.value)


@pytest.mark.parametrize("value", [2**63, 2**64 - 1], ids=str)
@pytest.mark.parametrize("name", ["mul", "add", "eq", "clamp", "mul_"])
def test_a_uint64_scalar_with_a_bool_tensor_raises_eagers_promotion_error(name, value):
    program, x = SCALAR_PROGRAMS[name], TENSORS["bool"]
    expected = _raised(program, x, value)
    assert isinstance(expected, RuntimeError)
    with pytest.raises(RuntimeError) as raised:
        thunder_rs.jit(program)(x, value)
    assert str(expected) in str(raised.value)


@pytest.mark.parametrize("value", [2**63, 2**64 - 1], ids=str)
@pytest.mark.parametrize("kind", ["int64", "uint8"])
@pytest.mark.parametrize("name", ["mul", "add", "eq", "clamp", "mul_", "pow"])
def test_a_uint64_scalar_with_an_integer_tensor_is_refused_naming_the_op_and_line(name, kind, value):
    # Eager wraps it (``arange(3) * 2**63`` is ``[0, -2**63, 0]``) or raises (``pow``): a refusal,
    # a RuntimeError as eager's are, naming the op and this file's line.
    program, x = SCALAR_PROGRAMS[name], TENSORS[kind]
    with pytest.raises(RuntimeError, match="past int64") as raised:
        thunder_rs.jit(program)(x, value)
    assert __file__ in str(raised.value)
    assert f"ltorch.{name.rstrip('_')}" in str(raised.value)


@pytest.mark.parametrize("value", [2**63, 2**64 - 1, -(2**63)], ids=str)
@pytest.mark.parametrize("kind", ["float32", "complex64"])
@pytest.mark.parametrize("name", ["mul", "add", "div", "eq", "mul_", "fill_", "full_like", "where"])
def test_an_int_past_int64_with_a_floating_tensor_computes_as_eager(name, kind, value):
    program, x = SCALAR_PROGRAMS[name], TENSORS[kind]
    expected, actual = program(x, value), thunder_rs.jit(program)(x, value)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)
