"""Programs as users write them, round 4, each next to eager over several calls.

What differed: ``logging.basicConfig(level=...)`` in the program configured the root logger once,
while traced: a call after the root's handlers were removed (a test harness, a notebook's reset)
left it without a handler, at its old level, where eager configures it again
(``library_settings``). ``sys.path = sys.path + [p]`` was refused with no line ("changed Python
state it read"), and ``sys.path = [p] + sys.path`` was made once, while traced: eager's path grows
by an entry every call (``traced_path``). A ``collections.Counter`` (or ``defaultdict``,
``OrderedDict``) a model keeps of what it saw was refused ("changed Python state it read"): their
item writes are made again by every call, as a dict's are (``containers``). A dict whose keys the
program moved (``d[k] = d.pop(k)``, ``move_to_end``: a most-recently-used order) kept its old order,
each compiled call setting the values alone. An attribute the program set of a module it imported
(``settings.FLAG = 1``, ``sys.argv = [...]``), or of a class its module defines (``Config.scale =
2``), was set once, while traced; it is refused, naming the line
(``Observer.refuse_unread_global_stores``)."""

import collections
import copy
import logging
import sys

import pytest
import torch
from torch import nn

import round4_settings
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


class _Tally(nn.Module):
    """Counts the tags it is called with (``self.seen[tag] += 1``) and doubles from a tag's third call."""

    def __init__(self, make):
        super().__init__()
        self.lin, self.seen = nn.Linear(3, 3), make()

    def forward(self, x, tag):
        self.seen[tag] += 1
        if self.seen[tag] > 2:
            x = x * 2
        return self.lin(x)


@pytest.mark.parametrize(
    "make",
    [collections.Counter, lambda: collections.defaultdict(int), lambda: collections.OrderedDict(a=0, b=0)],
    ids=["counter", "defaultdict", "ordered_dict"],
)
def test_a_counter_of_what_a_model_saw_counts_as_eager(make):
    torch.manual_seed(0)
    model = _Tally(make)
    eager, jitted = copy.deepcopy(model), thunder_rs.jit(model)
    for tag in "aabab":
        x = torch.randn(2, 3)
        torch.testing.assert_close(jitted(x, tag), eager(x, tag), rtol=0, atol=0)
    assert type(model.seen) is type(eager.seen) and list(model.seen.items()) == list(eager.seen.items())


class _Recent(nn.Module):
    """Keeps the last two batch means in a ``deque(maxlen=2)``."""

    def __init__(self):
        super().__init__()
        self.lin, self.recent = nn.Linear(3, 3), collections.deque(maxlen=2)

    def forward(self, x):
        self.recent.append(x.mean().item())
        return self.lin(x) * len(self.recent)


def test_a_deque_a_model_changes_is_refused_saying_what_a_call_makes_again():
    # The refusal said to keep such state "in a module attribute", which the deque was.
    with pytest.raises(thunder_rs.errors.ThunderNotImplementedError, match=r"_Recent.recent changed.*not in a deque"):
        thunder_rs.jit(_Recent())(torch.randn(2, 3))


class _MostRecent(nn.Module):
    """Keeps the tags it saw most recent last (a plain dict, or an ``OrderedDict`` with an LRU's
    ``move_to_end`` and ``popitem``) and scales by the oldest's value."""

    def __init__(self, ordered: bool):
        super().__init__()
        self.lin, self.ordered = nn.Linear(3, 3), ordered
        self.recent = (collections.OrderedDict if ordered else dict)(a=1, b=2, c=3)

    def forward(self, x, tag):
        if not self.ordered:
            self.recent[tag] = self.recent.pop(tag, 0)
        elif tag in self.recent:
            self.recent.move_to_end(tag)
        else:
            self.recent[tag] = 0
            if len(self.recent) > 3:
                self.recent.popitem(last=False)
        return self.lin(x) * next(iter(self.recent.values()))


@pytest.mark.parametrize("ordered", [False, True], ids=["dict", "ordered_dict"])
def test_a_most_recently_used_order_a_model_keeps_is_eagers(ordered):
    torch.manual_seed(0)
    model = _MostRecent(ordered)
    eager, jitted = copy.deepcopy(model), thunder_rs.jit(model)
    for tag in "abzab":
        x = torch.randn(2, 3)
        torch.testing.assert_close(jitted(x, tag), eager(x, tag), rtol=0, atol=0)
        assert list(model.recent.items()) == list(eager.recent.items())


def _sets_a_module_attribute(x):
    round4_settings.FLAG = 1
    return x + 1


def _sets_argv(x):
    sys.argv = ["program", "--flag"]
    return x + 1


class _Config:
    scale = 1.0


def _sets_a_class_attribute(x):
    _Config.scale = 2.0
    return x * _Config.scale


@pytest.mark.parametrize(
    "program, what",
    [
        (_sets_a_module_attribute, "round4_settings.FLAG"),
        (_sets_argv, "sys.argv"),
        (_sets_a_class_attribute, "_Config.scale"),
    ],
    ids=["user_module", "sys", "class"],
)
def test_setting_an_attribute_of_an_imported_module_or_a_class_is_refused_naming_the_line(program, what):
    flag, argv = round4_settings.FLAG, sys.argv
    try:
        with pytest.raises(thunder_rs.errors.ThunderNotImplementedError, match=rf"sets {what} at .*round4.py:\d+"):
            thunder_rs.jit(program)(torch.ones(2))
    finally:
        round4_settings.FLAG, sys.argv, _Config.scale = flag, argv, 1.0
