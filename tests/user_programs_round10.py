"""The programs of ``test_user_programs_round10.py``: each takes how to compile (``thunder_rs.jit``,
``torch.compile(backend="thunder_rs")`` or nothing, for eager), runs it over several calls while the
Python state or the input data change between them, and returns what the calls gave and left behind
(outputs, gradients, errors raised, the program's own state, the generators' next numbers)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from user_programs_round8 import _backward_steps, grads  # noqa: F401 (user_programs_round10_state's too)
from user_programs_round9 import _raised  # noqa: F401 (user_programs_round10_state's)


# -- (a) data-dependent branches ------------------------------------------------------------------


class LogIfPositive(nn.Module):
    """``if (x > 0).all()`` picks a log; otherwise a softplus: the branch flips both ways."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        if (y > 0).all():
            return y.log()
        return F.softplus(y)


def all_positive_branch(compile_it) -> list:
    torch.manual_seed(0)
    model = LogIfPositive()
    with torch.no_grad():
        model.lin.weight.copy_(torch.eye(3))
        model.lin.bias.zero_()
    xs = [torch.rand(2, 3) + 0.1, torch.randn(2, 3), torch.rand(2, 3) + 1.0, -torch.rand(2, 3)]
    return _backward_steps(model, compile_it(model), [(x,) for x in xs])


class EarlyExitOnPadding(nn.Module):
    """Returns its hidden states as they came when every token is padding (an early ``return``)."""

    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, hidden, attention_mask):
        if not attention_mask.any():
            return hidden
        scores = self.attn(hidden) @ hidden.transpose(-1, -2)
        scores = scores.masked_fill(~attention_mask[:, None, :], float("-inf"))
        return self.norm(hidden + scores.softmax(-1).nan_to_num() @ hidden)


def all_padding_early_return(compile_it) -> list:
    torch.manual_seed(0)
    model = EarlyExitOnPadding()
    masks = ([[1, 1, 0]], [[0, 0, 0]], [[1, 0, 0]], [[0, 0, 0]])
    batches = [(torch.randn(1, 3, 4, requires_grad=True), torch.tensor(m, dtype=torch.bool)) for m in masks]
    seen = _backward_steps(model, compile_it(model), batches)
    return seen + [b[0].grad for b in batches]


def _empty_or_mean(x):
    if x.numel() == 0:
        return x.new_zeros(x.shape[-1])
    return x.mean(0)


def numel_zero_branch(compile_it) -> list:
    run, seen = compile_it(_empty_or_mean), []
    for n in (3, 0, 4, 0, 2):
        x = torch.arange(n * 2.0).view(n, 2).requires_grad_()
        out = run(x)
        if out.requires_grad:
            out.sum().backward()
        seen += [out, x.grad]
    return seen


def _beam_like(logits_step, scores, max_steps: int):
    """Extends beams until every one ended (an end token, 0, at the top) or ``max_steps``."""
    finished = torch.zeros(scores.shape[0], dtype=torch.bool)
    steps, tokens = 0, []
    while not finished.all() and steps < max_steps:
        step_scores = scores[:, None] + logits_step[steps].log_softmax(-1)
        best, token = step_scores.max(-1)
        scores = torch.where(finished, scores, best)
        token = token.masked_fill(finished, 0)
        finished = finished | (token == 0)
        tokens.append(token)
        steps += 1
    return scores, torch.stack(tokens), steps


def beam_like_loop(compile_it) -> list:
    torch.manual_seed(0)
    run, seen = compile_it(_beam_like), []
    for end_at in (1, 3, 0, 2):
        logits = torch.randn(4, 2, 5)
        logits[end_at:, :, 0] += 10.0  # every beam ends at step end_at
        logits.requires_grad_()
        scores, tokens, steps = run(logits, torch.zeros(2), 4)
        scores.sum().backward()
        seen += [scores, tokens, steps, logits.grad]
    return seen


def _where_vs_item(x, w):
    y = x @ w
    if y.mean().item() > 0:
        a = y * 2
    else:
        a = -y
    return a + torch.where(y > 0, y, y.exp() - 1)


def where_and_item_branch(compile_it) -> list:
    torch.manual_seed(0)
    run, w, seen = compile_it(_where_vs_item), torch.randn(3, 3, requires_grad=True), []
    for sign in (1.0, -1.0, -1.0, 1.0):
        x = sign * torch.ones(2, 3) + 0.1 * torch.randn(2, 3)
        x = x * torch.sign(w.detach().sum(0)) if sign > 0 else x * -torch.sign(w.detach().sum(0))
        out = run(x, w)
        out.sum().backward()
        seen += [out, w.grad.clone()]
        w.grad = None
    return seen


