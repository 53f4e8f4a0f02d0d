"""Executors: who runs each bound symbol of an execution trace.

Executors are tried in priority order; the torch executor comes last and runs everything.
"""

from thunder_rs.executors.extend import (  # noqa: F401
    Executor,
    OperatorExecutor,
    add_operator_executor,
    default_executors,
    deregister_executor,
    register_executor,
)
