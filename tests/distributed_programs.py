"""Programs the distributed tests run in each of their processes (imported by the spawned
children, so they live at module level)."""

import thunder_rs
import torch
import torch.distributed as dist

STEPS, BATCH, WIDTH = 3, 4, 8


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 16), torch.nn.GELU(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)
    )


def batches(world: int):
    """Each step's inputs and targets for every rank: rank r trains on rows r*BATCH:(r+1)*BATCH."""
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(world * BATCH, WIDTH, generator=g), torch.randn(world * BATCH, 4, generator=g))
        for _ in range(STEPS)
    ]


def train(model, params, steps, rows=slice(None)):
    """Three Adam steps on the mean squared error of ``rows`` of each batch; returns the losses."""
    opt = torch.optim.Adam(params, lr=0.05)
    losses = []
    for x, y in steps:
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def eager_reference(world: int) -> dict:
    """Single process, whole batches: what the data-parallel runs must reproduce."""
    model = make_model()
    train(model, model.parameters(), batches(world))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _result(jm, params) -> dict:
    return {"params": params, "misses": thunder_rs.cache_misses(jm), "hits": thunder_rs.cache_hits(jm)}


def run_ddp(rank: int, world: int) -> dict:
    jm = thunder_rs.jit(make_model())
    ddp = torch.nn.parallel.DistributedDataParallel(jm)
    train(ddp, ddp.parameters(), batches(world), slice(rank * BATCH, (rank + 1) * BATCH))
    return _result(jm, {n: p.detach().clone() for n, p in jm._model.named_parameters()})


def run_fsdp(rank: int, world: int, nested: bool) -> dict:
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    if nested:
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
    fully_shard(model)
    jm = thunder_rs.jit(model)
    train(jm, model.parameters(), batches(world), slice(rank * BATCH, (rank + 1) * BATCH))
    return _result(jm, {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()})


#: The configurations a worker runs, by name, in one process group (starting processes is the
#: slow part).
RUNS = {
    "ddp": run_ddp,
    "fsdp2_root": lambda rank, world: run_fsdp(rank, world, nested=False),
    "fsdp2_per_layer": lambda rank, world: run_fsdp(rank, world, nested=True),
}


def worker(rank: int, world: int, init_file: str, out_file: str, names: list) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        results = {name: RUNS[name](rank, world) for name in names}
        if rank == 0:
            torch.save(results, out_file)
    finally:
        dist.destroy_process_group()
