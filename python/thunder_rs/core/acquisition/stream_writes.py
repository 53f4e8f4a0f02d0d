"""``sys.stdout.write(s)`` and ``sys.stderr.write(s)`` a traced program makes: made again by every
call, as its ``print`` calls are (``effects``).

The observer's hook sees the program call a stream's ``write`` but not what it writes, and would
refuse it (``core.state.c_effects``). While some program is traced, ``sys.stdout`` and
``sys.stderr`` are stand-ins (``put_streams``, ``put_back_streams``) that pass everything to the
stream they stand for, except the ``write``, ``writelines`` and ``flush`` calls the program makes
(itself, or the standard library for it: ``pprint.pprint``), which are recorded among its prints:
every compiled call writes the text to the ``sys.stdout`` (``sys.stderr``) of that call, in
program order with the prints and logging.
Text that formats a traced tensor is refused as print refuses it. A stream the program bound before
it was traced (``out = sys.stdout`` at import) is the stream itself, and its writes are refused.
"""

import sys

from thunder_rs.core.acquisition.effects import recorded_effects, refuse_formatted
from thunder_rs.core.lang.printed_text import resolved
from thunder_rs.core.state.hook import program_frame, thread_state


class CurrentStream:
    """Where a replayed write goes: ``sys``'s ``name`` stream when the compiled call makes it."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def write(self, text):
        return getattr(sys, self.name).write(text)

    def flush(self) -> None:
        getattr(sys, self.name).flush()


class StandIn:
    """``sys.stdout`` (``sys.stderr``) while programs are traced: ``stream`` itself to everyone,
    but for the program's ``write``, recorded."""

    def __init__(self, stream, name: str):
        object.__setattr__(self, "_stream", stream)
        object.__setattr__(self, "_name", name)

    def write(self, text):
        recorded, program = self._program_call()
        if program is None:
            return self._stream.write(text)
        return self._record(recorded, program, text)

    def _record(self, recorded: list, program, text):
        site, what = f"{program.f_code.co_filename}:{program.f_lineno}", f"sys.{self._name}.write: the text written"
        refuse_formatted((text,), what, site, "print the tensor (print(x)) instead")
        if not isinstance(text, str):
            return self._stream.write(text)  # (its TypeError, as eager raises it)
        recorded.append(resolved(((text,), {"end": "", "file": CurrentStream(self._name)})))
        return len(text)

    def writelines(self, lines) -> None:
        recorded, program = self._program_call()
        if program is None:
            return self._stream.writelines(lines)
        for line in lines:
            self._record(recorded, program, line)
        return None

    def flush(self) -> None:
        recorded, program = self._program_call()
        if program is None:
            return self._stream.flush()
        recorded.append(((), {"end": "", "file": CurrentStream(self._name), "flush": True}))
        return None

    def _program_call(self):
        """``(the recorded effects, the program's frame)`` when the caller of the caller is the
        program's code (or the standard library's for it) while it is traced; else ``(None, None)``."""
        recorded = recorded_effects()
        observer = thread_state.observer
        if recorded is None or observer is None or thread_state.inside:
            return None, None
        program = program_frame(sys._getframe(2))
        if program is None:
            return None, None
        return recorded, program

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def __setattr__(self, name, value) -> None:
        setattr(self._stream, name, value)


def put_streams() -> None:
    """Puts the stand-ins in (while some program is traced)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and type(stream) is not StandIn:
            setattr(sys, name, StandIn(stream, name))


def put_back_streams() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if type(stream) is StandIn:
            setattr(sys, name, stream._stream)
