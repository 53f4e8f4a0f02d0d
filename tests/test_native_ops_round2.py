"""Ops the op database ran as eager fallbacks, now traced natively: each is bit-equal to eager
(``torch.equal``) in float32 and bfloat16, forward and backward, on contiguous, transposed and
empty inputs, falls back nowhere, and rejects what eager rejects with eager's exception type.
"""

from collections.abc import Callable

import pytest
import torch

import thunder_rs

DTYPES = (torch.float32, torch.bfloat16)


def _leaves(args) -> list[torch.Tensor]:
    flat = [y for a in args for y in (a if isinstance(a, (list, tuple)) else (a,))]
    return [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad]


def check_bit_equal(fn: Callable, *args, grad: bool = True) -> None:
    """``fn``'s outputs under ``jit`` equal eager's bit for bit, with no eager fallback; so do the
    gradients of the inputs that require grad, from the same cotangents."""
    assert thunder_rs.examine(fn, *args).fallbacks == {}
    expected, actual = fn(*args), thunder_rs.jit(fn)(*args)
    expected, actual = (v if isinstance(v, tuple) else (v,) for v in (expected, actual))
    for e, a in zip(expected, actual, strict=True):
        assert torch.equal(e, a) and e.dtype == a.dtype and e.stride() == a.stride()
        assert e.requires_grad == a.requires_grad
    leaves = _leaves(args)
    if not grad or not leaves:
        return
    torch.manual_seed(1)
    cotangents = [torch.randn_like(e) if e.requires_grad else None for e in expected]

    def loss(outs):
        return sum((o * c).sum() for o, c in zip(outs, cotangents) if c is not None)

    grads = [torch.autograd.grad(loss(outs), leaves, allow_unused=True) for outs in (expected, actual)]
    for e, a in zip(*grads):
        assert (e is None and a is None) or torch.equal(e, a)


def check_same_error(fn: Callable, *args) -> None:
    with pytest.raises(Exception) as eager:
        fn(*args)
    with pytest.raises(type(eager.value)):
        thunder_rs.jit(fn)(*args)


def _randn(shape, dtype, *, transposed=False, grad=False) -> torch.Tensor:
    stored = (*shape[:-2], shape[-1], shape[-2]) if transposed else shape
    t = torch.randn(stored, dtype=dtype)
    t = t.mT if transposed else t
    return t.detach().requires_grad_(grad)


# -- roll: a shift by a multiple of the size copies (eager's output is a new contiguous tensor) -----


@pytest.mark.parametrize("dtype", DTYPES)
def test_roll_by_nothing_is_a_native_copy(dtype: torch.dtype) -> None:
    x = _randn((4, 5), dtype, grad=True)
    check_bit_equal(lambda a: torch.roll(a, 0, 0), x)
    check_bit_equal(lambda a: torch.roll(a.mT, (5, 4), (1, 0)), x)
    check_bit_equal(lambda a: torch.roll(a, 0, 0), torch.randn(0, 0, 0, dtype=dtype))
    out = thunder_rs.jit(lambda a: torch.roll(a, 0, 0))(x)
    assert out.data_ptr() != x.data_ptr()


# -- native_layer_norm ------------------------------------------------------------------------------


