"""Random ops: samplers, dropout and its channel-wise and alpha forms, gumbel_softmax, rrelu, and
the functional forms of the in-place samplers (``Tensor.uniform_`` and its kin).

Eager draws from a generator in an order and by an algorithm of its own (CPU ``normal_`` works in
blocks of 16, ``bernoulli_`` may draw one MKL seed, ``rrelu`` draws only for negative inputs), so
a decomposition into ``prims.uniform`` would draw other numbers. Each sampler is therefore a
*draw*: one random effect symbol, whose output metadata comes from running it on meta tensors,
inside an ltorch symbol that the torch executor runs whole as the torch call eager makes, with
the same arguments (``generator=`` included), so it consumes the generator as eager does. The
effect inside keeps the symbol from being removed by DCE, merged by CSE or recomputed in the
backward. Ops that eager itself builds from a draw and arithmetic (``dropout1d/2d/3d``,
``alpha_dropout``, ``feature_alpha_dropout``, ``gumbel_softmax``) decompose into the same draw
and the same arithmetic, so their gradients (the mask) come from the decomposition.

Gradients are eager's: zeros for the inputs of ``normal``, ``bernoulli`` (tensor ``p``) and the
in-place samplers, the drawn slopes for ``rrelu``; ``bernoulli`` with a float ``p`` has no
derivative in eager, so a gradient through it is refused.
"""

import math
import warnings

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.base.layouts import is_dense, layout_of
from thunder_rs.core.lang.eager_layouts import eager_strides
from thunder_rs.core.lang.fallback import META_RULES, fallback, refuse_draw_made_again, user_fallback
from thunder_rs.core.lang.symint import hint
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, check
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.torch.creation import _check_random_dtype, _device, _shape

T = torch.Tensor
__all__ = [
    "rand",
    "randn",
    "rand_like",
    "randn_like",
    "randint",
    "randint_like",
    "randperm",
    "normal",
    "bernoulli",
    "poisson",
    "multinomial",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "alpha_dropout",
    "feature_alpha_dropout",
    "gumbel_softmax",
    "rrelu",
    "rrelu_with_noise",
    "uniform_",
    "normal_",
    "exponential_",
    "geometric_",
    "cauchy_",
    "log_normal_",
    "random_",
    "bernoulli_",
]


def _draw(func, args: tuple, kwargs: dict, requires_grad=False):
    """``func(*args, **kwargs)``, an eager random call, recorded as one random effect symbol.
    ``requires_grad``: which outputs require grad (the caller's grad rule gives their gradients)."""
    return fallback(func, args, kwargs, effect=True, requires_grad=requires_grad)


def _requires_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, TensorProxy) and t.requires_grad for t in tensors)


def _check_no_leaf(op: str, requires_grad) -> None:
    check(
        not requires_grad,
        op,
        "requires_grad=True would create a leaf inside the compiled program, which thunder_rs "
        "does not support; create the tensor outside and pass it in (argument requires_grad)",
        ThunderNotImplementedError,
    )


def _zero_grads(*inputs) -> None:
    """Eager's gradient of a sampler's tensor arguments: zeros, for those that require grad."""
    for x in inputs:
        if isinstance(x, TensorProxy) and x.requires_grad:
            put_grad(x, prims.full(tuple(x.shape), clang.maybe_convert(0, x.dtype), x.device, x.dtype))


# -- factories and their _like forms -------------------------------------------------------------


@torchsymbol(torch.rand)
def rand(*size, generator=None, out=None, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False):
    """Uniform on [0, 1): ``prims.uniform`` draws as eager's ``uniform_`` on the default generator."""
    dtype = dtype or torch.get_default_dtype()
    _check_random_dtype(dtype, "ltorch.rand")
    _check_no_leaf("ltorch.rand", requires_grad)
    shape = _shape(size, "ltorch.rand")
    if generator is not None:
        return _draw(torch.rand, size, {"generator": generator, "dtype": dtype, "device": device})
    refuse_draw_made_again("torch.rand")
    return prims.uniform(shape, 0.0, 1.0, _device(device), dtype)


