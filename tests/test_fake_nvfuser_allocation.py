"""The stand-in ``nvfuser_direct`` (``fake_nvfuser_direct``) lays out a fusion's outputs as nvFuser's
``AllocationDomainPass`` does (``fake_nvfuser_allocation``): each output takes the stride order of the
input it depends on with the most non-broadcast dims, ``ops.stride_order`` pins one, and expanded
broadcast dims keep stride 0. Driven directly, on the CPU."""

import pytest
import torch

import fake_nvfuser_direct as fake
from fake_nvfuser_direct import DataType


def define(fd, t):
    """A definition input for ``t``, as the executor's ``_Definition.input`` makes one."""
    contiguity, stride_order = fake.compute_tensor_descriptor(list(t.shape), list(t.stride()))
    return fd.define_tensor(list(t.shape), list(contiguity), DataType(t.dtype), stride_order=list(stride_order))


def run(build, *args):
    """Defines ``build(fd, *inputs)`` (its outputs) and executes it on ``args``."""
    fd = fake.FusionDefinition()
    with fd:
        outs = build(fd, *(define(fd, a) for a in args))
        for out in outs:
            fd.add_output(out)
    return fd.execute(list(args))


def channels_last(*shape):
    return torch.randn(*shape).to(memory_format=torch.channels_last)


def column_major(rows, cols):
    return torch.randn(cols, rows).t()


def test_an_elementwise_output_takes_its_inputs_channels_last_order():
    x = channels_last(2, 3, 4, 5)
    (out,) = run(lambda fd, a: [fd.ops.exp(a)], x)
    torch.testing.assert_close(out, x.exp())
    assert out.stride() == x.stride() and out.is_contiguous(memory_format=torch.channels_last)


def test_a_broadcast_bias_leaves_the_full_input_the_reference():
    x, bias = channels_last(2, 3, 4, 5), torch.randn(3)

    def build(fd, a, b):
        return [fd.ops.add(a, fd.ops.broadcast_in_dim(b, [2, 3, 4, 5], [1]))]

    (out,) = run(build, x, bias)
    torch.testing.assert_close(out, x + bias[:, None, None])
    assert out.stride() == x.stride()
    # The bias first: the reference is still the input with the most non-broadcast dims.
    (out,) = run(lambda fd, b, a: build(fd, a, b), bias, x)
    assert out.stride() == x.stride()


@pytest.mark.parametrize("first_row_major", [True, False])
def test_two_inputs_of_equal_rank_in_different_orders_give_row_major(first_row_major):
    a, b = torch.randn(3, 4), column_major(3, 4)
    args = (a, b) if first_row_major else (b, a)
    (out,) = run(lambda fd, x, y: [fd.ops.add(x, y)], *args)
    torch.testing.assert_close(out, a + b)
    assert out.stride() == (4, 1)


def test_two_inputs_in_the_same_order_agree():
    a, b = column_major(3, 4), column_major(3, 4)
    (out,) = run(lambda fd, x, y: [fd.ops.mul(x, y)], a, b)
    torch.testing.assert_close(out, a * b)
    assert out.stride() == (1, 3)


def test_an_ambiguous_tie_gives_way_to_a_later_input_with_more_dims():
    a, b, c = torch.randn(3, 4), column_major(3, 4), torch.randn(4, 2, 3).permute(1, 2, 0)  # c: dims 2, 0, 1

    def build(fd, x, y, z):
        return [fd.ops.add(fd.ops.broadcast_in_dim(fd.ops.add(x, y), [2, 3, 4], [1, 2]), z)]

    (out,) = run(build, a, b, c)
    torch.testing.assert_close(out, (a + b) + c)
    assert out.stride() == c.stride()


def test_outputs_take_the_order_of_the_inputs_they_depend_on():
    a, b = torch.randn(3, 4), column_major(3, 4)
    x, y = run(lambda fd, p, q: [fd.ops.exp(p), fd.ops.exp(q)], a, b)
    torch.testing.assert_close((x, y), (a.exp(), b.exp()))
    assert (x.stride(), y.stride()) == ((4, 1), (1, 3))


def test_a_sum_over_channels_keeps_the_other_dims_order():
    # NHWC: the walk from the innermost passes over C (reduced), maps W, H and N: row-major N, H, W.
    x = channels_last(2, 3, 4, 5)
    (out,) = run(lambda fd, a: [fd.ops.sum(a, [1])], x)
    torch.testing.assert_close(out, x.sum(1))
    assert out.shape == (2, 4, 5) and out.stride() == (20, 5, 1)


