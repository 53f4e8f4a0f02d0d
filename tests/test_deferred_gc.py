"""A compile starts no garbage collection of generation 0 before its end (``core/run/deferred_gc.py``):
the threshold is raised while it runs and put back after, one collection runs where one was due,
and what the program or the user set is left as eager leaves it."""

import gc

import torch
from torch import nn

import thunder_rs


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[layer for _ in range(24) for layer in (nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU())])


def _collections_during(call) -> list:
    phases: list = []

    def note(phase, info):
        if phase == "start":
            phases.append(info["generation"])

    gc.callbacks.append(note)
    try:
        call()
    finally:
        gc.callbacks.remove(note)
    return phases


def test_a_compile_collects_once_at_its_end_and_puts_the_threshold_back():
    model, x = _model(), torch.randn(4, 8)
    jmodel = thunder_rs.jit(model)
    before = gc.get_threshold()
    gc.collect()
    out: list = []
    collections = _collections_during(lambda: out.append(jmodel(x)))
    torch.testing.assert_close(out[0], model(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jmodel).cache_misses == 1
    assert collections in ([], [0])  # (the compile allocates some ten thousand objects)
    assert gc.get_threshold() == before


def test_collection_disabled_stays_disabled_through_a_compile():
    model, x = _model(), torch.randn(4, 8)
    gc.disable()
    try:
        assert _collections_during(lambda: thunder_rs.jit(model)(x)) == []
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_threshold_the_program_sets_is_left_as_eager_leaves_it():
    before = gc.get_threshold()

    def program(x):
        gc.set_threshold(500, *before[1:])
        return x * 2

    try:
        thunder_rs.jit(program)(torch.randn(3))
        assert gc.get_threshold() == (500, *before[1:])
    finally:
        gc.set_threshold(*before)
