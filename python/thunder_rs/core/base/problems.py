"""What ``thunder_rs.examine`` collects instead of raising: each construct thunder_rs cannot
compile, noted where it is met, after which tracing goes on where a stand-in value lets it.

Outside ``examine`` nothing is collected: ``note`` returns False and the caller raises as usual.
"""

import contextlib
import contextvars
from dataclasses import dataclass

from thunder_rs.core.base.userframe import user_location

_problems: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_problems", default=None)

FALLBACK = "eager fallback"
DATA_DEPENDENT = "data-dependent"
INPLACE_LEAF = "in-place on leaf"
UNSUPPORTED = "unsupported call"
STOPPED = "error (tracing stopped)"


@dataclass(frozen=True)
class Problem:
    kind: str
    #: the op or construct, such as ``torch.Tensor.__bool__``
    what: str
    #: ``file:line`` of the user's code
    where: str
    detail: str = ""


def collecting() -> bool:
    return _problems.get() is not None


@contextlib.contextmanager
def collect():
    """Collects the problems noted in this context into the list it yields."""
    problems: list = []
    token = _problems.set(problems)
    try:
        yield problems
    finally:
        _problems.reset(token)


def note(kind: str, what: str, detail: str = "", where: str | None = None) -> bool:
    """Records a problem when ``examine`` collects them and returns True (the caller goes on with
    a stand-in); returns False otherwise (the caller raises)."""
    problems = _problems.get()
    if problems is None:
        return False
    problems.append(Problem(kind, what, where if where is not None else user_location(), detail))
    return True


#: What a data-dependent read gives while ``examine`` goes on (the branch taken is a guess).
_STAND_INS = {"__bool__": True, "__int__": 1, "__index__": 1, "__float__": 1.0, "__complex__": 1 + 0j, "item": 1}


def data_dependent_stand_in(name: str):
    """The value ``examine`` goes on with after noting the read ``name``, or None when there is none."""
    return _STAND_INS.get(name)
