"""Executors: who runs each bound symbol of an execution trace.

Executors are tried in priority order; the torch executor comes last and runs everything.
"""

from thunder_rs.executors.extend import (  # noqa: F401
    Executor,
    FusionExecutor,
    OperatorExecutor,
    Region,
    add_operator_executor,
    default_executors,
    deregister_executor,
    known_executor_names,
    register_executor,
    register_named_executor,
    resolve_executors,
)


def get_default_executors() -> list[Executor]:
    """The executors ``jit`` uses when given none, in priority order (the torch executor last)."""
    return default_executors()
