"""The clocks, the system's entropy and the effects outside the program that a traced program's
code may reach through the standard library: refused while it is traced, naming the line
(``stdlib_state`` tells the whole story). ``put_readers`` puts them in, with the other stand-ins
of a tracing (setters, file-system reads, ``open``, the streams), ``put_back_readers`` takes
them out once no program is traced.
"""

import copy
import os
import random
import sys
import time
from typing import Any

from thunder_rs.core.acquisition.file_reads import put_back_open, put_open
from thunder_rs.core.acquisition.library_settings import put_back_library_settings, put_library_settings
from thunder_rs.core.acquisition.cuda_state import put_back_cuda_state, put_cuda_state
from thunder_rs.core.acquisition.setters import put_back_setters, put_setters
from thunder_rs.core.acquisition.stdlib_frames import program_frame_of, site_of, stdlib_entry, tracing
from thunder_rs.core.acquisition.stream_writes import put_back_streams, put_streams
from thunder_rs.core.state.cached_reads import put_back_cached, register_stand_in
from thunder_rs.core.state.fs_reads import put_back_fs_readers, put_fs_readers
from thunder_rs.core.state.handed_effects import put_back_held, put_back_module_stand_ins, put_module_stand_ins
from thunder_rs.errors import ThunderNotImplementedError

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


def _clock(name: str, real=None, module: str = "time"):
    """A reader standing in for ``real``, ``module``'s ``name`` (``time``'s by default), that refuses
    to be read by program code while it is traced."""
    real, at = real or _clocks[name], _TIME_TAKING.get(name)

    def read(*args):
        frame: Any = sys._getframe(1)
        program = program_frame_of(frame) if tracing() and (at is None or len(args) <= at or args[at] is None) else None
        if program is not None:
            entry = stdlib_entry(frame, program, f"{module}.{name}")
            raise ThunderNotImplementedError(
                f"{entry}: the program reads the clock at {site_of(program)}; "
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
#: ``resource.getrusage`` where the program imported ``resource`` (``_put_imported_clock``)
_os_times = os.times
_TIMES_READER = _clock("times", _os_times, "os")
register_stand_in(_os_times, _TIMES_READER)


# -- entropy ---------------------------------------------------------------------------------------

_urandom = os.urandom
_getrandom = getattr(os, "getrandom", None)
_seed = random.Random.seed


def _refuse_entropy(what: str) -> None:
    """Refuses the read of the system's entropy by ``what`` if program code made it, directly or
    through the standard library, whose function it called is named."""
    frame: Any = sys._getframe(2)
    program = program_frame_of(frame) if tracing() else None
    if program is not None:
        raise ThunderNotImplementedError(
            f"{stdlib_entry(frame, program, what)}: the program draws from the system's entropy ({what}) at "
            f"{site_of(program)}; tracing draws once, and a compiled call would reuse what it drew. Draw outside the "
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


#: ``(module, name, its own function)``: the clocks of modules the program imported, put in while
#: a program is traced (``resource.getrusage``; ``uuid``'s C clock, which ``uuid1`` reads)
_imported_clocks: list = []


def _put_imported_clock(module_name: str, name: str, owner: str = "time") -> None:
    """Puts a refusing reader for ``module_name``'s ``name``, if the program imported that module."""
    module = sys.modules.get(module_name)
    real = getattr(module, name, None)
    if real is not None and not any(m is module and n == name for m, n, _ in _imported_clocks):
        _imported_clocks.append((module, name, real))
        setattr(module, name, _clock(name, real, owner))


#: Python functions whose call makes an effect outside the program (``core.state.c_effects`` has
#: the C ones), replaced while a program is traced: ``(holder, name, real)``
_effect_makers: list = []


def _refusing_effect(what: str, real):
    """``real`` (``subprocess.Popen``'s process start, ``torch.save``) refusing program code's call
    while it is traced: a compiled call would not make it again."""

    def make(*args, **kwargs):
        frame: Any = sys._getframe(1)
        program = program_frame_of(frame) if tracing() else None
        if program is not None:
            raise ThunderNotImplementedError(
                f"{stdlib_entry(frame, program, what)}: the program calls it at {site_of(program)}, an effect outside "
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
    if torch is not None and "__deepcopy__" not in torch.nn.Module.__dict__:
        torch.nn.Module.__deepcopy__ = _module_deepcopy


def _put_back_effect_makers() -> None:
    while _effect_makers:
        holder, name, real = _effect_makers.pop()
        setattr(holder, name, real)
    torch = sys.modules.get("torch")
    if torch is not None and torch.nn.Module.__dict__.get("__deepcopy__") is _module_deepcopy:
        del torch.nn.Module.__deepcopy__


def _module_deepcopy(self, memo):
    """``copy.deepcopy`` of a module while a program is traced (``torch.nn.Module`` has no
    ``__deepcopy__`` of its own: this one stands in then). By program code, refused naming its
    line: the traced module holds the trace's stand-ins for its tensors, which a copy would keep
    (it was refused as a tensor stored in a list, naming no line). Otherwise copied as without it."""
    frame: Any = sys._getframe(1)
    program = program_frame_of(frame) if tracing() else None
    if program is not None:
        raise ThunderNotImplementedError(
            f"{stdlib_entry(frame, program, 'copy.deepcopy')}: the program copies the module "
            f"{type(self).__name__} at {site_of(program)} while it is traced; a compiled call cannot copy the "
            "module it runs. Copy it outside the jitted function (a teacher or EMA copy kept as an attribute, "
            "updated there), or use torch.func.functional_call with detached copies of its parameters"
        )
    return copy._reconstruct(self, memo, *self.__reduce_ex__(4))


def put_readers() -> None:
    """Puts the refusing clocks and entropy in (under ``_tracings_lock``)."""
    for name, read in _CLOCK_READERS.items():
        setattr(time, name, read)
    os.urandom = random._urandom = _read_entropy  # type: ignore[attr-defined]
    random.Random.seed = _seed_of  # type: ignore[method-assign]
    if _getrandom is not None:
        os.getrandom = _read_getrandom
    os.times = _TIMES_READER
    _put_imported_clock("resource", "getrusage", "resource")
    _put_imported_clock("uuid", "_generate_time_safe")
    _put_effect_makers()
    put_module_stand_ins()
    put_fs_readers()
    put_setters()
    put_cuda_state()
    put_library_settings()
    put_open()
    put_streams()


def put_back_readers() -> None:
    """Puts ``time``'s, ``os``'s, ``random``'s and ``uuid``'s own back, and the clocks the program
    bound (once no program is traced)."""
    for name, real in _clocks.items():
        setattr(time, name, real)
    os.urandom = random._urandom = _urandom  # type: ignore[attr-defined]
    random.Random.seed = _seed  # type: ignore[method-assign]
    if _getrandom is not None:
        os.getrandom = _getrandom
    os.times = _os_times
    while _imported_clocks:
        module, name, real = _imported_clocks.pop()
        setattr(module, name, real)
    _put_back_effect_makers()
    put_back_module_stand_ins()
    put_back_fs_readers()
    put_back_setters()
    put_back_cuda_state()
    put_back_library_settings()
    put_back_held()
    put_back_open()
    put_back_streams()
    put_back_cached()
