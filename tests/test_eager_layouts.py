"""Layouts of the tensors a program computes, as eager's (``core.lang.eager_layouts``): where an
op's inputs are laid out in another order than their dims (channels_last, transposed), eager's
output keeps that order, and the trace decides from it where ``reshape`` and ``contiguous()``
copy, where ``view`` raises, and what ``stride()`` and ``is_contiguous()`` answer. The formats a
program asks for (``contiguous``/``to``/``clone`` with ``memory_format``) are eager's too.

Before, a computed tensor was taken to be contiguous: ``y.reshape(-1)`` of a channels_last ``y``
was a view, so a write through it changed ``y`` (eager's reshape copies), ``view`` ran where
eager raises, and ``contiguous(memory_format=torch.channels_last)`` and ``to(memory_format=...)``
returned the tensor as it was: a channels_last CNN ran contiguous convolutions.
"""

import copy

import pytest
import torch

import thunder_rs
from test_layout_fidelity import LAYOUTS, assert_like_eager, channels_last

CL = torch.channels_last

pytestmark = pytest.mark.usefixtures("one_thread")


def written_through_a_reshape(x):
    y = x.exp()
    z = y.reshape(-1)
    z.mul_(2)
    return y, z


def written_through_contiguous(x):
    y = x * 2
    y.contiguous().add_(1)
    return y


def written_through_flatten(x):
    y = (x + 1).flatten()
    y.zero_()
    return x


def strides_read(x):
    y = x.sin()
    return y.stride(), y.is_contiguous(), (y @ y.transpose(-1, -2)).is_contiguous()


def branch_on_layout(x):
    y = x.relu()
    return y.view(-1) * 2 if y.is_contiguous() else y.reshape(-1) * 3


@pytest.mark.parametrize("make", LAYOUTS)
@pytest.mark.parametrize(
    "program",
    [written_through_a_reshape, written_through_contiguous, written_through_flatten, branch_on_layout],
)
def test_writes_and_branches_through_a_computed_tensor_see_eagers_copies(program, make):
    x = make()
    expected, actual = program(x.clone()), thunder_rs.jit(program)(x.clone())
    for a, e in zip(actual, expected) if isinstance(expected, tuple) else [(actual, expected)]:
        assert_like_eager(a, e)


@pytest.mark.parametrize("make", LAYOUTS)
def test_stride_and_is_contiguous_of_a_computed_tensor_are_eagers(make):
    x = make()
    assert thunder_rs.jit(strides_read)(x) == strides_read(x)


@pytest.mark.parametrize("make", LAYOUTS)
def test_a_view_eager_refuses_on_a_computed_tensor_raises_as_eager(make):
    def viewed(x):
        return x.exp().view(-1)

    x = make()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        viewed(x)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        thunder_rs.jit(viewed)(x)


FORMATS = {
    "contiguous(channels_last)": lambda x: x.contiguous(memory_format=CL) * 2,
    "to(channels_last)": lambda x: x.to(memory_format=CL).relu(),
    "to(float64, channels_last)": lambda x: x.to(torch.float64, memory_format=CL),
    "to(copy, channels_last)": lambda x: x.to(memory_format=CL, copy=True),
    "clone(channels_last).add_": lambda x: x.clone(memory_format=CL).add_(1),
    "conv2d of to(channels_last)": lambda x: torch.nn.functional.conv2d(x.to(memory_format=CL), x[:2, :, :2, :2]),
    "empty_like(channels_last).copy_": lambda x: torch.empty_like(x, memory_format=CL).copy_(x),
    "channels_last then contiguous": lambda x: x.contiguous(memory_format=CL).exp().contiguous(),
}


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("arranged", [False, True], ids=["contiguous", "channels_last"])
def test_memory_formats_a_program_asks_for_are_eagers(name, arranged):
    program = FORMATS[name]
    x = channels_last() if arranged else torch.randn(2, 3, 4, 5)
    x.requires_grad_()
    expected, actual = program(x), thunder_rs.jit(program)(x)
    assert_like_eager(actual.detach(), expected.detach())
    cotangent = torch.randn_like(expected)
    torch.testing.assert_close(torch.autograd.grad(actual, x, cotangent), torch.autograd.grad(expected, x, cotangent))


