"""The fused kernels of eager's autograd that ltorch's families declare beside their ops
(``@torchsymbol(..., meta=...)``): each symbol's decomposition computes what
the aten call the torch executor runs for it computes, with the same dtypes and shapes.

For each case the symbol is compiled twice: as is, the generated code makes the aten call (the
reference); with the torch executor's implementation removed, its decomposition runs. A kernel
recorded whole (without its decomposition) has the outputs its decomposition records.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import thunder_rs
from thunder_rs import _core
from thunder_rs.core.lang import recorder
from thunder_rs.core.lang.recorder import input_proxy, recording
from thunder_rs.core.lang.executor_api import default_executors, whole_runners
from thunder_rs.executors.torch_ex import torch_ex
import thunder_rs.torch as ltorch
from thunder_rs.torch.base_losses import REDUCTIONS

TOLERANCE = {
    torch.float64: dict(rtol=1e-10, atol=1e-10),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
}


@contextlib.contextmanager
def decomposed(symbol):
    """The torch executor without its implementation of ``symbol``: the decomposition runs."""
    saved = torch_ex.registry.remove([symbol.symbol_id])
    try:
        yield
    finally:
        torch_ex.registry.register(*saved.values())


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
            return ltorch.native_layer_norm_backward(g, x, (4, 5), mean, rstd, w, b, mask)

        return tensors, call

    return inputs


def targets(n, classes=5, ignored=-100, all_ignored=False):
    t = torch.randint(0, classes, (n,))
    t[0] = ignored
    return torch.full((n,), ignored) if all_ignored else t


def multi_margin(reduction: str, p: int, weighted=False, shape=(4, 5)):
    """multi_margin_loss_backward's inputs (eager's CPU kernel has no bfloat16 form)."""
    code = REDUCTIONS[reduction]

    def inputs(dtype):
        if dtype == torch.bfloat16:
            pytest.skip("multi_margin_loss_backward has no bfloat16 kernel on the CPU")
        x = randn(*shape, dtype=dtype)
        rows = shape[0] if len(shape) == 2 else 1
        g = randn(rows, dtype=dtype) if code == REDUCTIONS["none"] and len(shape) == 2 else randn(dtype=dtype)
        t = torch.randint(0, shape[-1], (rows,))
        w = torch.rand(shape[-1], dtype=dtype) + 0.5 if weighted else None
        return (g, x, t, w), lambda g, x, t, w: ltorch.multi_margin_loss_backward(g, x, t, p, 0.7, w, code)

    return inputs


def cdist(p: float, backward=False):
    """``_cdist_forward``'s or ``_cdist_backward``'s inputs: x1 (2, 5, 3) and x2 (1, 4, 3), their
    batches broadcast, with a row of x2 equal to one of x1 (a zero distance)."""

    def inputs(dtype):
        if dtype == torch.bfloat16:
            pytest.skip("eager's CPU cdist kernels have no bfloat16 form")
        x1, x2 = randn(2, 5, 3, dtype=dtype), randn(1, 4, 3, dtype=dtype)
        x2[0, 1] = x1[1, 2]
        if not backward:
            return (x1, x2), lambda a, b: ltorch.cdist_forward(a, b, p, None)
        d = torch.ops.aten._cdist_forward(x1, x2, p, None)
        g = randn(*d.shape, dtype=dtype)
        return (g, x1, x2, d), lambda g, a, b, d: ltorch.cdist_backward(g, a, b, p, d)

    return inputs


def pdist_backward(p: float):
    """``_pdist_backward``'s inputs: five rows of 3, two of them equal (a zero distance)."""

    def inputs(dtype):
        if dtype == torch.bfloat16:
            pytest.skip("eager's CPU pdist kernels have no bfloat16 form")
        x = randn(5, 3, dtype=dtype)
        x[3] = x[1]
        d = torch.ops.aten._pdist_forward(x, p)
        g = randn(*d.shape, dtype=dtype)
        return (g, x, d), lambda g, x, d: ltorch.pdist_backward(g, x, p, d)

    return inputs


