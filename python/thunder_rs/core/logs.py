"""What thunder_rs reports through Python's ``logging``: the stages ``THUNDER_RS_DUMP`` names.

Rust never writes to the process's stderr; it marks the stages to dump and they are shown here,
so ``logging`` configuration, pytest's capture and ``contextlib.redirect_stderr`` all see them.
"""

import logging
import sys

from thunder_rs import _core
from thunder_rs.errors import ThunderValueError

#: Trace dumps (``THUNDER_RS_DUMP=dce,cse`` or ``all``), at INFO.
dump_logger = logging.getLogger("thunder_rs.dump")


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
        raise ThunderValueError(f"jit: passes must be a list of registered pass names, got {passes!r} (argument passes)")
    known = _core.registered_passes()
    for name in passes:
        if name not in known:
            raise ThunderValueError(f"jit: no pass is registered as {name!r}; registered: {', '.join(known)} (argument passes)")
    return tuple(passes)
