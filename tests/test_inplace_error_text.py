"""Eager's text of the "modified by an inplace operation" error a compiled backward raises
(``core.lang.saved_errors``): the node the saved tensor is an output of (the saving node for an
output, the tensor's own ``grad_fn`` for an input: the last in-place op, ``CopySlices``,
``AsStrided`` for a view, an input's node at the call), the versions counted from an input's
version at each call, eager's own error for one of several views a call made; and what fused
attention saves, as the kernel torch chose. Each case runs eagerly and compiled, as
``test_inplace_saved_versions``'s do: the texts are compared whole."""

import pytest
import torch
import torch.nn.functional as F
from test_inplace_saved_versions import LEADING, _attention_then_write_query, _check, _Save, _x
from torch.nn.attention import SDPBackend, sdpa_kernel

import thunder_rs
from thunder_rs.core.lang.saved_versions import eager_saves, taken_as_saved
from thunder_rs.torch import fused_attention


def _non_leaf(*shape):
    return lambda: torch.randn(*shape, requires_grad=True) * 1


def _view_input(*shape, grad=True):
    """A view (the first half) of a tensor twice as long: a non-leaf where ``grad``."""
    return lambda: (torch.randn(2 * shape[0], *shape[1:], requires_grad=grad) * 1)[: shape[0]]


def _written_before(*shape, grad=False, times=3):
    """A tensor the caller wrote in place ``times`` times before the call (at that version)."""

    def make():
        t = torch.randn(*shape, requires_grad=grad) * 1 if grad else torch.randn(*shape)
        for _ in range(times):
            t.mul_(1.5)
        return t

    return make


def _qr_output_written(x):
    q, r = torch.linalg.qr(x)  # saves both outputs: r is its output 1
    r.mul_(2)
    return r.sum()


def _sort_values_written_under_no_grad(x):
    v, _ = (x * 1).sort()
    z = v.sin()  # saves v, the output 0 of sort, which is its node at the backward
    with torch.no_grad():
        v.mul_(2)
    return z.sum()


def _fill_a_saved_tensor(x):
    y = x * 1
    z = y.sin()
    y.fill_(1.0)  # (the node of fill_'s overload 2: Fill2)
    return z.sum()


def _clamp_a_saved_tensor(x):
    y = x * 1
    z = y.exp()
    y.clamp_(min=0)
    return z.sum()


def _custom_function_output_written(x):
    z = _Save.apply(x)
    z.add_(1)  # (not saved: the custom Function saved its input)
    return (z * x).sum()


class _SaveOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        b = a * a
        ctx.save_for_backward(b)
        return b

    @staticmethod
    def backward(ctx, g):
        (b,) = ctx.saved_tensors
        return g * b


def _custom_function_saved_output_written(x):
    z = _SaveOutput.apply(x)
    z.add_(1)
    return z.sum()


def _input_saved_then_written(x, w):
    z = x * w  # saves x, for w's gradient
    x.add_(1)
    return z.sum()


def _input_saved_then_written_under_no_grad(x):
    z = x.sin()
    with torch.no_grad():
        x.mul_(2)
    return z.sum()


def _view_of_input_saved_then_written(x):
    z = x[:2].sin()
    x.mul_(2)
    return z.sum()


def _transposed_view_saved(x):
    y = x * 1
    z = y.t().sin()
    y.mul_(2)
    return z.sum()


def _sin_of_unbind_output_then_write_base(x):
    y = x * 1
    u = torch.unbind(y)
    z = u[1].sin()  # (eager refuses the use of one of several views once their base is written)
    y.mul_(2)
    return z.sum()


def _sin_of_a_view_of_unbind_output_then_write_base(x):
    y = x * 1
    v = torch.unbind(y)[1].view(2)  # (eager names the view's own node: "Output 0 of View")
    z = v.sin()
    y.mul_(2)
    return z.sum()


def _sin_of_chunk_then_write_base_under_no_grad(x):
    _, b = x.chunk(2)
    z = b.sin()
    with torch.no_grad():
        x.mul_(2)
    return z.sum()


