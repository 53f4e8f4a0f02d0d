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
import test_ops
from test_training import assert_nanogpt_trains_like_eager
import gpt  # examples/, on the path test_training sets

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


# -- end to end: jit(fn, executors=["inductor"]) ---------------------------------------------------


def _half_chain(x, y, z):
    """Ops whose float32 results eager rounds to x's dtype one by one, a float32 result of a
    rounded product, and Python numbers, which eager's kernels read in float32 as the second
    operand (and on the CPU in x's dtype as the first: ``0.7 - ...``). Inductor's fused kernel
    keeps the results in float32 unless it emulates the casts, and then rounds the numbers."""
    return ((x * y + z) * 1.1 - x) / (z.abs() + 1), (x * y).float() + 1, (0.7 - x * 0.3) / 3.3


def _check_half_precision_regions_round_as_eager(device, program=_half_chain):
    """The region equals eager bit for bit in bfloat16 and float16 though the process's Inductor
    setting says not to emulate eager's casts: the policy is the executor's own, and the process's
    setting is left as it was. Without it, a third of the elements differ; with it but with the
    numbers as Inductor reads them, one in seven."""
    from torch._inductor import config  # noqa: PLC0415 (Inductor is imported by the executor anyway)

    jfn = thunder_rs.jit(program, executors=["inductor"])
    torch.manual_seed(0)
    with config.patch(emulate_precision_casts=False):
        for dtype in (torch.bfloat16, torch.float16):
            x, y, z = (torch.randn(1000, dtype=dtype, device=device) for _ in range(3))
            for actual, expected in zip(jfn(x, y, z), program(x, y, z)):
                assert actual.dtype == expected.dtype and torch.equal(actual, expected), (dtype, actual - expected)
        assert config.emulate_precision_casts is False
    assert [r.name for r in thunder_rs.last_traces(jfn)[-1].regions()] == ["inductor_fusion0"]


def test_half_precision_regions_round_each_op_as_eager(one_thread):
    _check_half_precision_regions_round_as_eager("cpu")


@pytest.mark.gpu
def test_on_cuda_half_precision_regions_round_each_op_as_eager():
    # Multiplies and adds only: CUDA's and Triton's division (eager's multiplies by a number's
    # reciprocal) and transcendental functions are not bit for bit the same in float32.
    _check_half_precision_regions_round_as_eager(
        "cuda", lambda x, y, z: ((x * y + z) * 1.1 - x, (x * y).float() + 1, 0.7 - x * 0.3)
    )


def _chain(x, y):
    a = torch.sin(x) * y + 1.0
    b = torch.tanh(a) - torch.exp(-a)
    return (b * b).sum(dim=-1), torch.softmax(b, -1) @ y.t()


def test_jit_with_inductor_runs_regions_compiled_by_inductor_with_eagers_outputs_and_gradients(one_thread):
    jfn = thunder_rs.jit(_chain, executors=["inductor"])
    x, y = torch.randn(8, 16, requires_grad=True), torch.randn(8, 16, requires_grad=True)
    xe, ye = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    before = inductor_ex.stats().misses
    out, ref = jfn(x, y), _chain(xe, ye)
    assert_same(tuple(out), tuple(t.detach() for t in ref))
    cotangents = [torch.randn_like(r) for r in ref]
    torch.autograd.backward(out, cotangents)
    torch.autograd.backward(ref, cotangents)
    torch.testing.assert_close((x.grad, y.grad), (xe.grad, ye.grad))
    # One region each way, matmuls and views inside, compiled once each.
    for trace in (thunder_rs.last_traces(jfn)[-1], thunder_rs.last_backward_traces(jfn)[-1]):
        assert [region.name for region in trace.regions()] == ["inductor_fusion0"]
    assert inductor_ex.stats().misses == before + 2
    jfn(x, y)
    assert inductor_ex.stats().misses == before + 2


def test_repeated_layers_make_regions_with_one_key(monkeypatch):
    """Regions end at the attention kernel (left to the torch executor), so a GPT's regions are
    embeddings and the first layer's attention inputs; one layer's attention output, MLP and the
    next layer's attention inputs (once per pair of layers, all with one key: compiled once);
    and the last layer's rest with the head (backward, the same in reverse). The MLP's gelu is
    inside (``inductor_claims.gelu_as_eager``: eager's NaN at +inf where oneDNN computes it).
    Values are renamed in the key, so equal layers give equal keys."""
    monkeypatch.setattr(inductor_ex.InductorExecutor, "fuse", lambda self, region: region.function)
    model = gpt.GPT(gpt.GPTConfig(n_layer=4), seed=0)
    idx = gpt.random_tokens(model.config, 2, 32)
    jmodel = thunder_rs.jit(model, executors=["inductor"])
    jmodel(idx, idx)[1].backward()
    keys = [region.key for region in thunder_rs.last_backward_traces(jmodel)[-1].regions()]
    assert len(keys) == 5 and len(set(keys[1:4])) == 1 and len(set(keys)) == 3
    keys = [region.key for region in thunder_rs.last_traces(jmodel)[-1].regions()]
    assert len(keys) == 5 and len(set(keys[1:4])) == 1 and len(set(keys)) == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    "dtype,explicit_attention",
    [
        (torch.float32, False),
        (torch.float32, True),
        (torch.float64, False),
    ],
    ids=["float32-sdpa", "float32-masked_softmax", "float64-sdpa"],
)
def test_nanogpt_adamw_training_with_inductor_matches_eager(dtype, explicit_attention, one_thread):
    assert_nanogpt_trains_like_eager(dtype, explicit_attention, executors=["inductor"])


