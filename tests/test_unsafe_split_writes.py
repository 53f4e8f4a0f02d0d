"""In-place writes into the pieces of ``unsafe_split`` and ``unsafe_chunk``, compared with eager.
Eager's pieces share memory with their input but are no views to autograd (no ``_base``, a
version counter of their own): a write into a piece runs, changes the input's values (a leaf's
too) where the input's autograd does not see it, and the piece's own history records it; a write
into the input changes the pieces' values, not their histories. Values, gradients and the
caller's tensor are eager's; where eager's backward would read values written so (a tensor an op
saved), the compile refuses.

What differed: the pieces were taken as one op's several views, and a write into one was refused
with eager's error for those ("Output 0 of UnsafeSplit is a view and is being modified inplace")."""

import pytest
import torch

import thunder_rs


def _written_piece_then_base(x):
    y = x * 1.5
    p = torch.unsafe_chunk(y, 3, 1)[1]
    p.mul_(2)
    return y * y, p * 3


def _written_base_then_piece(x):
    y = x * 2
    p, _ = y.unsafe_split(2)
    y.mul_(3)
    return p * 1, y


def _through_views_of_pieces(x):
    y = x * 2
    p, q = y.unsafe_split(3, 1)
    p[0] = 7.0
    q.t().mul_(2)
    return y.exp(), p.sum(1), q * x[:, 3:]


def _under_no_grad(x):
    with torch.no_grad():
        x.unsafe_split(2)[0].add_(1)
    return x * 2


PROGRAMS = {
    "a piece of a leaf": lambda x: (torch.unsafe_split(x, 2, 1)[0].add_(1), x * 2),
    "a piece of a leaf, the piece returned": lambda x: torch.unsafe_split(x, 2, 1)[0].add_(1),
    "unsafe_chunk of an intermediate": _written_piece_then_base,
    "the input written, a piece read": _written_base_then_piece,
    "through views of pieces": _through_views_of_pieces,
    "under no_grad": _under_no_grad,
}


def _run(fn):
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64, requires_grad=True)
    outs = fn(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    loss = sum((o * torch.arange(o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in outs if o.requires_grad)
    (grad,) = torch.autograd.grad(loss, x)
    return [o.detach() for o in outs], grad, x.detach()


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_write_into_a_piece_or_its_input_is_eagers(name):
    fn = PROGRAMS[name]
    (eager_outs, eager_grad, eager_x), (outs, grad, x) = _run(fn), _run(thunder_rs.jit(fn))
    assert all(torch.equal(o, e) for o, e in zip(outs, eager_outs))
    assert torch.equal(grad, eager_grad) and torch.equal(x, eager_x)


def test_a_write_eagers_backward_reads_unseen_is_refused():
    """Eager's sin backward reads ``y`` as the piece's write left it; the compiled one would not."""

    def fn(x):
        y = x * 2
        s = y.sin()
        y.unsafe_split(2)[0].add_(1)
        return s

    with pytest.raises(NotImplementedError, match="unsafe_split"):
        thunder_rs.jit(fn)(torch.randn(4, 6, requires_grad=True))
