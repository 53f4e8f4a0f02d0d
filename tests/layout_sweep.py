"""A sweep of output strides against eager: every OpInfo sample with its tensors laid out as
channels_last (4-D) or permuted-dense (2-D and 3-D), in-place methods on intermediates and on
inputs, and the common CNN module ops forward and backward. Only outputs eager returns
non-overlapping and dense are compared. Not a test (it takes minutes): run it as a script,
``PYTHONPATH=python python tests/layout_sweep.py [--grad] [--told] [--ops NAME,...]``; it prints each
difference as ``op | input layout | eager strides | ours``. ``--told`` compares the strides the
trace tells the program (``y.stride()`` read while traced), from which it decides views and copies.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_leaves
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import thunder_rs  # noqa: E402
from opinfos import OPINFOS  # noqa: E402
from opinfos.sampling import kinds_of_samples, representative, sample_of  # noqa: E402


def dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: the elements fill a span of memory exactly, in some order."""
    if t.numel() <= 1:
        return False  # any strides are equally right
    dims = sorted((s, n) for n, s in zip(t.shape, t.stride()) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def relaid(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a non-contiguous dense layout: channels_last for 4-D, the dims' memory
    order reversed for 2-D and 3-D; other tensors as they are."""
    if sum(n > 1 for n in t.shape) < 2:
        return t
    if t.ndim == 4:
        return t.contiguous(memory_format=torch.channels_last)
    if t.ndim in (2, 3):
        order = tuple(reversed(range(t.ndim)))
        return t.permute(order).contiguous().permute(order)
    return t


def relay(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return relaid(value)
    if isinstance(value, (list, tuple)):
        return type(value)(relay(v) for v in value)
    return value


def tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def layout_name(args: Any) -> str:
    shapes = [f"{list(t.shape)}:{t.stride()}" for t in tensors(args) if t.ndim >= 2]
    return " ".join(shapes) or "-"


def compare(name: str, layout: str, expected: Any, actual: Any) -> Iterator[str]:
    for i, (e, a) in enumerate(zip(tensors(expected), tensors(actual), strict=False)):
        if dense(e) and a.shape == e.shape and a.stride() != e.stride():
            yield f"{name}[{i}] | {layout} | eager {e.stride()} | ours {a.stride()}"


def differentiable(value: Any, leaves: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        leaf = value.detach().requires_grad_()
        leaves.append(leaf)
        return leaf
    if isinstance(value, (list, tuple)):
        return type(value)(differentiable(v, leaves) for v in value)
    return value


def grads_of(fn: Callable, args: tuple, kwargs: dict, cotangent_like: list[torch.Tensor]) -> list[torch.Tensor]:
    leaves: list[torch.Tensor] = []
    args = differentiable(args, leaves)
    kwargs = {k: differentiable(v, leaves) for k, v in kwargs.items()}
    outs = [t for t in tensors(fn(*args, **kwargs)) if t.requires_grad]
    outs = outs[: len(cotangent_like)]
    if not leaves or not outs:
        return []
    cotangents = [torch.ones_like(c) for c in cotangent_like[: len(outs)]]
    got = torch.autograd.grad(outs, leaves, cotangents, allow_unused=True, materialize_grads=True)
    return list(got)


def check_call(name: str, fn: Callable, args: tuple, kwargs: dict, grad: bool) -> Iterator[str]:
    layout = layout_name([args, list(kwargs.values())])
    try:
        expected = fn(*args, **kwargs)
    except Exception:
        return
    try:
        actual = thunder_rs.jit(fn)(*args, **kwargs)
    except Exception as e:
        yield f"{name} | {layout} | jit raised {type(e).__name__}: {str(e)[:100]}"
        return
    yield from compare(name, layout, expected, actual)
    if not grad:
        return
    try:
        outs = [t for t in tensors(expected) if t.is_floating_point()]
        expected_grads = grads_of(fn, args, kwargs, outs)
    except Exception:
        return
    try:
        actual_grads = grads_of(thunder_rs.jit(fn), args, kwargs, outs)
    except Exception as e:
        yield f"{name} grad | {layout} | jit raised {type(e).__name__}: {str(e)[:100]}"
        return
    yield from compare(f"{name} grad", layout, expected_grads, actual_grads)


def told(fn: Callable) -> Callable:
    """``fn`` returning the strides of its outputs as the program reads them (``t.stride()``):
    traced, what the trace tells (``core.lang.eager_layouts``), not what the executors made."""

    def program(*args, **kwargs):
        return [tuple(t.stride()) for t in tensors(fn(*args, **kwargs))]

    return program


def check_told(name: str, fn: Callable, args: tuple, kwargs: dict) -> Iterator[str]:
    layout = layout_name([args, list(kwargs.values())])
    try:
        outs = tensors(fn(*args, **kwargs))
        got = thunder_rs.jit(told(fn))(*args, **kwargs)
    except Exception:
        return
    for i, (e, strides) in enumerate(zip(outs, got, strict=False)):
        kept = [d for d, n in enumerate(e.shape) if n > 1]
        if dense(e) and [e.stride()[d] for d in kept] != [strides[d] for d in kept]:
            yield f"{name}[{i}] told | {layout} | eager {e.stride()} | trace {strides}"


def opinfo_calls(ops: set[str] | None, dtype: torch.dtype) -> Iterator[tuple[str, Callable, tuple, dict]]:
    """Each op's representative samples in ``dtype`` with their tensors relaid."""
    for op in OPINFOS:
        if (ops and op.id not in ops) or dtype not in op.dtypes:
            continue
        for index in representative(kinds_of_samples(op, dtype), every_kind=True):
            sample = sample_of(op, dtype, index)
            args, kwargs = relay(sample.args), {k: relay(v) for k, v in sample.kwargs.items()}
            if layout_name([args, list(kwargs.values())]) != layout_name([sample.args, list(sample.kwargs.values())]):
                yield f"{op.id}#{index}", op.op, args, kwargs


#: In-place methods and the arguments they take after the tensor written.
IN_PLACE: dict[str, Callable[[torch.Tensor], tuple]] = {
    "fill_": lambda x: (2.0,),
    "fill_ (0-dim tensor)": lambda x: (torch.tensor(3.0),),
    "zero_": lambda x: (),
    "copy_ (contiguous src)": lambda x: (torch.randn(x.shape),),
    "copy_ (broadcast src)": lambda x: (torch.randn(x.shape[-1]),),
    "add_": lambda x: (torch.randn(x.shape),),
    "add_ (scalar)": lambda x: (1.5,),
    "mul_": lambda x: (torch.randn(x.shape[-1]),),
    "masked_fill_": lambda x: (torch.randn(x.shape) > 0, 0.5),
    "index_put_": lambda x: ((torch.tensor([0, 1]),), torch.tensor(7.0)),
    "clamp_": lambda x: (-0.5, 0.5),
    "relu_": lambda x: (),
    "exp_": lambda x: (),
    "sigmoid_": lambda x: (),
    "uniform_": lambda x: (),
    "normal_": lambda x: (),
    "bernoulli_": lambda x: (0.5,),
    "lerp_": lambda x: (torch.randn(x.shape), 0.3),
    "addcmul_": lambda x: (torch.randn(x.shape), torch.randn(x.shape)),
    "setitem": lambda x: (),
}

#: What the in-place method writes into: the input itself, or intermediates made from it.
TARGETS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "input": lambda x: x,
    "clone": lambda x: x.clone(),
    "x*2": lambda x: x * 2,
    "empty_like": lambda x: torch.empty_like(x).zero_(),
    "zeros_like": torch.zeros_like,
    "ones_like": torch.ones_like,
    "exp": torch.exp,
}


def in_place_fn(method: str, target: Callable, make_args: Callable) -> Callable:
    name = method.split(" ")[0]

    def fn(x):
        t = target(x)
        if name == "setitem":
            t[0] = 5.0
            return t
        getattr(t, name)(*make_args(t))
        return t

    return fn


def in_place_calls() -> Iterator[tuple[str, Callable, tuple, dict]]:
    for shape in ((2, 3, 4, 5), (4, 5), (3, 4, 5)):
        for method, make_args in IN_PLACE.items():
            for target_name, target in TARGETS.items():
                torch.manual_seed(0)
                args = make_args(torch.empty(shape))
                fn = in_place_fn(method, target, lambda t, a=args: a)
                yield f"{target_name}.{method}", fn, (relaid(torch.randn(shape)),), {}


def module_calls() -> Iterator[tuple[str, Callable, tuple, dict]]:
    torch.manual_seed(0)
    x = relaid(torch.randn(2, 3, 8, 8))
    w = relaid(torch.randn(4, 3, 3, 3))
    bn = (torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3))
    yield "conv2d", lambda x, w: F.conv2d(x, w, padding=1), (x, w), {}
    yield "conv2d+bias", lambda x, w: F.conv2d(x, w, torch.ones(4), stride=2), (x, w), {}
    yield "batch_norm train", lambda x: F.batch_norm(x, None, None, bn[2], bn[3], training=True), (x,), {}
    yield "batch_norm eval", lambda x: F.batch_norm(x, bn[0], bn[1], bn[2], bn[3]), (x,), {}
    yield "relu", F.relu, (x,), {}
    yield "max_pool2d", lambda x: F.max_pool2d(x, 2), (x,), {}
    yield "max_pool2d 3/2/1", lambda x: F.max_pool2d(x, 3, 2, 1), (x,), {}
    yield "avg_pool2d", lambda x: F.avg_pool2d(x, 2), (x,), {}
    yield "adaptive_avg_pool2d 1", lambda x: F.adaptive_avg_pool2d(x, 1), (x,), {}
    yield "adaptive_avg_pool2d 3", lambda x: F.adaptive_avg_pool2d(x, 3), (x,), {}
    yield "adaptive_max_pool2d 3", lambda x: F.adaptive_max_pool2d(x, 3), (x,), {}
    yield "interpolate nearest", lambda x: F.interpolate(x, scale_factor=2), (x,), {}
    yield "interpolate bilinear", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), (x,), {}
    yield "layer_norm last", lambda x: F.layer_norm(x, (8,)), (x,), {}
    yield "group_norm", lambda x: F.group_norm(x, 3), (x,), {}
    yield "dropout eval", lambda x: F.dropout(x, 0.5, training=False), (x,), {}
    yield "softmax dim1", lambda x: F.softmax(x, 1), (x,), {}
    yield "cnn block", cnn_block(w, bn), (x,), {}