def grid_sampler(interpolation: int, padding: int, align_corners: bool):
    """aten's ``grid_sampler`` inputs, the grid a little past [-1, 1]. In bfloat16 the
    decomposition's rounded coordinates pick other pixels than eager's (test_nvfuser_opinfos.py)."""

    def inputs(dtype):
        if dtype == torch.bfloat16:
            pytest.skip("bfloat16 coordinates round to other pixels in the decomposition")
        x, grid = randn(2, 3, 5, 6, dtype=dtype), (torch.rand(2, 4, 7, 2, dtype=torch.float64) * 2.4 - 1.2).to(dtype)
        return (x, grid), lambda x, g: ltorch.grid_sampler(x, g, interpolation, padding, align_corners)

    return inputs


def nll(reduction: str, weighted=False, unbatched=False, all_ignored=False, backward=False):
    code = REDUCTIONS[reduction]

    def inputs(dtype):
        x = randn(5, dtype=dtype) if unbatched else randn(4, 5, dtype=dtype)
        t = torch.tensor(2) if unbatched else targets(4, all_ignored=all_ignored)
        w = torch.rand(5, dtype=torch.float64).to(dtype) + 0.1 if weighted else None
        if not backward:
            return (x, t, w), lambda x, t, w: ltorch.nll_loss_forward(x, t, w, code, -100)
        out, total = torch.ops.aten.nll_loss_forward(x, t, w, code, -100)
        g = randn(*out.shape, dtype=dtype)
        return (g, x, t, w, total), lambda g, x, t, w, total: ltorch.nll_loss_backward(g, x, t, w, code, -100, total)

    return inputs


def attention(causal: bool, backward=False, query_len=5, key_len=3, strided_value=False, masked=False, kv_heads=3):
    def inputs(dtype):
        q, k = randn(2, 3, query_len, 8, dtype=dtype), randn(2, kv_heads, key_len, 8, dtype=dtype)
        # A value whose last dim is not dense: torch 2.9's kernel needs it made so.
        v = (
            randn(2, kv_heads, 8, key_len, dtype=dtype).transpose(-1, -2)
            if strided_value
            else randn(2, kv_heads, key_len, 8, dtype=dtype)
        )
        if masked:  # (a row that sees no key: zeros)
            mask = randn(query_len, key_len, dtype=dtype)
            mask[1] = float("-inf")
        if not backward:
            if masked:
                return (q, k, v, mask), lambda q, k, v, m: ltorch.sdpa_flash(q, k, v, causal, 0.3, m)
            return (q, k, v), lambda q, k, v: ltorch.sdpa_flash(q, k, v, causal, 0.3)
        flash = torch._scaled_dot_product_flash_attention_for_cpu
        out, lse = flash(q, k, v, 0.0, causal, attn_mask=mask if masked else None, scale=0.3)
        g = randn(*out.shape, dtype=dtype)
        if masked:
            return (g, q, k, v, out, lse, mask), lambda *a: ltorch.sdpa_flash_backward(*a[:6], causal, 0.3, a[6])
        return (g, q, k, v, out, lse), lambda *a: ltorch.sdpa_flash_backward(*a, causal, 0.3)

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
        return (randn(2, 3, 4, dtype=dtype), indices), lambda g, i: ltorch.embedding_backward(
            g, i, 6, padding_idx, by_freq
        )

    return inputs


def embedding_bag_forward(mode: int, padding: int = -1, last: bool = False, weighted: bool = False):
    def inputs(dtype):
        indices = torch.tensor([1, 2, 1, 5, 1, 9, 2, 0, 3, 3])
        offsets = torch.tensor([0, 3, 3, 6, 10] if last else [0, 3, 3, 6])
        sample_weights = randn(10, dtype=dtype) if weighted else None
        return (
            randn(10, 4, dtype=dtype),
            indices,
            offsets,
            sample_weights,
        ), lambda w, i, o, p: ltorch.embedding_bag_forward(w, i, o, mode, p, last, padding)

    return inputs


def masked_rows_sum(start: int, shape: tuple):
    """The gradient of a row assigned where a mask over dims ``start`` on of a (2, 5, 3) tensor is."""

    def inputs(dtype):
        mask = torch.tensor([[True, False, True, True, False], [False, True, True, False, True]])
        mask = mask[0] if start else mask
        return (randn(2, 5, 3, dtype=dtype), mask), lambda g, m: ltorch.masked_rows_sum(g, m, start, shape)

    return inputs


