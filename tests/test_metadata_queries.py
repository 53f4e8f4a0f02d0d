"""Answers about tensors rather than tensors: what a program asks of its tensors' metadata
(``torch.numel``, ``torch.result_type``, whether ``view`` can view) and the ``torch.Size`` it
returns are eager's."""

import pytest
import torch

import thunder_rs


@pytest.mark.parametrize(
    "other", [torch.tensor(2), 2.5, torch.ones(2, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bfloat16])
def test_result_type_and_numel_are_eagers(dtype, other):
    def program(x):
        return (x * torch.numel(x)).to(torch.result_type(x, other))

    x = torch.arange(2).to(dtype)
    out, expected = thunder_rs.jit(program)(x), program(x)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    "program",
    [
        lambda x: x.t().view(12),
        lambda x: x.t().view(-1),
        lambda x: x[:, :2].view(6),
        lambda x: x[:1].expand(3, 4).view(12),
    ],
    ids=["transposed", "inferred", "sliced", "expanded"],
)
def test_a_view_of_a_layout_eager_cannot_view_raises_eagers_error(program):
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        program(x)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        thunder_rs.jit(program)(x)


@pytest.mark.parametrize(
    "program",
    [
        lambda x: x.view(12),
        lambda x: x.t().view(4, 1, 3),
        lambda x: x[1:].view(8),
        lambda x: x[:, None].expand(3, 2, 4).view(3, 2, 2, 2),
    ],
    ids=["contiguous", "size_one_dim", "row_slice", "expanded_middle"],
)
def test_views_eager_can_make_still_alias(program):
    x = torch.randn(3, 4)
    out = thunder_rs.jit(program)(x)
    torch.testing.assert_close(out, program(x))


def test_a_returned_size_is_a_torch_size():
    out = thunder_rs.jit(lambda x: (x * 2, x.shape, {"size": x.size()}))(torch.randn(2, 3))
    assert type(out[1]) is torch.Size and type(out[2]["size"]) is torch.Size and out[1] == (2, 3)
    assert type(thunder_rs.jit(lambda x: x.shape)(torch.randn(4))) is torch.Size


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (1, 2, 3, 4, 5)])
def test_channels_last_contiguity_of_other_ranks_is_eagers(shape):
    def program(x):
        return x * (3.0 if not x.is_contiguous(memory_format=torch.channels_last) else 2.0)

    x = torch.ones(shape)
    torch.testing.assert_close(thunder_rs.jit(program)(x), program(x))


def test_a_printed_size_is_a_torch_size(capsys):
    def program(x):
        print(x.shape)
        return x * 2

    thunder_rs.jit(program)(torch.ones(2, 3))
    program(torch.ones(2, 3))
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["torch.Size([2, 3])"] * 2


def counts_of_a_shape(x):
    shape = x.shape
    total = shape.numel()
    scaled = x * total if total > 0 else x  # (torch's associative_scan: ``result.shape.numel() > 0``)
    rows = x.reshape(shape[:1] + (-1,))
    return scaled, rows, shape, shape[1:], shape[1:].numel(), (shape * 2).numel(), isinstance(shape, torch.Size)


def test_the_numel_of_a_symbolic_shape_is_symbolic():
    # ``torch.Size.numel()`` reads each size as an int: a symbolic size was specialised (a compile
    # per batch size of Mamba's selective scan). A proxy's shape with a symbolic size is a tuple
    # the program sees as a torch.Size; its numel is the product of its sizes, as are its
    # slices' and repetitions'.
    jf = thunder_rs.jit(counts_of_a_shape)
    for n in [3, 5, 8, 4]:
        x = torch.randn(n, 3, 2)
        out, expected = jf(x), counts_of_a_shape(x)
        torch.testing.assert_close(out[:2], expected[:2])
        assert out[2:] == expected[2:] and type(out[2]) is torch.Size and type(out[3]) is torch.Size
    assert thunder_rs.cache_misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons


class KeepsItsShapes(torch.nn.Module):
    """Stores and prints the shapes it sees, as a module noting its last input size does."""

    def forward(self, x):
        self.last = x.shape
        self.parts = (x.shape[1:], [x.size()])
        print("shape", x.shape)
        return x * 2


def test_a_symbolic_shape_stored_or_printed_is_each_calls_own(capsys):
    # A torch.Size holding symbolic sizes was kept whole as the trace's: from the compile with a
    # symbolic size on, the module kept and printed torch.Size([t0, 3]) on every call.
    jmodule, module = KeepsItsShapes(), KeepsItsShapes()
    jm = thunder_rs.jit(jmodule)
    for n in (2, 3, 4, 5):
        x = torch.randn(n, 3)
        torch.testing.assert_close(jm(x), module(x))
        assert (jmodule.last, jmodule.parts) == (module.last, module.parts) == ((n, 3), ((3,), [(n, 3)]))
        assert type(jmodule.last) is torch.Size and type(jmodule.parts[1][0]) is torch.Size
    printed = capsys.readouterr().out.splitlines()
    assert printed[0::2] == printed[1::2] == [f"shape torch.Size([{n}, 3])" for n in (2, 3, 4, 5)]
    assert thunder_rs.cache_misses(jm) == 2
