"""``out=`` under autograd, as eager: its error (type, text, the user's line) where grad mode is on
and an argument, ``out`` too, requires grad; the ops run where eager runs them."""

import warnings

import pytest
import torch

import thunder_rs

A, B = torch.randn(3, 3), torch.randn(3, 3)

#: Each on its own line: the error names the line of its op call.
RAISING = {
    "sin": lambda a, b: torch.sin(a, out=torch.empty(3, 3)),
    "add": lambda a, b: torch.add(a, b, alpha=2, out=torch.empty(3, 3)),
    "matmul": lambda a, b: torch.matmul(a, b, out=torch.empty(3, 3)),
    "mm": lambda a, b: torch.mm(a, b, out=torch.empty(3, 3)),
    "cat": lambda a, b: torch.cat([a, b], out=torch.empty(6, 3)),
    "sum_dim": lambda a, b: torch.sum(a, 0, out=torch.empty(3)),
    "clamp": lambda a, b: torch.clamp(a, -0.5, 0.5, out=torch.empty(3, 3)),
    "where": lambda a, b: torch.where(b > 0, a, b, out=torch.empty(3, 3)),
    "mul_number": lambda a, b: torch.mul(a, 2, out=torch.empty(3, 3)),
    "max_dim": lambda a, b: torch.max(a, 1, out=(torch.empty(3), torch.empty(3, dtype=torch.long))),
    "wrong_shape": lambda a, b: torch.sin(a, out=torch.empty(2)),
    "long_out": lambda a, b: torch.sin(a, out=torch.empty(3, 3, dtype=torch.long)),
}


def _error(fn, *args) -> str:
    with pytest.raises(RuntimeError) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize("name", list(RAISING))
def test_an_input_requiring_grad_is_eagers_error(name):
    fn = RAISING[name]
    a = A.clone().requires_grad_()
    eager = _error(fn, a, B)
    assert "out=... arguments don't support automatic differentiation" in eager
    where = f"(at {__file__}:{fn.__code__.co_firstlineno})"
    assert _error(thunder_rs.jit(fn), a, B) == f"{eager} {where}"


def test_out_requiring_grad_is_eagers_error():
    def fn(a, out):
        torch.sin(a, out=out)
        return out

    out = torch.zeros(3, 3, requires_grad=True)
    eager = _error(fn, A, out)
    assert _error(thunder_rs.jit(fn), A, out).startswith(eager)
    assert torch.equal(out, torch.zeros(3, 3))  # (neither wrote it)


def test_a_view_of_a_buffer_requiring_grad_is_eagers_error():
    def fn(a, buf):
        torch.mul(a, 2, out=buf[1:4])
        return buf

    eager = _error(fn, A, torch.zeros(5, 3, requires_grad=True))
    assert _error(thunder_rs.jit(fn), A, torch.zeros(5, 3, requires_grad=True)).startswith(eager)


def test_under_torch_compile_is_eagers_error():
    a = A.clone().requires_grad_()
    eager = _error(RAISING["sin"], a, B)
    assert eager in _error(torch.compile(RAISING["sin"], backend="thunder_rs"), a, B)


def _same_as_eager(fn, *args):
    fresh = lambda: [x.clone().requires_grad_(x.requires_grad) for x in args]  # noqa: E731
    expected, got = fn(*fresh()), thunder_rs.jit(fn)(*fresh())
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.stride() == e.stride() and g.requires_grad == e.requires_grad
        assert torch.equal(g, e)


def test_runs_where_eager_runs():
    def no_grad_mode(a, b):
        with torch.no_grad():
            out = torch.empty(3, 3)
            torch.add(a, b, out=out)
        return out, a * 2

    def nothing_requires_grad(a, b):
        out = torch.empty(3, 3)
        r = torch.mm(a.detach(), b, out=out)
        return out, r

    def results_without_gradients(a, b):
        flags, index = torch.empty(3, 3, dtype=torch.bool), torch.empty(3, dtype=torch.long)
        torch.gt(a, b, out=flags)
        torch.argmax(a, 0, out=index)
        return flags, index

    a = A.clone().requires_grad_()
    for fn in (no_grad_mode, nothing_requires_grad, results_without_gradients):
        _same_as_eager(fn, a, B)