CASES = [
    Case("masked_rows_sum", ltorch.masked_rows_sum, masked_rows_sum(0, (3,))),
    Case("masked_rows_sum_dim1", ltorch.masked_rows_sum, masked_rows_sum(1, (2, 1, 3))),
    Case("masked_rows_sum_all", ltorch.masked_rows_sum, masked_rows_sum(0, ())),
    Case("embedding_bag_forward_sum", ltorch.embedding_bag_forward, embedding_bag_forward(0)),
    Case("embedding_bag_forward_mean_padding", ltorch.embedding_bag_forward, embedding_bag_forward(1, padding=2)),
    Case("embedding_bag_forward_mean_last", ltorch.embedding_bag_forward, embedding_bag_forward(1, last=True)),
    Case(
        "embedding_bag_forward_sum_weighted_padding",
        ltorch.embedding_bag_forward,
        embedding_bag_forward(0, padding=1, weighted=True),
    ),
    Case(
        "native_layer_norm",
        ltorch.native_layer_norm,
        lambda d: (
            (randn(3, 4, 5, dtype=d), randn(4, 5, dtype=d), randn(4, 5, dtype=d)),
            lambda x, w, b: ltorch.native_layer_norm(x, (4, 5), w, b, 1e-5),
        ),
    ),
    Case(
        "native_layer_norm_plain",
        ltorch.native_layer_norm,
        lambda d: ((randn(3, 4, 5, dtype=d),), lambda x: ltorch.native_layer_norm(x, (5,), None, None, 1e-2)),
    ),
    Case("native_layer_norm_backward", ltorch.native_layer_norm_backward, layer_norm_backward([True, True, True])),
    Case(
        "native_layer_norm_backward_input",
        ltorch.native_layer_norm_backward,
        layer_norm_backward([True, False, False], params=False),
    ),
    Case(
        "native_layer_norm_backward_weight",
        ltorch.native_layer_norm_backward,
        layer_norm_backward([False, True, False]),
    ),
    Case(
        "native_dropout_backward",
        ltorch.native_dropout_backward,
        lambda d: (
            (randn(3, 4, dtype=d), torch.rand(3, 4) < 0.7),
            lambda g, m: ltorch.native_dropout_backward(g, m, 1 / 0.7),
        ),
    ),
    Case(
        "log_sigmoid_forward",
        ltorch.log_sigmoid_forward,
        lambda d: ((randn(5, 7, dtype=d) * 5,), ltorch.log_sigmoid_forward),
    ),
    Case(
        "gelu_backward",
        ltorch.gelu_backward,
        lambda d: ((randn(3, 4, dtype=d), randn(4, 3, dtype=d).t()), lambda g, x: ltorch.gelu_backward(g, x)),
    ),
    Case(
        "gelu_backward_tanh",
        ltorch.gelu_backward,
        lambda d: ((randn(3, 4, dtype=d), randn(3, 4, dtype=d)), lambda g, x: ltorch.gelu_backward(g, x, "tanh")),
    ),
    *(
        Case(name, getattr(ltorch, name), lambda d, call=call: ((randn(3, 4, dtype=d) * 4, randn(3, 4, dtype=d)), call))
        for name, call in {
            "softplus_backward": lambda g, x: ltorch.softplus_backward(g, x, 0.7, 2.0),
            "silu_backward": lambda g, x: ltorch.silu_backward(g, x),
            "mish_backward": lambda g, x: ltorch.mish_backward(g, x),
            "hardswish_backward": lambda g, x: ltorch.hardswish_backward(g, x),
            "tanh_backward": lambda g, y: ltorch.tanh_backward(g, y),
            "sigmoid_backward": lambda g, y: ltorch.sigmoid_backward(g, y),
        }.items()
    ),
    Case(
        "elu_backward",
        ltorch.elu_backward,
        lambda d: (
            (randn(3, 4, dtype=d), randn(3, 4, dtype=d)),
            lambda g, x: ltorch.elu_backward(g, 0.7, 1.2, 0.5, False, x),
        ),
    ),
    Case(
        "elu_backward_from_the_result",
        ltorch.elu_backward,
        lambda d: (
            (randn(3, 4, dtype=d), randn(3, 4, dtype=d)),
            lambda g, y: ltorch.elu_backward(g, 0.7, 1.2, 0.5, True, y),
        ),
    ),
    Case("softmax_backward", ltorch.softmax_backward, softmax_backward(ltorch.softmax_backward, False, 1)),
    Case("log_softmax_backward", ltorch.log_softmax_backward, softmax_backward(ltorch.log_softmax_backward, True, -1)),
    Case("embedding_backward", ltorch.embedding_backward, embedding(-1, False)),
    Case("embedding_backward_padding_by_freq", ltorch.embedding_backward, embedding(2, True)),
    Case("nll_loss_forward_mean", ltorch.nll_loss_forward, nll("mean", weighted=True)),
    Case("nll_loss_forward_none", ltorch.nll_loss_forward, nll("none")),
    Case("nll_loss_forward_unbatched_sum", ltorch.nll_loss_forward, nll("sum", unbatched=True)),
    Case("nll_loss_backward_mean", ltorch.nll_loss_backward, nll("mean", weighted=True, backward=True)),
    Case("nll_loss_backward_all_ignored", ltorch.nll_loss_backward, nll("mean", all_ignored=True, backward=True)),
    Case("nll_loss_backward_none", ltorch.nll_loss_backward, nll("none", weighted=True, backward=True)),
    Case("nll_loss_backward_unbatched_sum", ltorch.nll_loss_backward, nll("sum", unbatched=True, backward=True)),
    Case("multi_margin_loss_backward_mean", ltorch.multi_margin_loss_backward, multi_margin("mean", 1)),
    Case("multi_margin_loss_backward_p2_weighted", ltorch.multi_margin_loss_backward, multi_margin("sum", 2, True)),
    Case("multi_margin_loss_backward_none", ltorch.multi_margin_loss_backward, multi_margin("none", 2)),
    Case(
        "multi_margin_loss_backward_unbatched", ltorch.multi_margin_loss_backward, multi_margin("none", 1, shape=(5,))
    ),
    Case(
        "trilinear",
        ltorch.trilinear,
        lambda d: (
            (randn(5, 4, dtype=d), randn(6, 4, 3, dtype=d), randn(5, 3, dtype=d)),
            lambda a, w, b: ltorch.trilinear(a, w, b, (1, 3), (0,), (1, 2), (2, 3)),
        ),
    ),
    Case(
        "trilinear_weight_gradient",
        ltorch.trilinear,
        lambda d: (
            (randn(5, 4, dtype=d), randn(5, 6, dtype=d), randn(5, 3, dtype=d)),
            lambda a, g, b: ltorch.trilinear(a, g, b, (1, 3), (2, 3), (1, 2), (0,)),
        ),
    ),
    *(Case(f"cdist_forward_p{p}", ltorch.cdist_forward, cdist(p)) for p in (0.0, 0.5, 1.0, 2.0, 3.0, math.inf)),
    *(
        Case(f"cdist_backward_p{p}", ltorch.cdist_backward, cdist(p, backward=True))
        for p in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, math.inf)
    ),
    # (p = 0: zeros, which the decomposition records alone)
    *(
        Case(f"pdist_backward_p{p}", ltorch.pdist_backward, pdist_backward(p))
        for p in (0.5, 1.0, 1.5, 2.0, 3.0, math.inf)
    ),
    *(
        Case(f"grid_sampler_{mode}_{padding}_{align}", ltorch.grid_sampler, grid_sampler(mode, padding, align))
        for mode in (0, 1)
        for padding in (0, 1, 2)
        for align in (False, True)
    ),
    Case(
        "unfold_backward",
        ltorch.unfold_backward,
        lambda d: ((randn(3, 4, 2, 3, dtype=d),), lambda g: ltorch.unfold_backward(g, (3, 9, 2), 1, 3, 2)),
    ),
    Case("sdpa_flash", ltorch.sdpa_flash, attention(False)),
    Case("sdpa_flash_causal", ltorch.sdpa_flash, attention(True)),
    Case("sdpa_flash_strided_value", ltorch.sdpa_flash, attention(True, strided_value=True)),
    Case("sdpa_flash_backward", ltorch.sdpa_flash_backward, attention(False, backward=True)),
    Case("sdpa_flash_masked", ltorch.sdpa_flash, attention(False, masked=True)),
    Case("sdpa_flash_grouped_heads", ltorch.sdpa_flash, attention(True, kv_heads=1)),
    Case("sdpa_flash_backward_grouped_heads", ltorch.sdpa_flash_backward, attention(False, backward=True, kv_heads=1)),
    Case("sdpa_flash_backward_masked", ltorch.sdpa_flash_backward, attention(False, backward=True, masked=True)),
    Case("sdpa_flash_backward_strided_value", ltorch.sdpa_flash_backward, attention(False, True, strided_value=True)),
    Case(
        "sdpa_flash_backward_causal",
        ltorch.sdpa_flash_backward,
        attention(True, backward=True, query_len=3, key_len=5),
    ),
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
    out = thunder_rs.jit(lambda x, w, b: ltorch.native_layer_norm(x, (4, 5), w, b, 1e-5))(x, w, b)
    with decomposed(ltorch.native_layer_norm):
        decomposed_out = thunder_rs.jit(lambda x, w, b: ltorch.native_layer_norm(x, (4, 5), w, b, 1e-5))(x, w, b)
    assert [t.dtype for t in out] == [t.dtype for t in decomposed_out] == [torch.bfloat16, torch.float32, torch.float32]
    torch.testing.assert_close(out[1:], decomposed_out[1:])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_native_dropout_keeps_what_its_mask_says_in_both_forms(dtype: torch.dtype):
    # Masks are random, so the two forms are compared by what they promise: a bool mask keeping
    # about 1 - p of the elements, and the kept ones scaled by 1 / (1 - p).
    torch.manual_seed(0)
    x, p = torch.rand(64, 64, dtype=torch.float64).to(dtype) + 1, 0.25
    jkernel = thunder_rs.jit(lambda x: ltorch.native_dropout(x, p, True))
    forms = [jkernel(x)]
    assert "torch_native_dropout(" in str(thunder_rs.last_traces(jkernel)[-1])
    with decomposed(ltorch.native_dropout):
        jdecomposed = thunder_rs.jit(lambda x: ltorch.native_dropout(x, p, True))
        forms.append(jdecomposed(x))
    assert "torch_native_dropout(" not in str(thunder_rs.last_traces(jdecomposed)[-1])
    for out, mask in forms:
        assert (out.dtype, mask.dtype, out.shape) == (dtype, torch.bool, x.shape)
        assert abs(mask.double().mean().item() - (1 - p)) < 0.03
        torch.testing.assert_close(out, x * mask * (1 / (1 - p)), **TOLERANCE[dtype])


