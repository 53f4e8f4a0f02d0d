"""``torch.func.functional_call`` on a module whose state is not the traced program's own, given
tensors the program captured: refused, naming the line.

``functional_call(module, params, args)`` (``torch.nn.utils.stateless``) puts the tensors of
``params`` in the module's stores, runs it, and puts its own back. On the jitted module's modules
(the clones the program runs) and with tensors passed in as arguments or computed by the program,
the trace records that as any other read. On a module reached from a global, a closure or an
argument, given tensors the program captured from a global or a closure (``params`` not passed
in), the reads of the module's stores happen while they hold the dict's tensors, which no compiled
call could tell from the module's own: the program was refused with a reason about the module's
state ("Linear.bias changed") that named neither ``functional_call`` nor the dict. While a program
is traced, ``stateless._reparametrize_module`` (which both ``functional_call``\\ s use) refuses
such a call first.
"""

import torch
import torch.nn.utils.stateless as stateless

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.state.bystanders import traced_modules
from thunder_rs.core.state.observe import read_module_whole, thread_state
from thunder_rs.errors import ThunderNotImplementedError

_original = stateless._reparametrize_module


def _held(module, name: str):
    """The tensor ``module`` holds at the dotted ``name`` (a parameter or buffer), or None."""
    path, _, leaf = name.rpartition(".")
    try:
        owner = module.get_submodule(path) if path else module
    except AttributeError:
        return None
    return owner._parameters.get(leaf, owner._buffers.get(leaf))


def _captured(value, module, name: str) -> bool:
    """Whether ``value`` is a tensor the program captured that ``module`` does not hold at ``name``."""
    return isinstance(value, torch.Tensor) and not isinstance(value, TensorProxy) and value is not _held(module, name)


def _checked(module, parameters_and_buffers, *args, **kwargs):
    traced = thread_state.observer is not None and not thread_state.inside
    if traced and not any(module is c for c in traced_modules()):
        for name, value in parameters_and_buffers.items():
            if _captured(value, module, name):
                raise ThunderNotImplementedError(
                    f"thunder_rs.jit: torch.func.functional_call at {user_location()} puts tensors the program "
                    f"captured ({name!r} of a dict that is not an argument) into a {type(module).__name__} that is not "
                    "a module of the jitted module: tracing would read the module's state while it holds them, and a "
                    "compiled call could not tell them from its own. Pass the dict as an argument of the jitted "
                    "function, or jit a module that holds the module"
                )
        # Its forward runs from library code, whose reads of the attributes of a module not
        # cloned for tracing (``self.training``, ``self.momentum``) the observer does not see:
        # all are guarded (a global model's ``eval()`` kept the training call's batch statistics).
        read_module_whole(module, user_location())
    return _original(module, parameters_and_buffers, *args, **kwargs)


def put() -> None:
    """Makes ``functional_call`` check its module and tensors (while some program is traced)."""
    stateless._reparametrize_module = _checked


def put_back() -> None:
    stateless._reparametrize_module = _original
