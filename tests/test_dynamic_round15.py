"""Shapes that change between calls (issue 26), a fifteenth sweep: recompiles that should not
happen. Every call's outputs (and gradients where the program trains) are checked against eager,
and the compiles counted.

What the sweep found, each fixed and pinned here: a jitted module dropped every entry when its
structure changed (a submodule set, a parameter or buffer registered or deleted, a forward set on
an instance), so changing it back (a LoRA wrapper put on a layer and taken off, a submodule
swapped and swapped back) compiled again each time; torch.compile keeps its earlier entries. The
structure's number is now in the key (``core.state.structures``): a structure the module had finds
its entries, whose guards decide as ever (an attribute, a hook or a parameter changed meanwhile
runs as eager). Clearing the entries had also left the symbolic ones: after a structure change
(``model.act = nn.Tanh()``) or ``thunder_rs.reset()``, a symbolic entry of the old structure served
calls whose sizes it takes, running the module as it was (ReLU for Tanh: silently not eager).
"""

import gc
import weakref

import pytest
import torch
import torch.nn as nn

import thunder_rs
from thunder_rs.core.state import structures
from test_dynamic_round9 import assert_same, misses

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")]


# -- a module changed back to a structure it had ------------------------------------------------------


class LoRA(nn.Module):
    """A low-rank adapter around a linear layer, as PEFT wraps one: the layer stays a submodule."""

    def __init__(self, base: nn.Linear, rank: int = 2, scale: float = 2.0):
        super().__init__()
        self.base, self.scale = base, scale
        self.A = nn.Parameter(0.3 * torch.randn(rank, base.in_features, dtype=torch.float64))
        self.B = nn.Parameter(0.3 * torch.randn(base.out_features, rank, dtype=torch.float64))

    def forward(self, x):
        return self.base(x) + (x @ self.A.T @ self.B.T) * self.scale


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.act, self.head = nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)
        self.temperature = 1.0

    def forward(self, x):
        return self.head(self.act(self.first(x))) / self.temperature


def _body():
    torch.manual_seed(0)
    return Body().double()


