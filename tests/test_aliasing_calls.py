"""Calls whose eager result shares memory with their input, written in place, compared with eager:
``Tensor.cpu()`` of a CPU tensor (the tensor itself), and the slices ``tensor_split`` and the
``hsplit`` family return (ordinary views, which eager lets a program write).

What differed: ``x.cpu()`` ran as an eager fallback, a tensor of its own to the trace, so a write
through it left ``x`` as it was, silently; a write into one of ``tensor_split``'s outputs raised
"Output 0 of Slice is a view ... returns multiple views", an error eager does not raise (only
``split``, ``chunk`` and ``unbind`` make views of one node with several outputs)."""

import pytest
import torch

import thunder_rs


def _eager_and_jitted(fn, *args):
    """``fn``'s outputs and its inputs' gradients (of the outputs' sum), eager's then jitted."""
    results = []
    for call in (fn, thunder_rs.jit(fn)):
        inputs = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        outs = call(*inputs)
        wanted = [a for a in inputs if a.requires_grad]
        grads = torch.autograd.grad(sum(o.sum() for o in outs), wanted) if wanted else ()
        results.append((outs, grads))
    return results


@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_write_through_cpu_of_a_cpu_tensor_is_seen_by_the_tensor_as_in_eager(requires_grad):
    def f(x):
        h = x * 1
        on_cpu = h.cpu()
        on_cpu[:, 0] = 0
        return h * 2, on_cpu

    (expected, eager_grads), (got, grads) = _eager_and_jitted(f, torch.randn(3, 4, requires_grad=requires_grad))
    for a, b in zip((*got, *grads), (*expected, *eager_grads)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_cpu_of_a_cpu_input_returns_the_input_as_eager():
    x = torch.randn(3)
    assert thunder_rs.jit(lambda t: t.cpu())(x) is x


@pytest.mark.parametrize(
    "take",
    [
        lambda h: torch.tensor_split(h, 2, dim=1)[1],
        lambda h: h.tensor_split([1], dim=1)[1],
        lambda h: torch.hsplit(h, 2)[0],
        lambda h: torch.vsplit(h, 3)[2],
    ],
    ids=["tensor_split", "tensor_split_at", "hsplit", "vsplit"],
)
def test_a_write_into_a_slice_tensor_split_returned_is_eagers(take):
    def f(x):
        h = x * 1
        part = take(h)
        part.mul_(2)
        return h * 3, part

    (expected, eager_grads), (got, grads) = _eager_and_jitted(f, torch.randn(3, 4, requires_grad=True))
    for a, b in zip((*got, *grads), (*expected, *eager_grads)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize(
    "take",
    [
        lambda h: torch.tensor_split(h, 2, dim=1)[1][0],
        lambda h: torch.tensor_split(h, 2, dim=1)[1].t(),
        lambda h: torch.hsplit(h, 2)[0][1:].unsqueeze(0),
        lambda h: torch.vsplit(h, 3)[2].squeeze(0),
    ],
    ids=["select", "transpose", "slice_unsqueeze", "squeeze"],
)
def test_a_write_into_a_view_of_a_slice_tensor_split_returned_is_eagers(take):
    """A view of one of ``tensor_split``'s slices is an ordinary view to eager as the slice is:
    a write into it was refused as into one of several views of one node ('Output 0 of Select is a
    view ... returns multiple views'), which only ``split``, ``chunk`` and ``unbind`` make."""

    def f(x):
        h = x * 1
        part = take(h)
        part.mul_(2)
        return h * 3, part

    (expected, eager_grads), (got, grads) = _eager_and_jitted(f, torch.randn(3, 4, requires_grad=True))
    for a, b in zip((*got, *grads), (*expected, *eager_grads)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize(
    "take",
    [
        lambda h: h.split(2, dim=1)[0],
        lambda h: h.chunk(2, dim=1)[1],
        lambda h: h.unbind(0)[1],
        lambda h: h.split(2, dim=1)[0][0],
        lambda h: h.chunk(2, dim=1)[1].t()[1:],
    ],
)
def test_a_write_into_one_of_several_views_of_one_node_still_raises_eagers_error(take):
    def f(x):
        part = take(x * 1)
        part.mul_(2)
        return part

    x = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="returns multiple views") as eager:
        f(x)
    with pytest.raises(RuntimeError, match="returns multiple views") as jitted:
        thunder_rs.jit(f)(x)
    assert str(jitted.value).startswith(str(eager.value))


def test_a_view_of_a_tensor_split_slice_saved_then_its_base_written_raises_eagers_text():
    """``sin`` of a view of a ``tensor_split`` slice, then its base written: eager's backward names
    the view's node made again (AsStrided), not one of several views' error."""

    def f(x):
        h = x * 1
        s = torch.tensor_split(h, 2, dim=1)[1][0].sin()
        h.mul_(2)
        return s

    texts = []
    for fn in (f, thunder_rs.jit(f)):
        with pytest.raises(RuntimeError) as caught:
            fn(torch.randn(3, 4, requires_grad=True)).sum().backward()
        texts.append(str(caught.value).partition(" instead.")[0])
    assert texts[1] == texts[0]
