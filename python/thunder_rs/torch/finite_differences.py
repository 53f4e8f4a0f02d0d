"""``torch.gradient`` with scalar spacings: ATen's composite (``gradient_helper_float``), its
central differences inside and one-sided ones of ``edge_order`` at the ends, written with the
same ops in the same order, so that its values are eager's; its grad rule adds the slices'
cotangents in the order eager's autograd engine does. Spacings given as coordinate tensors
(``gradient_helper``: second-order differences weighted by the coordinates' steps) are traced
with eager's ops too where no gradient flows; with gradients they stay eager's call, whose
backward adds the slices' contributions in an order the decomposition's VJP does not keep (the
last bits differ).
"""

import torch

from thunder_rs import clang
from thunder_rs.core.lang.fallback import fallback
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, check
from thunder_rs.torch.common import is_number
from thunder_rs.torch.shape import slice_in_dim
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = ["gradient", "gradient_at_coordinates"]


def _sliced(a, d: int, start: int, stop: int | None = None):
    """``a[start:stop]`` along ``d`` (negative bounds count from the end)."""
    size = a.shape[d]
    stop = size if stop is None else stop + size if stop < 0 else stop
    return slice_in_dim(a, d, start + size if start < 0 else start, stop)


def _one_direction(a, d: int, dx, edge_order: int):
    """The gradient along dim ``d``: ``cat([prepend, center / 2, append])`` as ATen builds it."""
    center = ltorch.div(ltorch.sub(_sliced(a, d, 2), _sliced(a, d, 0, -2)), dx)
    if edge_order == 1:
        prepend = ltorch.div(ltorch.sub(_sliced(a, d, 1, 2), _sliced(a, d, 0, 1)), dx)
        append = ltorch.div(ltorch.sub(_sliced(a, d, -1), _sliced(a, d, -2, -1)), dx)
    else:
        first, second, third = (ltorch.mul(_sliced(a, d, i, i + 1), k) for i, k in ((0, -1.5), (1, 2), (2, 0.5)))
        prepend = ltorch.div(ltorch.sub(ltorch.add(first, second), third), dx)
        first, second, third = (
            ltorch.mul(_sliced(a, d, i, i + 1 or None), k) for i, k in ((-3, 0.5), (-2, 2), (-1, 1.5))
        )
        append = ltorch.div(ltorch.add(ltorch.sub(first, second), third), dx)
    return ltorch.cat([prepend, ltorch.div(center, 2), append], d)


@torchsymbol(name="gradient", sequence=True)
def gradient(input, spacing, dim, edge_order):
    """The gradients of ``input`` along each of ``dim`` (canonical, distinct), ``spacing`` apart."""
    return tuple(_one_direction(input, d, dx, edge_order) for d, dx in zip(dim, spacing))


def _contributions(g, d: int, dx, edge_order: int) -> list:
    """``(start, stop, value)`` of each slice of the input that one direction's cotangent ``g``
    flows back to, computed as eager's backward nodes compute them (divisions by the spacing,
    negations, products with the stencil's weights), in the order eager's engine runs those
    nodes (the latest made first: the append's slices, the prepend's, the center's)."""
    size = g.shape[d]
    gp, gc, ga = (_sliced(g, d, *bounds) for bounds in ((0, 1), (1, -1), (-1, None)))
    k = ltorch.div(ltorch.div(gc, 2), dx)
    kp, ka = ltorch.div(gp, dx), ltorch.div(ga, dx)
    center = [(2, size, k), (0, size - 2, ltorch.neg(k))]
    if edge_order == 1:
        ends = [(size - 1, size, ka), (size - 2, size - 1, ltorch.neg(ka)), (1, 2, kp), (0, 1, ltorch.neg(kp))]
    else:
        ends = [
            (size - 3, size - 2, ltorch.mul(ka, 0.5)),
            (size - 2, size - 1, ltorch.mul(ltorch.neg(ka), 2)),
            (size - 1, size, ltorch.mul(ka, 1.5)),
            (0, 1, ltorch.mul(kp, -1.5)),
            (1, 2, ltorch.mul(kp, 2)),
            (2, 3, ltorch.mul(ltorch.neg(kp), 0.5)),
        ]
    return ends + center


