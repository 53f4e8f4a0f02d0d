"""Views a jitted program returns, taken with an int argument that changes from call to call (and so
became a symbolic size), compared with eager by what a caller sees: the view's ``grad_fn``
(``x[n]`` a SelectBackward0, ``x.split(n)[1]`` a SplitBackward0), its creation meta (a write into
one of ``split``'s views is refused), ``_base``, strides, values, and the gradient through it.

What differed: the call takes a returned view again by the torch op the program called
(``views.PrimStep.call``/``group``), which was skipped where an argument held a symbolic size: the
view was taken by the shape prims the trace recorded, so ``x[n]`` was a ViewBackward0,
``x[:, n]`` a ReshapeAliasBackward0, ``x.select(0, n)`` a SqueezeBackward2, and ``x.split(n)[1]``
a SliceBackward0, an ordinary view a caller could write in place where eager refuses. The op is
now replayed with the ints of the current call, computed from its size inputs."""

import pytest
import torch

import thunder_rs

_get_creation_meta = torch._C._autograd._get_creation_meta

#: name -> program returning a view of its (5, 6) argument taken with the int ``n`` (2, 3, 4)
PROGRAMS = {
    "x[n]": lambda x, n: x[n],
    "x[n - 1]": lambda x, n: x[n - 1],
    "x[-n]": lambda x, n: x[-n],
    "x[:, n]": lambda x, n: x[:, n],
    "x[n, 1:]": lambda x, n: x[n, 1:],
    "select": lambda x, n: x.select(0, n),
    "x[n:]": lambda x, n: x[n:],
    "narrow": lambda x, n: x.narrow(1, n, 2),
    "of an intermediate, x[n]": lambda x, n: (x * 2)[n],
    "split(n)[1]": lambda x, n: x.split(n)[1],
    "split(n, 1)[0] of an intermediate": lambda x, n: (x * 2).split(n, 1)[0],
    "split_with_sizes": lambda x, n: x.split_with_sizes([n, 5 - n])[1],
    "chunk": lambda x, n: x[: 2 * n].chunk(2)[1],
    "reshape to a torch.Size": lambda x, n: x[:n].reshape(x[:n].shape[:1] + (3, 2)),
    "view as a torch.Size": lambda x, n: (x * 2)[:n].view(torch.Size([n, 3, 2])),
    "diagonal": lambda x, n: x.diagonal(n),
    "diagonal(offset=, dim1=, dim2=) of an intermediate": lambda x, n: (x * 2).diagonal(offset=-n, dim1=1, dim2=0),
    "unfold": lambda x, n: x.unfold(1, n, 1),
    "unfold(step=n) of an intermediate": lambda x, n: (x * 2).unfold(1, 2, n),
    "as_strided": lambda x, n: x.as_strided((n, 2), (1, n)),
    "torch.as_strided with an offset": lambda x, n: torch.as_strided(x, (2, n), (n, 1), n),
}


def _facts(out, x) -> tuple:
    meta = _get_creation_meta(out) if out._is_view() else None
    return (type(out.grad_fn).__name__, out._base is x, out._is_view(), meta, out.stride(), out.shape)


def _argument(kind: str) -> torch.Tensor:
    leaf = torch.randn(5, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64, requires_grad=True)
    return leaf if kind == "leaf" else leaf * 1


@pytest.mark.parametrize("kind", ["leaf", "non-leaf"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_view_taken_with_a_changing_int_is_eagers(name, kind):
    program = PROGRAMS[name]
    jitted = thunder_rs.jit(program)
    for n in (2, 3, 4):
        sides = []
        for fn in (program, jitted):
            x = _argument(kind)
            out = fn(x, n)
            weights = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)
            (grad,) = torch.autograd.grad((out * weights).sum(), x)
            sides.append((_facts(out, x), out.detach(), grad))
        assert sides[1][0] == sides[0][0], n
        assert torch.equal(sides[1][1], sides[0][1]) and torch.equal(sides[1][2], sides[0][2])
    assert thunder_rs.cache_misses(jitted) == 2  # (the int became a symbolic size at its second value)


def test_a_write_into_a_split_piece_taken_with_a_changing_int_raises_as_eager():
    def program(x, n):
        return (x * 2).split(n)[1]

    jitted = thunder_rs.jit(program)
    for n in (2, 3):
        with pytest.raises(RuntimeError, match="returns multiple views") as eager:
            program(_argument("leaf"), n).add_(1)
        with pytest.raises(RuntimeError, match="returns multiple views") as compiled:
            jitted(_argument("leaf"), n).add_(1)
        assert str(compiled.value) == str(eager.value)
