"""``logging`` calls and ``warnings.warn`` made by a traced program: recorded, not run, like
``print`` (``effects.py``), and made by every compiled call after running, at the user's line
(``stdlib_state`` tells the whole story).
"""

import functools
import logging
import sys
import threading
import traceback
import warnings

from thunder_rs.core.acquisition.effects import TracedValue, recorded_effects, refuse_formatted
from thunder_rs.core.acquisition.stdlib_frames import guard_read, program_frame_of, site_of, tracing
from thunder_rs.core.lang.printed_text import Text, at_hints, resolved, specialised
from thunder_rs.core.state.cached_reads import register_stand_in
from thunder_rs.core.state.hook import is_program
from thunder_rs.errors import ThunderNotImplementedError

#: Per thread: ``warnings.filters`` when the program's tracing began (``in_programs_catch_warnings``).
_traced = threading.local()


def note_filters():
    """Notes the warnings filters a program's tracing begins with; returns what to give
    ``end_filters`` when it ends (the outer tracing's)."""
    outer = getattr(_traced, "filters", None)
    _traced.filters = warnings.filters
    return outer


def end_filters(outer) -> None:
    _traced.filters = outer


# -- logging and warnings as effects ---------------------------------------------------------------

_logger_log = logging.Logger._log


def _refuse_formatted(text, what: str, frame) -> None:
    instead = "pass the tensor as an argument (log.info('%s', x))"
    refuse_formatted((text,), f"{what}: the text", site_of(frame), instead)


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
        program_frame_of(sys._getframe(1), skip=max(stacklevel, 1) - 1) if recorded is not None and tracing() else None
    )
    if frame is None:
        msg, args = at_hints((msg, args))  # (placeholders of sizes: their values, as traced)
        return _logger_log(self, level, msg, args, exc_info, extra, stack_info, stacklevel + 1)
    _refuse_formatted(msg, f"logging ({self.name!r})", frame)
    if exc_info:
        raise ThunderNotImplementedError(
            f"logging ({self.name!r}): the record logged at {site_of(frame)} carries an exception (exc_info, "
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


def in_programs_catch_warnings() -> bool:
    """Whether the program entered ``warnings.catch_warnings()`` since its tracing began (entering
    one puts a copy of the filters in place): what it does with a warning (records it, ignores it,
    raises it) happens inside the call and is undone when the block ends."""
    return warnings.filters is not getattr(_traced, "filters", warnings.filters)


def _warnings_warn(message, category=None, stacklevel=1, source=None, **kwargs):
    recorded = recorded_effects()
    if recorded is not None and in_programs_catch_warnings():
        # Made now, as eager makes it: ``catch_warnings(record=True)``'s list gets it while traced.
        return _warn(message, category, stacklevel + 1, source, **kwargs)
    frame = sys._getframe(1) if recorded is not None and tracing() and not kwargs else None
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
        guard_read(
            f"whether the warnings filters make the warning at {where[0]}:{where[1]} an error by its text", by_text
        )
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
    guard_read(label, read)
    return read()


def install_logged() -> None:
    """Puts the recorders in (once: ``stdlib_state.install``; they call straight through outside tracing)."""
    logging.Logger._log = _log  # type: ignore[method-assign]
    warnings.warn = _warnings_warn
