"""Programs as users write them, round 4, each next to eager over several calls.

What differed: ``logging.basicConfig(level=...)`` in the program configured the root logger once,
while traced: a call after the root's handlers were removed (a test harness, a notebook's reset)
left it without a handler, at its old level, where eager configures it again
(``library_settings``). ``sys.path = sys.path + [p]`` was refused with no line ("changed Python
state it read"), and ``sys.path = [p] + sys.path`` was made once, while traced: eager's path grows
by an entry every call (``traced_path``)."""

import logging
import sys

import pytest
import torch

import thunder_rs

_ENTRY = "/nonexistent/thunder_rs_round4"


def _configures_logging(x):
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    return x + 1


def _root_state() -> tuple:
    root = logging.root
    return root.level, [(type(h).__name__, getattr(h, "stream", None) is sys.stdout) for h in root.handlers]


def test_logging_basic_config_in_the_program_configures_the_root_logger_on_every_call_as_eager():
    root = logging.root
    handlers, level = list(root.handlers), root.level
    try:
        seen = {}
        for name, fn in (("eager", _configures_logging), ("jit", thunder_rs.jit(_configures_logging))):
            seen[name] = []
            for _ in range(3):
                root.handlers[:] = []  # (between calls: the harness resets the root logger)
                root.setLevel(logging.WARNING)
                fn(torch.ones(2))
                seen[name].append(_root_state())
        assert seen["jit"] == seen["eager"]
        assert seen["eager"][-1] == (logging.INFO, [("StreamHandler", True)])
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _configures_with_handlers(x):
    logging.basicConfig(handlers=[logging.NullHandler()])
    return x + 1


def test_logging_basic_config_with_handler_objects_is_refused_naming_the_line():
    root = logging.root
    handlers = list(root.handlers)
    root.handlers[:] = []
    try:
        with pytest.raises(thunder_rs.errors.ThunderNotImplementedError, match=r"logging.basicConfig.*round4.py:\d+"):
            thunder_rs.jit(_configures_with_handlers)(torch.ones(2))
        assert root.handlers == []
    finally:
        root.handlers[:] = handlers


def _appends_a_list(x):
    sys.path = sys.path + [_ENTRY]
    return x + 1


def _prepends_a_list(x):
    sys.path = [_ENTRY] + sys.path
    return x + 1


def _filters_the_path(x):
    sys.path = [p for p in sys.path if p != _ENTRY]
    return x + 1


@pytest.mark.parametrize(
    "program, compiles",
    [(_appends_a_list, 1), (_prepends_a_list, 1), (_filters_the_path, 2)],
    ids=["path_plus_entry", "entry_plus_path", "filtered"],
)
def test_a_program_giving_sys_path_a_new_list_gives_it_on_every_call_as_eager(program, compiles):
    path = list(sys.path)
    try:
        seen = {}
        for name, fn in (("eager", program), ("jit", thunder_rs.jit(program))):
            sys.path = [*path, _ENTRY]
            seen[name] = []
            for _ in range(3):
                torch.testing.assert_close(fn(torch.ones(2)), torch.ones(2) + 1, rtol=0, atol=0)
                seen[name].append((type(sys.path), list(sys.path)))
        assert seen["jit"] == seen["eager"]
        assert thunder_rs.compile_stats(fn).cache_misses == compiles
        assert type(sys) is type(logging)
    finally:
        sys.path = path


def _gives_a_tuple(x):
    sys.path = tuple(sys.path)
    return x + 1


def test_a_program_giving_sys_path_a_tuple_is_refused_naming_the_line():
    path = sys.path
    with pytest.raises(thunder_rs.errors.ThunderNotImplementedError, match=r"sys.path = .*round4.py:\d+"):
        thunder_rs.jit(_gives_a_tuple)(torch.ones(2))
    assert sys.path is path
