"""A compiled call whose output reaches the loss only through comparisons gets no gradient, and
the call that made that output gives none on: eager's built-in nodes pass nothing where no
gradient came, so the parameters before it keep ``.grad`` None (with zeros, AdamW's weight decay
and moments moved parameters no loss used). Seen as Mask2Former's pixel decoder and VITS under
``torch.compile`` (models round 15), where Dynamo's graphs are such calls in a row."""

import copy

import pytest
import torch

import thunder_rs


def _made(x, w):
    return torch.tanh(x @ w)


def _gated(y, v):
    return ((y.sigmoid() < 0.5).float() * v).sum()


def _used(y, v):
    return (y * v).sum()


@pytest.mark.parametrize("consumer", [_gated, _used], ids=["through-comparisons", "read"])
def test_composed_calls_give_eagers_grads(consumer):
    torch.manual_seed(0)
    x, w, v = torch.randn(3, 4), torch.randn(4, 4, requires_grad=True), torch.randn(4, requires_grad=True)
    results = []
    for made, consume in ((_made, consumer), (thunder_rs.jit(_made), thunder_rs.jit(consumer))):
        w.grad = v.grad = None
        consume(made(x, w), v).backward()
        results.append((w.grad, v.grad))
    (w_eager, v_eager), (w_jit, v_jit) = results
    assert (w_jit is None) == (w_eager is None)
    if w_eager is not None:
        assert torch.equal(w_jit, w_eager)
    assert torch.equal(v_jit, v_eager)


class _Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        features = self.decoder(x)
        torch._dynamo.graph_break()
        mask = (features.sigmoid() < 0.5).float()
        return self.head(x * mask).sum()


@pytest.mark.parametrize("mode", ["jit-pieces", "compile"])
def test_adamw_leaves_unreached_parameters_as_eager(mode):
    torch.manual_seed(0)
    eager = _Gated()
    model = copy.deepcopy(eager)
    if mode == "compile":
        torch._dynamo.reset()
        call = torch.compile(model, backend="thunder_rs")
    else:
        decoder, head = thunder_rs.jit(model.decoder), thunder_rs.jit(lambda x, f: model.head(x * (f.sigmoid() < 0.5)))

        def call(x):
            return head(x, decoder(x)).sum()

    optimizers = [torch.optim.AdamW(m.parameters(), lr=0.1, weight_decay=0.5) for m in (model, eager)]
    for step in range(2):
        x = torch.randn(5, 4)
        for run, module, optimizer in ((call, model, optimizers[0]), (eager, eager, optimizers[1])):
            optimizer.zero_grad()
            run(x).backward()
            optimizer.step()
        assert model.decoder.weight.grad is None and eager.decoder.weight.grad is None
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert torch.equal(p, q), (step, name)
