"""Thunder's ``extend`` names for the executor protocol, which lives in
``thunder_rs.core.lang.executor_api`` (core depends on the protocol, not on the executors)."""

from thunder_rs.core.lang.executor_api import (  # noqa: F401
    Executor,
    FusionExecutor,
    Implementation,
    OperatorExecutor,
    Region,
    Registry,
    add_operator_executor,
    default_executors,
    deregister_executor,
    executor_table,
    known_executor_names,
    register_executor,
    register_lazy_executor,
    register_named_executor,
    resolve_executors,
    symbol_key,
    whole_runners,
)
