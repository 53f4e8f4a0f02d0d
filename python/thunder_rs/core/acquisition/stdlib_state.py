"""Python state a traced program reads through the standard library and torch's global flags, and
the standard library's side effects it makes: guarded, or repeated by every call.

Tracing runs the program once, so what it reads is baked into the trace and what it does happens
once. The bytecode observer (``observe.py``) guards reads of the program's own objects; the state
here lives behind library calls it does not follow, so it is handled by a table each:

- **readers → guards.** ``os.environ`` and ``os.environb`` (``[...]``, ``get``, ``in``,
  ``os.getenv``: all go through ``os._Environ.__getitem__``, wrapped once) and the level of a logger (``isEnabledFor``,
  ``getEffectiveLevel``: wrapped on ``logging.Logger``) are guarded when the program reads them
  while it is traced, by name, so a changed value recompiles and the miss reason names it. The
  names set in ``os.environ`` are guarded when the program iterates it or takes its length, and
  ``sys.argv`` when it parses it with ``argparse`` (``parse_args()``, ``parse_known_args()``).
  torch's global flags are found by the observer among the program's read chains instead
  (``torch_flags.py``).
- **effects → repeated.** ``logging`` calls (``log.info``, ``logging.warning``: all reach
  ``Logger._log``) and ``warnings.warn`` made by program code are recorded, not run, like
  ``print`` (``effects.py``): every compiled call makes them after running, with that call's
  tensors among the arguments, attributed to the user's line as eager attributes them (the log
  record's file, line and function; the warning's registry, so the ``default`` filter shows it once
  per line as in eager). Text that already holds a formatted traced tensor is refused. A warning
  the filters make an error is raised while traced, where eager raises it (the program may catch
  it), and whether they do is guarded: ``simplefilter("error")`` between calls recompiles.
- **iterators.** ``next(it)`` on an iterator the program did not create (an argument, a global, a
  closure cell, an attribute of its state) consumes it once while tracing and never again:
  refused, naming the line. ``builtins.next`` calls a checking wrapper only while some program is
  traced (``consuming_iterators``), so eager code pays nothing otherwise. A generator passed in
  and advanced another way (``for v in gen``, which no wrapper sees) is refused after tracing.
  Repeating ``next`` per call cannot work: the trace is specialised on the item it took.
- **entropy.** ``os.urandom`` (and ``random``'s, under ``SystemRandom``, ``secrets`` and
  ``uuid.uuid4``), ``os.getrandom`` and ``random.Random`` seeded from them (``random.Random()``)
  read by program code are refused the same way, naming the function it called;
  ``datetime``'s wall clock by the observer (``core.state.clocks``).
- **clocks.** ``time.time()``, ``perf_counter``, ``monotonic``, ``process_time``, ``thread_time``
  and ``clock_gettime`` (and their ``_ns``), ``os.times`` and ``resource.getrusage``, and
  ``localtime``, ``gmtime``, ``ctime``, ``asctime`` and ``strftime`` not given a time, read by
  program code while it is traced (directly, through the standard library: ``uuid.uuid1``, or
  through a ``map`` or ``iter`` that ``next`` advances) are refused, naming the line: a compiled
  call would reuse the first reading.
  Like ``next``, they are wrapped only while some program is traced (``consuming_iterators``); so
  is a clock the program bound before tracing (``from time import perf_counter``), where it bound
  it (``core.state.clocks``).

- **effects outside the program.** ``subprocess``'s process start (``subprocess.run``,
  ``os.popen``) and ``torch.save`` called by program code while it is traced are refused, naming
  the line: tracing makes them once, and a compiled call would not make them again. They are
  replaced only while some program is traced (``_put_effect_makers``); the C functions that write
  (a file object's ``write``, ``os.write``, ``os.kill``, ``time.sleep``) are refused by the
  observer's profile hook (``core.state.c_effects``), and handed to a C caller
  (``functools.partial``, ``map``, ``operator.methodcaller``) by stand-ins for them
  (``core.state.handed_effects``: stand-ins for the callers instead stayed in the modules the
  program imported while traced, ``from functools import partial``, and broke torch's own lazy
  imports). Also while traced: ``open`` guards the files the program reads and refuses
  opening one to write (``file_reads``), and ``sys.stdout``/``sys.stderr`` record the program's
  writes, made by every call as ``print`` is (``stream_writes``).

- **the file system and the process's settings.** What program code reads of the file system
  besides files' contents (``os.stat`` and ``os.listdir`` under ``os.path.exists``, ``glob``,
  ``pathlib``; ``os.getcwd``) is guarded (``core.state.fs_reads``); the settings it makes
  (``os.environ[k] = v``, ``os.chdir``, ``sys.setrecursionlimit``, ``torch.set_num_threads``) are
  made again by every call (``setters``); the CUDA device it sets, reads or synchronizes as eager
  does, a stream it enters refused (``cuda_state``).

The closures and default arguments of the functions a program runs are watched by the observer
(``observe.py``, ``guards.DefaultsGuard``), as its other reads are.

Only reads and calls made by program code (not thunder_rs's, torch's or the standard library's
own) count, and nothing here runs for a program that makes none of them: their per-call cost is
only in the entries that carry such guards.
"""

