"""Python state a traced program reads through the standard library and torch's global flags,
and the standard library's side effects it makes: each program runs compiled and eagerly side by
side over several calls, with the state changed between calls (``core/acquisition/stdlib_state.py``,
``core/state/torch_flags.py``)."""

import argparse
import contextvars
import functools
import itertools
import logging
import os
import sys
import threading
import time
import warnings
from time import perf_counter

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderError

_VAR = "THUNDER_RS_TEST_SCALE"
_PERF_COUNTER = time.perf_counter


def _misses(jf) -> list:
    return thunder_rs.compile_stats(jf).miss_reasons


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv(_VAR, raising=False)
    return monkeypatch


# -- os.environ ------------------------------------------------------------------------------------


def _by_get(x):
    return x * float(os.environ.get(_VAR, "1"))


def _by_getenv(x):
    scale = os.getenv(_VAR)
    return x if scale is None else x * float(scale)


def _by_item(x):
    return x * float(os.environ[_VAR]) if _VAR in os.environ else x - 1


@pytest.mark.parametrize("program", [_by_get, _by_getenv, _by_item])
def test_an_environment_variable_changed_between_calls(env, program):
    jf, x = thunder_rs.jit(program), torch.randn(3)
    for value in (None, "2", "2", "3", None):
        if value is None:
            env.delenv(_VAR, raising=False)
        else:
            env.setenv(_VAR, value)
        torch.testing.assert_close(jf(x), program(x))
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_hits == 2 and stats.cache_misses == 3  # the last call finds the first entry
    assert f"os.environ['{_VAR}'] changed from unset to '2'" in _misses(jf)[1]
    assert "from '2' to '3'" in _misses(jf)[2]


def _counts_prefixed_variables(x):
    return x * sum(1 for name in os.environ if name.startswith(_VAR))


def _by_argv(x):
    return x * 2 if "--thunder-rs-double" in sys.argv else x


def _by_argparse(x):
    parser = argparse.ArgumentParser()
    parser.add_argument("--thunder-rs-scale", type=float, default=1.0)
    return x * parser.parse_known_args()[0].thunder_rs_scale


@pytest.mark.parametrize(
    "program, changes",
    [
        (_counts_prefixed_variables, [lambda: os.environ.__setitem__(_VAR, "1")]),
        (_by_argv, [lambda: sys.argv.append("--thunder-rs-double"), lambda: sys.argv.remove("--thunder-rs-double")]),
        (_by_argparse, [lambda: sys.argv.append("--thunder-rs-scale=3"), lambda: sys.argv.pop()]),
    ],
    ids=["iterating os.environ", "sys.argv", "argparse"],
)
def test_the_names_in_the_environment_and_sys_argv_changed_between_calls(env, monkeypatch, program, changes):
    # Iterating os.environ and reading sys.argv were not guarded: the compiled call kept what
    # tracing saw.
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    jf, x = thunder_rs.jit(program), torch.randn(3)
    torch.testing.assert_close(jf(x), program(x))
    for change in changes:
        change()
        torch.testing.assert_close(jf(x), program(x))
    assert thunder_rs.compile_stats(jf).cache_misses == 2  # the last state is the first's again


def test_a_program_reading_no_state_carries_no_guard():
    jf = thunder_rs.jit(lambda x: x * 2)
    jf(torch.ones(2))
    assert len(thunder_rs._function(jf)._last_entry.guards) == 0


# -- torch's global flags --------------------------------------------------------------------------


def _deterministic(x):
    if torch.are_deterministic_algorithms_enabled():
        return x + 1
    return x - 1


def _cudnn(x):
    return x * 2 if torch.backends.cudnn.deterministic else x * 3


def _tf32(x):
    return x * 2 if torch.backends.cuda.matmul.allow_tf32 else x * 3


def _precision(x):
    return x * 2 if torch.get_float32_matmul_precision() == "highest" else x * 3


def _default_dtype(x):
    return x.to(torch.get_default_dtype())


def _flash(x):
    return x * 2 if torch.backends.cuda.flash_sdp_enabled() else x * 3


