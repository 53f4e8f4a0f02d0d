"""The observer's profile hook (``_core.CallObserver``) on each thread, and what it reports:
calls and returns of the program's code go to the observer of the acquisition in progress
(``observe.Observer``), unless the thread is inside thunder_rs's own work or a module body the
program's call is importing runs them."""

import threading
import warnings

from thunder_rs import _core
from thunder_rs.core.state.c_effects import C_WRITERS, refuse_c_effect
from thunder_rs.core.state.clocks import C_READERS, refuse_c_call
from thunder_rs.core.state.code_reads import IMPORTING, classify, in_stdlib, interesting
from thunder_rs.core.state.cuda_calls import C_CUDA, refuse_cuda_call


class _ThreadState(threading.local):
    """Per thread: the profile hook (it keeps which code objects are interesting across compiles),
    the observer of the acquisition in progress, and how deep the thread is inside thunder_rs's
    handling of a torch call (functions run there, such as torch's internals or modules they
    import, are not the program's)."""

    hook = None
    observer = None
    inside = 0


thread_state = _thread = _ThreadState()


def thread_hook():
    if _thread.hook is None:
        _thread.hook = _core.CallObserver(classify, _dispatch_call, _dispatch_return)
        _thread.hook.watch_c_calls([*C_READERS, *C_WRITERS, *C_CUDA], _dispatch_c_call)
    return _thread.hook


def importing_frame(frame, entry) -> bool:
    """Whether ``frame`` runs for a module being imported (a module body between it and the
    observer's entry): a library imported lazily on the first call (``torch.utils.checkpoint``
    imports numpy, sympy, Dynamo) fills its registries then, which is not the program's state."""
    f = frame.f_back
    while f is not None and f is not entry:
        if f.f_code.co_name == "<module>":
            return True
        f = f.f_back
    return False


def _stdlib_code(code) -> bool:
    return in_stdlib(code.co_filename)


def program_frame(frame, passing=_stdlib_code, skip: int = 0, imports: bool = True):
    """The program's frame that runs ``frame``: the first from it outward whose code ``passing``
    does not pass (the standard library's: ``os.getenv``, ``json.dump`` writing to the program's
    file), after ``skip`` more (a ``stacklevel``), if it runs the program's code (``is_program``;
    without ``imports``, a module body being imported is not looked for); else None (thunder_rs's,
    torch's or the import system's code, a library's setup at import)."""
    while frame is not None and passing(frame.f_code):
        if frame.f_code.co_filename.startswith(IMPORTING):
            return None
        frame = frame.f_back
    for _ in range(skip):
        if frame is None:
            return None
        frame = frame.f_back
    if frame is None or not (is_program(frame) if imports else interesting(frame.f_code)):
        return None
    return frame


def is_program(frame) -> bool:
    """Whether ``frame`` runs the program's code: not a library's, nor a module body's that the
    program's first call imports (a library's setup at import happens once in eager too)."""
    observer = _thread.observer
    return interesting(frame.f_code) and not (observer is not None and importing_frame(frame, observer.entry))


def _dispatch_call(frame, importing: bool) -> bool:
    """A call of an interesting code (``classify``). ``importing``: a module body started since the
    hook did runs (else none is between the frame and the entry, and the walk is skipped). True
    when the code's returns are wanted too (``StateContainers.returns_wanted``)."""
    observer = _thread.observer
    if observer is None or _thread.inside or (importing and importing_frame(frame, observer.entry)):
        return False
    _thread.inside += 1
    try:
        return observer._on_call(frame)
    finally:
        _thread.inside -= 1


def _dispatch_return(frame, importing: bool, value=None) -> None:
    """A return of a code whose returns are wanted, ``value`` what it returns (None when raising,
    or from an extension built before the hook passed it)."""
    observer = _thread.observer
    if observer is not None and not _thread.inside and not (importing and importing_frame(frame, observer.entry)):
        own_work(observer._on_return, frame, value)


def _dispatch_c_call(frame, function, importing: bool, interesting: bool):
    """A call of a watched builtin by ``frame``: refused if it reads the clock (``clocks``), marks
    a point among CUDA kernels (``cuda_calls``) or makes an effect outside the program
    (``c_effects``); by a frame that is not the program's, an effect only where the standard
    library makes it for the program (``json.dump(obj, f)``)."""
    observer = _thread.observer
    if observer is None or _thread.inside:
        return
    program = frame if interesting else program_frame(frame, imports=False)
    if program is None or (importing and importing_frame(program, observer.entry)):
        return
    if interesting:
        refuse_c_call(frame, function)
        refuse_cuda_call(frame, function)
    refuse_c_effect(frame, function, observer)


def own_work(handle, *args):
    """``handle(*args)``, the observer's work, inside thunder_rs: its bytecode walks (a ``next``
    per instruction) and reads of state are not the program's, so the standard library's hooks for
    the program (``stdlib_state``) let them through at once."""
    _thread.inside += 1
    try:
        return handle(*args)
    finally:
        _thread.inside -= 1


_warned: list = []


def warn_profiler_once() -> None:
    if not _warned:
        _warned.append(True)
        warnings.warn(
            "thunder_rs.jit: a profiler holds this thread's profile hook (sys.setprofile), so only the "
            "reads of the jitted function and of module forwards are guarded, not those of functions they "
            "call; compile before profiling for full guards",
            stacklevel=5,
        )
