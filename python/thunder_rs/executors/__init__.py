"""Executors: who runs each bound symbol of an execution trace.

Executors are tried in priority order; the torch executor comes last and runs everything.
"""

from thunder_rs.core.lang.executor_api import (  # noqa: F401
    Executor,
    FusionExecutor,
    Implementation,
    OperatorExecutor,
    Region,
    add_operator_executor,
    default_executors,
    deregister_executor,
    known_executor_names,
    register_executor,
    register_lazy_executor,
    register_named_executor,
    resolve_executors,
)

# Importing Inductor takes seconds, which jit without it must not pay: these register on first use.
register_lazy_executor("inductor", "thunder_rs.executors.inductor_ex")
register_lazy_executor("nvfuser", "thunder_rs.executors.nvfuser_ex")


def get_default_executors() -> list[Executor]:
    """The executors ``jit`` uses when given none, in priority order (the torch executor last)."""
    return default_executors()
