"""What a program does with a float argument that changes between calls, once it is a float input
of the trace (``core.acquisition.float_args``), against eager with the value changing over the
calls: every use answers as eager's float does, symbolic where it can stay so, else the float a
constant per value (a miss reason naming it). The same for the symbolic sizes a program reads
where they stand in for an int in the same way."""

import pytest
import torch

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")

VALUES = (0.3, 0.7, 0.9, 0.3, 0.5)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _check(fn, values=VALUES):
    """``jit(fn)`` called as ``fn(x, v)`` for each of ``values``, each result checked against
    eager's; returns its compile stats."""
    jfn, x = thunder_rs.jit(fn), torch.rand(8) + 0.5
    for v in values:
        expected, got = fn(x, v), jfn(x, v)
        assert _same(expected, got), (v, expected, got)
    return thunder_rs.compile_stats(jfn)


#: Text the program makes of the float with ``repr``: the value (it specialises), never the trace's
#: stand-in for it (``SymFloat(t1, hint=0.7)`` before).
REPRS = {
    "repr": lambda x, s: (x * s, repr(s)),
    "!r": lambda x, s: (x * s, f"{s!r}"),
    "a list's text": lambda x, s: (x * s, str([s, 1.0])),
}


@pytest.mark.parametrize("use", REPRS)
def test_repr_of_a_float_input_is_its_value(use):
    stats = _check(REPRS[use])
    assert stats.cache_misses == len(set(VALUES))
    assert "s kept constant" in stats.miss_reasons[1]


def test_repr_of_a_symbolic_size_is_its_value():
    def fn(x):
        n = x.shape[0]
        return x * 2, repr(n), str([n]), f"{n!r}"

    jfn = thunder_rs.jit(fn)
    for n in (3, 4, 5, 4):
        x = torch.randn(n)
        assert _same(jfn(x), fn(x)), n
