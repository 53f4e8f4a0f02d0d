"""Views a jitted program returns whose memory it wrote in place after taking them, against eager:
eager's autograd makes such a view's node again at its next use, an ``AsStridedBackward0`` of the
base (whatever op took the view), and refuses any use of one of several views an op made
(``unbind``, ``split``) or of a view taken under ``no_grad`` (the call that returns it succeeds).

What differed: the call took the view again by the op the program called (a SliceBackward0 of
``y[1:]`` taken before ``y.mul_(2)``, where eager's is an AsStridedBackward0); a view written
itself was returned as the Function's output (no view, a CompiledFunctionBackward); a refused
view was returned with an ``UnbindBackward0`` that computed gradients eager refuses; later, such a
view was refused by the call, where eager's call returns it and refuses its use."""

import pytest
import torch

import thunder_rs

#: name -> view of a (3, 3) tensor
VIEWS = {
    "slice": lambda y: y[1:],
    "t": lambda y: y.t(),
    "view": lambda y: y.view(9),
    "expand": lambda y: y[0:1].expand(2, 3),
    "diagonal": lambda y: y.diagonal(),
    "select": lambda y: y[1],
    "narrow": lambda y: y.narrow(1, 1, 2),
    "a slice of a view": lambda y: y.view(9)[2:5],
}


def _before(view):
    def f(x):
        y = x * 1
        v = view(y)
        y.mul_(2)
        return v

    return f


def _after(view):
    def f(x):
        y = x * 1
        y.mul_(2)
        return view(y)

    return f


def _view_written(x):
    y = x * 1
    v = y[1:]
    v.mul_(2)
    return v


def _another_view_written(x):
    y = x * 1
    v = y[1:]
    y[0].mul_(2)
    return v


def _viewed_after(x):  # (a view of a view written since: a TBackward0 of an AsStridedBackward0)
    y = x * 1
    v = y[1:]
    y.mul_(2)
    return v.t()


def _under_no_grad(x):
    y = x * 1
    v = y[1:]
    with torch.no_grad():
        y.mul_(2)
    return v


def _through_detach(x):
    y = x * 1
    v = y[1:]
    y.detach().mul_(2)
    return v


def _through_data(x):  # (``.data`` has a version counter of its own: the view keeps its node)
    y = x * 1
    v = y[1:]
    y.data.mul_(2)
    return v


def _with_base(x):
    y = x * 1
    v = y[1:]
    y.mul_(2)
    return v, y, v[0]


def _of_written_input(x):
    v = x[1:]
    x.mul_(2)
    return v


def _of_input_written_through_view(x):
    v = x.t()
    x[0].add_(1)
    return v


def _of_view_as_real(x):  # (eager replays ``view_as_real``, then takes as_strided of it)
    z = torch.complex(x, x * 2)
    v = torch.view_as_real(z)[1:]
    z.mul_(2)
    return v


def _of_conj(x):
    z = torch.complex(x, x * 2)
    v = z.conj()[1:]
    z.mul_(2)
    return v


PROGRAMS = {
    **{f"{name}, taken before": _before(view) for name, view in VIEWS.items()},
    **{f"{name}, taken after": _after(view) for name, view in VIEWS.items()},
    "the view written": _view_written,
    "another view written": _another_view_written,
    "a view of it taken after": _viewed_after,
    "written under no_grad": _under_no_grad,
    "written through detach()": _through_detach,
    "written through .data": _through_data,
    "returned with its base": _with_base,
    "of a written input": _of_written_input,
    "of an input written through a view": _of_input_written_through_view,
    "of view_as_real": _of_view_as_real,
    "of a conjugate": _of_conj,
}


