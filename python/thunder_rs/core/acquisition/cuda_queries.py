"""What a traced program asks the CUDA runtime and its allocator: guarded, made again, or refused.

- ``torch.cuda.is_available()``, ``device_count()``, ``get_device_capability()``,
  ``get_device_name()``, ``is_bf16_supported()``, ``is_tf32_supported()``,
  ``is_current_stream_capturing()`` and
  ``torch.accelerator``'s ``is_available()``, ``device_count()``, ``current_accelerator()`` and
  ``get_device_capability()`` the program reads are guarded (eager branches on them, asking on
  every call: what they answer another time compiles again). Asked of the current device (no
  device given), the reading is of the device current when the call begins, or of the one the
  program chose before (``set_device``). ``get_device_properties()`` of the current device guards
  that device (a device's properties do not change while the process runs).
- ``torch.cuda.empty_cache()`` (``torch.accelerator.empty_cache()``) is made again by every call
  after it runs (tracing frees nothing: the allocator holds no block of the program's yet).
- The allocator's statistics (``memory_allocated``, ``max_memory_allocated``, ``memory_reserved``,
  ``memory_stats``, ``mem_get_info``, ...) and their resets (``reset_peak_memory_stats``, ...) are
  refused, naming the line: a compiled call allocates other tensors than eager's program (fused
  kernels keep no intermediates), so no reading or peak it could give is eager's, and tracing's
  reading would be reused. So are the device's readings of now (``utilization``, ``temperature``,
  ``power_draw``, ``clock_rate``, ``memory_usage``), which tracing would read once.

``cuda_state`` puts these stand-ins in while some program is traced (``PLACES``); they act only for
the program's own calls (``setters.program_of``).
"""

import functools
import sys

import torch

from thunder_rs.core.acquisition.effects import recorded_effects
from thunder_rs.core.acquisition.setters import SetterCall, program_of
from thunder_rs.core.lang.devices import current_cuda_index, guard_current_device, program_chose_device
from thunder_rs.core.state.guards import StateGuard
from thunder_rs.core.state.observe import thread_state
from thunder_rs.errors import ThunderNotImplementedError

__all__ = ["PLACES"]


def _of_current_device(device) -> bool:
    """Whether a query of ``device`` asks about the current CUDA device (none given, ``"cuda"``)."""
    if device is None:
        return True
    return isinstance(device, (str, torch.device)) and torch.device(device).index is None


def _on_device(index: int, real, *args, **kwargs):
    with torch.cuda.device(index):
        return real(*args, **kwargs)


def _guarded(label: str, of_device: str | None = None):
    """A stand-in maker: the program's call of ``real`` is guarded on what it returned (compared
    with ``==``). ``of_device``: ``"argument"``, its first argument is a device, the current one if
    not given; ``"current"``, it asks about the current device (``is_bf16_supported``). Where the
    program chose the current device itself, the guard asks about that one."""

    def make(real):
        def read(*args, **kwargs):
            value = real(*args, **kwargs)
            observer = thread_state.observer
            if observer is None or program_of(sys._getframe(1)) is None:
                return value
            shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            reader = functools.partial(real, *args, **kwargs)
            if of_device and program_chose_device():  # (the device the program chose, on every call)
                index = current_cuda_index()
                if of_device == "current":
                    reader = functools.partial(_on_device, index, real, *args, **kwargs)
                elif _of_current_device(args[0] if args else kwargs.get("device")):
                    reader = functools.partial(real, index)
                shown += f" on cuda:{index}"
            observer.guard_state(StateGuard(f"{label}({shown})", reader, value))
            return value

        return read

    return make


def _properties(real):
    """``get_device_properties``: the device asked about is guarded where it is the current one."""

    def get_device_properties(device=None):
        if program_of(sys._getframe(1)) is not None and _of_current_device(device):
            guard_current_device(current_cuda_index())
        return real(device)

    return get_device_properties


def _made_again(real):
    def make_again(*args, **kwargs):
        if program_of(sys._getframe(1)) is None:
            return real(*args, **kwargs)
        recorded = recorded_effects()
        if recorded is not None:
            recorded.append(SetterCall(real, args, kwargs))
        return None

    return make_again


def _refused(label: str, what: str, why: str):
    def make(real):
        def refuse(*args, **kwargs):
            program = program_of(sys._getframe(1))
            if program is None:
                return real(*args, **kwargs)
            raise ThunderNotImplementedError(
                f"{label}: the program {what} at {program.f_code.co_filename}:{program.f_lineno}; {why}. Do it "
                "outside the jitted function"
            )

        return refuse

    return make


_OTHER_TENSORS = (
    "a compiled call allocates other tensors than eager's program does (fused kernels keep no intermediates)"
)
_READS = f"{_OTHER_TENSORS}, so no reading of them it could give is eager's, and tracing's reading would be reused"
_RESETS = f"{_OTHER_TENSORS}, so the peak or totals counted after the reset are not eager's"
_STATE = "tracing's reading would be reused where eager reads it again on every call"
#: readings of the device's state now (which changes from call to call)
_STATE_READS = ("utilization", "memory_usage", "temperature", "power_draw", "clock_rate")
_STATISTICS = (
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "memory_snapshot",
    "mem_get_info",
    "get_memory_info",
    "list_gpu_processes",
    "host_memory_stats",
)
_RESETTERS = ("reset_peak_memory_stats", "reset_max_memory_allocated", "reset_accumulated_memory_stats")


def _allocator_places(holder) -> list:
    label = holder.__name__
    places = [(holder, "empty_cache", _made_again)]
    places += [
        (holder, name, _refused(f"{label}.{name}", "reads the CUDA allocator's statistics", _READS))
        for name in _STATISTICS
    ]
    places += [
        (holder, name, _refused(f"{label}.{name}", "resets the CUDA allocator's statistics", _RESETS))
        for name in _RESETTERS
    ]
    return [(h, name, make) for h, name, make in places if hasattr(h, name)]


#: ``(holder, name, stand-in maker)`` of the functions replaced while a program is traced
PLACES = (
    (torch.cuda, "is_available", _guarded("torch.cuda.is_available")),
    (torch.cuda, "device_count", _guarded("torch.cuda.device_count")),
    (torch.cuda, "get_device_capability", _guarded("torch.cuda.get_device_capability", "argument")),
    (torch.cuda, "get_device_name", _guarded("torch.cuda.get_device_name", "argument")),
    (torch.cuda, "is_bf16_supported", _guarded("torch.cuda.is_bf16_supported", "current")),
    (torch.cuda, "is_tf32_supported", _guarded("torch.cuda.is_tf32_supported", "current")),
    (torch.cuda, "get_device_properties", _properties),
    (torch.cuda, "is_current_stream_capturing", _guarded("torch.cuda.is_current_stream_capturing")),
    (torch.accelerator, "is_available", _guarded("torch.accelerator.is_available")),
    (torch.accelerator, "device_count", _guarded("torch.accelerator.device_count")),
    (torch.accelerator, "current_accelerator", _guarded("torch.accelerator.current_accelerator")),
    (torch.accelerator, "get_device_capability", _guarded("torch.accelerator.get_device_capability", "argument")),
    *((torch.cuda, name, _refused(f"torch.cuda.{name}", "reads the device's state", _STATE)) for name in _STATE_READS),
    *_allocator_places(torch.cuda),
    *_allocator_places(torch.cuda.memory),
    *_allocator_places(torch.accelerator),
    *_allocator_places(torch.accelerator.memory),
)
