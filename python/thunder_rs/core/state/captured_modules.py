"""Attributes a traced function sets on modules it captured (a closure's ``model``, a global's),
not given as the jitted module nor an argument: ``model.count += 1``, ``model.last = y.detach()``,
``model.seen = x.shape[0]``.

The function runs on those modules themselves, not on clones (``modules``), so what it set stayed
there after tracing: a tensor stored was refused as an escape, a value read back changed a guard
("changed Python state it read"), and a value set without a read stayed as tracing left it,
compiled calls setting nothing (a size held the trace's stand-in). Their instance dicts are copied
before the function runs (the modules its closure cells and the globals its code names hold, with
their submodules); after it, what changed is undone and becomes writes every compiled call makes
again, as those on the jitted module's attributes are. ``training`` is left to the mode writes
(``module.eval()``), and modules that are argument objects to their own writes.
"""

import torch

from thunder_rs.core.state.guards import MISSING
from thunder_rs.core.state.state import stands_in

#: Names whose changes others handle: the stores (changed in place, refused apart), the mode.
_NOT_WRITES = frozenset({"_parameters", "_buffers", "_modules", "training"})


def _contents(cell):
    """What ``cell`` holds; ``None`` for an empty cell (its variable deleted: the program's read raises)."""
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _captured(fn) -> list:
    """The modules ``fn``'s closure cells and the globals its code names hold, directly or in
    plain containers (a dict of layers picked by a computed key), and their submodules."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    values = [_contents(c) for c in fn.__closure__ or ()] if code.co_freevars else []
    names = fn.__globals__
    values += [names[n] for n in code.co_names if n in names]
    found: dict = {}
    for v in values:
        _collect(v, found, _DEPTH)
    return list(found.values())


#: How deep plain lists, tuples and dicts are followed to the modules they hold (``mods[f"l{i}"]``).
_DEPTH = 2


def _collect(value, found: dict, depth: int) -> None:
    """Puts the modules ``value`` is or holds in plain lists, tuples and dicts, with their
    submodules, in ``found`` (by id)."""
    if isinstance(value, torch.nn.Module):
        for m in value.modules():
            found.setdefault(id(m), m)
    elif depth > 0 and type(value) in (list, tuple, dict):
        for item in value.values() if type(value) is dict else value:
            _collect(item, found, depth - 1)


def argument_modules(flat_inputs) -> list:
    """The modules among a call's arguments, with their submodules, which the program runs on themselves."""
    found: dict = {}
    for x in flat_inputs:
        _collect(x, found, 0)
    return list(found.values())


class CapturedModules:
    """The instance dicts of the modules a function captured, as they were before it ran."""

    def __init__(self, fn):
        self._found = [(m, dict(m.__dict__)) for m in _captured(fn)]
        #: the modules themselves (a count one holds may be a size input: ``traced_inputs.int_stand_ins``)
        self.modules = [m for m, _ in self._found]
        #: id -> the instance dict as found (reads seen after the program's writes guard what it found)
        self.found = {id(m): before for m, before in self._found}

    def __enter__(self) -> "CapturedModules":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        """Where tracing failed, what the function set is undone (no stand-in left in the modules)."""
        if kind is not None:
            for module, before in self._found:
                module.__dict__.clear()
                module.__dict__.update(before)

    def writes(self, state) -> list:
        """``(module, name, value)`` for each attribute the function set (MISSING: deleted) on a
        module that is not a state object of ``state`` (an argument's); each undone."""
        out = []
        for module, before in self._found:
            now = module.__dict__
            if module in state or (list(now) == list(before) and all(now[k] is v for k, v in before.items())):
                continue
            names = [k for k in now if before.get(k, MISSING) is not now[k]] + [k for k in before if k not in now]
            names = [
                k
                for k in names
                if k not in _NOT_WRITES and not k.startswith("_thunder_rs") and not stands_in(now.get(k))
            ]
            for name in names:
                out.append((module, name, now.get(name, MISSING)))
                if name in before:
                    now[name] = before[name]
                else:
                    del now[name]
        return out
