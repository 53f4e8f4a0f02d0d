"""What torch's errors on meta and fake tensors say of an op: that it reads its arguments'
values, so that its outputs' metadata comes from running it on them (``fallback``,
``fallback_sizes``)."""

import re

#: What an op that reads an argument's values on the CPU says of its meta stand-in ("batch_sizes
#: tensor should be on CPU, but got meta"; "... a 1D CPU int64 tensor, but got 1D meta Long tensor").
_WANTS_THE_CPU = re.compile(r"\bCPU\b.*\bbut got\b.*\bmeta\b")
#: A fake tensor's data read (under autocast, where metadata comes from fake tensors): ``torch.tensor``
#: of a list of 0-d tensors reads each one's value, as ``Tensor.item()`` of a meta tensor refuses.
_FAKE_DATA = "data is not allocated yet"


def reads_values(e: Exception) -> bool:
    """Whether ``e``, raised by a call on meta or fake tensors, says that the op reads its
    arguments' values: a meta tensor's refused, one wanted on the CPU, a fake tensor's data."""
    return "meta tensor" in str(e).lower() or bool(_WANTS_THE_CPU.search(str(e))) or _FAKE_DATA in str(e)
