"""``torch.vmap`` inside a program under thunder_rs.jit: batched like eager for the ops index-based
functions use (elementwise ops, ``new_*`` creation, integer indexing), a clear error naming the op
and the line for anything else, and torch's own vmap outside tracing."""

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderError
from twin_training import stays_symbolic


def same_as_eager(fn, *args):
    expected = fn(*args)
    actual = thunder_rs.jit(fn)(*args)
    torch.testing.assert_close(actual, expected)
    assert type(actual) is torch.Tensor
    return actual


def mask_function(padding):
    """A Hugging Face-style mask function over (batch, query, key) indices."""

    def mask(b, q, kv):
        causal = kv <= q
        result = q.new_ones((), dtype=torch.bool) & causal.to(q.device)
        return result & padding[b, kv]

    return mask


def test_nested_vmaps_over_index_vectors_match_eager():
    def build(padding):
        fn = mask_function(padding)
        for dims in [(None, None, 0), (None, 0, None), (0, None, None)]:
            fn = torch.vmap(fn, in_dims=dims, out_dims=0)
        b, n = padding.shape
        return fn(torch.arange(b), torch.arange(n), torch.arange(n))

    padding = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    same_as_eager(build, padding)
    same_as_eager(build, padding.flip(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_elementwise_ops_with_in_dims_and_out_dims(dtype):
    def f(x, y, w):
        return (
            torch.vmap(lambda a, b: torch.where(a > 0, a * b - 1, (a + 2) / b), in_dims=(1, None), out_dims=1)(x, y) + w
        )

    x, y, w = torch.randn(3, 4, dtype=dtype), torch.rand(3, dtype=dtype) + 1, torch.randn(3, 4, dtype=dtype)
    same_as_eager(f, x, y, w)


def test_outputs_not_batched_over_a_level_are_expanded():
    def f(x):
        return torch.vmap(lambda a: x[0] * 2, in_dims=0)(x)  # ignores its argument

    same_as_eager(f, torch.randn(3, 2))


def test_gradients_flow_through_batched_elementwise_ops():
    def f(x, y):
        return torch.vmap(lambda a, b: (a * b).sin(), in_dims=(0, None))(x, y).sum()

    x, y = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    x2, y2 = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    thunder_rs.jit(f)(x, y).backward()
    f(x2, y2).backward()
    torch.testing.assert_close((x.grad, y.grad), (x2.grad, y2.grad))


def test_ops_without_a_batching_rule_are_refused_with_the_line():
    def f(x):
        return torch.vmap(lambda row: row.sort().values)(x)

    with pytest.raises(
        NotImplementedError, match=r"torch\.vmap: sort has no thunder_rs batching rule.*test_vmap\.py:\d+"
    ):
        thunder_rs.jit(f)(torch.randn(3, 4))


def test_promotion_that_batching_would_change_is_refused():
    # A 0-d float64 per example next to a float32 vector computes in float32 in eager; physically
    # the batched float64 operand has a dim and would promote the result.
    def f(x, v):
        return torch.vmap(lambda a: a + v)(x)

    with pytest.raises(NotImplementedError, match="float64 and torch.float32"):
        thunder_rs.jit(f)(torch.randn(3, dtype=torch.float64), torch.randn(2))


def test_reading_a_batched_value_is_data_dependent():
    def f(x):
        return torch.vmap(lambda a: a * 2 if a > 0 else a)(x)

    with pytest.raises(ThunderError, match=r"__bool__: data-dependent.*test_vmap\.py:\d+"):
        thunder_rs.jit(f)(torch.randn(3))


def test_mismatched_batch_sizes_raise_like_eager():
    def f(x, y):
        return torch.vmap(lambda a, b: a + b)(x, y)

    x, y = torch.randn(3), torch.randn(4)
    with pytest.raises(ValueError):
        f(x, y)
    with pytest.raises(ValueError, match="same size in the mapped dimension"):
        thunder_rs.jit(f)(x, y)


def test_torch_vmap_is_torchs_own_outside_tracing():
    vmap = torch.vmap
    thunder_rs.jit(lambda x: torch.vmap(torch.neg)(x))(torch.randn(2, 3))
    assert torch.vmap is vmap and torch.func.vmap is vmap
    # Inside a traced program, a vmap over captured real tensors is traced: their values are read per call.
    captured = torch.randn(3, 4)

    def f(x):
        return x + torch.vmap(lambda row: row * 2)(captured)

    jf, x = thunder_rs.jit(f), torch.randn(3, 4)
    torch.testing.assert_close(jf(x), f(x))
    captured.mul_(3)
    torch.testing.assert_close(jf(x), f(x))
    with pytest.raises(NotImplementedError, match="sort has no thunder_rs batching rule"):
        thunder_rs.jit(lambda x: x + torch.vmap(lambda row: row.sort().values)(captured))(torch.randn(3))


def test_functorch_transforms_bound_before_tracing_are_refused_with_the_line():
    # (a grad or jacrev made before tracing reaches torch's grad_impl or _vjp_with_argnums, which
    # thunder_rs traces: tests/test_traced_grads.py; functionalize made before reaches no such entry)
    functional = torch.func.functionalize(lambda a: a.sin())
    with pytest.raises(NotImplementedError, match=r"functorch: transforms over traced tensors.*test_vmap\.py"):
        thunder_rs.jit(lambda x: functional(x))(torch.randn(3))
    jacobian = torch.func.jacrev(lambda a: a.sin())
    x = torch.randn(3)
    torch.testing.assert_close(thunder_rs.jit(lambda x: jacobian(x))(x), jacobian(x), rtol=0, atol=0)


def test_torch_func_grad_around_a_jitted_function_is_eagers():
    # The program runs as torch calls the transform differentiates (tests/test_higher_order.py).
    x = torch.randn(3)
    jfn = thunder_rs.jit(lambda x: (x.sin() * x).sum())
    torch.testing.assert_close(torch.func.grad(jfn)(x), x.sin() + x * x.cos())


def test_a_vmap_imported_before_tracing_is_thunder_rss():
    # ``from torch.func import vmap`` binds functorch's function at import, before any tracing.
    from torch.func import vmap as imported_vmap

    def program(x, w):
        return imported_vmap(lambda row: (row * w).sin())(x)

    x, w = torch.randn(4, 3), torch.randn(3)
    torch.testing.assert_close(thunder_rs.jit(program)(x, w), program(x, w))
    assert torch.func.vmap is imported_vmap  # restored after tracing
    torch.testing.assert_close(imported_vmap(torch.sin)(x), x.sin())


def test_nested_in_dims_and_tree_outputs_match_eager():
    # functorch pairs in_dims with the arguments as a tree prefix: ``((0, 1), None)`` maps the
    # pair's first tensor over dim 0 and its second over dim 1; out_dims likewise for outputs.
    def f(x, y, w):
        def body(pair, scale):
            a, b = pair
            return {"sum": a + b * scale, "prod": (a * b, a - scale)}

        return torch.vmap(body, in_dims=((0, 1), None), out_dims={"sum": 1, "prod": (0, -1)})((x, y), w)

    x, y, w = torch.randn(3, 4), torch.randn(4, 3), torch.randn(4)
    expected = f(x, y, w)
    actual = thunder_rs.jit(f)(x, y, w)
    torch.testing.assert_close(actual, expected)


def test_out_dims_none_returns_an_unbatched_output_as_it_is():
    def f(x, w):
        return torch.vmap(lambda a: (a * 2, w + 1), in_dims=0, out_dims=(0, None))(x)

    x, w = torch.randn(3, 2), torch.randn(2)
    torch.testing.assert_close(thunder_rs.jit(f)(x, w), f(x, w))
    with pytest.raises(ValueError, match="out_dims is None"):
        thunder_rs.jit(lambda x: torch.vmap(lambda a: a * 2, out_dims=None)(x))(torch.randn(3))


@pytest.mark.parametrize("in_dims", [((0,), 0), [0, 0], ((0, 0, 0), None)], ids=["short", "list", "long"])
def test_in_dims_that_do_not_fit_the_arguments_raise_like_eager(in_dims):
    def f(x, y):
        return torch.vmap(lambda pair, b: pair[0] + pair[1] + b, in_dims=in_dims)((x, x), y)

    x, y = torch.randn(3), torch.randn(3)
    with pytest.raises(ValueError):
        f(x, y)
    with pytest.raises(ValueError, match=r"in_dims.*test_vmap\.py:\d+"):
        thunder_rs.jit(f)(x, y)


def selective_scan_combine(left, right):
    """Mamba's combine: states h_t = a_t * h_{t-1} + b_t compose as (a, b) pairs."""
    a_left, b_left = left
    a_right, b_right = right
    return a_left * a_right, a_right * b_left + b_right


def sequential_scan(a, b):
    """The recurrence the associative scan computes, one step at a time (eager Mamba's loop)."""
    products, states = [a[:, 0]], [b[:, 0]]
    for t in range(1, a.shape[1]):
        products.append(products[-1] * a[:, t])
        states.append(a[:, t] * states[-1] + b[:, t])
    return torch.stack(products, 1), torch.stack(states, 1)


@pytest.mark.parametrize("length", [1, 6, 7])
@pytest.mark.parametrize("mode", ["generic", "pointwise"])
def test_associative_scan_is_traced_and_equals_the_recurrence(mode, length):
    # generic: torch.vmap of the combine with nested in_dims; pointwise: the higher-order op,
    # which torch would compile and thunder_rs traces instead.
    from torch._higher_order_ops.associative_scan import associative_scan

    def f(a, b):
        products, states = associative_scan(selective_scan_combine, (a.sigmoid(), b), dim=1, combine_mode=mode)
        return (products * states).sum()

    a, b = torch.randn(2, length, 3, requires_grad=True), torch.randn(2, length, 3, requires_grad=True)
    jf = thunder_rs.jit(f)
    assert thunder_rs.examine(f, a, b).fallbacks == {}
    actual = jf(a, b)
    actual_grads = torch.autograd.grad(actual, (a, b))
    products, states = sequential_scan(a.sigmoid(), b)
    expected = (products * states).sum()
    # Eager's generic scan equals the recurrence; its pointwise backward does not (torch 2.15 on
    # the CPU: a's gradient is off by 0.19 to 1.8 at lengths 2 to 7), so the reference is the
    # recurrence, which eager Mamba runs.
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(actual_grads, torch.autograd.grad(expected, (a, b)))


def test_associative_scan_is_traced_with_a_symbolic_batch():
    # vmap's dtype check made meta tensors of the logical shapes, which failed with a symbolic
    # batch (Mamba's generate with another batch size): symbolic compiles stopped for the function.
    # torch's scan then tests ``result.shape.numel() > 0``, which specialised the batch (a compile
    # per batch size): that numel is symbolic now.
    from torch._higher_order_ops.associative_scan import associative_scan

    def f(a, b):
        return associative_scan(selective_scan_combine, (a.sigmoid(), b), dim=1, combine_mode="generic")[1]

    jf = thunder_rs.jit(f)
    for batch in (2, 3, 4, 5):
        a, b = torch.randn(batch, 4, 3), torch.randn(batch, 4, 3)
        torch.testing.assert_close(jf(a, b), sequential_scan(a.sigmoid(), b)[1])
    assert stays_symbolic(jf)
    assert thunder_rs.cache_misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons
