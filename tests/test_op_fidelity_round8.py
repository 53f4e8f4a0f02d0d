"""Op fidelity, round 8: outputs, strides and gradients bit-equal to eager's (``torch.equal``)
where eager's kernels are the ones compiled calls run.

- ``torch.quantile``/``nanquantile`` (their decomposition, when the input requires grad): eager
  computes ``(*kept, nq)`` contiguous (``kept`` the reduced shape, a kept dim in its place), then
  moves the quantiles first or squeezes a 0-d ``q``'s dim. The decomposition moved the quantiles
  first and then unsqueezed the kept dim, so a kept dim of size 1 had another stride
  (``(1, 1)`` for eager's ``(5, 1)``).
- ``torch.index_reduce(..., "prod")``'s gradient: eager's ``index_reduce_backward`` takes its
  products without each element by ``index_reduce`` itself; the rule took them by
  ``scatter_reduce``, whose kernel rounds a bfloat16 product otherwise (the input's gradient was
  ulps off in bfloat16).
- ``index_fill`` of a number into an input requiring grad: the forward was the decomposition, whose
  inner ``index_add`` raised "index out of range in self" for an index out of range, naming
  neither ``index_fill`` nor its dim; the grad rule (eager's ``grad.index_fill(dim, index, 0)``)
  now keeps the forward one ``index_fill`` call, which raises eager's error.
- ``torch.ops.aten._upsample_bilinear2d_aa``/``_upsample_bicubic2d_aa``'s default form (an output
  size and, apart, the scales the kernel is given): an eager fallback whose call passed the
  arguments as the ``vec`` form's, which eager's overloads refused for keyword scales. Now the
  antialiased resize with those scales (eager's backward kernel given them too).
- ``torch.meshgrid`` (tensors requiring grad, whose grids the call takes as views again): eager
  views each tensor as the grid's rank, then expands, so a dim of size 1 keeps the view's stride;
  the trace broadcast each tensor (every new dim's stride 0).
- ``torch.take_along_dim`` along a dim with negative (or past-the-end) indices: the installed
  torch takes them modulo the dim's size; the gradient scattered them as given and raised.
- ``torch.arange`` with a bool bound or step (eager's integer Scalar) was refused.
- ``torch.stack``'s gradients are eager's ``grad.select(dim, i)`` (views with the gradient's
  strides); the VJP of ``cat`` of unsqueezes reshaped slices (a size-1 dim's stride differed).
"""

from __future__ import annotations

import pytest
import torch

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")


def _grads(fn, args, cotangent_seed=7):
    """The outputs of ``fn`` on ``args`` and the gradients of the ones requiring grad."""
    out = fn(*args)
    wanting = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if not wanting:
        return out, ()
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(cotangent_seed))
    grads = torch.autograd.grad(out, wanting, g.to(out.dtype), allow_unused=True)
    return out.detach(), grads


def _assert_eager(fn, *args):
    """Outputs (values and strides) and gradients of the compiled ``fn`` are eager's."""
    expected, expected_grads = _grads(fn, args)
    actual, actual_grads = _grads(thunder_rs.jit(fn), args)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)
    assert actual.stride() == expected.stride(), (actual.stride(), expected.stride())
    assert len(actual_grads) == len(expected_grads)
    for i, (a, e) in enumerate(zip(actual_grads, expected_grads)):
        assert (a is None) == (e is None), (i, a, e)
        if e is not None:
            assert a.dtype == e.dtype and a.shape == e.shape and torch.equal(a, e), (i, a, e)


_KEPT = [((3, 5), 0), ((3, 5), 1), ((3, 2, 1, 2), 0), ((3, 2, 1, 2), 3), ((1, 3), 0), ((3, 1), 1), ((4,), None)]


