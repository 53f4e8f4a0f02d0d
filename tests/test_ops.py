"""Every OpInfo against eager PyTorch: outputs, error inputs, and float64 gradients.

The default run takes every op in every tested dtype on its representative samples (the first,
and each one with an edge case the others lack: ``opinfos/sampling.py``), about 40% of the table;
``--run-slow`` takes every sample. Every error input runs in both.

With OPINFO_SELF_CHECK=1 the jit is the identity, so the run validates the table itself without the
compiled package: every sample runs in eager and every error input raises exactly its listed type.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from itertools import islice
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from opinfos import OPINFOS, OpInfo, SampleInput
from opinfos.sampling import kinds_of_samples, sample_indices

SELF_CHECK = os.environ.get("OPINFO_SELF_CHECK") == "1"
TESTED_DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool)
# CUDA parameters only where CUDA is: 25,000 skipped ones cost the CPU run about a minute.
DEVICES = (
    "cpu",
    *([pytest.param("cuda", marks=(pytest.mark.requires_cuda, pytest.mark.gpu))] if torch.cuda.is_available() else []),
)

WARNING_FILTERS = [
    # Some samples reduce over fewer elements than the correction (var of a 0-dim tensor is NaN, as in eager).
    pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning"),
    # mse_loss warns before it raises on unbroadcastable shapes.
    pytest.mark.filterwarnings("ignore:Using a target size:UserWarning"),
]
# One xdist worker runs the whole module (``make test-python``'s ``--dist loadfile``, or the group
# under ``--dist loadgroup``): the coverage test at its end reads what the module's other tests
# reached in the same process.
pytestmark = [*WARNING_FILTERS, pytest.mark.xdist_group("opinfo_table")]


#: The ltorch symbols that compiled samples reached (forward and backward, at every depth), and
#: how many CPU sample tests passed: the coverage test at the end of this module reads both.
REACHED: set[str] = set()
PASSED_SAMPLES: list[str] = []


@pytest.fixture(autouse=True, scope="module")
def record_called_symbols():
    """Counts every composite called while tracing, also those whose call leaves nothing in the
    trace (``conj`` of a real tensor returns its input)."""
    if SELF_CHECK:
        yield
        return
    import thunder_rs.torch

    # The module whose ``record_composite`` the symbols ``@torchsymbol`` makes call.
    ltorch_module = sys.modules[thunder_rs.torch.torchsymbol.__module__]
    record = ltorch_module.record_composite

    def recording(symbol_id, name, fn, args, kwargs):
        REACHED.add(name)
        return record(symbol_id, name, fn, args, kwargs)

    ltorch_module.record_composite = recording
    yield
    ltorch_module.record_composite = record


def jit(fn):
    if SELF_CHECK:
        return fn
    # Imported on use so that the self-check runs before the extension module is built.
    import thunder_rs

    jfn = thunder_rs.jit(fn)

    def recording(*args, **kwargs):
        try:
            return jfn(*args, **kwargs)
        finally:
            # The first traces, and the execution traces (rewrites such as view folding make symbols).
            forward, backward = thunder_rs.last_traces(jfn), thunder_rs.last_backward_traces(jfn)
            for trace in [*forward[:1], *forward[-1:], *backward[:1], *backward[-1:]]:
                REACHED.update(name for name in trace.all_symbol_names() if name.startswith("ltorch."))

    return recording


def thunder_error() -> type[Exception]:
    import thunder_rs.errors

    return thunder_rs.errors.ThunderError


def nth(items: Iterable[Any], index: int) -> Any:
    return next(islice(items, index, None))


def sample_at(op: OpInfo, dtype: torch.dtype, device: str, index: int) -> SampleInput:
    # Seeded so that a failing id reproduces with the same values.
    torch.manual_seed(0)
    return nth(op.sample_inputs(dtype, device), index)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def count(items: Iterable[Any]) -> int:
    return sum(1 for _ in items)


def grad_tested(op: OpInfo) -> bool:
    return op.supports_grad and torch.float64 in op.dtypes


def op_dtypes(op: OpInfo) -> list[torch.dtype]:
    return [dtype for dtype in op.dtypes if dtype in TESTED_DTYPES]


def sample_count(op: OpInfo, dtype: torch.dtype) -> int:
    return len(kinds_of_samples(op, dtype))


def sample_params(full: bool) -> list:
    """Every op in every tested dtype, on its default-run samples or, with ``full``, on all. The
    float64 forward of an op whose gradient is tested runs only in the full sweep: the gradient
    test compares the same samples' float64 outputs too."""
    return [
        pytest.param(op, dtype, i, id=f"{op.id}-sample{i}-{dtype_name(dtype)}")
        for op in OPINFOS
        for position, dtype in enumerate(op_dtypes(op))
        if full or not (dtype == torch.float64 and grad_tested(op))
        for i in sample_indices(op, dtype, full, every_kind=position == 0)
    ]


def error_params() -> list:
    return [pytest.param(op, i, id=f"{op.id}-error{i}") for op in OPINFOS for i in range(count(op.error_inputs()))]