@torchsymbol(torch.randn)
def randn(*size, generator=None, out=None, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False):
    dtype = dtype or torch.get_default_dtype()
    _check_random_dtype(dtype, "ltorch.randn")
    _check_no_leaf("ltorch.randn", requires_grad)
    _shape(size, "ltorch.randn")
    return _draw(torch.randn, size, {"generator": generator, "dtype": dtype, "device": device})


def _define_like(name: str):
    op, fn = f"ltorch.{name}", getattr(torch, name)

    @torchsymbol(fn, name=name)
    def like(input, *, generator=None, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None):
        _check_random_dtype(dtype or input.dtype, op)
        _check_no_leaf(op, requires_grad)
        kwargs = {"generator": generator, "dtype": dtype, "device": device, "memory_format": memory_format}
        order = _memory_order(input) if name == "rand_like" and input._symbolic else None
        if order is not None and generator is memory_format is None:
            # A symbolic size stays symbolic (dropout's mask): the draw as ``rand``'s, in the order
            # eager's draws fill the input's layout (channels_last: N, H, W, C), then dims as the input's.
            shape = tuple(input.shape)
            device = _device(device or input.device)
            refuse_draw_made_again(f"torch.{name}")
            drawn = prims.uniform(tuple(shape[d] for d in order), 0.0, 1.0, device, dtype or input.dtype)
            return drawn if order == tuple(range(len(order))) else prims.transpose(drawn, _inverse(order))
        return _draw(fn, (input,), {k: v for k, v in kwargs.items() if v is not None})

    return like


def _memory_order(input) -> tuple | None:
    """The dims of ``input`` from the outermost in memory to the innermost, where it is dense (as
    ``empty_like`` lays out a copy of it), else None."""
    strides = eager_strides(input)
    if strides is None:
        return tuple(range(input.ndim))
    lay = layout_of(tuple(hint(s) for s in input.shape), tuple(hint(s) for s in strides))
    return lay[1] if is_dense(lay) else None


def _inverse(order: tuple) -> tuple:
    return tuple(order.index(d) for d in range(len(order)))


rand_like = _define_like("rand_like")
randn_like = _define_like("randn_like")


@torchsymbol(torch.randint)
def randint(*args, **kwargs):
    """``randint(low=0, high, size, *, generator=None, dtype=None, device=None, ...)``."""
    return _draw(torch.randint, args, kwargs)


@torchsymbol(torch.randint_like)
def randint_like(input, *args, **kwargs):
    """``randint_like(input, low=0, high, *, generator=None, dtype=None, device=None, ...)``."""
    return _draw(torch.randint_like, (input, *args), kwargs)


@torchsymbol(torch.randperm)
def randperm(n, **kwargs):
    """``randperm(n, *, generator=None, dtype=torch.int64, device=None, ...)``."""
    return _draw(torch.randperm, (n,), kwargs)


# -- distributions over tensors ------------------------------------------------------------------


@torchsymbol(torch.normal)
def normal(*args, **kwargs):
    """``normal(mean, std, *, generator=None)`` with tensor or float mean and std, and
    ``normal(mean, std, size, *, generator=None, dtype=None, ...)`` with floats."""
    return _draw(torch.normal, args, kwargs, requires_grad=_requires_grad(*args, *kwargs.values()))


@register_grad(normal)
def normal_grad(*args, **kwargs):
    out = normal(*args, **kwargs)
    get_grad(out)
    _zero_grads(*args[:2], kwargs.get("mean"), kwargs.get("std"))
    return out


@torchsymbol(torch.bernoulli, T.bernoulli)
def bernoulli(input, *args, **kwargs):
    """``bernoulli(input, *, generator=None)`` draws with the probabilities in ``input``;
    ``bernoulli(input, p, *, generator=None)`` with the float ``p`` (``input`` gives the shape)."""
    return _draw(torch.bernoulli, (input, *args), kwargs, requires_grad=_requires_grad(input))


