"""In-place writes inside a program to tensors eager's autograd saved for the backward
(``core.lang.saved_versions``): the compiled call's backward raises eager's "modified by an
inplace operation" error exactly where eager's does, and gives eager's gradients elsewhere.

Each case is a program with the inputs it takes, run eagerly and compiled: the backward of both
raises, or neither does and the gradients (and the inputs written) are equal."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thunder_rs
from thunder_rs.core.lang.saved_ops import SAVES_NO_OUTPUT, SAVES_NOTHING
from thunder_rs.core.lang.saved_versions import eager_saves
from thunder_rs.errors import ThunderNotImplementedError

LEADING = "one of the variables needed for gradient computation has been modified by an inplace operation"


def _x(*shape, grad=True):
    return lambda: torch.randn(*shape, requires_grad=grad)


def _sin_then_write(x):
    y = x * 1
    z = y.sin()
    y.mul_(2)
    return z.sum()


def _written_twice(x):
    y = x * 1
    z = y.sin()
    y.mul_(2)
    y.add_(1)
    return z.sum()


def _add_then_write(x):
    y = x * 1
    z = y + 1
    y.mul_(2)
    return z.sum()


def _scalar_mul_then_write(x):
    y = x * 1
    z = y * 2
    y.add_(1)
    return z.sum()


def _relu_then_write_input(x):
    y = x * 1
    z = y.relu()
    y.mul_(2)
    return z.sum()


def _relu_then_write_output(x):
    z = (x * 1).relu()
    z.mul_(2)
    return z.sum()


def _exp_then_write_output(x):
    z = x.exp()
    z.add_(1)
    return z.sum()


def _tanh_then_write_input(x):
    y = x * 1
    z = torch.tanh(y)
    y.add_(1)
    return z.sum()


def _relu_then_write(x):
    h = x * 1
    h.relu_()  # saves its result: h, after this write
    h.mul_(2)
    return h.sum()


def _sigmoid_then_relu_(x):
    return torch.relu_(torch.sigmoid(x)).sum()


def _linear_then_relu_(x, w):
    return F.relu(F.linear(x, w), inplace=True).sum()


def _sin_of_slice_then_write_other_slice(x):
    y = x * 1
    z = y[:2].sin()
    y[2].mul_(2)
    return z.sum()


def _sin_then_setitem(x):
    y = x * 1
    z = y.sin()
    y[0] = 0.0
    return z.sum()


def _mul_by_input_then_write_factor(x, b):
    a = x * 1
    c = a * b  # eager saves b (for a's gradient), not a (b needs none)
    a.add_(1)
    return c.sum()


def _mul_by_input_then_write_input(x, b):
    c = (x * 1) * b
    b.add_(1)
    return c.sum()


def _matmul_then_write(x, w):
    h = x * 1
    y = h @ w
    h.mul_(2)
    return y.sum()


def _softmax_then_write_output(x):
    s = torch.softmax(x, -1)
    s.mul_(2)
    return s.sum()


def _softmax_then_write_input(x):
    h = x * 1
    s = torch.softmax(h, -1)
    h.mul_(2)
    return s.sum()


def _layer_norm_then_write_input(x):
    h = x * 1
    y = F.layer_norm(h, (4,))
    h.add_(1)
    return y.sum()


def _index_then_write(x):
    h = x * 1
    y = h[torch.tensor([0, 2])]
    h.mul_(2)
    return y.sum()


def _mask_then_write(x):
    y = x * 1
    z = y[x > 0]  # (no meta kernel: run on CPU zeros) saves the indices, not y
    y.mul_(2)
    return z.sum()


def _index_put_into_saved(x):
    y = x * 1
    z = y.exp()
    y.index_put_((torch.tensor([0]),), torch.tensor([5.0]))
    return z.sum()


def _elu_inplace_then_write(x, w):
    y = F.elu(F.linear(x, w), inplace=True)  # linear saves no output; elu_ saves its result
    y.mul_(2)
    return y.sum()


def _leaky_relu_inplace_after_linear(x, w):
    return F.leaky_relu(F.linear(x, w), 0.1, inplace=True).sum()


def _batch_norm_input_written(x):
    h = x * 1
    y = F.batch_norm(h, torch.zeros(3), torch.ones(3), training=True)
    h.add_(1)
    return y.sum()


def _copy_into_saved(x):
    y = x * 1
    z = y.sin()
    y.copy_(torch.ones(3))
    return z.sum()


def _write_under_no_grad(x):
    y = x * 1
    z = y.sin()
    with torch.no_grad():
        torch.add(torch.ones(3), 1, out=y)
    return z.sum()


def _write_through_detach(x):
    y = x * 1
    z = y.sin()
    y.detach().mul_(2)
    return z.sum()


def _write_through_data(x):
    y = x * 1
    z = y.sin()
    y.data.mul_(2)
    return z.sum()


def _conv_then_write_input(x, w):
    h = x * 1
    y = F.conv2d(h, w)
    h.add_(1)
    return y.sum()


def _stale_node_not_in_the_loss(x):
    y = x * 1
    z = y.sin()  # noqa: F841 (computed, never used: no backward runs its node)
    y.mul_(2)
    return y.sum()


def _stale_node_only_through_a_comparison(x):
    y = x * 1
    z = y.sin()
    y.mul_(2)
    return (y * (z > 0)).sum()


class _Save(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * a

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return 2 * a * g


def _custom_function_then_write(x):
    y = x * 1
    z = _Save.apply(y)
    y.add_(1)
    return z.sum()


def _custom_function_then_write_other(x):
    y = x * 1
    z = _Save.apply(y * 2)
    y.add_(1)
    return z.sum()


def _attention_then_write_query(q, k, v):
    q = q * 1
    out = F.scaled_dot_product_attention(q, k, v)  # eager's CPU flash kernel saves the query
    q.mul_(2)
    return out.sum()


def _checkpointed_then_write(x):
    y = x * 1
    z = torch.utils.checkpoint.checkpoint(torch.sin, y, use_reentrant=False)
    y.mul_(2)
    return z.sum()


def _autocast_linear_then_write_input(x, w):
    h = x * 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = F.linear(h, w)  # saves the bfloat16 copy of h autocast made
    h.add_(1)
    return y.float().sum()


def _autocast_sigmoid_then_write_output(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        s = torch.sigmoid(x @ x.T)
        s.mul_(2)
    return s.float().sum()


CASES = {
    "sin saves its input": (_sin_then_write, [_x(3)]),
    "add saves nothing": (_add_then_write, [_x(3)]),
    "a saved tensor written twice": (_written_twice, [_x(3)]),
    "mul by a Python scalar saves nothing": (_scalar_mul_then_write, [_x(3)]),
    "relu saves its output, not its input": (_relu_then_write_input, [_x(3)]),
    "relu's output written": (_relu_then_write_output, [_x(3)]),
    "exp's output written": (_exp_then_write_output, [_x(3)]),
    "tanh's input written": (_tanh_then_write_input, [_x(3)]),
    "relu_ of sigmoid's output": (_sigmoid_then_relu_, [_x(3)]),
    "relu_'s result written": (_relu_then_write, [_x(3)]),
    "relu_ after linear": (_linear_then_relu_, [_x(2, 3), _x(4, 3)]),
    "a slice saved, another written": (_sin_of_slice_then_write_other_slice, [_x(3)]),
    "setitem into a saved tensor": (_sin_then_setitem, [_x(3)]),
    "mul: the factor that needs no gradient's partner": (_mul_by_input_then_write_factor, [_x(3), _x(3, grad=False)]),
    "mul: an input saved for the other's gradient": (_mul_by_input_then_write_input, [_x(3), _x(3, grad=False)]),
    "matmul's input written": (_matmul_then_write, [_x(2, 3), _x(3, 4)]),
    "softmax's output written": (_softmax_then_write_output, [_x(2, 3)]),
    "softmax's input written": (_softmax_then_write_input, [_x(2, 3)]),
    "layer_norm's input written": (_layer_norm_then_write_input, [_x(2, 4)]),
    "index saves its indices only": (_index_then_write, [_x(3)]),
    "copy_ into a saved tensor": (_copy_into_saved, [_x(3)]),
    "index_put_ into a saved tensor": (_index_put_into_saved, [_x(3)]),
    "elu_ after linear, its result written": (_elu_inplace_then_write, [_x(2, 3), _x(4, 3)]),
    "leaky_relu_ after linear": (_leaky_relu_inplace_after_linear, [_x(2, 3), _x(4, 3)]),
    "batch_norm's input written": (_batch_norm_input_written, [_x(4, 3)]),
    "a masked read saves its indices only": (_mask_then_write, [_x(6)]),
    "a write under no_grad (out=)": (_write_under_no_grad, [_x(3)]),
    "a write through detach()": (_write_through_detach, [_x(3)]),
    "conv2d's input written": (_conv_then_write_input, [_x(1, 2, 5, 5), _x(3, 2, 3, 3)]),
    "the stale node outside the loss": (_stale_node_not_in_the_loss, [_x(3)]),
    "the stale node only through a comparison": (_stale_node_only_through_a_comparison, [_x(3)]),
    "a custom Function's saved input written": (_custom_function_then_write, [_x(3)]),
    "a custom Function saved another tensor": (_custom_function_then_write_other, [_x(3)]),
    "attention's query written": (_attention_then_write_query, [_x(1, 2, 4, 8), _x(1, 2, 4, 8), _x(1, 2, 4, 8)]),
    "a checkpointed input written": (_checkpointed_then_write, [_x(3)]),
    "under autocast, an input cast for linear": (_autocast_linear_then_write_input, [_x(2, 3), _x(4, 3)]),
    "under autocast, sigmoid's output": (_autocast_sigmoid_then_write_output, [_x(2, 3)]),
}


def _outcome(fn, inputs):
    """``(error, gradients, inputs after)`` of ``fn(*inputs).backward()``."""
    try:
        fn(*inputs).backward()
    except RuntimeError as e:
        return str(e), None, [t.detach().clone() for t in inputs]
    return None, [t.grad for t in inputs], [t.detach().clone() for t in inputs]


def _made(makers):
    """The inputs, each as its maker made it (a non-leaf, a tensor written before the call), the
    same for each call."""
    torch.manual_seed(0)
    return [make() for make in makers]


def _check(fn, makers):
    eager = _outcome(fn, _made(makers))
    compiled = _outcome(thunder_rs.jit(fn), _made(makers))
    assert (eager[0] is None) == (compiled[0] is None), (eager[0], compiled[0])
    if eager[0] is not None:  # eager's text: the tensor, the node it is an output of, the versions, the hint
        assert compiled[0].startswith(eager[0]), (eager[0], compiled[0])
        return
    for a, b in zip(eager[1] + eager[2], compiled[1] + compiled[2]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("case", list(CASES))
def test_backward_raises_where_eager_raises(case):
    fn, makers = CASES[case]
    _check(fn, makers)


def _modules(*layers):
    return lambda: nn.Sequential(*(layer() for layer in layers))


@pytest.mark.parametrize(
    "make, raises",
    [
        (_modules(lambda: nn.Linear(3, 4), lambda: nn.ReLU(inplace=True)), False),
        (_modules(lambda: nn.Linear(3, 4), nn.Sigmoid, lambda: nn.ReLU(inplace=True)), True),
        (_modules(lambda: nn.Linear(3, 4), nn.Tanh, lambda: nn.Hardtanh(inplace=True)), True),
        (_modules(lambda: nn.Linear(3, 4), lambda: nn.BatchNorm1d(4), lambda: nn.ReLU(inplace=True)), False),
    ],
)
def test_modules_with_inplace_activations(make, raises):
    x = torch.randn(5, 3)
    outcomes = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = make()
        call = thunder_rs.jit(model) if compiled else model
        try:
            call(x).sum().backward()
        except RuntimeError as e:
            outcomes.append((str(e), None))
            continue
        outcomes.append((None, [p.grad for p in model.parameters()]))
    (eager, eager_grads), (ours, our_grads) = outcomes
    assert (eager is not None) == raises == (ours is not None), (eager, ours)
    if raises:
        assert ours.startswith(LEADING)
    else:
        for a, b in zip(eager_grads, our_grads):
            torch.testing.assert_close(a, b)


def test_forward_alone_never_raises():
    """Only a backward that runs the node raises: a training call whose result is not
    differentiated, and a call under no_grad, return eager's values."""
    x = torch.randn(3, requires_grad=True)
    jfn = thunder_rs.jit(_sin_then_write)
    torch.testing.assert_close(jfn(x), _sin_then_write(x))
    with torch.no_grad():
        torch.testing.assert_close(jfn(x), _sin_then_write(x))