import argparse
import builtins
import contextlib
import functools
import logging
import os
import random
import sys
import threading
import time
import traceback
import types
import warnings
from typing import Any

from thunder_rs.core.acquisition import reparametrize
from thunder_rs.core.acquisition.effects import TracedValue, recorded_effects, refuse_formatted
from thunder_rs.core.acquisition.file_reads import put_back_open, put_open
from thunder_rs.core.acquisition.setters import put_back_setters, put_setters
from thunder_rs.core.acquisition.cuda_state import put_back_cuda_state, put_cuda_state
from thunder_rs.core.acquisition.stream_writes import put_back_streams, put_streams
from thunder_rs.core.lang.printed_text import Text, at_hints, resolved, specialised
from thunder_rs.core.state.cached_reads import put_back_cached, register_stand_in
from thunder_rs.core.state.collector import keep_out
from thunder_rs.core.state.fs_reads import put_back_fs_readers, put_fs_readers
from thunder_rs.core.state.guards import MISSING, StateGuard
from thunder_rs.core.state.handed_effects import (
    passes_on,
    passing_on,
    put_back_held,
    put_back_module_stand_ins,
    put_module_stand_ins,
)
from thunder_rs.core.state.code_reads import in_stdlib
from thunder_rs.core.state.hook import is_program, program_frame, thread_state
from thunder_rs.errors import ThunderNotImplementedError

# -- the program's frame ---------------------------------------------------------------------------


def _passing(code) -> bool:
    """Code the program's frame is looked for beyond: the standard library's (``os.getenv``,
    ``Mapping.get``, ``Logger.info``), and thunder_rs's ``next`` calling on for the program (a
    ``map`` of ``os.environ.get``: ``handed_effects.passes_on``)."""
    return in_stdlib(code.co_filename) or passing_on(code)


def _program_frame(frame, skip: int = 0):
    """The program's frame running ``frame`` (``hook.program_frame``), after ``skip`` more."""
    return program_frame(frame, _passing, skip)


def _tracing() -> bool:
    return thread_state.observer is not None and not thread_state.inside


def _where(frame) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _guard(label: str, read, show=repr) -> None:
    observer: Any = thread_state.observer
    observer.guard_state(StateGuard(label, read, read(), show))


# -- os.environ ------------------------------------------------------------------------------------

_environ_getitem = os._Environ.__getitem__


def _environ_value(key, environ=os.environ):
    try:
        return _environ_getitem(environ, key)
    except KeyError:
        return MISSING


def _environ_name(mapping) -> str | None:
    """``os.environ``, or ``os.environb`` (the same names, as bytes), as ``mapping`` is; else None."""
    return "os.environ" if mapping is os.environ else "os.environb" if mapping is _ENVIRONB else None


_ENVIRONB = getattr(os, "environb", None)


def _unset(value) -> str:
    return "unset" if value is MISSING else repr(value)


def _getitem(self, key):
    name = _environ_name(self)
    if name is not None and _tracing() and _program_frame(sys._getframe(1)) is not None:
        _guard(f"{name}[{key!r}]", functools.partial(_environ_value, key, self), _unset)
    return _environ_getitem(self, key)