def _seeded(x):
    return x * (torch.initial_seed() % 5)


def _autocast_cache(x):
    return x * 2 if torch.is_autocast_cache_enabled() else x * 3


@pytest.mark.parametrize(
    "program, flip, reason",
    [
        (
            _deterministic,
            lambda on: torch.use_deterministic_algorithms(on),
            "torch.are_deterministic_algorithms_enabled()",
        ),
        (_cudnn, lambda on: setattr(torch.backends.cudnn, "deterministic", on), "torch.backends.cudnn.deterministic"),
        (
            _tf32,
            lambda on: setattr(torch.backends.cuda.matmul, "allow_tf32", on),
            "torch.backends.cuda.matmul.allow_tf32",
        ),
        (
            _precision,
            lambda on: torch.set_float32_matmul_precision("highest" if on else "high"),
            "torch.get_float32_matmul_precision()",
        ),
        (_default_dtype, lambda on: torch.set_default_dtype(torch.float64 if on else torch.float32), None),
        (_flash, torch.backends.cuda.enable_flash_sdp, "torch.backends.cuda.flash_sdp_enabled()"),
        (_seeded, lambda on: torch.manual_seed(3 if on else 1), None),
        (_autocast_cache, lambda on: torch.set_autocast_cache_enabled(not on), None),
    ],
)
def test_torch_global_flags_changed_between_calls(program, flip, reason):
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cuda.matmul.allow_tf32,
        torch.get_float32_matmul_precision(),
        torch.get_default_dtype(),
        torch.backends.cuda.flash_sdp_enabled(),
    )
    jf, x = thunder_rs.jit(program), torch.randn(3)
    # torch's own test utilities, once imported by another test, freeze the backend flags.
    with getattr(torch.backends, "__allow_nonbracketed_mutation")():
        try:
            for on in (False, True, True, False):
                flip(on)
                torch.testing.assert_close(jf(x), program(x))
        finally:
            torch.use_deterministic_algorithms(saved[0])
            torch.backends.cudnn.deterministic, torch.backends.cuda.matmul.allow_tf32 = saved[1:3]
            torch.set_float32_matmul_precision(saved[3])
            torch.set_default_dtype(saved[4])
            torch.backends.cuda.enable_flash_sdp(saved[5])
            torch.set_autocast_cache_enabled(True)
    assert thunder_rs.compile_stats(jf).cache_hits >= 1
    if reason is not None:
        assert reason in _misses(jf)[1] and "False to True" in _misses(jf)[1] or "'high" in _misses(jf)[1], _misses(jf)


def _autocast_by_default(x, w):
    with torch.autocast("cpu"):
        return x @ w


def test_the_dtype_an_autocast_inside_defaults_to_is_guarded():
    # torch.autocast("cpu") without a dtype takes torch.get_autocast_dtype("cpu"), which the cache
    # key does not hold while autocast is off: set between calls, the first dtype stayed.
    jf, x, w = thunder_rs.jit(_autocast_by_default), torch.randn(4, 4), torch.randn(4, 4)
    saved = torch.get_autocast_dtype("cpu")
    try:
        for dtype in (torch.bfloat16, torch.float16, torch.float16):
            torch.set_autocast_dtype("cpu", dtype)
            out = jf(x, w)
            assert out.dtype == dtype
            torch.testing.assert_close(out, _autocast_by_default(x, w))
    finally:
        torch.set_autocast_dtype("cpu", saved)
    assert "torch.get_autocast_dtype('cpu')" in _misses(jf)[1]
    assert thunder_rs.compile_stats(jf).cache_misses == 2


def test_a_flag_reader_imported_by_name_is_guarded():
    from torch import are_deterministic_algorithms_enabled as deterministic

    def f(x):
        return x + 1 if deterministic() else x - 1

    jf, x = thunder_rs.jit(f), torch.zeros(2)
    try:
        for on in (False, True):
            torch.use_deterministic_algorithms(on)
            torch.testing.assert_close(jf(x), f(x))
    finally:
        torch.use_deterministic_algorithms(False)
    assert "torch.are_deterministic_algorithms_enabled()" in _misses(jf)[1]


