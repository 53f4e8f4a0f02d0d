"""State a traced program sets on every call and reads back on the next: a tensor on a global
object (``STATE.last = x.detach()``), a list a method assigns (``self.items = []``). Each program
runs compiled and eagerly over the same calls from the same state; the compiled one must match and
compile once for each state it can meet, not once per call."""

import pytest
import torch

import thunder_rs


class _Running:
    mean = None


RUNNING = _Running()


def _centered(x):
    # Reads the tensor the previous call set, then sets a new one.
    if RUNNING.mean is None:
        RUNNING.mean = x.detach()
    else:
        RUNNING.mean = 0.5 * RUNNING.mean + 0.5 * x.detach()
    return x - RUNNING.mean


def _run(program, xs):
    RUNNING.mean = None
    outs = [program(x) for x in xs]
    return outs, RUNNING.mean


def test_a_tensor_a_global_object_holds_set_by_every_call_is_read_by_the_next():
    # It was guarded as that very tensor: each call found the one the last call set, and compiled.
    xs = [torch.randn(4) for _ in range(5)]
    jf = thunder_rs.jit(_centered)
    got, got_mean = _run(jf, xs)
    want, want_mean = _run(_centered, xs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(got_mean, want_mean)
    assert thunder_rs.compile_stats(jf).cache_misses == 2  # unset, then a tensor
    RUNNING.mean = torch.zeros(1)  # another shape: recompiles
    torch.testing.assert_close(jf(torch.ones(4)), torch.full((4,), 0.5))
    assert thunder_rs.compile_stats(jf).cache_misses == 3
    assert "RUNNING.mean changed from a float32 tensor of shape [4]" in thunder_rs.compile_stats(jf).miss_reasons[2]


class _Collects(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.items = [1.0, 2.0]

    def reset(self):
        self.items = []

    def forward(self, x):
        self.reset()
        self.items.append(x)
        return x * len(self.items)


class _CountsFirst(_Collects):
    def forward(self, x):
        before = len(self.items)  # the list the call found: guarded
        self.reset()
        self.items.append(x)
        return x * (len(self.items) + before)


@pytest.mark.parametrize("kind, compiles", [(_Collects, 1), (_CountsFirst, 3)])
def test_a_list_a_called_method_assigns_is_not_guarded_as_the_one_before_the_call(kind, compiles):
    # forward's read of self.items was evaluated when forward was entered, before self.reset()
    # stored a new list: it guarded the last call's list, and compiled on every call.
    model, twin = kind(), kind()
    jm = thunder_rs.jit(model)
    for x in [torch.randn(3) for _ in range(3)]:
        torch.testing.assert_close(jm(x), twin(x))
        assert len(model.items) == 1 and model.items[0] is x
    assert thunder_rs.compile_stats(jm).cache_misses == compiles


class _Box:
    def __init__(self):
        self.items = [1.0, 2.0]

    def reset(self):
        self.items = []

    def run(self, x):
        self.reset()
        self.items.append(x)
        return x * len(self.items)


BOX = _Box()


def _runs_the_box(x):
    return BOX.run(x)


def test_a_list_a_method_of_a_global_object_assigns_is_not_guarded_as_the_one_before_the_call():
    # The global object was guarded whole as the call found it, the last call's list included.
    jf = thunder_rs.jit(_runs_the_box)
    for x in [torch.randn(3) for _ in range(3)]:
        torch.testing.assert_close(jf(x), x)
        assert len(BOX.items) == 1 and BOX.items[0] is x
    assert thunder_rs.compile_stats(jf).cache_misses == 1
    BOX.scale = 2.0  # any other attribute is still guarded
    jf(torch.ones(3))
    assert thunder_rs.compile_stats(jf).cache_misses == 2
    del BOX.scale
