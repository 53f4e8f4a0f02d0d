"""Robustness against eager PyTorch: traced ops on worker threads, profilers, odd implementation
names, Ctrl-C and checker errors during a first call, compiles on many threads, bounded miss
reasons, a jitted module's names, and the gradient of a full max/min over NaN and ties."""

import contextvars
import copy
import cProfile
import subprocess
import sys
import textwrap
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import thunder_rs
from thunder_rs.core.lang.recorder import GRAD_RULES
from thunder_rs.errors import ThunderRuntimeError
from thunder_rs.executors import FusionExecutor, add_operator_executor, deregister_executor
from thunder_rs.executors.torch_ex import torch_ex
from thunder_rs.torch import tanh as ltorch_tanh

# -- traced ops on worker threads that carry the caller's context ---------------------------------


def _in_worker(fn, *args):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(contextvars.copy_context().run, fn, *args).result()


def _block(t):
    for _ in range(5):
        t = torch.nn.functional.softmax(t * 1.5, -1) + torch.nn.functional.gelu(t).sin()
    return t


def _rows_in_parallel(x):
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(contextvars.copy_context().run, _block, x[i]) for i in range(x.shape[0])]
        return torch.stack([f.result() for f in futures])


def test_a_traced_op_on_a_worker_thread_computes_as_eager():
    def f(x):
        return _in_worker(torch.sin, x) * 2

    x = torch.randn(4)
    jf = thunder_rs.jit(f)
    for _ in range(2):
        torch.testing.assert_close(jf(x), f(x))


def test_workers_tracing_at_once_each_record_their_own_calls():
    # Composite calls of several threads interleave; each thread's prims belong to its own.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        x = torch.randn(8, 16, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        out = thunder_rs.jit(_rows_in_parallel)(x)
        expected = _rows_in_parallel(x_eager)
    finally:
        sys.setswitchinterval(switch)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, x_eager.grad)


# -- a first call under a profiler --------------------------------------------------------------


def test_a_first_call_while_a_profiler_holds_the_threads_hook_computes_as_eager():
    # A fresh thread: one that compiled before keeps its observer hook, which hid the failure.
    def f(x):
        return torch.zeros(3) + x.sin() * 2

    x, results = torch.randn(2, 3), []

    def profiled():
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the warning that guards are found statically
                results.append(thunder_rs.jit(f)(x))
        finally:
            profiler.disable()

    worker = threading.Thread(target=profiled)
    worker.start()
    worker.join()
    assert len(results) == 1
    torch.testing.assert_close(results[0], f(x))


