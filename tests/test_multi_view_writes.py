"""In-place writes into the views ``split``, ``chunk``, ``split_with_sizes`` and ``unbind`` return,
compared with eager: eager refuses a write autograd sees into one of them, or into a view of one
("Output 0 of Split is a view and is being modified inplace ... returns multiple views"), and runs
the writes it does not see (``detach()``, ``no_grad``, memory and value that require no grad) and
those into the ordinary views ``tensor_split``, ``hsplit`` and ``unsafe_split`` return.

What differed: a split into one piece (``(x * 2).split(4, 1)[0].add_(1)``, ``chunk(1)``,
``unbind`` of a dim of size 1) returned one view, which the trace took as an ordinary view, and
ran the write; indexed assignment into a piece (``piece[0] = v``, ``piece[mask] = v``) wrote
through a view the trace took unnoted, and ran; a value that requires grad written into a piece
of memory that does not ran (eager: "A view was created in no_grad mode and is being modified
inplace with grad mode enabled ... returns multiple views")."""

import pytest
import torch

import thunder_rs


def _split_whole(x):
    return (x * 2).split(4, 1)[0].add_(1)


def _assigned(take, key, value=1.0):
    def f(x):
        piece = take(x * 2)
        piece[key(piece) if callable(key) else key] = value
        return piece

    return f


def _into_unrequired(take, write):
    """A piece of memory that requires no grad, written with a value of ``x``'s."""

    def f(x):
        base = torch.zeros(3, 4)
        write(take(base), x)
        return base

    return f


def _no_grad_split(x):
    with torch.no_grad():
        return (x * 2).split(4, 1)[0].add_(1)


REFUSED = {
    "split into one piece": _split_whole,
    "split into pieces": lambda x: (x * 2).split(2, 1)[0].add_(1),
    "chunk(1)": lambda x: (x * 2).chunk(1, 1)[0].sub_(1),
    "chunk(1) of dim 0": lambda x: (x * 2).chunk(1, 0)[0].mul_(2),
    "split_with_sizes([4])": lambda x: (x * 2).split_with_sizes([4], 1)[0].add_(1),
    "torch.split([4])": lambda x: torch.split(x * 2, [4], 1)[0].add_(1),
    "unbind of a dim of size 1": lambda x: (x[:1] * 2).unbind(0)[0].add_(1),
    "split of a leaf": lambda x: x.split(4, 1)[0].add_(1),
    "copy_ into one piece": lambda x: (x * 2).split(4, 1)[0].copy_(x),
    "a view of one piece": lambda x: (x * 2).split(4, 1)[0].view(12).add_(1),
    "piece[0] =": _assigned(lambda h: h.split(2, 1)[0], 0),
    "piece[0] = (one piece)": _assigned(lambda h: h.split(4, 1)[0], 0),
    "unbind piece[0] =": _assigned(lambda h: h.unbind(1)[0], 0),
    "piece[:] =": _assigned(lambda h: h.split(2, 1)[0], slice(None)),
    "piece[...] =": _assigned(lambda h: h.split(2, 1)[0], Ellipsis),
    "piece[:, :5] =": _assigned(lambda h: h.split(2, 1)[0], (slice(None), slice(None, 5))),
    "piece[..., 0:1] =": _assigned(lambda h: h.split(2, 1)[0], (Ellipsis, slice(0, 1))),
    "piece[1:, ...] =": _assigned(lambda h: h.split(2, 1)[0], (slice(1, None), Ellipsis)),
    "piece[mask] = (one piece)": _assigned(lambda h: h.split(4, 1)[0], lambda p: p > 0),
    "piece[[0, 1]] =": _assigned(lambda h: h.split(2, 1)[0], [0, 1]),
    "unrequired piece.add_(x)": _into_unrequired(lambda b: b.split(2, 1)[0], lambda p, x: p.add_(x[:, :2])),
    "unrequired one piece.add_(x)": _into_unrequired(lambda b: b.split(4, 1)[0], lambda p, x: p.add_(x)),
    "unrequired piece[:] = x": _into_unrequired(
        lambda b: b.split(2, 1)[0], lambda p, x: p.__setitem__(slice(None), x[:, :2])
    ),
    "unrequired piece[0] = x": _into_unrequired(lambda b: b.split(2, 1)[0], lambda p, x: p.__setitem__(0, x[0, :2])),
}

ALLOWED = {
    "under no_grad": _no_grad_split,
    "through detach()": lambda x: (x * 2).split(4, 1)[0].detach().add_(1),
    "unrequired piece.add_(1)": lambda x: _into_unrequired(lambda b: b.split(4, 1)[0], lambda p, _: p.add_(1))(x) * x,
    "unsafe_split into one piece": lambda x: (x * 2).unsafe_split(4, 1)[0].add_(1),
    "tensor_split(1)": lambda x: (x * 2).tensor_split(1, 1)[0].add_(1),
    "hsplit(1)": lambda x: (x * 2).hsplit(1)[0].add_(1),
    "meshgrid of one": lambda x: torch.meshgrid(x[0] * 2, indexing="ij")[0].add_(1),
    "broadcast_tensors of one": lambda x: torch.broadcast_tensors(x * 2)[0].add_(1),
    "tensor_split piece[0] =": _assigned(lambda h: h.tensor_split(2, 1)[0], 0),
    "a slice's [0] =": _assigned(lambda h: h[:, :2], 0),
}


def _x():
    return torch.randn(3, 4, requires_grad=True)


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_write_eager_refuses_raises_eagers_error(name):
    fn = REFUSED[name]
    with pytest.raises(RuntimeError) as eager:
        fn(_x())
    with pytest.raises(RuntimeError) as jitted:
        thunder_rs.jit(fn)(_x())
    assert "returns multiple views" in str(eager.value)
    assert str(jitted.value).startswith(str(eager.value)), (str(jitted.value), str(eager.value))


@pytest.mark.parametrize("name", list(ALLOWED))
def test_a_write_eager_runs_gives_eagers_values_and_gradient(name):
    fn = ALLOWED[name]
    x = _x()
    results = []
    for call in (fn, thunder_rs.jit(fn)):
        xi = x.detach().clone().requires_grad_()
        out = call(xi)
        grad = torch.autograd.grad(out.sum(), xi) if out.requires_grad else None
        results.append((out.detach(), grad, out.requires_grad))
    (expected, eager_grad, eager_rg), (got, grad, rg) = results
    assert rg == eager_rg
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if eager_grad is not None:
        torch.testing.assert_close(grad, eager_grad, rtol=0, atol=0)


def test_the_jit_raises_again_on_a_cache_hit():
    jfn = thunder_rs.jit(_split_whole)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="returns multiple views"):
            jfn(_x())
