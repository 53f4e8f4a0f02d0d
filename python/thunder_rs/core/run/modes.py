"""The grad mode and autocast state a compiled call runs its generated code under.

Grad mode and autocast are trace state: the trace records what each op did under the modes in
effect when it was traced (outputs that require grad, casts made by autocast), and the cache
key holds the caller's modes. The generated code must then run without the caller's modes
acting on it a second time:

- a trace with differentiable outputs builds its autograd graph even when the caller's grad
  mode is off (``torch.enable_grad()`` inside a call made under ``torch.no_grad()``);
- a trace without differentiable outputs runs with grad mode off when an input requires grad,
  so that ops recorded under ``no_grad`` inside it do not record a graph at run time;
- a trace recorded under autocast runs its forward with autocast off: its casts are recorded
  ops, and the ops autocast left alone (inside ``autocast(enabled=False)``) must stay so. The
  backward runs under the modes of the ``backward()`` call, as eager's backward ops do.
"""

import torch

from thunder_rs.core.lang import autocast
from thunder_rs.core.lang.autocast import AutocastState, nesting as _autocast_nesting
from thunder_rs.errors import ThunderNotImplementedError

_is_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
_set_autocast_enabled = torch.set_autocast_enabled


def _with_grad_mode(fn, mode: bool):
    def call(*args):
        previous = _is_grad_enabled()
        _set_grad_enabled(mode)
        try:
            return fn(*args)
        finally:
            _set_grad_enabled(previous)

    return call


def _without_autocast(fn, devices: tuple[str, ...]):
    """``fn`` run with autocast off on ``devices``, those whose autocast the trace recorded (the
    cache key holds them, so they are on whenever this entry is called)."""

    def call(*args):
        for d in devices:
            _set_autocast_enabled(d, False)
        try:
            return fn(*args)
        finally:
            for d in devices:
                _set_autocast_enabled(d, True)

    return call


class RecordedModes:
    """The modes of one compilation (those of its cache key), read before the program is traced."""

    def __init__(self):
        self.grad_enabled = _is_grad_enabled()
        self.autocast: AutocastState | None = autocast.state()
        self.nesting = _autocast_nesting()

    def check_restored(self) -> None:
        """Raises when the traced program left grad mode or autocast changed (``torch.set_grad_enabled(False)``
        called as a function): it ran once, so later calls would not change them as eager's do."""
        now = (_is_grad_enabled(), autocast.state())
        if now == (self.grad_enabled, self.autocast):
            return
        self.restore()
        raise ThunderNotImplementedError(
            f"thunder_rs.jit: the traced program changed grad mode or autocast (grad mode, autocast: "
            f"{(self.grad_enabled, self.autocast)} -> {now}) without restoring them; a compiled program is traced "
            "once, so later calls would not change them as eager's calls do. Use torch.no_grad(), "
            "torch.set_grad_enabled(...) or torch.autocast(...) as context managers or decorators"
        )

    def restore(self) -> None:
        """Sets grad mode and autocast back to those of the compilation: after a trace that left
        them changed, or one that thunder_rs gave up part way (a ``torch.compile`` graph sets grad
        mode by calls, ``torch._C._set_grad_enabled(False)`` ... ``(True)``, and one refused between
        them left grad mode off for the eager run of the graph that follows: its outputs had no
        gradient), and the count of autocast regions entered (one a refused graph entered)."""
        for _ in range(_autocast_nesting() - self.nesting):
            # An autocast region entered (``_enter_autocast``) and not left: nested, its casts of
            # the weights stayed cached after every later region, which then used stale ones.
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()
        if (_is_grad_enabled(), autocast.state()) == (self.grad_enabled, self.autocast):
            return
        _set_grad_enabled(self.grad_enabled)
        for device_type in ("cpu", "cuda"):
            dtype = getattr(self.autocast, device_type) if self.autocast is not None else None
            torch.set_autocast_enabled(device_type, dtype is not None)
            if dtype is not None:
                torch.set_autocast_dtype(device_type, dtype)

    def call(self, fn, differentiable: bool, acquired_trace):
        """The compiled call, ``fn`` being the autograd function's apply when ``differentiable``."""
        if differentiable and not self.grad_enabled:
            fn = _with_grad_mode(fn, True)
        elif not differentiable and self.grad_enabled and any(acquired_trace.input_requires_grad()):
            fn = _with_grad_mode(fn, False)
        if self.autocast is None:
            return fn
        return _without_autocast(fn, tuple(d for d, _ in self.autocast.devices()))
