"""Items a program reads by a constant key from dicts, lists and tuples it reaches as state
(``self.cfg["sub"]["scale"]``, ``self.hooks[0].alpha``, ``TABLE[1]["w"]``) are guarded like
attributes: changing them between calls recompiles, so every call computes what eager computes."""

import types

import pytest
import torch
import torch.nn as nn

import thunder_rs
from test_getattr_guards import check_changes_recompile


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = {"scale": 2.0, "sub": {"shift": 1.0}}
        self.steps = [types.SimpleNamespace(alpha=1.0), types.SimpleNamespace(alpha=2.0)]
        self.pairs = ({"w": 3.0}, {"w": 4.0})
        self.blocks = nn.ModuleList([nn.Identity(), nn.Identity()])
        self.blocks[1].gain = 0.5

    def forward(self, x):
        y = x * self.cfg["scale"] + self.cfg["sub"]["shift"]
        y = y * self.steps[1].alpha + self.pairs[0]["w"]
        return y * self.blocks[1].gain


CHANGES = [
    lambda m: m.cfg.__setitem__("scale", 5.0),
    lambda m: m.cfg["sub"].__setitem__("shift", -1.0),
    lambda m: m.cfg.__setitem__("sub", {"shift": 7.0}),
    lambda m: setattr(m.steps[1], "alpha", 3.0),
    lambda m: m.steps.__setitem__(1, types.SimpleNamespace(alpha=-2.0)),
    lambda m: m.pairs[0].__setitem__("w", 9.0),
    lambda m: setattr(m.blocks[1], "gain", 4.0),
]


@pytest.mark.filterwarnings("ignore:thunder_rs. Nested recompiled")
def test_items_read_by_a_constant_key_are_guarded():
    check_changes_recompile(Nested(), CHANGES, torch.randn(3))


def test_a_miss_reason_names_the_item():
    model = Nested()
    jmodel = thunder_rs.jit(model)
    jmodel(torch.randn(3))
    model.cfg["sub"]["shift"] = 2.5
    jmodel(torch.randn(3))
    reason = thunder_rs.compile_stats(jmodel).miss_reasons[-1]
    assert "Nested.cfg['sub']" in reason, reason


TABLE = [{"w": 1.0}, {"w": 2.0}]


def _reads_a_global_table(x):
    return x * TABLE[1]["w"]


@pytest.mark.parametrize("change", [lambda: TABLE[1].__setitem__("w", 6.0), lambda: TABLE.__setitem__(1, {"w": 0.5})])
def test_items_of_a_global_are_guarded(change):
    saved = [dict(d) for d in TABLE]
    try:
        jf = thunder_rs.jit(_reads_a_global_table)
        x = torch.randn(2)
        torch.testing.assert_close(jf(x), _reads_a_global_table(x))
        change()
        torch.testing.assert_close(jf(x), _reads_a_global_table(x))
    finally:
        TABLE[:] = saved


def test_items_of_a_closure_are_guarded():
    scales = {"inner": {"s": 2.0}}

    def program(x):
        return x * scales["inner"]["s"]

    jprogram = thunder_rs.jit(program)
    x = torch.randn(2)
    torch.testing.assert_close(jprogram(x), program(x))
    scales["inner"]["s"] = -1.0
    torch.testing.assert_close(jprogram(x), program(x))


def test_unchanged_items_do_not_recompile():
    model = Nested()
    jmodel = thunder_rs.jit(model)
    for _ in range(3):
        jmodel(torch.randn(3))
    stats = thunder_rs.compile_stats(jmodel)
    assert stats.cache_misses == 1 and stats.cache_hits == 2, stats.miss_reasons


class RestoresItsTensors(nn.Module):
    """Stores a new list of its tensors on every call, as torchvision's ``AnchorGenerator``
    (``self.cell_anchors = [a.to(dtype, device) for a in self.cell_anchors]``)."""

    def __init__(self):
        super().__init__()
        self.cells = [torch.randn(3, 4), torch.randn(2, 4)]
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.cells = [c.to(dtype=x.dtype, device=x.device) for c in self.cells]
        return self.lin(x) + sum(c.sum() for c in self.cells)


def test_a_new_list_of_the_same_tensors_each_call_compiles_once_and_keeps_them():
    """Eager keeps the very tensors (``to`` of their own dtype returns them); so does every
    compiled call, whose list then holds the objects the guard expects: one compile (it was a
    compile per call). A list whose items change recompiles."""
    model = RestoresItsTensors()
    jmodel = thunder_rs.jit(model)
    cells = list(model.cells)
    for _ in range(3):
        x = torch.randn(5, 4)
        torch.testing.assert_close(jmodel(x), RestoresItsTensors.forward(model, x))
        assert all(a is b for a, b in zip(model.cells, cells))
    assert thunder_rs.cache_misses(jmodel) == 1
    model.cells = [cells[0], torch.ones(2, 4)]
    x = torch.randn(5, 4)
    torch.testing.assert_close(jmodel(x), RestoresItsTensors.forward(model, x))
    assert thunder_rs.cache_misses(jmodel) == 2
