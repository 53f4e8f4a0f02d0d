"""Modules loaded when a program first needs them, declared at module level.

``import thunder_rs`` should cost little over ``import torch`` (issue 25), and some modules are
needed only by some programs or only once a program runs. A third-party one: optree
(``torch.utils._cxx_pytree``, about 20 ms to import) flattens keyword calls. One of the package's:
acquisition (``core.acquisition.acquire`` and the modules only a compile uses: ten, about 12 ms to
import) runs at a program's first compile, never at import. A module declares such a dependency
where its imports stand, ``_ACQUIRE = LazyModule("thunder_rs.core.acquisition.acquire")``, and
calls ``_ACQUIRE.load()`` where it is first needed.

A declaration is an import that runs later, nothing less: the layering test
(``tests/test_layers.py``) reads each one as an import of its module for the layer and cycle
checks, so laziness never hides an upward import or a cycle, and it asks why each of the package's
modules is lazy (``LAZY_MODULES``). Declarations stand at module level, where that test reads them.
"""

import importlib
from types import ModuleType


class LazyModule:
    """A module by name, imported at the first ``load()``; Python's import lock makes concurrent
    first loads from several threads import it once. Later loads return the module kept then, so
    a load on a per-call path costs an attribute read."""

    __slots__ = ("name", "_module")

    def __init__(self, name: str):
        self.name = name
        self._module: ModuleType | None = None

    def load(self) -> ModuleType:
        """The module, imported now if no one has yet (``ImportError`` as ``import`` raises it)."""
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self.name)
        return module

    def __repr__(self) -> str:
        return f"LazyModule({self.name!r})"
