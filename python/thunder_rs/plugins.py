"""Loading Rust pass plugins: extension modules built against thunder_rs's ``plugin_abi`` crate
that hand their passes to this (pip-installed) thunder_rs through a capsule of a C-ABI table,
and the Rust crates such a module builds against, which the wheel carries (``rust_crates_dir``,
``cargo_config``).

See the README's "Writing a Rust pass" and ``examples/rust_pass``.
"""

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from thunder_rs import _core
from thunder_rs.errors import ThunderRuntimeError, ThunderTypeError, ThunderValueError

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


# The crates a plugin builds against, released with the wheel at its version: each package's
# crates.io name (a plugin's Cargo.toml names it, `thunder_rs_plugin_abi = "=0.1.0"`, and
# cargo_config() patches it) and its folder, which is also its library's name (`use plugin_abi::...`).
RUST_CRATES = {"thunder_rs_trace_ir": "trace_ir", "thunder_rs_passes": "passes", "thunder_rs_plugin_abi": "plugin_abi"}
# Where the wheel carries them: `make wheel` unpacks each crate's `cargo package` (the sources a
# crates.io release would hold) into this folder of the package.
PACKAGED_CRATES = Path(__file__).parent / "rust_crates"
CARGO_CONFIG_HEADER = "# Written by thunder_rs.cargo_config(): build against the installed thunder_rs's crates."


def rust_crates_dir() -> Path:
    """The folder holding the Rust crates a pass plugin builds against (the packages
    ``thunder_rs_trace_ir``, ``thunder_rs_passes`` and ``thunder_rs_plugin_abi``, in the sub-folders
    ``trace_ir``, ``passes`` and ``plugin_abi``), of this thunder_rs's version, as
    ``numpy.get_include()`` names numpy's headers: the copy the wheel ships, or in a source checkout
    the tree's ``crates/``, which the installed extension was built from. See ``cargo_config``."""
    checkout = Path(__file__).resolve().parents[2] / "crates"
    for folder in (checkout, PACKAGED_CRATES):
        if all((folder / name / "Cargo.toml").is_file() for name in RUST_CRATES.values()):
            return folder
    raise ThunderRuntimeError(
        f"rust_crates_dir: this thunder_rs has no Rust crate sources ({PACKAGED_CRATES} is missing or "
        f"incomplete): a wheel built by `make wheel` ships them"
    )


def cargo_config() -> str:
    """The cargo configuration that builds a pass plugin against this thunder_rs's crates: a
    ``[patch.crates-io]`` table pointing the packages ``thunder_rs_trace_ir``, ``thunder_rs_passes``
    and ``thunder_rs_plugin_abi`` at their folders in ``rust_crates_dir()``. Write it to the plugin
    project's ``.cargo/config.toml``::

        python -c "import thunder_rs; print(thunder_rs.cargo_config())" > .cargo/config.toml

    so that ``cargo build`` and ``maturin develop`` use the installed version's sources (the
    plugin and the extension it loads into must agree on the plugin ABI and the trace format)."""
    folder = rust_crates_dir()
    # json.dumps writes a TOML basic string (quotes and backslashes escaped).
    lines = [
        f"{package} = {{ path = {json.dumps((folder / sub).as_posix())} }}" for package, sub in RUST_CRATES.items()
    ]
    return "\n".join([CARGO_CONFIG_HEADER, "[patch.crates-io]", *lines]) + "\n"