def test_channels_last_3d_is_eagers():
    x = torch.randn(2, 3, 4, 5, 6)
    for program in (
        lambda x: x.contiguous(memory_format=torch.channels_last_3d).sin(),
        lambda x: x.to(memory_format=torch.channels_last_3d),
    ):
        assert_like_eager(thunder_rs.jit(program)(x), program(x))


def test_to_a_format_the_tensor_has_returns_the_tensor_itself():
    """Eager's ``to`` aliases a tensor whose strides suggest the format: a write through the result
    writes the caller's tensor."""

    def write(x):
        y = x.to(memory_format=CL)
        y.add_(1)
        return y

    for make in (channels_last, lambda: torch.randn(2, 3, 4, 5)):
        x, x_eager = make(), None
        x_eager = x.clone(memory_format=torch.preserve_format)
        expected, actual = write(x_eager), thunder_rs.jit(write)(x)
        assert_like_eager(actual, expected)
        assert_like_eager(x, x_eager)


class ChannelsLastNet(torch.nn.Module):
    """A small CNN whose head reshapes its feature map (a copy in eager: channels_last)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)
        )
        self.head = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        features = self.body(x)
        flat = features.reshape(features.shape[0], -1)
        return self.head(flat), features


def train_channels_last_net_over_batches(dtype=torch.float64, executors=None):
    """``ChannelsLastNet`` trained at batch sizes 2, 3 and 5 beside an eager copy: outputs,
    gradients and their strides as eager's, in 2 compiles (the batch symbolic from the second)."""
    torch.manual_seed(0)
    model = ChannelsLastNet().to(dtype).to(memory_format=CL)
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model, executors=executors)
    for batch in (2, 3, 5):
        x = torch.randn(batch, 3, 6, 6, dtype=dtype).to(memory_format=CL)
        (out, features), (out_e, features_e) = jmodel(x), eager(x)
        assert_like_eager(features, features_e)
        torch.testing.assert_close(out, out_e)
        (out.sum() + features.square().mean()).backward()
        (out_e.sum() + features_e.square().mean()).backward()
        for p, p_e in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, p_e.grad)
            assert p.grad.stride() == p_e.grad.stride()
    assert thunder_rs.compile_stats(jmodel).cache_misses == 2


def test_a_channels_last_cnn_trains_as_eager_over_image_sizes():
    train_channels_last_net_over_batches()


F = torch.nn.functional

#: Ops of each layout rule (``thunder_rs/torch/layout_rules.py``) on an image batch ``x``.
IMAGE_OPS = {
    "exp": torch.exp,
    "mul by contiguous": lambda x: x * torch.ones(x.shape),
    "contiguous times it": lambda x: torch.ones(x.shape) * x,
    "add of a channel vector": lambda x: x + torch.ones(x.shape[1], 1, 1),
    "where": lambda x: torch.where(x > 0, x, torch.zeros(x.shape[-1])),
    "gelu": F.gelu,
    "mse_loss none": lambda x: F.mse_loss(x, torch.zeros(x.shape), reduction="none"),
    "to float64": lambda x: x.to(torch.float64),
    "dropout eval": lambda x: F.dropout(x, 0.5, training=False) * 1,
    "conv2d": lambda x: F.conv2d(x, torch.ones(2, x.shape[1], 3, 3)),
    "conv2d of a channels_last weight": lambda x: F.conv2d(
        x.contiguous(), torch.ones(2, x.shape[1], 3, 3).contiguous(memory_format=CL)
    ),
    "max_pool2d": lambda x: F.max_pool2d(x, 2),
    "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, 2),
    "batch_norm": lambda x: F.batch_norm(x, None, None, training=True),
    "group_norm": lambda x: F.group_norm(x, 1),
    "interpolate": lambda x: F.interpolate(x, scale_factor=2.0, mode="bilinear"),
    "pixel_shuffle": lambda x: F.pixel_shuffle(x.repeat(1, 4, 1, 1), 2),
    "sort": lambda x: torch.sort(x, dim=1)[0],
    "index_fill": lambda x: x.index_fill(1, torch.tensor([0]), 0.0),
    "cat of two alike": lambda x: torch.cat([x, x.exp()], 1),
    "cat with a contiguous tensor": lambda x: torch.cat([x, torch.ones(x.shape)], 1),
    "softmax (contiguous)": lambda x: F.softmax(x, 1),
    "layer_norm (contiguous)": lambda x: F.layer_norm(x, x.shape[-1:]),
    "sum over channels (contiguous)": lambda x: x.sum(1),
}


