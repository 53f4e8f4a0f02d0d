"""Automatic dynamic floats: float arguments that change between calls are inputs of the trace.

As torch.compile does with ``specialize_float=False``, a function is compiled for the floats of
its first call; when a later call misses the cache and a float argument (positional, keyword,
or an item of a list, tuple or dict argument) differs from an earlier call's, the next compile
takes it as a float input (``symfloat.float_input``): what the program computes from it stays
symbolic, and the compiled program passes the caller's float to torch, so the kernels see what
eager's see (a wrapped number: a float never promotes a float16 tensor). The key of the calls it
serves holds ``FLOAT`` at that place rather than the value (``widen``), so every value hits.

Where the program needs the value itself (a comparison, ``float()``, ``int()``, ``round``,
``math.*``, text, a dropout probability), tracing notes it (``symfloat.specialised_inputs``) and
the float is compiled as a constant, then and from then on: each value is a key of its own, and
the miss reason says where the program read it. ``jit(dynamic=False)`` keeps every float constant.
"""

from typing import NamedTuple

from thunder_rs.core.acquisition.cache import leaf_key
from thunder_rs.core.lang.symfloat import specialised_inputs

#: A float argument's place in a key where the trace takes it as an input: any float matches.
FLOAT = (float, None)


class ArgFloat(NamedTuple):
    """A float argument the trace takes as an input: flat input ``position``; the entry takes it
    among its last inputs (after the ints read as sizes), the ``input``-th float."""

    position: int
    input: int

    def code(self, j: int, scope: dict) -> str:
        """An expression reading it from a call's flat inputs ``flat``."""
        return f"flat[{self.position}]"


class FloatSpecialised(Exception):
    """A compile with float inputs needed the value of some (``sites``: ``{flat position: "file:line"}``)."""

    def __init__(self, sites: dict):
        super().__init__(sites)
        self.sites = sites


def _is_float_key(k) -> bool:
    return type(k) is tuple and len(k) == 2 and k[0] is float


def widen(key, positions):
    """``key`` (a general call's: ``(state, leaves, spec)``) with ``FLOAT`` at ``positions``."""
    if not positions:
        return key
    leaves = list(key[1])
    for i in positions:
        leaves[i] = FLOAT
    return (key[0], tuple(leaves), *key[2:])


def widened(key) -> tuple:
    """The positions where ``key`` holds ``FLOAT``: the floats its entry takes as inputs."""
    if type(key) is not tuple or len(key) < 3:
        return ()
    return tuple(i for i, k in enumerate(key[1]) if k is FLOAT or k == FLOAT)


def changed_floats(old_key, new_key) -> set:
    """The positions of the float arguments that differ between two keys of calls with the same
    structure (and global state)."""
    if type(old_key) is not tuple or len(old_key) != len(new_key) or len(new_key) < 3:
        return set()
    if old_key[0] != new_key[0] or old_key[2:] != new_key[2:] or len(old_key[1]) != len(new_key[1]):
        return set()
    return {
        i for i, (a, b) in enumerate(zip(old_key[1], new_key[1])) if a != b and _is_float_key(a) and _is_float_key(b)
    }


class FloatArgs:
    """A jitted function's float arguments: those seen to change (``marked``), those its entries
    take as inputs (``wide``: its calls' keys hold ``FLOAT`` there), and those its program needs
    the value of (``constant``: never inputs again)."""

    def __init__(self):
        self.marked: set = set()
        self.wide: tuple = ()
        #: ``{flat position: "file:line" or None}``: where the program needed the value
        self.constant: dict = {}
        #: the floats the last compile found it needed the value of (its miss reason says so)
        self.kept: dict = {}

    def key(self, key):
        """A general call's key with ``FLOAT`` where the entries take floats as inputs."""
        leaves = key[1]
        wide = [i for i in self.wide if i < len(leaves) and _is_float_key(leaves[i])]
        return widen(key, wide) if wide else key

    def wanted(self, mode, key, flat, earlier_keys):
        """``key`` widened at the float arguments of the call of ``flat`` to take as inputs: those an
        earlier call had other values for (``earlier_keys``), unless ``mode`` is False, and never
        those the program needed the value of."""
        if mode is not False and len(key) >= 3:
            for old in earlier_keys:
                if old is not None:
                    self.marked.update(changed_floats(old, key))
        floats = [i for i in sorted(self.marked) if i < len(flat) and type(flat[i]) is float and i not in self.constant]
        return widen(key, floats) if floats else key

    def generate(self, make, key, flat):
        """``(make(floats), key)`` for the floats ``key`` takes as inputs (``widened``), where the
        compile kept them so; where it needed the value of some (or failed), again with those
        constant and the key holding their values. ``make`` returns ``_generated``'s tuple."""
        floats = widened(key)
        self.kept = {}
        while True:
            try:
                with specialised_inputs() as noted:
                    made = make(floats)
                inputs = {vid: at.position for at, vid in made[0].floats}
                needed = {inputs[v]: site for v, site in noted.found.items() if v in inputs}
                if needed:
                    raise FloatSpecialised(needed)
            except FloatSpecialised as e:
                needed = e.sites
            except Exception:
                if not floats:
                    raise
                needed = {i: None for i in floats}
            if not floats:
                return made, key
            if not needed:
                self.wide = tuple(sorted({*self.wide, *floats}))
                return made, key
            self.constant.update(needed)
            self.kept.update(needed)
            self.wide = tuple(i for i in self.wide if i not in needed)
            floats = tuple(i for i in floats if i not in needed)
            leaves = list(key[1])
            for i in needed:
                leaves[i] = leaf_key(flat[i])
            key = (key[0], tuple(leaves), *key[2:])

    def again(self, make, key):
        """``make(floats)`` of the floats ``key`` takes as inputs, traced again (with other sizes
        symbolic); raises ``FloatSpecialised`` where it needed the value of one."""
        with specialised_inputs() as noted:
            made = make(widened(key))
        if noted.found:
            raise FloatSpecialised(noted.found)
        return made

    def labels(self, key, names: list) -> str:
        """``; compiled with symbolic floats s, cfg['lr']`` for the floats ``key`` takes as inputs,
        and ``; s kept constant: its value is needed at file:line`` for those the last compile
        found it needed the value of."""
        parts = []
        floats = widened(key)
        if floats:
            parts.append("compiled with symbolic floats " + ", ".join(names[i] for i in floats))
        for i, site in self.kept.items():
            parts.append(f"{names[i]} kept constant" + (f": its value is needed at {site}" if site else ""))
        return "".join(f"; {p}" for p in parts)
