"""Settings of Python's libraries a program makes (``sys.path``'s changes, ``warnings``' filters,
``torch``'s and NumPy's print options, a logger's level, ``logging.disable``) are made again by every
compiled call, as eager makes them (``core/acquisition/library_settings.py``): tracing made them
once, and a setting reset between calls stayed reset. State the program reads after setting it
itself is guarded as the tracing found it (``setters.settle_later``)."""

import contextlib
import io
import logging
import os
import sys
import types
import warnings

import numpy as np
import pytest
import torch

import thunder_rs

_PATH = "/nonexistent/thunder_rs_test_settings"
_LOGGER = logging.getLogger("thunder_rs_test_settings")


class _SettingsWarning(UserWarning):
    pass


def _drop_path() -> None:
    while _PATH in sys.path:
        sys.path.remove(_PATH)


def _appends_to_the_path(x):
    sys.path.append(_PATH)
    return x + 1


def _inserts_in_the_path(x):
    sys.path.insert(0, _PATH)
    return x + 1


def _inserts_once(x):
    if _PATH not in sys.path:
        sys.path.insert(0, _PATH)
    return x + 1


def _ignores_a_warning(x):
    warnings.simplefilter("ignore", _SettingsWarning)
    return x + 1


def _filters_a_warning(x):
    warnings.filterwarnings("error", message="thunder_rs settings", category=_SettingsWarning)
    return x + 1


def _sets_torch_print_options(x):
    torch.set_printoptions(precision=2)
    return x + 1


def _sets_numpy_print_options(x):
    np.set_printoptions(precision=2)
    return x + 1


def _sets_a_level(x):
    logging.getLogger("thunder_rs_test_settings").setLevel(logging.ERROR)
    return x + 1


def _disables_logging(x):
    logging.disable(logging.CRITICAL)
    return x + 1


def _has_filter() -> bool:
    return any(f[2] is _SettingsWarning for f in warnings.filters)


_CASES = {
    "sys.path.append": (_appends_to_the_path, _drop_path, lambda: sys.path.count(_PATH)),
    "sys.path.insert": (_inserts_in_the_path, _drop_path, lambda: sys.path[:1].count(_PATH)),
    "sys.path idiom": (_inserts_once, _drop_path, lambda: sys.path.count(_PATH)),
    "simplefilter": (_ignores_a_warning, lambda: None, _has_filter),
    "filterwarnings": (_filters_a_warning, lambda: None, _has_filter),
    "torch.set_printoptions": (
        _sets_torch_print_options,
        lambda: torch.set_printoptions(precision=4),
        lambda: torch._tensor_str.PRINT_OPTS.precision,
    ),
    "np.set_printoptions": (
        _sets_numpy_print_options,
        lambda: np.set_printoptions(precision=8),
        lambda: np.get_printoptions()["precision"],
    ),
    "Logger.setLevel": (_sets_a_level, lambda: _LOGGER.setLevel(logging.INFO), lambda: _LOGGER.level),
    "logging.disable": (
        _disables_logging,
        lambda: logging.disable(logging.NOTSET),
        lambda: logging.root.manager.disable,
    ),
}


@pytest.mark.parametrize("kind", sorted(_CASES))
def test_a_library_setting_the_program_makes_is_made_by_every_call_as_eager(kind):
    program, reset, read = _CASES[kind]
    with warnings.catch_warnings():
        try:
            seen = {}
            for name, fn in (("eager", program), ("jit", thunder_rs.jit(program))):
                seen[name] = []
                for i in range(3):
                    if i != 1:  # (between calls: eager's next call sets it again; once, not)
                        reset()
                    if kind in ("simplefilter", "filterwarnings"):
                        warnings.resetwarnings()
                    torch.testing.assert_close(fn(torch.ones(2)), torch.ones(2) + 1, rtol=0, atol=0)
                    seen[name].append(read())
            assert seen["jit"] == seen["eager"]
        finally:
            _drop_path()
            torch.set_printoptions(profile="default")
            np.set_printoptions(precision=8)
            _LOGGER.setLevel(logging.NOTSET)
            logging.disable(logging.NOTSET)


def _prints_with_its_options(x):
    torch.set_printoptions(precision=2)
    print(x)
    return x + 1


def _logs_at_its_level(x):
    _LOGGER.setLevel(logging.INFO)
    _LOGGER.info("at %s", "info")
    return x + 1


def _warns_after_its_filter(x):
    warnings.simplefilter("error", _SettingsWarning)
    try:
        warnings.warn("thunder_rs settings", _SettingsWarning)
    except _SettingsWarning:
        x = x + 1
    return x


@pytest.mark.parametrize("program", [_prints_with_its_options, _logs_at_its_level, _warns_after_its_filter])
def test_what_follows_a_setting_in_the_program_sees_it_on_every_call(program):
    # Read after the program set it: guarded as the tracing found it (it read its own setting
    # once, then refused: "changed Python state it read").
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    _LOGGER.addHandler(handler)
    try:
        seen = {}
        for name, fn in (("eager", program), ("jit", thunder_rs.jit(program))):
            seen[name] = []
            for _ in range(3):
                torch.set_printoptions(precision=4)
                _LOGGER.setLevel(logging.ERROR)
                with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()) as out:
                    result = fn(torch.arange(3.0) / 3)
                seen[name].append((result.tolist(), out.getvalue(), stream.getvalue()))
                stream.seek(0)
                stream.truncate()
        assert seen["jit"] == seen["eager"]
    finally:
        _LOGGER.removeHandler(handler)
        _LOGGER.setLevel(logging.NOTSET)
        torch.set_printoptions(profile="default")


_VAR = "THUNDER_RS_TEST_SETTING_2"


def _sets_then_reads_the_environment(x):
    os.environ[_VAR] = "on"
    if os.environ[_VAR] == "on":
        x = x + 1
    return x


def test_an_environment_variable_the_program_sets_then_reads_is_set_by_every_call():
    try:
        seen = {}
        for name, fn in (
            ("eager", _sets_then_reads_the_environment),
            ("jit", thunder_rs.jit(_sets_then_reads_the_environment)),
        ):
            seen[name] = []
            for _ in range(3):
                os.environ.pop(_VAR, None)
                seen[name].append((fn(torch.ones(2)).tolist(), os.environ.get(_VAR)))
        assert seen["jit"] == seen["eager"]
    finally:
        os.environ.pop(_VAR, None)


def _filters_inside_its_block(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _SettingsWarning)
        y = x + 1
    return y


def test_a_filter_inside_the_programs_catch_warnings_is_not_made_again():
    with warnings.catch_warnings():
        jitted = thunder_rs.jit(_filters_inside_its_block)
        for _ in range(2):
            torch.testing.assert_close(jitted(torch.ones(2)), torch.ones(2) + 1)
            assert not _has_filter()


def test_the_library_settings_are_put_back_after_tracing():
    try:
        thunder_rs.jit(_inserts_once)(torch.ones(2))
    finally:
        _drop_path()
    assert type(sys.path) is list and type(sys) is types.ModuleType
    functions = (warnings.simplefilter, warnings.filterwarnings, torch.set_printoptions, np.set_printoptions)
    functions += (logging.Logger.setLevel, logging.disable, logging.basicConfig)
    assert all(type(f) is types.FunctionType and "thunder_rs" not in f.__code__.co_filename for f in functions)