def test_only_the_outputs_that_reach_the_node_raise():
    """With two outputs, a backward from the one computed without the stale node runs."""

    def f(x):
        y = x * 1
        z = y.sin()
        y.mul_(2)
        return z.sum(), y.sum()

    x = torch.randn(3, requires_grad=True)
    jfn = thunder_rs.jit(f)
    jfn(x)[1].backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    with pytest.raises(RuntimeError, match=LEADING):
        jfn(x)[0].backward()


def test_a_double_backward_raises_too():
    x = torch.randn(3, requires_grad=True)
    out = thunder_rs.jit(_sin_then_write)(x)
    with pytest.raises(RuntimeError, match=LEADING):
        torch.autograd.grad(out, x, create_graph=True)


def test_under_torch_func_grad_too():
    x = torch.randn(3)
    for fn in (_sin_then_write, thunder_rs.jit(_sin_then_write)):
        with pytest.raises(RuntimeError, match=LEADING):
            torch.func.grad(fn)(x)
    jfn = thunder_rs.jit(_add_then_write)
    torch.testing.assert_close(torch.func.grad(jfn)(x), torch.func.grad(_add_then_write)(x))


def test_under_saved_tensor_hooks_nothing_raises():
    """Eager checks no version of a tensor a pack hook took (``save_on_cpu``)."""
    x = torch.randn(3, requires_grad=True)
    jfn = thunder_rs.jit(_sin_then_write)
    with torch.autograd.graph.save_on_cpu():
        out = jfn(x)
    out.backward()
    torch.testing.assert_close(x.grad, torch.cos(x.detach()))