# -- OpInfo gradients (tests/test_ops.py's samples) through Inductor regions -----------------------


def _scaled(value):
    """``value`` with its floating tensors multiplied by 1 (exactly themselves)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value * 1.0
    if isinstance(value, (list, tuple)):
        return type(value)(_scaled(v) for v in value)
    return value


def _in_a_region(op):
    """``op`` called on its inputs times 1: the partitioner leaves a single op to the torch
    executor, so alone the op would not reach Inductor; with its inputs' products it makes a
    region forward, and its gradient with theirs one backward."""

    def fn(*args, **kwargs):
        return op(*_scaled(args), **{k: _scaled(v) for k, v in kwargs.items()})

    return fn


#: The default run's cases of the sweep below; ``--run-slow`` runs every float64 sample.
DEFAULT_GRAD_CASES = ("layer_norm-sample0-float64", "cross_entropy-sample0-float64")


def pytest_generate_tests(metafunc):
    """The OpInfo gradient sweep's parameters for the run: a default run makes only its own
    cases, not 4,600 to skip."""
    if metafunc.function.__name__ == "test_op_grad_through_inductor_matches_eager":
        full = metafunc.config.getoption("--run-slow")
        params = [p for p in test_ops.grad_params(full=True) if full or p.id in DEFAULT_GRAD_CASES]
        metafunc.parametrize(("op", "index"), params)


def test_op_grad_through_inductor_matches_eager(op, index):
    sample = test_ops.sample_at(op, torch.float64, "cpu", index)
    try:
        expected = test_ops.grads(op, sample, op.op)
    except RuntimeError as e:
        pytest.skip(f"eager refuses inputs that require grad here: {e}")
    inputs = test_ops.tensors_of([sample.args, list(sample.kwargs.values())])
    if not all(t.isfinite().all() for t in inputs if t.is_floating_point()):
        pytest.skip("non-finite inputs: gradients there are conventions, not calculus")
    if not all(g.isfinite().all() for g in test_ops.tensors_of([expected])):
        pytest.skip("eager's own gradient is not finite here")
    actual = test_ops.grads(op, sample, thunder_rs.jit(_in_a_region(op.op), executors=["inductor"]))
    test_ops.assert_same(actual, expected, op.tolerance(torch.float64), sample)


@pytest.mark.inductor
def test_reset_forgets_the_compiled_regions_of_the_process():
    x = torch.randn(8, 8)

    def fn(a):
        return (a.sin() * 2 + 1).exp().tanh()

    jf = thunder_rs.jit(fn, executors=["inductor"])
    torch.testing.assert_close(jf(x), fn(x))
    assert inductor_ex._compiled
    thunder_rs.reset()
    assert not inductor_ex._compiled
    torch.testing.assert_close(jf(x), fn(x))
    assert inductor_ex._compiled and thunder_rs.cache_misses(jf) == 2


@pytest.mark.inductor
@pytest.mark.parametrize("dims", [2, 3])
def test_avg_pool_gradient_with_overhanging_ceil_mode_windows_equals_eager(dims, one_thread):
    """Inductor's avg_pool backward divides windows that ceil_mode lets overhang by the whole
    kernel (pytorch/pytorch#198119); that backward stays with the torch executor."""
    pool = torch.nn.functional.avg_pool2d if dims == 2 else torch.nn.functional.avg_pool3d

    def fn(x):
        return pool(x * 2.0, 3, 2, 0, True).exp()

    x = torch.randn(2, 3, *(9, 8, 7)[:dims], dtype=torch.float64, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    out, ref = thunder_rs.jit(fn, executors=["inductor"])(x), fn(xe)
    cotangent = torch.randn_like(ref)
    out.backward(cotangent)
    ref.backward(cotangent)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, xe.grad)


@pytest.mark.inductor
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsample_gradient_with_a_scale_factor_that_is_not_the_sizes_ratio_equals_eager(mode, one_thread):
    """Inductor's upsample backward maps indices by the sizes' ratio, eager by the scale factor."""

    def fn(x):
        return torch.nn.functional.interpolate(x * 2.0, scale_factor=1.7, mode=mode).exp()

    x = torch.randn(2, 3, 7, 5, dtype=torch.float64, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    out, ref = thunder_rs.jit(fn, executors=["inductor"])(x), fn(xe)
    cotangent = torch.randn_like(ref)
    out.backward(cotangent)
    ref.backward(cotangent)
    torch.testing.assert_close(x.grad, xe.grad)


@pytest.mark.inductor
def test_convolution_gradient_of_an_empty_batch_equals_eager(one_thread):
    def fn(x, w, b):
        return torch.nn.functional.conv2d(x * 2.0, w * 1.0, b).sin()

    args = [
        torch.randn(0, 3, 5, 5, dtype=torch.float64),
        torch.randn(4, 3, 3, 3, dtype=torch.float64),
        torch.randn(4, dtype=torch.float64),
    ]
    args = [a.requires_grad_() for a in args]
    expected = torch.autograd.grad(fn(*args).sum(), args)
    actual = torch.autograd.grad(thunder_rs.jit(fn, executors=["inductor"])(*args).sum(), args)
    torch.testing.assert_close(actual, expected)


def _masked_view_sum(x, w):
    t = x.shape[1]
    mask = torch.ones(t, t, device=x.device).tril()
    y = (x.exp() * 2).view(x.shape[0], t, 2, -1).sum(2) + mask[:t, :4]
    return (y.softmax(-1) @ w).sum()


def test_a_region_with_symbolic_sizes_compiles_once_for_every_length(device="cpu"):
    """The symbolic compile's regions compile with their sizes symbolic: one Inductor compile
    (per region) serves every later length where its guards hold, outputs and gradients equal to
    eager; a region that reads a size in its parameters (a view to ``(B, T, 2, -1)``, a ``T x T``
    mask, a backward's broadcast) takes the size as an input."""
    fn = _masked_view_sum
    jf = thunder_rs.jit(fn, executors=["inductor"])
    w = torch.randn(4, 4, device=device, requires_grad=True)
    before = inductor_ex.stats()
    for n in [4, 6, 9, 12, 5, 16]:
        x = torch.randn(3, n, 8, device=device, requires_grad=True)
        actual, expected = jf(x, w), fn(x, w)
        torch.testing.assert_close(actual, expected)
        for a, e in zip(torch.autograd.grad(actual, (x, w)), torch.autograd.grad(expected, (x, w))):
            torch.testing.assert_close(a, e)
    assert thunder_rs.compile_stats(jf).cache_misses == 2
    assert thunder_rs.last_traces(jf)[-1].regions()
    after = inductor_ex.stats()
    # the static compile's forward and backward regions, then the symbolic ones: four compiles
    # for six lengths, the other lengths served by the symbolic compiles
    assert (after.misses - before.misses, after.failures - before.failures) == (4, 0)
    assert after.symbolic_reuses - before.symbolic_reuses == 8
    assert jf._dynamic_off is None


@pytest.mark.gpu
@pytest.mark.slow
def test_on_cuda_a_region_with_symbolic_sizes_compiles_once_for_every_length():
    """The same with Triton kernels: Inductor's dynamic-shape CUDA code for the symbolic regions."""
    test_a_region_with_symbolic_sizes_compiles_once_for_every_length(device="cuda")


def test_a_symbolic_artifact_serves_only_sizes_its_guards_hold_for():
    """What tracing and Inductor assumed of the symbolic sizes (equal sizes, a size input among
    them, sharing a symbol; 0 and 1 kept apart; ranges) is checked before an artifact serves a
    call; a float is an input of the graph (``inductor_floats``): any value serves."""
    from torch._inductor.decomposition import select_decomp_table

    from thunder_rs.executors.inductor_ex import _inductor
    from thunder_rs.executors.inductor_symbolic import compile_symbolic

    def region(x, y, n, scale):
        return ((x + y) * scale).sum(0) * n, x.exp()

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    shapes = (("T", 8), ("T", 8), "T", None)
    make_fx, compile_graph = _inductor()
    artifact = compile_symbolic(region, [x, y, 4, 2.0], shapes, make_fx, compile_graph, select_decomp_table())
    for n, m, size, scale, serves in [
        (6, 6, 6, 2.0, True),
        (9, 9, 9, 2.0, True),
        (6, 5, 6, 2.0, False),  # the sizes shared a symbol
        (6, 6, 5, 2.0, False),  # the size input shared the dim's symbol (equal sizes do)
        (1, 1, 1, 2.0, False),  # 1 is kept apart
        (6, 6, 6, 3.0, True),  # another float
    ]:
        args = [torch.randn(n, 8), torch.randn(m, 8), size, scale]
        assert artifact.serves(args) is serves, (n, m, size, scale)
        if serves:
            for a, e in zip(artifact.run(args), region(*args)):
                torch.testing.assert_close(a, e)
