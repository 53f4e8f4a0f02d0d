"""Where the standard library's stand-ins for a traced program look for it: the program's frame a
call of theirs runs for, past the standard library's frames and thunder_rs's that call on for it
(``stdlib_state``, ``stdlib_reads``, ``logged``, ``stdlib_readers``)."""

from typing import Any

from thunder_rs.core.acquisition.setters import settle_later
from thunder_rs.core.state.code_reads import in_stdlib
from thunder_rs.core.state.guards import StateGuard
from thunder_rs.core.state.handed_effects import passing_on
from thunder_rs.core.state.hook import program_frame, thread_state


def _passing(code) -> bool:
    """Code the program's frame is looked for beyond: the standard library's (``os.getenv``,
    ``Mapping.get``, ``Logger.info``), and thunder_rs's ``next`` calling on for the program (a
    ``map`` of ``os.environ.get``: ``handed_effects.passes_on``)."""
    return in_stdlib(code.co_filename) or passing_on(code)


def program_frame_of(frame, skip: int = 0):
    """The program's frame running ``frame`` (``hook.program_frame``), after ``skip`` more."""
    return program_frame(frame, _passing, skip)


def tracing() -> bool:
    return thread_state.observer is not None and not thread_state.inside


def site_of(frame) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def guard_read(label: str, read, show=repr) -> None:
    """Guards the state ``read()`` reads, as it is when the tracing began (``setters.settle_later``)."""
    observer: Any = thread_state.observer
    guard = StateGuard(label, read, read(), show)
    observer.guard_state(guard)
    settle_later(guard)


def stdlib_entry(frame, program, name: str) -> str:
    """What the program called to reach ``frame``: the outermost of the standard library's frames
    from ``frame`` to ``program``'s (``uuid.uuid4``), or ``name`` where it called it directly."""
    while frame is not program:
        if not passing_on(frame.f_code):
            name = f"{frame.f_globals.get('__name__')}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"
        frame = frame.f_back
    return name