def test_a_view_of_a_buffer_and_another_dtype_under_no_grad():
    def fn(a, buf):
        with torch.no_grad():
            torch.mul(a, 2, out=buf[1:4])
            wide = torch.empty(3, 3, dtype=torch.float64)
            torch.sin(a, out=wide)
        return buf, wide

    _same_as_eager(fn, A.clone().requires_grad_(), torch.zeros(5, 3))


def test_another_dtype_eager_refuses_under_no_grad():
    def fn(a):
        with torch.no_grad():
            return torch.sin(a, out=torch.empty(3, 3, dtype=torch.long))

    eager = _error(fn, A.clone().requires_grad_())
    assert "can't be cast" in eager
    with pytest.raises(RuntimeError, match="can't be cast"):
        thunder_rs.jit(fn)(A.clone().requires_grad_())


def _warned(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args)
    return result, [(str(w.message), w.filename, w.lineno) for w in caught]


def test_a_resize_eager_makes_of_a_tensor_the_program_made():
    def fn(a, b):
        out, index = torch.empty(2), torch.empty(0, dtype=torch.long)
        torch.add(a, b, out=out)
        torch.argmax(a, 0, out=index)
        with torch.no_grad():
            kept = torch.empty(5, 5)
            torch.sin(a, out=kept)
        return out, index, kept

    expected, eager_warnings = _warned(fn, A, B)
    got, jit_warnings = _warned(thunder_rs.jit(fn), A, B)
    for e, g in zip(expected, got):
        assert g.shape == e.shape and g.stride() == e.stride() and g.dtype == e.dtype
        assert torch.equal(g, e)
    assert len(jit_warnings) == len(eager_warnings) == 2  # (not for the empty one)
    for (text, *where), (eager_text, *eager_where) in zip(jit_warnings, eager_warnings):
        assert eager_text.startswith(text) and where == eager_where


def test_a_resize_into_a_dtype_eager_refuses():
    def fn(a):
        return torch.add(a, 1, out=torch.empty(0, dtype=torch.long))

    assert "can't be cast" in _error(fn, A)
    with pytest.raises(RuntimeError, match="can't be cast"):
        thunder_rs.jit(fn)(A)


def test_a_resize_of_a_tensor_requiring_grad_is_eagers_error():
    def fn(a):
        return torch.sin(a, out=torch.empty(2))

    a = A.clone().requires_grad_()
    assert _error(thunder_rs.jit(fn), a).startswith(_error(fn, a))


def test_out_written_by_a_node_without_a_derivative_is_refused():
    # Eager's torch.softmax writes ``out`` through a node whose backward raises ("derivative for
    # aten::softmax is not implemented"); a compiled call would differentiate it.
    def fn(a):
        out = torch.empty(3, 3)
        torch.softmax(a, 0, out=out)
        return out

    a = A.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="not implemented"):
        fn(a).sum().backward()
    with pytest.raises(NotImplementedError, match=f"out= at {__file__}"):
        thunder_rs.jit(fn)(a)
    with torch.no_grad():
        assert torch.equal(thunder_rs.jit(fn)(a), fn(a))


def test_a_call_under_no_grad_then_with_grad_mode_on():
    fn = RAISING["sin"]
    jfn, a = thunder_rs.jit(fn), A.clone().requires_grad_()
    with torch.no_grad():
        assert torch.equal(jfn(a, B), fn(a, B))
    assert _error(jfn, a, B).startswith(_error(fn, a, B))
    assert torch.equal(jfn(B, B), fn(B, B))


def test_under_torch_compile_runs_where_eager_runs():
    def fn(a, b):
        out, index = torch.empty(0), torch.empty(0, dtype=torch.long)
        torch.add(a, b, out=out)
        torch.argmax(a, 0, out=index)
        with torch.no_grad():
            buf = torch.zeros(5, 3)
            torch.mul(a, 2, out=buf[1:4])
        return out, index, buf

    expected, got = fn(A, B), torch.compile(fn, backend="thunder_rs")(A, B)
    for e, g in zip(expected, got):
        assert g.shape == e.shape and g.stride() == e.stride() and g.dtype == e.dtype
        assert torch.equal(g, e)
