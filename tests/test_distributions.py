"""torch.distributions under thunder_rs.jit: samples and log-probabilities equal eager's under the
same seed, and a distribution or transform the program keeps (a module's prior) is state whose
attributes are guarded."""

import pytest
import torch
import torch.distributions as D
import torch.nn as nn

import thunder_rs


@pytest.fixture(autouse=True)
def no_validation():
    # Validation reads tensor values (data-dependent control flow), which thunder_rs refuses.
    before = D.Distribution._validate_args
    D.Distribution.set_default_validate_args(False)
    yield
    D.Distribution.set_default_validate_args(before)


# Each builds its sample with ``param.new(shape)`` (torch.Size) filled in place.
SAMPLES = {
    "exponential": lambda p: D.Exponential(p).rsample(),
    "laplace": lambda p: D.Laplace(torch.zeros(3, dtype=p.dtype), p).rsample((2,)),
    "cauchy": lambda p: D.Cauchy(torch.zeros(3, dtype=p.dtype), p).rsample(),
    "weibull": lambda p: D.Weibull(p, torch.ones(3, dtype=p.dtype)).rsample(),
    "geometric": lambda p: D.Geometric(probs=p / 5).sample(),
}


@pytest.mark.parametrize("name", SAMPLES)
def test_samples_and_their_gradients_are_eagers(name):
    sample = SAMPLES[name]
    p = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64, requires_grad=True)
    torch.manual_seed(0)
    expected = sample(p)
    torch.manual_seed(0)
    got = thunder_rs.jit(sample)(p)
    torch.testing.assert_close(got, expected)
    if expected.requires_grad:
        torch.testing.assert_close(torch.autograd.grad(got.sum(), p), torch.autograd.grad(expected.sum(), p))


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x.new(torch.Size([2, 3])).fill_(1.0),
        lambda x: x.new(2, 3).fill_(2.0),
        lambda x: x.new(),
        lambda x: x.new([1.0, 2.0]),
        lambda x: x.new((4.0, 5.0)),
    ],
    ids=["size", "ints", "empty", "list", "tuple"],
)
def test_tensor_new_takes_sizes_or_data_as_eager(make):
    x = torch.randn(3)
    torch.testing.assert_close(thunder_rs.jit(make)(x), make(x))


class WithPrior(nn.Module):
    def __init__(self):
        super().__init__()
        self.prior = D.Normal(torch.zeros(3), torch.ones(3))
        self.squash = D.AffineTransform(0.0, 2.0)

    def forward(self, z):
        return self.prior.log_prob(self.squash(z))


@pytest.mark.parametrize(
    "change",
    [
        lambda m: setattr(m.prior, "scale", torch.full((3,), 2.0)),
        lambda m: setattr(m.prior, "loc", torch.ones(3)),
        lambda m: setattr(m.squash, "scale", 3.0),
    ],
    ids=["scale", "loc", "transform"],
)
def test_attributes_of_a_kept_distribution_are_guarded(change):
    model = WithPrior()
    jmodel = thunder_rs.jit(model)
    z = torch.randn(3)
    torch.testing.assert_close(jmodel(z), model(z))
    change(model)
    torch.testing.assert_close(jmodel(z), model(z))


def test_log_prob_of_a_value_made_in_the_program_is_eagers():
    # Gamma.log_prob converts its value with torch.as_tensor(value, device=...).
    a = torch.tensor([0.7, 1.5, 2.0])

    def program(a):
        return D.Gamma(a, a).log_prob(torch.tensor([0.2, 1.5, 0.7]))

    torch.testing.assert_close(thunder_rs.jit(program)(a), program(a))
