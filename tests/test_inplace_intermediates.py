"""Writes through a slice of a tensor the program made, run in place (``passes::reinplace``), and
eager's version counts of written arguments set by bumps: what runs, and that everything a caller
can see is eager's (values, ``_base``, offsets, strides, versions, gradients, errors), also where
the in-place form must not be taken (saved for backward, under grad, symbolic sizes, a base that
is an argument, a value of another dtype, an alias read after the write)."""

import pytest
import torch

import thunder_rs


def _execution(jf) -> str:
    return str(thunder_rs.last_traces(jf)[-1])


def _view_written(x):
    y = x * 1
    v = y[1:]
    v.mul_(2)
    return v


def _two_writes(x):
    y = x * 1
    y[1:].mul_(2)
    y[2:].add_(1)
    return y


def _columns_written(x):
    y = x * 1
    y[:, 1:3].add_(x[:, :2])
    return y.sum(0)


def _base_and_view(x):
    y = x * 1
    v = y[1:]
    v.mul_(2)
    return y, v


def _view_written_twice_then_viewed(x):
    y = x.exp()
    v = y[1::2]
    v.mul_(2)
    v.sub_(1)
    return v.t()


#: programs whose writes run in place, with the calls eager runs
IN_PLACE = {
    "a view written, returned": (_view_written, ["mul_"]),
    "two slices written": (_two_writes, ["mul_", "add_"]),
    "columns written with an argument's": (_columns_written, ["add_"]),
    "the base and its view returned": (_base_and_view, ["mul_"]),
    "a strided view written twice, transposed": (_view_written_twice_then_viewed, ["mul_", "sub_"]),
}


def _seen(out) -> list:
    """What a caller can see of the outputs ``out``: values, layout, versions, their bases."""
    outs = out if isinstance(out, tuple) else (out,)
    seen = []
    for o in outs:
        base = o._base
        seen.append((o.shape, o.stride(), o.storage_offset(), o._version, o.dtype))
        seen.append(None if base is None else (base.shape, base.stride(), base._version))
    return seen


def _same_as_eager(fn, jf, x):
    out, jout = fn(x.clone()), jf(x.clone())
    outs, jouts = (out, jout) if isinstance(out, tuple) else ((out,), (jout,))
    assert _seen(jout) == _seen(out)
    for a, b in zip(jouts, outs):
        assert torch.equal(a, b)
        assert (a._base is None) == (b._base is None)
        if b._base is not None:
            assert torch.equal(a._base, b._base)
    return outs, jouts


@pytest.mark.parametrize("name", list(IN_PLACE))
def test_a_write_through_a_slice_of_a_made_tensor_runs_in_place_as_eager(name):
    fn, writes = IN_PLACE[name]
    jf = thunder_rs.jit(fn)
    x = torch.randn(6, 4)
    for _ in range(3):
        _same_as_eager(fn, jf, x)
    code = _execution(jf)
    assert "slice_scatter" not in code and "slice_overwrite" not in code
    assert all(f".{w}(" in code for w in writes), code


def test_the_base_returned_beside_its_written_view_is_the_views_base():
    jf = thunder_rs.jit(_base_and_view)
    y, v = jf(torch.randn(6, 4))
    assert v._base is y
    assert y._version == v._version == 1
    v.add_(1)  # (writes y too, as eager's)
    assert y._version == 2 and torch.equal(y[1:], v)


def _alias_read_after(x):
    y = x * 1
    u = y[1:]
    v = y[1:]
    v.mul_(2)
    return u + v


def _old_values_kept(x):
    y = x * 1
    before = y.clone()
    v = y[1:]
    v.mul_(2)
    return y - before


def _base_is_argument(x):
    v = x[1:]
    v.mul_(2)
    return v


def _wider_value(x):
    y = x * 1
    v = y[1:]
    v.add_(torch.ones(5, 4, dtype=torch.float64) / 3)
    return v


def _broadcast_write(x):
    y = x * 1
    v = y[1:]
    v.add_(x[0])
    return y


def _scatter_called(x):
    y = x * 1
    return torch.slice_scatter(y, y[1:] * 2, 0, 1, 6, 1)  # (a new tensor, at version 0)