def _recorded(call, tensors, whole):
    """The outputs' (shape, dtype, device, requires_grad) of ``call`` recorded on proxies of
    ``tensors`` as the forward of a grad rule records it, and how many proxies it made."""
    rec, made = _core.Recorder(), []
    recorder._running.in_backward.append(False)
    try:
        with recording(rec, made=made, whole=whole):
            proxies = [input_proxy(rec, t) for t in tensors]
            made.clear()
            out = as_tuple(call(*proxies))
    finally:
        recorder._running.in_backward.pop()
    return [(tuple(o.shape), o.dtype, o.device, o.requires_grad) for o in out], len(made)


def _requiring_grad(tensors, which: str):
    floats = [i for i, t in enumerate(tensors) if t.is_floating_point()]
    chosen = {"none": [], "first": floats[:1], "last": floats[-1:], "all": floats}[which]
    return [t.detach().requires_grad_(i in chosen) for i, t in enumerate(tensors)]


def batch_norm(kind: str, weighted=True):
    def inputs(dtype):
        x = randn(4, 3, 5, dtype=dtype)
        w, b = (randn(3, dtype=dtype), randn(3, dtype=dtype)) if weighted else (None, None)
        rm, rv = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
        if kind == "forward":
            return (x, w, b, rm, rv), lambda *a: ltorch.native_batch_norm(*a, True, 0.1, 1e-5)
        if kind == "no_stats":
            return (x, w, b), lambda x, w, b: ltorch.native_batch_norm_no_stats(x, w, b, 1e-5)
        _, mean, invstd = torch.ops.aten._native_batch_norm_legit.no_stats(x.float(), None, None, True, 0.0, 1e-5)
        g = randn(4, 3, 5, dtype=dtype)

        def call(g, x, w, rm, rv, mean, invstd):
            train = kind == "train"
            return ltorch.native_batch_norm_backward(g, x, w, rm, rv, mean, invstd, train, 1e-5, [True, True, True])

        return (g, x, w, rm, rv, mean, invstd), call

    return inputs


