"""Text of symbolic sizes that a program only prints, logs or warns (``core.lang.printed_text``):
each call prints, logs and warns eager's text, made from its own sizes, and the sizes stay symbolic
(two compiles for every length); text put to any other use (a warnings filter that matches it too)
still holds the size's value (a compile per size), as eager's text does."""

import _warnings
import logging
import warnings
from warnings import warn

import pytest
import torch

import thunder_rs

log = logging.getLogger("thunder_rs.tests.printed")


def misses(jfn) -> int:
    return thunder_rs.compile_stats(jfn).cache_misses


def printing(x):
    print(f"batch {x.shape}, {x.shape[0]:>4} rows, {x.size(0)!r}", x.shape[1], str(x.shape), sep="|")
    print("rows", str(x.size(0)), f"{x.shape[0]}", x.size(0), end=";\n")
    return x * 2


def test_sizes_formatted_into_print_are_each_calls_and_stay_symbolic(capsys):
    jf = thunder_rs.jit(printing)
    sizes = [2, 3, 5, 9, 3]
    for n in sizes:
        x = torch.randn(n, 4)
        torch.testing.assert_close(jf(x), x * 2)
    got = capsys.readouterr().out
    for n in sizes:
        printing(torch.randn(n, 4))
    assert got == capsys.readouterr().out
    assert misses(jf) == 2


def logging_sizes(x):
    log.info(f"rows {x.shape[0]} of {str(x.shape)}")
    logger = logging.getLogger("thunder_rs.tests.printed")
    logger.warning("%s and %d", f"{x.shape!r}", x.shape[0])
    log.debug(f"off at INFO: {x.shape}")
    return x + 1


def test_sizes_formatted_into_logging_are_each_calls_and_stay_symbolic(caplog):
    jf = thunder_rs.jit(logging_sizes)
    sizes = [2, 3, 6, 4]
    with caplog.at_level(logging.INFO, logger=log.name):
        for n in sizes:
            jf(torch.randn(n, 3))
        got = [(r.levelname, r.getMessage(), r.lineno) for r in caplog.records if r.name == log.name]
        caplog.clear()
        for n in sizes:
            logging_sizes(torch.randn(n, 3))
        expected = [(r.levelname, r.getMessage(), r.lineno) for r in caplog.records if r.name == log.name]
    assert got == expected and len(got) == 2 * len(sizes)
    assert misses(jf) == 2


def text_kept(x):
    label = f"rows {x.shape[0]}"  # stored, then printed and returned: its value
    print(label)
    return x * 2, label + "!", f"{str(x.shape[0]):>8}|"


def test_text_put_to_other_uses_holds_the_value(capsys):
    jf = thunder_rs.jit(text_kept)
    for n in [2, 3, 4]:
        x = torch.randn(n, 2)
        got, expected = jf(x), text_kept(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1:] == expected[1:]
    out = capsys.readouterr().out.splitlines()
    assert out[::2] == out[1::2] == ["rows 2", "rows 3", "rows 4"]
    assert misses(jf) == 3


def warning_sizes(x):
    warnings.warn(f"rows {x.shape[0]} of {x.shape}")
    logging.getLogger("thunder_rs.tests.printed").info(f"rows {x.shape[0]}")  # (a logger got by name)
    return x - 1


def _warned(fn, sizes, action: str, caplog, error: str | None = None) -> tuple:
    """The warnings (text, category, line) and log records ``fn``'s calls on ``sizes`` make under
    the filter ``action`` (and one making messages matching ``error`` errors, raised by those calls)."""
    raised = []
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, logger=log.name):
        warnings.simplefilter(action)
        if error is not None:
            warnings.filterwarnings("error", message=error)
        for n in sizes:
            try:
                fn(torch.randn(n, 3))
            except UserWarning as e:
                raised.append(str(e))
    records = [r.getMessage() for r in caplog.records if r.name == log.name]
    caplog.clear()
    return [(str(w.message), w.category, w.lineno) for w in caught], records, raised


@pytest.mark.parametrize("action", ["always", "default"])
def test_sizes_formatted_into_warnings_and_a_logger_got_by_name_are_each_calls(action, caplog):
    # warnings.warn and logging.getLogger(...).info made the text of the size when traced, which
    # specialised it: a compile per length (4 here).
    jf, sizes = thunder_rs.jit(warning_sizes), [2, 3, 6, 3, 4]
    got = _warned(jf, sizes, action, caplog)
    assert got == _warned(warning_sizes, sizes, action, caplog)  # (``default``: once per text, as eager)
    assert len(got[0]) == (5 if action == "always" else 4) and len(got[1]) == 5
    assert misses(jf) == 2


def test_a_warning_a_filter_matches_by_its_text_is_made_of_the_sizes_values(caplog):
    # The filters' answer depends on the text: the sizes are specialised (each length compiles), and
    # the warning raised where eager raises it.
    jf, sizes = thunder_rs.jit(warning_sizes), [2, 3, 4, 3]
    got = _warned(jf, sizes, "always", caplog, error="rows 3 ")
    assert got == _warned(warning_sizes, sizes, "always", caplog, error="rows 3 ")
    assert got[2] == ["rows 3 of torch.Size([3, 3])"] * 2 and len(got[0]) == 2


class _Shown:
    """Not a logger: its ``info`` keeps the text it is given."""

    def __init__(self):
        self.texts: list = []

    def info(self, text):
        self.texts.append(text)


_SHOWN = _Shown()
logging.getLogger("thunder_rs.tests.printed.odd").shown = lambda: _SHOWN  # type: ignore[attr-defined]


def shown_sizes(x):
    logging.getLogger("thunder_rs.tests.printed.odd").shown().info(f"rows {x.shape[0]}")  # not a Logger's
    return x * 3


def test_text_given_to_what_a_loggers_method_returns_holds_the_value():
    # Only a method of what logging.getLogger(...) returns is a Logger's: the text is made whole.
    jf = thunder_rs.jit(shown_sizes)
    for n in [2, 3, 4]:
        jf(torch.randn(n, 2))
    assert _SHOWN.texts == ["rows 2", "rows 3", "rows 4"]
    assert misses(jf) == 3


def bound_warn(x):
    warn("bound before tracing")  # (a name bound to warnings.warn when the module was imported)
    warn(f"rows {x.shape[0]}", stacklevel=1)
    return x + 2


@pytest.mark.parametrize("action", ["always", "default"])
def test_warnings_warn_bound_by_name_warns_on_each_call_as_in_eager(action, caplog):
    # ``from warnings import warn``: tracing warned once and no compiled call warned again (under
    # "always", 1 of 5 warnings); a size in its text compiled per length.
    jf, sizes = thunder_rs.jit(bound_warn), [2, 3, 6, 3, 4]
    got = _warned(jf, sizes, action, caplog)
    assert got == _warned(bound_warn, sizes, action, caplog)
    assert len(got[0]) == (10 if action == "always" else 5)
    assert misses(jf) == 2 and bound_warn.__globals__["warn"] is _warnings.warn  # (put back)