def _told_strides(op):
    def program(x):
        y = op(x)
        return y.stride(), y.is_contiguous(), y.is_contiguous(memory_format=CL) if y.ndim == 4 else None

    return program


@pytest.mark.parametrize("name", list(IMAGE_OPS))
@pytest.mark.parametrize(
    "make", [channels_last, lambda: torch.randn(2, 3, 4, 5).permute(0, 1, 3, 2)], ids=["channels_last", "permuted"]
)
def test_the_strides_a_trace_tells_are_eagers(name, make):
    program = _told_strides(IMAGE_OPS[name])
    x = make()
    assert thunder_rs.jit(program)(x) == program(x)


@pytest.mark.parametrize(
    "program",
    [
        lambda a, b: a * b,
        lambda a, b: b - a,
        lambda a, b: torch.where(a > b, a, b),
        lambda a, b: torch.addcmul(a, a, b),
    ],
)
def test_pointwise_ops_of_mixed_layouts_order_dims_as_tensor_iterator(program):
    """The first operand whose strides tell two dims apart orders them; broadcast dims tell nothing."""
    layouts = [channels_last(), torch.randn(2, 3, 4, 5), torch.randn(3, 4, 1), torch.randn(5, 4).t()]
    for a in layouts:
        for b in layouts:
            told = _told_strides(lambda x: program(x, b))
            assert thunder_rs.jit(told)(a) == told(a)


IN_PLACE = {
    "masked_fill_ of a transposed clone": (lambda x: x.t().clone().masked_fill_(x.t() > 0, 0), "transposed"),
    "masked_fill_ of a channels_last product": (lambda x: (x * 2).masked_fill_(x > 1, 0), "channels_last"),
    "index_fill_": (lambda x: (x * 2).index_fill_(1, torch.tensor([0]), 0.0), "channels_last"),
    "relu_": (lambda x: (x * 2).relu_(), "channels_last"),
    "relu(inplace=True)": (lambda x: F.relu(x * 2, inplace=True), "channels_last"),
    "add_ of a contiguous tensor": (lambda x: (x * 2).add_(torch.ones(x.shape)), "channels_last"),
    "mul_ by an int": (lambda x: (x * 2).mul_(3), "permuted"),
}
_MAKERS = {"transposed": lambda: torch.randn(4, 3), "channels_last": channels_last, "permuted": LAYOUTS[2].values[0]}


@pytest.mark.parametrize("name", list(IN_PLACE))
def test_an_in_place_op_on_a_computed_tensor_keeps_its_layout_with_one_kernel(name):
    """Eager writes into the tensor; its out-of-place form may lay out otherwise (``masked_fill``
    is contiguous): the trace selects the value into the tensor's layout, only where the op's
    rule does not already give it."""
    program, layout = IN_PLACE[name]
    x = _MAKERS[layout]().requires_grad_()
    jfn = thunder_rs.jit(program)
    expected, actual = program(x), jfn(x)
    assert_like_eager(actual.detach(), expected.detach())
    torch.testing.assert_close(torch.autograd.grad(actual.sum(), x), torch.autograd.grad(expected.sum(), x))
    selects = str(thunder_rs.last_traces(jfn)[-1]).count("full((), False")  # ``inplace._nowhere``
    assert selects == (1 if "masked_fill_" in name else 0)


#: Ops whose out-of-place forms write a new contiguous tensor whatever their operand's layout.
CONTIGUOUS_RESULTS = {
    "masked_fill": lambda x: (x.t() * 2).masked_fill(x.t() > 0, 0.0),
    "cumsum": lambda x: (x.t() * 2).cumsum(0),
    "tril": lambda x: (x.t() * 2).tril(),
    "addmm": lambda x: torch.addmm(x.t() * 2, x, x),
}