#: Kernels the comparison with aten above leaves out (batch norm has tests of its own).
META_CASES = CASES + [
    Case("native_batch_norm", ltorch.native_batch_norm, batch_norm("forward")),
    Case("native_batch_norm_unweighted", ltorch.native_batch_norm, batch_norm("forward", weighted=False)),
    Case("native_batch_norm_no_stats", ltorch.native_batch_norm_no_stats, batch_norm("no_stats")),
    Case("native_batch_norm_backward_train", ltorch.native_batch_norm_backward, batch_norm("train")),
    Case("native_batch_norm_backward_eval", ltorch.native_batch_norm_backward, batch_norm("eval")),
]


@pytest.mark.parametrize("which", ["none", "first", "last", "all"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", META_CASES, ids=[c.id for c in META_CASES])
def test_a_kernel_recorded_whole_has_the_outputs_of_its_decomposition(case: Case, dtype: torch.dtype, which: str):
    torch.manual_seed(0)
    tensors, call = case.inputs(dtype)
    present = _requiring_grad([t for t in tensors if t is not None], which)

    def bound(*args):
        it = iter(args)
        return call(*[next(it) if t is not None else None for t in tensors])

    whole, whole_made = _recorded(bound, present, whole_runners(default_executors()))
    decomposition, made = _recorded(bound, present, None)
    assert whole == decomposition
    assert whole_made == len(whole) < made, "recorded whole: the outputs alone"


def _made_recording(call, tensors, whole, in_rule: bool) -> int:
    """How many proxies recording ``call`` made (its outputs alone when recorded whole)."""
    rec, made = _core.Recorder(), []
    if in_rule:
        recorder._running.in_backward.append(False)
    try:
        with recording(rec, made=made, whole=whole):
            proxies = [input_proxy(rec, t) for t in tensors]
            made.clear()
            call(*proxies)
    finally:
        if in_rule:
            recorder._running.in_backward.pop()
    return len(made)


class _Translator(thunder_rs.executors.FusionExecutor):
    fuses_decompositions = True


def test_a_kernel_is_recorded_whole_only_where_nothing_needs_its_decomposition():
    x, w, b = randn(3, 4, dtype=torch.float32), randn(4, dtype=torch.float32), randn(4, dtype=torch.float32)
    call = lambda x, w, b: ltorch.native_layer_norm(x, (4,), w, b, 1e-5)  # noqa: E731
    defaults = whole_runners(default_executors())
    assert _made_recording(call, (x, w, b), defaults, in_rule=True) == 3
    # Without gradients the VJP pass never differentiates it, inside a grad rule or not.
    assert _made_recording(call, (x, w, b), defaults, in_rule=False) == 3
    # Differentiated outside a grad rule: the VJP pass needs the decomposition.
    assert _made_recording(call, (x.requires_grad_(), w, b), defaults, in_rule=False) > 3
    # An executor that translates prims needs every decomposition.
    assert whole_runners([_Translator("translator"), *default_executors()]) is None
    assert _made_recording(call, (x, w, b), None, in_rule=True) > 3


def test_a_kernel_whose_runners_refuse_the_call_records_its_decomposition():
    x = randn(3, 4, dtype=torch.float32)
    call = lambda x: ltorch.native_layer_norm(x, (4,), None, None, 1e-5)  # noqa: E731
    for accepts, whole in ((True, True), (False, False)):
        executor = thunder_rs.executors.Executor("picky")
        executor.register_implementation(
            ltorch.native_layer_norm, torch.native_layer_norm, checker=lambda *args, accepts=accepts: accepts
        )
        made = _made_recording(call, (x,), whole_runners([executor]), in_rule=True)
        assert (made == 3) == whole


def test_a_whole_kernel_the_vjp_must_differentiate_is_refused_naming_it():
    """A grad rule that records a kernel and then does not differentiate its call itself leaves
    the VJP pass a kernel without decomposition: a clear error, never a missing gradient."""
    from thunder_rs.core.lang.recorder import GRAD_RULES

    builtin = GRAD_RULES.get(ltorch.silu.symbol_id)  # silu has a rule of its own: put back after

    @thunder_rs.register_grad(ltorch.silu)
    def silu_through_a_kernel(input, inplace=False):
        return ltorch.native_layer_norm(input, (4,), None, None, 1e-5)[0]

    try:
        fn = thunder_rs.jit(lambda x: torch.nn.functional.silu(x) * 2)
        with pytest.raises(
            thunder_rs.errors.ThunderNotImplementedError,
            match="ltorch.native_layer_norm: was recorded without its decomposition",
        ):
            fn(randn(3, 4, dtype=torch.float32).requires_grad_())
    finally:
        GRAD_RULES[ltorch.silu.symbol_id] = builtin
