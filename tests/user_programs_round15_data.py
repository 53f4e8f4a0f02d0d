"""The programs of ``test_user_programs_round15.py`` whose control flow depends on tensor values:
``if x.sum() > 0`` with a backward through either branch, ``.item()`` as a loop count,
``torch.any`` early exits, ``nonzero`` rows processed and written back, a loss over
``masked_select``ed tokens, a Newton iteration ``while`` it has not converged, ``torch.cond``, a
mixture of experts whose routing leaves experts empty, ``tolist()`` used as indices, a greedy
decode stopping at an end token, a rescale by ``max().item()``, ``torch.where(mask)`` coordinates
walked in Python. Each takes how to compile, runs it over several calls with inputs whose
values take other paths, and returns what the calls gave and left."""

import torch
import torch.nn.functional as F
from torch import nn

from user_programs_round8 import _backward_steps


class SignBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        if h.sum() > 0:
            return F.relu(h) * 2
        return torch.tanh(h) - 1


def branch_on_a_sum_with_backward(compile_it) -> list:
    torch.manual_seed(0)
    model = SignBranch()
    run = compile_it(model)
    batches = [(torch.randn(2, 3) * s,) for s in (5.0, -5.0, 5.0, -5.0, -5.0)]
    return _backward_steps(model, run, batches)


class RefinedByCount(nn.Module):
    """Refinement steps counted by a tensor the caller passes (``int(steps.item())``)."""

    def __init__(self):
        super().__init__()
        self.step = nn.Linear(3, 3)

    def forward(self, x, steps):
        x = self.step(x)
        for _ in range(int(steps.item())):
            x = x + 0.5 * torch.tanh(self.step(x))
        return x


def item_as_a_loop_count(compile_it) -> list:
    torch.manual_seed(0)
    model = RefinedByCount()
    run = compile_it(model)
    batches = [(torch.randn(2, 3), torch.tensor(n)) for n in (2, 3, 0, 2, 5)]
    return _backward_steps(model, run, batches)


def _guarded_norm(x):
    if torch.any(torch.isnan(x)):
        return torch.zeros_like(x), False
    if not torch.all(x.abs() < 1e3):
        x = x.clamp(-1e3, 1e3)
    return x / x.norm(), True


def any_and_all_early_exits(compile_it) -> list:
    run, seen = compile_it(_guarded_norm), []
    for x in ([1.0, 2.0], [float("nan"), 1.0], [1e4, 1.0], [3.0, 4.0], [float("nan"), 0.0]):
        seen.append(run(torch.tensor(x)))
    return seen


class SparseRows(nn.Module):
    """Only the rows that are not all zero go through the layer; they are written back in place."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        rows = x.abs().sum(-1).nonzero().squeeze(-1)
        out = torch.zeros_like(x)
        out[rows] = self.lin(x[rows])
        return out, rows.numel()


def nonzero_rows_processed_and_written_back(compile_it) -> list:
    torch.manual_seed(0)
    model = SparseRows()
    run = compile_it(model)
    batches = []
    for keep in ([1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 1], [1, 0, 0, 1]):
        batches.append((torch.randn(4, 3) * torch.tensor(keep, dtype=torch.float32)[:, None],))
    return _backward_steps(model, run, batches)


class MaskedTokenLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3, 5)

    def forward(self, x, labels):
        logits = self.head(x)
        keep = labels != -100
        picked = logits.masked_select(keep[..., None]).view(-1, 5)
        return F.cross_entropy(picked, labels.masked_select(keep)), picked.shape[0]


def masked_select_loss_over_kept_tokens(compile_it) -> list:
    torch.manual_seed(0)
    model = MaskedTokenLoss()
    run = compile_it(model)
    batches = [
        (torch.randn(2, 4, 3), torch.tensor(labels))
        for labels in ([[1, -100, 2, 3], [0, 0, -100, -100]], [[1, 2, 3, 4], [0, 1, 2, 3]], [[-100, 1, -100, -100]] * 2)
    ]
    return _backward_steps(model, run, batches)


def _newton_sqrt(a, tol: float = 1e-10):
    """Square roots by Newton's iteration, ``while`` any has not converged (at most 50 steps)."""
    x, steps = a.clone(), 0
    while (x * x - a).abs().max() > tol and steps < 50:
        x = 0.5 * (x + a / x)
        steps += 1
    return x, steps


def newton_iteration_until_convergence(compile_it) -> list:
    run, seen = compile_it(_newton_sqrt), []
    for values in ([4.0, 9.0], [2.0, 1e6], [4.0, 9.0], [1.0, 1.0], [2.0, 3.0]):
        a = torch.tensor(values, dtype=torch.float64, requires_grad=True)
        x, steps = run(a)
        (grad,) = torch.autograd.grad(x.sum(), a)
        seen += [x, steps, grad]
    return seen


def _conditioned(x, w):
    return torch.cond(x.sum() > 0, lambda x, w: (x @ w).relu(), lambda x, w: (x @ w).sigmoid() - x, (x, w))


def torch_cond_on_a_sum(compile_it) -> list:
    """``torch.cond`` without grad (under grad, thunder_rs refuses it, naming the line: eager's
    backward gives what the branch not taken reads zero gradients)."""
    torch.manual_seed(0)
    run, seen = compile_it(_conditioned), []
    w = torch.randn(3, 3)
    for sign in (1.0, -1.0, -1.0, 1.0):
        with torch.no_grad():
            seen.append(run((torch.rand(2, 3) + 0.1) * sign, w))
    return seen


