"""Differentiated attention on CUDA runs the fused kernel torch chooses, forward and backward
(thunder_rs/torch/fused_attention.py), checked without a GPU.

Programs run on fake CUDA tensors (FakeTensorMode): the aten kernels the torch executor calls run
their meta registrations, so each kernel symbol's meta rule is compared with torch's own outputs
for the call. Torch's choice needs a GPU (without one every fused kernel is unavailable), so
``fused_attention.fused_sdp_choice`` is replaced by each backend in turn; what it asks torch is
checked separately, and on a GPU by ``test_cuda.py``. The backward runs through the compiled
``autograd.Function``'s backward directly (the autograd engine wants a CUDA context).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel

import thunder_rs
from thunder_rs.core.lang import sdp_state
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError
from thunder_rs.executors.torch_ex import _efficient_bias, _rng_as, torch_ex
from thunder_rs.torch import fused_attention as fa
from thunder_rs.torch import common

FLASH, EFFICIENT, CUDNN, MATH = fa.FLASH, fa.EFFICIENT, fa.CUDNN, fa.MATH
KERNELS = {FLASH: "flash_attention", EFFICIENT: "efficient_attention", CUDNN: "cudnn_attention"}


@pytest.fixture
def fake():
    return FakeTensorMode()


def choosing(monkeypatch, backend: int) -> list:
    """Torch's choice replaced by ``backend``; returns a list that gets one item per call asked
    about (not the call's proxies: a tracing stand-in kept after the call is refused)."""
    asked: list = []

    def choice(*args):
        asked.append(len(args))
        return backend

    monkeypatch.setattr(fa, "fused_sdp_choice", choice)
    return asked


@contextlib.contextmanager
def observed_kernels():
    """Per kernel name: the outputs its meta rule described at trace time, and the outputs of
    its aten call (fake tensors) at run time."""
    seen: dict = {"described": {}, "ran": {}}
    record, saved = common.record_opaque, {}

    def describing(sid, meta, args):
        seen["described"].setdefault(meta.__name__, []).append(meta(*args))
        return record(sid, meta, args)

    def running(name, impl):
        def run(*args):
            out = impl(*args)
            seen["ran"].setdefault(name, []).append(out if isinstance(out, tuple) else (out,))
            return out

        return run

    common.record_opaque = describing
    for name in ("flash_attention", "efficient_attention", "cudnn_attention"):
        for form in (name, f"{name}_dropout", f"{name}_backward"):
            sid = getattr(fa, form).symbol_id
            saved[sid] = torch_ex.registry[sid]
            torch_ex.registry.update(sid, fn=running(form.removesuffix("_dropout"), saved[sid].fn))
    try:
        yield seen
    finally:
        common.record_opaque = record
        torch_ex.registry.register(*saved.values())


def fake_leaf(shape, dtype, grad=True, layout=None):
    """A fake CUDA tensor requiring grad; ``layout`` is the order its dims are stored in (the
    heads-after-positions layout of q, k, v split from one projection is (0, 2, 1, 3))."""
    order = layout or tuple(range(len(shape)))
    stored = torch.empty([shape[d] for d in order], device="cuda", dtype=dtype)
    return stored.permute([order.index(d) for d in range(len(shape))]).detach().requires_grad_(grad)


@dataclass
class Case:
    id: str
    backend: int
    #: (query, key, value, attn_mask) shapes; the mask's dtype; extra keyword arguments
    shapes: tuple
    dtype: torch.dtype = torch.bfloat16
    mask: torch.dtype | None = None
    mask_grad: bool = False
    kwargs: dict = field(default_factory=dict)

    def inputs(self):
        q, k, v, m = self.shapes
        tensors = [fake_leaf(s, self.dtype, layout=(0, 2, 1, 3)) for s in (q, k, v)]
        if m is not None:
            tensors.append(fake_leaf(m, self.mask, grad=self.mask_grad))
        return tensors


QKV = ((2, 4, 16, 64), (2, 4, 16, 64), (2, 4, 16, 64), None)
CROSS = ((2, 4, 16, 64), (2, 4, 24, 64), (2, 4, 24, 64))
GQA = ((2, 8, 16, 64), (2, 2, 16, 64), (2, 2, 16, 64), None)

CASES = [
    Case("flash_causal", FLASH, QKV, kwargs=dict(is_causal=True)),
    Case("flash_head_size_4_padded", FLASH, ((2, 4, 16, 4), (2, 4, 16, 4), (2, 4, 16, 4), None), torch.float16),
    Case("flash_gqa", FLASH, GQA, kwargs=dict(enable_gqa=True, is_causal=True)),
    Case("flash_dropout_scale", FLASH, QKV, kwargs=dict(dropout_p=0.25, scale=0.3)),
    Case("efficient_causal_float32", EFFICIENT, QKV, torch.float32, kwargs=dict(is_causal=True)),
    Case("efficient_float_mask_with_grad", EFFICIENT, (*CROSS, (1, 4, 16, 24)), mask=torch.bfloat16, mask_grad=True),
    Case("efficient_bool_mask_2d", EFFICIENT, (*CROSS, (16, 24)), mask=torch.bool),
    # (GQA with efficient attention: torch >= 2.13's kernels; 2.11's meta gives keys' gradients
    # the query's heads, and its dispatcher never chooses efficient for GQA.)
    Case("efficient_dropout", EFFICIENT, QKV, kwargs=dict(dropout_p=0.5)),
    Case("cudnn_causal", CUDNN, QKV, kwargs=dict(is_causal=True)),
    Case("cudnn_bool_mask", CUDNN, (*CROSS, (2, 1, 16, 24)), mask=torch.bool),
    Case("cudnn_float_mask", CUDNN, (*CROSS, (2, 4, 16, 24)), torch.float16, mask=torch.float16),
    Case("cudnn_gqa_dropout", CUDNN, GQA, kwargs=dict(enable_gqa=True, dropout_p=0.125)),
]


def attention(kwargs):
    def fn(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)

    return fn


def backward(out):
    """The compiled backward, run directly on a fake cotangent."""
    with torch.no_grad():
        return out.grad_fn.apply(torch.empty_like(out))


def metadata(t):
    return tuple(t.shape), t.dtype, t.device


def assert_described_as_ran(seen, meta_name: str, kernel: str):
    """Each output the meta rule described has the shape, dtype and device (and for the attention
    output, the strides) of what torch's meta registration returned for the call."""
    (described,), (ran,) = seen["described"][meta_name], seen["ran"][kernel]
    assert len(described) == len(ran)
    for i, ((shape, dtype, _, strides), actual) in enumerate(zip(described, ran)):
        assert (tuple(shape), dtype) == (tuple(actual.shape), actual.dtype), f"{kernel} output {i}"
        assert actual.device.type == "cuda"
        if strides is not None or i == 0 and meta_name != "_flash_backward_meta":
            assert (strides or actual.stride()) == actual.stride(), f"{kernel} output {i} strides"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_trace_runs_the_kernel_torch_chooses_with_its_metadata(case: Case, fake, monkeypatch):
    asked = choosing(monkeypatch, case.backend)
    kernel = KERNELS[case.backend]
    dropout = case.kwargs.get("dropout_p", 0) > 0
    fn = attention(case.kwargs)
    jfn = thunder_rs.jit(fn)
    with fake, observed_kernels() as seen:
        inputs = case.inputs()
        out = jfn(*inputs)
        grads = backward(out)
    assert len(asked) == 1
    forward_trace, backward_trace = str(thunder_rs.last_traces(jfn)[-1]), str(thunder_rs.last_backward_traces(jfn)[-1])
    assert f"torch_{kernel}{'_dropout' if dropout else ''}(" in forward_trace, forward_trace
    assert f"torch_{kernel}_backward(" in backward_trace, backward_trace
    # No attention matrix is computed again: no product, no softmax, no [.., L, S] value but the
    # mask's gradient (in the mask's dtype).
    rows, cols = case.shapes[0][2], case.shapes[1][2]
    matrix = rf"{'' if case.mask is None else 'f32'}\[\d+, \d+, {rows}, {cols}\]"
    assert not re.search(matrix, backward_trace) and not re.search(matrix, forward_trace)
    assert "matmul" not in backward_trace and "softmax" not in backward_trace
    short = kernel.removesuffix("_attention")
    assert_described_as_ran(seen, f"_{short}_meta", kernel)
    assert_described_as_ran(seen, f"_{short}_backward_meta", f"{kernel}_backward")
    # The program's output and gradients are eager's: its output's metadata, one gradient per
    # input that requires grad, shaped like it.
    assert metadata(out) == (tuple(case.shapes[0][:3]) + (case.shapes[2][-1],), case.dtype, inputs[0].device)
    wanted = [x for x in inputs if x.requires_grad]
    assert [metadata(g) for g in grads if g is not None] == [metadata(x) for x in wanted]


def test_a_view_of_the_output_follows_the_kernels_layout(fake, monkeypatch):
    """Flash and cuDNN give the output the query's layout (positions before heads for q, k, v
    split from one projection), so eager views it back without a copy; so does the trace."""
    choosing(monkeypatch, CUDNN)

    def block(q, k, v):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).view(2, 16, 4 * 64)

    with fake:
        q, k, v = (fake_leaf((2, 4, 16, 64), torch.bfloat16, layout=(0, 2, 1, 3)) for _ in range(3))
        assert thunder_rs.jit(block)(q, k, v).shape == (2, 16, 256)
        # Had the trace taken the output for contiguous, the view would be refused as eager
        # refuses it for such a tensor.
        monkeypatch.setattr(fa, "_output", lambda query, shape, strides: (shape, query.dtype, True, None))
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            thunder_rs.jit(block)(q, k, v)