class MixtralLikeMoE(nn.Module):
    """Top-2 routing as HF Mixtral writes it: an expert no token chose is skipped
    (``if expert_mask[i].any()``), its output added back with ``index_add_``."""

    def __init__(self, experts=4, dim=4):
        super().__init__()
        self.gate = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 8), nn.SiLU(), nn.Linear(8, dim)) for _ in range(experts)
        )

    def forward(self, x):
        weights, chosen = self.gate(x).softmax(-1).topk(2, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        expert_mask = F.one_hot(chosen, len(self.experts)).permute(2, 1, 0)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            if not expert_mask[i].any():
                continue
            slot, token = torch.where(expert_mask[i])
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out


def mixtral_like_routing(compile_it) -> list:
    torch.manual_seed(0)
    model = MixtralLikeMoE()
    with torch.no_grad():
        model.gate.weight.copy_(torch.tensor([[4.0, 0, 0, 0], [0, 4.0, 0, 0], [0, 0, 4.0, 0], [0, 0, 0, 4.0]]))
    rows = ([[1.0, 1, 0, 0]], [[1.0, 1, 0, 0], [0, 0, 1, 1]], [[0, 1.0, 1, 0]] * 3, [[1.0, 0, 0, 1]])
    return _backward_steps(model, compile_it(model), [(torch.tensor(r),) for r in rows])


class Clipped(nn.Module):
    def __init__(self, clip: float):
        super().__init__()
        self.lin, self.clip = nn.Linear(3, 3), clip

    def forward(self, x):
        y = self.lin(x)
        if y.abs().max() > self.clip:
            y = y * (self.clip / y.abs().max())
        return y


class NestedBranches(nn.Module):
    """A branch in the parent around children that branch themselves."""

    def __init__(self):
        super().__init__()
        self.a, self.b = Clipped(1.0), Clipped(5.0)

    def forward(self, x):
        if x.sum() > 0:
            return self.b(self.a(x))
        return self.a(self.b(x)) * 2


def nested_submodule_branches(compile_it) -> list:
    torch.manual_seed(0)
    model = NestedBranches()
    scales = (0.1, -0.1, 10.0, -10.0, 0.1)
    return _backward_steps(model, compile_it(model), [(torch.ones(2, 3) * s,) for s in scales])


class RunningPeak(nn.Module):
    """Under ``no_grad``, a buffer updated only when the batch's norm is above it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("peak", torch.zeros(()))
        self.updates = 0

    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():
            norm = y.norm()
            if norm > self.peak:
                self.peak.copy_(norm)
                self.updates += 1
        return y / self.peak


def branch_under_no_grad(compile_it) -> list:
    torch.manual_seed(0)
    model = RunningPeak()
    batches = [(torch.randn(2, 3) * s,) for s in (1.0, 0.5, 3.0, 0.1)]
    return _backward_steps(model, compile_it(model), batches) + [model.peak.clone(), model.updates]


def _autocast_rescaled(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        if y.float().abs().max() > 8:
            y = y / 8
    return y.float().sum(-1)


def branch_under_autocast(compile_it) -> list:
    torch.manual_seed(0)
    run, w, seen = compile_it(_autocast_rescaled), torch.randn(4, 4, requires_grad=True), []
    for scale in (1.0, 20.0, 1.0, 20.0):
        out = run(torch.ones(2, 4) * scale, w)
        out.sum().backward()
        seen += [out, w.grad.clone()]
        w.grad = None
    return seen


def _conjugate_gradient(a, b, tol: float):
    x = torch.zeros_like(b)
    r = b - a @ x
    p, rs, iters = r, r @ r, 0
    while rs.sqrt() > tol and iters < 10:
        ap = a @ p
        alpha = rs / (p @ ap)
        x = x + alpha * p
        r = r - alpha * ap
        rs_new = r @ r
        p, rs, iters = r + (rs_new / rs) * p, rs_new, iters + 1
    return x, iters


def conjugate_gradient_refinement(compile_it) -> list:
    torch.manual_seed(0)
    run, seen = compile_it(_conjugate_gradient), []
    m = torch.randn(4, 4)
    a = (m @ m.T + 4 * torch.eye(4)).requires_grad_()
    for tol, scale in ((1e-1, 1.0), (1e-6, 1.0), (1e-1, 0.0), (1e-1, 1.0)):
        b = (torch.arange(4.0) * scale).requires_grad_()
        x, iters = run(a, b, tol)
        if x.requires_grad:  # (b of zeros: no step taken)
            x.sum().backward()
        seen += [x, iters, a.grad, b.grad]
        a.grad = None
    return seen


class GradScalerLike(nn.Module):
    """Skips the step when a gradient is not finite (``if torch.isinf(g).any() or torch.isnan(g).any()``),
    halving its scale; otherwise steps and counts the good steps."""

    def __init__(self):
        super().__init__()
        self.scale, self.good = 4.0, 0

    def forward(self, param, grad):
        found_inf = torch.isinf(grad).any() or torch.isnan(grad).any()
        if found_inf:
            self.scale /= 2
            return param
        self.good += 1
        with torch.no_grad():
            param.sub_(0.1 * grad / self.scale)
        return param


def grad_scaler_like_skip(compile_it) -> list:
    model = GradScalerLike()
    run, param, seen = compile_it(model), torch.ones(3), []
    for bad in (None, "inf", None, "nan", None):
        grad = torch.arange(3.0)
        if bad:
            grad[1] = float(bad)
        seen += [run(param, grad).clone(), model.scale, model.good]
    return [*seen, param]


class ConfidentExit(nn.Module):
    """Early exit: stops at the first layer whose prediction is confident (``break`` on a value)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.head = nn.Linear(4, 2)

    def forward(self, x, threshold: float):
        for depth, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            probs = self.head(x).softmax(-1)
            if probs.max() > threshold:
                break
        return probs, depth


def confident_early_exit(compile_it) -> list:
    torch.manual_seed(0)
    model = ConfidentExit()
    x = torch.randn(1, 4)
    batches = [(x, t) for t in (0.0, 1.0, 0.0, 0.999)]
    return _backward_steps(model, compile_it(model), batches)


class TracksBest(nn.Module):
    """Keeps the best loss seen as a Python float (``self.best = loss.item()``)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 1)
        self.best, self.improved = math.inf, []

    def forward(self, x, y):
        loss = F.mse_loss(self.lin(x).squeeze(-1), y)
        if loss.item() < self.best:
            self.best = loss.item()
            self.improved.append(True)
        else:
            self.improved.append(False)
        return loss


def best_loss_attribute(compile_it) -> list:
    torch.manual_seed(0)
    model = TracksBest()
    x = torch.randn(4, 3)
    batches = [(x, torch.full((4,), float(s))) for s in (3.0, 1.0, 2.0, 0.5)]
    return _backward_steps(model, compile_it(model), batches) + [model.best, model.improved]


def _truthiness(x):
    if x.sum():  # bool() of a 0-dim tensor
        return x / x.sum()
    return x + 1


def tensor_truthiness(compile_it) -> list:
    run, seen = compile_it(_truthiness), []
    for v in ([1.0, 2.0], [1.0, -1.0], [0.5, 0.5], [2.0, -2.0]):
        x = torch.tensor(v, requires_grad=True)
        out = run(x)
        out.sum().backward()
        seen += [out, x.grad]
    return seen


def _both_signs(x):
    if x.max() > 0 and x.min() < 0:
        return x.abs()
    if x.max() > 0:
        return x * 2
    return -x


def short_circuit_reads(compile_it) -> list:
    run, seen = compile_it(_both_signs), []
    for v in ([1.0, -1.0], [1.0, 2.0], [-1.0, -2.0], [3.0, -1.0], [1.0, 2.0]):
        x = torch.tensor(v, requires_grad=True)
        out = run(x)
        out.sum().backward()
        seen += [out, x.grad]
    return seen


def _top_positive(x):
    k = int((x > 0).sum())
    return x.topk(k).values.sum() if k else x.sum() * 0


def count_sized_topk(compile_it) -> list:
    run, seen = compile_it(_top_positive), []
    for v in ([1.0, -1.0, 2.0], [-1.0, -2.0, -3.0], [1.0, 2.0, 3.0], [1.0, -1.0, 2.0]):
        x = torch.tensor(v, requires_grad=True)
        out = run(x)
        out.backward()
        seen += [out, x.grad]
    return seen


def _isclose_skip(x, target: float):
    if math.isclose(x.sum().item(), target, abs_tol=1e-6):
        return x * 0
    return x - target / x.numel()


def isclose_on_items(compile_it) -> list:
    run, seen = compile_it(_isclose_skip), []
    for v, t in (([1.0, 2.0], 3.0), ([1.0, 2.0], 4.0), ([0.5, 0.5], 1.0), ([0.5, 0.5], 1.0 + 1e-9)):
        x = torch.tensor(v, requires_grad=True)
        out = run(x, t)
        out.sum().backward()
        seen += [out, x.grad]
    return seen