def grad_params(full: bool) -> list:
    return [
        pytest.param(op, i, id=f"{op.id}-sample{i}-float64")
        for op in OPINFOS
        if grad_tested(op)
        for i in sample_indices(op, torch.float64, full, every_kind=True)
    ]


def decomposition_params(full: bool) -> list:
    """Each op's first tested dtype, on its default-run samples or, with ``full``, on all."""
    return [
        pytest.param(op, dtypes[0], i, id=f"{op.id}-sample{i}-{dtype_name(dtypes[0])}")
        for op in OPINFOS
        if (dtypes := op_dtypes(op))
        for i in sample_indices(op, dtypes[0], full, every_kind=True)
    ]


#: The parameters of each sample test, made for the run's sweep (the default run's samples, or
#: every sample under ``--run-slow``), so that a default run neither makes nor skips the rest.
SWEEPS = {
    "test_op_matches_eager": (("op", "dtype", "index"), sample_params),
    "test_op_decomposition_matches_eager": (("op", "dtype", "index"), decomposition_params),
    "test_op_grad_matches_eager": (("op", "index"), grad_params),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ in SWEEPS:
        names, params = SWEEPS[metafunc.function.__name__]
        metafunc.parametrize(names, params(full=metafunc.config.getoption("--run-slow")))


def assert_same(actual: Any, expected: Any, tolerance: dict, sample: SampleInput) -> None:
    """Tensors match in dtype, shape, device and values (NaN equal to NaN); tuples match elementwise."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual).__name__} for {sample}"
        assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype} for {sample}"
        assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape} for {sample}"
        torch.testing.assert_close(actual, expected, equal_nan=True, **tolerance, msg=lambda m: f"{m}\n{sample}")
    elif isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)), f"expected a sequence, got {type(actual).__name__} for {sample}"
        assert len(actual) == len(expected), f"{len(actual)} outputs != {len(expected)} for {sample}"
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e, tolerance, sample)
    else:
        assert actual == expected, f"{actual!r} != {expected!r} for {sample}"


@pytest.mark.parametrize("device", DEVICES)
def test_op_matches_eager(op: OpInfo, dtype: torch.dtype, index: int, device: str) -> None:
    sample = sample_at(op, dtype, device, index)
    expected = op.op(*sample.args, **sample.kwargs)
    actual = jit(op.op)(*sample.args, **sample.kwargs)
    assert_same(actual, expected, op.tolerance(dtype), sample)
    if device == "cpu":
        PASSED_SAMPLES.append(f"{op.id}-{index}-{dtype}")


# The torch executor runs a composite whole as its torch callable, so the test above checks the
# symbol's metadata and plumbing; this one runs its decomposition into prims, as fusion will.
def test_op_decomposition_matches_eager(op: OpInfo, dtype: torch.dtype, index: int) -> None:
    if SELF_CHECK:
        pytest.skip("checks thunder_rs's decompositions")
    if index in op.decomposition_skips:
        pytest.skip("the decomposition cannot give eager's result here (see the OpInfo entry)")
    from thunder_rs.executors.torch_ex import decomposing

    sample = sample_at(op, dtype, "cpu", index)
    expected = op.op(*sample.args, **sample.kwargs)
    with decomposing():
        actual = jit(op.op)(*sample.args, **sample.kwargs)
    assert_same(actual, expected, op.tolerance(dtype), sample)


@pytest.mark.parametrize(("op", "index"), error_params())
def test_op_error_matches_eager(op: OpInfo, index: int) -> None:
    error = nth(op.error_inputs(), index)
    fn = jit(op.op)
    with pytest.raises(error.exc_type) as info:
        fn(*error.sample.args, **error.sample.kwargs)
    if SELF_CHECK:
        # The table must list exactly what eager raises, not a base class of it.
        assert type(info.value) is error.exc_type, f"eager raised {type(info.value).__name__}: {info.value}"
        return
    if raised_before_dispatch(info):
        return
    assert isinstance(info.value, thunder_error()), f"not a ThunderError: {info.value!r}"
    pattern = error.match if error.match is not None else re.escape(op.name)
    assert re.search(pattern, str(info.value), re.IGNORECASE), f"{str(info.value)!r} does not name {op.name}"


def raised_before_dispatch(info: pytest.ExceptionInfo) -> bool:
    """Whether torch's own argument parsing rejected the call before thunder_rs saw it: no frame
    of the language context or of an ltorch decomposition is on the traceback. The error is then
    torch's own, and only its type is checked."""
    files = [entry.path for entry in info.traceback]
    return not any("thunder_rs/torch/" in str(f) or str(f).endswith("langctx.py") for f in files)


def with_grad(value: Any, leaves: list[torch.Tensor]) -> Any:
    """`value` with each floating tensor replaced by a fresh leaf that requires grad (same strides)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        leaf = value.detach().requires_grad_()
        leaves.append(leaf)
        return leaf
    if isinstance(value, (list, tuple)):
        return type(value)(with_grad(v, leaves) for v in value)
    return value


def tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def differentiable_call(op: OpInfo, sample: SampleInput, fn) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`fn(sample)` with its floating inputs as fresh leaves that require grad: (leaves, outputs)."""
    leaves: list[torch.Tensor] = []
    args = with_grad(sample.args, leaves)
    kwargs = {k: v if k in op.nondifferentiable else with_grad(v, leaves) for k, v in sample.kwargs.items()}
    return leaves, tensors_of(fn(*args, **kwargs))


def grads(op: OpInfo, sample: SampleInput, fn) -> tuple[torch.Tensor, ...]:
    """Gradients of `fn(sample)` with respect to its floating inputs, for a fixed random cotangent."""
    leaves, outputs = differentiable_call(op, sample, fn)
    outputs = [t for t in outputs if t.requires_grad]
    if not leaves or not outputs:
        pytest.skip("no differentiable input or output")
    torch.manual_seed(1)
    # Independent of memory layout: prims keep an input's strides where eager may not.
    cotangents = [torch.randn(t.shape, dtype=t.dtype, device=t.device) for t in outputs]
    return torch.autograd.grad(outputs, leaves, cotangents, allow_unused=True, materialize_grads=True)


def eager_grads_or_skip(op: OpInfo, sample: SampleInput, fn) -> tuple[torch.Tensor, ...]:
    """Eager's gradients of ``fn(sample)`` in a reduced-precision or device sweep; the test is
    skipped where they are no reference: eager's backward fails, or an input or eager's own
    gradient is not finite."""
    try:
        expected = grads(op, sample, fn)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"eager's backward fails here: {e}")
    inputs = tensors_of([sample.args, list(sample.kwargs.values())])
    if not all(t.isfinite().all() for t in inputs if t.is_floating_point()):
        pytest.skip("non-finite inputs")
    if not all(g.isfinite().all() for g in tensors_of([expected])):
        pytest.skip("eager's own gradient is not finite here")
    return expected


