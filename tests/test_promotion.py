"""Type promotion follows torch's own rules: every dtype pair in every tier, and n-ary mixes."""

import itertools
import random

import pytest
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

import thunder_rs
from thunder_rs.core.base import dtypes
from thunder_rs.errors import ThunderNotImplementedError

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]
NUMBERS = [True, 2, 2.5, 2 + 1j]


@pytest.mark.parametrize("ranks", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_tensor_pairs_promote_as_torch(ranks):
    for a, b in itertools.product(DTYPES, DTYPES):
        x, y = torch.zeros((2,) * ranks[0], dtype=a), torch.zeros((2,) * ranks[1], dtype=b)
        assert dtypes.result_type(x, y) == torch.result_type(x, y), (a, b, ranks)


@pytest.mark.parametrize("default", [torch.float32, torch.float64])
def test_tensor_and_number_promote_as_torch(default):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        for a, number, rank in itertools.product(DTYPES, NUMBERS, (0, 1)):
            x = torch.zeros((2,) * rank, dtype=a)
            assert dtypes.result_type(x, number) == torch.result_type(x, number), (a, number, rank)
        assert dtypes.result_type(1, 2.5) == default
    finally:
        torch.set_default_dtype(previous)


def test_many_operands_promote_as_torch():
    rng = random.Random(0)
    checked = 0
    for _ in range(2000):
        operands = [
            torch.zeros((2,) * rng.randint(0, 1), dtype=rng.choice(DTYPES))
            if rng.random() < 0.6
            else rng.choice(NUMBERS)
            for _ in range(rng.randint(2, 4))
        ]
        if not any(isinstance(o, torch.Tensor) for o in operands):
            continue
        expected = elementwise_dtypes(*operands, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]
        assert dtypes.result_type(*operands) == expected, operands
        checked += 1
    assert checked > 1000


@pytest.mark.parametrize(
    "dim_dtype,zero_dtype",
    [(torch.float64, torch.complex64), (torch.float32, torch.complex128), (torch.int32, torch.complex64)],
)
def test_complex_zero_dim_operand_keeps_the_tensor_precision(dim_dtype, zero_dtype):
    """A float64 tensor times a complex64 scalar tensor is complex128 in torch (not complex64)."""
    x = torch.arange(6, dtype=dim_dtype).reshape(2, 3)
    s = torch.tensor(1.5 - 0.5j, dtype=zero_dtype)
    fn = thunder_rs.jit(lambda a, b: a * b + b)
    out = fn(x, s)
    expected = x * s + s
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected)


def test_promotion_to_an_unsupported_dtype_raises_naming_the_op():
    """float16 with a complex number is complex32 in torch, which thunder_rs cannot represent."""
    fn = thunder_rs.jit(lambda a: a + 1j)
    with pytest.raises(ThunderNotImplementedError, match=r"add: .*complex32"):
        fn(torch.ones(2, dtype=torch.float16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32])
def test_a_promotion_first_met_while_tracing_works(dtype):
    """Torch combines the tiers on meta tensors, which tracing must not take for the program's
    calls: with the cache empty, the first compile met the combination inside the trace."""
    dtypes._combine.cache_clear()
    x = torch.arange(-3, 3).to(dtype)
    fn = thunder_rs.jit(lambda x: torch.where(x > 0, 0.5, x) * 2 + 1.0)
    torch.testing.assert_close(fn(x), torch.where(x > 0, 0.5, x) * 2 + 1.0)


@pytest.mark.parametrize(
    "fill",
    [
        lambda x: x.masked_fill(x > 0, float("-inf")),
        lambda x: x.clone().fill_(float("nan")),
        lambda x: torch.full_like(x, float("inf")),
        lambda x: x.clone().__setitem__(0, float("nan")),
    ],
    ids=["masked_fill", "fill_", "full_like", "setitem"],
)
def test_non_finite_values_into_integer_tensors_raise_eagers_error(fill):
    x = torch.arange(3)
    with pytest.raises(RuntimeError, match="cannot be converted to type"):
        fill(x)
    with pytest.raises(RuntimeError, match="cannot be converted to type"):
        thunder_rs.jit(fill)(x)