@pytest.mark.parametrize("op", [torch.quantile, torch.nanquantile])
@pytest.mark.parametrize(("shape", "dim"), _KEPT)
@pytest.mark.parametrize("q", [0.5, "vector", "one", "0-d"])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_quantile_keeps_eager_s_strides_of_a_kept_dim(op, shape, dim, q, requires_grad):
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(shape, generator=gen)
    q = {"vector": torch.tensor([0.2, 0.5]), "one": torch.tensor([0.3]), "0-d": torch.tensor(0.4)}.get(q, q)
    for interpolation in ("linear", "lower", "midpoint"):
        for keepdim in (True, False):
            _assert_eager(
                lambda x: op(x, q, dim=dim, keepdim=keepdim, interpolation=interpolation),
                x.clone().requires_grad_(requires_grad),
            )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize(("shape", "dim", "source_shape"), [((5, 5), 1, (5, 10)), ((5, 5, 5), 1, (5, 10, 5))])
def test_index_reduce_prod_s_gradient_takes_index_reduce_s_products(dtype, include_self, shape, dim, source_shape):
    gen = torch.Generator().manual_seed(9)
    for trial in range(3):
        x = torch.randn(shape, generator=gen).to(dtype)
        source = torch.randn(source_shape, generator=gen).to(dtype)
        if trial == 2:  # a zero in the input and a single zero in the source
            x.view(-1)[3] = 0
            source.view(-1)[4] = 0
        index = torch.randint(0, shape[dim], (source_shape[dim],), generator=gen)
        _assert_eager(
            lambda x, s: x.index_reduce(dim, index, s, "prod", include_self=include_self),
            x.requires_grad_(),
            source.requires_grad_(),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_fill_with_negative_indices_and_a_number_is_eager_s(dtype, dim):
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(4, 5, generator=gen).to(dtype).requires_grad_()
    for index in ([-1, 0, -1], [-4, 3], -2):
        i = torch.tensor(index)
        _assert_eager(lambda x: x.index_fill(dim, i, 1.5), x)


@pytest.mark.parametrize("index", [[-6], [5], [0, -7]])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_index_fill_out_of_range_raises_eager_s_error(index, requires_grad):
    """With a gradient, the forward was the decomposition, whose ``index_add`` raised "index out of
    range in self" naming neither ``index_fill`` nor the dim; now eager's own check raises."""
    x = torch.randn(4, 5, requires_grad=requires_grad)
    i = torch.tensor(index)

    def program(x):
        return x.index_fill(1, i, 2.0)

    with pytest.raises(IndexError) as eager:
        program(x)
    with pytest.raises(IndexError, match="index_fill") as compiled:
        thunder_rs.jit(program)(x)
    assert str(eager.value) in str(compiled.value)


_AA_CALLS = [
    ((10, 20), ([3, 3], False), {"scales_h": 1.7, "scales_w": 0.9}),
    ((10, 20), (), {"output_size": [3, 3], "align_corners": False, "scales_h": None, "scales_w": None}),
    ((10, 20), ([5, 30], True, 1.7, 0.9), {}),
    ((20, 10), ([7, 5], False, None, 2.5), {}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"])
@pytest.mark.parametrize("form", ["packet", "default", "_nn"])
@pytest.mark.parametrize(("spatial", "args", "kwargs"), _AA_CALLS)
def test_aten_antialiased_resize_s_default_form_is_eager_s(dtype, name, form, spatial, args, kwargs):
    """The default form (``output_size`` and, apart, ``scales_h``/``scales_w``) was an eager
    fallback whose call passed its arguments as the ``vec`` form's: eager's overloads refused
    keyword scales. Now it is traced: eager's values, strides and gradients."""
    packet = getattr(torch.ops.aten, name)
    fn = {"packet": packet, "default": packet.default, "_nn": getattr(torch._C._nn, name)}[form]
    x = torch.randn(2, 3, *spatial, generator=torch.Generator().manual_seed(11)).to(dtype)
    program = lambda x: fn(x, *args, **kwargs)  # noqa: E731
    assert not thunder_rs.examine(program, x).fallbacks
    _assert_eager(program, x.requires_grad_())


_GRIDS = [[(3,), ()], [(), ()], [(3,), (), (3,)], [(1,), (4,)], [(2,), (1,), (3,)]]


@pytest.mark.parametrize("shapes", _GRIDS)
@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_meshgrid_s_views_have_eager_s_strides(shapes, indexing, requires_grad):
    """Eager views each tensor as the grid's rank (its elements at its dim, 1 elsewhere), then
    expands: a dim of size 1 keeps the view's stride. The trace broadcast each tensor, which
    made the stride of every new dim 0 (``(0, 0)`` for eager's ``(1, 0)``)."""
    gen = torch.Generator().manual_seed(12)
    tensors = [torch.randn(s, generator=gen).requires_grad_(requires_grad) for s in shapes]
    expected = torch.meshgrid(*tensors, indexing=indexing)
    actual = thunder_rs.jit(lambda *ts: torch.meshgrid(*ts, indexing=indexing))(*tensors)
    for a, e in zip(actual, expected):
        assert torch.equal(a, e) and a.stride() == e.stride(), (a.stride(), e.stride())

    def written(*ts):  # the grids are views of the tensors, as eager's
        grids = torch.meshgrid(*ts, indexing=indexing)
        for t in ts:
            t.add_(1)
        return [g * 1 for g in grids]

    copies = [t.detach().clone() for t in tensors]
    for a, e in zip(thunder_rs.jit(written)(*[t.clone() for t in copies]), written(*[t.clone() for t in copies])):
        assert torch.equal(a, e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("shape", "index", "dim"),
    [
        ((5,), [-1, -2, -1, 7, -6], 0),
        ((2, 3), [[-1, 4], [3, -4]], 1),
        ((2, 3), [[-1, 4, 2]], 0),
        ((4, 5), [[-1, -5]], -1),
    ],
)
def test_take_along_dim_s_gradient_takes_eager_s_wrapped_indices(dtype, shape, index, dim):
    """The installed torch's ``take_along_dim`` along a dim takes its indices modulo the dim's
    size (its ``GatherBackward`` saves them so); the gradient scattered the indices as given,
    which raised for ``-1`` where eager's backward runs."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(13)).to(dtype).requires_grad_()
    i = torch.tensor(index)
    _assert_eager(lambda x: torch.take_along_dim(x, i, dim), x)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((False, True, True), {"dtype": torch.float32}),
        ((True, 5), {}),
        ((0, 5, True), {}),
        ((True,), {}),
        ((True, 3.5), {}),
    ],
)
def test_arange_takes_bools_as_eager_s_integers(args, kwargs):
    """A bool bound or step is eager's integer Scalar; the trace refused it ("expected a number")."""
    program = lambda: torch.arange(*args, **kwargs)  # noqa: E731
    expected, actual = program(), thunder_rs.jit(program)()
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtypes", [(torch.float32,) * 3, (torch.float32, torch.float64, torch.bfloat16)])
def test_stack_s_gradients_are_eager_s_selects(dim, dtypes):
    """Eager's ``stack_tensors_backward`` selects each gradient from the output's, a view with its
    strides; the VJP of ``cat`` of unsqueezes reshaped slices (a dim of size 1: another stride)."""
    gen = torch.Generator().manual_seed(14)
    tensors = [torch.randn(1, 2, 1, 4, generator=gen).to(dt).requires_grad_() for dt in dtypes]
    expected = torch.stack(tensors, dim)
    actual = thunder_rs.jit(lambda *ts: torch.stack(ts, dim))(*tensors)
    assert torch.equal(actual, expected) and actual.stride() == expected.stride()
    cot = torch.randn(expected.shape, generator=gen).to(expected.dtype)
    for a, e in zip(torch.autograd.grad(actual, tensors, cot), torch.autograd.grad(expected, tensors, cot)):
        assert a.dtype == e.dtype and torch.equal(a, e) and a.stride() == e.stride(), (a.stride(), e.stride())
