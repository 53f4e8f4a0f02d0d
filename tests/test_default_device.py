"""torch's default device in a jitted program: factory calls without a device (``torch.zeros(3)``,
``torch.arange(T)``, ``torch.tensor(...)``) put their tensors where eager's do, on the device
``torch.set_default_device`` or a ``with torch.device(...)`` block made the default, and a call under
another default device compiles again. On this CPU machine the other device is ``meta``, which
takes every factory the way CUDA does (a device that is not the CPU, set through the same mode)."""

import pytest
import torch

import thunder_rs


def factories(x):
    n = x.shape[0]
    made = [
        torch.zeros(n),
        torch.ones(2, 3),
        torch.full((2,), 1.5),
        torch.arange(n),
        torch.eye(3),
        torch.linspace(0, 1, 5),
        torch.empty(4),
        torch.tensor([1.0, 2.0]),
        torch.zeros_like(x),
    ]
    return [t.float().sum() + x.float().sum() for t in made[:3]], made


def devices(out) -> list:
    return [t.device for t in out[1]] + [t.device for t in out[0]]


def test_factories_follow_a_torch_device_block():
    jf = thunder_rs.jit(factories)
    x = torch.randn(4, device="meta")
    with torch.device("meta"):
        expected, actual = factories(x), jf(x)
    assert devices(actual) == devices(expected) == [torch.device("meta")] * 12
    assert [t.shape for t in actual[1]] == [t.shape for t in expected[1]]


def test_factories_follow_set_default_device_and_a_change_recompiles():
    jf = thunder_rs.jit(factories)
    x = torch.randn(4)
    cpu = jf(x)
    assert devices(cpu) == [torch.device("cpu")] * 12
    torch.testing.assert_close(cpu[0], factories(x)[0])
    try:
        torch.set_default_device("meta")
        meta = jf(torch.randn(4, device="meta"))
        assert devices(meta) == [torch.device("meta")] * 12
    finally:
        torch.set_default_device(None)
    jf(x)  # the CPU entry again
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_misses == 2 and stats.cache_hits == 1
    assert "default device None -> meta" in stats.miss_reasons[1]


def test_a_device_block_inside_the_program_acts_as_in_eager():
    def program(x):
        with torch.device("meta"):
            inner = torch.ones(3)
        return inner, torch.ones(3) + x

    jf = thunder_rs.jit(program)
    x = torch.randn(3)
    inner, outer = jf(x)
    expected_inner, expected_outer = program(x)
    assert inner.device == expected_inner.device == torch.device("meta")
    torch.testing.assert_close(outer, expected_outer)


@pytest.mark.gpu
def test_factories_follow_cuda_as_the_default_device():
    jf = thunder_rs.jit(factories)
    x = torch.randn(4, device="cuda")
    with torch.device("cuda"):
        expected, actual = factories(x), jf(x)
    assert devices(actual) == devices(expected)
    torch.testing.assert_close(actual[0], expected[0])


def test_set_default_device_inside_the_program_acts_on_every_call():
    # The call is replayed as an effect, as set_default_dtype is: the default device after each call
    # is eager's, and the factories after it in the program see it.
    def sets_and_restores(x):
        torch.set_default_device("meta")
        y = torch.ones(3)
        torch.set_default_device(None)
        return y, x + 1

    def leaves_set(x):
        torch.set_default_device("meta")
        return x + 1

    x = torch.randn(3)
    jf, jg = thunder_rs.jit(sets_and_restores), thunder_rs.jit(leaves_set)
    try:
        for _ in range(2):
            y, z = jf(x)
            assert y.device == torch.device("meta") and torch.get_default_device() == torch.device("cpu")
            torch.testing.assert_close(z, x + 1)
            torch.set_default_device(None)
            jg(x)
            assert torch.get_default_device() == torch.device("meta")
            torch.set_default_device(None)
    finally:
        torch.set_default_device(None)
