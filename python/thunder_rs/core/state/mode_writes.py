"""Train/eval toggles a traced program makes on modules that are not the jitted module's clones:
a teacher held in a closure, a global or an argument object (``teacher.eval()``, its forward,
``teacher.train()`` in a distillation step).

Tracing runs such a module as it is, so ``nn.Module.train`` sets ``training`` on the user's
modules while the program runs. The reads of ``training`` after the program's own write are the
program's, not state the call found: they are not guarded (a guard on the value the program wrote
refused the toggle, naming torch's line, or compiled again on every call where the caller set
the mode back between calls). After tracing, each module's ``training`` is put back as the call
found it and the last mode the program set becomes a write every call repeats: eager's state
after the call.

The program's other attribute writes to such a module found as state (a global or a closure's:
``encoder.last_length = T``, ``window.size = w``) are kept the same way: while tracing they hold
what the program set (a size among them a symbolic one), later reads of them in the call are the
program's, and after tracing they are put back, each call setting them again with its own values.
Without this they stayed as the trace left them: a compiled call did not set them at all, and a
symbolic trace left its stand-in for a size in the user's module.
"""

import threading

import torch

from thunder_rs.core.state.guards import MISSING
from thunder_rs.core.state.modules import mode_writers, write_epoch

#: A module's stores: a write of a parameter, buffer or submodule changes its structure (not kept here).
_STORES = ("_parameters", "_buffers", "_modules")


class ModeWrites:
    """Records, for one traced program in this thread, the modules whose ``training`` it set and
    what each held before; ``clones`` the ids of the jitted module's clones (whose writes
    ``modules.attribute_writes`` finds)."""

    def __init__(self, clones: set):
        self._clones, self._thread = clones, threading.get_ident()
        #: id -> (module, its ``training`` when the program first set it)
        self._found: dict = {}
        #: ids of the modules the program made (their first ``training`` set in ``__init__``)
        self._made: set = set()
        #: ids of the modules not cloned the program found as state (``reached``), and
        #: ``(id, name)`` -> ``(module, name, the value the call found or MISSING)`` of the other
        #: attributes the program set on them
        self._reached: set = set()
        self._attributes: dict = {}
        self._outer: ModeWrites | None = None

    def __enter__(self):
        self._outer = mode_writers.get(self._thread)  # (a program traced while another is)
        mode_writers[self._thread] = self
        return self

    def __exit__(self, *exc) -> None:
        if self._outer is None:
            mode_writers.pop(self._thread, None)
        else:
            mode_writers[self._thread] = self._outer

    def reached(self, module) -> None:
        """``module``, not a clone, was found as state (a global's, a closure's): the call found it."""
        if id(module) not in self._clones:
            self._reached.add(id(module))

    def note_attribute(self, module, name: str, value) -> None:
        """``module.<name> = value`` is about to run (``nn.Module.__setattr__``): a module found as
        state keeps what it held, to be put back (``undo``). Parameters, buffers and submodules
        are not attributes of the instance dict, and a tensor stored there is refused after
        tracing (``escapes``): left alone."""
        key = id(module)
        if name == "training":
            self.note(module)
            return
        if key not in self._reached or (key, name) in self._attributes:
            return
        held = module.__dict__
        if isinstance(value, (torch.Tensor, torch.nn.Module)) or any(name in held.get(s, ()) for s in _STORES):
            return
        self._attributes[(key, name)] = (module, name, held.get(name, MISSING))

    def note(self, module) -> None:
        """``module.training`` is about to be set (by ``nn.Module.__setattr__``)."""
        key = id(module)
        if key in self._clones or key in self._made or key in self._found:
            return
        held = module.__dict__
        if "training" not in held:
            self._made.add(key)
        else:
            self._found[key] = (module, held["training"])

    def set_by_program(self, module, name: str = "training") -> bool:
        """Whether the program set ``module.<name>`` earlier in the call."""
        return id(module) in self._found if name == "training" else (id(module), name) in self._attributes

    def undo(self) -> list:
        """Puts back each module's ``training`` as the call found it; returns ``(module,
        "training", the last mode the program set)`` for every call to set again."""
        writes = []
        for module, found in self._found.values():
            held = module.__dict__
            writes.append((module, "training", held.get("training", found)))
            held["training"] = found
        for module, name, found in self._attributes.values():
            held = module.__dict__
            writes.append((module, name, held.get(name, MISSING)))
            if found is MISSING:
                held.pop(name, None)
            else:
                held[name] = found
        if writes:
            write_epoch[0] += 1
        self._found.clear()
        self._attributes.clear()
        return writes
