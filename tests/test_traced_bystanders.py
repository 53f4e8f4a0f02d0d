"""Code that runs while a program is traced but is not the program: what the garbage collector runs
(``gc.callbacks``, ``__del__``, ``weakref.finalize``; ``core/state/collector.py``) is neither
guarded nor recorded, and reads of the wall clock and of the system's entropy (``datetime``,
``os.urandom`` and what draws on it: ``uuid.uuid4``, ``secrets``, ``random.SystemRandom``) made by
the program are refused naming its line, as ``time.time()`` is (``core/acquisition/stdlib_state.py``)."""

import datetime
import functools
import gc
import os
import random
import secrets
import time
import uuid
import weakref
from datetime import date
from os import urandom

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderError

_seen: list = []


def _misses(jf) -> list:
    return thunder_rs.compile_stats(jf).miss_reasons


def _note_phase(phase, info):
    _seen.append(phase)


class _Noted:
    def __del__(self):
        _seen.append("del")


def _garbage_with_a_finalizer():
    """Cyclic garbage, freed only by a collection: a ``__del__`` and a ``weakref.finalize``."""
    a, b = _Noted(), _Noted()
    a.other, b.other = b, a
    weakref.finalize(b, _seen.append, "finalize")


def _collects(x):
    gc.collect()  # (stands for a collection started by any allocation while traced)
    return x * 2


@pytest.fixture
def collector_callback():
    gc.callbacks.append(_note_phase)
    yield
    gc.callbacks.remove(_note_phase)


def test_a_gc_callback_run_while_traced_is_not_the_programs(collector_callback):
    jf = thunder_rs.jit(_collects)
    x = torch.randn(4)
    for _ in range(3):
        assert torch.equal(jf(x), _collects(x))
    assert _misses(jf) == ["first call"]
    assert "start" in _seen and "stop" in _seen


def test_finalizers_and_del_run_by_the_collector_while_traced_are_not_the_programs():
    jf = thunder_rs.jit(_collects)
    x = torch.randn(4)
    for _ in range(3):
        _garbage_with_a_finalizer()
        assert torch.equal(jf(x), _collects(x))
    assert _misses(jf) == ["first call"]
    assert "del" in _seen and "finalize" in _seen


# -- the wall clock and the system's entropy -------------------------------------------------------

_DATETIME = datetime.datetime


class _Stamp(datetime.datetime):
    pass


_URANDOM = os.urandom
_LOCALTIME = time.localtime
_UUID_CLOCK = uuid._generate_time_safe


def _days(x):
    return x * datetime.datetime.now().microsecond


def _bound_date(x):
    return x * date.today().day


def _uuid(x):
    return x * (uuid.uuid4().int % 7)


def _token(x):
    return x * len(secrets.token_hex(2))


def _system_random(x):
    return x * random.SystemRandom().random()


def _bound_urandom(x):
    return x * urandom(1)[0]


@pytest.mark.parametrize(
    "program, name",
    [
        (_days, r"datetime.datetime.now: the program reads the wall clock"),
        (lambda x: x * _DATETIME.utcnow().second, r"datetime.datetime.utcnow: the program reads the wall clock"),
        (_bound_date, r"datetime.date.today: the program reads the wall clock"),
        (lambda x: x * _Stamp.now().second, r"_Stamp.now: the program reads the wall clock"),
        (lambda x: x * os.urandom(1)[0], r"os.urandom: the program draws from the system's entropy"),
        (_bound_urandom, r"os.urandom: the program draws from the system's entropy"),
        (_uuid, r"uuid.uuid4: the program draws"),
        (_token, r"secrets.token_hex: the program draws"),
        (_system_random, r"random.SystemRandom.random: the program draws"),
        (lambda x: x * random.Random().random(), r"random.Random.__init__: the program draws"),
        (lambda x: x * (uuid.uuid1().int % 7), r"uuid.uuid1: the program reads the clock"),
        (lambda x: x * time.localtime().tm_sec, r"time.localtime: the program reads the clock"),
        (lambda x: x * len(time.strftime("%S")), r"time.strftime: the program reads the clock"),
    ],
    ids=[
        "now",
        "utcnow",
        "date bound as a global",
        "subclass",
        "urandom",
        "urandom bound",
        "uuid4",
        "secrets",
        "SystemRandom",
        "unseeded Random",
        "uuid1",
        "localtime",
        "strftime",
    ],
)
def test_reading_the_wall_clock_or_entropy_is_refused_naming_the_line(program, name):
    # Each was read once while traced: every compiled call computed with the first call's value.
    with pytest.raises(ThunderError, match=name + r".* at .*test_traced_bystanders.py:\d+"):
        thunder_rs.jit(program)(torch.ones(2))
    assert os.urandom is _URANDOM and random._urandom is _URANDOM and urandom is _URANDOM  # put back
    assert time.localtime is _LOCALTIME and uuid._generate_time_safe is _UUID_CLOCK