@pytest.mark.slow  # about 20 s: the profiler slows importing torch tenfold
def test_a_first_call_under_cprofile_computes_as_eager(tmp_path):
    script = tmp_path / "profiled.py"
    script.write_text(
        textwrap.dedent("""
        import warnings
        import torch
        import thunder_rs
        warnings.simplefilter("ignore")

        def f(x):
            return torch.zeros(3) + x.sin() * 2

        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.GELU())
        x = torch.randn(2, 3)
        torch.testing.assert_close(thunder_rs.jit(f)(x), f(x))
        torch.testing.assert_close(thunder_rs.jit(model)(x), model(x))
        print("same as eager")
    """)
    )
    run = subprocess.run(
        [sys.executable, "-m", "cProfile", "-s", "time", str(script)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "same as eager" in run.stdout


# -- implementation names generated code cannot take as they are --------------------------------


def test_lambdas_and_names_that_are_no_identifiers_run_their_own_implementation():
    ex = add_operator_executor(
        "my-ex",
        {
            "torch.sin": ("my sin", None, lambda x: torch.sin(x) + 1),
            "torch.cos": (None, None, lambda x: torch.cos(x) + 2),  # named my-ex_<lambda>
            "torch.tanh": (None, None, lambda x: torch.tanh(x) + 3),  # the same name again
            "torch.exp": ("t0", None, lambda x: torch.exp(x) + 4),  # a value's name in generated code
            "torch.abs": ("torch", None, lambda x: torch.abs(x) + 5),
            "torch.neg": ("if", None, lambda x: torch.neg(x) + 6),
            "torch.sigmoid": ("1st", None, lambda x: torch.sigmoid(x) + 7),
        },
    )
    try:

        def f(x):
            return (
                torch.sin(x) * torch.cos(x)
                - torch.tanh(x)
                + torch.exp(x) * torch.abs(x)
                - torch.neg(x)
                + torch.sigmoid(x)
            )

        x = torch.randn(5)
        expected = (
            (torch.sin(x) + 1) * (torch.cos(x) + 2)
            - (torch.tanh(x) + 3)
            + (torch.exp(x) + 4) * (torch.abs(x) + 5)
            - (torch.neg(x) + 6)
            + (torch.sigmoid(x) + 7)
        )
        torch.testing.assert_close(thunder_rs.jit(f)(x), expected)
    finally:
        deregister_executor(ex)


class _Fuser(FusionExecutor):
    def __init__(self, name: str):
        super().__init__(name)
        self.take_from(torch_ex)

    def fuse(self, region):
        return region.function


def test_a_fusion_executor_whose_name_is_no_identifier_names_its_regions_as_code_can():
    def f(x):
        return (torch.sin(x) * 2 + 1).tanh()

    x = torch.randn(6)
    jf = thunder_rs.jit(f, executors=[_Fuser("my-fuser"), _Fuser("my fuser")])
    torch.testing.assert_close(jf(x), f(x))
    assert "my_fuser_fusion0" in str(thunder_rs.last_traces(jf)[-1])


# -- Ctrl-C and errors in the hooks of a first call ---------------------------------------------


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _assert_interrupt_leaves_nothing(jf, x):
    """A KeyboardInterrupt while ``jf`` compiles reaches the caller as it is; the cache stays empty."""
    grad_mode = torch.is_grad_enabled()
    with pytest.raises(KeyboardInterrupt):
        jf(x)
    assert torch.is_grad_enabled() == grad_mode
    stats = thunder_rs.compile_stats(jf)
    assert (stats.cache_misses, stats.cache_hits) == (0, 0)


def test_ctrl_c_in_a_checker_stays_keyboard_interrupt_and_other_errors_chain():
    x = torch.randn(3)
    for checker, expected in ((_interrupt, KeyboardInterrupt), (lambda a: 1 / 0, ThunderRuntimeError)):
        ex = add_operator_executor("checked", {"torch.sin": ("checked_sin", checker, torch.sin)})
        try:
            jf = thunder_rs.jit(lambda t: torch.sin(t) + 1)
            with pytest.raises(expected) as raised:
                jf(x)
            if expected is ThunderRuntimeError:
                assert isinstance(raised.value.__cause__, ZeroDivisionError)
                assert "checker failed" in str(raised.value)
            assert thunder_rs.compile_stats(jf).cache_misses == 0
        finally:
            deregister_executor(ex)
        torch.testing.assert_close(jf(x), torch.sin(x) + 1)  # the cache was left as it was


def test_ctrl_c_in_fuse_a_grad_rule_a_hook_or_the_first_run_stays_keyboard_interrupt(monkeypatch):
    x = torch.randn(4, 3, requires_grad=True)

    fuser = _Fuser("interrupted")
    monkeypatch.setattr(fuser, "fuse", _interrupt)
    jf = thunder_rs.jit(lambda t: (t.sin() * 2).cos(), executors=[fuser])
    _assert_interrupt_leaves_nothing(jf, x)

    monkeypatch.setitem(GRAD_RULES, ltorch_tanh.symbol_id, _interrupt)
    _assert_interrupt_leaves_nothing(thunder_rs.jit(lambda t: torch.tanh(t) * 2), x)
    monkeypatch.undo()

    model = torch.nn.Linear(3, 2)
    model.register_forward_pre_hook(_interrupt)
    _assert_interrupt_leaves_nothing(thunder_rs.jit(model), x)

    ex = add_operator_executor("interrupting", {"torch.cos": ("interrupting_cos", None, _interrupt)})
    try:
        jf = thunder_rs.jit(lambda t: torch.cos(t) + 1)
        with pytest.raises(KeyboardInterrupt):
            jf(x)
    finally:
        deregister_executor(ex)


# -- first calls on many threads ----------------------------------------------------------------


def _custom_scale(i: int):
    """A custom op thunder_rs has no symbol for: its first trace registers a fallback."""

    @torch.library.custom_op(f"thunder_rs_robustness::scale{i}", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * (i + 1)

    scale.register_fake(lambda x: torch.empty_like(x))
    return scale


def test_first_calls_of_different_functions_on_many_threads_compute_as_eager():
    # Each first call registers a fallback (writing the torch executor's table) while other
    # threads build their executor tables from it.
    def program(op):
        return lambda x: op(x).sin() + 1

    programs = [program(_custom_scale(i)) for i in range(48)]
    x = torch.rand(4)
    failures: list = []

    def compile_each(fns):
        for fn in fns:
            try:
                torch.testing.assert_close(thunder_rs.jit(fn)(x), fn(x))
            except Exception as e:  # noqa: BLE001 (collected, reported by the test)
                failures.append(repr(e))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=compile_each, args=(programs[k::8],)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert failures == []


# -- miss reasons are bounded -------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*recompiled")
def test_miss_reasons_keep_the_most_recent_as_many_as_the_cache_holds():
    jf = thunder_rs.jit(lambda x, n: x * n, cache=4, dynamic=False)
    x = torch.randn(2)
    kept = thunder_rs.compile_stats(jf).reasons_kept
    for n in range(kept + 12):
        jf(x, float(n))  # (not dynamic: each number a compile of its own)
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_misses == kept + 12
    assert len(stats.miss_reasons) == kept
    assert str(kept + 10) in stats.miss_reasons[-1]


# -- a jitted module's names are eager's --------------------------------------------------------


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.scale = torch.nn.Parameter(torch.tensor(2.0))
        self.register_buffer("offset", torch.ones(2))

    def forward(self, x):
        return self.lin(x) * self.scale + self.offset


def _names(pairs) -> list:
    return [name for name, _ in pairs]


def test_a_jitted_module_names_parameters_and_buffers_as_eager():
    model = _Scaled()
    jm = thunder_rs.jit(model)
    for recurse in (True, False):
        assert _names(jm.named_parameters(recurse=recurse)) == _names(model.named_parameters(recurse=recurse))
        assert _names(jm.named_buffers(recurse=recurse)) == _names(model.named_buffers(recurse=recurse))
    assert _names(jm.named_parameters(prefix="m")) == _names(model.named_parameters(prefix="m"))
    assert list(jm.state_dict()) == list(model.state_dict())
    bigger, bigger_jitted = (
        torch.nn.Sequential(torch.nn.Linear(3, 3), model),
        torch.nn.Sequential(torch.nn.Linear(3, 3), jm),
    )
    assert _names(bigger_jitted.named_parameters()) == _names(bigger.named_parameters())
    assert _names(bigger_jitted.named_buffers()) == _names(bigger.named_buffers())
    assert [p for p in jm.parameters()] == [p for p in model.parameters()]


def test_functional_call_of_a_jitted_module_computes_as_eager():
    model = _Scaled()
    jm = thunder_rs.jit(copy.deepcopy(model))
    x = torch.randn(4, 3)
    params = {name: (p * 2).detach().requires_grad_() for name, p in model.named_parameters()}
    tensors = {**params, "offset": torch.full((2,), 3.0)}
    for strict in (False, True):
        out = torch.func.functional_call(jm, tensors, (x,), strict=strict)
        expected = torch.func.functional_call(model, tensors, (x,), strict=strict)
        torch.testing.assert_close(out, expected)
        grads = torch.autograd.grad(out.sum(), list(params.values()))
        torch.testing.assert_close(grads, torch.autograd.grad(expected.sum(), list(params.values())))
    torch.testing.assert_close(jm(x), model(x))  # its own tensors again
    assert isinstance(jm.scale, torch.nn.Parameter)


# -- a full max/min's gradient over NaN and ties ------------------------------------------------

NAN = float("nan")
_EXTREMA = {
    "max": lambda x: x.max(),
    "min": lambda x: x.min(),
    "amax": lambda x: x.amax(),
    "amin": lambda x: x.amin(),
    "amax_dim": lambda x: x.amax(-1),
    "amin_dim_keepdim": lambda x: x.amin(0, keepdim=True),
    "max_dim": lambda x: x.max(-1).values,
    "min_dim": lambda x: x.min(0).values,
    "torch.max": lambda x: torch.max(x),
    "elementwise": lambda x: torch.max(x, x.flip(-1)),
}
_VALUES = {
    "nan": [[1.0, NAN, 3.0], [2.0, 5.0, 5.0]],
    "two_nans": [[NAN, 1.0, NAN], [4.0, 4.0, NAN]],
    "ties": [[3.0, 1.0, 5.0], [5.0, 5.0, -1.0]],
    "plain": [[3.0, 1.0, 2.0], [0.5, 4.0, -1.0]],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("values", list(_VALUES), ids=str)
@pytest.mark.parametrize("op", list(_EXTREMA), ids=str)
def test_extremum_gradient_goes_where_eager_sends_it(op, values, dtype):
    fn = _EXTREMA[op]
    x = torch.tensor(_VALUES[values], dtype=dtype, requires_grad=True)
    x_eager = x.detach().clone().requires_grad_()
    out, expected = thunder_rs.jit(fn)(x), fn(x_eager)
    torch.testing.assert_close(out, expected, equal_nan=True)
    cotangent = torch.rand_like(expected) + 0.5
    (grad,) = torch.autograd.grad(out, x, cotangent)
    (expected_grad,) = torch.autograd.grad(expected, x_eager, cotangent)
    torch.testing.assert_close(grad, expected_grad, equal_nan=True)
