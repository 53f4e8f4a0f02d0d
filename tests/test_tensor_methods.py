"""Every ``torch.Tensor`` method thunder_rs binds takes its arguments as torch's method does.

The methods are enumerated from thunder_rs's registry (``TORCH_TO_LTORCH``) and checked with real
calls: PyTorch's own OpInfo database gives each method, in-place and operator variant (aliases
included) its sample inputs, called inside ``thunder_rs.jit`` and eagerly; the methods it has no
variant for have calls below. A newly bound method that neither covers fails
``test_every_bound_method_is_checked``. The default run checks each variant's first sample; all
samples run with ``--run-slow``.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import thunder_rs
from thunder_rs.errors import ThunderError, ThunderNotImplementedError
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH

_OPERATOR_NAMES = {"inv": "__invert__"}
#: Methods returning uninitialised memory: their values are not defined.
UNINITIALISED = frozenset({"new_empty", "new_empty_strided"})
#: Bound methods with no check here, and why.
UNCHECKED = {
    "indices": "sparse tensors only",
    "values": "sparse tensors only",
    "resize_as_sparse_": "sparse tensors only",
    "sparse_resize_": "sparse tensors only",
    "sparse_resize_and_clear_": "sparse tensors only",
    "apply_": "refused in a trace: runs a Python callable per element",
    "map_": "refused in a trace: runs a Python callable per element",
    "map2_": "refused in a trace: runs a Python callable per element",
    "set_": "refused in a trace: swaps the tensor's storage",
    "share_memory_": "refused in a trace: moves storage to shared memory",
    "cuda": "needs a CUDA device: checked on fake CUDA tensors in test_cuda_devices.py",
}


def _is_method(fn) -> bool:
    return getattr(fn, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor) or getattr(
        fn, "__qualname__", ""
    ).startswith(("Tensor.", "TensorBase."))


@functools.cache
def bound_methods() -> frozenset[str]:
    return frozenset(fn.__name__ for fn in TORCH_TO_LTORCH if _is_method(fn))


def _named(fn, operator: bool = False) -> str | None:
    name = getattr(fn, "__name__", None)  # functools.partial variants have none
    if name is None or not operator:
        return name
    return _OPERATOR_NAMES.get(name, f"__{name}__")


@functools.cache
def opinfo_variants() -> dict[str, list]:
    """Bound method name -> [(OpInfo, the variant callable)] from torch's op_db."""
    found: dict[str, list] = {}
    for op in op_db:
        sources = [(v, False) for v in (op.method_variant, op.inplace_variant)]
        sources += [(v, True) for v in (op.operator_variant, op.inplace_operator_variant)]
        sources += [(v, False) for alias in op.aliases for v in (alias.method_variant, alias.inplace_variant)]
        for fn, operator in sources:
            name = _named(fn, operator) if fn is not None else None
            if name in bound_methods():
                found.setdefault(name, []).append((op, fn))
    return found


def _dtype(op) -> torch.dtype:
    supported = op.supported_dtypes("cpu")
    for dtype in (torch.float64, torch.float32, torch.int64, torch.bool):
        if dtype in supported:
            return dtype
    return next(iter(supported))


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _run(fn, args: tuple, kwargs: dict):
    """(result, arguments after the call) or the exception eager or the jit raised."""
    args, kwargs = _clone(args), _clone(kwargs)
    torch.manual_seed(0)
    try:
        return fn(*args, **kwargs), args
    except Exception as e:  # noqa: BLE001 - compared with the other side's
        return e, args


