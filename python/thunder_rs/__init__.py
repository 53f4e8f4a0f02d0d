"""thunder_rs: a trace compiler for PyTorch with a Rust core.

``jfn = thunder_rs.jit(fn_or_module)`` records the program once per input signature into a
Rust-owned trace, optimises it, and from then on runs generated code with almost no overhead.
"""

import inspect as _inspect
from typing import (
    TYPE_CHECKING as _TYPE_CHECKING,
    Any as _Any,
    Callable as _Callable,
    ParamSpec as _ParamSpec,
    TypeVar as _TypeVar,
    overload as _overload,
)

import torch as _torch

from thunder_rs import _core, errors
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.dtypes import CODES as _CODES
from thunder_rs.core.lang.symfloat import SymFloat as _SymFloat
from thunder_rs.core.lang.symint import SymInt as _SymInt

_core.configure(TensorProxy, _torch.dtype, _torch.device, _CODES, _SymInt, _SymFloat)

from thunder_rs import prims  # noqa: E402
from thunder_rs import torch as ltorch  # noqa: E402
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad  # noqa: E402
from thunder_rs.core.run.front import check_options, reset  # noqa: E402
from thunder_rs.core.run.compile_module import compile_module  # noqa: E402
from thunder_rs.core.base.lazy import LazyModule as _LazyModule  # noqa: E402
from thunder_rs.core.base.logs import configure_from_env as _configure_logs, set_logs  # noqa: E402
from thunder_rs.core.run.jit import DEFAULT_CACHE_SIZE, CompileStats, ThunderFunction, ThunderModule  # noqa: E402
from thunder_rs.plugins import load_passes  # noqa: E402
from thunder_rs.plugins import cargo_config, rust_crates_dir  # noqa: E402
from thunder_rs.executors import torch_ex as _torch_ex  # noqa: E402,F401
from thunder_rs.executors import autograd_ex as _autograd_ex  # noqa: E402,F401
from thunder_rs.executors.nvfuser_default import use_nvfuser_on_cuda as _use_nvfuser_on_cuda  # noqa: E402

_use_nvfuser_on_cuda()

__all__ = [
    "jit",
    "reset",
    "compile_module",
    "registered_passes",
    "load_passes",
    "rust_crates_dir",
    "cargo_config",
    "rules",
    "Rule",
    "register_rules",
    "last_traces",
    "last_backward_traces",
    "register_grad",
    "get_grad",
    "put_grad",
    "cache_hits",
    "cache_misses",
    "compile_stats",
    "examine",
    "set_logs",
    "errors",
    "prims",
    "ltorch",
    "ThunderFunction",
    "ThunderModule",
    "CompileStats",
    "ExamineReport",
]
__version__ = "0.1.0"

#: Names the package resolves at their first use (PEP 562), so that ``import thunder_rs`` does not
#: pay for them, with the module that has them: rewrite rules as data are for the programs that
#: register some, ``examine`` (and its report, a dataclass) for the programs examined.
_RULES = _LazyModule("thunder_rs.rules")
_EXAMINE = _LazyModule("thunder_rs.core.run.examine")
_LAZY_NAMES = {"Rule": _RULES, "register_rules": _RULES, "examine": _EXAMINE, "ExamineReport": _EXAMINE}

if _TYPE_CHECKING:
    from thunder_rs import rules
    from thunder_rs.core.run.examine import ExamineReport, examine
    from thunder_rs.rules import Rule, register_rules


def __getattr__(name: str) -> _Any:
    if name == "rules":
        value = _RULES.load()
    elif name in _LAZY_NAMES:
        value = getattr(_LAZY_NAMES[name].load(), name)
    else:
        raise AttributeError(f"module 'thunder_rs' has no attribute {name!r}")
    globals()[name] = value
    return value


_configure_logs()


_P = _ParamSpec("_P")
_R = _TypeVar("_R")


@_overload
def jit(
    fn_or_module: _torch.nn.Module, *, cache: int = ..., passes=..., executors=..., dynamic: bool | None = ...
) -> ThunderModule: ...
@_overload
def jit(
    fn_or_module: _Callable[_P, _R], *, cache: int = ..., passes=..., executors=..., dynamic: bool | None = ...
) -> _Callable[_P, _R]: ...