@pytest.mark.parametrize("name", list(CONTIGUOUS_RESULTS))
def test_an_op_writing_a_new_contiguous_tensor_is_not_computed_into_a_dying_operand(name):
    """The generated code writes an op's result into a dying intermediate only where eager's
    result would have its layout: not a transposed one's for these."""
    program = CONTIGUOUS_RESULTS[name]
    x = torch.randn(4, 4)
    assert_like_eager(thunder_rs.jit(program)(x), program(x))


@pytest.mark.parametrize(
    "make",
    [lambda s: torch.randn(2, 3, s, s + 1).contiguous(memory_format=CL), lambda s: torch.randn(s + 1, s).t()],
    ids=["channels_last", "transposed"],
)
def test_random_draws_like_a_tensor_laid_out_otherwise_are_eagers_at_symbolic_sizes(make):
    """Eager's ``rand_like`` fills its output in memory order (channels_last: N, H, W, C); dropout
    in training draws so. The symbolic variant draws in that order too, and stays symbolic (the
    layout had sent it to an eager call, which specialised the sizes)."""
    weight = torch.ones(1, requires_grad=True)

    def program(x):
        y = (x * weight).relu() + 1
        return F.dropout(y, 0.5), torch.rand_like(y)

    jfn = thunder_rs.jit(program)
    for size in (6, 8, 10, 12):
        x = make(size)
        torch.manual_seed(0)
        expected = program(x)
        torch.manual_seed(0)
        for actual, e in zip(jfn(x), expected):
            assert_like_eager(actual.detach(), e.detach())
    assert thunder_rs.compile_stats(jfn).cache_misses == 2