def test_a_sum_over_height_passes_the_reduced_dim_and_keeps_channels_innermost():
    # NHWC: C maps, W maps, H (reduced) is passed over, N maps: the result is N, W, C in memory.
    x = channels_last(2, 3, 4, 5)
    (out,) = run(lambda fd, a: [fd.ops.sum(a, [2])], x)
    torch.testing.assert_close(out, x.sum(2))
    assert out.shape == (2, 3, 5) and out.stride() == (15, 1, 3)
    # keepdim: H is a new broadcast, unmapped, which ends the walk after C and W: C stays innermost.
    (out,) = run(lambda fd, a: [fd.ops.sum(a, [2], True)], x)
    torch.testing.assert_close(out, x.sum(2, keepdim=True))
    assert (out.stride(0), out.stride(1), out.stride(3)) == (15, 1, 3)


def test_a_permute_of_a_row_major_input_keeps_the_inputs_memory_order():
    a = torch.randn(3, 4)
    (out,) = run(lambda fd, x: [fd.ops.permute(x, [1, 0])], a)
    torch.testing.assert_close(out, a.t())
    assert out.stride() == a.t().stride() == (1, 4)
    b = torch.randn(2, 3, 4)
    (out,) = run(lambda fd, x: [fd.ops.permute(x, [2, 0, 1])], b)
    torch.testing.assert_close(out, b.permute(2, 0, 1))
    assert out.stride() == b.permute(2, 0, 1).stride()


def test_an_input_with_two_dims_in_one_group_is_no_reference():
    # x + x.T maps x's two dims together (self mapping): no reference, a row-major output.
    x = column_major(3, 3)
    (out,) = run(lambda fd, a: [fd.ops.add(a, fd.ops.permute(a, [1, 0]))], x)
    torch.testing.assert_close(out, x + x.t())
    assert out.stride() == (3, 1)


def test_stride_order_pins_an_outputs_order():
    x = channels_last(2, 3, 4, 5)
    row_major, pinned_default = run(
        lambda fd, a: [fd.ops.stride_order(fd.ops.exp(a), [3, 2, 1, 0]), fd.ops.stride_order(fd.ops.exp(a), [])], x
    )
    torch.testing.assert_close((row_major, pinned_default), (x.exp(), x.exp()))
    assert row_major.stride() == (60, 20, 5, 1)
    assert pinned_default.stride() == x.stride()  # [] is just a set: the inference gives it x's order
    (out,) = run(lambda fd, a: [fd.ops.stride_order(a, [0, 1])], torch.randn(3, 4))
    assert out.stride() == (1, 3)


@pytest.mark.parametrize(
    "stride_order, message",
    [
        ([1, 0, 2], "Operator stride_order expects `stride_order` argument to have the same length as input!"),
        ([0, 0], "Stride order is not valid: 0, 0"),
        ([2, 0], "Stride order is not valid: 2, 0"),
    ],
)
def test_a_bad_stride_order_is_refused(stride_order, message):
    fd = fake.FusionDefinition()
    with fd:
        a = define(fd, torch.randn(3, 4))
        with pytest.raises(RuntimeError, match=message.replace("(", r"\(")):
            fd.ops.stride_order(a, stride_order)


def test_expanded_broadcast_outputs_keep_stride_zero_in_the_inferred_order():
    x = column_major(3, 4)
    (out,) = run(lambda fd, a: [fd.ops.broadcast_in_dim(a, [2, 3, 4], [1, 2])], x)
    torch.testing.assert_close(out, x.expand(2, 3, 4))
    assert out.stride() == (0, 1, 3)
    (out,) = run(lambda fd, a: [fd.ops.broadcast_in_dim(a, [3, 4], [0])], torch.randn(3))
    assert out.stride() == (1, 0)
    (out,) = run(lambda fd, a: [fd.ops.stride_order(fd.ops.broadcast_in_dim(a, [2, 3, 4], [1, 2]), [0, 2, 1])], x)
    torch.testing.assert_close(out, x.expand(2, 3, 4))
    assert out.stride() == (0, 4, 1)  # pinned: dim 1 outermost, then dim 2, dim 0 (expanded) innermost


def test_ops_that_make_new_dims_map_only_the_dims_they_leave_alone():
    # A slice of part of dim 0 makes it new: the walk from x's innermost dim (0) ends there at once.
    x = column_major(3, 4)
    sliced, whole = run(lambda fd, a: [fd.ops.slice(a, [1, 0], [3, 4]), fd.ops.slice(a, [0, 0], [3, 4])], x)
    torch.testing.assert_close((sliced, whole), (x[1:], x))
    assert sliced.stride() == (4, 1) and whole.stride() == (1, 3)  # what a slice keeps whole maps
    (padded,) = run(lambda fd, a: [fd.ops.pad(a, [1, 1])], x)  # pads dim 1 only: dim 0 maps, dim 1 is new
    torch.testing.assert_close(padded, torch.nn.functional.pad(x, [1, 1]))
    assert padded.stride() == (1, 3)
    # A reshape that splits dim 1 leaves dim 0 alone: it maps, and stays innermost.
    (split,) = run(lambda fd, a: [fd.ops.reshape(a, [3, 2, 2])], x)
    torch.testing.assert_close(split, x.reshape(3, 2, 2))
    assert split.stride() == (1, 6, 3)