_environ_iter = os._Environ.__iter__
_environ_len = os._Environ.__len__


def _environ_names() -> frozenset:
    return frozenset(os.environ._data)  # type: ignore[attr-defined]


def _guard_names(self) -> None:
    if _environ_name(self) is not None and _tracing() and _program_frame(sys._getframe(2)) is not None:
        _guard("the names set in os.environ", _environ_names, lambda names: f"{len(names)} names")


def _iter(self):
    _guard_names(self)
    return _environ_iter(self)


def _len(self):
    _guard_names(self)
    return _environ_len(self)


# -- sys.argv --------------------------------------------------------------------------------------

_parse_known_args = argparse.ArgumentParser.parse_known_args


def _parse_known(self, args=None, namespace=None):
    """``parse_args()`` and ``parse_known_args()`` without ``args`` parse ``sys.argv``: guarded as
    a program's own read of it is (``torch_flags``)."""
    if args is None and _tracing() and _program_frame(sys._getframe(1)) is not None:
        _guard("sys.argv", _argv)
    return _parse_known_args(self, args, namespace)


def _argv() -> tuple:
    return tuple(sys.argv)


# -- logger levels ---------------------------------------------------------------------------------

_is_enabled_for = logging.Logger.isEnabledFor
_effective_level = logging.Logger.getEffectiveLevel


def _level_of(logger) -> tuple:
    """What decides which records ``logger`` makes: ``logging.disable``'s level and its own."""
    return (logger.manager.disable, _effective_level(logger))


def _show_level(value: tuple) -> str:
    disabled, level = value
    text = logging.getLevelName(level)
    return f"{text} (logging.disable({logging.getLevelName(disabled)}))" if disabled else text


def _guard_level(logger) -> None:
    if _tracing() and _program_frame(sys._getframe(2)) is not None:
        _guard(f"the level of logger {logger.name!r}", functools.partial(_level_of, logger), _show_level)


def _isEnabledFor(self, level):  # noqa: N802 (logging's name)
    _guard_level(self)
    return _is_enabled_for(self, level)


def _getEffectiveLevel(self):  # noqa: N802 (logging's name)
    _guard_level(self)
    return _effective_level(self)


# -- logging and warnings as effects ---------------------------------------------------------------

_logger_log = logging.Logger._log


def _refuse_formatted(text, what: str, frame) -> None:
    instead = "pass the tensor as an argument (log.info('%s', x))"
    refuse_formatted((text,), f"{what}: the text", _where(frame), instead)


class LogCall:
    """One record the program logged, made again by every call: the record eager makes, at the
    user's line, with that call's tensors among its arguments."""

    __slots__ = ("logger", "level", "msg", "arguments", "where", "extra", "sinfo")

    def __init__(self, logger, level, msg, args, where, extra, sinfo):
        self.logger, self.level, self.msg, self.where, self.extra, self.sinfo = logger, level, msg, where, extra, sinfo
        self.arguments = args

    def effect(self, extras: list):
        self.arguments = TracedValue(self.arguments, extras)
        if type(self.msg) is Text:
            self.msg = TracedValue(self.msg, extras)
        return self

    def apply(self, extras, flat) -> None:
        path, line, function = self.where
        record = self.logger.makeRecord(
            self.logger.name,
            self.level,
            path,
            line,
            self.msg.get(extras) if type(self.msg) is TracedValue else self.msg,
            self.arguments.get(extras),
            None,
            function,
            self.extra,
            self.sinfo,
        )
        self.logger.handle(record)


def _log(self, level, msg, args, exc_info=None, extra=None, stack_info=False, stacklevel=1):
    recorded = recorded_effects()
    frame = (
        _program_frame(sys._getframe(1), skip=max(stacklevel, 1) - 1) if recorded is not None and _tracing() else None
    )
    if frame is None:
        msg, args = at_hints((msg, args))  # (placeholders of sizes: their values, as traced)
        return _logger_log(self, level, msg, args, exc_info, extra, stack_info, stacklevel + 1)
    _refuse_formatted(msg, f"logging ({self.name!r})", frame)
    if exc_info:
        raise ThunderNotImplementedError(
            f"logging ({self.name!r}): the record logged at {_where(frame)} carries an exception (exc_info, "
            "log.exception), which tracing raised once and a compiled call does not raise; log it outside the "
            "jitted function"
        )
    sinfo = (
        "Stack (most recent call last):\n" + "".join(traceback.format_stack(frame)).rstrip("\n") if stack_info else None
    )
    where = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    recorded.append(LogCall(self, level, resolved(msg), resolved(args), where, extra, sinfo))
    return None