def _native_layer_norm(x, w, b):
    return torch.native_layer_norm(x, (3, 5), w, b, 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params", ["both", "weight", "none"])
def test_native_layer_norm(dtype: torch.dtype, params: str) -> None:
    x = _randn((4, 3, 5), dtype, transposed=params == "weight", grad=True)
    w = _randn((3, 5), dtype, grad=True) if params != "none" else None
    b = _randn((3, 5), dtype, grad=True) if params == "both" else None
    check_bit_equal(_native_layer_norm, x, w, b)
    check_bit_equal(_native_layer_norm, _randn((0, 3, 5), dtype, grad=True), w, b)


def test_native_layer_norm_errors() -> None:
    x = torch.randn(4, 3, 5)
    check_same_error(lambda a: torch.native_layer_norm(a, (3, 4), None, None, 1e-5), x)
    check_same_error(lambda a, w: torch.native_layer_norm(a, (3, 5), w, None, 1e-5), x, torch.randn(5))
    check_same_error(lambda a, w: torch.native_layer_norm(a, (3, 5), None, w, 1e-5), x, torch.randn(3, 5).double())


# -- _softmax_backward_data ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, dim", [((5, 7), 1), ((5, 7), 0), ((2, 3, 4), -1), ((), 0), ((0, 3), 1)])
def test_softmax_backward_data(dtype: torch.dtype, shape, dim: int) -> None:
    grad = _randn(shape, dtype, grad=True)
    output = torch.softmax(_randn(shape, dtype, transposed=len(shape) == 2), dim).requires_grad_()
    check_bit_equal(lambda g, o: torch._softmax_backward_data(g, o, dim, dtype), grad, output)


@pytest.mark.parametrize("aten", [torch.ops.aten._softmax_backward_data, torch.ops.aten._softmax_backward_data.default])
def test_softmax_backward_data_as_aten_op(aten) -> None:
    output = torch.softmax(torch.randn(3, 5), 1)
    check_bit_equal(lambda g, o: aten(g, o, 1, torch.float32), torch.randn(3, 5, requires_grad=True), output)


def test_softmax_backward_data_errors() -> None:
    g, o = torch.randn(3, 4), torch.randn(3, 4).softmax(1)
    fn = torch._softmax_backward_data
    check_same_error(lambda g, o: fn(g, o, 2, torch.float32), g, o)
    check_same_error(lambda g, o: fn(g, o, 1, torch.float16), g, o)  # half to float: CUDA's only
    check_same_error(lambda g, o: fn(g, o, 1, torch.float32), g.bfloat16(), o)
    check_same_error(lambda g, o: fn(g, o, 1, torch.float32), g[:2], o)


# -- _chunk_cat ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunk_cat(dtype: torch.dtype) -> None:
    def fn(ts, dim, n):
        return torch._chunk_cat(ts, dim, n)

    check_bit_equal(fn, [_randn((3, 5), dtype), _randn((3, 7, 2), dtype, transposed=True)], 1, 3)
    check_bit_equal(fn, [_randn((6, 4), dtype, transposed=True)], -1, 4)
    check_bit_equal(fn, [_randn((7,), dtype), _randn((4,), dtype)], 0, 3)


def test_chunk_cat_errors() -> None:
    a, b = torch.randn(3, 5), torch.randn(3, 4, 2)
    for ts, dim, n in [([a, b], -1, 2), ([a, b], 2, 2), ([a], 1, 0), ([], 0, 2), ([torch.randn(0, 3)], 0, 2)]:
        check_same_error(torch._chunk_cat, ts, dim, n)
    for ts, dim, n in [([a, a.double()], 1, 2), ([a, torch.randn(2, 5)], 1, 2), ([a], 5, 2)]:
        check_same_error(torch._chunk_cat, ts, dim, n)


def test_chunk_cat_refuses_grad_as_eager_has_none() -> None:
    """Eager's backward raises (no derivative): with grad wanted it runs as eager's, its backward raising."""
    x = torch.randn(3, 5, requires_grad=True)
    out = thunder_rs.jit(torch._chunk_cat)([x], 1, 2)
    assert torch.equal(out, torch._chunk_cat([x], 1, 2))
    with pytest.raises(RuntimeError, match="derivative for aten::_chunk_cat is not implemented"):
        out.sum().backward()
    with torch.no_grad():
        assert torch.equal(thunder_rs.jit(torch._chunk_cat)([x], 1, 2), torch._chunk_cat([x], 1, 2))


# -- _unsafe_masked_index and _unsafe_masked_index_put_accumulate ----------------------------------


def _masked_args(shape, bcast=False):
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(3, 4, generator=gen) > 0.4
    rows = torch.randint(-shape[0] - 2, shape[0] + 2, (3, 4), generator=gen)  # out of range in places
    cols = torch.randint(-3, 8, (1 if bcast else 3, 4), generator=gen).int()
    return mask, [rows, cols]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["plain", "transposed", "empty", "broadcast"])
def test_unsafe_masked_index(dtype: torch.dtype, case: str) -> None:
    x = _randn((0 if case == "empty" else 5, 6), dtype, transposed=case == "transposed", grad=True)
    mask, indices = _masked_args(x.shape, bcast=case == "broadcast")
    check_bit_equal(lambda a, m, i: torch._unsafe_masked_index(a, m, i, -2.5), x, mask, indices)
    values = _randn((4,) if case == "broadcast" else (3, 4), dtype, grad=True)
    check_bit_equal(torch._unsafe_masked_index_put_accumulate, x, mask, indices, values)


