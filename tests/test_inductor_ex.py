"""The Inductor executor: regions of torch calls compiled by Inductor equal the same calls run
eagerly, compile once per region key and input layout, and claim only what Inductor computes as
eager does.

Regions are built by hand here, as the partitioning pass makes them: a function of the torch
executor's implementations that returns a tuple. Each cold compile costs seconds (the C++
compiler), so the default run keeps a few tests and the rest are slow.
"""

import copy
import logging
import re
import textwrap
import threading
import time
import warnings
from dataclasses import dataclass
from itertools import count

import pytest
import torch

import thunder_rs
from thunder_rs import prims
from thunder_rs.executors import inductor_cache, inductor_claims, inductor_ex
from thunder_rs.executors.torch_ex import torch_ex
from thunder_rs.torch import SYMBOLS

pytestmark = pytest.mark.inductor

#: What region sources call: every implementation of the torch executor, by its name.
IMPLS = {"torch": torch, **{impl.name: impl.fn for impl in torch_ex.registry.values()}}
_names = count()


@dataclass(frozen=True)
class Region:
    """A stand-in for ``thunder_rs.core.lang.executor_api.Region`` with the fields ``fuse`` reads."""

    name: str
    key: str
    source: str
    function: object
    symbol_names: tuple
    num_inputs: int
    num_outputs: int
    input_shapes: tuple = ()


def region(body: str, params: str, inputs: str = "") -> Region:
    """A region ``def <name>(<params>): <body>`` over the torch executor's implementations; its
    key is its body, then ``inputs`` (as the Rust key ends with the inputs' dtypes, devices and
    shapes, which compiled regions do not check again), so that equal bodies on inputs alike are
    identical regions."""
    name = f"inductor_fusion{next(_names)}"
    source = f"def {name}({params}):\n" + textwrap.indent(textwrap.dedent(body).strip(), "    ")
    namespace = dict(IMPLS)
    exec(source, namespace)
    lines = [line for line in source.splitlines()[1:] if "=" in line]
    key = textwrap.dedent(body) + inputs
    return Region(name, key, source, namespace[name], tuple(lines), params.count(",") + 1, 0)


def assert_same(outputs, expected):
    assert isinstance(outputs, tuple) and len(outputs) == len(expected)
    for out, ref in zip(outputs, expected):
        assert (out.dtype, out.shape, out.device) == (ref.dtype, ref.shape, ref.device)
        torch.testing.assert_close(out, ref, equal_nan=True)
        if ref.numel() > 1 and ref.is_contiguous():
            assert out.is_contiguous()


def check(r: Region, *args):
    """Runs ``r`` compiled and eagerly on ``args``; returns the compiled callable."""
    compiled = inductor_ex.inductor_ex.fuse(r)
    assert_same(compiled(*args), r.function(*args))
    return compiled


CHAIN = """
    t2 = prim_add(t0, t1)
    t3 = prim_sin(t2)
    t4 = prim_mul(t3, n)
    t5 = torch_softmax(t4, -1)
    t6 = prim_sum(t4, (1,))
    t7 = prim_broadcast_in_dim(t6, (8, 16), (0,))
    t8 = prim_sub(t2, t7)
    return (t5, t6, t8)
"""


# -- the default run: one region, layouts and the process-wide cache, claims -----------------------


def test_region_equals_its_eager_calls_and_compiles_once_per_layout(one_thread, caplog):
    r = region(CHAIN, "t0, t1, n")
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    before = inductor_ex.stats()
    thunder_rs.set_logs(inductor=True)
    try:
        with caplog.at_level(logging.INFO, logger="thunder_rs.inductor"):
            compiled = check(r, a, b, 2.0)
    finally:
        thunder_rs.set_logs()
    # Each region compiled says so as it happens (a cold compile takes seconds, minutes on a GPU).
    said = [record.getMessage() for record in caplog.records if record.name == "thunder_rs.inductor"]
    assert any(
        re.fullmatch(
            rf"{r.name} \(\d+ symbols, cpu\): (compiled by Inductor|loaded from .+) in [\d.]+ s "
            r"\(region \d+ of this process\)",
            line,
        )
        for line in said
    ), said
    check_again = inductor_ex.stats()
    assert check_again.misses == before.misses + 1 and "cpu" in check_again.startup_s
    assert_same(compiled(a + 1, b, 2.0), r.function(a + 1, b, 2.0))  # same layout: no compile
    assert inductor_ex.stats().misses == check_again.misses

    # Another layout of an input, and another value of a number input, each compile once.
    transposed = torch.randn(16, 8).t()
    assert_same(compiled(transposed, b, 2.0), r.function(transposed, b, 2.0))
    assert_same(compiled(a, b, -0.5), r.function(a, b, -0.5))
    assert inductor_ex.stats().misses == check_again.misses + 2
    # An identical region (another partition of a repeated layer, or a fresh jit) compiles nothing.
    twin = region(CHAIN, "t0, t1, n")
    assert_same(inductor_ex.inductor_ex.fuse(twin)(transposed, b, 2.0), r.function(transposed, b, 2.0))
    after = inductor_ex.stats()
    assert after.misses == check_again.misses + 2 and after.hits == check_again.hits + 1


