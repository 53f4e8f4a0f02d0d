"""Convolutions: ``F.conv1d/2d/3d``, ``F.conv_transpose1d/2d/3d`` and ``torch.convolution``, over
the ``convolution`` prim (its gradient is the ``convolution_backward`` prim: aten's kernels, as in
eager). Unbatched inputs, ``padding="same"/"valid"`` and int-or-tuple arguments are resolved here."""

import torch
import torch.nn.functional as F

from thunder_rs import prims
from thunder_rs.errors import ThunderRuntimeError, ThunderTypeError, ThunderValueError, check
from thunder_rs.core.lang.symint import hint
from thunder_rs.torch.common import is_int
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution"]


def _ints(value, n: int, op: str, arg: str) -> tuple[int, ...]:
    """An int-or-sequence argument as ``n`` ints (a one-element sequence is repeated, as torch does).
    The convolution prim takes numbers: an int from a symbolic size is specialised."""
    if is_int(value):
        return (int(value),) * n
    check(
        isinstance(value, (tuple, list)) and all(is_int(v) for v in value),
        op,
        lambda: f"expected an int or a sequence of ints for {arg}, got {value!r}",
        ThunderTypeError,
    )
    value = tuple(map(int, value))
    if len(value) == 1:
        return value * n
    check(
        len(value) == n,
        op,
        f"expected {arg} to be a single integer value or a list of {n} values to match the "
        f"convolution dimensions, but got {arg}={list(value)}",
        ThunderRuntimeError,
    )
    return value


def _check_operands(op: str, input, weight, bias, n: int) -> None:
    check(
        isinstance(input, torch.Tensor) and isinstance(weight, torch.Tensor),
        op,
        "expected tensors for input and weight",
        ThunderTypeError,
    )
    check(
        weight.ndim == n + 2,
        op,
        f"expected a {n + 2}-D weight, got {tuple(weight.shape)} (argument weight)",
        ThunderRuntimeError,
    )
    check(
        input.ndim in (n + 1, n + 2),
        op,
        f"Expected {n + 1}D (unbatched) or {n + 2}D (batched) input to conv{n}d, "
        f"but got input of size: {list(input.shape)} (argument input)",
        ThunderRuntimeError,
    )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check(
                t.dtype == input.dtype,
                op,
                f"Input type ({input.dtype}) and {name} type ({t.dtype}) should be the same (argument {name})",
                ThunderRuntimeError,
            )


def _same_padding(input, weight, dilation, stride, op: str):
    """``padding="same"``: torch pads ``d * (k - 1)`` in all, the odd element at the end, which
    the prim's symmetric padding cannot say; that element is padded here first."""
    check(
        all(s == 1 for s in stride),
        op,
        "padding='same' is not supported for strided convolutions (argument padding)",
        ThunderRuntimeError,
    )
    totals = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
    extra = [t % 2 for t in totals]
    if any(extra):  # eager's constant_pad_nd, whose gradient is a new tensor (not a view of one)
        input = ltorch.pad(input, [amount for e in reversed(extra) for amount in (0, e)])
    return input, tuple(t // 2 for t in totals)


#: eager's checks of a convolution's geometry, in its order (``at::_convolution``): (argument,
#: whether its values are refused, eager's message)
_GEOMETRY = (
    ("padding", lambda v: v < 0, "negative padding is not supported"),
    ("output_padding", lambda v: v < 0, "negative output_padding is not supported"),
    ("stride", lambda v: v <= 0, "non-positive stride is not supported"),
    ("dilation", lambda v: v <= 0, "dilation should be greater than zero"),
)


def _check_geometry(op: str, stride, padding, dilation, output_padding) -> None:
    """Eager's RuntimeError for a negative padding, a non-positive stride or dilation."""
    values = {"stride": stride, "padding": padding, "dilation": dilation, "output_padding": output_padding}
    for arg, refused, message in _GEOMETRY:
        if any(refused(v) for v in values[arg]):
            raise ThunderRuntimeError(f"{op}: {message} (argument {arg} = {list(values[arg])})")


def _conv(op: str, n: int, input, weight, bias, stride, padding, dilation, groups, transposed=False, output_padding=0):
    _check_operands(op, input, weight, bias, n)
    stride, dilation = _ints(stride, n, op, "stride"), _ints(dilation, n, op, "dilation")
    output_padding = _ints(output_padding, n, op, "output_padding")
    check(
        # (a symbolic count where vmap folds per-example weights into groups, one per example)
        is_int(groups) and hint(groups) > 0,
        op,
        f"non-positive groups is not supported (argument groups={groups})",
        ThunderRuntimeError,
    )
    unbatched = input.ndim == n + 1
    if unbatched:
        input = prims.reshape(input, (1, *input.shape))
    if isinstance(padding, str):
        check(
            padding in ("same", "valid") and not transposed,
            op,
            f"Invalid padding string '{padding}', should be one of ['valid', 'same'] (argument padding)",
            ThunderValueError,
        )
        input, padding = _same_padding(input, weight, dilation, stride, op) if padding == "same" else (input, (0,) * n)
    padding = _ints(padding, n, op, "padding")
    _check_geometry(op, stride, padding, dilation, output_padding)
    out = prims.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    return prims.reshape(out, tuple(out.shape[1:])) if unbatched else out


def _define_conv(n: int):
    torch_fn = getattr(F, f"conv{n}d")

    @torchsymbol(torch_fn, getattr(torch, f"conv{n}d"), name=f"conv{n}d")
    def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        return _conv(f"ltorch.conv{n}d", n, input, weight, bias, stride, padding, dilation, groups)

    return conv


def _define_conv_transpose(n: int):
    torch_fn = getattr(F, f"conv_transpose{n}d")

    @torchsymbol(torch_fn, getattr(torch, f"conv_transpose{n}d"), name=f"conv_transpose{n}d")
    def conv_transpose(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
        return _conv(
            f"ltorch.conv_transpose{n}d",
            n,
            input,
            weight,
            bias,
            stride,
            padding,
            dilation,
            groups,
            transposed=True,
            output_padding=output_padding,
        )

    return conv_transpose


conv1d, conv2d, conv3d = (_define_conv(n) for n in (1, 2, 3))
conv_transpose1d, conv_transpose2d, conv_transpose3d = (_define_conv_transpose(n) for n in (1, 2, 3))


@torchsymbol(torch.convolution)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = weight.ndim - 2
    check(
        n in (1, 2, 3) and input.ndim == n + 2,
        "ltorch.convolution",
        f"expected a batched input and a weight of rank 3 to 5, got {tuple(input.shape)} and {tuple(weight.shape)}",
        ThunderRuntimeError,
    )
    return _conv(
        "ltorch.convolution",
        n,
        input,
        weight,
        bias,
        stride,
        padding,
        dilation,
        groups,
        bool(transposed),
        output_padding,
    )