def check_call(fn, args: tuple, kwargs: dict) -> None:
    """``fn`` inside thunder_rs.jit computes what it computes eagerly, and leaves its (possibly
    mutated) arguments as eager does; when eager raises, the jit raises an error of its type."""
    expected, expected_args = _run(fn, args, kwargs)
    actual, actual_args = _run(thunder_rs.jit(fn), args, kwargs)
    if isinstance(expected, Exception):
        assert isinstance(actual, Exception), f"eager raised {expected!r}, thunder_rs returned"
        if not isinstance(actual, ThunderNotImplementedError):
            assert isinstance(actual, type(expected)) or isinstance(expected, type(actual)), (actual, expected)
        return
    if isinstance(actual, ThunderNotImplementedError):
        pytest.skip(f"not supported here: {actual}")
    if isinstance(actual, ThunderError) and _resized(args, expected_args):
        return  # eager resized an in-place call's receiver (deprecated); thunder_rs refuses it with an error
    if isinstance(actual, Exception):
        raise actual
    torch.testing.assert_close(actual, expected, equal_nan=True, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(_tensors(actual_args), _tensors(expected_args), equal_nan=True, atol=1e-6, rtol=1e-5)


def _resized(before, after) -> bool:
    return any(a.shape != b.shape for a, b in zip(_tensors(before), _tensors(after)))


def _tensors(value) -> list:
    return [x for x in torch.utils._pytree.tree_leaves(value) if isinstance(x, torch.Tensor)]


def _variant_params(every_sample: bool) -> list:
    """Each variant's first sample; every sample (slow) when asked for: counting them takes a
    minute on 2 cores."""
    params = []
    for name, variants in sorted(opinfo_variants().items()):
        for op, fn in variants:
            count = sum(1 for _ in op.sample_inputs("cpu", _dtype(op))) if every_sample else 1
            for index in range(count):
                marks = (pytest.mark.slow,) if index else ()
                params.append(
                    pytest.param(
                        name,
                        op,
                        fn,
                        index,
                        id=f"{name}-{op.name}.{op.variant_test_name}-{index}".replace(".-", "-"),
                        marks=marks,
                    )
                )
    return params


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ == "test_bound_method_with_opinfo_samples_equals_eager":
        every_sample = metafunc.config.getoption("--run-slow")
        metafunc.parametrize(("name", "op", "variant", "index"), _variant_params(every_sample))


def _calling(fn):
    """The variant called on the sample's tensor: ``x.method(*args)``, ``x + y``, ``x += y``."""
    return lambda x, *args, **kwargs: fn(x, *args, **kwargs)


def test_bound_method_with_opinfo_samples_equals_eager(name, op, variant, index):
    torch.manual_seed(0)
    sample = list(op.sample_inputs("cpu", _dtype(op)))[index]
    fn = _calling(variant)
    if name in UNINITIALISED:  # only the metadata of uninitialised memory is defined
        fn = _metadata_of(fn)
    check_call(fn, (sample.input, *sample.args), dict(sample.kwargs))


def _metadata_of(fn):
    return lambda *args, **kwargs: (lambda t: torch.tensor([*t.shape, t.dtype.itemsize, *t.stride()]))(
        fn(*args, **kwargs)
    )


def _x(*shape, dtype=torch.float64):
    return torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(sum(shape) + 1))


def _ints(*shape):
    return torch.arange(1, 1 + int(torch.tensor(shape).prod())).reshape(shape) % 7 - 3