class _Workers:
    """Stands in for Inductor's ``AsyncCompile`` pool: records what the start-up asks of it."""

    def __init__(self, ready: bool = True):
        self.calls, self.ready = [], ready

    def warm_pool(self):
        self.calls.append("warm_pool")

    def wait_pool_ready(self, timeout):
        self.calls.append(("wait_pool_ready", timeout))
        if not self.ready:
            raise TimeoutError("no worker answered")


def test_on_a_gpu_the_start_up_starts_inductors_compile_workers_and_waits_for_them(monkeypatch):
    """Without its pool of compile workers ready, Inductor compiles each Triton kernel (each
    autotuning configuration) in the calling process, one after the other; ``torch.compile``
    starts the pool when its backend is made, ``standalone_compile`` never does."""
    from torch._inductor import async_compile

    workers = _Workers()
    monkeypatch.setattr(async_compile, "AsyncCompile", workers)
    monkeypatch.setattr(async_compile, "get_compile_threads", lambda: 4)
    assert inductor_ex._start_compile_workers("cpu") is None  # C++ kernels compile on threads
    wait = inductor_ex._start_compile_workers("cuda")
    assert workers.calls == ["warm_pool"]  # started at once, waited for after the first compile
    assert wait() == "4 ready" and workers.calls[1] == ("wait_pool_ready", inductor_ex.WORKERS_TIMEOUT_S)
    workers.ready = False
    assert wait().startswith("not ready (TimeoutError: no worker answered)")
    monkeypatch.setenv("TORCH_WARM_POOL", "0")  # torch.compile's own switch for the pool
    assert inductor_ex._start_compile_workers("cuda") is None
    monkeypatch.setenv("TORCH_WARM_POOL", "1")
    monkeypatch.setattr(async_compile, "get_compile_threads", lambda: 1)
    assert inductor_ex._start_compile_workers("cuda") is None


def test_lazily_negated_and_conjugated_inputs_are_read_as_eager_reads_them(one_thread):
    """``x.conj().imag`` is a view with a negation bit and ``x.conj()`` one with a conjugation
    bit; a kernel reading their storage directly would miss the bit."""
    body = """
        t2 = prim_mul(t0, 2.0)
        t3 = prim_add(t2, t1)
        t4 = prim_exp(t3)
        return (t4,)
    """
    z, b = torch.randn(4, 3, dtype=torch.complex64), torch.randn(4, 3)
    negated = z.conj().imag
    assert negated.is_neg()
    r = region(body, "t0, t1", "f32[4, 3], f32[4, 3]")
    compiled = check(r, negated, b)
    assert_same(compiled(negated, b), r.function(negated, b))
    zb = torch.randn(4, 3, dtype=torch.complex64)
    assert z.conj().is_conj()
    check(region(body, "t0, t1", "c64[4, 3], c64[4, 3]"), z.conj(), zb)


def test_a_region_inductor_cannot_compile_runs_its_eager_calls_with_a_warning():
    # nonzero's shape depends on the data: Inductor's graph cannot hold it.
    r = region("t1 = torch.nonzero(t0)\nreturn (t1,)", "t0")
    x = torch.tensor([0.0, 1.0, 0.0, 2.0])
    before = inductor_ex.stats().failures
    with pytest.warns(UserWarning, match=f"{r.name} .* runs eagerly: Inductor could not compile it"):
        out = inductor_ex.inductor_ex.fuse(r)(x)
    assert_same(out, r.function(x))
    assert inductor_ex.stats().failures == before + 1