#: programs the in-place form must leave as they are, or that must stay eager's when it applies
KEPT = {
    "a slice_scatter the program calls": _scatter_called,
    "another view read after the write": _alias_read_after,
    "a copy of the old values": _old_values_kept,
    "a view of an argument": _base_is_argument,
    "a value of a wider dtype": _wider_value,
    "a row broadcast into the slice": _broadcast_write,
}


@pytest.mark.parametrize("name", list(KEPT))
def test_writes_the_in_place_form_must_not_change_are_eagers(name):
    fn = KEPT[name]
    jf = thunder_rs.jit(fn)
    x = torch.randn(6, 4)
    for _ in range(2):
        xe, xj = x.clone(), x.clone()
        out, jout = fn(xe), jf(xj)
        assert torch.equal(jout, out)
        assert _seen(jout) == _seen(out)
        assert torch.equal(xj, xe) and xj._version == xe._version


def test_a_wider_value_is_written_functionally():
    jf = thunder_rs.jit(_wider_value)
    jf(torch.randn(6, 4))
    assert "slice_scatter" in _execution(jf)


@pytest.mark.parametrize("name", ["a view written, returned", "the base and its view returned"])
def test_under_grad_the_write_is_eagers_and_differentiated(name):
    """With grad, autograd saves values for the backward: the trace writes functionally, and the
    outputs' nodes, values and gradients are eager's."""
    fn, _ = IN_PLACE[name]
    w = torch.randn(6, 4, requires_grad=True)
    jw = w.detach().clone().requires_grad_()
    jf = thunder_rs.jit(fn)
    out, jout = fn(w), jf(jw)
    outs, jouts = (out, jout) if isinstance(out, tuple) else ((out,), (jout,))
    views = [i for i, o in enumerate(outs) if o._base is not None]  # (their nodes: eager's AsStridedBackward0)
    assert [type(jouts[i].grad_fn).__name__ for i in views] == [type(outs[i].grad_fn).__name__ for i in views]
    assert _seen(jout) == _seen(out)
    sum(((o * o).sum() for o in outs)).backward()
    sum(((o * o).sum() for o in jouts)).backward()
    assert torch.equal(jw.grad, w.grad)


def _saved_then_written(x, w):
    y = x * w
    z = y * y  # (mul saves y for its backward)
    v = y[1:]
    v.mul_(2)
    return z, v


def test_a_value_saved_for_backward_and_written_after_raises_as_eager():
    x = torch.randn(6, 4)
    w, jw = (torch.randn(6, 4, requires_grad=True) for _ in range(2))
    with torch.no_grad():
        jw.copy_(w)
    z, v = _saved_then_written(x, w)
    jz, jv = thunder_rs.jit(_saved_then_written)(x, jw)
    assert torch.equal(jz, z) and torch.equal(jv, v)
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as eager:
        z.sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as jitted:
        jz.sum().backward()
    assert str(jitted.value).startswith(str(eager.value))  # (and where the program wrote it)


def test_symbolic_sizes_write_as_eager():
    jf = thunder_rs.jit(_view_written, dynamic=True)
    for n in (5, 7, 9):
        _same_as_eager(_view_written, jf, torch.randn(n, 3))


def _arg_written(n):
    def fn(x, y):
        for _ in range(n):
            x.add_(1)
        y.mul_(2)
        y.mul_(2)
        return x

    return fn


@pytest.mark.parametrize("n", [0, 1, 3, 12])
def test_written_arguments_end_at_eagers_versions(n):
    """Bumped once per write the copy does not make (few: one ``_increment_version`` call; many,
    or none at all: the counter set), also under ``inference_mode`` (no counter) and with grad."""
    fn = _arg_written(n)
    jf = thunder_rs.jit(fn)
    for grad in (False, True):
        base = torch.randn(3, requires_grad=grad)
        xe, ye, xj, yj = (base * 1 for _ in range(4))
        for _ in range(2):
            fn(xe, ye)
            jf(xj, yj)
        assert (xj._version, yj._version) == (xe._version, ye._version)
        assert torch.equal(xj, xe) and torch.equal(yj, ye)
    with torch.inference_mode():
        xe, ye = torch.ones(3), torch.ones(3)
        xj, yj = xe.clone(), ye.clone()
        fn(xe, ye)
        jf(xj, yj)
    assert torch.equal(xj, xe) and torch.equal(yj, ye)
