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
"""

import threading

from thunder_rs.core.state.modules import mode_writers, write_epoch


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

    def set_by_program(self, module) -> bool:
        """Whether the program set ``module.training`` earlier in the call."""
        return id(module) in self._found

    def undo(self) -> list:
        """Puts back each module's ``training`` as the call found it; returns ``(module,
        "training", the last mode the program set)`` for every call to set again."""
        writes = []
        for module, found in self._found.values():
            held = module.__dict__
            writes.append((module, "training", held.get("training", found)))
            held["training"] = found
        if writes:
            write_epoch[0] += 1
        self._found.clear()
        return writes