# Gradients come from the Rust VJP pass (prim rules, composite grad rules) through one
# autograd.Function per call; eager autograd is the reference.
@pytest.mark.parametrize("device", DEVICES)
def test_op_grad_matches_eager(op: OpInfo, index: int, device: str) -> None:
    sample = sample_at(op, torch.float64, device, index)
    # Which outputs require grad is part of the result: ops torch defines no derivative for give
    # outputs that do not.
    try:
        expected_outputs = differentiable_call(op, sample, op.op)[1]
        expected_flags = [t.requires_grad for t in expected_outputs]
        expected = grads(op, sample, op.op)
    except RuntimeError as e:
        # e.g. torch 2.9's mse_loss backward with a float64 input and a float32 target, or
        # scatter with reduce=, which has no derivative (thunder_rs refuses to trace it with grads).
        pytest.skip(f"eager refuses inputs that require grad, or its own backward fails here: {e}")
    except pytest.skip.Exception:
        expected = None  # no output requires grad: only the flags below are compared
    outputs = differentiable_call(op, sample, jit(op.op))[1]
    flags = [t.requires_grad for t in outputs]
    assert flags == expected_flags, f"requires_grad of the outputs: {flags}, eager {expected_flags}"
    assert_same(
        [t.detach() for t in outputs], [t.detach() for t in expected_outputs], op.tolerance(torch.float64), sample
    )
    if expected is None:
        pytest.skip("no differentiable input or output")
    inputs = tensors_of([sample.args, list(sample.kwargs.values())])
    if not all(t.isfinite().all() for t in inputs if t.is_floating_point()):
        pytest.skip("non-finite inputs: gradients there are conventions, not calculus")
    if not all(g.isfinite().all() for g in tensors_of([expected])):
        # e.g. var/std over dim=(): eager reduces every dim forward but its backward divides by zero.
        pytest.skip("eager's own gradient is not finite here")
    actual = grads(op, sample, jit(op.op))
    assert_same(actual, expected, op.tolerance(torch.float64), sample)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_keeps_expected_fraction(device: str) -> None:
    torch.manual_seed(0)
    p = 0.25
    x = torch.ones(20_000, device=device)
    y = jit(lambda a: F.dropout(a, p=p, training=True))(x)
    kept = y != 0
    assert abs(kept.double().mean().item() - (1 - p)) < 0.02
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))


def test_every_ltorch_symbol_is_reached_by_an_opinfo_sample(request: pytest.FixtureRequest) -> None:
    """Runs last: every registered ltorch symbol was recorded by some sample of the table (as the
    op itself, inside another's decomposition, or in a backward), so none goes untested."""
    total = len(sample_params(full=request.config.getoption("--run-slow")))
    if SELF_CHECK or len(PASSED_SAMPLES) < total:
        pytest.skip(f"needs every CPU sample test of the table to pass in this run ({len(PASSED_SAMPLES)} of {total})")
    from thunder_rs import ltorch

    missing = sorted({s.symbol_name for s in ltorch.SYMBOLS} - REACHED)
    assert not missing, f"{len(missing)} ltorch symbols no OpInfo sample reaches: {missing}"
