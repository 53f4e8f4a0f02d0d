"""What thunder_rs reports through Python's ``logging``, under the ``thunder_rs`` logger.

Its children: ``thunder_rs.recompiles`` (each compilation and why the cache missed),
``thunder_rs.fallbacks`` (each op recorded as an eager fallback, with the user's line),
``thunder_rs.passes`` (the seconds each compile stage took), ``thunder_rs.inductor`` (Inductor's
start-up and each region it compiles, with its time and which cache answered) and
``thunder_rs.dump`` (the traces ``THUNDER_RS_DUMP`` names). All log at INFO (but for one WARNING
on ``thunder_rs.inductor`` when a compile runs long, shown by default). By default their level
is unset, so nothing is shown unless the user configures them;
``THUNDER_RS_LOG=recompiles,fallbacks,passes,inductor`` (or ``all``), like
``TORCH_LOGS``, or ``thunder_rs.set_logs(recompiles=True)`` sets their level, and when no handler
would see the records installs a stderr handler on the ``thunder_rs`` logger (never the root's).

Records are made only on the compile path (a cache miss, a trace): a cache hit logs nothing. Rust
never writes to the process's stderr; it marks the stages to dump and they are shown here, so
``logging`` configuration, pytest's capture and ``contextlib.redirect_stderr`` all see them.
"""

import logging
import os
import sys

from thunder_rs import _core
from thunder_rs.errors import ThunderValueError

logger = logging.getLogger("thunder_rs")
recompiles_logger = logging.getLogger("thunder_rs.recompiles")
fallbacks_logger = logging.getLogger("thunder_rs.fallbacks")
passes_logger = logging.getLogger("thunder_rs.passes")
inductor_logger = logging.getLogger("thunder_rs.inductor")
#: Trace dumps (``THUNDER_RS_DUMP=dce,cse`` or ``all``), at INFO.
dump_logger = logging.getLogger("thunder_rs.dump")

#: The names ``THUNDER_RS_LOG`` and ``set_logs`` take, and their loggers.
LOG_NAMES = {
    "recompiles": recompiles_logger,
    "fallbacks": fallbacks_logger,
    "passes": passes_logger,
    "inductor": inductor_logger,
}
LOG_ENV = "THUNDER_RS_LOG"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at each record (pytest's capture, ``redirect_stderr``)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("[%(name)s] %(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it
        pass


_handler = _StderrHandler()


def set_logs(
    *,
    all: bool | int | None = None,
    recompiles: bool | int | None = None,
    fallbacks: bool | int | None = None,
    passes: bool | int | None = None,
    inductor: bool | int | None = None,
) -> None:
    """Turns thunder_rs's log records on or off, as ``torch._logging.set_logs`` does torch's.

    Each argument is True (INFO), a ``logging`` level, or False/None (the logger's level unset:
    shown only as the user's own configuration says). ``all`` applies to every name not given.
    A call replaces the previous setting of every name. When some name is on and no handler would
    see its records, a stderr handler is installed on the ``thunder_rs`` logger."""
    given = {"recompiles": recompiles, "fallbacks": fallbacks, "passes": passes, "inductor": inductor}
    for name, value in given.items():
        if value is None:
            value = all
        if value is not None and (not isinstance(value, (bool, int))):
            raise ThunderValueError(
                f"set_logs: {name} must be a bool or a logging level, got {value!r} (argument {name})"
            )
        level = logging.INFO if value is True else (logging.NOTSET if value in (None, False) else value)
        LOG_NAMES[name].setLevel(level)
    _install_handler()


def _install_handler() -> None:
    on = any(log.level != logging.NOTSET for log in LOG_NAMES.values())
    if on and _handler not in logger.handlers and not logger.hasHandlers():
        logger.addHandler(_handler)
    elif not on:
        logger.removeHandler(_handler)


def parse_log_setting(text: str) -> dict:
    """``THUNDER_RS_LOG``'s value (``recompiles,fallbacks``, ``all``) as ``set_logs`` arguments;
    an unknown name is an error listing the valid ones."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    valid = ["all", *LOG_NAMES]
    for name in names:
        if name not in valid:
            raise ThunderValueError(f"{LOG_ENV}: unknown log name {name!r}; valid names: {', '.join(valid)}")
    return {name: True for name in names}


def configure_from_env() -> None:
    """Applies ``THUNDER_RS_LOG`` when it is set (at import)."""
    text = os.environ.get(LOG_ENV)
    if text:
        set_logs(**parse_log_setting(text))


def log_compile(fn_name: str, misses: int, reason: str, seconds: float, stages: dict) -> None:
    """One record per compilation: why the cache missed (``recompiles``), the time each stage took
    (``passes``)."""
    if recompiles_logger.isEnabledFor(logging.INFO):
        what = "compiled" if misses == 1 else f"recompiled (compilation {misses})"
        recompiles_logger.info("%s %s: %s", fn_name, what, reason)
    if passes_logger.isEnabledFor(logging.INFO):
        parts = ", ".join(f"{stage} {s * 1e3:.3f} ms" for stage, s in stages.items())
        passes_logger.info("%s compiled in %.3f ms: %s", fn_name, seconds * 1e3, parts)


def log_dynamic_off(fn_name: str, why: str) -> None:
    """A record that ``fn_name`` compiles with constant sizes from now on: a compile with
    symbolic sizes failed (``recompiles``)."""
    if recompiles_logger.isEnabledFor(logging.INFO):
        recompiles_logger.info("%s: symbolic sizes failed, compiling for each size from now on: %s", fn_name, why)


def log_fallback(name: str, location) -> None:
    """A record that ``name`` runs as an eager fallback; ``location()`` gives the user's line
    (called only when the record is made)."""
    if fallbacks_logger.isEnabledFor(logging.INFO):
        fallbacks_logger.info("%s runs eagerly (no thunder_rs decomposition) at %s", name, location())


def log_dumps(name: str, traces, backward_traces) -> None:
    """Shows every trace whose stage ``THUNDER_RS_DUMP`` names: through the ``thunder_rs.dump``
    logger when logging is configured for it, else on ``sys.stderr``."""
    for half, stage_traces in (("", traces), ("backward ", backward_traces)):
        for trace in stage_traces:
            if trace.dump:
                note = f"# {trace.note}\n" if trace.note else ""
                _show(f"# thunder_rs: {name}: {half}after {trace.label} ({trace.seconds * 1e6:.1f} µs)\n{note}{trace}")


def _show(text: str) -> None:
    if dump_logger.hasHandlers() and dump_logger.isEnabledFor(logging.INFO):
        dump_logger.info(text)
    else:
        print(text, file=sys.stderr)


def checked_passes(passes) -> tuple:
    """``passes`` as a tuple of registered pass names; anything else is an error naming the
    registered ones."""
    if isinstance(passes, str) or not all(isinstance(p, str) for p in passes):
        raise ThunderValueError(
            f"jit: passes must be a list of registered pass names, got {passes!r} (argument passes)"
        )
    known = _core.registered_passes()
    for name in passes:
        if name not in known:
            raise ThunderValueError(
                f"jit: no pass is registered as {name!r}; registered: {', '.join(known)} (argument passes)"
            )
    return tuple(passes)
