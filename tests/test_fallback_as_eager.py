"""Eager fallbacks (calls thunder_rs runs as torch calls inside the trace, ``core.lang.fallback``)
whose values and gradients are eager's bit for bit, compared with eager:

- The RNNs (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) run under the grad mode they were traced in, on
  tensors requiring grad as eager's did: the CPU kernels choose by both (oneDNN's training
  primitive, products folded by whether an operand requires grad), and the compiled forward runs
  without grad on tensors most of which require none.
"""

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import thunder_rs

RNNS = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}
CONFIGS = {
    "plain": {},
    "batch_first bidirectional 2 layers": {"batch_first": True, "bidirectional": True, "num_layers": 2},
    "2 layers dropout 0": {"num_layers": 2, "dropout": 0.0},
}


def _outputs_and_grads(module, x, grad: bool):
    """The outputs (flattened) and the gradients of the input and the parameters, or None without grad."""
    with torch.set_grad_enabled(grad):
        out, state = module(x)
    out = out.data if hasattr(out, "batch_sizes") else out
    flat = [out, *(state if isinstance(state, tuple) else (state,))]
    if not grad:
        return flat, None
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape)).sum() for o in flat)
    return flat, torch.autograd.grad(loss, [x, *module.parameters()])


def _assert_equal_to_eager(module, make_input, grad: bool = True):
    eager = _outputs_and_grads(module, make_input(), grad)
    compiled = _outputs_and_grads(thunder_rs.jit(module), make_input(), grad)
    for c, e in zip(compiled[0], eager[0]):
        assert torch.equal(c, e), (c - e).abs().max()
    for c, e in zip(compiled[1] or (), eager[1] or ()):
        assert torch.equal(c, e), (c - e).abs().max()


def _rnn(kind: str, dtype, **config):
    torch.manual_seed(0)
    return RNNS[kind](5, 7, **config).to(dtype)


#: float64 under the slow marker: float32 (oneDNN's kernels) is the representative case.
DTYPES = [torch.float32, pytest.param(torch.float64, marks=pytest.mark.slow)]


def _sequence(dtype, batch_first: bool = False):
    torch.manual_seed(1)
    return torch.randn((3, 6, 5) if batch_first else (6, 3, 5), dtype=dtype).requires_grad_()


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("kind", list(RNNS))
def test_rnn_outputs_and_gradients_are_eagers_bit_for_bit(kind, dtype, config):
    module = _rnn(kind, dtype, **CONFIGS[config])
    _assert_equal_to_eager(module, lambda: _sequence(dtype, CONFIGS[config].get("batch_first", False)))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("kind", list(RNNS))
def test_rnn_without_grad_is_eagers_bit_for_bit(kind, dtype):
    module = _rnn(kind, dtype, bidirectional=True, num_layers=2)
    _assert_equal_to_eager(module, lambda: _sequence(dtype), grad=False)


@pytest.mark.parametrize("kind", list(RNNS))
def test_rnn_of_an_input_requiring_no_grad_is_eagers_bit_for_bit(kind):
    """Only the parameters require grad: eager's kernel folds by them alone."""
    module = _rnn(kind, torch.float32, bidirectional=True, num_layers=2)
    eager = module(_sequence(torch.float32).detach())[0]
    compiled = thunder_rs.jit(module)(_sequence(torch.float32).detach())[0]
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("kind", list(RNNS))
def test_rnn_of_packed_sequences_is_eagers_bit_for_bit(kind, dtype):
    """A packed sequence (packed outside the program) given to the RNN."""
    module = _rnn(kind, dtype, bidirectional=True, num_layers=2)
    results = []
    for rnn in (module, thunder_rs.jit(module)):
        x = _sequence(dtype)
        out, state = rnn(pack_padded_sequence(x, torch.tensor([6, 4, 2])))
        flat = [out.data, *(state if isinstance(state, tuple) else (state,))]
        loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=dtype).view(o.shape)).sum() for o in flat)
        results.append([*flat, *torch.autograd.grad(loss, [x, *module.parameters()])])
    for c, e in zip(results[1], results[0]):
        assert torch.equal(c, e), (c - e).abs().max()
