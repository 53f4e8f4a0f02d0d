"""Where eager's CPU kernels hand a tensor to oneDNN rather than to their own (TensorIterator)
kernel, and what oneDNN computes there that the decompositions do not.

``F.gelu`` runs oneDNN's ``eltwise_gelu_erf`` (``gelu_out_cpu`` and ``use_mkldnn`` in
aten/src/ATen/native/Activation.cpp) for a contiguous CPU tensor of more than one element, float32,
bfloat16 or float16 where the CPU has oneDNN's support of them (float16: AVX512-FP16 or AMX-FP16;
a CPU without takes aten's kernel, which the value read below shows), while ``torch.backends.mkldnn.enabled``
(on aarch64 its tanh approximation too). oneDNN's JIT kernel for AVX-512 gives NaN for +inf, where
aten's own kernels (vectorized or not, and CUDA's) and the decomposition give inf: so eager's
``gelu(x)[i]`` at +inf depends on the tensor's layout and size, not on the element's position.
Which value oneDNN gives there is read once per dtype from oneDNN itself (it differs by ISA).
"""

import functools
import math
import platform

import torch

from thunder_rs.core.base.layouts import is_contiguous
from thunder_rs.core.state.guards import StateGuard
from thunder_rs.core.state.observe import thread_state
from thunder_rs.torch.strides import strides_of

__all__ = ["gelu_at_inf", "gelu_may_differ_at_inf", "tensor_gelu_at_inf"]

_ONEDNN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _read_switch() -> bool:
    return bool(torch.backends.mkldnn.enabled)


def _switch() -> bool:
    """``torch.backends.mkldnn.enabled`` now; while a program is traced, its entry also runs only
    while the switch is what it was when the call began (a changed switch compiles again)."""
    value = _read_switch()
    observer = thread_state.observer
    if observer is not None:
        observer.guard_state(StateGuard("torch.backends.mkldnn.enabled", _read_switch, value))
    return value


@functools.cache
def _gelu_of_inf(dtype: torch.dtype, approximate: str) -> float:
    """Eager's gelu of +inf in a contiguous tensor of two elements: oneDNN's where it takes the
    dtype (read with the switch on), aten's own kernel's (inf) where it does not."""
    with torch._C.DisableTorchFunction():
        x = torch.full((2,), math.inf, dtype=dtype)
        return float(torch._C._nn.gelu(x, approximate=approximate)[0])


def _may_take_onednn(input, approximate: str) -> bool:
    """Whether eager's gelu may run oneDNN's kernel for a tensor of ``input``'s dtype and device,
    its layout and sizes aside."""
    if input.device.type != "cpu" or input.dtype not in _ONEDNN_DTYPES:
        return False
    if approximate != "none" and platform.machine() not in ("aarch64", "arm64"):
        return False
    return torch.backends.mkldnn.is_available()


def _takes_onednn(input, approximate: str) -> bool:
    if not _may_take_onednn(input, approximate):
        return False
    # (a symbolic size is 2 or more: only constant sizes make one element)
    if all(type(n) is int and n == 1 for n in input.shape):
        return False
    return is_contiguous(input.shape, strides_of(input)) and _switch()


def gelu_at_inf(input, approximate: str) -> float | None:
    """What eager's ``F.gelu(input, approximate=approximate)`` gives at +inf where oneDNN computes
    it and that is not inf (NaN on AVX-512); None where it gives inf, as the decomposition does."""
    if not _takes_onednn(input, approximate):
        return None
    value = _gelu_of_inf(input.dtype, approximate)
    return None if value == math.inf else value


def gelu_may_differ_at_inf(input, approximate: str) -> bool:
    """Whether eager's gelu of a tensor of ``input``'s dtype and device may give other than inf at
    +inf (where oneDNN computes it), whatever its layout and sizes (symbolic ones included) and
    without a guard: for a decision outside tracing that is exact either way where eager's gelu
    does give inf (an executor leaving such a gelu to eager)."""
    if not _may_take_onednn(input, approximate) or not _read_switch():
        return False
    return _gelu_of_inf(input.dtype, approximate) != math.inf


def tensor_gelu_at_inf(x: torch.Tensor, approximate: str) -> float | None:
    """``gelu_at_inf`` for a tensor (a fake one while a region is traced to its FX graph): from its
    own layout and the switch as it is now. A symbolic size is 2 or more."""
    if not _may_take_onednn(x, approximate) or all(type(n) is int and n == 1 for n in x.shape):
        return None
    if not (x.is_contiguous() and _read_switch()):
        return None
    value = _gelu_of_inf(x.dtype, approximate)
    return None if value == math.inf else value