def cnn_block(w: torch.Tensor, bn: tuple) -> Callable:
    def block(x):
        y = F.conv2d(x, w, padding=1)
        y = F.batch_norm(y, None, None, None, None, training=True)
        y = F.relu(y)
        y = F.max_pool2d(y, 2)
        return F.adaptive_avg_pool2d(y, 1)

    return block


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grad", action="store_true", help="also compare gradients w.r.t. inputs")
    parser.add_argument("--ops", default="", help="comma-separated OpInfo ids (default: all)")
    parser.add_argument("--part", default="opinfo,inplace,modules")
    parser.add_argument("--told", action="store_true", help="compare the strides the trace tells, not the outputs'")
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    parts = options.part.split(",")
    calls: list[Iterator] = []
    if "modules" in parts:
        calls.append(module_calls())
    if "inplace" in parts:
        calls.append(in_place_calls())
    if "opinfo" in parts:
        calls.append(opinfo_calls(set(filter(None, options.ops.split(","))), torch.float64))
    checked = differences = 0
    for group in calls:
        for name, fn, args, kwargs in group:
            checked += 1
            found = (
                check_told(name, fn, args, kwargs) if options.told else check_call(name, fn, args, kwargs, options.grad)
            )
            for line in found:
                differences += 1
                print(line, flush=True)
    print(f"# {checked} calls, {differences} differences", flush=True)


if __name__ == "__main__":
    main()