def test_a_channels_last_squeezenet_trains_as_eager_over_image_sizes_in_two_compiles():
    """torchvision's SqueezeNet in channels_last: its fire modules concatenate channels_last maps
    (``cat`` keeps the format), and its classifier's dropout draws in the maps' memory order."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.squeezenet1_0(num_classes=10).double().train().to(memory_format=CL)
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for height, width in ((64, 64), (96, 80), (112, 128)):
        x = torch.randn(2, 3, height, width, dtype=torch.float64).contiguous(memory_format=CL)
        torch.manual_seed(1)
        expected = eager(x)
        torch.manual_seed(1)
        actual = jmodel(x)
        assert_like_eager(actual.detach(), expected.detach())
        actual.square().mean().backward()
        expected.square().mean().backward()
        for p, p_e in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, p_e.grad)
            assert p.grad.stride() == p_e.grad.stride()
        model.zero_grad(), eager.zero_grad()
    assert thunder_rs.compile_stats(jmodel).cache_misses == 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_channels_last_blocks_keep_eagers_layouts_with_the_default_executors(dtype):
    """nvFuser's regions (the default CUDA path) hand on tensors in the layouts eager's kernels
    make: a channels_last conv block's output and gradients, a pointwise chain's output, and a
    reshape the trace took for a copy."""
    torch.manual_seed(0)
    block = ChannelsLastNet().cuda().to(dtype).to(memory_format=CL)
    eager = copy.deepcopy(block)
    x = torch.randn(4, 3, 6, 6, device="cuda", dtype=dtype).contiguous(memory_format=CL)
    (out, features), (out_e, features_e) = thunder_rs.jit(block)(x), eager(x)
    assert features.stride() == features_e.stride()
    torch.testing.assert_close(out, out_e, **({"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}))
    (out.float().sum() + features.float().square().mean()).backward()
    (out_e.float().sum() + features_e.float().square().mean()).backward()
    for p, p_e in zip(block.parameters(), eager.parameters()):
        assert p.grad.stride() == p_e.grad.stride()
    for program in (lambda x: (x.relu() * 2 + 1).sin(), lambda x: written_through_a_reshape(x)[0]):
        assert_like_eager(thunder_rs.jit(program)(x).float(), program(x).float())


def _spd(n: int = 3) -> torch.Tensor:
    a = torch.randn(n, n, dtype=torch.float64)
    return a @ a.T + n * torch.eye(n, dtype=torch.float64)


LINALG = {
    "inv": lambda a: (torch.linalg.inv(a),),
    "inv batched": lambda a: (torch.linalg.inv(a.expand(2, 3, 3) + 0),),
    "solve": lambda a: (torch.linalg.solve(a, a[:, :2]),),
    "qr": lambda a: tuple(torch.linalg.qr(a)),
    "svd": lambda a: tuple(torch.linalg.svd(a)),
    "legacy svd": lambda a: tuple(torch.svd(a)),
    "eigh": lambda a: tuple(torch.linalg.eigh(a)),
    "cholesky": lambda a: (torch.linalg.cholesky(a),),
    "lu_factor": lambda a: tuple(torch.linalg.lu_factor(a)),
    "inv then exp": lambda a: (torch.linalg.inv(a).exp(),),
}


@pytest.mark.parametrize("name", list(LINALG))
def test_linalgs_results_are_column_major_as_eagers(name):
    """LAPACK's results are column-major whatever the input's layout: the trace tells eager's
    strides, so a reshape of one is a copy, and a view raises as in eager."""
    op = LINALG[name]

    def program(a):
        return [t.stride() for t in op(a)]

    a = _spd()
    assert thunder_rs.jit(program)(a) == program(a)


def test_a_view_of_an_inverse_raises_as_eager_and_a_reshape_copies():
    def viewed(a):
        return torch.linalg.inv(a).view(-1)

    def written(a):
        inverse = torch.linalg.inv(a)
        inverse.reshape(-1).zero_()
        return inverse

    a = _spd()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        viewed(a)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        thunder_rs.jit(viewed)(a)
    assert_like_eager(thunder_rs.jit(written)(a), written(a))


@pytest.mark.parametrize(
    "op",
    [
        lambda x: torch.as_strided(x, (3, 3), (1, 2)),
        lambda x: x.unfold(1, 2, 1),
        lambda x: x.unfold(0, 2, 2),
        lambda x: x.adjoint(),
    ],
    ids=["as_strided", "unfold", "unfold step 2", "adjoint"],
)
def test_views_of_their_own_strides_tell_them(op):
    """Views whose strides are not their input's (eager's ``as_strided`` takes them as given,
    ``unfold`` windows overlap): the trace told the input's, so a ``reshape`` or ``contiguous()``
    of a window decided as if it were its input."""

    def program(x):
        y = op(x)
        return y.stride(), y.is_contiguous(), y.reshape(-1).sum()

    x = torch.randn(4, 6)
    told, expected = thunder_rs.jit(program)(x), program(x)
    assert told[:2] == expected[:2]
    torch.testing.assert_close(told[2], expected[2])


@pytest.mark.parametrize(
    "shape, window, transposed",
    [
        ((2, 10, 3), (1, 4, 2), False),
        ((2, 10, 3), (1, 4, 2), True),
        ((4, 9), (0, 2, 2), True),
        ((6,), (0, 6, 1), False),
    ],
    ids=["dim 1", "dim 1 of a transposed input", "overlapping steps of dim 0", "one window"],
)
def test_unfold_under_autograd_returns_eagers_views_and_gradients(shape, window, transposed):
    """``Tensor.unfold`` of a tensor that requires grad: the windows are eager's view of the input
    (its strides, and those of a product of them), and the gradient is eager's
    ``unfold_backward``'s, values and strides; the decomposition gathered a contiguous copy."""

    def program(x):
        y = x.unfold(*window)
        return y, y * 2, y.sum(-1)

    x = torch.randn(*shape)
    if transposed:
        x = x.transpose(0, -1).contiguous().transpose(0, -1)
    sides = []
    for fn in (program, thunder_rs.jit(program)):
        leaf = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
        outs = fn(leaf)
        torch.autograd.backward(outs, [torch.ones_like(o) * (i + 1) for i, o in enumerate(outs)])
        sides.append((*outs, leaf.grad))
    for got, expected in zip(*sides):
        assert got.stride() == expected.stride()
        assert torch.equal(got, expected)


