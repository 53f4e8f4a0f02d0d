"""One tensor passed at several argument positions is one tensor to the trace, as in eager: programs
branch on ``query is key`` (``nn.MultiheadAttention``) and see a write through one place through the
other; an entry compiled for one sharing does not serve the other."""

import copy

import pytest
import torch
from torch import nn

import thunder_rs


def _identity_and_sum(a, b):
    return (a is b), a + b


def test_a_tensor_passed_twice_is_one_tensor_and_distinct_tensors_are_two():
    jf = thunder_rs.jit(_identity_and_sum)
    x, y = torch.randn(3), torch.randn(3)
    for a, b in ((x, x), (x, y), (y, y), (x, x.clone())):
        same, out = jf(a, b)
        eager_same, eager_out = _identity_and_sum(a, b)
        assert same == eager_same
        torch.testing.assert_close(out, eager_out, rtol=0, atol=0)
    assert thunder_rs.cache_misses(jf) == 2


def test_a_tensor_passed_twice_through_keywords_is_one_tensor():
    jf = thunder_rs.jit(_identity_and_sum)
    x = torch.randn(3)
    assert jf(x, b=x)[0] is True
    assert jf(x, b=x.clone())[0] is False


def _mha(training: bool):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True, dropout=0.0)
    return mha.train(training)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_multihead_self_attention_with_one_tensor_matches_eager(training):
    mha = _mha(training)
    eager = copy.deepcopy(mha)
    jm = thunder_rs.jit(mha)
    torch.manual_seed(1)
    x, k, v = torch.randn(2, 5, 8, requires_grad=True), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    for args in ((x, x, x), (x, k, v), (x, x, x), (x, k, k)):
        out, weights = jm(*args)
        expected, expected_weights = eager(*args)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        torch.testing.assert_close(weights, expected_weights, rtol=0, atol=0)
        (grad,) = torch.autograd.grad(out.sum(), x)
        (expected_grad,) = torch.autograd.grad(expected.sum(), x)
        torch.testing.assert_close(grad, expected_grad, rtol=0, atol=0)
    assert thunder_rs.cache_misses(jm) == 3
    reasons = thunder_rs.compile_stats(jm).miss_reasons
    assert "tensor arguments that are one tensor (key is query, value is query) -> none" in reasons[1]


def test_multihead_self_attention_fast_path_with_fully_masked_rows_matches_eager():
    mha = _mha(False)
    jm = thunder_rs.jit(mha)
    x, other = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1] = True
    with torch.no_grad():
        for args in ((x, x, x), (x, other, other), (x, x, x)):
            out = jm(*args, key_padding_mask=mask, need_weights=False)[0]
            expected = mha(*args, key_padding_mask=mask, need_weights=False)[0]
            # (eager's fused kernel rounds otherwise than the traced slow path: within float32's tolerance)
            torch.testing.assert_close(out, expected, equal_nan=True)


def _writes_then_reads(a, b):
    a.mul_(2)
    return b + 1


def test_a_tensor_passed_twice_and_written_through_one_place_matches_eager():
    jf = thunder_rs.jit(_writes_then_reads)
    for same in (True, False, True):
        x, eager_x = torch.ones(3), torch.ones(3)
        y, eager_y = (x, eager_x) if same else (torch.ones(3), torch.ones(3))
        torch.testing.assert_close(jf(x, y), _writes_then_reads(eager_x, eager_y), rtol=0, atol=0)
        torch.testing.assert_close(x, eager_x, rtol=0, atol=0)
    assert thunder_rs.cache_misses(jf) == 2


def _first_is_last(*tensors):
    return tensors[0] is tensors[-1], sum(tensors)


@pytest.mark.parametrize("count", [3, 9, 11])
def test_a_tensor_repeated_among_many_arguments_is_one_tensor(count):
    jf = thunder_rs.jit(_first_is_last)
    x = torch.randn(2)
    others = [torch.randn(2) for _ in range(count - 2)]
    for last in (x, torch.randn(2), x):
        same, out = jf(x, *others, last)
        assert same == (last is x)
        torch.testing.assert_close(out, _first_is_last(x, *others, last)[1], rtol=0, atol=0)
    assert thunder_rs.cache_misses(jf) == 2
