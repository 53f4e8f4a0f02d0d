"""The switches that decide which fused attention kernel eager runs, as state a trace depends on.

Which kernel eager's ``scaled_dot_product_attention`` runs on CUDA depends, beyond its inputs, on
global switches: ``torch.backends.cuda.enable_{flash,mem_efficient,cudnn,math}_sdp`` (which
``torch.nn.attention.sdpa_kernel`` sets and restores), the backends' priority order, and
deterministic algorithms (torch refuses cuDNN's kernel under them), and, for half precision, whether
the math path may reduce in it (``allow_fp16_bf16_reduction_math_sdp``; else it computes in float32).
A trace that records the kernel torch chose, or the math path's rounding, depends on them, and only
such a trace:

- ``guard()`` reads them and, while a program is traced, guards the entry on them, so that a
  changed switch is a cache miss that says so. The guard holds their value when the call began
  (the first read of the acquisition wins, and the setters below read before they write).
- The setters (``torch._C._set_sdp_use_*``, ``_set_sdp_priority_order``), when the traced program
  calls them (``with sdpa_kernel(...)`` inside it), are applied at once, so that the choices made
  while tracing see them, and recorded as effects, so that every call sets them as eager does and
  the attention calls the trace runs eagerly (inference) run under them. Outside tracing they are
  torch's own, called directly.
"""

import torch

from thunder_rs.core.lang.fallback import qualified_name
from thunder_rs.core.state.guards import StateGuard
from thunder_rs.core.state.observe import thread_state
from thunder_rs.core.lang.rng import STATE_CALLS, _intercept, _sets_default

_C = torch._C


def _off() -> bool:
    return False


def _enabled(backend: str):
    # fa3/fa4 (torch >= 2.10) and overrideable may be missing from older versions: always off there.
    return getattr(_C, f"_get_{backend}_sdp_enabled", _off)


_flash, _efficient, _math, _cudnn, _overrideable, _fa3, _fa4 = map(
    _enabled, ("flash", "mem_efficient", "math", "cudnn", "overrideable", "fa3", "fa4")
)
_priority = getattr(_C, "_get_sdp_priority_order", tuple)
_deterministic, _warn_only = _C._get_deterministic_algorithms, _C._get_deterministic_algorithms_warn_only
_half_reduction = getattr(_C, "_get_math_sdp_allow_fp16_bf16_reduction", _off)

#: What ``state()`` holds, in order (for miss reasons).
FIELDS = (
    "flash",
    "mem_efficient",
    "math",
    "cudnn",
    "overrideable",
    "fa3",
    "fa4",
    "priority",
    "deterministic",
    "deterministic_warn_only",
    "math_fp16_bf16_reduction",
)


def state() -> tuple:
    """The switches, read with one C call each (about 1 µs: a guard runs it on every call)."""
    return (
        _flash(),
        _efficient(),
        _math(),
        _cudnn(),
        _overrideable(),
        _fa3(),
        _fa4(),
        tuple(_priority()),
        _deterministic(),
        _warn_only(),
        _half_reduction(),
    )


def _show(value: tuple) -> str:
    return "(" + ", ".join(f"{name}={v!r}" for name, v in zip(FIELDS, value)) + ")"


class SwitchesGuard(StateGuard):
    """The guard on ``state()``; its miss reason names only the switches that changed, each with
    the value traced under and the value now (a GPU run printed the whole tuple twice, and which
    of ten fields differed had to be found by eye)."""

    def describe(self, flat) -> str:
        now = self.read()
        changed = [f"{name} {was!r} -> {is_!r}" for name, was, is_ in zip(FIELDS, self.expected, now) if was != is_]
        return f"{self.label} changed: {', '.join(changed) or _show(now)} (traced under {self.show(self.expected)})"


def guard() -> tuple:
    """The switches now; while a program is traced, its entry also runs only while they are what
    they were when the call began."""
    value = state()
    observer = thread_state.observer
    if observer is not None:
        observer.guard_state(
            SwitchesGuard("the attention kernel switches (torch.backends.cuda *_sdp)", state, value, _show)
        )
    return value


def _guarded_setter(original):
    """``original`` (a switch's setter) while tracing: the state is guarded as it was before, then
    the call is applied and recorded."""
    record = _sets_default(original)

    def set_while_tracing(*args, **kwargs):
        guard()
        return record(*args, **kwargs)

    return set_while_tracing


_SETTERS = (
    "_set_sdp_use_flash",
    "_set_sdp_use_mem_efficient",
    "_set_sdp_use_math",
    "_set_sdp_use_cudnn",
    "_set_sdp_use_overrideable",
    "_set_sdp_use_fa3",
    "_set_sdp_use_fa4",
    "_set_sdp_priority_order",
    "_set_math_sdp_allow_fp16_bf16_reduction",
)


def _install() -> None:
    for name in _SETTERS:
        setter = getattr(_C, name, None)
        if setter is None or hasattr(setter, "__thunder_rs_original__"):
            continue
        STATE_CALLS.add(qualified_name(setter))
        setattr(_C, name, _intercept(setter, _guarded_setter(setter)))


_install()
