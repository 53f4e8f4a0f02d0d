"""Constructs real programs hit, round 3: counters and attributes on modules a program reaches
other than as the jitted module, run as eager runs them.

A step counter on a module the program captured (``model.count += 1`` in a function over a
closure's or a global's model) or takes as an argument made every call compile again ("Linear.count
changed from 1 to 2"), where the jitted module's own counter turns into a size input once it has
changed (``dynamic.HeldInt``), as torch.compile's automatic dynamic ints do: it now does so there
too, and a counter used in tensor math (a bias correction ``1 - beta ** step``) still gives
eager's value on every call. A module picked from a closure's dict by a computed key
(``mods[f"l{i}"]``) kept the trace's ``SymInt`` in the attributes the program set, and its
counter, guarded as it was after the program's write, was not counted on by compiled calls."""

import pytest
import torch
from torch import nn

import thunder_rs

from test_data_rebinding import COMPILERS, _eager, _line_of
from thunder_rs.errors import ThunderNotImplementedError
from test_refusals_round2 import _same

pytestmark = pytest.mark.usefixtures("one_thread")


def _bias_corrected(compile_it, as_argument: bool) -> tuple:
    """Adam-style bias correction by a step counter the module holds, over six calls."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    model.step = 0

    def train_step(model, x):
        model.step += 1
        return model(x) / (1 - 0.9**model.step), model.step * 2

    run = compile_it(train_step if as_argument else (lambda x: train_step(model, x)))
    seen = []
    for i in range(6):
        x = torch.full((2, 3), float(i))
        seen += [list(run(model, x) if as_argument else run(x)), model.step]
    return seen, run


@COMPILERS
@pytest.mark.parametrize("as_argument", [False, True], ids=["captured", "argument"])
def test_a_step_counter_on_a_captured_or_argument_module_stops_recompiling(compile_it, as_argument):
    # Compiled on every call (6 misses of 6): the counter was a constant of each trace.
    got, run = _bias_corrected(compile_it, as_argument)
    _same(got, _bias_corrected(_eager, as_argument)[0])
    if compile_it is thunder_rs.jit:  # (0 and 1 stay constants, as sizes do; from 2 on one entry serves)
        assert thunder_rs.cache_misses(run) == 3 and thunder_rs.cache_hits(run) == 3


def _picked_by_key(compile_it) -> list:
    """Layers in a closure's dict picked by a computed key, each counting its calls and keeping the
    call's index and batch size."""
    torch.manual_seed(0)
    layers = {"l0": nn.Linear(3, 2), "l1": nn.Linear(3, 2)}
    for layer in layers.values():
        layer.count, layer.index, layer.batch = 0, -1, -1

    def step(x, i):
        layer = layers[f"l{i % 2}"]
        layer.count += 1
        layer.index, layer.batch = i, x.shape[0]
        return layer(x).sum()

    run, seen = compile_it(step), []
    for i, n in [(0, 2), (1, 3), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6)]:
        seen.append(run(torch.ones(n, 3), i))
        seen += [[layer.count, layer.index, layer.batch] for layer in layers.values()]
    return seen


@COMPILERS
def test_a_module_picked_from_a_closure_dict_by_a_computed_key_counts_as_eager(compile_it):
    # jit: the trace's SymInt left in layer.index (ThunderRuntimeError on comparing it), and with
    # constant keys the counts stayed at 1 (compiled calls set the traced count + 1).
    _same(_picked_by_key(compile_it), _picked_by_key(_eager))


class _Alternating(nn.Module):
    """Blocks taken in turn by a computed index, each counting its calls (added to the output)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(3, 3) for _ in range(2)])
        self.calls = 0
        for block in self.blocks:
            block.count = 0

    def forward(self, x):
        block = self.blocks[self.calls % 2]
        block.count += 1
        self.calls += 1
        return block(x).sum() + block.count


def _alternating(compile_it) -> list:
    torch.manual_seed(0)
    model = _Alternating()
    run = compile_it(model)
    return [[run(torch.ones(2, 3)), [b.count for b in model.blocks], model.calls] for _ in range(7)]


@COMPILERS
def test_a_block_taken_by_a_computed_index_counts_as_eager(compile_it):
    # jit: from the fifth call the blocks' counts stayed at 2 and the outputs used them (the count,
    # read through a local after the write, was not guarded).
    _same(_alternating(compile_it), _alternating(_eager))


class _DictScaled(nn.Module):
    """A scale kept in and read from the instance dict, as code that bypasses ``__setattr__`` does."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.__dict__["scale"] = 1.0

    def forward(self, x):
        return self.lin(x) * self.__dict__["scale"]


def _dict_scaled(compile_it) -> list:
    torch.manual_seed(0)
    model = _DictScaled()
    run, seen = compile_it(model), []
    for scale in (1.0, 2.0, 2.0, 3.0):
        model.__dict__["scale"] = scale
        seen.append(run(torch.ones(2, 3)))
    return seen


@COMPILERS
def test_a_module_attribute_read_and_set_through_its_dict_is_the_calls(compile_it):
    # jit: kept scale 1.0 (module guards wait for nn.Module.__setattr__, which a __dict__ write skips).
    _same(_dict_scaled(compile_it), _dict_scaled(_eager))


class _Scheduled(nn.Module):
    """Scales taken from an iterator the module holds, one per call."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.scales = iter([1.0, 2.0, 3.0])

    def forward(self, x):
        return self.lin(x) * next(self.scales)  # consumed


def test_next_on_an_iterator_a_module_holds_is_refused_naming_the_attribute_and_line():
    # Said "(an argument, a global or a closure cell)", not which.
    model = _Scheduled()
    line = _line_of(_Scheduled.forward, "# consumed")
    with pytest.raises(
        ThunderNotImplementedError, match=rf"^next: .*list_iterator .* at {line}, held as _Scheduled.scales;"
    ):
        thunder_rs.jit(model)(torch.ones(2, 3))
    assert next(model.scales) == 1.0  # (tracing took no item)


class _LazyBuffer(nn.Module):
    """A running mean registered by the first call (lazy initialisation)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        if not hasattr(self, "running"):
            self.register_buffer("running", torch.zeros(3))  # registered
        self.running.mul_(0.9).add_(x.mean(0), alpha=0.1)
        return self.lin(x)


def test_a_buffer_registered_by_forward_is_registered_as_eager_registers_it():
    # Was refused ("forward registers or removes buffers"): the call now registers it after.
    torch.manual_seed(0)
    model, eager = _LazyBuffer(), _LazyBuffer()
    eager.load_state_dict(model.state_dict())
    run = thunder_rs.jit(model)
    for x in (torch.ones(2, 3), torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)):
        _same(run(x), eager(x))
        assert torch.equal(model.running, eager.running) and "running" in model._buffers
    assert sorted(model.state_dict()) == sorted(eager.state_dict())


class _LazyParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        if not hasattr(self, "gain"):
            self.register_parameter("gain", nn.Parameter(torch.ones(2)))  # registered
        return self.lin(x) * self.gain


def test_a_parameter_registered_by_forward_is_refused_naming_the_line():
    model = _LazyParameter()
    line = _line_of(_LazyParameter.forward, "# registered")
    with pytest.raises(
        ThunderNotImplementedError, match=rf"forward registers or removes parameters \('gain'\) at {line};"
    ):
        thunder_rs.jit(model)(torch.ones(2, 3))
    assert not hasattr(model, "gain")