class TopOneMoE(nn.Module):
    """Top-1 routing; an expert no token chose is skipped (``if not idx.numel()``)."""

    def __init__(self, experts: int = 4):
        super().__init__()
        self.router = nn.Linear(3, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(3, 3) for _ in range(experts))

    def forward(self, x):
        gate = self.router(x).softmax(-1)
        weight, choice = gate.max(-1)
        out, used = torch.zeros_like(x), []
        for e, expert in enumerate(self.experts):
            idx = (choice == e).nonzero().squeeze(-1)
            if not idx.numel():
                continue
            used.append(e)
            out = out.index_add(0, idx, expert(x[idx]) * weight[idx, None])
        return out, used


def moe_routing_with_empty_experts(compile_it) -> list:
    torch.manual_seed(0)
    model = TopOneMoE()
    run = compile_it(model)
    with torch.no_grad():  # (expert 0 wins every token of a batch of positives)
        model.router.weight.zero_()
        model.router.weight[0] = 1.0
        model.router.weight[1] = -1.0
    batches = [(torch.rand(5, 3) * s,) for s in (1.0, -1.0, 1.0)] + [(torch.randn(6, 3),)]
    return _backward_steps(model, run, batches)


def _picked_rows(x, sel):
    rows = [x[i] * (k + 1) for k, i in enumerate(sel.tolist())]
    return torch.stack(rows) if rows else x[:0]


def tolist_as_indices(compile_it) -> list:
    run, seen = compile_it(_picked_rows), []
    x = torch.arange(12.0).reshape(4, 3).requires_grad_()
    for sel in ([0, 2], [3, 1], [0, 2], [1], [], [2, 2, 0]):
        out = run(x, torch.tensor(sel, dtype=torch.int64))
        if out.numel():
            (grad,) = torch.autograd.grad(out.sum(), x)
            seen.append(grad)
        seen.append(out)
    return seen


class GreedyDecoder(nn.Module):
    """Decodes greedily until the end token (``.item()``) or ``max_steps``."""

    def __init__(self):
        super().__init__()
        self.emb, self.cell, self.out = nn.Embedding(6, 4), nn.GRUCell(4, 4), nn.Linear(4, 6)
        self.eos, self.max_steps = 5, 6

    @torch.no_grad()
    def forward(self, token, h):
        tokens = []
        for _ in range(self.max_steps):
            h = self.cell(self.emb(token), h)
            token = self.out(h).argmax(-1)
            tokens.append(int(token.item()))
            if tokens[-1] == self.eos:
                break
        return tokens, h


def greedy_decode_to_an_end_token(compile_it) -> list:
    torch.manual_seed(0)
    model = GreedyDecoder()
    run, seen = compile_it(model), []
    for start in range(4):
        seen += list(run(torch.tensor([start]), torch.randn(1, 4)))
    with torch.no_grad():  # (now the end token wins at once)
        model.out.bias[5] = 100.0
    return seen + list(run(torch.tensor([1]), torch.randn(1, 4)))


def _rescaled(x):
    peak = x.abs().max().item()
    if peak > 1.0:
        x = x / peak
    return x * 2, peak > 1.0


def rescale_by_the_largest_value(compile_it) -> list:
    run, seen = compile_it(_rescaled), []
    for x in ([0.5, -0.2], [3.0, -6.0], [0.1, 0.9], [-2.0, 1.0]):
        x = torch.tensor(x, requires_grad=True)
        out, scaled = run(x)
        (grad,) = torch.autograd.grad(out.sum(), x)
        seen += [out, scaled, grad]
    return seen


def _walked(x, mask):
    rows, cols = torch.where(mask)
    total = x.new_zeros(())
    for r, c in zip(rows.tolist(), cols.tolist()):
        total = total + x[r, c] * (r - c)
    return total, len(rows)


def where_coordinates_walked_in_python(compile_it) -> list:
    run, seen = compile_it(_walked), []
    x = torch.arange(9.0).reshape(3, 3)
    for mask in (torch.eye(3, dtype=torch.bool), x > 5, x > 5, x < 0, (x % 2) == 0):
        seen.append(run(x, mask))
    return seen


class PickedExpert(nn.Module):
    """The expert a router's ``argmax`` picks for the whole batch: a module chosen by a value."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(3, 3)
        self.experts = nn.ModuleList(nn.Linear(3, 3) for _ in range(3))

    def forward(self, x):
        pick = int(self.router(x).mean(0).argmax())
        return self.experts[pick](x), pick


def expert_picked_by_argmax(compile_it) -> list:
    torch.manual_seed(0)
    model = PickedExpert()
    run = compile_it(model)
    with torch.no_grad():
        model.router.weight.copy_(torch.eye(3) * 5)
    batches = [(torch.eye(3)[[k, k]] + 0.01,) for k in (0, 2, 2, 1, 0)]
    return _backward_steps(model, run, batches)


class FiniteSteps(nn.Module):
    """Counts, in a Python int, the batches whose loss was finite, and skips the others."""

    def __init__(self):
        super().__init__()
        self.lin, self.good_steps = nn.Linear(3, 1), 0

    def forward(self, x):
        loss = self.lin(x).square().mean()
        if torch.isfinite(loss):
            self.good_steps += 1
            return loss * (1.0 / self.good_steps)
        return loss.new_zeros(())


def python_counter_updated_on_finite_losses(compile_it) -> list:
    torch.manual_seed(0)
    model = FiniteSteps()
    run, seen = compile_it(model), []
    for bad in (False, True, False, False, True):
        x = torch.randn(2, 3)
        if bad:
            x[0, 0] = float("inf")
        out = run(x)
        if out.requires_grad:
            out.backward()
        seen += [out, model.good_steps, model.lin.weight.grad]
        model.zero_grad()
    return seen
