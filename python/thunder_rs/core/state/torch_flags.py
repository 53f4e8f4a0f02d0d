"""torch's global flags a traced program reads, as guards: a changed flag recompiles, naming it.

The observer (``observe.py``) finds the program's read chains from its bytecode but does not follow
library modules (``torch.nn.functional``'s attributes are code, not state). torch's global switches
are read through them, so those chains are matched here against a table: a zero-argument reader
(``torch.are_deterministic_algorithms_enabled()``, also when imported as a bare name), or any plain
value under ``torch.backends`` (``torch.backends.cudnn.deterministic``,
``torch.backends.cuda.matmul.allow_tf32``). Each becomes a ``StateGuard`` that re-reads it per call.
``sys.argv`` is read through such a chain too (``"--debug" in sys.argv``): guarded by its items;
so is ``decimal``'s context, where the program reads ``decimal`` or one of its names.
Grad mode, autocast and ``torch.get_default_dtype()`` are in every cache key already. A chain in a
branch the program did not take is guarded too: a needless recompile when that flag changes, never
a stale trace.
"""

import functools
import sys
import types

import torch

from thunder_rs.core.state.guards import MISSING, Item, StateGuard

#: Zero-argument readers of torch's global flags, by the name a program calls them by.
_TORCH_READERS = {
    f"torch.{name}": getattr(torch, name)
    for name in (
        "are_deterministic_algorithms_enabled",
        "is_deterministic_algorithms_warn_only_enabled",
        "get_deterministic_debug_mode",
        "get_float32_matmul_precision",
        "is_warn_always_enabled",
        "get_num_threads",
        "get_num_interop_threads",
        "is_anomaly_enabled",
        "is_anomaly_check_nan_enabled",
        "is_inference_mode_enabled",
        "initial_seed",
        "is_autocast_cache_enabled",
    )
    if hasattr(torch, name)
}
if hasattr(torch.backends, "mha"):
    _TORCH_READERS["torch.backends.mha.get_fastpath_enabled"] = torch.backends.mha.get_fastpath_enabled
#: ``torch.backends.cuda``'s switches of attention kernels and library choices, read by calling them
#: (``torch.backends.cuda.flash_sdp_enabled()``); their setters (``enable_flash_sdp``) change them.
_TORCH_READERS.update(
    {
        f"torch.backends.cuda.{name}": getattr(torch.backends.cuda, name)
        for name in (
            "flash_sdp_enabled",
            "mem_efficient_sdp_enabled",
            "math_sdp_enabled",
            "cudnn_sdp_enabled",
            "fp16_bf16_reduction_math_sdp_allowed",
            "preferred_blas_library",
            "preferred_linalg_library",
        )
        if hasattr(torch.backends.cuda, name)
    }
)
_READER_NAMES = {id(fn): name for name, fn in _TORCH_READERS.items()}


def _argv() -> tuple:
    return tuple(sys.argv)


#: The process's state read as a library module's attribute, by the name a program reads it by:
#: ``sys.argv`` (``"--debug" in sys.argv``, ``float(sys.argv[1])``), guarded by a copy of its items.
_PROCESS_STATE = {"sys.argv": _argv}
#: Modules whose plain attributes are flags (``torch.backends.cudnn.deterministic``).
_FLAG_MODULES = ("torch.backends", "torch.utils.deterministic")


def _resolve(root, path: tuple):
    value = root
    for name in path:
        value = getattr(value, name)
    return value


def _decimal_context() -> tuple:
    """What ``decimal``'s arithmetic reads of the thread's context: precision, rounding, exponent
    limits, ``capitals``, ``clamp`` and the signals that trap (not the flags, which it sets)."""
    c = sys.modules["decimal"].getcontext()
    return (c.prec, c.rounding, c.Emin, c.Emax, c.capitals, c.clamp, tuple(str(t) for t, on in c.traps.items() if on))


def _reads_decimal(root) -> bool:
    """Whether ``root``, read by the program, is ``decimal`` or one of its names (``Decimal``,
    ``getcontext``, ``localcontext``): its arithmetic (C operators, which no hook reports) computes
    in the thread's context, which a user sets between calls (``decimal.getcontext().prec = 3``)."""
    name = root.__name__ if isinstance(root, types.ModuleType) else getattr(root, "__module__", None)
    return name in ("decimal", "_decimal", "_pydecimal") and "decimal" in sys.modules


def library_read(observer, root, attrs: tuple) -> None:
    """Guards what a read chain of the program on a library module (``torch.backends.cudnn
    .deterministic``, ``torch.are_deterministic_algorithms_enabled``) or on a function it imported
    from one (``from torch import are_deterministic_algorithms_enabled``) reads of torch's flags,
    and ``decimal``'s context where the program reads ``decimal`` (``_reads_decimal``)."""
    if _reads_decimal(root):
        observer.guard_state(StateGuard("decimal.getcontext()", _decimal_context, _decimal_context()))
        return
    if not isinstance(root, types.ModuleType):
        reader = _READER_NAMES.get(id(root))
        if reader is not None:
            observer.guard_state(StateGuard(f"{reader}()", root, root()))
        return
    name = root.__name__
    value = root
    for i, attr in enumerate(attrs):
        if type(attr) is Item:
            return
        reader = _TORCH_READERS.get(f"{name}.{attr}")
        if reader is not None:
            observer.guard_state(StateGuard(f"{name}.{attr}()", reader, reader()))
            return
        process = _PROCESS_STATE.get(f"{name}.{attr}")
        if process is not None:
            observer.guard_state(StateGuard(f"{name}.{attr}", process, process()))
            return
        value = getattr(value, attr, MISSING)
        if value is MISSING:
            return
        if type(value) in (bool, int, float, str):
            if name.startswith(_FLAG_MODULES):
                read = functools.partial(_resolve, root, tuple(attrs[: i + 1]))
                observer.guard_state(StateGuard(f"{name}.{attr}", read, value))
            return
        name = f"{name}.{attr}"


def parametrizations_cached() -> bool:
    """Whether the call runs inside ``torch.nn.utils.parametrize.cached()``: there eager computes
    a parametrized tensor once and reads it from the cache at every later use (a spectral norm's
    power iteration runs once, not once per use), where a trace made outside it computes each use."""
    parametrize = sys.modules.get("torch.nn.utils.parametrize")
    return parametrize is not None and bool(parametrize._cache_enabled)


def is_parametrized(module) -> bool:
    """Whether ``module`` holds parametrizations (``parametrize.register_parametrization``)."""
    parametrize = sys.modules.get("torch.nn.utils.parametrize")
    return parametrize is not None and parametrize.is_parametrized(module)


def entered(cached: bool) -> str:
    return "entered" if cached else "not entered"