def _step(model, jitted, T: int) -> None:
    """One call of ``model`` eager and jitted on ``T`` rows: outputs and the trainable parameters'
    gradients bit-equal."""
    x = torch.randn(T, 4, dtype=torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    expected, got = model(x), jitted(x)
    assert_same(expected, got)
    for a, b in zip(torch.autograd.grad(expected.sin().sum(), params), torch.autograd.grad(got.sin().sum(), params)):
        assert_same(a, b)


def test_a_lora_wrapper_taken_off_and_put_back_finds_the_entries_of_each_structure():
    """A LoRA wrapper put on a layer, taken off and put back (the same wrapper), at one length, then
    over lengths that change: each structure compiles as a new one would (static, then symbolic);
    returning to one compiles nothing (it compiled each time: five compiles for the first five
    structures at one length)."""
    model = _body()
    jitted = thunder_rs.jit(model)
    base = model.first
    wrapper = LoRA(base)
    for structure in (base, wrapper, base, wrapper, base):
        model.first = structure
        _step(model, jitted, 5)
    assert misses(jitted) == 2, thunder_rs.compile_stats(jitted).miss_reasons
    for structure in (base, wrapper):
        model.first = structure
        for T in (3, 7):
            _step(model, jitted, T)
    assert misses(jitted) == 4
    for structure in (base, wrapper, base, wrapper):
        model.first = structure
        for T in (4, 9, 5):
            _step(model, jitted, T)
    assert misses(jitted) == 4, thunder_rs.compile_stats(jitted).miss_reasons


def test_a_swapped_submodule_runs_as_eager_and_swapping_it_back_compiles_nothing():
    """``model.act = nn.Tanh()`` after the symbolic compile: the symbolic entry of the ReLU model
    served the calls (ReLU's outputs, not eager's). Now the Tanh model compiles, and the ReLU back
    finds its entries."""
    model = _body()
    jitted = thunder_rs.jit(model)
    relu = model.act
    for T in (3, 5, 7):
        _step(model, jitted, T)
    model.act = nn.Tanh()
    for T in (3, 9):
        _step(model, jitted, T)
    compiled = misses(jitted)
    model.act = relu
    for T in (3, 6, 11):
        _step(model, jitted, T)
    assert misses(jitted) == compiled


def test_a_structure_returned_to_runs_what_changed_meanwhile_as_eager():
    """While the module had another structure, what its entries read changed: an attribute of the
    root, a hook and an attribute of the swapped-out submodule, that submodule's weight replaced by
    another tensor of the same sizes, a buffer registered and deleted again. Back in the structure,
    every call is eager's (the entries' guards decide; a changed read compiles)."""
    model = _body()
    jitted = thunder_rs.jit(model)
    leaky = model.act = nn.LeakyReLU(0.1)
    for T in (3, 5, 7):
        _step(model, jitted, T)
    first = model.first

    def away_and_back(change) -> None:
        model.first = LoRA(first)
        _step(model, jitted, 5)
        change()
        model.first = first
        for T in (3, 6):
            _step(model, jitted, T)

    away_and_back(lambda: setattr(model, "temperature", 2.0))
    away_and_back(lambda: setattr(leaky, "negative_slope", 0.3))
    handle = first.register_forward_hook(lambda module, args, out: out * 3)
    away_and_back(lambda: None)
    away_and_back(handle.remove)
    away_and_back(lambda: setattr(first, "weight", nn.Parameter(torch.randn(6, 4, dtype=torch.float64))))
    away_and_back(lambda: first.register_buffer("seen", torch.zeros(2)))
    away_and_back(lambda: delattr(first, "seen"))
    with torch.no_grad():
        first.bias.mul_(-1)
    _step(model, jitted, 4)


def test_training_mode_and_hooks_removed_return_to_their_entries():
    """(Checked, unchanged: they were keyed or guarded, not part of the structure.) ``train()`` and
    ``eval()`` toggled and a hook added then removed compile once each state, then hit."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.0), nn.BatchNorm1d(6), nn.Linear(6, 2)).double()
    jitted = thunder_rs.jit(model)
    for mode in (True, False, True, False):
        model.train(mode)
        _step(model, jitted, 5)
    assert misses(jitted) == 2
    for _ in range(2):
        handle = model[3].register_forward_hook(lambda module, args, out: out.flip(-1))
        _step(model, jitted, 5)
        handle.remove()
        _step(model, jitted, 5)
    assert misses(jitted) == 4  # (each hook is a new one: its handle's id is in the hooks' snapshot)


def test_past_the_structures_kept_the_oldest_is_dropped_with_its_entries():
    """More structures than ``STRUCTURES_KEPT``: the least recently bound one is dropped with its
    entries (its modules no longer kept alive by them) and compiles again when it returns."""
    model = _body()
    jitted = thunder_rs.jit(model)
    relu = model.act
    _step(model, jitted, 3)
    first_swapped = nn.Tanh()
    gone = weakref.ref(first_swapped)
    model.act = first_swapped
    _step(model, jitted, 3)
    del first_swapped
    for _ in range(structures.STRUCTURES_KEPT):
        model.act = nn.Tanh()
        _step(model, jitted, 3)
    model.act = relu
    compiled = misses(jitted)
    _step(model, jitted, 3)
    assert misses(jitted) == compiled + 1
    gc.collect()
    assert gone() is None
    assert len(jitted._jfn._structures.numbers()) == structures.STRUCTURES_KEPT


def test_reset_drops_the_symbolic_entries_too():
    """``thunder_rs.reset()`` cleared the entries by key but not the symbolic ones, which served the
    next call of other sizes without compiling."""
    jitted = thunder_rs.jit(lambda x: x.relu() * 2)
    for T in (3, 5, 7):
        jitted(torch.randn(T))
    thunder_rs.reset()
    x = torch.randn(9)
    assert torch.equal(jitted(x), x.relu() * 2)
    assert misses(jitted) == 3
