"""Outputs aliased to inputs (``fd.add_output(output, alias_input)``): the stand-in
(``fake_nvfuser_aliases``) takes and refuses what nvFuser's source does (NVIDIA/Fuser 81c4b22:
python_direct/runtime.cpp:148-169, csrc/fusion.cpp:387-402 and 929-976,
runtime/fusion_executor_cache.cpp:86-97, runtime/allocations.cpp:335-340). Each check runs on the
stand-in on the CPU and on the real bindings on a GPU (``real_nvfuser``: skipped without them)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


def _bn_net():
    """Two BatchNorms, each in a region (a BatchNorm alone runs as torch's kernel)."""
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.BatchNorm2d(4), nn.ReLU()
    ).train()


def _steps(model, jit_of):
    """Three training-mode calls (with grad, without, with) of ``jit_of(model)``: outputs, grads,
    buffers, their versions and memory."""
    jmodel = jit_of(model)
    memory = [b.data_ptr() for b in model.buffers()]
    seen = []
    for i in range(3):
        torch.manual_seed(i)
        x = torch.randn(2, 3, 10, 10, requires_grad=i != 1)
        out = jmodel(x)
        if i != 1:
            out.square().sum().backward()
        seen.append((out.detach(), x.grad, [b.clone() for b in model.buffers()], [b._version for b in model.buffers()]))
    return seen, [b.data_ptr() for b in model.buffers()] == memory


def test_a_batchnorm_region_writes_the_running_statistics_itself_as_the_copies_did(fake_ex):
    """The nvFuser region writes BatchNorm's running statistics and count (an output aliased to
    the buffer): values bit-equal to the copies' path (the same definitions without the aliases),
    versions eager's (statistics unbumped, counts +1), the buffers' memory kept."""
    import thunder_rs  # noqa: PLC0415

    fake.definitions.clear()
    written, kept = _steps(_bn_net(), lambda m: thunder_rs.jit(m, executors=[fake_ex, "torch"]))
    assert kept and any(d.aliases for d in fake.definitions) and fake_ex.stats["failures"] == 0
    fake_ex.writes_inputs = False  # (the instance's: the copies' path)
    copied, _ = _steps(_bn_net(), lambda m: thunder_rs.jit(m, executors=[fake_ex, "torch"]))
    eager, _ = _steps(_bn_net(), lambda m: m)
    for (o, g, bufs, vers), (o2, g2, bufs2, vers2), (_, _, _, eager_vers) in zip(written, copied, eager):
        assert torch.equal(o, o2) and (g is None) == (g2 is None) and (g is None or torch.equal(g, g2))
        assert all(torch.equal(a, b) for a, b in zip(bufs, bufs2))
        assert vers == vers2 == eager_vers


def test_inference_tensor_buffers_are_copied_not_written_by_the_region(fake_ex):
    """Buffers made under ``inference_mode`` and trained under it (no version counters): the region
    writes none of them, the copies do, with the values of the copies' path."""
    import thunder_rs  # noqa: PLC0415

    results = []
    for writes in (True, False):
        fake_ex.writes_inputs = writes
        fake.definitions.clear()
        with torch.inference_mode():
            model = _bn_net()
            jmodel = thunder_rs.jit(model, executors=[fake_ex, "torch"])
            out = jmodel(torch.ones(2, 3, 10, 10))
        assert not any(d.aliases for d in fake.definitions)
        results.append((out, [b.clone() for b in model.buffers()]))
    (out, bufs), (out2, bufs2) = results
    assert torch.equal(out, out2) and all(torch.equal(a, b) for a, b in zip(bufs, bufs2))


