"""Kernel launches and copy traffic of the CUDA default path, counted on the CPU: the aten ops eager
dispatches against the ops thunder_rs's executed traces dispatch outside nvFuser regions, plus the
nvFuser fusions they execute, for one training step (forward, backward, AdamW step) and one
inference forward, on fake CUDA tensors (``FakeTensorMode``) through the CUDA default executors (the
stand-in ``nvfuser_direct`` of ``tests/``, claiming CUDA tensors only, then torch).

    python benchmarks/cuda_launches.py [--models gpt,gpt2,llama,resnet18] [--modes float32,bf16_autocast]
        [--ops] [--out benchmarks/results/cuda_launches_stop63.md]

On a GPU each aten op that is not a view or an allocation is a kernel launch (5-10 µs of host
time on an H100) and each fusion is one or a few kernels; the CPU cannot time them, but it can count
them. ``copies`` are the copy, ``_to_copy``, ``clone``, ``contiguous`` and ``_foreach_copy_`` ops
(casts included) and ``MB`` the bytes they write (from the fake tensors' sizes; a foreach copy's:
its targets'). Ops whose results are all empty launch nothing and are not counted. Each count is
of the second call (the first compiles and makes the optimizer's state). The backward runs node by
node as the autograd engine runs it (``run_backward``: the engine itself wants a CUDA context), with the engine's
accumulation of gradients (an ``add`` where two flow into one input); the optimizer step is eager
in both columns (``torch.optim.AdamW(foreach=True)``, its default on CUDA), so it differs only
through the gradients each side hands it. Eager's attention runs the fused kernel torch chooses on
an H100 (``FusedAttention``; on fake tensors torch's choice is the math path), grouped keys and
values repeated to the query's heads (as thunder_rs's recorded kernels take them).
"""

import argparse
import collections
import contextlib
import dataclasses
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples")]

import pytest  # noqa: E402 (the test helpers' MonkeyPatch)
import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

#: Ops that launch no kernel: allocations and metadata (views are told by ``OpOverload.is_view``).
NO_KERNEL = {
    "empty",
    "empty_strided",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "detach",
    "alias",
    "lift_fresh",
    "_unsafe_view",
    "set_",
    "resize_",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "is_same_size",
    "_record_function_enter_new",
    "_record_function_exit",
}
#: Ops that copy or cast a tensor: each writes its result's bytes.
COPIES = {"copy_", "_to_copy", "clone", "contiguous", "_copy_from", "_copy_from_and_resize", "copy", "_foreach_copy_"}
PHASES = ("forward", "backward", "optimizer", "inference")


@dataclasses.dataclass
class Counts:
    """What one phase dispatched: launching ops by name, copies and their bytes, fusions run."""

    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    copies: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    copy_bytes: int = 0
    fusions: int = 0

    @property
    def launches(self) -> int:
        return sum(self.ops.values())


def _bytes(out) -> int:
    tensors = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _empty(out) -> bool:
    """Whether every tensor ``out`` has is empty: CUDA launches no kernel for those (TensorIterator
    and the BLAS wrappers return early), as for the autocast cache's lookups by empty partners
    (``torch_casts``)."""
    tensors = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.numel() == 0 for t in tensors)


