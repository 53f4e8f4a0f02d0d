"""Writes through views, differentiated as eager's autograd differentiates them: an in-place op on a
view of a tensor that requires grad gives the tensor's base a ``CopySlices`` node, which copies the
base's gradient into a new tensor laid out as the base, hands the op's backward a contiguous copy
of the view's part and writes the op's input gradient back into that part. The values are the
same whatever the layouts; a reduction over them (a bias's gradient, summed over the rows of a
linear's output) is not: the compiled gradients followed the layout of the gradient reaching the
write, and a linear's bias gradient was an ulp or more apart (DeBERTa's ``pos_q_proj.bias``, whose
projection is divided in place through a permuted view). Float32, compared bit for bit.
"""

import copy

import pytest
import torch

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")

SCALE = torch.tensor(3.0).sqrt()
W = torch.randn(16, 16, generator=torch.Generator().manual_seed(4))


def _p2c(h):
    """DeBERTa's position-to-content projection: heads split, divided in place by a 0-d tensor."""
    p = h.view(3, 16, 2, 16).permute(0, 2, 1, 3)
    p /= torch.sqrt(torch.tensor(p.size(-1), dtype=torch.float) * 3)
    return p.transpose(-1, -2) @ W


def _transposed(h):
    v = h.transpose(1, 2)
    v /= SCALE
    return h.transpose(1, 2) @ W


def _sliced(h):
    h[..., 4:20].mul_(SCALE)
    return h.transpose(1, 2) @ W


def _sliced_and_transposed_twice(h):
    v = h[:, 2:10].transpose(1, 2)
    v.add_(1.0)
    v.mul_(SCALE)
    return h.transpose(1, 2) @ W


def _masked(h):
    v = h.view(3, 16, 4, 8).transpose(1, 2)
    v.masked_fill_(v > 0.5, 0.0)
    return h.transpose(1, 2) @ W


def _assigned(h, y):
    h[:, 0] = y * 2
    return h.transpose(1, 2) @ W


def _copied(h, y):
    h.transpose(1, 2)[..., :4].copy_(y[:, :, None].expand(3, 32, 4))
    return h.transpose(1, 2) @ W


WRITES = {
    "divided through a permuted view (DeBERTa's p2c)": _p2c,
    "divided through a transposed view": _transposed,
    "multiplied through a slice": _sliced,
    "two writes through a transposed slice": _sliced_and_transposed_twice,
    "masked_fill_ through a view": _masked,
    "a row assigned": _assigned,
    "copied into a transposed slice": _copied,
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_write_through_a_view_differentiates_as_eagers_copy_slices(write):
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 32)
    x, y = torch.randn(3, 16, 32, requires_grad=True), torch.randn(3, 32, requires_grad=True)
    fn = WRITES[write]
    takes_y = fn.__code__.co_argcount == 2

    def program(x, y):
        h = linear(x)
        return fn(h, y) if takes_y else fn(h)

    results = []
    for run in (program, thunder_rs.jit(program)):
        linear.zero_grad()
        out = run(x, y)
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        grads = torch.autograd.grad(out, (x, *((y,) if takes_y else ()), *linear.parameters()), cotangent)
        results.append((out, *grads))
    for i, (actual, expected) in enumerate(zip(*results, strict=True)):
        assert torch.equal(actual, expected), f"#{i}: max difference {(actual - expected).abs().max().item()}"


@pytest.mark.slow
def test_deberta_trains_a_step_in_float32_as_eager_to_the_bit():
    transformers = pytest.importorskip("transformers")
    from test_hf_families import ENCODER, _batch  # noqa: PLC0415

    config = transformers.DebertaConfig(
        relative_attention=True, max_relative_positions=16, pos_att_type=["c2p", "p2c"], **ENCODER
    )
    torch.manual_seed(0)
    model = transformers.DebertaForSequenceClassification(config).train()
    eager = copy.deepcopy(model)
    outs = []
    for run in (thunder_rs.jit(model), eager):
        torch.manual_seed(1)  # dropout draws alike
        out = run(**_batch("cls", 0))
        out.loss.backward()
        outs.append(out)
    assert torch.equal(outs[0].loss, outs[1].loss) and torch.equal(outs[0].logits, outs[1].logits)
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), f"{name}: max difference {(p.grad - q.grad).abs().max().item()}"