def test_inference_mode_read_by_the_program_is_guarded():
    def f(x):
        return x + 1 if torch.is_inference_mode_enabled() else x - 1

    jf, x = thunder_rs.jit(f), torch.zeros(2)
    with torch.no_grad():  # the same grad mode in the cache key
        torch.testing.assert_close(jf(x), f(x))
    with torch.inference_mode():
        torch.testing.assert_close(jf(x), f(x))
    # Inference mode is in the cache key (``cache.global_key``), which also guards this read.
    assert "inference mode False -> True" in _misses(jf)[1]


# -- logging ---------------------------------------------------------------------------------------

_log = logging.getLogger("thunder_rs_test_program")


def _logs(x):
    y = x * 2
    _log.info("scaled by %d: %s", 2, y)
    if _log.isEnabledFor(logging.DEBUG):
        y = y + 1
    logging.getLogger("thunder_rs_test_program.child").warning("done")
    return y


def _run_logging(caplog, program, x) -> tuple:
    caplog.clear()
    out = program(x)
    return out, [
        (r.name, r.levelname, r.getMessage(), r.funcName, r.lineno)
        for r in caplog.records
        if r.name.startswith("thunder_rs_test_program")
    ]


def test_logging_calls_and_levels_behave_as_in_eager(caplog):
    jf = thunder_rs.jit(_logs)
    try:
        for level in (logging.INFO, logging.INFO, logging.DEBUG, logging.WARNING, logging.INFO):
            _log.setLevel(level)
            x = torch.randn(3)
            (got, got_logs), (want, want_logs) = _run_logging(caplog, jf, x), _run_logging(caplog, _logs, x)
            torch.testing.assert_close(got, want)
            assert got_logs == want_logs and want_logs, (got_logs, want_logs)
    finally:
        _log.setLevel(logging.NOTSET)
    assert "the level of logger 'thunder_rs_test_program'" in _misses(jf)[1]
    # The record names the user's line, with that call's tensor values.
    assert got_logs[0][3] == "_logs" and str(want) in got_logs[0][2]


def _by_level(x):
    return x * _log.getEffectiveLevel() + _log.level


def test_a_logger_level_read_directly_is_guarded():
    jf, x = thunder_rs.jit(_by_level), torch.ones(2)
    try:
        for level in (logging.INFO, logging.INFO, logging.ERROR):
            _log.setLevel(level)
            torch.testing.assert_close(jf(x), _by_level(x))
    finally:
        _log.setLevel(logging.NOTSET)
    assert thunder_rs.compile_stats(jf).cache_misses == 2


def test_a_formatted_tensor_in_a_log_message_is_refused():
    def f(x):
        y = x + 1
        _log.warning(f"y is {y}")
        return y

    with pytest.raises(ThunderError, match=r"logging .*test_stdlib_state.py:\d+ formats a traced tensor"):
        thunder_rs.jit(f)(torch.ones(2))


# -- warnings --------------------------------------------------------------------------------------


def _warns(x, n):
    warnings.warn(f"step {n}: check the input")
    return x + n


def test_warnings_warn_happens_on_every_call_as_in_eager():
    jf, x = thunder_rs.jit(_warns), torch.zeros(2)
    for action in ("always", "default"):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter(action)
            for n in (1, 1, 1):
                jf(x, n)
        with warnings.catch_warnings(record=True) as want:
            warnings.simplefilter(action)
            for n in (1, 1, 1):
                _warns(x, n)
        assert [(str(w.message), w.filename, w.lineno) for w in got] == [
            (str(w.message), w.filename, w.lineno) for w in want
        ]
        assert len(want) == (3 if action == "always" else 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="step 1"):
            jf(x, 1)


def _falls_back_when_warnings_raise(x):
    try:
        warnings.warn("slow path taken")
    except UserWarning:
        return x * 0
    return x + 1


