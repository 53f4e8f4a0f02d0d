"""The user's frame: the innermost one outside thunder_rs and torch, which errors, warnings and
log records name."""

import os
import sys

import torch

_PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__))
_TORCH_DIR = os.path.dirname(torch.__file__)


def user_frame():
    """The innermost frame outside thunder_rs and torch (None when there is none)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not (path.startswith(("<frozen", "<thunder_rs")) or path.startswith(_PACKAGE_DIR) or path.startswith(_TORCH_DIR)):
            return frame
        frame = frame.f_back
    return None


def user_location() -> str:
    """``file:line`` of the innermost frame outside thunder_rs and torch."""
    frame = user_frame()
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "<unknown>"