def test_a_long_compile_is_told_once_as_a_warning_while_it_runs(monkeypatch, caplog):
    # A first compile on a GPU took 62 s with nothing shown: past SLOW_COMPILE_S it is told, as
    # it runs, on the logger Python shows by default; later long compiles say nothing more.
    spans = []

    def slow_compile(function, args, region_key=None):
        start = time.time()
        time.sleep(0.3)
        spans.append((start, time.time()))
        return lambda args: function(*args)

    monkeypatch.setattr(inductor_ex, "SLOW_COMPILE_S", 0.05)
    monkeypatch.setattr(inductor_ex, "_slow_told", threading.Event())
    monkeypatch.setattr(inductor_ex, "_compile_function", slow_compile)
    monkeypatch.setattr(inductor_ex, "_stats", inductor_ex.InductorStats(startup_s={"cpu": 0.0}))
    monkeypatch.setattr(inductor_ex, "_compiled", {})
    x = torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="thunder_rs.inductor"):
        first = region("t1 = torch.sin(t0)\nreturn (t1,)", "t0")
        assert_same(inductor_ex.inductor_ex.fuse(first)(x), first.function(x))
        second = region("t1 = torch.cos(t0)\nreturn (t1,)", "t0")
        inductor_ex.inductor_ex.fuse(second)(x)
    told = [r for r in caplog.records if r.name == "thunder_rs.inductor" and r.levelno == logging.WARNING]
    assert len(told) == 1, [r.getMessage() for r in told]
    assert re.match(
        rf"thunder_rs: the Inductor region {first.name} \(1 symbols, cpu\) has been compiling for over "
        r"0 s .*setLevel\(logging.ERROR\)",
        told[0].getMessage(),
    ), told[0].getMessage()
    assert spans[0][0] <= told[0].created <= spans[0][1]  # while the compile ran, not after it

    # Under the threshold nothing is said.
    monkeypatch.setattr(inductor_ex, "SLOW_COMPILE_S", 10.0)
    monkeypatch.setattr(inductor_ex, "_slow_told", threading.Event())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="thunder_rs.inductor"):
        third = region("t1 = torch.tan(t0)\nreturn (t1,)", "t0")
        inductor_ex.inductor_ex.fuse(third)(x)
    assert not [r for r in caplog.records if r.name == "thunder_rs.inductor"]


def test_a_view_after_an_op_inductor_decomposes_with_other_strides_compiles(one_thread):
    """GPT-2's attention with its legacy empty cache: aten's ``cat`` of an empty 1-d tensor and
    a transposed view is contiguous, Inductor's is a copy keeping the view's strides. The
    ``matmul`` then reshapes the transposed result: traced through aten, that reshape was a view,
    which Inductor's strides refuse, and the region ran eagerly with a warning."""
    r = region(
        """
        t2 = torch.cat([t0, t1.transpose(1, 2)], -2)
        t3 = torch.matmul(t2, t2.transpose(-1, -2))
        return (t3,)
    """,
        "t0, t1",
    )
    empty, heads = torch.empty(0), torch.randn(2, 8, 32).view(2, 8, 2, 16)
    before = inductor_ex.stats().failures
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check(r, empty, heads)
    assert inductor_ex.stats().failures == before


def test_masked_norm_backwards_compile_when_the_input_needs_no_gradient(one_thread):
    """A batch or layer norm whose input needs no gradient has a backward that computes the
    weight's and bias's only: eager aten leaves the input's gradient undefined, its fake kernels
    (which Inductor's tracing runs) compute it anyway, and the region once unpacked the wrong
    number of outputs and ran eagerly."""
    torch.manual_seed(0)
    # float64: Inductor's norms sum in another order than aten's, which float32 shows over a small batch.
    models = [
        torch.nn.Sequential(torch.nn.BatchNorm2d(3), torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).double(),
        torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).double(),
    ]
    inputs = [torch.randn(2, 3, 8, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)]
    before = inductor_ex.stats().failures
    for model, x in zip(models, inputs):
        eager = copy.deepcopy(model)
        thunder_rs.jit(model, executors=["inductor"])(x).square().sum().backward()
        eager(x).square().sum().backward()
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
    assert inductor_ex.stats().failures == before