def test_filters_that_make_a_warning_an_error_between_calls_recompile():
    # The warning was made after the compiled call ran: under simplefilter("error") eager took the
    # except branch (x * 0) while the compiled call returned x + 1 and then raised.
    jf, x = thunder_rs.jit(_falls_back_when_warnings_raise), torch.ones(2)
    for action in ("ignore", "error", "always", "error"):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter(action)
            assert torch.equal(jf(x), _falls_back_when_warnings_raise(x))
        assert len(got) == (2 if action == "always" else 0)
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_misses == 2
    assert "whether the warnings filters raise the UserWarning" in stats.miss_reasons[1]


def _deprecated_helper(x):
    warnings.warn("use the other helper", DeprecationWarning, stacklevel=2)
    return x * 2


def _calls_deprecated(x):
    return _deprecated_helper(x) + 1


def test_a_warning_with_a_stacklevel_names_the_callers_line():
    jf, x = thunder_rs.jit(_calls_deprecated), torch.zeros(2)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        jf(x)
        jf(x)
        _calls_deprecated(x)
    assert [w.category for w in got] == [DeprecationWarning] * 3
    assert (
        len({(w.filename, w.lineno) for w in got}) == 1
        and got[0].lineno == _calls_deprecated.__code__.co_firstlineno + 1
    )


def _counts_its_warnings(x):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("inside")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            warnings.warn("raised")
        except UserWarning:
            x = x + 10
    warnings.warn("outside")
    return x * len(caught)


def test_warnings_inside_the_programs_own_catch_warnings_are_made_while_traced():
    # They were recorded to be made after each call, so the program's record list stayed empty
    # and its "error" filter raised nothing while it was traced.
    jf, x = thunder_rs.jit(_counts_its_warnings), torch.ones(2)
    for _ in range(2):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            torch.testing.assert_close(jf(x), _counts_its_warnings(x))
        assert [str(w.message) for w in got] == ["outside", "outside"]


# -- iterators -------------------------------------------------------------------------------------


def test_consuming_an_iterator_passed_in_or_closed_over_is_refused():
    counter = itertools.count()

    def closed(x):
        return x + next(counter)

    def passed(x, it):
        return x + next(it)

    with pytest.raises(ThunderError, match=r"next: the program consumes a count .*test_stdlib_state.py:\d+"):
        thunder_rs.jit(closed)(torch.zeros(2))
    with pytest.raises(ThunderError, match=r"next: the program consumes a generator"):
        thunder_rs.jit(passed)(torch.zeros(2), (i for i in range(3)))


_STEPS = itertools.count()


def _zips_a_global_count(x):
    for i, _ in zip(_STEPS, range(2)):
        x = x + i
    return x


def _loops_over_its_argument(x, it):
    for v in it:
        x = x + v
    return x


@pytest.mark.parametrize(
    "program, arguments, name",
    [
        (_zips_a_global_count, lambda: (), "count '_STEPS'"),
        (_loops_over_its_argument, lambda: (iter([1.0, 2.0]),), "list_iterator 'it'"),
        (_loops_over_its_argument, lambda: (map(float, [1, 2]),), "map 'it'"),
    ],
)
def test_an_iterator_it_did_not_create_consumed_by_a_loop_is_refused(program, arguments, name):
    # Only next() was watched: zip and for loops took the items once, while tracing, and the
    # compiled calls added the first call's numbers again.
    with pytest.raises(ThunderError, match=f"the program consumed the {name} read at"):
        thunder_rs.jit(program)(torch.zeros(2), *arguments())


def _scaled_by_the_clock(x):
    return x * (time.perf_counter() % 1)


def test_reading_the_clock_inside_a_program_is_refused_naming_the_line():
    # The first call's reading was baked into the trace: every later call computed with it.
    with pytest.raises(ThunderError, match=r"time.perf_counter: the program reads the clock at .*test_stdlib_state"):
        thunder_rs.jit(_scaled_by_the_clock)(torch.ones(2))
    assert time.perf_counter is _PERF_COUNTER  # put back after tracing


class _Timer:
    clock = None


_TIMER = _Timer()
_TIMER.clock = time.monotonic


