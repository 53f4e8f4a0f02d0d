"""Hit-path shortcuts that must leave every call as eager's: a view returned after a write through it
(``output_views.OutputViews.own``: the trace's own view where the write ran in place, else the view
taken again of its root), checked against eager's values, strides, offsets, versions and bases."""

import pytest
import torch

import thunder_rs


def _written_view(x):
    y = x * 1
    v = y[1:]
    v.mul_(2)
    return v


def _written_view_and_base(x):
    y = x * 1
    v = y[1:]
    v.mul_(2)
    return y, v


def _written_transpose(x):
    y = x * 1
    v = y[1:].t()
    v.mul_(2)
    return v


def _two_written_views(x):
    y = x * 1
    v = y[1:]
    v.mul_(2)
    w = y[:2]
    w.add_(1)
    return v, w


def _base_read_after(x):  # (the base only read after the write)
    y = x * 1
    v = y[1:]
    v.mul_(2)
    return v, y.sum()


def _as_list(x):
    y = x * 1
    v = y[2:]
    v.sub_(1)
    return [v, x.sum()]


def _two_writes(x):  # (not run in place: the first write's values are read by the second)
    y = x * 1
    v = y[1:]
    v.mul_(2)
    v.add_(3)
    return v


def _not_in_place(x):  # (a write whose value no in-place method computes)
    y = x * 1
    v = y[1:]
    v.copy_(torch.ones(7, 8))
    return v


PROGRAMS = [
    _written_view,
    _written_view_and_base,
    _written_transpose,
    _two_written_views,
    _base_read_after,
    _as_list,
    _two_writes,
    _not_in_place,
]


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _layout(t):
    return t.shape, t.stride(), t.storage_offset(), t._version, t._base is None, t.dtype


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_a_view_written_through_is_returned_as_eager_returns_it(fn):
    jf = thunder_rs.jit(fn)
    for _ in range(3):  # (the compile, then hits)
        x = torch.randn(8, 8)
        expected, actual = fn(x.clone()), jf(x.clone())
        assert type(actual) is type(expected)
        for e, a in zip(_flat(expected), _flat(actual), strict=True):
            assert torch.equal(a, e)
            assert _layout(a) == _layout(e)
            if e._base is not None:  # (a view of the program's tensor: its base's values and layout too)
                assert torch.equal(a._base, e._base) and _layout(a._base) == _layout(e._base)


def test_the_returned_view_and_base_share_memory_as_in_eager():
    jf = thunder_rs.jit(_written_view_and_base)
    for _ in range(3):
        y, v = jf(torch.randn(8, 8))
    assert v._base is y
    v.add_(1)  # (a write through the returned view reaches its base, and both versions, as eager's)
    ey, ev = _written_view_and_base(torch.zeros(8, 8))
    ev.add_(1)
    assert (y._version, v._version) == (ey._version, ev._version) == (2, 2)
    assert torch.equal(y[1:], v)


def test_the_write_runs_in_place_and_the_trace_returns_the_view():
    """The trace writes through the slice in place (``passes::reinplace``) and returns that slice
    as the program's view, with no view taken again after the call."""
    jf = thunder_rs.jit(_written_view)
    jf(torch.randn(8, 8))
    source = str(thunder_rs.last_traces(jf)[-1])
    assert ".mul_(2)" in source and "slice_scatter" not in source
    assert source.rstrip().splitlines()[-1].strip().startswith("return (")  # (the base, then the view)


@pytest.mark.parametrize("fn", [_written_view, _base_read_after, _two_written_views], ids=lambda f: f.__name__)
def test_writes_through_slices_still_run_in_place(fn):
    """Returning the views' own values keeps the writes in place where they ran in place before:
    the base read after the write, or written through another slice after it."""
    jf = thunder_rs.jit(fn)
    jf(torch.randn(8, 8))
    assert "slice_scatter" not in str(thunder_rs.last_traces(jf)[-1])


def test_the_view_is_taken_again_where_the_write_did_not_run_in_place():
    jf = thunder_rs.jit(_two_writes)
    jf(torch.randn(8, 8))
    assert "slice_scatter" in str(thunder_rs.last_traces(jf)[-1])
    x = torch.randn(8, 8)
    v, ev = jf(x.clone()), _two_writes(x.clone())
    assert v._base is not None and _layout(v) == _layout(ev) and torch.equal(v, ev)


def _copied_then_written(x, z):
    y = z * 1
    v = y[1:]
    v.mul_(2)
    x.copy_(v)  # (the values before the next write, which also reaches v's memory)
    y[:2].add_(5)
    return v


def test_values_copied_out_before_a_later_write_keep_the_values_copied():
    jf = thunder_rs.jit(_copied_then_written)
    for _ in range(3):
        x, z = torch.randn(7, 8), torch.randn(8, 8)
        ex, jx = x.clone(), x.clone()
        expected, actual = _copied_then_written(ex, z), jf(jx, z)
        assert torch.equal(jx, ex) and jx._version == ex._version
        assert torch.equal(actual, expected) and _layout(actual) == _layout(expected)