def _keys(*names):
    ids = {s.symbol_name: s.symbol_id for s in SYMBOLS}
    return [ids.get(n, n) for n in names]


def test_claims_pure_compilable_keys_with_the_torch_executors_implementations():
    registry = inductor_ex.inductor_ex.registry
    claimed = _keys(
        "add",
        "sin",
        "sum",
        "matmul",
        "linear",
        "reshape",
        "transpose",
        "broadcast_in_dim",
        "full",
        "ltorch.softmax",
        "ltorch.layer_norm",
        "ltorch.gelu",
        "ltorch.cross_entropy",
        "ltorch.getitem",
        "ltorch.native_layer_norm",
        "ltorch.native_layer_norm_backward",
        "ltorch.softmax_backward",
        "ltorch.gelu_backward",
        "ltorch.embedding_backward",
        "ltorch.nll_loss_backward",
    )
    region_functions = dict(zip(_keys(*inductor_claims.REGION_FUNCTIONS), inductor_claims.REGION_FUNCTIONS.values()))
    for key in claimed:
        fn = region_functions.get(key, torch_ex.registry[key].fn)
        assert registry[key].name == torch_ex.registry[key].name and registry[key].fn is fn, key
    # Random ops, ops eager checks on values, ops writing inputs, torch's checked kernels, opaque
    # linear algebra and fallbacks stay with the torch executor.
    unclaimed = _keys(
        "uniform",
        "device_put",
        "ltorch.randn",
        "ltorch.dropout",
        "ltorch.native_dropout",
        "ltorch.bernoulli",
        "ltorch.binary_cross_entropy",
        "ltorch.gaussian_nll_loss",
        "ltorch.quantile",
        "ltorch.masked_scatter",
        "ltorch.batch_norm",
        "ltorch.sdpa_flash",
        "ltorch.native_batch_norm",
        "ltorch.linalg_inv",
        "ltorch.as_strided",
        "ltorch.empty",
    )
    assert not [key for key in unclaimed if key in registry]
    assert not any(torch_ex.registry[key].checker is not None for key in registry)
    # The tables name existing keys.
    names = {s.symbol_name for s in SYMBOLS} | set(prims.NAMES)
    assert set(inductor_claims.NOT_CLAIMED) <= names and set(inductor_claims.CHECKERS) <= names


def test_integer_division_device_copies_and_masks_stay_eager():
    checker = {
        name: inductor_ex.inductor_ex.registry[key].checker
        for name, key in zip(
            ("div", "ltorch.div", "ltorch.floor_divide", "ltorch.to", "ltorch.getitem"),
            _keys("div", "ltorch.div", "ltorch.floor_divide", "ltorch.to", "ltorch.getitem"),
        )
    }
    i, f = torch.ones(3, dtype=torch.int64), torch.ones(3)
    assert not checker["div"](i, i) and checker["div"](f, f)
    assert checker["ltorch.div"](i, i) and not checker["ltorch.div"](i, 2, rounding_mode="floor")
    assert checker["ltorch.div"](i, 2.0, rounding_mode="floor") and not checker["ltorch.floor_divide"](i, i)
    assert checker["ltorch.to"](f, torch.float64) and checker["ltorch.to"](f, "cpu", torch.float64)
    assert not checker["ltorch.to"](f, "cuda") and not checker["ltorch.to"](f, device="meta")
    assert checker["ltorch.getitem"](f, (slice(1), i)) and not checker["ltorch.getitem"](f, i > 0)


# -- slow: more region shapes ----------------------------------------------------------------------