@register_grad(gradient)
def gradient_rule(input, spacing, dim, edge_order):
    """Eager's gradient: each slice's cotangent placed in zeros of the input's shape and put one
    by one in the order eager's engine accumulates them (the last direction first), each apart:
    after what ops later in the forward gave the input, eager's ``((c + a) + b) + ...``."""
    outs = gradient(input, spacing, dim, edge_order)
    for out, d, dx in reversed(tuple(zip(outs, dim, spacing))):
        for start, stop, value in _contributions(get_grad(out), d, dx, edge_order):
            pad = [0] * (2 * input.ndim)
            pad[2 * (input.ndim - 1 - d)], pad[2 * (input.ndim - 1 - d) + 1] = start, input.shape[d] - stop
            put_grad(input, ltorch.constant_pad_nd(value, pad, 0))
    return outs


def _checked(op: str, input, spacing, dim, edge_order) -> tuple[tuple, tuple]:
    """``(spacings, dims)`` as ATen's overloads make them, with ``pre_check_gradient``'s checks."""
    uint8 = "torch.gradient does not support uint8 input. (argument input)"
    check(input.dtype != torch.uint8, op, uint8, ThunderNotImplementedError)
    given = spacing is not None and not is_number(spacing)
    dims = tuple(range(input.ndim)) if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
    if not given:
        spacing = (1.0 if spacing is None else spacing,) * len(dims)
    spacing = tuple(spacing)
    if given and dim is None:
        check(
            len(spacing) == input.ndim,
            op,
            f"torch.gradient expected spacing to be unspecified, a scalar, or a list of length equal to "
            f"'self.dim() = {input.ndim}', since dim argument was not given, but got a list of length "
            f"{len(spacing)} (argument spacing)",
            ThunderRuntimeError,
        )
    check(
        len(spacing) == len(dims),
        op,
        f"torch.gradient expected spacing to be unspecified, a scalar or it's spacing and dim arguments to have "
        f"the same length, but got a spacing argument of length {len(spacing)} and a dim argument of length "
        f"{len(dims)}. (argument spacing)",
        ThunderRuntimeError,
    )
    check(
        edge_order in (1, 2),
        op,
        "torch.gradient only supports edge_order=1 and edge_order=2. (argument edge_order)",
        ThunderRuntimeError,
    )
    dims = tuple(clang.canonicalize_dim(input.ndim, d, op) for d in dims)
    for i, d in enumerate(dims):
        check(
            d not in dims[:i],
            op,
            f"dim {d} appears multiple times in the list of dims (argument dim)",
            ThunderRuntimeError,
        )
    check(
        all(input.shape[d] >= edge_order + 1 for d in dims),
        op,
        "torch.gradient expected each dimension size to be at least edge_order+1 (argument input)",
        ThunderRuntimeError,
    )
    return spacing, dims


def _weights(steps, first: int, second: int, outer: bool):
    """The one-sided second-order stencil at an end, from the steps ``first`` (at the end) and
    ``second`` next to it: ``gradient_helper``'s ``a``, ``b``, ``c``, in its order of operations."""
    h1, h2 = (ltorch.reshape(_sliced(steps, 0, i, i + 1 or None), ()) for i in (first, second))
    if not outer:  # the first end: weights of the points 0, 1, 2
        a = ltorch.div(ltorch.neg(ltorch.add(ltorch.mul(h1, 2.0), h2)), ltorch.mul(h1, ltorch.add(h1, h2)))
        b = ltorch.div(ltorch.add(h1, h2), ltorch.mul(h1, h2))
        c = ltorch.div(ltorch.neg(h1), ltorch.mul(h2, ltorch.add(h1, h2)))
        return a, b, c
    # the last end (``first`` is the last step): weights of the points -3, -2, -1
    a = ltorch.div(h1, ltorch.mul(h2, ltorch.add(h1, h2)))
    b = ltorch.div(ltorch.neg(ltorch.add(h1, h2)), ltorch.mul(h1, h2))
    c = ltorch.div(ltorch.add(ltorch.mul(h1, 2), h2), ltorch.mul(h1, ltorch.add(h1, h2)))
    return a, b, c