@pytest.mark.parametrize("kwargs", [dict(is_causal=True), dict(enable_gqa=True)], ids=["causal", "gqa"])
def test_the_math_choice_runs_the_math_path_op_by_op_in_the_forward(kwargs, fake, monkeypatch):
    """The forward of a differentiated call torch chose its math path for is that path's ops, the
    probabilities kept for the backward as eager's autograd keeps them. It was
    F.scaled_dot_product_attention whole, which the forward runs without grad, where torch may
    choose a fused kernel (cuDNN's backward head sizes on sm90 are asked only of inputs that
    require grad): its output, not the math path's, beside the math path's gradients. Without
    grad, eager's own attention still runs whole."""
    choosing(monkeypatch, MATH)
    jfn = thunder_rs.jit(attention(kwargs))
    with fake:
        inputs = Case("", MATH, GQA if kwargs.get("enable_gqa") else QKV).inputs()
        grads = backward(jfn(*inputs))
    forward_trace, backward_trace = str(thunder_rs.last_traces(jfn)[-1]), str(thunder_rs.last_backward_traces(jfn)[-1])
    assert "torch_scaled_dot_product_attention(" not in forward_trace
    assert "torch_safe_softmax(" in forward_trace and "softmax" not in backward_trace.replace("softmax_backward", "")
    assert not any(name in forward_trace + backward_trace for name in KERNELS.values())
    assert [metadata(g) for g in grads] == [metadata(x) for x in inputs]
    with fake, torch.no_grad():
        jfn(*inputs)
    assert "torch_scaled_dot_product_attention(" in str(thunder_rs.last_traces(jfn)[-1])


