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
- **lengths.** ``len(x)`` of a traced tensor in program code is ``x.shape[0]``, symbolic where that
  is (``builtins.len`` is a wrapper only while some program is traced, as ``next`` is): Python's
  own takes the size's ``__index__``, a guard on its value.
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
  replaced only while some program is traced (``stdlib_readers``); the C functions that write
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
  made again by every call (``setters``), as are those of Python's libraries (``sys.path``'s
  changes, ``warnings``' filters, torch's and NumPy's print options, a logger's level:
  ``library_settings``) and the seeding of Python's and NumPy's generators (``core.state.pydraws``);
  the CUDA device it sets, reads or synchronizes as eager does, a stream it enters refused
  (``cuda_state``), what it asks of the devices guarded and the allocator's statistics, CUDA events
  and waits between streams refused (``cuda_queries``, ``cuda_events``).

The closures and default arguments of the functions a program runs are watched by the observer
(``observe.py``, ``guards.DefaultsGuard``), as its other reads are.

Where each lives: the readers guarded in ``stdlib_reads``, logging and warnings in ``logged``, the
clocks, the entropy and the effects outside the program in ``stdlib_readers``, the settings in
``setters``; how they find the program's frame in ``stdlib_frames``; ``next`` and the tracing's
bracket (``consuming_iterators``) here.

Only reads and calls made by program code (not thunder_rs's, torch's or the standard library's
own) count, and nothing here runs for a program that makes none of them: their per-call cost is
only in the entries that carry such guards.
"""

import builtins
import operator
import sys
import contextlib
import threading
import types

import torch

from thunder_rs.core.acquisition import reparametrize
from thunder_rs.core.acquisition.logged import end_filters, install_logged, note_filters
from thunder_rs.core.acquisition.stdlib_frames import site_of
from thunder_rs.core.acquisition.stdlib_readers import put_back_readers, put_readers
from thunder_rs.core.acquisition.stdlib_reads import install_reads
from thunder_rs.core.base.proxies import SymbolicSize
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.core.state.collector import keep_out
from thunder_rs.core.state.handed_effects import passes_on
from thunder_rs.core.state.hook import is_program, thread_state
from thunder_rs.errors import ThunderNotImplementedError

# -- iterators -------------------------------------------------------------------------------------

_builtin_next = builtins.next
_tracings = 0
_tracings_lock = threading.Lock()


def _next(iterator, *default):
    observer = thread_state.observer
    if observer is not None and not thread_state.inside:
        frame = sys._getframe(1)
        if is_program(frame) and observer.reached_from_outside(iterator):
            held = observer.held_as(iterator) or "an argument, a global, a closure cell or an attribute"
            raise ThunderNotImplementedError(
                f"next: the program consumes a {type(iterator).__name__} it did not create at {site_of(frame)}, held "
                f"as {held}; tracing takes its item once, and a compiled call would neither take the next one nor "
                "see it. Take the item outside the jitted function and pass it in"
            )
    return _builtin_next(iterator, *default)


passes_on(_next)  # (a ``map`` of ``os.read`` it advances reads for the program)

# -- len of a tensor -------------------------------------------------------------------------------

_builtin_len = builtins.len


#: Classes no tensor is an instance of, whose instances cannot claim another class (a
#: ``SymbolicSize`` claims ``torch.Size``): ``len`` of one is Python's, without ``isinstance``
#: (which takes ~20 times a ``len``'s time; thousands of ``len`` calls a compile, most of them
#: thunder_rs's own on shapes and bytecode).
_NO_TENSORS = frozenset((list, tuple, dict, str, bytes, set, frozenset, range, torch.Size, SymbolicSize))


def _len(obj):
    """``len(x)`` of a traced tensor in program code: its first size as ``x.shape[0]`` answers it,
    symbolic where that is (Python's ``len`` would take the size's ``__index__``, a guard on its
    value: a compile per length where the program only passes the length on to torch, as
    ``torch.arange(len(x))``). A decision on it, or a plain int taken of it, guards as for
    ``x.shape[0]``; anything else is Python's ``len``."""
    if type(obj) in _NO_TENSORS:
        return _builtin_len(obj)
    if isinstance(obj, torch.Tensor) and thread_state.observer is not None and not thread_state.inside:
        if is_program(sys._getframe(1)):
            n = obj.__len__()  # (a 0-dim tensor raises eager's TypeError)
            return n if type(n) is SymInt else operator.index(n)
    return _builtin_len(obj)


def _generator_position(gen):
    frame = gen.gi_frame
    return None if frame is None else frame.f_lasti


@contextlib.contextmanager
def consuming_iterators(flat_inputs: list):
    """While the ``with`` body traces a program, ``next`` refuses to consume iterators the program
    did not create (process-wide, held by a count: several threads may trace at once). A generator
    passed in that the program advanced another way (``for v in gen``) is refused after. The clocks
    and the system's entropy refuse to be read by program code (``stdlib_readers.put_readers``) meanwhile, and
    what the garbage collector runs is not observed (``collector``). Notes the warnings filters the
    tracing began with (``logged.in_programs_catch_warnings``), and ``functional_call`` checks what it is
    given (``reparametrize``)."""
    global _tracings
    generators = [
        (i, g, _generator_position(g)) for i, g in enumerate(flat_inputs) if isinstance(g, types.GeneratorType)
    ]
    with _tracings_lock:
        _tracings += 1
        builtins.next = _next
        builtins.len = _len
        keep_out()  # the garbage collector's callbacks and finalizers are not the program
        put_readers()
        reparametrize.put()
    outer_filters = note_filters()
    try:
        yield
    finally:
        end_filters(outer_filters)
        with _tracings_lock:
            _tracings -= 1
            if not _tracings:
                builtins.next = _builtin_next
                builtins.len = _builtin_len
                put_back_readers()
                reparametrize.put_back()
    for i, gen, position in generators:
        if _generator_position(gen) != position:
            raise ThunderNotImplementedError(
                f"thunder_rs.jit: the program consumed the generator {gen.__qualname__} passed as its input {i} (a "
                "for loop, list() or next() over it); tracing took its items once, and a compiled call would neither "
                "take them again nor see them. Pass the items (a list or a tensor) instead"
            )


# -- installing ------------------------------------------------------------------------------------

_installed: list = []


def install() -> None:
    """Puts the wrappers in, once (they call straight through outside tracing)."""
    if _installed:
        return
    _installed.append(True)
    install_reads()
    install_logged()
