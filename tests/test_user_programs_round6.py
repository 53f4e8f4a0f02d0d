"""Programs as users write them, round 6, each next to eager over several training steps.

What differed: under ``torch.compile(backend="thunder_rs")``, a graph that writes state under
``torch.no_grad()`` (an EMA codebook, a momentum encoder) holds ``torch._C._set_grad_enabled(False)``
... ``(True)`` as calls; one thunder_rs refused between them (``.data``, ``t_``) left grad
mode off for the eager run of the graph that followed, so its outputs had no gradient: the loss
did not require grad (``backward()`` raised) or the parameters before the ``no_grad`` block got
none, silently (``RecordedModes.restore``). ``t.data`` in such a graph, which Dynamo writes as
``torch._C._autograd._get_data_attr(t)``, reached torch dispatch and sent the whole graph to
eager; it is traced as ``t.data`` is under ``jit`` (``dynamo._data_reads``). Such a graph refused
inside ``torch.autocast`` left the region entered (torch's count of nested regions one too many), so
torch never cleared its cache of casts again: every later autocast region, eager code of the user's
included, used the bfloat16 casts of the weights made before the optimizer's steps."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thunder_rs
from test_dynamo_backend import compiled_by_thunder_rs, fresh_dynamo  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


class EmaCodebook(nn.Module):
    """A VQ-VAE quantiser whose codebook follows the encoder's outputs by an exponential moving
    average written through ``.data`` under ``no_grad``, with a straight-through estimator."""

    def __init__(self, codes=6, dim=4):
        super().__init__()
        self.enc, self.dec = nn.Linear(5, dim), nn.Linear(dim, 5)
        self.register_buffer("embed", torch.randn(codes, dim))
        self.register_buffer("cluster_size", torch.zeros(codes))
        self.register_buffer("embed_avg", self.embed.clone())

    def forward(self, x):
        z = self.enc(x)
        d = z.pow(2).sum(1, keepdim=True) - 2 * z @ self.embed.T + self.embed.pow(2).sum(1)
        ind = d.argmin(1)
        q = F.embedding(ind, self.embed)
        if self.training:
            with torch.no_grad():
                onehot = F.one_hot(ind, self.embed.shape[0]).type(z.dtype)
                self.cluster_size.data.mul_(0.9).add_(onehot.sum(0), alpha=0.1)
                self.embed_avg.data.mul_(0.9).add_(onehot.T @ z, alpha=0.1)
                n = self.cluster_size.sum()
                sizes = (self.cluster_size + 1e-5) / (n + 6e-5) * n
                self.embed.data.copy_(self.embed_avg / sizes.unsqueeze(1))
        commit = F.mse_loss(z, q.detach())
        return self.dec(z + (q - z).detach()), commit


class DetachedInPlace(nn.Module):
    """A layer keeping a statistic of its output under ``no_grad``, made by ``t_`` (which
    thunder_rs refuses: its graph runs eagerly; ``detach_`` was, and is traced now)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("seen", torch.zeros(3))

    def forward(self, x):
        z = self.lin(x)
        with torch.no_grad():
            self.seen.add_(z.mul(2).t_().sum(1))
        return z.sum()


def _train_next_to_eager(make, batches, loss_of, compile_it, exact=True) -> nn.Module:
    torch.manual_seed(0)
    model = make()
    eager = copy.deepcopy(model)
    compiled = compile_it(model)
    opt, eager_opt = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, eager))
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-5, atol=1e-6)
    for batch in batches:
        out, expected = compiled(*batch), eager(*batch)
        torch.testing.assert_close(out, expected, **tol)
        loss_of(out).backward()
        loss_of(expected).backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=name)
        opt.step()
        eager_opt.step()
        opt.zero_grad()
        eager_opt.zero_grad()
        for (name, b), c in zip(model.named_buffers(), eager.buffers(), strict=True):
            torch.testing.assert_close(b, c, **tol, msg=name)
    return model


def _vq_loss(out):
    return out[0].square().mean() + out[1]


@pytest.mark.parametrize("compile_it", [thunder_rs.jit, lambda m: torch.compile(m, backend="thunder_rs")])
def test_a_vq_codebook_averaged_through_data_under_no_grad_trains_as_eager(compile_it):
    # torch.compile: the encoder got no gradient (the graph ran eagerly with grad mode left off).
    batches = [(torch.randn(7, 5),) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no graph runs eagerly
        _train_next_to_eager(EmaCodebook, batches, _vq_loss, compile_it)
    if compile_it is not thunder_rs.jit:
        assert compiled_by_thunder_rs()


def test_a_graph_refused_inside_no_grad_runs_eagerly_under_the_callers_grad_mode():
    # The loss did not require grad: backward() raised.
    batches = [(torch.randn(2, 3),) for _ in range(3)]
    with pytest.warns(UserWarning, match="runs eagerly: .*t_: changes"):
        _train_next_to_eager(
            DetachedInPlace, batches, lambda out: out, lambda m: torch.compile(m, backend="thunder_rs")
        )
    assert torch.is_grad_enabled()


class AutocastStatistic(DetachedInPlace):
    """``DetachedInPlace`` under bfloat16 autocast, its output read by the layer again."""

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = self.lin(x)
            with torch.no_grad():
                self.seen.add_(z.float().mul(2).t_().sum(1))
            y = self.lin(z)
        return y.float().sum()


def test_a_graph_refused_inside_autocast_leaves_later_autocast_regions_casting_the_new_weights():
    # After the first call every autocast region, the eager one below too, used the casts of the
    # weights that the first region made: the optimizer's steps were not seen.
    torch.manual_seed(0)
    model = AutocastStatistic()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="thunder_rs")
    opt, eager_opt = (torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, eager))
    for _ in range(3):
        x = torch.randn(2, 3)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "thunder_rs backend: graph .* runs eagerly: .*t_: changes")
            out = compiled(x)
        expected = eager(x)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        out.backward()
        expected.backward()
        opt.step()
        eager_opt.step()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            read = model.lin(x)
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            eager_read = eager.lin(x)  # (what a region that left the cache empty casts)
        torch.testing.assert_close(read, eager_read, rtol=0, atol=0)


class InferenceTargets(nn.Module):
    """A layer whose targets are made under ``torch.inference_mode()`` with ``t_`` (which
    thunder_rs refuses: its graph runs eagerly)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        z = self.lin(x)
        with torch.inference_mode():
            target = x.flip(0).mul(2).t_().t_()
        return (z - target).square().mean()


def test_a_graph_refused_inside_inference_mode_leaves_inference_mode_as_it_found_it():
    # Inference mode stayed on after the call: the loss had no gradient (backward() raised), and
    # every tensor the program made after was an inference tensor.
    batches = [(torch.randn(2, 3),) for _ in range(3)]
    with pytest.warns(UserWarning, match="runs eagerly: .*t_: changes"):
        _train_next_to_eager(
            InferenceTargets, batches, lambda out: out, lambda m: torch.compile(m, backend="thunder_rs")
        )
    assert not torch.is_inference_mode_enabled() and not torch.ones(1).is_inference()
