"""The executors of a program run under torch's autograd (``core.differentiable``: a double
backward, torch.func transforms): the torch executor, after one that runs each custom
``torch.autograd.Function`` whole as ``Fn.apply``. Its traced decomposition would be
differentiated by autograd as plain torch calls, where eager calls the Function's own backward
(a straight-through estimator's, a gradient reversal's)."""

from thunder_rs.core.lang.custom_function import function_symbols
from thunder_rs.core.lang.executor_api import Executor, register_differentiable_executor


def _applying(cls):
    """``cls.apply`` returning its outputs as the trace binds them (a tuple of one is its tensor)."""

    def apply(*args):
        out = cls.apply(*args)
        return out[0] if isinstance(out, tuple) and len(out) == 1 else out

    apply.__name__ = f"apply_{cls.__name__}"
    return apply


def _register_functions() -> None:
    """Registers every custom Function traced so far (``Executor.sync``)."""
    for cls, sid in function_symbols():
        if sid not in autograd_function_ex.registry:
            autograd_function_ex.register_implementation(sid, _applying(cls), impl_name=f"apply_{cls.__name__}")


autograd_function_ex = register_differentiable_executor(Executor("autograd_function", sync=_register_functions))

__all__ = ["autograd_function_ex"]
