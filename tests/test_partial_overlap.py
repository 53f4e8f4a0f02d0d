"""Writes whose operand partially overlaps the written tensor, against eager.

Eager's TensorIterator and ``copy_`` refuse an operand that shares part of the written memory
without being laid out as it is (``assert_no_partial_overlap``): ``x.add_(x.t())``,
``x[1:].mul_(x[:-1])``, ``x.copy_(x.t())``, ``torch.add(x.t(), 1, out=x)``. The trace computes each
value before writing it, so it returned a result eager never gives. Now it raises eager's error;
the writes eager accepts (the same memory laid out alike, disjoint parts, operands not dense, ops
that are not pointwise) still run and give eager's values.
"""

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderError

REFUSED = {
    "copy_transposed": lambda x: x.copy_(x.t()),
    "add_transposed": lambda x: x.add_(x.t()),
    "iadd_transposed": lambda x: x.__iadd__(x.t()),
    "mul_shifted": lambda x: x[1:].mul_(x[:-1]),
    "add_row": lambda x: x.add_(x[0]),
    "clamp_transposed": lambda x: x.clamp_(min=x.t()),
    "sub_out_transposed": lambda x: torch.sub(x, 1, out=x.t()),
    "add_out_of_transposed": lambda x: torch.add(x.t(), 1, out=x),
    "own_intermediate": lambda x: (lambda y: (y[1:].add_(y[:-1]), y)[1])(x * 1),
}

ACCEPTED = {
    "copy_same_layout": lambda x: x.copy_(x.view(3, 3)),
    "copy_flipped": lambda x: x.copy_(x.flip(0)),
    "add_out_same": lambda x: torch.add(x, 1, out=x),
    "add_itself": lambda x: x.add_(x),
    "disjoint_rows": lambda x: x[0].add_(x[1]),
    "unary_on_slice": lambda x: x[1:].relu_(),
    "column_not_dense": lambda x: x[:, 0].add_(x[0]),
    "diagonal_copied_onto_itself": lambda x: x.diagonal().copy_(x.diagonal()),
    "flat_prefix_times_row": lambda x: x.view(9)[:3].mul_(x[0]),
    "out_not_dense": lambda x: torch.exp(x[:, :2], out=x[:, 1:]),
    "masked_fill_not_pointwise": lambda x: x.masked_fill_(x.t() > 3, 0.0),
    "transposed_copy_first": lambda x: x.add_(x.t().contiguous()),
    "column_into_row": lambda x: x[0].copy_(x[:, 0]),
    "read_before_written": lambda x: x[1].copy_(x[:, 2]),
    "own_last_column": lambda x: x.sub_(x[:, 2:3]),
}

#: In-place writes whose operand, not dense, reads elements the op wrote before (eager adds the
#: new ``x[0, 0]`` to ``x[0, 1]``): eager's result depends on its kernel's order; refused.
ORDER_DEPENDENT = {
    "add_first_column": lambda x: x.add_(x[:, :1]),
    "mul_first_column_as_row": lambda x: x.mul_(x[:, 0:1].t()),
    "row_into_column": lambda x: x[:, 2].copy_(x[1]),
}


def _x() -> torch.Tensor:
    return torch.arange(9.0).reshape(3, 3)


@pytest.mark.parametrize("name", REFUSED)
def test_partial_overlap_raises_eagers_error(name: str) -> None:
    fn = REFUSED[name]
    with pytest.raises(RuntimeError, match="refer to a single memory location") as eager:
        fn(_x())
    x = _x()
    with pytest.raises(RuntimeError, match="refer to a single memory location") as compiled:
        thunder_rs.jit(fn)(x)
    assert isinstance(compiled.value, ThunderError) and isinstance(compiled.value, type(eager.value))
    assert "test_partial_overlap.py" in str(compiled.value)  # the user's line
    assert torch.equal(x, _x())  # nothing written, as eager writes nothing


@pytest.mark.parametrize("name", ACCEPTED)
def test_writes_eager_accepts_still_match(name: str) -> None:
    fn = ACCEPTED[name]
    expected, x = _x(), _x()
    fn(expected)
    thunder_rs.jit(fn)(x)
    assert torch.equal(x, expected)


@pytest.mark.parametrize("name", ORDER_DEPENDENT)
def test_writes_whose_result_depends_on_eagers_order_are_refused(name: str) -> None:
    fn = ORDER_DEPENDENT[name]
    fn(_x())  # (eager runs it)
    x = _x()
    with pytest.raises(NotImplementedError, match="depends on the order") as compiled:
        thunder_rs.jit(fn)(x)
    assert isinstance(compiled.value, ThunderError) and "test_partial_overlap.py" in str(compiled.value)
    assert torch.equal(x, _x())