_warn = warnings.warn


class WarnCall:
    """One ``warnings.warn`` the program made, made again by every call at the user's line: through
    ``warn_explicit`` with that line's module registry, so filters (``default``: once per line,
    ``always``, ``error``) act on each call as in eager."""

    __slots__ = ("message", "category", "where", "source")

    def __init__(self, message, category, where, source):
        self.message, self.category, self.where, self.source = message, category, where, source

    def effect(self, extras: list):
        if type(self.message) is Text:  # (text of sizes: this call's, ``printed_text``)
            self.message = TracedValue(self.message, extras)
        return self

    def apply(self, extras, flat) -> None:
        path, line, module, registry, module_globals = self.where
        message = self.message.get(extras) if type(self.message) is TracedValue else self.message
        warnings.warn_explicit(message, self.category, path, line, module, registry, module_globals, self.source)


def _error_by_text(category, module: str, line: int) -> bool:
    """Whether ``warnings.filters`` make a warning of ``category`` at ``line`` of ``module`` an error
    for some texts and not for others: a filter that matches messages (``filterwarnings(message=)``)
    comes before the first one that matches any, with another answer."""
    errors = set()
    for action, message, matched, module_re, at in warnings.filters:
        if _applies(category, module, line, matched, module_re, at):
            errors.add(action == "error")
            if message is None:
                return len(errors) == 2
    errors.add(warnings.defaultaction == "error")  # type: ignore[attr-defined]
    return len(errors) == 2


def _in_programs_catch_warnings() -> bool:
    """Whether the program entered ``warnings.catch_warnings()`` since its tracing began (entering
    one puts a copy of the filters in place): what it does with a warning (records it, ignores it,
    raises it) happens inside the call and is undone when the block ends."""
    return warnings.filters is not getattr(_traced, "filters", warnings.filters)


def _warnings_warn(message, category=None, stacklevel=1, source=None, **kwargs):
    recorded = recorded_effects()
    if recorded is not None and _in_programs_catch_warnings():
        # Made now, as eager makes it: ``catch_warnings(record=True)``'s list gets it while traced.
        return _warn(message, category, stacklevel + 1, source, **kwargs)
    frame = sys._getframe(1) if recorded is not None and _tracing() and not kwargs else None
    if frame is None or not is_program(frame):
        return _warn(message, category, stacklevel + 1, source, **kwargs)
    for _ in range(max(stacklevel, 1) - 1):
        frame = frame.f_back if frame.f_back is not None else frame
    _refuse_formatted(str(message), "warnings.warn", frame)
    if isinstance(message, Warning):
        category = type(message)
    category = UserWarning if category is None else category
    g = frame.f_globals
    module = g.get("__name__", "<string>")
    where = (frame.f_code.co_filename, frame.f_lineno, module, g.setdefault("__warningregistry__", {}), g)
    text = resolved(message) if type(message) is str else message
    if type(text) is Text:  # sizes' text, made by each call (of their values where the filters read it)
        message = at_hints(message)
        by_text = functools.partial(_error_by_text, category, module, where[1])
        _guard(f"whether the warnings filters make the warning at {where[0]}:{where[1]} an error by its text", by_text)
        text = specialised(text) if by_text() else text
    if _guard_raising(category, str(message), module, where):
        # The filters make it an error, raised now as eager raises it (the program may catch it).
        warnings.warn_explicit(message, category, *where[:4], module_globals=g, source=source)
    message = text
    recorded.append(WarnCall(message, category, where, source))
    return None


register_stand_in(_warn, _warnings_warn)  # also where the program bound it (``from warnings import warn``)


def _action(category, text: str, module: str, line: int) -> str:
    """What ``warnings.filters`` do with a warning (``warn_explicit``'s search): the first filter
    that matches it, else the default action."""
    for action, message, matched, module_re, at in warnings.filters:
        if (message is None or (message.match(text) if hasattr(message, "match") else message == text)) and _applies(
            category, module, line, matched, module_re, at
        ):
            return action
    return warnings.defaultaction  # type: ignore[attr-defined]