@pytest.mark.parametrize(
    "program, shape",
    [
        (lambda x: x.as_strided((3, 4), (1, 3)), (12,)),
        (lambda x: torch.as_strided(x * 2, (3, 2), (1, 3), 1).exp(), (2, 4)),
        (lambda x: x.as_strided((30, 20), (3, 1)).exp(), (120,)),  # overlapping windows
        (lambda x: x.as_strided((7, 5, 1, 3), (0, 1, 4, 0)) * 1.1, (5,)),  # stride 0, size 1
        (lambda x: x.as_strided((2, 2), (1, 2)) * -0.0, (4,)),  # signed zeros of the gradient
        (lambda x: x.expand(3, 4).contiguous().as_strided((4, 3), (1, 4)), (4,)),
        (lambda x: x.as_strided((3, 1), (2, 1)).expand(3, 4) * 2, (6,)),
        (lambda x: x.as_strided((0, 3), (1, 1)), (4,)),
    ],
    ids=["transposed", "of a computed tensor", "overlapping", "stride 0", "-0.0", "of expand", "expanded", "empty"],
)
def test_as_strided_under_autograd_returns_eagers_views_and_gradients(program, shape):
    """``as_strided`` of a tensor that requires grad: eager's view with the strides asked for (the
    decomposition gathered a contiguous copy), and eager's ``as_strided_backward``: windows read
    twice add their cotangents, bit for bit, strides included."""
    x = torch.randn(*shape)
    sides = []
    for fn in (program, thunder_rs.jit(program)):
        leaf = x.clone().requires_grad_()
        out = fn(leaf)
        (grad,) = torch.autograd.grad(out, leaf, torch.randn(out.shape, generator=torch.Generator().manual_seed(0)))
        sides.append((out, grad))
    for got, expected in zip(*sides):
        assert got.stride() == expected.stride()
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


def _t(*shape):
    """A float64 tensor of ``shape`` laid out with its dims' memory order reversed."""
    return torch.randn(*reversed(shape), dtype=torch.float64).permute(*reversed(range(len(shape))))


#: Ops whose layout their arguments or their decomposition decide (``layout_rules``' rule
#: functions), with arguments laid out otherwise than contiguously: the trace told them contiguous
#: (or column-major), where eager's are not.
ARGUMENT_RULES = {
    "inner of a 0-dim tensor": (torch.inner, lambda: (torch.tensor(2.0, dtype=torch.float64), _t(3, 4))),
    "addr": (torch.addr, lambda: (_t(3, 4), torch.randn(3, dtype=torch.float64), torch.randn(4, dtype=torch.float64))),
    "kron": (torch.kron, lambda: (_t(2, 3), _t(3, 2))),
    "diff": (torch.diff, lambda: (_t(3, 4),)),
    "diff n=2 dim 0": (lambda x: torch.diff(x, 2, 0), lambda: (_t(4, 3),)),
    "diff n=0": (lambda x: torch.diff(x, 0), lambda: (_t(3, 4),)),
    "diff with prepend": (lambda x: torch.diff(x, prepend=x), lambda: (_t(3, 4),)),
    "quantile": (lambda x, q: torch.quantile(x, q, 0, True), lambda: (_t(4, 3), torch.rand(4, dtype=torch.float64))),
    "nanquantile (contiguous)": (
        lambda x, q: torch.nanquantile(x, q, 1),
        lambda: (torch.randn(4, 3, dtype=torch.float64), torch.rand(2, dtype=torch.float64)),
    ),
    "quantile of a scalar q": (lambda x: torch.quantile(x, 0.3, 0), lambda: (_t(4, 3),)),
    "solve left=False": (lambda a, b: torch.linalg.solve(a, b, left=False), lambda: (_spd().t(), _t(2, 3))),
    "solve_ex left=False": (lambda a, b: torch.linalg.solve_ex(a, b, left=False)[0], lambda: (_spd(), _t(2, 3))),
    "lu_solve left=False": (
        lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, left=False),
        lambda: (_spd(), _t(2, 3)),
    ),
    "solve_triangular left=False": (
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=True, left=False),
        lambda: (_spd().triu(), _t(2, 3)),
    ),
    "svd without uv": (lambda a: torch.svd(a, compute_uv=False), lambda: (_t(4, 3),)),
    "max_unpool2d": (
        lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2),
        lambda: (torch.randn(2, 3, 4, 4, dtype=torch.float64).contiguous(memory_format=CL),),
    ),
    "atleast_3d of several": (torch.atleast_3d, lambda: (torch.tensor(1.0), torch.randn(3), _t(2, 3))),
}