def _linear_of_3d_input_then_write(x, w):
    h = x * 1
    y = F.linear(h, w)  # saves a [10, 3] view of h
    h.add_(1)
    return y.sum()


def _attention_math_path_then_write_query(q, k, v):
    q = q * 1
    out = F.scaled_dot_product_attention(q, k, v)  # (v's head size differs: the math path, which saves a copy of q)
    q.mul_(2)
    return out.sum()


def _attention_math_path_then_write_value(q, k, v):
    v = v * 1
    out = F.scaled_dot_product_attention(q, k, v)  # (the math path saves a [2, 4, 16] view of v)
    v.mul_(2)
    return out.sum()


def _attention_under_math_kernel_then_write_query(q, k, v):
    q = q * 1
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v)
    q.mul_(2)  # (after the context: the kernel was chosen as the call ran)
    return out.sum()


def _attention_mask_requiring_grad_then_write_query(q, k, v, mask):
    q = q * 1
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (a mask requiring grad: the math path)
    q.mul_(2)
    return out.sum()


TEXT_CASES = {
    "an output 1 of qr written": (_qr_output_written, [_x(3, 3)]),
    "sort's output, written under no_grad": (_sort_values_written_under_no_grad, [_x(4)]),
    "fill_ into a saved tensor": (_fill_a_saved_tensor, [_x(3)]),
    "clamp_ into a saved tensor": (_clamp_a_saved_tensor, [_x(3)]),
    "a custom Function's output written": (_custom_function_output_written, [_x(3)]),
    "a custom Function's saved output written": (_custom_function_saved_output_written, [_x(3)]),
    "a transposed view saved": (_transposed_view_saved, [_x(2, 3)]),
    "one of unbind's views saved, its base written": (_sin_of_unbind_output_then_write_base, [_x(3, 2)]),
    "a view of one of unbind's views saved, its base written": (
        _sin_of_a_view_of_unbind_output_then_write_base,
        [_x(3, 2)],
    ),
    "one of chunk's views of a leaf saved, the leaf written": (_sin_of_chunk_then_write_base_under_no_grad, [_x(4, 2)]),
    "linear saves a view of its 3-d input": (_linear_of_3d_input_then_write, [_x(2, 5, 3), _x(4, 3)]),
    "attention's math path, its query written": (
        _attention_math_path_then_write_query,
        [_x(1, 2, 4, 8), _x(1, 2, 4, 8), _x(1, 2, 4, 16)],
    ),
    "attention's math path, its value written": (
        _attention_math_path_then_write_value,
        [_x(1, 2, 4, 8), _x(1, 2, 4, 8), _x(1, 2, 4, 16)],
    ),
    "attention of 3-d tensors, its query written": (  # (CPU's flash kernel saves [1, 2, 4, 8] views)
        _attention_then_write_query,
        [_x(2, 4, 8), _x(2, 4, 8), _x(2, 4, 8)],
    ),
    "attention under sdpa_kernel(MATH), its query written": (
        _attention_under_math_kernel_then_write_query,
        [_x(1, 2, 4, 8), _x(1, 2, 4, 8), _x(1, 2, 4, 8)],
    ),
    "attention with a mask requiring grad, its query written": (
        _attention_mask_requiring_grad_then_write_query,
        [_x(1, 2, 4, 8), _x(1, 2, 4, 8), _x(1, 2, 4, 8), _x(4, 4)],
    ),
    "a non-leaf input saved, then written": (_input_saved_then_written, [_non_leaf(3), _x(3)]),
    "a non-leaf input saved, then written under no_grad": (_input_saved_then_written_under_no_grad, [_non_leaf(3)]),
    "a view of a non-leaf input saved": (_view_of_input_saved_then_written, [_non_leaf(3)]),
    "an input that is a view, saved, then written": (_input_saved_then_written, [_view_input(3), _x(3)]),
    "an input that is a view, written under no_grad": (_input_saved_then_written_under_no_grad, [_view_input(3)]),
    "an input that is a view of a tensor needing no grad": (
        _input_saved_then_written,
        [_view_input(3, grad=False), _x(3)],
    ),
    # eager's versions: an input the caller wrote before the call counts from its version then
    "an input at version 3 saved, then written": (_input_saved_then_written, [_written_before(3), _x(3)]),
    "a non-leaf input at version 3, then written": (_input_saved_then_written, [_written_before(3, grad=True), _x(3)]),
    "a non-leaf input at version 3, written under no_grad": (
        _input_saved_then_written_under_no_grad,
        [_written_before(3, grad=True)],
    ),
}