def _clock_bound_in_a_cell():
    clock = time.process_time

    def program(x):
        return x * (clock() % 1)

    return program


def _by_a_clock_bound_as_a_global(x, timed=True):
    return x * (perf_counter() % 1) if timed else x


@pytest.mark.parametrize(
    "program, name",
    [
        (_by_a_clock_bound_as_a_global, "perf_counter"),
        (lambda x: x * (_TIMER.clock() % 1), "monotonic"),
        (_clock_bound_in_a_cell(), "process_time"),
    ],
    ids=["global", "attribute of a global object", "closure cell"],
)
def test_a_clock_bound_before_tracing_is_refused_naming_the_line(program, name):
    # ``from time import perf_counter`` is not looked up in ``time`` while traced: every compiled call
    # computed with the first call's reading.
    with pytest.raises(ThunderError, match=rf"time.{name}: the program reads the clock at .*test_stdlib_state.py:\d+"):
        thunder_rs.jit(program)(torch.ones(2))
    assert perf_counter is _PERF_COUNTER and _TIMER.clock is time.monotonic  # put back after tracing
    assert program.__closure__ is None or program.__closure__[0].cell_contents is time.process_time


class _Timed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.clock = time.perf_counter  # (a clock held as a module's attribute: read from its clone)

    def forward(self, x):
        return x * (self.clock() % 1)


def test_a_clock_held_as_a_modules_attribute_is_refused_naming_the_line():
    # Not replaced in the module's clone: every compiled call computed with the first call's reading.
    module = _Timed()
    with pytest.raises(
        ThunderError, match=r"time.perf_counter: the program reads the clock at .*test_stdlib_state.py:\d+"
    ):
        thunder_rs.jit(module)(torch.ones(2))
    assert module.clock is _PERF_COUNTER and "clock" not in type(module).__dict__


def test_a_clock_bound_but_not_called_is_left_alone():
    jf, x = thunder_rs.jit(functools.partial(_by_a_clock_bound_as_a_global, timed=False)), torch.ones(2)
    assert torch.equal(jf(x), x) and torch.equal(jf(x), x)
    assert thunder_rs.compile_stats(jf).cache_misses == 1 and perf_counter is _PERF_COUNTER


def test_a_generator_passed_in_and_looped_over_is_refused():
    def f(x, gen):
        for v in gen:
            x = x + v
        return x

    with pytest.raises(ThunderError, match=r"consumed the generator 'gen' it was given, at .*test_stdlib_state.py:\d+"):
        thunder_rs.jit(f)(torch.zeros(2), (i for i in range(3)))


def test_an_iterator_the_program_makes_is_consumed_per_call():
    def f(x, sizes):
        it = iter(sizes)
        return x * next(it) + next(it)

    jf, x = thunder_rs.jit(f), torch.ones(2)
    torch.testing.assert_close(jf(x, [2, 3]), f(x, [2, 3]))
    torch.testing.assert_close(jf(x, [4, 5]), f(x, [4, 5]))


# -- closures of callables passed in, and defaults -------------------------------------------------


def test_the_closure_of_a_callable_argument_is_watched():
    def make():
        scale = 2.0

        def fn(t):
            return t * scale

        def set_scale(v):
            nonlocal scale
            scale = v

        return fn, set_scale

    fn, set_scale = make()

    def f(x, g):
        return g(x) + 1

    jf, x = thunder_rs.jit(f), torch.randn(3)
    for v in (2.0, 3.0, 3.0):
        set_scale(v)
        torch.testing.assert_close(jf(x, fn), f(x, fn))
    assert "closure variable 'scale'" in _misses(jf)[1]


def _helper(x, scale=2.0, *, shift=0.0):
    return x * scale + shift


def _calls_helper(x, bias=1.0):
    return _helper(x) + bias