def test_without_gradients_eager_attention_runs_with_the_chosen_kernels_layout(fake, monkeypatch):
    """Inference runs eager's own attention (its dispatcher picks the kernel at run time); the
    choice, made once at compile time, tells the output's layout (the memory-efficient kernel's
    ``[B, L, H, D]``-major), which the program's ``stride()`` reads as eager's."""
    asked = choosing(monkeypatch, EFFICIENT)

    def strides(q, k, v):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y * 2, y.stride()

    jfn = thunder_rs.jit(strides)
    with fake:
        q, k, v = (fake_leaf((2, 4, 16, 64), torch.bfloat16, grad=False) for _ in range(3))
        assert jfn(q, k, v)[1] == (16 * 4 * 64, 64, 4 * 64, 1)
        jfn(q, k, v)
    assert "torch_scaled_dot_product_attention(" in str(thunder_rs.last_traces(jfn)[-1])
    assert len(asked) == 1


def test_a_mask_that_alone_requires_grad_is_differentiated_by_the_decomposition(fake, monkeypatch):
    """Eager's fused kernels keep no logsumexp when query, key and value need no gradient."""
    choosing(monkeypatch, EFFICIENT)
    jfn = thunder_rs.jit(attention({}))
    with fake:
        q, k, v = (fake_leaf((2, 4, 16, 64), torch.bfloat16, grad=False) for _ in range(3))
        mask = fake_leaf((16, 16), torch.bfloat16)
        grads = backward(jfn(q, k, v, mask))
    assert [metadata(g) for g in grads if g is not None] == [metadata(mask)]
    assert "efficient_attention" not in str(thunder_rs.last_traces(jfn)[-1])


