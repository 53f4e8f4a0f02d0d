"""Text of symbolic sizes that the program only prints or logs: made again by every call, from
that call's sizes.

Text made from a size holds its value, so making it specialises the size (``SymInt.__str__``):
``print(f"batch of {x.shape}")`` compiled once per size. Where the caller's bytecode shows that
the text goes straight into an argument of ``print`` or of a logging call
(``caller_code.only_printed``), nothing reads it but that call, which tracing records instead of
making and every compiled call makes again after running (``acquisition.effects``, ``print`` and
``LogCall``). There the size's text is a placeholder: two private-use characters around the index
of the size in this trace's list (``formatting``). The recorded call takes the text as a ``Text``
(``resolved``), and each call renders it with its own sizes as eager would have (``format(T, spec)``,
``str(T)``, ``repr(T)``). Logging at a level that is off drops the text unread, as eager does.
"""

import contextvars
import operator
import re

_OPEN, _CLOSE = "\U000f8000", "\U000f8001"  # (Unicode's supplementary private use area)
_PLACEHOLDER = re.compile(f"{_OPEN}(\\d+){_CLOSE}")

#: The sizes the trace under way formatted as placeholders, as ``(size, render)``; None when no
#: trace records its prints.
_formatted: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_formatted", default=None)


def formatting(sizes: list):
    """Placeholders index ``sizes`` while the returned token is set (``effects.recording_prints``)."""
    return _formatted.set(sizes)


def stop_formatting(token) -> None:
    _formatted.reset(token)


def recording() -> bool:
    """Whether a trace under way records its prints (placeholders can be made)."""
    return _formatted.get() is not None


def renderer(spec: str | None):
    """How eager makes a size's text: ``format(T, spec)``, or ``repr`` for ``spec`` None. None
    where that may fail for some value (``format(T, "c")``): the size is then specialised."""
    if spec is None:
        return repr
    if spec.endswith("c"):
        return None
    return operator.methodcaller("__format__", spec)


def placeholder(size, render) -> str | None:
    """A placeholder for the text ``render`` makes of ``size``'s value on each call; None where no
    trace records its prints, or ``render`` is None."""
    sizes = _formatted.get()
    if sizes is None or render is None:
        return None
    sizes.append((size, render))
    return f"{_OPEN}{len(sizes) - 1}{_CLOSE}"


class Text:
    """Printed text holding sizes: ``parts`` are strings and ``(size, render)`` pairs."""

    __slots__ = ("parts",)

    def __init__(self, parts: list):
        self.parts = parts


def _text(text: str, sizes: list) -> "str | Text":
    if _OPEN not in text:
        return text
    pieces = _PLACEHOLDER.split(text)
    return Text([piece if k % 2 == 0 else sizes[int(piece)] for k, piece in enumerate(pieces)])


def resolved(value):
    """``value`` (a printed or logged value: a string, or a tuple, list or dict holding some) with
    each string that holds placeholders a ``Text``."""
    sizes = _formatted.get()
    if not sizes:
        return value
    kind = type(value)
    if kind is str:
        return _text(value, sizes)
    if kind in (tuple, list):
        return kind(map(resolved, value))
    if kind is dict:
        return {k: resolved(v) for k, v in value.items()}
    return value


def at_hints(value):
    """``value`` (as ``resolved`` takes) with each placeholder the text of its size when traced: for
    a ``print`` or logging call made while no trace records it (thunder_rs's own code running the
    program's), which prints as eager would have on this call."""
    sizes = _formatted.get()
    if not sizes:
        return value
    kind = type(value)
    if kind is str:
        text = _text(value, sizes)
        if type(text) is str:
            return text
        return "".join(p if type(p) is str else p[1](p[0].expr.hint) for p in text.parts)
    if kind in (tuple, list):
        return kind(map(at_hints, value))
    if kind is dict:
        return {k: at_hints(v) for k, v in value.items()}
    return value


def specialised(text: Text) -> str:
    """``text`` made of its sizes' values, each size specialised: for a reader of the text itself (a
    warnings filter that matches messages), which a compiled call cannot make again."""
    return "".join(p if type(p) is str else p[1](p[0].__index__()) for p in text.parts)
