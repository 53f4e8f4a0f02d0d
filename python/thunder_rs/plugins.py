"""Loading Rust pass plugins: extension modules built against thunder_rs's ``plugin_abi`` crate
that hand their passes to this (pip-installed) thunder_rs through a capsule of a C-ABI table.

See the README's "Writing a Rust pass" and ``examples/rust_pass``.
"""

from types import ModuleType
from typing import Any

from thunder_rs import _core
from thunder_rs.errors import ThunderTypeError, ThunderValueError

# The module attribute a plugin exports its capsule as.
CAPSULE_ATTRIBUTE = "thunder_rs_passes"


def load_passes(module_or_capsule: ModuleType | Any, on_error: str = "raise") -> dict[str, str]:
    """Registers the passes of a Rust plugin, so ``jit(fn, passes=[name])`` runs them at the stage
    each declares (``program``: before autodiff; ``forward``/``backward``: on the halves after the
    split). Takes the plugin module (its ``thunder_rs_passes`` capsule is read) or the capsule
    itself; returns ``{pass name: stage}``. A plugin built for another plugin ABI version is a
    ``ThunderRuntimeError`` naming both versions.

    ``on_error`` says what a failing pass (an error, a panic, a trace that does not verify) does
    to the compile running it: ``"raise"`` fails it with a ``ThunderRuntimeError`` naming the pass
    (nothing is cached); ``"skip"`` compiles without the pass, with one ``RuntimeWarning`` naming
    the pass and its error. Loading the plugin again replaces the choice."""
    capsule = module_or_capsule
    if isinstance(module_or_capsule, ModuleType):
        capsule = getattr(module_or_capsule, CAPSULE_ATTRIBUTE, None)
        if capsule is None:
            raise ThunderTypeError(
                f"load_passes: module {module_or_capsule.__name__} has no {CAPSULE_ATTRIBUTE!r} capsule; a plugin "
                f"exports its plugin_abi table under that name (argument module_or_capsule)"
            )
    if type(capsule).__name__ != "PyCapsule":
        raise ThunderTypeError(
            f"load_passes: expected a plugin module or its capsule, got {type(capsule).__name__} "
            f"(argument module_or_capsule)"
        )
    if on_error not in ("raise", "skip"):
        raise ThunderValueError(f'load_passes: on_error is "raise" or "skip", got {on_error!r} (argument on_error)')
    return {loaded.name: loaded.stage for loaded in _core.load_plugin_capsule(capsule, on_error)}
