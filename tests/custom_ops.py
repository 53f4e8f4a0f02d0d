"""A user's custom op (``torch.library``): thunder_rs has no decomposition of it and never will, so
the tests of eager fallbacks use it rather than a torch op that may gain one."""

import torch


@torch.library.custom_op("thunder_rs_tests::running_sum", mutates_args=())
def running_sum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, dim=-1)


@running_sum.register_fake
def _running_sum_fake(x):
    return torch.empty_like(x)


running_sum.register_autograd(lambda ctx, g: torch.flip(torch.cumsum(torch.flip(g, (-1,)), dim=-1), (-1,)))