def test_a_write_through_data_is_refused_at_compile_time():
    """Eager's ``.data`` has a version counter of its own: its backward reads the values written
    through it unchecked, which a functional trace cannot: the compile refuses it, naming the write's
    line, where the program's outputs reach the node that saved the tensor (the refusal came from the
    backward); elsewhere, and under no_grad, the program runs."""
    x = torch.randn(3, requires_grad=True)
    _write_through_data(x).backward()  # eager: no error, cos of the doubled values
    torch.testing.assert_close(x.grad, torch.cos(2 * x.detach()))
    line = _write_through_data.__code__.co_firstlineno + 3
    with pytest.raises(ThunderNotImplementedError, match=rf"mul_ at .*test_inplace_saved_versions.py:{line} writes "):
        thunder_rs.jit(_write_through_data)(x)
    with torch.no_grad():
        torch.testing.assert_close(thunder_rs.jit(_write_through_data)(x), _write_through_data(x))

    def unreached(x):
        y = x * 1
        z = y.sin()  # noqa: F841 (no output reaches its node)
        y.data.mul_(2)
        return y.sum()

    x.grad = None
    thunder_rs.jit(unreached)(x).backward()
    torch.testing.assert_close(x.grad, torch.ones(3))


def _g(*shape):
    return torch.randn(*shape, requires_grad=True)


