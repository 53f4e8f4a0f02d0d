"""Data-parallel training through torch's own engines: DDP around a jitted module, and FSDP2
(``fully_shard`` on the model, or on each layer and the model) before ``thunder_rs.jit``. Two
processes on CPU with gloo; the parameters after three Adam steps on different rows per rank
equal a single-process eager run on the whole batches (so gradients were averaged across ranks)."""

import os
import sys

import distributed_programs as programs
import pytest
import thunder_rs
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
WORLD = 2


@pytest.mark.slow  # about 30 s on a 2-core machine: starting the processes
def test_ddp_and_fsdp2_train_as_eager(tmp_path):
    init_file, out_file = str(tmp_path / "init"), str(tmp_path / "out.pt")
    sys.path.insert(0, os.path.dirname(__file__))  # the children import distributed_programs
    names = list(programs.RUNS)
    mp.spawn(programs.worker, args=(WORLD, init_file, out_file, names), nprocs=WORLD, join=True)
    results = torch.load(out_file)
    expected = programs.eager_reference(WORLD)
    for name in names:
        result = results[name]
        assert result["params"].keys() == expected.keys(), name
        for param, value in expected.items():
            torch.testing.assert_close(result["params"][param], value, msg=f"{name}: {param}")
        # One compilation, then the compiled program ran for the other steps.
        assert (result["misses"], result["hits"]) == (1, programs.STEPS - 1), name


@pytest.fixture
def one_process(tmp_path):
    """A one-process gloo group in this process: FSDP's hooks, collectives and state machine run
    for real, fast enough for the default suite."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("nested", [False, True], ids=["root", "per_layer"])
def test_fsdp2_in_one_process_trains_as_eager(one_process, nested):
    result = programs.run_fsdp(0, 1, nested)
    for param, value in programs.eager_reference(1).items():
        torch.testing.assert_close(result["params"][param], value, msg=param)
    assert (result["misses"], result["hits"]) == (1, programs.STEPS - 1)


def test_fsdp2_forward_hooks_of_the_user_still_trace(one_process):
    from torch.distributed.fsdp import fully_shard

    model = programs.make_model()
    eager = programs.make_model()
    for m in (model, eager):
        m[2].register_forward_hook(lambda mod, args, out: out * 2)
    fully_shard(model[0])
    fully_shard(model)
    x = torch.randn(3, programs.WIDTH)
    out = thunder_rs.jit(model)(x)
    torch.testing.assert_close(out, eager(x))
    out.sum().backward()
    eager(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, msg=name)


def test_fsdp2_on_a_submodule_only_is_refused(one_process):
    from torch.distributed.fsdp import fully_shard

    model = programs.make_model()
    fully_shard(model[0])
    with pytest.raises(NotImplementedError, match="Sequential has fully_shard.*not sharded itself"):
        thunder_rs.jit(model)


def test_fsdp2_groups_and_inner_mixed_precision_are_refused(one_process):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = programs.make_model()
    fully_shard([model[0], model[2]])
    fully_shard(model)
    with pytest.raises(NotImplementedError, match="group of modules"):
        thunder_rs.jit(model)
    model = programs.make_model()
    fully_shard(model[0], mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    fully_shard(model)
    with pytest.raises(NotImplementedError, match="MixedPrecisionPolicy"):
        thunder_rs.jit(model)


def test_fully_shard_after_jit_is_refused_naming_the_parameter(one_process):
    from torch.distributed.fsdp import fully_shard

    model = programs.make_model()
    jm = thunder_rs.jit(model)
    fully_shard(model)
    with pytest.raises(NotImplementedError, match=r"parameter or buffer 0.weight is a DTensor.*fully_shard before"):
        jm(torch.randn(2, programs.WIDTH))


def test_fsdp2_eval_under_no_grad_after_training(one_process):
    from torch.distributed.fsdp import fully_shard

    model, eager = programs.make_model(), programs.make_model()
    fully_shard(model[0])
    fully_shard(model)
    jm = thunder_rs.jit(model)
    steps = programs.batches(1)
    programs.train(jm, model.parameters(), steps)
    programs.train(eager, eager.parameters(), steps)
    x = torch.randn(5, programs.WIDTH)
    with torch.no_grad():
        out = jm(x)
        torch.testing.assert_close(out, eager(x))
    assert not out.requires_grad
    from torch.distributed.tensor import DTensor

    # The inner layer is resharded after the forward (the root, by FSDP's default, is not).
    assert all(isinstance(p, DTensor) for p in model[0].parameters())
