"""The regularized incomplete gamma functions ``torch.igamma`` (``torch.special.gammainc``) and
``torch.igammac`` (``gammaincc``): one prim each, which executors run as eager's kernel (its series,
continued fraction and asymptotic branches have no sensible decomposition into other prims), with
eager's type promotion, broadcasting and argument checks, and eager's derivative in ``x`` beside
each (torch defines none in ``a``: a gradient wanted there is refused up front).
"""

import torch

from thunder_rs import clang, prims
from thunder_rs.core.lang.grad import get_grad, register_grad
from thunder_rs.errors import ThunderNotImplementedError, ThunderTypeError, check
from thunder_rs.torch.elementwise import put_operand_grads
from thunder_rs.torch.symbols import ltorch, torchsymbol

T = torch.Tensor
__all__ = ["igamma", "igammac"]


def _incomplete_gamma(op: str, prim, input, other):
    for x, name in ((input, "input"), (other, "other")):
        check(
            isinstance(x, torch.Tensor),
            op,
            lambda: f"argument '{name}' must be Tensor, not {type(x).__name__} (argument {name})",
            ThunderTypeError,
        )
    return clang.elementwise(prim, op, input, other)


@torchsymbol(torch.igamma, T.igamma, torch.special.gammainc)
def igamma(input, other):
    return _incomplete_gamma("ltorch.igamma", prims.igamma, input, other)


@torchsymbol(torch.igammac, T.igammac, torch.special.gammaincc)
def igammac(input, other):
    return _incomplete_gamma("ltorch.igammac", prims.igammac, input, other)


def _incomplete_gamma_grad(symbol, sign: float, input, other):
    """Eager's formula (``derivatives.yaml``): ``g * exp((a - 1) * log(x) - x - lgamma(a))`` for
    ``x`` (negated for igammac: ``-g * ...``), in its operators' order."""
    out = symbol(input, other)  # (its checks first: both are tensors)
    name = symbol.symbol_name.removeprefix("ltorch.")
    check(
        not input.requires_grad,
        symbol.symbol_name,
        lambda: f"the derivative for '{name}: input' is not implemented (in torch either); detach it (argument input)",
        ThunderNotImplementedError,
    )
    if other.requires_grad:
        g = get_grad(out)
        density = torch.exp((input - 1) * torch.log(other) - other - torch.lgamma(input))
        put_operand_grads((other,), ((g if sign > 0 else -g) * density,))
    return out


@register_grad(ltorch.igamma)
def igamma_grad(input, other):
    return _incomplete_gamma_grad(ltorch.igamma, 1.0, input, other)


@register_grad(ltorch.igammac)
def igammac_grad(input, other):
    return _incomplete_gamma_grad(ltorch.igammac, -1.0, input, other)