@register_grad(bernoulli)
def bernoulli_grad(input, *args, **kwargs):
    check(
        not args and "p" not in kwargs,
        "ltorch.bernoulli",
        "derivative for bernoulli with a float p is not implemented in eager (argument input requires grad)",
        ThunderNotImplementedError,
    )
    out = bernoulli(input, **kwargs)
    get_grad(out)
    _zero_grads(input)
    return out


@torchsymbol(torch.poisson)
def poisson(input, generator=None):
    kwargs = {"generator": generator} if generator is not None else {}
    return _draw(torch.poisson, (input,), kwargs, requires_grad=_requires_grad(input))


@register_grad(poisson)
def poisson_grad(input, generator=None):
    out = poisson(input, generator)
    get_grad(out)
    _zero_grads(input)
    return out


@torchsymbol(torch.multinomial, T.multinomial)
def multinomial(input, num_samples, replacement=False, *, generator=None):
    kwargs = {"generator": generator} if generator is not None else {}
    return _draw(torch.multinomial, (input, num_samples, replacement), kwargs)


# -- functional forms of the in-place samplers -----------------------------------------------------

#: In-place sampler (``Tensor.uniform_``) -> its functional ltorch symbol, which takes the same
#: arguments and returns the values the call writes (``thunder_rs.torch.inplace`` writes them).
IN_PLACE_SAMPLERS: dict = {}


def _define_sampler(name: str):
    """The functional form of ``Tensor.<name>``: the sampler run on a fresh tensor like ``self``
    (same layout, so it draws in the same order); the values of ``self`` are not read."""
    method = getattr(T, name)

    def on_fresh(self, *args, **kwargs):
        return method(torch.empty_like(self), *args, **kwargs)

    on_fresh.__name__ = on_fresh.__qualname__ = f"{name}on_fresh"
    # What it returns is laid out as ``self``, whatever its arguments: no run on values to tell, which
    # drew for real while traced where an argument is a 0-d tensor (``uniform_(-r, r)`` of NumPy
    # values Dynamo holds as tensors, whose meta run reads them), and the compiling call's values were
    # the draws after those.
    META_RULES[on_fresh] = lambda self, *args, **kwargs: torch.empty_like(self)

    @torchsymbol(on_fresh, name=name)
    def sampler(self, *args, **kwargs):
        return _draw(on_fresh, (self, *args), kwargs, requires_grad=_requires_grad(self, *args, *kwargs.values()))

    @register_grad(sampler)
    def sampler_grad(self, *args, **kwargs):
        out = sampler(self, *args, **kwargs)
        get_grad(out)
        _zero_grads(self, *args, *kwargs.values())
        return out

    IN_PLACE_SAMPLERS[method] = sampler
    return sampler


uniform_ = _define_sampler("uniform_")
normal_ = _define_sampler("normal_")
exponential_ = _define_sampler("exponential_")
geometric_ = _define_sampler("geometric_")
cauchy_ = _define_sampler("cauchy_")
log_normal_ = _define_sampler("log_normal_")
random_ = _define_sampler("random_")
bernoulli_ = _define_sampler("bernoulli_")


# -- dropout ---------------------------------------------------------------------------------------

# SELU's constants, as eager's alpha dropout computes with them.
_ALPHA = 1.7580993408473766


def _check_p(op: str, p) -> None:
    check(0.0 <= p <= 1.0, op, f"dropout probability has to be between 0 and 1, but got {p} (argument p)")


def _noise_like(input, feature: bool, unbatched: bool):
    """A tensor shaped and laid out as eager's noise, which ``bernoulli_`` fills in memory order
    as eager does: the input itself (its values are not read), or for channel-wise
    dropout a contiguous one with a value per batch and channel (per channel when unbatched)."""
    if not feature:
        return input
    keep = 1 if unbatched else 2
    shape = (*input.shape[:keep], *([1] * (input.ndim - keep)))
    return prims.full(shape, clang.maybe_convert(0, input.dtype), input.device, input.dtype)