def jit(
    fn_or_module: _Any, *, cache: int = DEFAULT_CACHE_SIZE, passes=(), executors=None, dynamic=None, **unknown
) -> _Any:
    """Compiles ``fn_or_module`` lazily: the first call with each input signature traces it.

    ``cache`` bounds how many compiled entries are kept; beyond it the least recently used is
    dropped (and compiled again if it is needed again). ``passes`` names registered Rust passes
    (``thunder_rs.registered_passes()``) to run on the program after dead-code elimination and
    common-subexpression elimination, in order. ``executors`` are executor objects or names
    (``thunder_rs.executors.known_executor_names()``) in priority order, the torch executor last
    whether named or not; by default, ``thunder_rs.executors.get_default_executors()``.
    ``dynamic`` says which sizes of tensor arguments are traced as symbolic, so that one compile
    serves calls of other sizes: None (the default) those seen to change between calls (as
    torch.compile's automatic dynamic shapes), True all from the first call, False none (a
    compile per size). As for torch.compile, ``torch._dynamo.mark_dynamic(x, dim)`` makes a dim
    symbolic from the first call and ``torch._dynamo.mark_static(x, dim)`` keeps it constant.
    Sizes 0 and 1 are never symbolic.

    **Threads.** The result may be called from several threads at once, each getting what eager
    computes in that thread. A call that finds its entry takes no lock; the cache key holds the
    calling thread's grad mode, inference mode and autocast (thread-local in torch). A miss
    compiles under the callable's lock, so calls of one key on several threads compile it once
    and the threads that waited use that entry. A trace observes only its own thread: the reads
    and writes of Python state it records, and the hooks it registers, are the traced call's. A
    jitted module is traced on a clone of its tree, never changed in place: what another thread
    sets on the module meanwhile (an attribute, a submodule, a hook) is that thread's write, left
    as it set it and read by the next call, which compiles again where the trace had read it.
    Parameters and buffers are read from their slots at every call, so an update another thread
    makes (in place, or a new tensor) is seen by the calls that start after it. Backward may run
    on another thread than its forward, and several at once. ``compile_stats`` and
    ``last_traces`` are the callable's, over all threads (``last_traces``: the last compile of
    any). Not covered: attributes of other Python objects the program reads (a config object, a
    global's attributes) that another thread sets while a call is traced are taken as that
    call's writes, as the program writes those objects directly; keep them unchanged while calls
    compile, or keep such settings on the module. And the default generators are shared: where a
    program both reads tensor values and draws random numbers, its trace sets them back after
    running the program so far, and the backward of a random op run as torch's own call
    (``rrelu``) sets them to its forward's state to draw the same numbers, each undoing what other
    threads drew meanwhile (they draw those numbers again).
    """
    check_options(unknown)
    if isinstance(fn_or_module, ThunderModule) or isinstance(fn_or_module, ThunderFunction):
        return fn_or_module
    if (
        _inspect.isgeneratorfunction(fn_or_module)
        or _inspect.iscoroutinefunction(fn_or_module)
        or _inspect.isasyncgenfunction(fn_or_module)
    ):
        raise errors.ThunderTypeError(
            f"jit: {getattr(fn_or_module, '__qualname__', fn_or_module)} is a generator or coroutine function; its "
            "body runs only as the result is iterated or awaited, after the call, so it cannot be traced "
            "(argument fn_or_module)"
        )
    if isinstance(fn_or_module, _torch.nn.Module):
        return ThunderModule(fn_or_module, cache=cache, passes=passes, executors=executors, dynamic=dynamic)
    if not callable(fn_or_module):
        raise errors.ThunderTypeError(
            f"jit: expected a function or torch.nn.Module, got {type(fn_or_module).__name__} (argument fn_or_module)"
        )
    return ThunderFunction(fn_or_module, cache=cache, passes=passes, executors=executors, dynamic=dynamic)


def registered_passes() -> list[str]:
    """The names of the Rust passes ``jit(fn, passes=[...])`` can run."""
    return _core.registered_passes()


def _function(jfn) -> ThunderFunction:
    if isinstance(jfn, ThunderModule):
        return jfn._jfn
    if isinstance(jfn, ThunderFunction):
        return jfn
    raise errors.ThunderTypeError(f"expected a thunder_rs.jit result, got {type(jfn).__name__} (argument jfn)")


def last_traces(jfn) -> list:
    """The traces of the last compilation: acquired, after each pass, and the execution trace."""
    entry = _function(jfn)._last_entry
    return list(entry.traces) if entry is not None else []


def last_backward_traces(jfn) -> list:
    """The backward's traces of the last compilation: after the split, after each pass, and its
    execution trace. Empty when the last compilation took the forward-only path (no output
    requires grad, or grad mode was off)."""
    entry = _function(jfn)._last_entry
    return list(entry.backward_traces) if entry is not None else []


def cache_hits(jfn) -> int:
    return _function(jfn)._stats.cache_hits


def cache_misses(jfn) -> int:
    return _function(jfn)._stats.cache_misses


def compile_stats(jfn) -> CompileStats:
    return _function(jfn)._stats


from thunder_rs import dynamo as _dynamo  # noqa: E402

_dynamo.register()
