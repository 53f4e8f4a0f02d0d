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


# Ops whose fake kernels compute their output sizes from their inputs' (a symbolic size stays one
# through them) and decide on them (the decision becomes a guard).
@torch.library.custom_op("thunder_rs_tests::fold_pairs", mutates_args=())
def fold_pairs(x: torch.Tensor) -> torch.Tensor:
    """Rows 2i and 2i+1 side by side: ``[n, d] -> [n // 2, 2 * d]`` (n even)."""
    return x.reshape(x.shape[0] // 2, 2 * x.shape[1]).clone()


@fold_pairs.register_fake
def _fold_pairs_fake(x):
    torch._check(x.shape[0] % 2 == 0, lambda: "fold_pairs: an odd number of rows")
    return x.new_empty(x.shape[0] // 2, 2 * x.shape[1])


def _keep_shape(ctx, inputs, output):
    ctx.shape = inputs[0].shape


fold_pairs.register_autograd(lambda ctx, g: g.reshape(ctx.shape), setup_context=_keep_shape)


@torch.library.custom_op("thunder_rs_tests::head_rows", mutates_args=())
def head_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` rows."""
    return x[:n].clone()


@head_rows.register_fake
def _head_rows_fake(x, n):
    torch._check(n <= x.shape[0])
    return x.new_empty(n, *x.shape[1:])


@torch.library.custom_op("thunder_rs_tests::pool_long_rows", mutates_args=())
def pool_long_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows longer than 8 are averaged in pairs of columns; shorter ones are kept."""
    return x.unflatten(1, (-1, 2)).mean(-1) if x.shape[1] > 8 else x.clone()


@pool_long_rows.register_fake
def _pool_long_rows_fake(x):
    return x.new_empty(x.shape[0], x.shape[1] // 2) if x.shape[1] > 8 else torch.empty_like(x)


@torch.library.custom_op("thunder_rs_tests::scaled_pair", mutates_args=())
def scaled_pair(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(2 x, 3 y)``: each output reads one input."""
    return x * 2, y * 3


@scaled_pair.register_fake
def _scaled_pair_fake(x, y):
    return torch.empty_like(x), torch.empty_like(y)


def _scaled_pair_unmaterialized(ctx, inputs, output):
    ctx.set_materialize_grads(False)  # (an output the loss does not read gets None, not zeros)


def _scaled_pair_backward(ctx, gx, gy):
    """No gradient (None) for the input of an output that got none, as torch's own ops give."""
    return (None if gx is None else gx * 2), (None if gy is None else gy * 3)


scaled_pair.register_autograd(_scaled_pair_backward, setup_context=_scaled_pair_unmaterialized)