@pytest.mark.parametrize("case", list(TEXT_CASES))
def test_the_error_is_eagers_text(case):
    fn, makers = TEXT_CASES[case]
    _check(fn, makers)


def _fake_cuda(*shapes, dtype):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        made = [torch.empty(shape, device="cuda", dtype=dtype, requires_grad=True) for shape in shapes]
        return made, torch.empty(shapes[0][:-1] + shapes[2][-1:], device="cuda", dtype=dtype)


def test_attention_on_cuda_is_taken_as_its_kernel_saves(monkeypatch):
    """On CUDA (fake tensors), attention saves what the kernel torch chooses saves: every tensor
    for a fused kernel (the choice replaced, as without a GPU none is available), and the math
    path's tensors where torch takes it (float64, which no fused kernel takes): eager's math path
    on the CPU, which does not upcast float64."""
    (q, k, v), out = _fake_cuda((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8), dtype=torch.float64)
    cpu = [torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    with sdpa_kernel(SDPBackend.MATH):
        math_saves = eager_saves(F.scaled_dot_product_attention, tuple(cpu), {})
    assert math_saves == {2}  # (v; the query and key are saved scaled, as copies)
    assert taken_as_saved(F.scaled_dot_product_attention, (q, k, v), {}, (out,)) == math_saves
    (q, k, v), out = _fake_cuda((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8), dtype=torch.bfloat16)
    monkeypatch.setattr(fused_attention, "_choose", lambda *args: fused_attention.FLASH)
    assert taken_as_saved(F.scaled_dot_product_attention, (q, k, v), {}, (out,)) == {0, 1, 2, 3}


def test_the_versions_are_read_at_each_call():
    """The versions in the error count from the input's version at each call, as eager's: a second
    call (a cache hit) with an input the caller wrote more often gives eager's numbers again, and
    the caller's writes between the call and the backward count too."""
    jfn = thunder_rs.jit(_input_saved_then_written)
    for times, after in ((3, 0), (5, 0), (3, 2)):
        messages = []
        for fn in (_input_saved_then_written, jfn):
            x, w = _written_before(3, times=times)(), torch.randn(3, requires_grad=True)
            out = fn(x, w)
            for _ in range(after):
                x.mul_(2)
            with pytest.raises(RuntimeError, match=LEADING) as caught:
                out.backward()
            messages.append(str(caught.value))
        assert messages[1].startswith(messages[0]), messages
        assert f"is at version {times + 1 + after}; expected version {times} instead" in messages[0]
    assert thunder_rs.compile_stats(jfn).cache_misses == 1


@pytest.mark.parametrize("make", [_x(3, grad=False), _non_leaf(3)], ids=["leaf", "non_leaf"])
def test_an_input_written_after_the_call_gives_eagers_text(make):
    """An input the call saved, written by the caller before the backward: eager's text, the node
    being the input's own (a non-leaf's last in-place op) and none for a leaf."""

    def f(x, w):
        return x * w

    messages = []
    for fn in (f, thunder_rs.jit(f)):
        torch.manual_seed(0)
        x, w = make(), torch.randn(3, requires_grad=True)
        out = fn(x, w)
        x.mul_(2)
        with pytest.raises(RuntimeError, match=LEADING) as caught:
            out.sum().backward()
        messages.append(str(caught.value))
    assert messages[1].startswith(messages[0]), messages


def _write_one_of_chunks(x):
    y = x * 1
    _, b = y.chunk(2)
    b.mul_(2)
    return y.sum()


def _write_one_of_unbinds(x):
    y = x * 1
    u = y.unbind(0)
    u[1].add_(1)
    return y.sum()


def _write_one_of_chunks_under_no_grad(x):
    y = x * 1
    _, b = y.chunk(2)
    with torch.no_grad():
        b.mul_(2)
    return y.sum()


def _write_an_element_of_one_of_splits(x):
    y = x * 1
    a, _ = y.split(2)
    a[0].mul_(2)  # (eager: "Output 0 of Select is a view and is being modified inplace")
    return y.sum()


def _write_a_view_of_a_view_of_one_of_chunks(x):
    y = x * 1
    a, _ = y.chunk(2)
    a.view(-1)[1:].mul_(2)
    return y.sum()


def _write_contiguous_of_one_of_splits(x):
    y = x * 1
    a, _ = y.split(2)
    a.contiguous().mul_(2)  # (a itself: eager names Split's output)
    return y.sum()


def _write_the_transpose_of_one_of_unbinds(x):
    y = x * 1
    a = y.unbind(1)[0]
    a.T.mul_(2)  # (a new view of a 1-d tensor, which the trace gives a's proxy: eager names Permute)
    return y.sum()


def _write_flatten_of_one_of_unbinds(x):
    y = x * 1
    a = y.unbind(1)[0]
    a.flatten().mul_(2)  # (a itself: eager names Unbind's output)
    return y.sum()


def _write_a_view_of_one_of_unbinds_under_no_grad(x):
    y = x * 1
    u = y.unbind(0)
    with torch.no_grad():
        u[1].view(3).mul_(2)
    return y.sum()


@pytest.mark.parametrize(
    "fn",
    [
        _write_one_of_chunks,
        _write_one_of_unbinds,
        _write_one_of_chunks_under_no_grad,
        _write_an_element_of_one_of_splits,
        _write_a_view_of_a_view_of_one_of_chunks,
        _write_a_view_of_one_of_unbinds_under_no_grad,
        _write_contiguous_of_one_of_splits,
        _write_the_transpose_of_one_of_unbinds,
        _write_flatten_of_one_of_unbinds,
    ],
)
def test_a_write_into_one_of_several_views_is_refused_as_eager(fn):
    """Eager refuses, at the write, a write autograd sees into one of several views a call made of
    memory that requires grad ('Output 1 of Split is a view and is being modified inplace'), or
    into a view of one (named by its own node: 'Output 0 of Select'); the compiled call ran it.
    Under no_grad both run."""
    x = torch.randn(4, 3, requires_grad=True)
    try:
        expected = fn(x)
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as caught:
            thunder_rs.jit(fn)(x)
        assert str(caught.value).startswith(str(e)), (str(e), str(caught.value))
        assert "at " + __file__ in str(caught.value)
        return
    torch.testing.assert_close(thunder_rs.jit(fn)(x), expected)


def _exp(x):
    return x.exp()


def _sigmoid_of_a_product(x):
    return (x * 2).sigmoid()  # (the compiled forward computes it into the product's buffer: sigmoid_)


def _relu_in_place(x):
    y = x * 2
    y.relu_()  # (relu_ saves its result: eager's node of y is Relu, at version 1)
    return y


def _qr_and_a_sum(x):
    q, r = torch.linalg.qr(x)
    return r, q.sum()


def _tanh_twice(x):
    y = torch.tanh(x + 1)
    return y, y * 3


@pytest.mark.parametrize("fn", [_exp, _sigmoid_of_a_product, _relu_in_place, _qr_and_a_sum, _tanh_twice])
@pytest.mark.parametrize("create_graph", [False, True])
def test_an_output_the_caller_writes_before_the_backward_gives_eagers_text(fn, create_graph):
    """An output the program made, which its node saved, written by the caller between the call and
    the backward: eager's text, naming the node that made it (Exp, Sigmoid, Relu, LinalgQr's output
    1) and eager's versions, where the compiled call named none and counted the writes of the
    buffer its forward computed the output into (sigmoid_: 'at version 2; expected version 1')."""
    messages = []
    for f in (fn, thunder_rs.jit(fn)):
        x = torch.randn(3, 3, requires_grad=True)
        out = f(x)
        first = out[0] if isinstance(out, tuple) else out
        first.mul_(2)
        total = sum(o.sum() for o in out) if isinstance(out, tuple) else out.sum()
        with pytest.raises(RuntimeError, match=LEADING) as caught:
            total.backward(create_graph=create_graph)
        messages.append(str(caught.value))
    assert messages[1].startswith(messages[0]), messages


def _scaled(x):
    return x * 2  # (mul by a number saves nothing)


def _sin(x):
    return x.sin()  # (saves its input, not its result)


@pytest.mark.parametrize("fn", [_scaled, _sin])
def test_an_output_the_caller_writes_that_no_node_reached_saved_leaves_the_gradients_eagers(fn):
    """Where eager's node of the written output saves no output, eager's backward runs: so does the
    compiled one, with eager's gradients."""
    grads = []
    for f in (fn, thunder_rs.jit(fn)):
        x = torch.randn(3, 3, requires_grad=True)
        torch.manual_seed(0)
        with torch.no_grad():
            x.copy_(torch.randn(3, 3))
        out = f(x)
        out.mul_(2)
        out.sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0])