def _by_a_given_time(x, t):
    return x * time.localtime(t).tm_min + len(time.strftime("%M", time.gmtime(t)))


@pytest.mark.skipif(not hasattr(os, "getrandom"), reason="os.getrandom is Linux's")
def test_getrandom_is_refused_naming_the_line():
    with pytest.raises(ThunderError, match=r"os.getrandom: the program draws .* at .*test_traced_bystanders.py:\d+"):
        thunder_rs.jit(lambda x: x * os.getrandom(1)[0])(torch.ones(2))


def _by_a_seeded_generator(x):
    return x * random.Random(7).random()


def test_a_generator_the_program_seeds_is_not_refused():
    jf, x = thunder_rs.jit(_by_a_seeded_generator), torch.ones(2)
    assert torch.equal(jf(x), _by_a_seeded_generator(x)) and torch.equal(jf(x), _by_a_seeded_generator(x))


def test_times_given_to_time_functions_are_not_clock_reads():
    jf, x = thunder_rs.jit(_by_a_given_time), torch.ones(2)
    for t in (0.0, 3600.0):
        assert torch.equal(jf(x, t), _by_a_given_time(x, t))


def test_the_wall_clock_and_entropy_read_outside_the_program_still_work():
    def stamped(x, when):
        return x * when

    jf, x = thunder_rs.jit(stamped), torch.ones(2)
    for _ in range(2):
        when = datetime.datetime.now().microsecond + len(secrets.token_hex(2))
        assert torch.equal(jf(x, when), stamped(x, when))


# -- the wall clock handed to a C caller -----------------------------------------------------------

_UTC = datetime.timezone.utc
_NOW = datetime.datetime.now  # a bound method held before tracing
_NOW_IN_UTC = functools.partial(datetime.datetime.now, _UTC)  # a partial made before tracing


def _through_a_held_partial(x):
    return x * _NOW_IN_UTC().microsecond


def _through_a_partial_it_makes(x):
    return x * functools.partial(datetime.datetime.now, _UTC)().microsecond


def _through_map(x):
    return x * next(map(datetime.datetime.now, [_UTC])).microsecond


def _held_method_through_map(x):
    return x * list(map(_NOW, [_UTC]))[0].microsecond


def _subclass_through_a_partial(x):
    return x * functools.partial(_Stamp.now, _UTC)().microsecond


def _clock_in_a_closure():
    now = _DATETIME.now

    def program(x):
        return x * functools.partial(now, _UTC)().microsecond

    return program


@pytest.mark.parametrize(
    "program",
    [
        _through_a_held_partial,
        _through_a_partial_it_makes,
        _through_map,
        _held_method_through_map,
        _subclass_through_a_partial,
        _clock_in_a_closure(),
    ],
    ids=["held partial", "partial made", "map", "held method to map", "subclass", "closure cell"],
)
def test_the_wall_clock_handed_to_a_c_caller_is_refused_naming_the_line(program):
    # functools.partial and map call datetime.datetime.now from C, which the profile hook does not
    # report: tracing read the clock once, and every compiled call reused that reading.
    with pytest.raises(ThunderError, match=r"\.now: the program .* at .*test_traced_bystanders.py:\d+"):
        thunder_rs.jit(program)(torch.ones(2))
    assert type(_NOW_IN_UTC) is functools.partial and type(_NOW) is type(_DATETIME.now)  # put back
    assert program(torch.ones(2)).shape == (2,)  # (eager runs)


def _hands_on_other_datetime_methods(x, stamp):
    parse = functools.partial(datetime.datetime.fromtimestamp, tz=_UTC)
    return x * parse(stamp).hour + next(map(datetime.date.fromordinal, [stamp // 86400 + 1])).day


def test_other_datetime_methods_handed_on_run_as_eager():
    jf, x = thunder_rs.jit(_hands_on_other_datetime_methods), torch.ones(2)
    for stamp in (0, 7200):
        assert torch.equal(jf(x, stamp), _hands_on_other_datetime_methods(x, stamp))