def _seen(outs, x):
    """What the caller sees: each view's node (an output that is no view has the compiled call's)
    and the views among its node's inputs, view-ness, base, layout; the identity of bases among the
    outputs and the argument."""
    named = {id(x): "x", **{id(o): i for i, o in enumerate(outs)}}
    seen = []
    for o in outs:
        node = o.grad_fn if o._is_view() else None
        below = [type(n).__name__ for n, _ in node.next_functions] if node is not None else []
        base = o._base
        seen.append(
            (
                type(node).__name__,
                [n for n in below if n.removesuffix("Backward0") in ("AsStrided", "Slice", "T", "ViewAsReal", "Conj")],
                o._is_view(),
                None if base is None else (tuple(base.shape), named.get(id(base), "other")),
                o.shape,
                o.stride(),
                o.storage_offset(),
                o.is_conj(),
            )
        )
    return seen


def _run(fn):
    leaf = torch.randn(3, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64, requires_grad=True)
    x = leaf * 1
    out = fn(x)
    outs = out if isinstance(out, tuple) else (out,)
    seen = _seen(outs, x)
    weights = [torch.arange(o.numel()).to(o.dtype).reshape(o.shape) for o in outs]
    sum(torch.view_as_real((o * w).sum().resolve_conj() + 0j).sum() for o, w in zip(outs, weights)).backward()
    return seen, [o.detach().clone() for o in outs], x.detach().clone(), leaf.grad


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_returned_view_has_eagers_node_base_values_and_gradient(name):
    fn = PROGRAMS[name]
    seen, outs, x, grad = _run(fn)
    jseen, jouts, jx, jgrad = _run(thunder_rs.jit(fn))
    assert jseen == seen
    assert all(torch.equal(a, b) for a, b in zip(jouts, outs))
    assert torch.equal(jx, x)
    torch.testing.assert_close(jgrad, grad)


def _unbind_before(x):
    y = x * 1
    v = y.unbind(0)[1]
    y.mul_(2)
    return v


def _split_before(x):
    y = x * 1
    a = y.split(2)[0][0]  # (a view of one: eager refuses it as well)
    y[2].add_(1)
    return a


def _unbind_of_memory_requiring_no_grad(x):  # (eager: "A view was created in no_grad mode ...")
    y = torch.zeros(4, 3)
    v = y.unbind(0)[1]
    y.add_(x)
    return v


def _no_grad_view(x):
    y = x * 1
    with torch.no_grad():
        v = y[1:]
    y.mul_(2)
    return v


def _chunk_before(x):
    y = x * 1
    v = y.chunk(2)[1]
    y.mul_(2)
    return v


def _of_written_argument_unbind(x):
    v = x.unbind(0)[1]
    x.mul_(2)
    return v


def _of_written_argument_no_grad(x):
    with torch.no_grad():
        v = x[1:]
    x.mul_(2)
    return v


#: a use of the returned view: eager's autograd refuses each but the last two
USES = {
    "grad_fn": lambda v: v.grad_fn,
    "an op with grad": lambda v: v * 2,
    "an in-place write": lambda v: v.add_(1),
    "a backward through it": lambda v: v.sum().backward(),
    "an op under no_grad": lambda v: torch.no_grad()(lambda: v * 2)(),
    "detach()": lambda v: v.detach() + 1,
}


def _uses(fn):
    """What each use of the view ``fn`` returns does (the error's type and text, or the value),
    with the view's version, view-ness, requires_grad and base's shape."""
    seen = []
    for use in USES.values():
        leaf = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
        v = fn(leaf * 1)
        seen.append((v._version, v._is_view(), v.requires_grad, tuple(v._base.shape), v.shape))
        try:
            out = use(v)
        except RuntimeError as e:
            seen.append((type(e), str(e)))
        else:
            seen.append(None if out is None else out.detach().clone())
    return seen


def _same(a, b) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