def _ng(*shape):  # a non-leaf that requires grad: what an in-place op may write
    return torch.randn(*shape, requires_grad=True) * 1


_T = torch.Tensor
#: A call of each op ``saved_ops`` answers for, all its tensors requiring grad (the most it saves).
SAMPLES = {
    _T.__add__: lambda: ((_g(3), _g(3)), {}),
    _T.__radd__: lambda: ((_g(3), _g(3)), {}),
    _T.__iadd__: lambda: ((_ng(3), _g(3)), {}),
    _T.__sub__: lambda: ((_g(3), _g(3)), {}),
    _T.__rsub__: lambda: ((_g(3), _g(3)), {}),
    _T.__isub__: lambda: ((_ng(3), _g(3)), {}),
    _T.__neg__: lambda: ((_g(3),), {}),
    _T.add: lambda: ((_g(3), _g(3)), {"alpha": 2}),
    _T.add_: lambda: ((_ng(3), _g(3)), {}),
    _T.sub: lambda: ((_g(3), _g(3)), {}),
    _T.sub_: lambda: ((_ng(3), _g(3)), {}),
    _T.neg: lambda: ((_g(3),), {}),
    torch.add: lambda: ((_g(3), _g(3)), {}),
    torch.sub: lambda: ((_g(3), _g(3)), {}),
    torch.neg: lambda: ((_g(3),), {}),
    _T.view: lambda: ((_g(2, 3), (6,)), {}),
    _T.reshape: lambda: ((_g(2, 3).t(), (6,)), {}),
    _T.flatten: lambda: ((_g(2, 3),), {}),
    _T.transpose: lambda: ((_g(2, 3), 0, 1), {}),
    _T.permute: lambda: ((_g(2, 3), (1, 0)), {}),
    _T.unsqueeze: lambda: ((_g(3), 0), {}),
    _T.squeeze: lambda: ((_g(1, 3),), {}),
    _T.contiguous: lambda: ((_g(2, 3).t(),), {}),
    _T.clone: lambda: ((_g(3),), {}),
    _T.expand: lambda: ((_g(1, 3), (2, 3)), {}),
    _T.float: lambda: ((_g(3).double(),), {}),
    _T.to: lambda: ((_g(3), torch.float64), {}),
    torch.reshape: lambda: ((_g(2, 3), (3, 2)), {}),
    torch.flatten: lambda: ((_g(2, 3),), {}),
    torch.transpose: lambda: ((_g(2, 3), 0, 1), {}),
    torch.permute: lambda: ((_g(2, 3), (1, 0)), {}),
    torch.cat: lambda: (([_g(3), _g(3)],), {}),
    torch.stack: lambda: (([_g(3), _g(3)],), {}),
    torch.clone: lambda: ((_g(3),), {}),
    F.dropout: lambda: ((_g(4), 0.5, True), {}),
    F.linear: lambda: ((_g(2, 5, 3), _g(4, 3), _g(4)), {}),
    torch.conv1d: lambda: ((_g(1, 2, 5), _g(3, 2, 3), _g(3)), {}),
    torch.conv2d: lambda: ((_g(1, 2, 5, 5), _g(3, 2, 3, 3), _g(3)), {}),
    torch.conv3d: lambda: ((_g(1, 2, 4, 4, 4), _g(3, 2, 3, 3, 3)), {}),
    F.conv_transpose1d: lambda: ((_g(1, 2, 5), _g(2, 3, 3)), {}),
    F.conv_transpose2d: lambda: ((_g(1, 2, 5, 5), _g(2, 3, 3, 3)), {}),
    F.batch_norm: lambda: ((_g(4, 3), torch.zeros(3), torch.ones(3), _g(3), _g(3), True), {}),
    F.layer_norm: lambda: ((_g(2, 4), (4,), _g(4), _g(4)), {}),
    F.group_norm: lambda: ((_g(2, 4, 3), 2, _g(4), _g(4)), {}),
    F.embedding: lambda: ((torch.tensor([0, 2]), _g(5, 3)), {}),
    F.gelu: lambda: ((_g(3),), {}),
    F.silu: lambda: ((_g(3),), {}),
    _T.__mul__: lambda: ((_g(3), _g(3)), {}),
    _T.__rmul__: lambda: ((_g(3), _g(3)), {}),
    _T.mul: lambda: ((_g(3), _g(3)), {}),
    torch.mul: lambda: ((_g(3), _g(3)), {}),
    _T.__matmul__: lambda: ((_g(2, 3), _g(3, 4)), {}),
    torch.matmul: lambda: ((_g(2, 2, 3), _g(3, 4)), {}),
    torch.mm: lambda: ((_g(2, 3), _g(3, 4)), {}),
    torch.bmm: lambda: ((_g(2, 2, 3), _g(2, 3, 4)), {}),
}


