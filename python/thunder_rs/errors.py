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


def check(condition: bool, op: str, message, exc=ThunderValueError) -> None:
    """Raises ``exc("op: message")`` unless ``condition``; ``message`` may be a callable."""
    if not condition:
        raise exc(f"{op}: {message() if callable(message) else message}")