@pytest.mark.parametrize(
    "change",
    [
        lambda: setattr(_calls_helper, "__defaults__", (5.0,)),
        lambda: setattr(_helper, "__defaults__", (3.0,)),
        lambda: _helper.__kwdefaults__.update(shift=1.0),
    ],
)
def test_defaults_of_the_jitted_function_and_of_functions_it_calls_are_watched(change):
    saved = (_calls_helper.__defaults__, _helper.__defaults__, dict(_helper.__kwdefaults__))
    jf, x = thunder_rs.jit(_calls_helper), torch.randn(3)
    try:
        torch.testing.assert_close(jf(x), _calls_helper(x))
        change()
        torch.testing.assert_close(jf(x), _calls_helper(x))
        torch.testing.assert_close(jf(x), _calls_helper(x))
    finally:
        _calls_helper.__defaults__, _helper.__defaults__ = saved[:2]
        _helper.__kwdefaults__ = saved[2]
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_misses == 2 and stats.cache_hits == 1
    assert "the default arguments of" in _misses(jf)[1]


def test_defaults_of_a_partial_and_of_a_method_are_watched():
    class Scaler(torch.nn.Module):
        def forward(self, x, scale=2.0):
            return x * scale

    m = Scaler()
    jm, x = thunder_rs.jit(m), torch.randn(3)
    torch.testing.assert_close(jm(x), m(x))
    Scaler.forward.__defaults__ = (4.0,)
    torch.testing.assert_close(jm(x), m(x))
    jf = thunder_rs.jit(lambda x, g: g(x))
    g = functools.partial(_helper, shift=1.0)
    torch.testing.assert_close(jf(x, g), g(x))


# -- contextvars and threading.local ----------------------------------------------------------------

_SCALE_VAR = contextvars.ContextVar("scale_var", default=1.0)
_PER_THREAD = threading.local()


def test_a_context_variable_set_between_calls_recompiles():
    def f(x):
        return x * _SCALE_VAR.get()

    jf, x = thunder_rs.jit(f), torch.randn(3)
    for scale in (1.0, 3.0, 3.0, 1.0):
        token = _SCALE_VAR.set(scale)
        try:
            torch.testing.assert_close(jf(x), f(x))
        finally:
            _SCALE_VAR.reset(token)
    assert "contextvars.ContextVar 'scale_var'" in _misses(jf)[1]
    assert thunder_rs.compile_stats(jf).cache_misses == 2


def test_a_thread_local_read_in_another_thread_is_that_threads_value():
    def f(x):
        return x * _PER_THREAD.scale

    jf, x, found = thunder_rs.jit(f), torch.randn(3), {}
    _PER_THREAD.scale = 1.0
    torch.testing.assert_close(jf(x), f(x))

    def other():
        _PER_THREAD.scale = 7.0
        found["jit"], found["eager"] = jf(x), f(x)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    torch.testing.assert_close(found["jit"], found["eager"])
    torch.testing.assert_close(jf(x), f(x))


def _scaled_by_default(x, scales=[1.0], *, shifts={"by": 0.0}):  # noqa: B006 (the defaults are the state)
    return x * scales[0] + shifts["by"]


def _counts_in_its_default(x, memo=[]):  # noqa: B006
    memo.append(1)
    return x * len(memo)


def test_a_list_or_dict_among_the_defaults_changed_in_place_recompiles_and_one_the_program_changes_is_refused():
    # The identity of __defaults__ held while its list changed: the first call's item stayed.
    scales, shifts = _scaled_by_default.__defaults__[0], _scaled_by_default.__kwdefaults__["shifts"]
    jf, x = thunder_rs.jit(_scaled_by_default), torch.randn(3)
    try:
        for scale, shift in ((1.0, 0.0), (3.0, 0.0), (3.0, 2.0)):
            scales[0], shifts["by"] = scale, shift
            torch.testing.assert_close(jf(x), _scaled_by_default(x))
    finally:
        scales[0], shifts["by"] = 1.0, 0.0
    assert "_scaled_by_default.__defaults__[0] changed from [1.0] to [3.0]" in _misses(jf)[1]
    with pytest.raises(ThunderError, match=r"_counts_in_its_default.__defaults__\[0\] changed from \[\] to \[1\]"):
        thunder_rs.jit(_counts_in_its_default)(x)
