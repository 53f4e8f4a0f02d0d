"""Python entry points of the prims, generated from the Rust prim declarations.

``prims.add(a, b)`` records the prim through the current recorder; its meta rule (shape, dtype,
device, errors) runs in Rust. Arguments are positional and canonical: prims neither broadcast
nor promote, and dims are non-negative.
"""

from thunder_rs import _core
from thunder_rs.core.lang.recorder import record_prim

#: Every prim's ``_core.PrimInfo`` (name, family, promotion), as the Rust declarations give them.
TABLE: tuple[_core.PrimInfo, ...] = tuple(_core.prim_table())
NAMES: tuple[str, ...] = tuple(info.name for info in TABLE)
#: The parameterless elementwise prims whose ltorch symbols are derived, by family
#: (``Unary``/``Binary``), with the ``clang`` type promotion kind of each.
DERIVED: dict[str, dict[str, int]] = {
    family: {info.name: info.promotion for info in TABLE if info.family == family and info.promotion is not None}
    for family in ("Unary", "Binary")
}


def _entry_point(name: str):
    def prim(*args):
        return record_prim(name, args)

    prim.__name__ = prim.__qualname__ = name
    prim.__doc__ = f"Records prims.{name}."
    return prim


globals().update({name: _entry_point(name) for name in NAMES})


def __getattr__(name: str):
    raise AttributeError(f"thunder_rs.prims has no prim {name!r}")
