"""Third-party modules core loads when a program first needs them, declared at module level.

``import thunder_rs`` should cost little over ``import torch`` (issue 25), and some dependencies
are needed only by some programs or only once a program runs: optree (``torch.utils._cxx_pytree``,
about 20 ms to import) flattens keyword calls on the per-call path. A module declares such a
dependency where its imports stand, ``_CXX = LazyModule("torch.utils._cxx_pytree")``, and calls
``_CXX.load()`` where it is first needed; the hot path then keeps what ``load`` returned rather
than asking again. It takes no thunder_rs module, and declarations stand at module level, so a
dependency between the package's layers is never hidden from the layering test
(``tests/test_layers.py`` checks both).
"""

import importlib
from types import ModuleType


class LazyModule:
    """A module by name, imported at the first ``load()``; Python's import lock makes concurrent
    first loads from several threads import it once."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        if name.split(".")[0] == "thunder_rs":
            raise ValueError(f"LazyModule is for third-party modules, got {name!r} (argument name)")
        self.name = name

    def load(self) -> ModuleType:
        """The module, imported now if no one has yet (``ImportError`` as ``import`` raises it)."""
        return importlib.import_module(self.name)

    def __repr__(self) -> str:
        return f"LazyModule({self.name!r})"