def _weighted(a, d: int, weights, starts) -> object:
    """``w0 * a[s0] + w1 * a[s1] + w2 * a[s2]`` along ``d``, left to right."""
    terms = [ltorch.mul(w, _sliced(a, d, s, e)) for w, (s, e) in zip(weights, starts)]
    return ltorch.add(ltorch.add(terms[0], terms[1]), terms[2])


@torchsymbol(name="gradient_at_coordinates", sequence=True)
def gradient_at_coordinates(input, coordinates, dim, edge_order):
    """``gradient_helper``: the gradients of ``input`` along each of ``dim`` (canonical, distinct)
    at the points ``coordinates`` (1-D tensors) give."""
    out = []
    for x, d in zip(coordinates, dim):
        shape = tuple(-1 if i == d else 1 for i in range(input.ndim))
        steps = ltorch.sub(_sliced(x, 0, 1), _sliced(x, 0, 0, -1))
        h1, h2 = _sliced(steps, 0, 0, -1), _sliced(steps, 0, 1)
        a = ltorch.div(ltorch.neg(h2), ltorch.mul(h1, ltorch.add(h1, h2)))
        b = ltorch.div(ltorch.sub(h2, h1), ltorch.mul(h1, h2))
        c = ltorch.div(h1, ltorch.mul(h2, ltorch.add(h1, h2)))
        center = _weighted(input, d, [ltorch.reshape(w, shape) for w in (a, b, c)], ((0, -2), (1, -1), (2, None)))
        if edge_order == 1:
            first, last = (ltorch.reshape(_sliced(steps, 0, i, i + 1 or None), ()) for i in (0, -1))
            prepend = ltorch.div(ltorch.sub(_sliced(input, d, 1, 2), _sliced(input, d, 0, 1)), first)
            append = ltorch.div(ltorch.sub(_sliced(input, d, -1), _sliced(input, d, -2, -1)), last)
        else:
            prepend = _weighted(input, d, _weights(steps, 0, 1, False), ((0, 1), (1, 2), (2, 3)))
            append = _weighted(input, d, _weights(steps, -1, -2, True), ((-3, -2), (-2, -1), (-1, None)))
        out.append(ltorch.cat([prepend, center, append], d))
    return tuple(out)


def _coordinates(op: str, spacing, dims, device) -> None:
    for x in spacing:
        check(
            isinstance(x, torch.Tensor) and x.ndim == 1,
            op,
            lambda: (
                "torch.gradient expected each element of spacing to have one dimension, but got an element with "
                f"{getattr(x, 'ndim', 0)} dimensions! (argument spacing)"
            ),
            ThunderRuntimeError,
        )
        check(
            x.device == device,
            op,
            lambda: (
                f"torch.gradient expected each tensor to be on the same device, but got devices {device} and "
                f"{x.device}! (argument spacing)"
            ),
            ThunderRuntimeError,
        )


def _gradient_call(input, *, spacing=None, dim=None, edge_order=1):
    """``torch.gradient``: spacings as numbers or as coordinate tensors."""
    spacing, dims = _checked("ltorch.gradient", input, spacing, dim, edge_order)
    if any(isinstance(s, torch.Tensor) for s in spacing):
        _coordinates("ltorch.gradient", spacing, dims, input.device)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (input, *spacing)):
            return fallback(torch.gradient, (input,), {"spacing": spacing, "dim": dim, "edge_order": edge_order})
        return gradient_at_coordinates(input, spacing, dims, edge_order)
    return gradient(input, spacing, dims, edge_order)


TORCH_TO_LTORCH[torch.gradient] = _gradient_call