def _applies(category, module: str, line: int, matched, module_re, at) -> bool:
    """Whether a filter applies to a warning of ``category`` at ``line`` of ``module``, whatever its text."""
    return (
        issubclass(category, matched)
        and (module_re is None or (module_re.match(module) if hasattr(module_re, "match") else module_re == module))
        and (at == 0 or at == line)
    )


def _raises(category, text: str, module: str, line: int) -> bool:
    return _action(category, text, module, line) == "error"


def _guard_raising(category, text: str, module: str, where: tuple) -> bool:
    """Guards whether the filters make the warning the program makes at ``where`` an error, which
    eager raises there (a compiled call would make it after running, or not at all where the program
    catches it: ``simplefilter("error")`` between calls); returns whether they do. The other actions
    are the replayed ``warn_explicit``'s."""
    read = functools.partial(_raises, category, text, module, where[1])
    label = f"whether the warnings filters raise the {category.__name__} warned at {where[0]}:{where[1]}"
    _guard(label, read)
    return read()


# -- iterators -------------------------------------------------------------------------------------

_builtin_next = builtins.next
#: Per thread: ``warnings.filters`` when the program's tracing began (``_in_programs_catch_warnings``).
_traced = threading.local()
_tracings = 0
_tracings_lock = threading.Lock()


def _next(iterator, *default):
    observer = thread_state.observer
    if observer is not None and not thread_state.inside:
        frame = sys._getframe(1)
        if is_program(frame) and observer.reached_from_outside(iterator):
            raise ThunderNotImplementedError(
                f"next: the program consumes a {type(iterator).__name__} it did not create at {_where(frame)} (an "
                "argument, a global or a closure cell); tracing takes its item once, and a compiled call would "
                "neither take the next one nor see it. Take the item outside the jitted function and pass it in"
            )
    return _builtin_next(iterator, *default)


passes_on(_next)  # (a ``map`` of ``os.read`` it advances reads for the program)


def _generator_position(gen):
    frame = gen.gi_frame
    return None if frame is None else frame.f_lasti


@contextlib.contextmanager
def consuming_iterators(flat_inputs: list):
    """While the ``with`` body traces a program, ``next`` refuses to consume iterators the program
    did not create (process-wide, held by a count: several threads may trace at once). A generator
    passed in that the program advanced another way (``for v in gen``) is refused after. The clocks
    and the system's entropy refuse to be read by program code (``_put_readers``) meanwhile, and
    what the garbage collector runs is not observed (``collector``). Notes the warnings filters the
    tracing began with (``_in_programs_catch_warnings``), and ``functional_call`` checks what it is
    given (``reparametrize``)."""
    global _tracings
    generators = [
        (i, g, _generator_position(g)) for i, g in enumerate(flat_inputs) if isinstance(g, types.GeneratorType)
    ]
    with _tracings_lock:
        _tracings += 1
        builtins.next = _next
        keep_out()  # the garbage collector's callbacks and finalizers are not the program
        _put_readers()
        reparametrize.put()
    outer_filters = getattr(_traced, "filters", None)
    _traced.filters = warnings.filters
    try:
        yield
    finally:
        _traced.filters = outer_filters
        with _tracings_lock:
            _tracings -= 1
            if not _tracings:
                builtins.next = _builtin_next
                _put_back_readers()
                reparametrize.put_back()
    for i, gen, position in generators:
        if _generator_position(gen) != position:
            raise ThunderNotImplementedError(
                f"thunder_rs.jit: the program consumed the generator {gen.__qualname__} passed as its input {i} (a "
                "for loop, list() or next() over it); tracing took its items once, and a compiled call would neither "
                "take them again nor see them. Pass the items (a list or a tensor) instead"
            )


# -- clocks ----------------------------------------------------------------------------------------