@pytest.mark.parametrize(
    "fn",
    [
        _unbind_before,
        _split_before,
        _chunk_before,
        _no_grad_view,
        _of_written_argument_unbind,
        _of_written_argument_no_grad,
    ],
)
def test_a_view_whose_use_eager_refuses_raises_eagers_error_at_the_use(fn):
    """The call returns the view; its use raises eager's error, as eager's does, not the call."""
    seen, jseen = _uses(fn), _uses(thunder_rs.jit(fn))
    assert _same(jseen, seen)
    assert sum(isinstance(s, tuple) and s[0] is RuntimeError for s in seen) == 4


def test_a_view_whose_refusal_is_not_eagers_is_refused_at_the_call():
    """One of several views of memory that required no grad when taken: eager's view has no node,
    the call's would (its root is the call's output), and torch's error would name it."""
    fn = _unbind_of_memory_requiring_no_grad
    x = torch.randn(4, 3, requires_grad=True) * 1
    v = fn(x)
    with pytest.raises(RuntimeError) as eager:
        v.grad_fn
    with pytest.raises(NotImplementedError) as jitted:
        thunder_rs.jit(fn)(x)
    assert str(eager.value) in str(jitted.value)
    assert "test_rebased_view_grad_fns.py" in str(jitted.value)  # (the line of the write)


@pytest.mark.parametrize("fn", [_unbind_before, _split_before, _unbind_of_memory_requiring_no_grad, _no_grad_view])
def test_a_refused_view_runs_where_no_output_requires_grad(fn):
    x = torch.randn(4, 3)
    torch.testing.assert_close(thunder_rs.jit(fn)(x), fn(x))


def test_a_view_of_several_taken_after_the_write_is_eagers():
    def f(x):
        y = x * 1
        y.mul_(2)
        return y.unbind(0)

    seen, outs, x, grad = _run(f)
    jseen, jouts, jx, jgrad = _run(thunder_rs.jit(f))
    assert jseen == seen and seen[0][0] == "UnbindBackward0"
    assert all(torch.equal(a, b) for a, b in zip(jouts, outs))
    torch.testing.assert_close(jgrad, grad)


def test_views_of_symbolic_sizes_are_eagers_at_each_size():
    def f(x):
        y = x * 1
        v, w = y[1:], y.view(-1)[2:]
        y.mul_(2)
        return v, w

    jf = thunder_rs.jit(f)
    for n in (3, 4, 5):  # (the second size compiles with symbolic sizes, the third reuses it)
        leaf = torch.randn(n, 3, dtype=torch.float64, requires_grad=True)
        seen, jseen = _seen(f(leaf * 1), leaf), _seen(jf(leaf * 1), leaf)
        assert jseen == seen and seen[0][0] == "AsStridedBackward0"
    assert thunder_rs.compile_stats(jf).cache_misses == 2


def test_a_view_of_a_written_argument_at_another_offset_is_eagers():
    """The view's layout, kept per layout of the tensor it is taken of, follows each call's offset."""
    jf = thunder_rs.jit(_of_written_input)
    for start in (0, 1, 2):
        leaf = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
        x, jx = (leaf * 1)[start : start + 3], (leaf * 1)[start : start + 3]
        v, jv = _of_written_input(x), jf(jx)
        assert (jv.storage_offset(), jv.stride(), type(jv.grad_fn).__name__) == (
            v.storage_offset(),
            v.stride(),
            type(v.grad_fn).__name__,
        )
        assert torch.equal(jv, v) and jv._base is jx._base


def test_one_of_several_views_at_symbolic_sizes_raises_eagers_error_at_the_use():
    jf = thunder_rs.jit(_chunk_before)
    for n in (4, 6, 8):  # (the second size compiles with symbolic sizes, the third reuses it)
        leaf = torch.randn(n, 3, requires_grad=True)
        v, jv = _chunk_before(leaf * 1), jf(leaf * 1)
        with pytest.raises(RuntimeError) as eager:
            v * 2
        with pytest.raises(RuntimeError) as jitted:
            jv * 2
        assert str(jitted.value) == str(eager.value) and torch.equal(jv.detach(), v.detach())
    assert thunder_rs.compile_stats(jf).cache_misses == 2
