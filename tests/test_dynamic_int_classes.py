"""An int argument that changes on every call (a step counter, a decode position) is served by
the symbolic entry compiled for it at every new value without a key of its own: the call's key
with the int's value from 2 up replaced by its class finds the entry (``dynamic.IntClasses``), whose
guards are checked as before. The cache does not grow with the values, other shapes' entries are
not evicted, and 0, 1, negative values and the program's branches on the value keep their own
entries. Every call is checked against eager."""

import pytest
import torch

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")


def stats(jfn):
    return thunder_rs.compile_stats(jfn)


def stored(jfn) -> int:
    """The entries the cache holds, over all keys."""
    return sum(map(len, thunder_rs._function(jfn)._variants.values()))


def counter(x, n):
    return x * n + 1


def test_a_counter_is_served_by_one_entry_without_growing_the_cache():
    jf = thunder_rs.jit(counter)
    x = torch.randn(8)
    for n in range(2, 302):
        torch.testing.assert_close(jf(x, n), counter(x, n), rtol=0, atol=0)
    assert stats(jf).cache_misses == 2, stats(jf).miss_reasons
    assert stored(jf) == 2 and stats(jf).evictions == 0
    assert stats(jf).cache_hits == 298


def test_a_counter_leaves_the_entries_of_other_dtypes_in_the_cache():
    jf = thunder_rs.jit(counter)
    shapes = [torch.randn(8, dtype=dtype) for dtype in (torch.float32, torch.float64, torch.bfloat16)]
    for x in shapes:  # (each dtype an entry of its own)
        jf(x, 2)
    misses = stats(jf).cache_misses
    for n in range(3, 303):
        torch.testing.assert_close(jf(shapes[0], n), counter(shapes[0], n), rtol=0, atol=0)
    for x in shapes:
        torch.testing.assert_close(jf(x, 2), counter(x, 2), rtol=0, atol=0)
    assert stats(jf).cache_misses == misses + 1, stats(jf).miss_reasons
    assert stats(jf).evictions == 0 and stored(jf) == misses + 1


def branching(x, n):
    if n > 100:
        return x * n
    return x - n + x[: min(n, 4)].sum()


def test_a_branch_on_the_counter_serves_the_side_each_value_takes():
    jf = thunder_rs.jit(branching)
    x = torch.randn(8)
    values = [v for pair in zip(range(2, 152), range(300, 150, -1)) for v in pair]
    for n in [*values, 0, 1, -3, 100, 101]:
        torch.testing.assert_close(jf(x, n), branching(x, n))
    assert stats(jf).cache_misses <= 8, stats(jf).miss_reasons
    assert stored(jf) == stats(jf).cache_misses and stats(jf).evictions == 0


def keyed_counter(x, state):
    return x * state["step"] + state["scale"]


def test_an_int_in_a_dict_argument_is_served_like_an_argument():
    jf = thunder_rs.jit(keyed_counter)
    x = torch.randn(8)
    for n in [*range(2, 302), 1, 0]:
        state = {"step": n, "scale": 3}
        torch.testing.assert_close(jf(x, state), keyed_counter(x, state), rtol=0, atol=0)
    assert stats(jf).cache_misses == 4, stats(jf).miss_reasons
    assert stored(jf) == 4 and stats(jf).evictions == 0


def test_ints_below_two_and_a_relation_on_the_value_keep_their_entries():
    def f(x, n):
        return x[:n] * n

    jf = thunder_rs.jit(f)
    x = torch.randn(10)
    for n in [*range(2, 40), 1, 0, -2, *range(40, 2, -1), 1, 0, -2]:
        out, want = jf(x, n), f(x, n)
        assert out.shape == want.shape and out.stride() == want.stride()
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert stored(jf) == stats(jf).cache_misses <= 8, stats(jf).miss_reasons


def reads_a_value(x, n):
    if (x.sum() > 0).item():
        return x * n
    return x - n


def test_a_counter_in_a_program_that_reads_a_value_keeps_one_variant_per_side():
    jf = thunder_rs.jit(reads_a_value)
    for n in range(2, 302):
        x = torch.randn(6) + (3 if n % 3 else -3)
        torch.testing.assert_close(jf(x, n), reads_a_value(x, n), rtol=0, atol=0)
    assert stats(jf).cache_misses == 3, stats(jf).miss_reasons
    assert stored(jf) == 3 and stats(jf).evictions == 0 and stats(jf).eager_calls == 0


def rows(x, y):
    return (x * 2 + y).sum(0)


def test_a_changing_tensor_size_is_served_without_growing_the_cache():
    jf = thunder_rs.jit(rows)
    for n in [*range(2, 302), 1, 300, 1]:
        x, y = torch.randn(n, 3), torch.randn(n, 1)
        out, want = jf(x, y), rows(x, y)
        assert out.shape == want.shape and out.stride() == want.stride()
        torch.testing.assert_close(out, want)
    assert stats(jf).cache_misses == 3, stats(jf).miss_reasons
    assert stored(jf) == 3 and stats(jf).evictions == 0


def test_sizes_the_trace_relates_keep_their_guard_at_new_sizes():
    jf = thunder_rs.jit(rows)
    for n in range(2, 200):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        torch.testing.assert_close(jf(x, y), rows(x, y))
        with pytest.raises(RuntimeError, match="must match the size"):  # (eager's broadcast error)
            rows(x, torch.randn(n + 1, 3))
        with pytest.raises(RuntimeError, match="must match the size"):
            jf(x, torch.randn(n + 1, 3))
    assert stored(jf) == stats(jf).cache_misses <= 6, stats(jf).miss_reasons


def test_a_strided_tensor_of_changing_size_matches_eager():
    jf = thunder_rs.jit(rows)
    for n in range(2, 60):
        x = torch.randn(3, n).t()
        out, want = jf(x, x), rows(x, x)
        assert out.stride() == want.stride()
        torch.testing.assert_close(out, want)
    assert stats(jf).evictions == 0