def test_unsafe_masked_index_errors() -> None:
    x = torch.randn(5, 5)
    mask, (rows, _) = _masked_args(x.shape)
    for fn in (torch._unsafe_masked_index, torch._unsafe_masked_index_put_accumulate):
        last = 1.0 if fn is torch._unsafe_masked_index else torch.randn(3, 4)
        check_same_error(fn, x, mask, [rows.float()], last)
        check_same_error(fn, x, mask, [rows > 0], last)
    check_same_error(torch._unsafe_masked_index, x, mask, [rows] * 3, 1.0)
    check_same_error(torch._unsafe_masked_index, x, mask, [rows], 1.0)  # the mask against the result


# -- linalg.diagonal: diagonal's view with the last two dims by default ------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape, kwargs", [((5, 5), {}), ((5, 5), {"offset": 2}), ((2, 3, 4), {"dim1": 0}), ((0, 3), {})]
)
def test_linalg_diagonal(dtype: torch.dtype, shape, kwargs) -> None:
    check_bit_equal(lambda a: torch.linalg.diagonal(a, **kwargs), _randn(shape, dtype, transposed=True, grad=True))


def test_linalg_diagonal_writes_through_and_errors() -> None:
    def write(a):
        torch.linalg.diagonal(a).add_(1)
        return a

    x = torch.randn(3, 3)
    assert torch.equal(thunder_rs.jit(write)(x.clone()), write(x.clone()))
    check_same_error(lambda a: torch.linalg.diagonal(a), torch.randn(3))
    check_same_error(lambda a: torch.linalg.diagonal(a, dim1=0, dim2=0), x)
    check_same_error(lambda a: torch.linalg.diagonal(a, dim1=5), x)


# -- triplet_margin_with_distance_loss with the program's own distance function ----------------------


def _cosine_distance(x, y):
    return 1.0 - torch.nn.functional.cosine_similarity(x, y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "kwargs",
    [
        {"distance_function": torch.nn.PairwiseDistance()},
        {"distance_function": _cosine_distance, "swap": True, "reduction": "sum"},
        {"distance_function": torch.nn.PairwiseDistance(p=1), "margin": 10.0, "reduction": "none"},
    ],
)
def test_triplet_margin_with_distance_function(dtype: torch.dtype, kwargs) -> None:
    def fn(a, p, n):
        return torch.nn.functional.triplet_margin_with_distance_loss(a, p, n, **kwargs)

    check_bit_equal(fn, *(_randn((5, 10), dtype, grad=True) for _ in range(3)))


def test_triplet_margin_with_distance_function_errors() -> None:
    a, d = torch.randn(5, 10), torch.nn.PairwiseDistance()
    loss = torch.nn.functional.triplet_margin_with_distance_loss
    check_same_error(lambda x: loss(x, x, x, distance_function=d, margin=0.0), a)
    check_same_error(lambda x: loss(x, x, x, distance_function=d, reduction="x"), a)
    check_same_error(lambda x, y: loss(x, x, y, distance_function=d), a, a[0])


# -- Tensor.new_empty_strided: empty_strided with the tensor's dtype and device ----------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size, stride", [((), ()), ((2, 0), (3, 4)), ((3, 2, 2), (1, 2, 3)), ((2, 3), (1, 2))])
def test_new_empty_strided(dtype: torch.dtype, size, stride) -> None:
    def fn(a):
        return a.new_empty_strided(size, stride)

    x = torch.randn(3, dtype=dtype)
    assert thunder_rs.examine(fn, x).fallbacks == {}
    expected, actual = fn(x), thunder_rs.jit(fn)(x)  # (uninitialised: the layout alone is defined)
    assert (actual.shape, actual.stride(), actual.dtype) == (expected.shape, expected.stride(), expected.dtype)
    check_same_error(lambda a: a.new_empty_strided((2, 3), (1,)), x)


