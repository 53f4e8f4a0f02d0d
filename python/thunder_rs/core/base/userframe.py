"""The user's frame: the innermost one outside thunder_rs and torch, which errors, warnings and
log records name."""

import os
import sys

import torch

#: The thunder_rs package's directory (this file is thunder_rs/core/base/userframe.py): frames there
#: are never the user's.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep  # (not torchvision's, beside it)


def is_user_file(path: str) -> bool:
    """Whether code in ``path`` is the user's: not thunder_rs's, torch's or generated."""
    return not path.startswith(("<frozen", "<thunder_rs", PACKAGE_DIR, _TORCH_DIR))


def user_frame():
    """The innermost frame outside thunder_rs and torch (None when there is none)."""
    frame = sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


def user_location() -> str:
    """``file:line`` of the innermost frame outside thunder_rs and torch."""
    frame = user_frame()
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "<unknown>"