@pytest.mark.parametrize("name", list(ARGUMENT_RULES))
def test_layouts_their_arguments_or_decompositions_decide_are_told_as_eagers(name):
    """The strides the trace tells (``stride()`` read while traced), against eager's: ``left=False``
    solves are row-major, ``svd(compute_uv=False)``'s V column-major, a 1-D ``q``'s quantiles
    innermost, ``kron``/``addr``/``diff`` keep their operands' order, ``atleast_3d`` of several
    tensors views each."""
    op, make = ARGUMENT_RULES[name]

    def program(*args):
        out = op(*args)
        return [(t.stride(), t.is_contiguous()) for t in (out if isinstance(out, (tuple, list)) else (out,))]

    args = make()
    assert thunder_rs.jit(program)(*args) == program(*args)


@pytest.mark.parametrize("name", ["kron", "diff", "quantile", "solve left=False", "max_unpool2d"])
def test_a_write_through_a_reshape_of_such_a_result_and_its_view_are_eagers(name):
    """Where eager's result is not contiguous, its ``reshape(-1)`` copies (a write through it
    leaves it as it was) and ``view(-1)`` raises; where it is (``solve(left=False)``), both view."""
    op, make = ARGUMENT_RULES[name]

    def written(*args):
        y = op(*args) * 1  # (keeps the layout: a pointwise op)
        y.reshape(-1).zero_()
        return y

    def viewed(*args):
        return op(*args).view(-1)

    args = make()
    assert_like_eager(thunder_rs.jit(written)(*args), written(*args))
    try:
        expected = viewed(*args)
    except RuntimeError:
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            thunder_rs.jit(viewed)(*args)
    else:
        torch.testing.assert_close(thunder_rs.jit(viewed)(*args), expected)


def test_writes_through_atleast_3d_of_several_tensors_and_diff_n0_are_eagers():
    """``atleast_3d(a, b, c)`` views each of its tensors (the trace linked only the first's); a
    ``diff`` with ``n=0`` is a copy (the trace returned the input itself)."""

    def program(a, b, c):
        _, y, z = torch.atleast_3d(a, b, c)
        y.add_(1)
        z.mul_(2)
        torch.diff(c, 0).zero_()
        return a, b, c

    args = (torch.tensor(1.0), torch.randn(3), _t(2, 3))
    expected = program(*(t.clone() for t in args))
    for got, want in zip(thunder_rs.jit(program)(*(t.clone() for t in args)), expected):
        torch.testing.assert_close(got, want)


def _split_heads(x):
    """``[B, T, H * D]`` as ``[B, H, T, D]`` the way models split heads: a view laid out ``[B, T, H, D]``."""
    return x.view(2, 5, 3, 4).transpose(1, 2)


#: name -> (query, key, value, keywords): on the CPU, torch's flash kernel lays its output out as
#: the query (torch 2.15); the math path (dropout, another value head size) returns a matmul's.
ATTENTION = {
    "heads split from a projection": (lambda: _split_heads(torch.randn(2, 5, 12)), {}),
    "contiguous heads": (lambda: torch.randn(2, 3, 5, 4), {}),
    "causal": (lambda: _split_heads(torch.randn(2, 5, 12)), {"is_causal": True}),
    "dropout (math)": (lambda: _split_heads(torch.randn(2, 5, 12)), {"dropout_p": 0.5}),
}


@pytest.mark.parametrize("name", list(ATTENTION))
def test_cpu_attention_tells_the_layout_of_the_kernel_eager_runs(name):
    make, kwargs = ATTENTION[name]

    def program(q, k, v):
        y = F.scaled_dot_product_attention(q, k, v, **kwargs)
        return y.stride(), y.transpose(1, 2).is_contiguous()

    q, k, v = make(), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    assert thunder_rs.jit(program)(q, k, v) == program(q, k, v)
    q.requires_grad_()
    assert thunder_rs.jit(program)(q, k, v) == program(q, k, v)  # (the flash kernel's symbol)