def test_the_known_answers_are_eagers():
    """Each op ``saved_ops`` answers for without a meta run saves what it says in eager: nothing,
    or none of its outputs; and the meta run that answers for the others finds what eager saves."""
    assert set(SAMPLES) == SAVES_NOTHING | SAVES_NO_OUTPUT
    for func, sample in SAMPLES.items():
        args, kwargs = sample()
        taken = len({id(t) for t in _tensors((args, kwargs))})
        saved = eager_saves(func, args, kwargs)
        assert not saved if func in SAVES_NOTHING else max(saved, default=-1) < taken, (func, saved)
    x, w = _g(2, 3), _g(4, 3)
    assert eager_saves(F.linear, (x, w), {}) == {0, 1}  # (a view of each)
    assert eager_saves(F.linear, (x, w.detach()), {}) == {1}  # x needs no saving: w needs no gradient
    assert eager_saves(torch.sigmoid, (x,), {}) == {1}  # its result
    assert eager_saves(torch.sin, (x,), {}) == {0}
    assert eager_saves(torch.relu_, (x * 1,), {}) == {0}  # its result, the tensor it wrote
    q, k, v = _g(1, 2, 4, 8), _g(1, 2, 4, 8), _g(1, 2, 4, 8)
    node = F.scaled_dot_product_attention(q, k, v).grad_fn  # (CPU's flash kernel: every tensor)
    assert node._saved_query is q and node._saved_key is k and node._saved_value is v


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return _tensors(list(value.values()))
    return []