# -- torch.gradient with scalar spacings: ATen's stencil, and its gradients in eager's order ------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("edge_order", [1, 2])
@pytest.mark.parametrize(
    "shape, kwargs", [((7,), {}), ((5, 5), {}), ((4, 6), {"spacing": [0.5, 3]}), ((3, 4, 5), {"dim": [0, -1]})]
)
def test_gradient(dtype: torch.dtype, edge_order: int, shape, kwargs) -> None:
    """(Before its grad rule, the input's gradient differed from eager's in the last bit in 13 of
    24 such cases: the slices' cotangents were added in another order.)"""

    def fn(a):
        return torch.gradient(a, edge_order=edge_order, **kwargs)

    check_bit_equal(fn, _randn(shape, dtype, transposed=len(shape) == 2, grad=True))


def test_gradient_of_integers_and_coordinates() -> None:
    x = torch.arange(12).reshape(3, 4)
    for expected, actual in zip(torch.gradient(x, edge_order=2), thunder_rs.jit(torch.gradient)(x, edge_order=2)):
        assert torch.equal(expected, actual) and expected.dtype == actual.dtype
    coordinates, y = [torch.arange(5.0) ** 2], torch.randn(5)
    assert torch.equal(
        thunder_rs.jit(torch.gradient)(y, spacing=coordinates)[0], torch.gradient(y, spacing=coordinates)[0]
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("edge_order", [1, 2])
@pytest.mark.parametrize("dims", [(0,), (1, 0), (-1,)])
def test_gradient_at_coordinate_tensors_is_traced_without_gradients(dtype, edge_order: int, dims) -> None:
    """``gradient_helper``'s weighted differences (float, integer and other-dtype coordinates),
    bit for bit; with gradients, eager's call (whose backward adds in an order the decomposition's
    VJP does not keep)."""
    torch.manual_seed(0)
    x = _randn((5, 6), dtype, transposed=True)
    points = {5: torch.tensor([0.0, 1.0, 3.0, 3.5, 7.0], dtype=dtype), 6: torch.tensor([0, 1, 3, 4, 7, 9])}
    coordinates = [points[x.shape[d]] for d in dims]

    def fn(a, *c):
        return torch.gradient(a, spacing=list(c), dim=list(dims), edge_order=edge_order)

    check_bit_equal(fn, x, *coordinates)
    x.requires_grad_()
    assert thunder_rs.examine(fn, x, *coordinates).fallbacks == {"torch.gradient": 1}
    for expected, actual in zip(fn(x, *coordinates), thunder_rs.jit(fn)(x, *coordinates)):
        assert torch.equal(expected, actual)
    x.requires_grad_(False)
    check_bit_equal(fn, x, *[c[:3] for c in coordinates])  # (one weight each, broadcast as in eager)
    check_same_error(fn, x, *[c[:4] for c in coordinates])
    check_same_error(fn, x, *[c.reshape(1, -1) for c in coordinates])


@pytest.mark.parametrize(
    "shape, kwargs",
    [((5,), {"edge_order": 3}), ((2,), {"edge_order": 2}), ((4, 4), {"spacing": [1.0]}), ((4, 4), {"dim": [0, 0]})],
)
def test_gradient_errors(shape, kwargs) -> None:
    check_same_error(lambda a: torch.gradient(a, **kwargs), torch.randn(shape))


def test_gradient_of_uint8_is_refused_as_eager_refuses_it() -> None:
    check_same_error(torch.gradient, torch.arange(5, dtype=torch.uint8))


# -- torch.combinations: eager's self[table], the table built in the trace ----------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n, r, with_replacement", [(4, 2, False), (5, 3, True), (7, 4, False), (3, 4, True), (5, 1, False), (1, 2, False)]
)
def test_combinations(dtype: torch.dtype, n: int, r: int, with_replacement: bool) -> None:
    check_bit_equal(lambda a: torch.combinations(a, r, with_replacement), _randn((n,), dtype, grad=True))


def test_combinations_of_nothing_and_errors() -> None:
    check_bit_equal(lambda a: torch.combinations(a, 0), torch.randn(4))
    check_bit_equal(lambda a: torch.combinations(a, 2), torch.randn(0))
    check_same_error(lambda a: torch.combinations(a, 2), torch.randn(2, 2))
    check_same_error(lambda a: torch.combinations(a, -1), torch.randn(3))