def test_merging_heads_copies_nothing_eager_does_not():
    """``y.transpose(1, 2).contiguous()`` of attention's output is the output itself in eager (the
    kernel laid it out ``[B, T, H, D]``): the trace makes no copy of it either, with or without
    gradients."""

    def merge(x, k):
        y = F.scaled_dot_product_attention(_split_heads(x), k, k, is_causal=True)
        return y.transpose(1, 2).contiguous().view(2, 5, 12) * 2

    x, k = torch.randn(2, 5, 12, requires_grad=True), torch.randn(2, 3, 6, 4)
    jmerge = thunder_rs.jit(merge)
    out, expected = jmerge(x, k), merge(x, k)
    torch.testing.assert_close(out, expected)
    assert out.stride() == expected.stride()
    assert "clone" not in str(thunder_rs.last_traces(jmerge)[-1])


@pytest.mark.parametrize("requires_grad", [False, True])
def test_cpu_attention_follows_the_kernel_switches_between_calls(requires_grad):
    """``sdpa_kernel(SDPBackend.MATH)`` around a later call runs the math path, whose output is a
    matmul's (contiguous): the merged heads are then a copy in eager. The entry is guarded on the
    switches, so that call compiles anew with them and returns eager's strides."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    def merged(x, k):
        return F.scaled_dot_product_attention(_split_heads(x), k, k).transpose(1, 2).contiguous()

    x, k = torch.randn(2, 5, 12, requires_grad=requires_grad), torch.randn(2, 3, 6, 4)
    jmerged = thunder_rs.jit(merged)
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel(backend):
            out, expected = jmerged(x, k), merged(x, k)
        assert_like_eager(out.detach(), expected.detach())
    assert thunder_rs.compile_stats(jmerged).cache_misses == 2


@pytest.mark.parametrize(
    "program",
    [
        lambda x: x.t().contiguous() * 2,
        lambda x: x.t().exp().contiguous() + 1,
        lambda x: x.unsqueeze(0).expand(3, 5, 7).contiguous().sin(),
    ],
)
def test_a_copy_contiguous_makes_hands_on_eagers_layout(program):
    """``contiguous()`` of a tensor laid out otherwise copies in eager, and what reads the copy
    computes row-major: the trace's copy is one the executors make (it was the tensor itself, and
    the product came back transposed)."""
    x = torch.randn(5, 7)
    out, expected = thunder_rs.jit(program)(x), program(x)
    torch.testing.assert_close(out, expected)
    assert out.stride() == expected.stride()


def _told_at_module_outputs(model, *args) -> dict:
    """Each submodule's tensor output's (shape, strides) as the call under way tells them: hooks
    keep them on the modules (the jitted module's own state, which a traced call may write)."""

    def keep(module, inputs, out):
        if isinstance(out, torch.Tensor):
            module._told_layout = (tuple(out.shape), tuple(out.stride()))

    modules = dict(model.named_modules())
    handles = [m.register_forward_hook(keep) for name, m in modules.items() if name]
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return {name: m.__dict__.pop("_told_layout") for name, m in modules.items() if "_told_layout" in m.__dict__}


def _models():
    import torchvision  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    gpt2 = transformers.GPT2Model(transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=100))
    resnet = torchvision.models.resnet18(num_classes=10).eval().to(memory_format=CL)
    return {
        "gpt2": (gpt2.eval(), torch.randint(0, 100, (2, 7))),
        "resnet18 channels_last": (resnet, torch.randn(2, 3, 32, 32).contiguous(memory_format=CL)),
    }


@pytest.mark.parametrize("name", ["gpt2", "resnet18 channels_last"])
def test_every_module_output_of_a_model_tells_eagers_strides(name):
    """The strides the trace tells at each submodule's output are eager's, size-1 dims' included
    (a channels_last [N, C, 1, 1] pooling output's are channels_last ones, not row-major)."""
    pytest.importorskip("torchvision")
    pytest.importorskip("transformers")
    model, x = _models()[name]
    eager = _told_at_module_outputs(model, x)
    told = _told_at_module_outputs(thunder_rs.jit(model), x)
    assert told == eager