def _dropout(op: str, input, p, training, feature: bool, alpha: bool, unbatched: bool = False):
    """Eager's ``_dropout_impl``: a bernoulli(1 - p) mask in the input's dtype, scaled by
    1 / (1 - p) (or, for alpha dropout, affinely so that SELU's mean and variance are kept),
    times the input."""
    _check_p(op, p)
    if p == 0 or not training or input.numel() == 0:
        return input
    if p == 1:
        return prims.mul(input, clang.maybe_convert(0, input.dtype))
    check(
        not feature or input.ndim >= 2,
        op,
        "Feature dropout requires at least 2 dimensions in the input (argument input)",
        ThunderRuntimeError,
    )
    check(
        input.dtype.is_floating_point,
        op,
        f"result type Float can't be cast to the desired output type {input.dtype} (argument input)",
        ThunderRuntimeError,
    )
    with torch.no_grad():  # the mask is a constant of the gradient, as in eager
        noise = bernoulli_(_noise_like(input, feature, unbatched), 1.0 - p)
    if alpha:
        a = 1.0 / math.sqrt((_ALPHA * _ALPHA * p + 1) * (1 - p))
        shift = prims.add(prims.mul(prims.add(noise, -1.0), _ALPHA * a), _ALPHA * a * p)
        scaled = prims.mul(noise, a)
        return prims.add(prims.mul(input, clang.expand_to(scaled, input.shape)), clang.expand_to(shift, input.shape))
    return prims.mul(input, clang.expand_to(prims.div(noise, 1.0 - p), input.shape))


def _check_rank(op: str, input, ranks: tuple[int, int]) -> None:
    check(
        input.ndim in ranks,
        op,
        f"Expected {ranks[0]}D or {ranks[1]}D input, but received a {input.ndim}D input (argument input)",
        ThunderRuntimeError,
    )


@torchsymbol(F.dropout1d)
def dropout1d(input, p=0.5, training=True, inplace=False):
    op = "ltorch.dropout1d"
    _check_p(op, p)
    _check_rank(op, input, (2, 3))
    return _dropout(op, input, p, training, feature=True, alpha=False, unbatched=input.ndim == 2)


def _warn_rank(name: str, input, ranks: tuple[int, int]) -> None:
    """Eager's deprecation warnings for channel-wise dropout of unexpected ranks."""
    if input.ndim not in ranks:
        warnings.warn(
            f"{name}: Received a {input.ndim}-D input to {name}, which is deprecated and will result in an "
            f"error in a future release. To retain the behavior and silence this warning, please use "
            f"dropout instead.",
            stacklevel=4,
        )


@torchsymbol(F.dropout2d)
def dropout2d(input, p=0.5, training=True, inplace=False):
    op = "ltorch.dropout2d"
    _check_p(op, p)
    _warn_rank("dropout2d", input, (3, 4))
    if input.ndim == 3:
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout behavior "
            "is desired - input is interpreted as shape (N, C, L), where C is the channel dim.",
            stacklevel=3,
        )
    return _dropout(op, input, p, training, feature=True, alpha=False)


@torchsymbol(F.dropout3d)
def dropout3d(input, p=0.5, training=True, inplace=False):
    op = "ltorch.dropout3d"
    _check_p(op, p)
    _warn_rank("dropout3d", input, (4, 5))
    return _dropout(op, input, p, training, feature=True, alpha=False, unbatched=input.ndim != 5)


@torchsymbol(F.alpha_dropout)
def alpha_dropout(input, p=0.5, training=False, inplace=False):
    return _dropout("ltorch.alpha_dropout", input, p, training, feature=False, alpha=True)


@torchsymbol(F.feature_alpha_dropout)
def feature_alpha_dropout(input, p=0.5, training=False, inplace=False):
    return _dropout("ltorch.feature_alpha_dropout", input, p, training, feature=True, alpha=True)