#: ``time``'s clocks: a reading differs on every call, and a traced program would keep its first.
_CLOCKS: tuple[str, ...] = ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns")
_CLOCKS += tuple(
    name
    for base in ("process_time", "thread_time", "clock_gettime")
    for name in (base, f"{base}_ns")
    if hasattr(time, name)
)
#: ``time``'s functions that read the clock when not given a time: name -> the position of that argument
_TIME_TAKING = {"localtime": 0, "gmtime": 0, "ctime": 0, "asctime": 0, "strftime": 1}
_clocks = {name: getattr(time, name) for name in (*_CLOCKS, *_TIME_TAKING)}


def _stdlib_entry(frame, program, name: str) -> str:
    """What the program called to reach ``frame``: the outermost of the standard library's frames
    from ``frame`` to ``program``'s (``uuid.uuid4``), or ``name`` where it called it directly."""
    while frame is not program:
        if not passing_on(frame.f_code):
            name = f"{frame.f_globals.get('__name__')}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"
        frame = frame.f_back
    return name


def _clock(name: str, real=None, module: str = "time"):
    """A reader standing in for ``real``, ``module``'s ``name`` (``time``'s by default), that refuses
    to be read by program code while it is traced."""
    real, at = real or _clocks[name], _TIME_TAKING.get(name)

    def read(*args):
        frame: Any = sys._getframe(1)
        program = _program_frame(frame) if _tracing() and (at is None or len(args) <= at or args[at] is None) else None
        if program is not None:
            entry = _stdlib_entry(frame, program, f"{module}.{name}")
            raise ThunderNotImplementedError(
                f"{entry}: the program reads the clock at {_where(program)}; "
                "tracing reads it once, and a compiled call would reuse that reading. Time the jitted call from "
                "outside it, or pass the time in"
            )
        return real(*args)

    return read


#: What ``consuming_iterators`` puts in ``time`` while a program is traced.
_CLOCK_READERS = {name: _clock(name) for name in _clocks}
for _name, _reader in _CLOCK_READERS.items():
    register_stand_in(_clocks[_name], _reader)  # also where the program bound it (``core.state.clocks``)
#: the process's times (CPU time, as ``time.process_time`` reads it): ``os.times``, and
#: ``resource.getrusage`` where the program imported ``resource`` (``_usage_clock``: ``(module, real)``)
_os_times = os.times
_TIMES_READER = _clock("times", _os_times, "os")
register_stand_in(_os_times, _TIMES_READER)
_usage_clock: list = []


# -- entropy ---------------------------------------------------------------------------------------

_urandom = os.urandom
_getrandom = getattr(os, "getrandom", None)
_seed = random.Random.seed


def _refuse_entropy(what: str) -> None:
    """Refuses the read of the system's entropy by ``what`` if program code made it, directly or
    through the standard library, whose function it called is named."""
    frame: Any = sys._getframe(2)
    program = _program_frame(frame) if _tracing() else None
    if program is not None:
        raise ThunderNotImplementedError(
            f"{_stdlib_entry(frame, program, what)}: the program draws from the system's entropy ({what}) at "
            f"{_where(program)}; tracing draws once, and a compiled call would reuse what it drew. Draw outside the "
            "jitted function and pass the value in, or use torch's random functions, which draw on every call"
        )


def _read_entropy(size: int) -> bytes:
    """``os.urandom`` while a program is traced (also ``random``'s, which ``SystemRandom`` and
    ``secrets`` draw on, and ``uuid.uuid4``'s)."""
    _refuse_entropy("os.urandom")
    return _urandom(size)


def _read_getrandom(*args):
    _refuse_entropy("os.getrandom")
    return _getrandom(*args)


def _seed_of(self, a=None, version=2):
    """``random.Random.seed`` while a program is traced: seeding from the system's entropy (a
    generator the program makes, ``random.Random()``) is refused; a given seed is not."""
    if a is None:
        _refuse_entropy("random.Random.seed")
    return _seed(self, a, version)


register_stand_in(_urandom, _read_entropy)  # also where the program bound it (``from os import urandom``)


#: ``uuid``'s C clock (``uuid1`` reads it) while a program is traced: ``(module, real)``
_uuid_clock: list = []
#: Python functions whose call makes an effect outside the program (``core.state.c_effects`` has
#: the C ones), replaced while a program is traced: ``(holder, name, real)``
_effect_makers: list = []


