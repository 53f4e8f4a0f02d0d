"""thunder_rs's records through Python's ``logging``: recompiles with their reason, eager
fallbacks with the user's line, compile stage times; ``THUNDER_RS_LOG`` and ``set_logs``."""

import logging
import os
import subprocess
import sys
import warnings

import pytest
import thunder_rs
import torch
from custom_ops import running_sum
from thunder_rs.core.base import logs
from thunder_rs.errors import ThunderValueError

_HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def logs_off():
    thunder_rs.set_logs()
    yield
    thunder_rs.set_logs()


def _messages(caplog, name):
    return [r.getMessage() for r in caplog.records if r.name == name]


def test_recompiles_are_logged_with_their_reason(caplog):
    def scaled(x, s):
        return x * s

    thunder_rs.set_logs(recompiles=True)
    jf = thunder_rs.jit(scaled)
    with caplog.at_level(logging.INFO, logger="thunder_rs"):
        jf(torch.ones(2), 2.0)
        jf(torch.ones(2), 2.0)  # a hit: no record
        jf(torch.ones(3), 2.0)
    assert _messages(caplog, "thunder_rs.recompiles") == [
        "test_recompiles_are_logged_with_their_reason.<locals>.scaled compiled: first call",
        (
            "test_recompiles_are_logged_with_their_reason.<locals>.scaled recompiled (compilation 2): "
            "x: shape torch.Size([2]) -> torch.Size([3])"
        ),
    ]
    assert caplog.records[0].levelno == logging.INFO


def test_fallbacks_are_logged_with_the_user_line(caplog):
    def f(a):
        return running_sum(a) * 2  # the fallback's line

    thunder_rs.set_logs(fallbacks=True)
    a = torch.randn(4)
    with caplog.at_level(logging.INFO, logger="thunder_rs"):
        torch.testing.assert_close(thunder_rs.jit(f)(a), f(a))
    line = f.__code__.co_firstlineno + 1
    assert _messages(caplog, "thunder_rs.fallbacks") == [
        "torch._ops.thunder_rs_tests.running_sum.default runs eagerly (no thunder_rs decomposition) at "
        f"{__file__}:{line}"
    ]


def test_compile_stage_times_are_logged(caplog):
    thunder_rs.set_logs(passes=True)
    jf = thunder_rs.jit(lambda x: (x + 1).sin())
    with caplog.at_level(logging.INFO, logger="thunder_rs"):
        jf(torch.randn(3))
    (message,) = _messages(caplog, "thunder_rs.passes")
    stats = thunder_rs.compile_stats(jf)
    for stage in stats.stage_s:
        assert f" {stage} " in message
    assert "acquire" in message and "pass:cse" in message


def test_nothing_is_recorded_unless_turned_on(caplog):
    jf = thunder_rs.jit(lambda a: running_sum(a) + 1)
    with caplog.at_level(logging.WARNING):
        jf(torch.randn(3))
    assert not [r for r in caplog.records if r.name.startswith("thunder_rs")]


def test_users_configure_the_loggers_themselves(caplog):
    # No switch: a user's own level on the loggers is enough.
    jf = thunder_rs.jit(lambda a: running_sum(a) + 1)
    with caplog.at_level(logging.INFO, logger="thunder_rs.fallbacks"):
        jf(torch.randn(3))
    assert len(_messages(caplog, "thunder_rs.fallbacks")) == 1
    assert not _messages(caplog, "thunder_rs.recompiles")


def test_set_logs_off_again(caplog):
    thunder_rs.set_logs(all=True, passes=False)
    assert logs.recompiles_logger.level == logging.INFO and logs.passes_logger.level == logging.NOTSET
    thunder_rs.set_logs()
    assert all(log.level == logging.NOTSET for log in logs.LOG_NAMES.values())
    assert logs._handler not in logging.getLogger("thunder_rs").handlers


def test_set_logs_rejects_a_non_level():
    with pytest.raises(ThunderValueError, match="recompiles"):
        thunder_rs.set_logs(recompiles="yes")


def test_unknown_log_names_list_the_valid_ones():
    with pytest.raises(
        ThunderValueError, match="unknown log name 'recompile'; valid names: all, recompiles, fallbacks, passes"
    ):
        logs.parse_log_setting("recompile,passes")
    assert logs.parse_log_setting(" recompiles, passes ") == {"recompiles": True, "passes": True}


_PROGRAM = """
import torch, thunder_rs
from custom_ops import running_sum
jf = thunder_rs.jit(lambda x: running_sum(x) * 2)
jf(torch.ones(2)); jf(torch.ones(2)); jf(torch.ones(3))
print("done")
"""


def _run(env_value):
    env = {**os.environ, "PYTHONPATH": _HERE}
    env.pop("THUNDER_RS_LOG", None)
    if env_value is not None:
        env["THUNDER_RS_LOG"] = env_value
    return subprocess.run(
        [sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_environment_switch_prints_to_stderr():
    result = _run("recompiles,fallbacks")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    lines = result.stderr.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("[thunder_rs.recompiles]")] == [
        "[thunder_rs.recompiles] <lambda> compiled",
        "[thunder_rs.recompiles] <lambda> recompiled (compilation 2)",
    ]
    assert sum(line.startswith("[thunder_rs.fallbacks]") for line in lines) == 2
    assert not any(line.startswith("[thunder_rs.passes]") for line in lines)


def test_without_the_switch_nothing_is_printed():
    result = _run(None)
    assert result.returncode == 0 and result.stderr == ""


def test_an_unknown_name_in_the_switch_is_an_error():
    result = _run("recompiles,bogus")
    assert result.returncode != 0
    assert "unknown log name 'bogus'; valid names: all, recompiles, fallbacks, passes" in result.stderr


def test_the_installed_handler_writes_to_the_current_stderr(capsys):
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()  # as in a program that configured no logging (pytest adds its own)
    try:
        thunder_rs.set_logs(recompiles=True)
        thunder_rs.jit(lambda x: x + 1)(torch.ones(2))
    finally:
        thunder_rs.set_logs()
        root.handlers[:] = saved
    assert "<lambda> compiled: first call" in capsys.readouterr().err


def test_the_recompile_warning_points_at_the_calling_line():
    def f(x, scale):
        return x * scale

    jf = thunder_rs.jit(f, dynamic=False)  # a compile per float
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for s in range(8):
            line = sys._getframe().f_lineno + 1
            jf(torch.ones(1), float(s))
    (warning,) = [w for w in record if "recompiled" in str(w.message)]
    assert (warning.filename, warning.lineno) == (__file__, line)


def test_the_recompile_warning_points_at_the_module_call_line():
    lin = torch.nn.Linear(2, 2)
    jm = thunder_rs.jit(lin, dynamic=False)  # a compile per batch size
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for n in range(1, 9):
            line = sys._getframe().f_lineno + 1
            jm(torch.ones(n, 2))
    (warning,) = [w for w in record if "recompiled" in str(w.message)]
    assert (warning.filename, warning.lineno) == (__file__, line)