class _Reads(torch.nn.Module):
    """A BatchNorm whose running mean the program also reads: before the write or after it."""

    def __init__(self, after: bool):
        super().__init__()
        self.conv, self.bn, self.after = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), after

    def forward(self, x):
        old = self.bn.running_mean * 1
        y = self.bn(self.conv(x))
        read = self.bn.running_mean * 2 if self.after else old
        return y + read.view(1, -1, 1, 1)


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_a_buffer_the_program_also_reads_before_the_write_is_copied(fake_ex, after):
    """The running mean's old value read by another op too is not written by the region (a segment
    of it could read the buffer after the write); its new value read after is (the region reads the
    value it computed): values as the copies' path and as eager's reads see them (allclose: the
    stand-in's Welford is not eager's CPU kernel)."""
    import thunder_rs  # noqa: PLC0415

    results = []
    for writes in (True, False):
        fake_ex.writes_inputs = writes
        fake.definitions.clear()
        torch.manual_seed(0)
        model = _Reads(after)
        out = thunder_rs.jit(model, executors=[fake_ex, "torch"])(torch.ones(2, 3, 6, 6) * torch.arange(6.0))
        written = {s.slot for d in fake.definitions for _, s, _ in d.aliases}
        results.append((out, model.bn.running_mean.clone(), len(written)))
    torch.manual_seed(0)
    model = _Reads(after)
    expected = model(torch.ones(2, 3, 6, 6) * torch.arange(6.0))
    (out, mean, aliased), (out2, mean2, none) = results
    assert torch.equal(out, out2) and torch.equal(mean, mean2)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(mean, model.bn.running_mean)
    assert (aliased, none) == (3 if after else 2, 0)  # (before: the running variance and the count)


class _Copies(TorchDispatchMode):
    """The copies dispatched under it, but the stand-in's (``fusing``: its evaluation with torch;
    its definitions' on meta tensors)."""

    fusing = 0

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        copy = func.overloadpacket.__name__ in ("copy_", "_foreach_copy_", "clone")
        if copy and not _Copies.fusing:
            first = args[0][0] if isinstance(args[0], (list, tuple)) and args[0] else args[0]
            self.copies += not getattr(first, "is_meta", False)  # (the stand-in defines on meta)
        return func(*args, **(kwargs or {}))


def _fusing(execute):
    def counted(self, *args, **kwargs):
        _Copies.fusing += 1
        try:
            return execute(self, *args, **kwargs)
        finally:
            _Copies.fusing -= 1

    return counted


def _regions_write(executor, device: str):
    """BatchNorm's running statistics and counts written by the regions themselves (no copy after
    the call), versions eager's, the buffers' memory kept; values as eager's within float32's
    tolerance (nvFuser's reductions, and the stand-in's, are not eager's kernels)."""
    import thunder_rs  # noqa: PLC0415

    with torch.device(device):
        model, twin = _bn_net(), _bn_net()
    jmodel = thunder_rs.jit(twin, executors=[executor, "torch"])
    memory = [b.data_ptr() for b in twin.buffers()]
    for i in range(3):
        x = torch.randn(2, 3, 10, 10, device=device, requires_grad=i != 1)
        expected = model(x)
        copies = _Copies()
        with copies:
            out = jmodel(x)
        if i:  # (the first call compiles)
            assert copies.copies == 0, (i, copies.copies)
        torch.testing.assert_close(out, expected)
        for a, b in zip(model.buffers(), twin.buffers()):
            torch.testing.assert_close(b, a)
            assert b._version == a._version
    assert [b.data_ptr() for b in twin.buffers()] == memory
    assert executor.stats["failures"] == executor.stats["unwritten"] == 0, executor.fallbacks


def test_batchnorm_regions_write_the_running_statistics_with_no_copy(fake_ex, monkeypatch):
    monkeypatch.setattr(fake.FusionDefinition, "execute", _fusing(fake.FusionDefinition.execute))
    _regions_write(fake_ex, "cpu")


@pytest.mark.gpu
def test_on_cuda_nvfusers_batchnorm_regions_write_the_running_statistics(real_nvfuser):
    """``_regions_write`` on a GPU with the real ``nvfuser_direct``."""
    from thunder_rs.executors.nvfuser_ex import NvFuserExecutor  # noqa: PLC0415

    _regions_write(NvFuserExecutor("nvfuser_real_writes", module=real_nvfuser), "cuda")