@pytest.mark.parametrize("backend", [EFFICIENT, CUDNN, MATH], ids=["efficient", "cudnn", "math"])
def test_dropout_with_a_mask_that_alone_requires_grad_is_refused_where_a_kernel_draws_it(backend, fake, monkeypatch):
    """Where torch chooses a fused kernel, eager's dropout is drawn inside it; the decomposition,
    which differentiates a mask that alone requires grad, would draw with aten's dropout: other
    values than eager's forward. The math path draws as eager's math path does."""
    choosing(monkeypatch, backend)
    jfn = thunder_rs.jit(attention(dict(dropout_p=0.5)))
    with fake:
        q, k, v = (fake_leaf((2, 4, 16, 64), torch.bfloat16, grad=False) for _ in range(3))
        mask = fake_leaf((16, 16), torch.bfloat16)
        if backend == MATH:
            assert [metadata(g) for g in backward(jfn(q, k, v, mask)) if g is not None] == [metadata(mask)]
            return
        with pytest.raises(ThunderNotImplementedError, match=r"draws its dropout inside the kernel.*dropout_p"):
            jfn(q, k, v, mask)


def test_cudnn_with_a_mask_requiring_grad_is_refused(fake, monkeypatch):
    choosing(monkeypatch, CUDNN)
    jfn = thunder_rs.jit(attention({}))
    with fake, pytest.raises(ThunderNotImplementedError, match="cuDNN attention kernel .*enable_cudnn_sdp"):
        jfn(*Case("", CUDNN, (*QKV[:3], (16, 16)), mask=torch.bfloat16, mask_grad=True).inputs())


def test_a_forward_with_dropout_draws_on_every_call(fake, monkeypatch):
    """Its kernel draws from the CUDA generator: two equal calls are both made, and one whose
    result is unused is still made (as eager's own attention, which draws as much), as eager
    makes them."""
    choosing(monkeypatch, FLASH)

    def twice(q, k, v):
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
        return a + F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    jfn = thunder_rs.jit(twice)
    with fake:
        jfn(*Case("", FLASH, QKV).inputs())
    trace = str(thunder_rs.last_traces(jfn)[-1])
    assert trace.count("torch_flash_attention_dropout(") == 2
    assert trace.count("torch_scaled_dot_product_attention(") == 1


