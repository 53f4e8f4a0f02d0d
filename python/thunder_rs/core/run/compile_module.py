"""``thunder_rs.compile_module(module)``: ``nn.Module.compile`` with thunder_rs."""

import torch

from thunder_rs.core.run.front import check_options
from thunder_rs.core.run.jit import ThunderFunction


def compile_module(module: torch.nn.Module, **options) -> None:
    """Jits ``module`` in place, as ``nn.Module.compile`` does with ``torch.compile``: its calls
    (``module(x)``, hooks included) go through ``thunder_rs.jit`` of its ``_call_impl``, while the
    object, its parameters and its state dict stay what they were."""
    check_options(options)
    module._compiled_call_impl = ThunderFunction(module._call_impl, module=module, **options)