REGIONS = {
    "matmul_and_views": (
        """
        t3 = prim_reshape(t0, (4, 2, 16))
        t4 = prim_transpose(t3, (1, 0, 2))
        t5 = prim_reshape(t4, (2, 64))
        t6 = prim_linear(t5, t1, t2)
        t7 = prim_matmul(t6, prim_transpose(t6, (1, 0)))
        t8 = torch_gelu(t7)
        return (t6, t8)
    """,
        "t0, t1, t2",
        lambda: (torch.randn(8, 16), torch.randn(5, 64), torch.randn(5)),
    ),
    "layer_norm_forward_backward": (
        """
        (t3, t4, t5) = torch_native_layer_norm(t0, (16,), t1, t2, 1e-5)
        (t6, t7, t8) = torch_native_layer_norm_backward(t3, t0, (16,), t4, t5, t1, t2, (True, True, True))
        return (t3, t4, t5, t6, t7, t8)
    """,
        "t0, t1, t2",
        lambda: (torch.randn(4, 8, 16), torch.randn(16), torch.randn(16)),
    ),
    "softmax_and_gelu_backward": (
        """
        t2 = torch_softmax(t0, -1)
        t3 = torch_softmax_backward(t1, t2, 1)
        t4 = torch_gelu_backward(t1, t0, approximate="tanh")
        t5 = torch_log_softmax(t0, 0)
        t6 = torch_log_softmax_backward(t1, t5, 0)
        return (t3, t4, t6)
    """,
        "t0, t1",
        lambda: (torch.randn(6, 10), torch.randn(6, 10)),
    ),
    "non_contiguous_and_broadcast_inputs": (
        """
        t3 = prim_broadcast_in_dim(t1, (6, 5), (1,))
        t4 = prim_mul(t0, t3)
        t5 = prim_add(t4, t2)
        t6 = prim_amax(t5, (0,))
        return (t5, t6)
    """,
        "t0, t1, t2",
        lambda: (torch.randn(5, 6).t(), torch.randn(10)[::2], torch.randn(1, 5).expand(6, 5)),
    ),
    "storage_offset": (
        """
        t1 = prim_exp(t0)
        return (prim_mul(t1, t0),)
    """,
        "t0",
        lambda: (torch.randn(40)[3:35].view(4, 8),),
    ),
    "zero_dim_and_empty": (
        """
        t2 = prim_broadcast_in_dim(t0, (0, 3), ())
        t3 = prim_add(t1, t2)
        t4 = prim_sum(t3, (0,))
        t5 = prim_mul(t0, t0)
        return (t3, t4, t5)
    """,
        "t0, t1",
        lambda: (torch.tensor(1.5), torch.randn(0, 3)),
    ),
    "integer_and_bool": (
        """
        t2 = prim_add(t0, t1)
        t3 = prim_mul(t2, 3)
        t4 = prim_gt(t3, t1)
        t5 = prim_bitwise_and(t4, prim_lt(t0, 2))
        t6 = prim_where(t5, t3, t0)
        t7 = prim_sum(t6, (1,))
        t8 = prim_convert_element_type(t5, torch.float32)
        return (t6, t7, t8, t5)
    """,
        "t0, t1",
        lambda: (torch.randint(-5, 5, (4, 6)), torch.randint(-5, 5, (4, 6))),
    ),
    "number_inputs": (
        """
        t3 = prim_mul(t0, a)
        t4 = prim_add(t3, b)
        t5 = prim_mul(t4, c)
        return (t5, prim_pow(t0, 2))
    """,
        "t0, a, b, c",
        lambda: (torch.randn(3, 4), 3, -0.25, True),
    ),
    "output_is_an_input": (
        """
        t1 = prim_neg(t0)
        return (t0, t1, t1)
    """,
        "t0",
        lambda: (torch.randn(3),),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REGIONS))
def test_region_shapes(name, one_thread, monkeypatch, tmp_path):
    body, params, make_inputs = REGIONS[name]
    monkeypatch.setenv(inductor_cache.ENV, str(tmp_path))
    check(region(body, params), *make_inputs())
    # Loaded from thunder_rs's artifact cache (as a later process would), it computes the same.
    monkeypatch.setattr(inductor_ex, "_compiled", {})
    loads = inductor_ex.stats().artifact_hits
    check(region(body, params), *make_inputs())
    assert inductor_ex.stats().artifact_hits == loads + 1


@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_region_equals_its_eager_calls():
    body, params, make_inputs = REGIONS["matmul_and_views"]
    check(region(body, params), *(t.cuda() for t in make_inputs()))
    check(region(CHAIN, "t0, t1, n"), torch.randn(8, 16, device="cuda"), torch.randn(8, 16, device="cuda"), 0.5)
    assert "cuda" in inductor_ex.stats().startup_s