def _refusing_effect(what: str, real):
    """``real`` (``subprocess.Popen``'s process start, ``torch.save``) refusing program code's call
    while it is traced: a compiled call would not make it again."""

    def make(*args, **kwargs):
        frame: Any = sys._getframe(1)
        program = _program_frame(frame) if _tracing() else None
        if program is not None:
            raise ThunderNotImplementedError(
                f"{_stdlib_entry(frame, program, what)}: the program calls it at {_where(program)}, an effect outside "
                "the program; tracing made it once, and a compiled call would not make it again where eager makes it "
                "on every call. Make it outside the jitted function"
            )
        return real(*args, **kwargs)

    return make


def _put_effect_makers() -> None:
    subprocess, torch = sys.modules.get("subprocess"), sys.modules.get("torch")
    for holder, name, what in (
        (getattr(subprocess, "Popen", None), "_execute_child", "subprocess.Popen"),
        (torch, "save", "torch.save"),
    ):
        real = getattr(holder, name, None)
        if real is not None and not any(h is holder and n == name for h, n, _ in _effect_makers):
            _effect_makers.append((holder, name, real))
            setattr(holder, name, _refusing_effect(what, real))


def _put_back_effect_makers() -> None:
    while _effect_makers:
        holder, name, real = _effect_makers.pop()
        setattr(holder, name, real)


def _put_readers() -> None:
    """Puts the refusing clocks and entropy in (under ``_tracings_lock``)."""
    for name, read in _CLOCK_READERS.items():
        setattr(time, name, read)
    os.urandom = random._urandom = _read_entropy  # type: ignore[attr-defined]
    random.Random.seed = _seed_of  # type: ignore[method-assign]
    if _getrandom is not None:
        os.getrandom = _read_getrandom
    os.times = _TIMES_READER
    resource = sys.modules.get("resource")
    if resource is not None and not _usage_clock:
        _usage_clock.append((resource, resource.getrusage))
        resource.getrusage = _clock("getrusage", resource.getrusage, "resource")  # type: ignore[attr-defined]
    uuid = sys.modules.get("uuid")  # (imported by the program if it uses it)
    real = getattr(uuid, "_generate_time_safe", None)
    if real is not None and not _uuid_clock:
        _uuid_clock.append((uuid, real))
        uuid._generate_time_safe = _clock("_generate_time_safe", real)  # type: ignore[union-attr]
    _put_effect_makers()
    put_module_stand_ins()
    put_fs_readers()
    put_setters()
    put_cuda_state()
    put_open()
    put_streams()


def _put_back_readers() -> None:
    """Puts ``time``'s, ``os``'s, ``random``'s and ``uuid``'s own back, and the clocks the program
    bound (once no program is traced)."""
    for name, real in _clocks.items():
        setattr(time, name, real)
    os.urandom = random._urandom = _urandom  # type: ignore[attr-defined]
    random.Random.seed = _seed  # type: ignore[method-assign]
    if _getrandom is not None:
        os.getrandom = _getrandom
    os.times = _os_times
    while _usage_clock:
        resource, real = _usage_clock.pop()
        resource.getrusage = real
    while _uuid_clock:
        uuid, real = _uuid_clock.pop()
        uuid._generate_time_safe = real
    _put_back_effect_makers()
    put_back_module_stand_ins()
    put_back_fs_readers()
    put_back_setters()
    put_back_cuda_state()
    put_back_held()
    put_back_open()
    put_back_streams()
    put_back_cached()


# -- installing ------------------------------------------------------------------------------------

_installed: list = []


def install() -> None:
    """Puts the wrappers in, once (they call straight through outside tracing)."""
    if _installed:
        return
    _installed.append(True)
    os._Environ.__getitem__ = _getitem  # type: ignore[method-assign]
    os._Environ.__iter__ = _iter  # type: ignore[method-assign]
    os._Environ.__len__ = _len  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = _parse_known  # type: ignore[method-assign]
    logging.Logger.isEnabledFor = _isEnabledFor  # type: ignore[method-assign]
    logging.Logger.getEffectiveLevel = _getEffectiveLevel  # type: ignore[method-assign]
    logging.Logger._log = _log  # type: ignore[method-assign]
    warnings.warn = _warnings_warn
