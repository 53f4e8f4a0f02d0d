"""The fused kernels of thunder_rs/torch/kernels.py: each symbol's decomposition computes what
the aten call the torch executor runs for it computes, with the same dtypes and shapes.

For each case the symbol is compiled twice: as is, the generated code makes the aten call (the
reference); with the torch executor's implementation removed, its decomposition runs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import thunder_rs
from thunder_rs.executors.extend import _bump
from thunder_rs.executors.torch_ex import torch_ex
from thunder_rs.torch import kernels

TOLERANCE = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-5),
             torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@contextlib.contextmanager
def decomposed(symbol):
    """The torch executor without its implementation of ``symbol``: the decomposition runs."""
    entry = torch_ex.implmap.pop(symbol.symbol_id)
    _bump()
    try:
        yield
    finally:
        torch_ex.implmap[symbol.symbol_id] = entry
        _bump()


def randn(*shape, dtype):
    return torch.randn(shape, dtype=torch.float64).to(dtype)


@dataclass
class Case:
    id: str
    symbol: object
    #: (tensor arguments, the rest of the call given them)
    inputs: Callable[[torch.dtype], tuple[tuple, Callable]]


def layer_norm_stats(dtype, params=True, mixed=False):
    x = randn(3, 4, 5, dtype=dtype)
    pdtype = torch.float32 if mixed else dtype
    w, b = (randn(4, 5, dtype=pdtype), randn(4, 5, dtype=pdtype)) if params else (None, None)
    out, mean, rstd = torch.native_layer_norm(x, (4, 5), w, b, 1e-5)
    return x, w, b, mean, rstd


def layer_norm_backward(mask, params=True, mixed=False):
    def inputs(dtype):
        x, w, b, mean, rstd = layer_norm_stats(dtype, params, mixed)
        g = randn(3, 4, 5, dtype=dtype)
        tensors = (g, x, mean, rstd) + ((w, b) if params else ())

        def call(g, x, mean, rstd, w=None, b=None):
            return kernels.native_layer_norm_backward(g, x, (4, 5), mean, rstd, w, b, mask)

        return tensors, call

    return inputs


def targets(n, classes=5, ignored=-100, all_ignored=False):
    t = torch.randint(0, classes, (n,))
    t[0] = ignored
    return torch.full((n,), ignored) if all_ignored else t


def nll(reduction: str, weighted=False, unbatched=False, all_ignored=False, backward=False):
    code = kernels.REDUCTIONS[reduction]

    def inputs(dtype):
        x = randn(5, dtype=dtype) if unbatched else randn(4, 5, dtype=dtype)
        t = torch.tensor(2) if unbatched else targets(4, all_ignored=all_ignored)
        w = torch.rand(5, dtype=torch.float64).to(dtype) + 0.1 if weighted else None
        if not backward:
            return (x, t, w), lambda x, t, w: kernels.nll_loss_forward(x, t, w, code, -100)
        out, total = torch.ops.aten.nll_loss_forward(x, t, w, code, -100)
        g = randn(*out.shape, dtype=dtype)
        return (g, x, t, w, total), lambda g, x, t, w, total: kernels.nll_loss_backward(g, x, t, w, code, -100, total)

    return inputs


def attention(causal: bool, backward=False, query_len=5, key_len=3, strided_value=False):
    def inputs(dtype):
        q, k = randn(2, 3, query_len, 8, dtype=dtype), randn(2, 3, key_len, 8, dtype=dtype)
        # A value whose last dim is not dense: torch 2.9's kernel needs it made so.
        v = randn(2, 3, 8, key_len, dtype=dtype).transpose(-1, -2) if strided_value else randn(2, 3, key_len, 8, dtype=dtype)
        if not backward:
            return (q, k, v), lambda q, k, v: kernels.sdpa_flash(q, k, v, causal, 0.3)
        out, lse = torch._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=0.3)
        g = randn(*out.shape, dtype=dtype)
        return (g, q, k, v, out, lse), lambda *a: kernels.sdpa_flash_backward(*a, causal, 0.3)

    return inputs


def softmax_backward(symbol, log: bool, dim: int):
    def inputs(dtype):
        x = randn(3, 4, 5, dtype=dtype)
        out = torch.log_softmax(x, dim) if log else torch.softmax(x, dim)
        return (randn(3, 4, 5, dtype=dtype), out), lambda g, out: symbol(g, out, dim)

    return inputs


def embedding(padding_idx: int, by_freq: bool):
    def inputs(dtype):
        indices = torch.tensor([[0, 2, 2], [5, 2, 0]])
        return (randn(2, 3, 4, dtype=dtype), indices), lambda g, i: kernels.embedding_backward(g, i, 6, padding_idx, by_freq)

    return inputs


CASES = [
    Case("native_layer_norm", kernels.native_layer_norm,
         lambda d: ((randn(3, 4, 5, dtype=d), randn(4, 5, dtype=d), randn(4, 5, dtype=d)),
                    lambda x, w, b: kernels.native_layer_norm(x, (4, 5), w, b, 1e-5))),
    Case("native_layer_norm_plain", kernels.native_layer_norm,
         lambda d: ((randn(3, 4, 5, dtype=d),), lambda x: kernels.native_layer_norm(x, (5,), None, None, 1e-2))),
    Case("native_layer_norm_backward", kernels.native_layer_norm_backward, layer_norm_backward([True, True, True])),
    Case("native_layer_norm_backward_input", kernels.native_layer_norm_backward,
         layer_norm_backward([True, False, False], params=False)),
    Case("native_layer_norm_backward_weight", kernels.native_layer_norm_backward, layer_norm_backward([False, True, False])),
    Case("native_dropout_backward", kernels.native_dropout_backward,
         lambda d: ((randn(3, 4, dtype=d), torch.rand(3, 4) < 0.7), lambda g, m: kernels.native_dropout_backward(g, m, 1 / 0.7))),
    Case("gelu_backward", kernels.gelu_backward,
         lambda d: ((randn(3, 4, dtype=d), randn(4, 3, dtype=d).t()), lambda g, x: kernels.gelu_backward(g, x))),
    Case("gelu_backward_tanh", kernels.gelu_backward,
         lambda d: ((randn(3, 4, dtype=d), randn(3, 4, dtype=d)), lambda g, x: kernels.gelu_backward(g, x, "tanh"))),
    Case("softmax_backward", kernels.softmax_backward, softmax_backward(kernels.softmax_backward, False, 1)),
    Case("log_softmax_backward", kernels.log_softmax_backward, softmax_backward(kernels.log_softmax_backward, True, -1)),
    Case("embedding_backward", kernels.embedding_backward, embedding(-1, False)),
    Case("embedding_backward_padding_by_freq", kernels.embedding_backward, embedding(2, True)),
    Case("nll_loss_forward_mean", kernels.nll_loss_forward, nll("mean", weighted=True)),
    Case("nll_loss_forward_none", kernels.nll_loss_forward, nll("none")),
    Case("nll_loss_forward_unbatched_sum", kernels.nll_loss_forward, nll("sum", unbatched=True)),
    Case("nll_loss_backward_mean", kernels.nll_loss_backward, nll("mean", weighted=True, backward=True)),
    Case("nll_loss_backward_all_ignored", kernels.nll_loss_backward, nll("mean", all_ignored=True, backward=True)),
    Case("nll_loss_backward_none", kernels.nll_loss_backward, nll("none", weighted=True, backward=True)),
    Case("nll_loss_backward_unbatched_sum", kernels.nll_loss_backward, nll("sum", unbatched=True, backward=True)),
    Case("sdpa_flash", kernels.sdpa_flash, attention(False)),
    Case("sdpa_flash_causal", kernels.sdpa_flash, attention(True)),
    Case("sdpa_flash_strided_value", kernels.sdpa_flash, attention(True, strided_value=True)),
    Case("sdpa_flash_backward", kernels.sdpa_flash_backward, attention(False, backward=True)),
    Case("sdpa_flash_backward_strided_value", kernels.sdpa_flash_backward, attention(False, True, strided_value=True)),
    Case("sdpa_flash_backward_causal", kernels.sdpa_flash_backward, attention(True, backward=True, query_len=3, key_len=5)),
]


def as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def assert_same(actual, expected, dtype):
    actual, expected = as_tuple(actual), as_tuple(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert (a.dtype, a.shape) == (e.dtype, e.shape)
        torch.testing.assert_close(a, e, **TOLERANCE[dtype], equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decomposition_and_kernel_match_aten(case: Case, dtype: torch.dtype):
    torch.manual_seed(0)
    tensors, call = case.inputs(dtype)
    present = [t for t in tensors if t is not None]

    def bind(*args):
        it = iter(args)
        return [next(it) if t is not None else None for t in tensors]

    kernel_call = f"torch_{case.symbol.symbol_name.removeprefix('ltorch.')}("
    jkernel = thunder_rs.jit(lambda *a: call(*bind(*a)))
    expected = jkernel(*present)
    assert kernel_call in str(thunder_rs.last_traces(jkernel)[-1])
    with decomposed(case.symbol):
        jdecomposed = thunder_rs.jit(lambda *a: call(*bind(*a)))
        actual = jdecomposed(*present)
    assert kernel_call not in str(thunder_rs.last_traces(jdecomposed)[-1])
    assert_same(actual, expected, dtype)


def test_layer_norm_statistics_of_mixed_precision_have_the_parameters_dtype():
    x, w, b, mean, rstd = layer_norm_stats(torch.bfloat16, mixed=True)
    out = thunder_rs.jit(lambda x, w, b: kernels.native_layer_norm(x, (4, 5), w, b, 1e-5))(x, w, b)
    with decomposed(kernels.native_layer_norm):
        decomposed_out = thunder_rs.jit(lambda x, w, b: kernels.native_layer_norm(x, (4, 5), w, b, 1e-5))(x, w, b)
    assert [t.dtype for t in out] == [t.dtype for t in decomposed_out] == [torch.bfloat16, torch.float32, torch.float32]
    torch.testing.assert_close(out[1:], decomposed_out[1:])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_native_dropout_keeps_what_its_mask_says_in_both_forms(dtype: torch.dtype):
    # Masks are random, so the two forms are compared by what they promise: a bool mask keeping
    # about 1 - p of the elements, and the kept ones scaled by 1 / (1 - p).
    torch.manual_seed(0)
    x, p = torch.rand(64, 64, dtype=torch.float64).to(dtype) + 1, 0.25
    jkernel = thunder_rs.jit(lambda x: kernels.native_dropout(x, p, True))
    forms = [jkernel(x)]
    assert "torch_native_dropout(" in str(thunder_rs.last_traces(jkernel)[-1])
    with decomposed(kernels.native_dropout):
        jdecomposed = thunder_rs.jit(lambda x: kernels.native_dropout(x, p, True))
        forms.append(jdecomposed(x))
    assert "torch_native_dropout(" not in str(thunder_rs.last_traces(jdecomposed)[-1])
    for out, mask in forms:
        assert (out.dtype, mask.dtype, out.shape) == (dtype, torch.bool, x.shape)
        assert abs(mask.double().mean().item() - (1 - p)) < 0.03
        torch.testing.assert_close(out, x * mask * (1 / (1 - p)), **TOLERANCE[dtype])
