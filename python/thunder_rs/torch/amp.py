"""Loss scaling's in-place kernels (what ``torch.amp.GradScaler`` runs), for a program that scales
its loss by hand: ``torch._amp_foreach_non_finite_check_and_unscale_`` multiplies each gradient
by the inverse scale and sets ``found_inf`` to 1 where one holds an inf or a NaN, and
``torch._amp_update_scale_`` backs the scale off after such a step or grows it after
``growth_interval`` clean ones. Each is written as eager's CPU kernel computes it
(``AmpGradScalerKernels.cpp``), with the in-place tensor methods (``inplace``), so each call
writes the values eager writes."""

import functools

import torch

from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.langctx import MUTATING, TORCH_TO_LTORCH
from thunder_rs.errors import ThunderRuntimeError, check

_REDUCED = (torch.float16, torch.bfloat16)


def _check_one_element(name: str, what: str, t, dtype: torch.dtype, dtype_name: str) -> None:
    check(
        t.numel() == 1, name, lambda: f"{what} must be a 1-element tensor. (at {user_location()})", ThunderRuntimeError
    )
    check(
        t.dtype == dtype,
        name,
        lambda: f"{what} must be a {dtype_name} tensor. (at {user_location()})",
        ThunderRuntimeError,
    )


def non_finite_check_and_unscale_(scaled_grads, found_inf, inv_scale) -> None:
    """Each gradient times ``inv_scale`` (in float for half and bfloat16 ones, rounded once, as
    the kernel's opmath); ``found_inf`` 1 if any element of any gradient is not finite, else
    left as it was (zeroing it first is the caller's part)."""
    name = "torch._amp_foreach_non_finite_check_and_unscale_"
    if not scaled_grads:
        return
    _check_one_element(name, "inv_scale", inv_scale, torch.float32, "float")
    _check_one_element(name, "found_inf", found_inf, torch.float32, "float")
    scale = inv_scale.reshape(())
    # (each gradient as it came: the kernel checks a value before it multiplies it)
    found = functools.reduce(torch.logical_or, [grad.isfinite().logical_not().any() for grad in scaled_grads])
    for grad in scaled_grads:
        if grad.dtype in _REDUCED:
            grad.copy_(grad.float().mul(scale))
        else:
            grad.mul_(scale)
    found_inf.copy_(torch.where(found, torch.ones_like(found_inf), found_inf))


def update_scale_(current_scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """The new scale and count of clean steps: after a step with an inf or NaN (``found_inf``
    nonzero) the scale times ``backoff_factor`` and a count of 0; after ``growth_interval`` clean
    steps the scale times ``growth_factor`` (kept where that overflows float) and a count of 0;
    else the count plus one. The products are taken in double and rounded to float, as the
    kernel's."""
    name = "torch._amp_update_scale_"
    _check_one_element(name, "growth_tracker", growth_tracker, torch.int32, "int")
    _check_one_element(name, "current_scale", current_scale, torch.float32, "float")
    _check_one_element(name, "found_inf", found_inf, torch.float32, "float")
    found = found_inf != 0  # (a NaN is nonzero: the kernel's ``if (*found_inf_ptr)``)
    scale = current_scale.double()
    backed_off = scale.mul(backoff_factor).float()
    grown = scale.mul(growth_factor).float()
    successful = growth_tracker.add(1)
    grow = found.logical_not().logical_and(successful == growth_interval)
    kept = torch.where(grow.logical_and(grown.isfinite()), grown, current_scale)
    new_tracker = torch.where(found.logical_or(grow), torch.zeros_like(successful), successful)
    current_scale.copy_(torch.where(found, backed_off, kept))
    growth_tracker.copy_(new_tracker)
    return current_scale


def _register() -> None:
    for fn, handler in (
        (torch._amp_foreach_non_finite_check_and_unscale_, non_finite_check_and_unscale_),
        (torch._amp_update_scale_, update_scale_),
    ):
        TORCH_TO_LTORCH[fn] = handler
        MUTATING.add(fn)


_register()
