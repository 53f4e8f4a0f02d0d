"""Python entry points of the prims, generated from the Rust ``Prim`` table.

``prims.add(a, b)`` records the prim through the current recorder; its meta rule (shape, dtype,
device, errors) runs in Rust. Arguments are positional and canonical: prims neither broadcast
nor promote, and dims are non-negative.
"""

from thunder_rs import _core
from thunder_rs.core.recorder import record_prim

NAMES: tuple[str, ...] = tuple(_core.prim_names())


def _entry_point(name: str):
    def prim(*args):
        return record_prim(name, args)

    prim.__name__ = prim.__qualname__ = name
    prim.__doc__ = f"Records prims.{name}."
    return prim


globals().update({name: _entry_point(name) for name in NAMES})


def __getattr__(name: str):
    raise AttributeError(f"thunder_rs.prims has no prim {name!r}")