def test_a_changed_switch_compiles_again_with_the_kernel_then_chosen(fake, monkeypatch):
    monkeypatch.setattr(
        fa, "fused_sdp_choice", lambda *a: FLASH if torch.backends.cuda.flash_sdp_enabled() else EFFICIENT
    )
    jfn = thunder_rs.jit(attention({}))
    with fake:
        inputs = Case("", FLASH, QKV).inputs()
        jfn(*inputs), jfn(*inputs)
        assert "torch_flash_attention(" in str(thunder_rs.last_traces(jfn)[-1])
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            jfn(*inputs), jfn(*inputs)
            assert "torch_efficient_attention(" in str(thunder_rs.last_traces(jfn)[-1])
        jfn(*inputs)
    stats = thunder_rs.compile_stats(jfn)
    assert (stats.cache_misses, stats.cache_hits) == (2, 3)
    reason = stats.miss_reasons[1]
    assert "attention kernel switches" in reason and "flash True -> False" in reason, reason
    assert "mem_efficient" not in reason.split("(traced under")[0], reason  # only the switches that changed


def test_sdpa_kernel_inside_the_program_is_set_by_every_call(fake, monkeypatch):
    """The switches a program sets are set again by each call (the eager attention an
    inference trace runs sees them), and the choice made while tracing saw them."""
    asked = []
    monkeypatch.setattr(
        fa, "fused_sdp_choice", lambda *a: asked.append(torch.backends.cuda.flash_sdp_enabled()) or EFFICIENT
    )

    def program(q, k, v):
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    jfn = thunder_rs.jit(program)
    before = sdp_state.state()
    with fake:
        inputs = Case("", EFFICIENT, QKV).inputs()
        jfn(*inputs), jfn(*inputs)
    assert asked == [False] and sdp_state.state() == before
    stats = thunder_rs.compile_stats(jfn)
    assert (stats.cache_misses, stats.cache_hits) == (1, 1)
    assert "_set_sdp_use_flash" in str(thunder_rs.last_traces(jfn)[-1])