def _attention_output_written(q, k, v):
    out = F.scaled_dot_product_attention(q * 1, k, v)
    out.mul_(2)
    return out.sum()


@pytest.mark.parametrize("head", [8, 12])
@pytest.mark.parametrize("backend", ["FLASH", "EFFICIENT", "CUDNN"])
def test_a_fused_kernels_saved_output_is_named_as_eagers_node_on_cuda(backend, head, monkeypatch):
    """On CUDA (fake tensors, the kernel chosen replaced) a write to attention's output, which the
    fused kernel saved, names the kernel's node as eager's error does (ScaledDotProductFlashAttention,
    ...), not the CPU kernel's a run again chose (ScaledDotProductFlashAttentionForCpu); for flash with
    a head size eager's composite pads to a multiple of 8, the padded output it saved ([.., 16]), and
    a write to the query, of which flash saved a padded copy, leaves the backward valid (eager's
    backward runs); the other kernels save the query itself."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(fused_attention, "_choose", lambda *args: getattr(fused_attention, backend))
    name = {"FLASH": "Flash", "EFFICIENT": "Efficient", "CUDNN": "Cudnn"}[backend]
    padded = head + (-head % 8 if backend == "FLASH" else 0)
    for fn, shape, node in (
        (_attention_output_written, padded, f"ScaledDotProduct{name}Attention"),
        (_attention_then_write_query, None if padded != head else head, "Mul"),
    ):
        with FakeTensorMode():
            q, k, v = (torch.empty(1, 2, 4, head, device="cuda", dtype=torch.half, requires_grad=True) for _ in "qkv")
            out = thunder_rs.jit(fn)(q, k, v)
            with torch.no_grad():
                if shape is None:
                    out.grad_fn.apply(torch.empty_like(out))
                    continue
                with pytest.raises(RuntimeError, match=LEADING) as caught:
                    out.grad_fn.apply(torch.empty_like(out))
        wanted = f"[torch.cuda.HalfTensor [1, 2, 4, {shape}]], which is output 0 of {node}, is at version 1; expected"
        assert wanted in str(caught.value), str(caught.value)


def test_asking_which_kernel_attention_ran_records_no_switches_into_the_program():
    """Learning what attention saved (a run again under ``sdpa_kernel`` of the kernel eager chose)
    sets and restores the kernel switches outside the program: the compiled call set them ten
    times per call (``_set_sdp_use_*`` recorded as the program's effects)."""
    q, k, v = (torch.randn(2, 4, 8, requires_grad=True) for _ in "qkv")
    jfn = thunder_rs.jit(_attention_then_write_query)
    with pytest.raises(RuntimeError, match=LEADING):
        jfn(q, k, v).backward()
    assert "_set_sdp_use" not in str(thunder_rs.last_traces(jfn)[-1])