def _resnet_steps(executor):
    """Two training steps of torchvision's ResNet-18 jitted with ``executor``: outputs, buffers,
    their versions, gradients."""
    import thunder_rs  # noqa: PLC0415

    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10).train()
    jmodel = model if executor is None else thunder_rs.jit(model, executors=[executor, "torch"])
    seen = []
    for i in range(2):
        torch.manual_seed(i)
        out = jmodel(torch.randn(2, 3, 32, 32))
        out.sum().backward()
        buffers = list(model.buffers())
        grads = [p.grad.clone() for p in model.parameters()]
        seen.append((out.detach(), [b.clone() for b in buffers], [b._version for b in buffers], grads))
    return seen


@pytest.mark.slow
def test_torchvision_resnet18_regions_write_all_running_statistics_as_the_copies_did(fake_ex, one_thread):
    """All 20 BatchNorms of a ResNet-18 write their statistics and counts in their regions (60
    aliased outputs): outputs, buffers and gradients bit-equal to the copies' path, versions eager's."""
    fake.definitions.clear()
    written = _resnet_steps(fake_ex)
    assert sum(len(d.aliases) for d in fake.definitions) == 60
    fake_ex.writes_inputs = False
    copied, eager = _resnet_steps(fake_ex), _resnet_steps(None)
    for (o, bufs, vers, grads), (o2, bufs2, vers2, grads2), (_, _, eager_vers, _) in zip(written, copied, eager):
        assert torch.equal(o, o2) and all(torch.equal(a, b) for a, b in zip(bufs, bufs2))
        assert all(torch.equal(a, b) for a, b in zip(grads, grads2))
        assert vers == vers2 == eager_vers


class _WithArgument(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)

    def forward(self, x, extra):
        return torch.relu(self.bn(self.conv(x))) + extra.view(1, -1, 1, 1)


def test_a_written_buffer_passed_as_an_argument_too_is_refused_before_the_region_writes_it(fake_ex):
    """An argument sharing a written buffer's memory is refused (as before: the trace took them as
    separate tensors), now before the call, so that the region has not written the buffer."""
    import thunder_rs  # noqa: PLC0415
    from thunder_rs.errors import ThunderNotImplementedError  # noqa: PLC0415

    torch.manual_seed(0)
    model = _WithArgument().train()
    jmodel = thunder_rs.jit(model, executors=[fake_ex, "torch"])
    x = torch.randn(2, 3, 6, 6)
    jmodel(x, torch.zeros(8))
    assert any(d.aliases for d in fake.definitions)
    before = [(b.clone(), b._version) for b in model.buffers()]
    with pytest.raises(ThunderNotImplementedError, match="shares its memory"):
        jmodel(x, model.bn.running_mean)
    assert all(torch.equal(b, a) and b._version == v for b, (a, v) in zip(model.buffers(), before))


def test_a_region_that_falls_back_leaves_the_statistics_to_the_copies(fake_ex, monkeypatch):
    """A region nvFuser cannot compile runs its eager calls: their values are copied into the
    buffers as before (versions eager's), with the values of the copies' path."""
    import thunder_rs  # noqa: PLC0415

    def refused(self, *args, **kwargs):
        raise RuntimeError("refused for the test")

    monkeypatch.setattr(fake.FusionDefinition, "execute", refused)
    seen = []
    for writes in (True, False):
        fake_ex.writes_inputs = writes
        with pytest.warns(UserWarning, match="runs eagerly"):
            seen.append(_steps(_bn_net(), lambda m: thunder_rs.jit(m, executors=[fake_ex, "torch"]))[0])
    eager, _ = _steps(_bn_net(), lambda m: m)
    for (o, g, bufs, vers), (o2, g2, bufs2, vers2), (_, _, _, eager_vers) in zip(*seen, eager):
        assert torch.equal(o, o2) and all(torch.equal(a, b) for a, b in zip(bufs, bufs2))
        assert vers == vers2 == eager_vers
