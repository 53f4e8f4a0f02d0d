"""thunder_rs exception types.

Each subclasses :class:`ThunderError` and the matching Python built-in, so ``except ValueError``
in user code keeps working. Messages start with the op and name the offending argument.
"""


class ThunderError(Exception):
    """Base class of every error thunder_rs raises on bad input."""


class ThunderValueError(ThunderError, ValueError):
    pass


class ThunderTypeError(ThunderError, TypeError):
    pass


class ThunderIndexError(ThunderError, IndexError):
    pass


class ThunderRuntimeError(ThunderError, RuntimeError):
    pass


class ThunderNotImplementedError(ThunderError, NotImplementedError):
    pass


class ThunderOverflowError(ThunderError, OverflowError):
    """For a number no scalar of eager's holds (a Python int past uint64, as its argument parser says)."""


class ThunderAssertionError(ThunderError, AssertionError):
    """For the few checks torch itself makes with ``assert`` (``F.embedding``'s padding_idx)."""


def check(condition: bool, op: str, message, exc=ThunderValueError) -> None:
    """Raises ``exc("op: message")`` unless ``condition``; ``message`` may be a callable."""
    if not condition:
        raise exc(f"{op}: {message() if callable(message) else message}")


#: Built-in exception type -> its thunder_rs subclass; the declared ones first, so that a
#: ``RuntimeError`` raised in generated code becomes ``ThunderRuntimeError`` itself.
_runtime_classes: dict[type, type] = {
    ValueError: ThunderValueError,
    TypeError: ThunderTypeError,
    IndexError: ThunderIndexError,
    RuntimeError: ThunderRuntimeError,
    NotImplementedError: ThunderNotImplementedError,
    AssertionError: ThunderAssertionError,
    OverflowError: ThunderOverflowError,
}


def _thunder_class(exc_type: type) -> type:
    """A subclass of both ThunderError and ``exc_type``, so ``except ZeroDivisionError`` still works."""
    cls = _runtime_classes.get(exc_type)
    if cls is None:
        try:
            cls = type(f"Thunder{exc_type.__name__}", (ThunderError, exc_type), {"__module__": __name__})
        except TypeError:
            cls = ThunderRuntimeError
        _runtime_classes[exc_type] = cls
    return cls


def thunder_error_like(exc: Exception, message: str) -> Exception:
    """A thunder_rs error of ``exc``'s built-in type (``RuntimeError`` stays one) saying ``message``."""
    try:
        return _thunder_class(type(exc))(message)
    except Exception:
        return ThunderRuntimeError(message)


#: what a compiled call that raised leaves to undo, as eager's ``with`` blocks would have on the
#: way out (``cuda_queue``: the streams it entered): each called before its error is raised
UNDO_AFTER_ERROR: list = []


def runtime_error(exc: Exception, filename: str, source: str) -> Exception:
    """Re-labels an exception raised inside generated code with the call that raised it (after
    undoing what the call left: ``UNDO_AFTER_ERROR``)."""
    for undo in UNDO_AFTER_ERROR:
        undo()
    if isinstance(exc, ThunderError):
        return exc
    tb, lineno = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    if lineno is None:
        return exc
    line = source.splitlines()[lineno - 1].split("  #")[0].strip()
    callee = line.split("=", 1)[-1].split("(", 1)[0].strip()
    return thunder_error_like(exc, f"{callee}: {exc} (execution trace line {lineno}: {line})")


#: The attribute of the program's own error, raised while it was traced, that makes again the process
#: settings it made before raising (``core.acquisition.setters.note_settings_made``).
SETTINGS_MADE = "_thunder_rs_settings_made"


def note_made_again(error: BaseException, again) -> None:
    """Adds ``again`` (a callable) to what ``settings_made_again`` makes again for ``error``."""
    before = error.__dict__.get(SETTINGS_MADE)
    error.__dict__[SETTINGS_MADE] = again if before is None else _both(before, again)


def _both(first, second):
    def both() -> None:
        first()
        second()

    return both


def settings_made_again(error: BaseException) -> None:
    """Makes again the process settings (``sys.path.insert(0, p)``, ``os.environ[k] = v``) that the
    program made before raising ``error`` while traced, which tracing undid: eager, raising there,
    leaves them made. Called where the error leaves the compile, after any compile tried again."""
    again = getattr(error, "__dict__", {}).pop(SETTINGS_MADE, None)
    if again is not None:
        again()
