"""Training loops as users write them, round 4: state a jitted step updates in modules it calls
(not the jitted module): an exponential moving average kept by ``torch.optim.swa_utils.
AveragedModel``, a buffer counted with ``+=`` and spectral norm's power iterations, compared with
eager PyTorch step by step."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import thunder_rs


class _Counted(nn.Module):
    """A running mean of what it is given, with the count as a buffer updated by ``+=``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.tensor(0))
        self.register_buffer("mean", torch.zeros(3))

    def update(self, x):
        self.mean.mul_(self.count / (self.count + 1)).add_(x / (self.count + 1))
        self.count += 1


def test_a_buffer_counted_with_an_augmented_assignment_in_a_module_the_step_calls_is_eagers():
    # ``self.count += 1`` sets the slot again, to the same tensor in eager; the trace's stand-in
    # for it was found there and the program refused as storing a tensor it computed.
    counted, eager = _Counted(), _Counted()
    count = counted.count

    def step(module, x):
        module.update(x)
        return x * 2

    jstep = thunder_rs.jit(lambda x: step(counted, x))
    for i in range(3):
        x = torch.randn(3, generator=torch.Generator().manual_seed(i))
        torch.testing.assert_close(jstep(x), step(eager, x))
        torch.testing.assert_close(counted.count, eager.count, rtol=0, atol=0)
        torch.testing.assert_close(counted.mean, eager.mean, rtol=0, atol=0)
    assert counted.count is count and counted._buffers["count"] is count


@pytest.mark.slow
def test_an_averaged_model_updated_inside_the_jitted_step_is_eagers():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))
    twin = copy.deepcopy(net)
    runs = []
    for model, jit in ((twin, False), (net, True)):
        averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        optimizer = torch.optim.SGD(model.parameters(), 0.1)

        def loss_of(x, y, model=model, averaged=averaged):
            averaged.update_parameters(model)
            return F.cross_entropy(model(x), y)

        runs.append((model, averaged, optimizer, thunder_rs.jit(loss_of) if jit else loss_of))
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        losses = []
        for model, averaged, optimizer, loss_of in runs:
            loss = loss_of(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0])
        (_, eager, _, _), (_, averaged, _, _) = runs
        for got, expected in zip(averaged.state_dict().values(), eager.state_dict().values()):
            torch.testing.assert_close(got, expected)


@pytest.mark.slow
def test_a_spectrally_normalised_model_the_jitted_loss_calls_updates_its_power_iterations_as_eager():
    # Its power iteration writes the vectors with ``out=`` and stores the result in their slots
    # (``self._u = F.normalize(..., out=self._u)``): refused like ``+=`` above.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    nn.utils.parametrizations.spectral_norm(model[0])
    eager = copy.deepcopy(model)
    optimizers = [torch.optim.SGD(m.parameters(), 0.1) for m in (eager, model)]

    def loss_of(m, x, y):
        return F.cross_entropy(m(x), y)

    jloss = thunder_rs.jit(lambda x, y: loss_of(model, x, y))
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        losses = [loss_of(eager, x, y), jloss(x, y)]
        for loss, optimizer in zip(losses, optimizers):
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.testing.assert_close(losses[1], losses[0])
        for got, expected in zip(model.state_dict().values(), eager.state_dict().values()):
            torch.testing.assert_close(got, expected)