def test_the_math_kernel_chosen_by_sdpa_kernel_is_eager_s_to_the_bit():
    # On the CPU the flash kernel took the call whatever the switches where its output is laid out
    # as the math path's: under sdpa_kernel(MATH) eager's math path rounds otherwise (3.6e-7 off
    # in the output, 9.5e-7 in the gradients). The switches are guarded: one compile more.
    f = attention({})
    jfn = thunder_rs.jit(f)
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    for math_only in (False, True, False, True):
        with sdpa_kernel([SDPBackend.MATH] if math_only else [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
            out, expected = jfn(q, k, v), f(q, k, v)
            grads = torch.autograd.grad(out.sum(), (q, k, v))
            expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        torch.testing.assert_close(grads, expected_grads, rtol=0, atol=0)
    assert thunder_rs.compile_stats(jfn).cache_misses == 2


#: (keywords, mask) of the math path's calls: a causal one, grouped heads, a negative scale, a
#: bool mask (one row hidden), a float mask that requires grad.
MATH_PATH_CALLS = {
    "causal": (dict(is_causal=True), None),
    "gqa": (dict(enable_gqa=True, scale=0.3), None),
    "negative_scale": (dict(scale=-0.2), None),
    "bool_mask": ({}, "bool"),
    "float_mask_grad": ({}, "float"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("call", list(MATH_PATH_CALLS))
def test_the_math_path_the_forward_records_is_eagers_to_the_bit(call, dtype):
    """What a differentiated call torch sends to its math path records (the path op by op, its
    probabilities kept for the gradients; on CUDA where torch chose it), here on the CPU: eager's
    math path under sdpa_kernel(MATH), output and gradients, to the bit."""
    kwargs, mask = MATH_PATH_CALLS[call]
    gen = torch.Generator().manual_seed(0)
    heads = 2 if kwargs.get("enable_gqa") else 4
    q = torch.randn(2, 4, 6, 8, generator=gen).to(dtype)
    k, v = (torch.randn(2, heads, 7, 8, generator=gen).to(dtype) for _ in range(2))
    inputs = [q, k, v]
    if mask == "bool":
        hidden = torch.rand(6, 7, generator=gen) > 0.3
        hidden[2] = False
        inputs.append(hidden)
    elif mask == "float":
        inputs.append(torch.randn(1, 4, 6, 7, generator=gen).to(dtype))
    f = attention(kwargs)

    def run(fn):
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
        with sdpa_kernel(SDPBackend.MATH):
            out = fn(*leaves)
        grads = torch.autograd.grad(out, [t for t in leaves if t.requires_grad], torch.ones_like(out))
        return out, *grads

    jfn = thunder_rs.jit(f)
    for actual, expected in zip(run(jfn), run(f), strict=True):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    assert "torch_safe_softmax(" in str(thunder_rs.last_traces(jfn)[-1])


def _last_dims_reversed(t: torch.Tensor) -> torch.Tensor:
    return t.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("layout", ["dims reversed", "every other head element"])
def test_inputs_whose_last_dim_steps_over_elements_take_eager_s_math_path(layout: str, dtype: torch.dtype):
    # Eager's CPU flash kernel wants the last dims dense (check_last_dim_stride_equals_1_dense):
    # otherwise its math path runs, whose output rounds and whose gradients are laid out otherwise.
    torch.manual_seed(0)
    if layout == "dims reversed":
        inputs = [_last_dims_reversed(torch.randn(2, 2, 3, 8, dtype=dtype)) for _ in range(3)]
    else:
        inputs = [torch.randn(2, 2, 3, 16, dtype=dtype)[..., ::2] for _ in range(3)]
    results = []
    for fn in (F.scaled_dot_product_attention, thunder_rs.jit(F.scaled_dot_product_attention)):
        leaves = [x.detach().requires_grad_() for x in inputs]
        out = fn(*leaves)
        g = torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
        results.append((out, torch.autograd.grad(out, leaves, g)))
    (expected, expected_grads), (out, grads) = results
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for grad, eager in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, eager, rtol=0, atol=0)
        assert grad.stride() == eager.stride()


# -- torch's choice ------------------------------------------------------------------------------


def test_the_choice_is_asked_of_torch_with_the_eager_layout(fake, monkeypatch):
    seen = []

    def eager_choice(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa):
        seen.append((q.stride(), k.requires_grad, mask.dtype, torch.is_grad_enabled(), dropout_p, scale, enable_gqa))
        return MATH

    monkeypatch.setattr(fa, "eager_choice", eager_choice)
    monkeypatch.setattr(fa, "_choices", {})
    jfn = thunder_rs.jit(attention(dict(dropout_p=0.0, scale=0.5)))
    with fake:
        q, k, v = (fake_leaf((2, 4, 16, 64), torch.bfloat16, layout=(0, 2, 1, 3)) for _ in range(3))
        jfn(q, k, v, fake_leaf((16, 16), torch.bool, grad=False))
    # (Asked again with q, k and v, the call's inputs, starting elsewhere: ``guard_offsets``.)
    assert set(seen) == {(q.stride(), True, torch.bool, True, 0.0, 0.5, False)}


KERNEL_CALLS = {
    FLASH: lambda q: torch.ops.aten._scaled_dot_product_flash_attention.default(q, q, q),
    EFFICIENT: lambda q: torch.ops.aten._scaled_dot_product_efficient_attention.default(q, q, q, None, True),
    CUDNN: lambda q: torch.ops.aten._scaled_dot_product_cudnn_attention.default(q, q, q, None, True),
    MATH: lambda q: torch.softmax(q @ q.transpose(-1, -2), -1) @ q,
}


@pytest.mark.parametrize("backend", list(KERNEL_CALLS), ids=["flash", "efficient", "cudnn", "math"])
def test_the_kernel_eagers_composite_calls_is_the_backend_chosen(backend, fake):
    with fake:
        q = fake_leaf((2, 4, 16, 64), torch.bfloat16)
        with fa._KernelSeen() as seen:
            KERNEL_CALLS[backend](q)
    assert seen.backend == backend


def test_torch_is_asked_once_for_equal_calls_under_equal_switches(fake, monkeypatch):
    asked = []

    def choice(q, k, v, *args):
        starts = tuple(x.storage_offset() for x in (q, k, v))
        return asked.append((*starts, torch.backends.cuda.flash_sdp_enabled())) or MATH

    monkeypatch.setattr(fa, "eager_choice", choice)
    monkeypatch.setattr(fa, "_choices", {})

    def layers(q, k, v):
        for _ in range(3):
            q = F.scaled_dot_product_attention(q, k, v)
        return q

    with fake:
        inputs = [fake_leaf((2, 4, 16, 64), torch.bfloat16) for _ in range(3)]  # laid out as the outputs
        thunder_rs.jit(layers)(*inputs)
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            thunder_rs.jit(layers)(*inputs)
    # Once per call and switches: the layers' (asked again with k and v, and q, the program's
    # inputs, starting elsewhere: ``guard_offsets``)
    assert len(asked) == len(set(asked))
    assert [flash for *starts, flash in asked if starts == [0, 0, 0]] == [True, False]


@pytest.mark.skipif(torch.cuda.is_available(), reason="without a GPU torch has no fused kernel to offer")
def test_without_a_gpu_torch_chooses_the_math_path_or_none(fake):
    jfn = thunder_rs.jit(attention({}))
    with fake:
        inputs = Case("", MATH, QKV).inputs()
        jfn(*inputs)
        assert "torch_safe_softmax(" in str(thunder_rs.last_traces(jfn)[-1])  # (the math path, op by op)
        with (
            sdpa_kernel(SDPBackend.FLASH_ATTENTION),
            pytest.warns(UserWarning),
            pytest.raises(ThunderRuntimeError, match="No available kernel"),
        ):
            thunder_rs.jit(attention({}))(*inputs)


# -- the torch executor's preparation of inputs (CPU tensors) ------------------------------------


@pytest.mark.parametrize("shape", [(16, 24), (2, 1, 16, 21), (1, 4, 16, 40)])
def test_the_efficient_kernels_mask_is_aligned_and_expanded_with_its_values(shape):
    q, k = torch.empty(2, 4, 16, 8), torch.empty(2, 4, shape[-1], 8)
    mask = torch.randn(shape)
    bias = _efficient_bias(mask, q, k)
    assert bias.shape == (2, 4, 16, shape[-1]) and all(s % 16 == 0 for s in bias.stride()[:-1])
    assert torch.equal(bias, mask.expand(bias.shape))
    assert _efficient_bias(None, q, k) is None


def test_flash_philox_state_travels_as_int64_with_its_bits():
    seed = torch.tensor([2**63 + 5, 7], dtype=torch.uint64)
    carried = _rng_as(seed, torch.int64)
    assert carried.dtype == torch.int64 and torch.equal(_rng_as(carried, torch.uint64), seed)
    assert _rng_as(None, torch.int64) is None


def test_a_gpt_block_on_fake_cuda_compiles_once_and_names_the_switch_that_changed(fake):
    """The GPT steps on an H100 compiled twice with "the attention kernel switches changed": on
    fake CUDA tensors the block's entry carries the switches' guard, equal calls hit it, and a
    changed switch misses with a reason naming that switch and its two values (not the whole state)."""
    import sys  # noqa: PLC0415 (only this test imports the example)
    from pathlib import Path  # noqa: PLC0415

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from gpt import Block, GPTConfig  # noqa: PLC0415

    with fake, torch.device("cuda"):
        jblock = thunder_rs.jit(Block(GPTConfig(n_embd=64, n_head=4, block_size=32)), executors=["torch"])
        for _ in range(3):
            assert jblock(torch.empty(2, 32, 64, requires_grad=True)).requires_grad
        assert thunder_rs.compile_stats(jblock).cache_misses == 1, thunder_rs.compile_stats(jblock).miss_reasons
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION]):
            jblock(torch.empty(2, 32, 64, requires_grad=True))
    reason = thunder_rs.compile_stats(jblock).miss_reasons[-1]
    assert re.match(
        r"the attention kernel switches \(torch.backends.cuda \*_sdp\) changed: flash True -> False, "
        r"overrideable True -> False \(traced under \(flash=True, ",
        reason,
    ), reason


def test_the_first_choice_of_a_process_may_set_the_priority_order(fake, monkeypatch):
    """On GPUs where torch prefers cuDNN's kernel (sm90 and newer) its first choice in a process
    puts cuDNN first in the priority order (``priority_order`` in ``sdp_utils.cpp``). The entry is
    guarded on the order after the choice: the first call compiles and the next one hits (on an
    H200 the first traced attention failed as a program that changed the state it read)."""
    setter = torch._C._set_sdp_priority_order
    setter = getattr(setter, "__thunder_rs_original__", setter)
    before = list(torch._C._get_sdp_priority_order())
    cudnn_first = [CUDNN, *[b for b in before if b != CUDNN]]
    asked = []

    def first_sets_the_order(*args, **kwargs):
        if not asked:
            setter(cudnn_first)
        asked.append(1)
        return CUDNN

    monkeypatch.setattr(fa, "eager_choice", first_sets_the_order)
    fa._choices.clear()
    jfn = thunder_rs.jit(attention({}))
    try:
        with fake:
            inputs = Case("", CUDNN, QKV).inputs()
            jfn(*inputs), jfn(*inputs)
        assert "torch_cudnn_attention(" in str(thunder_rs.last_traces(jfn)[-1])
        stats = thunder_rs.compile_stats(jfn)
        assert (stats.cache_misses, stats.cache_hits) == (1, 1), stats.miss_reasons
        assert len(asked) == 2  # the second call's choice is the stored one, under the new order
        # (the other: q, k and v, the program's inputs, starting elsewhere, ``guard_offsets``)
    finally:
        setter(before)
        fa._choices.clear()


@pytest.mark.parametrize("odd_lengths_math", [False, True], ids=["same_choice", "choice_changes"])
def test_attention_over_changing_lengths_asks_torchs_choice_per_length(fake, monkeypatch, odd_lengths_math):
    """With symbolic lengths the kernel is chosen at the hints, and the symbolic entry serves
    another length only where torch chooses the same kernel for it: a choice that changes for
    odd lengths compiles them apart (each entry records its own kernel), never served wrongly."""
    asked = []

    def choice(q, *args, **kwargs):
        asked.append(q.shape[2])
        return MATH if odd_lengths_math and q.shape[2] % 2 else EFFICIENT

    monkeypatch.setattr(fa, "eager_choice", choice)
    fa._choices.clear()
    jfn = thunder_rs.jit(attention(dict(is_causal=True)))
    kernels = {}
    with fake:
        for n in (16, 24, 32, 17, 40, 19):
            jfn(*(fake_leaf((2, 4, n, 64), torch.bfloat16) for _ in range(3)))
            kernels[n] = "torch_efficient_attention(" in str(thunder_rs.last_traces(jfn)[-1])
    fa._choices.clear()
    stats = thunder_rs.compile_stats(jfn)
    if odd_lengths_math:
        assert stats.cache_misses == 3, stats.miss_reasons  # 16, then 24 symbolic, then 17 symbolic
        assert not kernels[17] and 40 in asked and 19 in asked
    else:
        assert stats.cache_misses == 2, stats.miss_reasons
    assert kernels[24]