#: Calls of the bound methods op_db has no variant for, and of binding forms worth pinning down:
#: (method, call, arguments).
CALLS = [
    ("__and__", lambda a, b: a & b, (_ints(3, 4), _ints(4))),
    ("__or__", lambda a, b: a | b, (_ints(3, 4), 5)),
    ("__floordiv__", lambda a, b: a // b, (_x(3, 4), _x(4) + 3)),
    ("__truediv__", lambda a, b: a / b, (_ints(3, 4), 2)),
    ("__idiv__", lambda a, b: a.__idiv__(b), (_x(3, 4), _x(4) + 3)),
    ("__ifloordiv__", lambda a, b: a.__ifloordiv__(b), (_x(3, 4), 2.0)),
    ("__setitem__", lambda a, b: (a.__setitem__((slice(None), 1), b), a * 2)[1], (_x(3, 4), _x(3))),
    ("__setitem__", lambda a, m: (a.__setitem__(m, 0.5), a)[1], (_x(3, 4), _x(3, 4) > 0)),
    ("copy_", lambda a, b: a.copy_(b) + 1, (_x(3, 4), _x(4))),
    ("copy_", lambda a, b: a.copy_(b, non_blocking=False), (_x(3, 4), _ints(3, 4))),
    ("detach", lambda a: a.detach() * 2, (_x(3, 4),)),
    ("detach_", lambda a: (a * 1).detach_(), (_x(3, 4),)),
    ("fill_diagonal_", lambda a: a.fill_diagonal_(2.0, wrap=True), (_x(7, 3),)),
    ("hardshrink", lambda a: a.hardshrink(0.3), (_x(3, 4),)),
    ("hardshrink", lambda a: a.hardshrink(lambd=0.3), (_x(3, 4),)),
    ("prelu", lambda a, w: a.prelu(w), (_x(2, 3, 4), _x(3))),
    ("relu", lambda a: a.relu(), (_x(3, 4),)),
    ("relu_", lambda a: a.relu_() + 1, (_x(3, 4),)),
    ("slogdet", lambda a: a.slogdet(), (_x(2, 3, 3),)),
    ("type", lambda a: a.type(torch.int32), (_x(3, 4) * 4,)),
    ("type", lambda a: a.type("torch.FloatTensor"), (_x(3, 4),)),
    ("type", lambda a: a.type(dtype=torch.float32), (_x(3, 4),)),
    ("type_as", lambda a, b: a.type_as(b), (_x(3, 4), _ints(2))),
    ("is_same_size", lambda a, b: a * float(a.is_same_size(b)), (_x(3, 4), _x(3, 4))),
    ("requires_grad_", lambda a: a.requires_grad_(False) * 2, (_x(3, 4),)),
    ("bernoulli", lambda a: a.bernoulli(), (_x(3, 4).sigmoid(),)),
    ("bernoulli", lambda a: a.bernoulli(0.3), (_x(3, 4),)),
    ("bernoulli_", lambda a: a.bernoulli_(0.25), (_x(3, 4),)),
    ("multinomial", lambda a: a.multinomial(2, replacement=True), (_x(3, 4).exp(),)),
    ("random_", lambda a: a.random_(0, 10), (_x(3, 4),)),
    ("random_", lambda a: a.random_(5), (_x(3, 4),)),
    # Binding forms: receivers that are not the function's first argument, dims as varargs or a
    # tuple, keywords for positionals, several signatures of one method.
    ("where", lambda x, c, y: x.where(c, y), (_x(3, 4), _x(3, 4) > 0, _x(4))),
    ("where", lambda x, c, y: x.where(condition=c, other=y), (_x(3, 4), _x(3, 4) > 0, _x(4))),
    ("view", lambda x: x.view(2, 6) + x.view((6, 2)).t(), (_x(3, 4),)),
    ("view", lambda x: x.view(-1), (_x(3, 4),)),
    ("view", lambda x: x.view(torch.int64), (_x(3, 4),)),
    ("reshape", lambda x: x.reshape(4, -1) * x.reshape((4, 3)), (_x(3, 4),)),
    ("expand", lambda x: x.expand(2, -1, -1) + x.expand((2, 3, 4)), (_x(3, 4),)),
    ("permute", lambda x: x.permute(2, 0, 1) * x.permute((2, 0, 1)) + x.permute(dims=(2, 0, 1)), (_x(2, 3, 4),)),
    ("repeat", lambda x: x.repeat(2, 1, 3) * x.repeat((2, 1, 3)), (_x(3, 4),)),
    ("transpose", lambda x: x.transpose(0, 1) + x.transpose(dim0=1, dim1=0), (_x(3, 4),)),
    ("sum", lambda x: x.sum(1, keepdim=True) + x.sum(dim=(0, 1)) + x.sum(), (_x(3, 4),)),
    ("sum", lambda x: x.sum(dtype=torch.float32), (_ints(3, 4),)),
    ("mean", lambda x: x.mean(-1) + x.mean(dim=[0, 1], keepdim=False), (_x(3, 4),)),
    ("to", lambda x: x.to(torch.float32), (_x(3, 4),)),
    ("to", lambda x: x.to("cpu", torch.int32), (_x(3, 4) * 3,)),
    ("to", lambda x, y: x.to(y), (_x(3, 4), _ints(2))),
    ("to", lambda x: x.to(dtype=torch.float16, copy=True), (_x(3, 4),)),
    ("to", lambda x: x.to(device="cpu"), (_x(3, 4),)),
    ("max", lambda x: x.max(1).values + x.max(dim=1, keepdim=False)[0] + x.max(), (_x(3, 4),)),
    ("max", lambda x, y: x.max(y), (_x(3, 4), _x(4))),
    ("min", lambda x: x.min(0)[1], (_x(3, 4),)),
    ("split", lambda x: [t * i for i, t in enumerate(x.split(2, 1))], (_x(3, 5),)),
    ("split", lambda x: x.split([1, 4], dim=1), (_x(3, 5),)),
    ("chunk", lambda x: x.chunk(3, -1), (_x(3, 7),)),
    ("flatten", lambda x: x.flatten(1) + x.flatten(start_dim=1, end_dim=-1), (_x(2, 3, 4),)),
    ("unflatten", lambda x: x.unflatten(1, (2, 2)) * x.unflatten(-1, [-1, 2]), (_x(3, 4),)),
    ("softmax", lambda x: x.softmax(-1) + x.softmax(dim=0), (_x(3, 4),)),
    ("softmax", lambda x: x.softmax(1, dtype=torch.float32), (_x(3, 4),)),
    ("add", lambda x, y: x.add(y, alpha=2) + x.add(3) + x.add(other=y), (_x(3, 4), _x(4))),
    ("sub", lambda x, y: x.sub(y, alpha=0.5), (_x(3, 4), _x(4))),
    (
        "div",
        lambda x, y: x.div(y, rounding_mode="floor") + x.div(y, rounding_mode="trunc") + x.div(y),
        (_x(3, 4), _x(4) + 3),
    ),
    (
        "masked_fill",
        lambda x, m: x.masked_fill(m, -1.0) + x.masked_fill(mask=m, value=torch.tensor(2.0)),
        (_x(3, 4), _x(3, 4) > 0),
    ),
    ("index_select", lambda x, i: x.index_select(1, i) + x.index_select(dim=1, index=i), (_x(3, 4), _ints(2) % 4)),
    (
        "new_zeros",
        lambda x: x.new_zeros(2, 3) + x.new_zeros((2, 3)) + x.new_zeros([2, 3], dtype=torch.float64),
        (_x(3, 4),),
    ),
    ("new_ones", lambda x: x.new_ones((2,), dtype=torch.int32), (_x(3, 4),)),
    ("new_full", lambda x: x.new_full((2, 2), 7), (_ints(3, 4),)),
    ("clamp", lambda x: x.clamp(min=-0.5) + x.clamp(max=0.5) + x.clamp(-0.2, 0.2), (_x(3, 4),)),
    ("clamp", lambda x, lo: x.clamp(lo), (_x(3, 4), _x(4))),
    ("gather", lambda x, i: x.gather(1, i) + x.gather(dim=1, index=i), (_x(3, 4), torch.tensor([[0], [3], [1]]))),
    ("gather", lambda x, i: x.gather(0, i), (_x(5), torch.zeros(2, 0, dtype=torch.uint8))),  # empty: unchecked
    ("gather", lambda x, i: x.gather(0, i), (_x(), torch.tensor([0]))),  # 0-dim input
    ("scatter", lambda x, i: x.scatter(0, i, 2.0), (_x(4, 2), torch.tensor([[0, 3]], dtype=torch.int32))),
    (
        "squeeze",
        lambda x: x.squeeze() + x.squeeze(1).unsqueeze(1) + x.squeeze((1, 3)).unsqueeze(1).unsqueeze(3),
        (_x(3, 1, 4, 1),),
    ),
    ("std", lambda x: x.std(1, unbiased=False) + x.std(dim=1, correction=0) + x.std(1, keepdim=False), (_x(3, 4),)),
    ("var", lambda x: x.var(0) + x.var(0, True), (_x(3, 4),)),
    ("norm", lambda x: x.norm() + x.norm(1) + x.norm(p=2, dim=1).sum() + x.norm("fro"), (_x(3, 4),)),
    ("pow", lambda x: x.pow(2) + x.abs().pow(exponent=0.5), (_x(3, 4),)),
    ("scatter", lambda x, i: x.scatter(1, i, 9.0) + x.scatter(1, i, x, reduce="add"), (_x(3, 4), _ints(3, 2) % 4)),
    ("index_fill", lambda x, i: x.index_fill(1, i, -2.0), (_x(3, 4), torch.tensor([0, 2]))),
    ("narrow", lambda x: x.narrow(1, 1, 2) + x.narrow(dim=1, start=torch.tensor(1), length=2), (_x(3, 4),)),
    ("roll", lambda x: x.roll(1, 0) + x.roll((1, -1), (0, 1)) + x.roll(shifts=2), (_x(3, 4),)),
    ("cumsum", lambda x: x.cumsum(1) + x.cumsum(dim=0, dtype=torch.float64), (_x(3, 4),)),
    ("argmax", lambda x: x.argmax() + x.argmax(1, keepdim=True).sum() + x.argmax(dim=0).sum(), (_x(3, 4),)),
    ("topk", lambda x: x.topk(2).values + x.topk(2, dim=0, largest=False)[0].t().sum(), (_x(4, 4),)),
    ("sort", lambda x: x.sort(descending=True)[0] + x.sort(1, stable=True).values, (_x(3, 4),)),
    ("all", lambda x: x.all() & x.all(1).any() & x.any(dim=0).all(), (_x(3, 4) > -2,)),
    ("size", lambda x: x.new_zeros(x.size()) + x.size(1) + x.size(dim=-1), (_x(3, 4),)),
    ("contiguous", lambda x: x.t().contiguous(memory_format=torch.contiguous_format), (_x(3, 4),)),
    ("float", lambda x: x.float() + x.double().float() + x.half().float() + x.int().float(), (_x(3, 4),)),
    ("masked_fill_", lambda x, m: x.masked_fill_(m, 0.0) * 2, (_x(3, 4), _x(3, 4) > 0)),
    ("add_", lambda x, y: x.add_(y, alpha=3) * 2, (_x(3, 4), _x(4))),
    ("clamp_", lambda x: x.clamp_(min=0) * 2, (_x(3, 4),)),
    ("cpu", lambda x: x.cpu() * 2 + x.t().cpu(memory_format=torch.contiguous_format).t(), (_x(3, 4),)),
]


@pytest.mark.parametrize(("name", "call", "args"), [pytest.param(*c, id=f"{c[0]}-{i}") for i, c in enumerate(CALLS)])
def test_bound_method_call_equals_eager(name, call, args):
    check_call(call, args, {})


def test_every_bound_method_is_checked():
    checked = set(opinfo_variants()) | {name for name, *_ in CALLS} | set(UNCHECKED)
    missing = sorted(bound_methods() - checked)
    assert not missing, f"bound Tensor methods without a check (add a call to CALLS): {missing}"
    stale = sorted(set(UNCHECKED) - bound_methods())
    assert not stale, f"UNCHECKED lists methods thunder_rs no longer binds: {stale}"