@torchsymbol(F.gumbel_softmax)
def gumbel_softmax(logits, tau=1, hard=False, eps=1e-10, dim=-1):
    """Eager's definition: softmax of the logits plus Gumbel noise (minus the log of exponential
    samples drawn into a contiguous tensor), over ``tau``; ``hard`` gives the one-hot of the
    largest, with the soft values' gradient."""
    if eps != 1e-10:
        warnings.warn("`eps` parameter is deprecated and has no effect.", stacklevel=3)
    with torch.no_grad():  # the noise does not depend on the logits
        fresh = prims.full(tuple(logits.shape), clang.maybe_convert(0, logits.dtype), logits.device, logits.dtype)
        gumbels = -exponential_(fresh).log()
    y_soft = ((logits + gumbels) / tau).softmax(dim)
    if not hard:
        return y_soft
    index = y_soft.max(dim, keepdim=True)[1]
    dim = dim % max(logits.ndim, 1)
    positions = (
        prims.broadcast_in_dim(
            prims.iota(logits.shape[dim], 0, 1, logits.device, torch.int64), tuple(logits.shape), (dim,)
        )
        if logits.ndim
        else index
    )
    y_hard = clang.maybe_convert(positions == index, logits.dtype)  # eager scatters 1.0 at the index
    return y_hard - y_soft.detach() + y_soft


# -- rrelu -----------------------------------------------------------------------------------------


def _rrelu_train(input, lower, upper, generator=None):
    """Training-mode rrelu and the slope it drew for each element (1 for positive ones), as
    ``torch.rrelu`` computes it: a slope is drawn only for each non-positive element."""
    noise = torch.empty_like(input, memory_format=torch.contiguous_format)
    return tuple(torch.ops.aten.rrelu_with_noise_functional(input, noise, lower, upper, True, generator))


@torchsymbol(_rrelu_train, name="rrelu_with_noise")
def rrelu_with_noise(input, lower, upper, generator=None):
    kwargs = {"generator": generator} if generator is not None else {}
    return _draw(_rrelu_train, (input, lower, upper), kwargs, requires_grad=(_requires_grad(input), False))


@torchsymbol(F.rrelu)
def rrelu(input, lower=1.0 / 8.0, upper=1.0 / 3.0, training=False, inplace=False):
    """Training: each non-positive element times a slope drawn from U(lower, upper); otherwise
    leaky_relu with the mean slope."""
    op = "ltorch.rrelu"
    check(
        input.dtype.is_floating_point,
        op,
        f'"rrelu_with_noise" not implemented for {input.dtype} (argument input)',
        ThunderNotImplementedError,
    )
    check(
        lower <= upper,
        op,
        f"Lower bound should be less than or equal to the upper bound, got {lower} and {upper} (argument lower)",
        ThunderRuntimeError,
    )
    if not training:
        return ltorch.leaky_relu(input, (lower + upper) / 2)
    return rrelu_with_noise(input, lower, upper)[0]


@register_grad(rrelu)
def rrelu_grad(input, lower=1.0 / 8.0, upper=1.0 / 3.0, training=False, inplace=False):
    if not training:
        return rrelu(input, lower, upper, training)
    out, noise = rrelu_with_noise(input, lower, upper)
    put_grad(input, prims.mul(get_grad(out), noise))
    return out


def _dropout_on_copy(input, p, train):
    return torch.dropout_(input.clone(), p, train)


def _dropout_in_place(input, p=0.5, training=True):
    """``F.dropout(..., inplace=True)``'s value where eager draws it otherwise than out of place, else
    None. Off the CPU, where ``dropout`` runs the fused ``native_dropout`` (``is_fused_kernel_acceptable``
    in ATen's Dropout.cpp: 0 < p < 1), ``dropout_`` multiplies by ``bernoulli_(1 - p) / (1 - p)``:
    other numbers from the generator. Computed by eager's ``dropout_``, on a copy."""
    if not isinstance(input, TensorProxy) or input.device.type == "cpu" or not training or not 0 < p < 1:
        return None
    return user_fallback(_dropout_on_copy, (input, p, training), {}, effect=True)


#: ``inplace=True`` forms whose eager kernel may draw otherwise than the out-of-place one
#: (``inplace._inplace_argument``): their value where it does, else None.
DRAWN_IN_PLACE = {F.dropout: _dropout_in_place}
