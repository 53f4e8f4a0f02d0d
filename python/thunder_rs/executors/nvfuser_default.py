"""Makes nvFuser the default fusion executor on CUDA machines where ``nvfuser_direct`` imports.

CPU-only machines (and ``THUNDER_RS_NVFUSER=0``) keep the defaults unchanged and never import
nvFuser; the nvFuser executor claims only CUDA tensors, so CPU programs run as before either way.
"""

import importlib
import importlib.util
import os

import torch

from thunder_rs.core.lang.executor_api import register_executor


def use_nvfuser_on_cuda() -> bool:
    """Adds the nvFuser executor to the defaults when CUDA is available and nvFuser imports;
    returns whether it did."""
    if os.environ.get("THUNDER_RS_NVFUSER", "1") == "0" or not torch.cuda.is_available():
        return False
    if importlib.util.find_spec("nvfuser_direct") is None:
        return False
    executor = importlib.import_module("thunder_rs.executors.nvfuser_ex").nvfuser_executor()
    if not executor.available:
        return False
    register_executor(executor)
    return True
