"""Outputs aliased to inputs (``fd.add_output(output, alias_input)``): the stand-in
(``fake_nvfuser_aliases``) takes and refuses what nvFuser's source does (NVIDIA/Fuser 81c4b22:
python_direct/runtime.cpp:148-169, csrc/fusion.cpp:387-402 and 929-976,
runtime/fusion_executor_cache.cpp:86-97, runtime/allocations.cpp:335-340). Each check runs on the
stand-in on the CPU and on the real bindings on a GPU (``real_nvfuser``: skipped without them)."""

import pytest
import torch

import fake_nvfuser_aliases as aliases
import fake_nvfuser_direct as fake


def _input(module, fd, t):
    contiguity, order = module.compute_tensor_descriptor(list(t.shape), list(t.stride()))
    return fd.define_tensor(list(t.shape), list(contiguity), module.DataType.Float, stride_order=list(order))


def _ema(module, fd, stat, batch):
    """``stat * 0.9 + batch * 0.1``: a running statistic's update, as a BatchNorm region's."""
    a = fd.ops.mul(stat, fd.define_scalar(0.9, dtype=module.DataType.Float))
    b = fd.ops.mul(batch, fd.define_scalar(0.1, dtype=module.DataType.Float))
    return fd.ops.add(a, b)


def _hidden_and_visible(module, device: str):
    """A hidden alias is written and not returned; a visible one is returned as the input itself;
    neither bumps the input's version counter (the kernel writes it)."""
    stat, batch = torch.randn(8, device=device), torch.randn(8, device=device)
    expected = stat * 0.9 + batch * 0.1
    for visible in (False, True):
        target = stat.clone()
        version = target._version
        fd = module.FusionDefinition()
        with fd:
            s, b = _input(module, fd, target), _input(module, fd, batch)
            new = _ema(module, fd, s, b)
            fd.add_output(fd.ops.neg(b))
            if visible:
                fd.add_output(new)
            fd.add_output(new, s)
        outs = fd.execute([target, batch])
        assert len(outs) == 1 + visible
        torch.testing.assert_close(outs[0], -batch)
        assert torch.equal(target, expected)
        assert target._version == version
        if visible:
            assert outs[1].data_ptr() == target.data_ptr()


def _made_visible_later(module, device: str):
    """``add_output(v)`` after ``add_output(v, input)`` makes the hidden output visible, last."""
    stat, batch = torch.randn(8, device=device), torch.randn(8, device=device)
    fd = module.FusionDefinition()
    with fd:
        s, b = _input(module, fd, stat), _input(module, fd, batch)
        new = _ema(module, fd, s, b)
        fd.add_output(new, s)
        fd.add_output(fd.ops.neg(b))
        fd.add_output(new)
    expected = stat * 0.9 + batch * 0.1
    outs = fd.execute([stat, batch])
    assert len(outs) == 2
    torch.testing.assert_close(outs[0], -batch)
    assert outs[1].data_ptr() == stat.data_ptr()
    assert torch.equal(stat, expected)


def test_the_stand_in_writes_an_aliased_output_into_its_input():
    _hidden_and_visible(fake, "cpu")
    _made_visible_later(fake, "cpu")


def test_the_real_bindings_write_an_aliased_output_into_its_input(real_nvfuser):
    _hidden_and_visible(real_nvfuser, "cuda")
    _made_visible_later(real_nvfuser, "cuda")


def _not_an_input(module, fd, s, b):
    fd.add_output(fd.ops.neg(b), fd.ops.exp(s))


def _a_scalar(module, fd, s, b):
    x = fd.define_scalar(dtype=module.DataType.Double)
    fd.add_output(fd.ops.neg(b), x)


def _other_rank(module, fd, s, b):
    fd.add_output(fd.ops.broadcast_in_dim(b, [2, 8], [1]), s)


REFUSED = [
    ("an intermediate value as the source", _not_an_input, "alias source can only be a fusion input"),
    ("a scalar input as the source", _a_scalar, "only supported for TensorView"),
    ("an output of another rank", _other_rank, None),
]


def _refused(module, define, match):
    fd = module.FusionDefinition()
    with pytest.raises(RuntimeError, match=match):
        with fd:
            s, b = (_input(module, fd, torch.zeros(8)) for _ in range(2))
            define(module, fd, s, b)


@pytest.mark.parametrize(("what", "define", "match"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_stand_in_refuses_what_the_source_refuses(what, define, match):
    _refused(fake, define, match)


@pytest.mark.parametrize(("what", "define", "match"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_real_bindings_refuse_it(what, define, match, real_nvfuser):
    _refused(real_nvfuser, define, match)


def test_the_stand_in_refuses_an_alias_of_another_dtype_which_nvfuser_does_not_check():
    fd = fake.FusionDefinition()
    with pytest.raises(AssertionError, match="refuses an alias of torch.float32 to an input of torch.int64"):
        with fd:
            s = fd.define_tensor([8], [True], fake.DataType.Int)
            b = _input(fake, fd, torch.zeros(8))
            fd.add_output(fd.ops.neg(b), s)


def test_an_input_aliased_to_itself_is_copied_first():
    """``aliasOutputToInput`` of an output that is a fusion input writes a ``set`` of it."""
    fd = fake.FusionDefinition()
    a, b = torch.randn(8), torch.randn(8)
    with fd:
        s, t = _input(fake, fd, a), _input(fake, fd, b)
        fd.add_output(t, s)
        fd.add_output(fd.ops.neg(t))
    outs = fd.execute([a, b])
    assert fd.recorded.count("set") == 1 and len(outs) == 1
    assert torch.equal(a, b)


def test_a_write_that_a_broadcast_reaches_is_a_copy_kernel_of_its_own():
    """``SegmentInplaceUpdate``: an aliased output computed from a broadcast is written by a copy
    kernel of its own; a running statistic's update (the batch mean of a reduction) is not."""
    for through_broadcast in (False, True):
        fd = fake.FusionDefinition()
        with fd:
            s, x = _input(fake, fd, torch.zeros(8)), _input(fake, fd, torch.zeros(2, 8))
            mean = fd.ops.sum(x, [0])
            if through_broadcast:
                mean = fd.ops.sum(fd.ops.sub(x, fd.ops.broadcast_in_dim(mean, [2, 8], [1])), [0])
            centred = fd.ops.sub(x, fd.ops.broadcast_in_dim(mean, [2, 8], [1]))
            fd.add_output(centred)
            fd.add_output(_ema(fake, fd, s, mean), s)
        assert aliases.split_writes(fd) == through_broadcast
