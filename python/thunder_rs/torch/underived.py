"""Torch calls eager has no derivative for where a gradient would flow: they run as eager fallbacks.

Eager's forward of such a call runs, its output requires grad, and its backward raises
(``derivatives.yaml``'s ``not_implemented``: "the derivative for 'zeta' is not implemented.",
"derivative for aten::_chunk_cat is not implemented"): a program that never runs that backward
(a loss of other outputs, a call under ``no_grad``, an input requiring no grad) runs. The traced
symbols refuse a gradient there up front, so the program's call of such an op with an argument
requiring grad is recorded as the torch call itself, whose backward is torch's autograd on it
(``core.lang.fallback``), raising eager's error, of eager's type, when the backward runs (a
random draw's backward draws again from the state its forward drew from).
"""

import numbers

import torch

from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.torch.common import flows

T = torch.Tensor


def _argument(args, kwargs, position: int, name: str):
    return args[position] if len(args) > position else kwargs.get(name)


def _first_flows(args, kwargs) -> bool:
    """zeta's ``x``, igamma's and igammac's ``a``: eager has no derivative in them."""
    return flows(_argument(args, kwargs, 0, "input") if "self" not in kwargs else kwargs["self"])


def _any_listed_flows(args, kwargs) -> bool:
    """``_chunk_cat(tensors, dim, num_chunks)``: no derivative in any of them."""
    return flows(*(_argument(args, kwargs, 0, "tensors") or ()))


def _number_dividend(args, kwargs) -> bool:
    """``remainder(number, tensor)``: no derivative in the divisor."""
    dividend, divisor = _argument(args, kwargs, 0, "input"), _argument(args, kwargs, 1, "other")
    return isinstance(dividend, numbers.Number) and flows(divisor)


def _reflected_number_dividend(args, kwargs) -> bool:
    """``number % tensor`` (``Tensor.__rmod__(tensor, number)``)."""
    return isinstance(_argument(args, kwargs, 1, "other"), numbers.Number) and flows(args[0])


def _reduced_scatter(args, kwargs) -> bool:
    """``scatter(input, dim, index, src, reduce=...)``: no derivative with ``reduce``."""
    src = _argument(args, kwargs, 3, "src") if "value" not in kwargs else None
    return _argument(args, kwargs, 4, "reduce") is not None and flows(_argument(args, kwargs, 0, "input"), src)


def _float_probability(args, kwargs) -> bool:
    """``bernoulli(input, p)`` with a float ``p``: no derivative in ``input``."""
    return _argument(args, kwargs, 1, "p") is not None and flows(_argument(args, kwargs, 0, "input"))


#: ``(torch callables, whether a call of them wants a gradient eager has none for)``.
UNDERIVED = (
    ((torch.special.zeta,), _first_flows),
    ((torch.igamma, T.igamma, torch.special.gammainc), _first_flows),
    ((torch.igammac, T.igammac, torch.special.gammaincc), _first_flows),
    ((torch._chunk_cat,), _any_listed_flows),
    ((torch.remainder,), _number_dividend),
    ((T.__rmod__,), _reflected_number_dividend),
    ((torch.scatter, T.scatter), _reduced_scatter),
    ((torch.bernoulli, T.bernoulli), _float_probability),
)
#: Of them, those that draw random numbers.
_DRAWS = frozenset({torch.bernoulli, T.bernoulli})


def _eager_where_underived(func, traced, underived):
    """``func``'s mapping: ``traced``, or ``func`` as an eager fallback where, with grad on, a
    gradient would flow where eager has none (``underived(args, kwargs)``)."""

    def call(*args, **kwargs):
        if torch.is_grad_enabled() and underived(args, kwargs):
            return user_fallback(func, args, kwargs, effect=func in _DRAWS)
        return traced(*args, **kwargs)

    call.__name__ = getattr(traced, "__name__", "call")
    return call


for _funcs, _underived in UNDERIVED:
    for _func in _funcs:
        TORCH_TO_LTORCH[_func] = _eager_where_underived(_func, TORCH_TO_LTORCH[_func], _underived)