class Counter(TorchDispatchMode):
    """Counts the aten ops dispatched outside fusions (``fusing``: inside a stand-in
    ``FusionDefinition.execute``, whose evaluation with torch is no launch of the real nvFuser)."""

    def __init__(self):
        super().__init__()
        self.counts, self.fusing = Counts(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if self.fusing or func.is_view or name in NO_KERNEL or func.namespace == "prim" or _empty(out):
            return out
        self.counts.ops[name] += 1
        if name in COPIES:
            self.counts.copies[name] += 1
            self.counts.copy_bytes += _bytes(args[0] if name == "_foreach_copy_" else out)  # (that one returns None)
        return out


#: The counters counting now (``counting``), innermost last: the stand-in's executions count to it.
ACTIVE: list = []


@contextlib.contextmanager
def counting(counter: Counter):
    """The dispatches under it counted, the stand-in's executions counted as fusions."""
    ACTIVE.append(counter)
    try:
        with FusedAttention(), counter:
            yield
    finally:
        ACTIVE.remove(counter)


def _counted(execute):
    """``FusionDefinition.execute`` counting each execution as a fusion of the active counter, its
    evaluation with torch no launch (the executor binds ``fd.execute`` once, at its first call)."""

    def counted(self, *args, **kwargs):
        if not ACTIVE:
            return execute(self, *args, **kwargs)
        counter = ACTIVE[-1]
        # (and a copy kernel per write of an aliased output nvFuser's SegmentInplaceUpdate splits off)
        if getattr(self, "split_writes", None) is None:
            import fake_nvfuser_aliases  # noqa: PLC0415 (tests/: a stand-in, imported where used)

            self.split_writes = fake_nvfuser_aliases.split_writes(self)
        counter.counts.fusions += 1 + self.split_writes
        counter.fusing += 1
        try:
            return execute(self, *args, **kwargs)
        finally:
            counter.fusing -= 1

    return counted


def run_backward(loss: torch.Tensor) -> None:
    """``loss.backward()`` node by node, as the engine runs it on one device: each node once all
    the gradients flowing into it are summed (an ``add`` per extra one, the engine's InputBuffer),
    each checked as the engine's ``validate_outputs`` does (``_validated``),
    under no_grad; a custom Function's node gets zeros for the gradients it was given none of
    (``materialize_grads``); AccumulateGrad nodes set ``.grad``."""
    root = loss.grad_fn
    pending, seen = collections.Counter(), {root}
    stack = [root]
    while stack:
        node = stack.pop()
        for nxt, _ in node.next_functions:
            if nxt is not None:
                pending[nxt] += 1
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
    buffers: dict = {root: [None] * len(root._input_metadata)}
    buffers[root][loss.output_nr] = torch.ones_like(loss)
    ready = [root]
    with torch.no_grad():
        while ready:
            node = ready.pop()
            grads = buffers.pop(node)
            if hasattr(node, "_forward_cls") and getattr(node, "materialized", True):
                grads = [
                    torch.zeros(m.shape, dtype=m.dtype, device=m.device) if g is None and _materializes(node, m) else g
                    for g, m in zip(grads, node._input_metadata)
                ]
            if hasattr(node, "_forward_cls"):
                outs = node.apply(*grads)
                outs = outs if isinstance(outs, tuple) else (outs,)
                # one per forward argument; an edge per argument requiring grad (test_cuda_training)
                outs = [g for g, needed in zip(outs, node.needs_input_grad, strict=True) if needed]
                edges = [e for e in node.next_functions if e[0] is not None]
            else:
                outs = node(*grads)
                outs = outs if isinstance(outs, tuple) else (outs,)
                edges = list(node.next_functions)
            for (nxt, nr), g in zip(edges, outs, strict=True):
                if nxt is None:
                    continue
                if g is not None:
                    g = _validated(g, nxt._input_metadata[nr])
                    slots = buffers.setdefault(nxt, [None] * len(nxt._input_metadata))
                    slots[nr] = g if slots[nr] is None else slots[nr] + g
                pending[nxt] -= 1
                if pending[nxt] == 0:
                    if nxt in buffers:
                        ready.append(nxt)
                    else:
                        _skip(nxt, pending, buffers, ready)


def _materializes(node, meta) -> bool:
    """Whether the engine hands a custom Function's node zeros for an output given no gradient: not
    for a non-differentiable one (whose metadata is default-constructed: a float32 scalar on the
    CPU) where ``ctx._materialize_non_diff_grads`` is False."""
    default = tuple(meta.shape) == () and meta.dtype == torch.float32 and meta.device.type == "cpu"
    return not (default and not node._materialize_non_diff_grads)


def _validated(grad: torch.Tensor, meta) -> torch.Tensor:
    """The engine's ``validate_outputs``: a gradient summed to its input's shape where it was
    broadcast, cast to its input's dtype where it differs."""
    if tuple(grad.shape) != tuple(meta.shape):
        grad = grad.sum_to_size(meta.shape)
    return grad if grad.dtype == meta.dtype else grad.to(meta.dtype)


def _skip(node, pending, buffers, ready) -> None:
    """A node no gradient reached: the engine does not run it; its successors wait one less."""
    for nxt, _ in node.next_functions:
        if nxt is not None:
            pending[nxt] -= 1
            if pending[nxt] == 0:
                (ready.append(nxt) if nxt in buffers else _skip(nxt, pending, buffers, ready))


# -- the CUDA default path on the stand-in ------------------------------------------------------------


@contextlib.contextmanager
def cuda_default_path():
    """The stand-in ``nvfuser_direct`` (as ``test_cuda_training``'s ``cuda_ex``): yields the nvFuser
    executor claiming CUDA tensors only, the stand-in module, and the MonkeyPatch (for autocast)."""
    import fake_nvfuser_direct as fake  # noqa: PLC0415 (tests/: a stand-in, imported where used)
    import gpt  # noqa: PLC0415

    from thunder_rs.torch import fused_attention as fa  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
        from thunder_rs.executors.nvfuser_ex import NvFuserExecutor  # noqa: PLC0415

    with pytest.MonkeyPatch.context() as m:
        m.setitem(sys.modules, "nvfuser_direct", fake)
        fake.definitions.clear()
        m.setattr(fake.FusionDefinition, "execute", _counted(fake.FusionDefinition.execute))
        # cuDNN's attention for halves, the memory-efficient kernel for float32 (the H100's choices)
        m.setattr(fa, "fused_sdp_choice", lambda q, *args: fa.CUDNN if q.element_size() == 2 else fa.EFFICIENT)
        m.setattr(gpt, "init_weights", lambda model, seed: None)
        m.setattr(torch.autograd.function.FunctionCtx, "set_materialize_grads", _noted_materialize)
        yield NvFuserExecutor("nvfuser_stand_in_cuda", module=fake), fake, m


_set_materialize_grads = torch.autograd.function.FunctionCtx.set_materialize_grads


def _noted_materialize(ctx, value: bool) -> None:
    """``ctx.set_materialize_grads``, noted where ``run_backward`` reads it (torch's is unreadable)."""
    ctx.materialized = value
    _set_materialize_grads(ctx, value)


_sdpa = torch.nn.functional.scaled_dot_product_attention


def _fused_eager_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Eager's attention as on the H100: the kernel torch chooses there (cuDNN's for halves, the
    memory-efficient one for float32: ``cuda_default_path``'s choice); on fake tensors torch's
    choice falls back to the math path (a dozen ops where the GPU launches one kernel)."""
    if torch.is_autocast_enabled("cuda"):  # (autocast casts at the composite's dispatch, which this replaces)
        low = torch.get_autocast_dtype("cuda")
        q, k, v = (t.to(low) if t.is_floating_point() else t for t in (q, k, v))
        attn_mask = attn_mask.to(low) if attn_mask is not None and attn_mask.is_floating_point() else attn_mask
    if q.device.type != "cuda" or q.dtype not in (torch.float32, torch.bfloat16):
        return _sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if enable_gqa:  # (the fused kernels take as many key/value heads as query heads, as thunder_rs's)
        k, v = (t.repeat_interleave(q.shape[-3] // t.shape[-3], -3) for t in (k, v))
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    aten = torch.ops.aten
    if q.element_size() == 2:
        kernel = aten._scaled_dot_product_cudnn_attention
        return kernel(q, k, v, attn_mask, grad, dropout_p, is_causal, False, scale=scale)[0]
    kernel = aten._scaled_dot_product_efficient_attention
    return kernel(q, k, v, attn_mask, grad, dropout_p, is_causal, scale=scale)[0]


class FusedAttention(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` called at run time (eager's, and thunder_rs's torch
    executor's where it runs torch's composite) runs the fused kernel a GPU runs
    (``_fused_eager_sdpa``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is _sdpa:
            return _fused_eager_sdpa(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def _autocast(m, on: bool):
    if not on:
        return contextlib.nullcontext()
    from test_cuda_training import _cuda_autocast  # noqa: PLC0415 (tests/)

    return _cuda_autocast(m, torch.bfloat16)


def _phases(fn, inputs, loss_of, optimizer, autocast) -> dict[str, Counts]:
    """The counts of the second training step and the second inference forward of ``fn``."""
    for _ in range(2):
        counters = {phase: Counter() for phase in PHASES}
        with counting(counters["forward"]), autocast():
            loss = loss_of(fn(**inputs))
        with counting(counters["backward"]):
            run_backward(loss)
        with counting(counters["optimizer"]):
            optimizer.step()
            optimizer.zero_grad()
        del loss
    for _ in range(2):
        counters["inference"] = Counter()
        with counting(counters["inference"]), autocast(), torch.no_grad():
            fn(**inputs)
    return {phase: c.counts for phase, c in counters.items()}


def measure(name: str, bf16: bool) -> dict[str, dict[str, Counts]]:
    """Eager's and thunder_rs's counts for model ``name`` (``test_cuda_training.MODELS``)."""
    import thunder_rs  # noqa: PLC0415
    from test_cuda_training import MODELS  # noqa: PLC0415 (tests/: the models users train)

    with cuda_default_path() as (cuda_ex, fake, m), FakeTensorMode():
        with torch.device("cuda"):
            model, inputs, loss_of = MODELS[name]()
        autocast = lambda: _autocast(m, bf16)  # noqa: E731
        jmodel = thunder_rs.jit(model, executors=[cuda_ex, "torch"])
        result = {}
        for side, fn in (("eager", model), ("thunder_rs", jmodel)):
            optimizer = torch.optim.AdamW(model.parameters(), foreach=True)  # (CUDA's default; fake tensors' is not)
            result[side] = _phases(fn, inputs, loss_of, optimizer, autocast)
        assert cuda_ex.stats["failures"] == 0, cuda_ex.fallbacks
    return result


# -- the table ----------------------------------------------------------------------------------------


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f}"


def rows(name: str, mode: str, result) -> list[str]:
    eager, ours = result["eager"], result["thunder_rs"]
    out = []
    for phase in PHASES:
        e, t = eager[phase], ours[phase]
        out.append(
            f"| {name} | {mode} | {phase} | {e.launches} | {t.launches} | {t.fusions} | {t.launches + t.fusions} | "
            f"{sum(e.copies.values())} | {sum(t.copies.values())} | {_mb(e.copy_bytes)} | {_mb(t.copy_bytes)} |"
        )
    return out


HEADER = [
    "| model | mode | phase | eager ops | thunder_rs ops outside fusions | fusions | thunder_rs launches "
    "| eager copies | thunder_rs copies | eager copy MB | thunder_rs copy MB |",
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
]


def differences(result) -> list[str]:
    """Per phase, the ops thunder_rs dispatches more or fewer of than eager (outside fusions)."""
    lines = []
    for phase in PHASES:
        e, t = result["eager"][phase].ops, result["thunder_rs"][phase].ops
        diff = {k: t[k] - e[k] for k in set(e) | set(t) if t[k] != e[k]}
        lines.append(f"  {phase}: " + ", ".join(f"{k} {v:+d}" for k, v in sorted(diff.items())))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt,gpt2,llama,resnet18")
    parser.add_argument("--modes", default="float32,bf16_autocast")
    parser.add_argument("--ops", action="store_true", help="per phase, the ops thunder_rs runs more or fewer of")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) there")
    args = parser.parse_args(argv)
    table = list(HEADER)
    notes = []
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            result = measure(name, mode == "bf16_autocast")
            table += rows(name, mode, result)
            if args.ops:
                notes += [f"{name} {mode}:", *differences(result)]
    text = "\n".join(table + ([""] + notes if notes else []))
    print(text)
    if args.out:
        command = "python benchmarks/cuda_launches.py " + " ".join(argv if argv is not None else sys.argv[1:])
        args.out.write_text(f"`{command.strip()}`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
